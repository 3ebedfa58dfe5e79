#!/usr/bin/env bash
# What the gateway's checks of its node exports' flags (read_only_check_s, docs/gateway.md "Read-only
# volumes") cost the node: one rein serve with VOLUMES exports of 1 MiB ([tls] mode = "require", x509
# ECDSA P-256 certificates; TLS=0: plain) and a rein gateway with VOLUMES volumes on it (protocol rein,
# one tenant), both release builds on this host. The node's CPU time (utime + stime from /proc/PID/stat)
# over SECONDS, with read_only_check_s = PERIOD_S and with the checks off (0), and the checks the gateway
# counted meanwhile (/api/nodes). With BASE=path/to/an/older/rein, that binary runs the same two rows.
# Usage: [BASE=rein-before] [TLS=0] [NODE_IP=127.0.0.38] [GW_IP=127.0.0.39] \
#          bash scripts/bench-ro-checks.sh [VOLUMES] [PERIOD_S] [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
VOLUMES=${1:-1024}
PERIOD=${2:-10}
SECONDS_RUN=${3:-60}
NODE_IP=${NODE_IP:-127.0.0.38}
GW_IP=${GW_IP:-127.0.0.39}
TLS=${TLS:-1}
for t in openssl curl python3; do command -v $t >/dev/null || { echo "needs $t" >&2; exit 1; }; done
cargo build --release --locked -p rein -q
W=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$W"; }
trap cleanup EXIT
wait_port() { for _ in $(seq 600); do (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null && return 0; sleep 0.2; done; echo "no server on $1:$2" >&2; exit 1; }
( cd "$W"
  EC=(-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes)
  openssl req -x509 "${EC[@]}" -keyout ca-key.pem -out ca-cert.pem -subj /CN=bench-ca -days 1
  printf 'subjectAltName=IP:%s\nextendedKeyUsage=serverAuth\n' "$NODE_IP" > node.ext
  openssl req "${EC[@]}" -keyout node-key.pem -out node.csr -subj /CN=node
  openssl x509 -req -in node.csr -CA ca-cert.pem -CAkey ca-key.pem -CAcreateserial -out node-cert.pem -days 1 -extfile node.ext
  printf 'extendedKeyUsage=clientAuth\n' > gw.ext
  openssl req "${EC[@]}" -keyout gw-key.pem -out gw.csr -subj /CN=gw
  openssl x509 -req -in gw.csr -CA ca-cert.pem -CAkey ca-key.pem -CAcreateserial -out gw-cert.pem -days 1 -extfile gw.ext
) 2>/dev/null
{ echo "listen = \"$NODE_IP:10809\""; echo "admin = \"$NODE_IP:9180\""; echo "data_dir = \"$W/data\""
  echo 'capacity_iops = 100000'; echo 'scheduler = "dmclock"'
  echo 'max_connections_per_client = 4096'; echo 'max_connections_per_tenant = 4096'
  [ "$TLS" = 1 ] && printf '[tls]\nmode = "require"\ncert = "%s"\nkey = "%s"\nca = "%s"\n' \
    "$W/node-cert.pem" "$W/node-key.pem" "$W/ca-cert.pem"
  printf '[node]\nenabled = true\nspecs = "gateway"\n'
  for i in $(seq 0 $((VOLUMES - 1))); do printf '[[exports]]\nname = "e%d"\nsize_mb = 1\n' "$i"; done
} > "$W/rein.toml"
gw_toml() { # read_only_check_s
  { echo "listen = \"$GW_IP:10810\""; echo "admin = \"$GW_IP:9190\""; echo "read_only_check_s = $1"
    [ "$TLS" = 1 ] && printf '[node_tls]\nca = "ca-cert.pem"\ncert = "gw-cert.pem"\nkey = "gw-key.pem"\n'
    printf '[[nodes]]\nname = "s1"\naddress = "%s:10809"\nprotocol = "rein"\n' "$NODE_IP"
    printf '[[tenants]]\nname = "t"\nreservation = 0\n'
    for i in $(seq 0 $((VOLUMES - 1))); do printf '[[exports]]\nname = "e%d"\ntenant = "t"\nsize_mb = 1\n' "$i"; done
  } > "$W/gw.toml"
}
checks() { # the checks the gateway counted, in all, and the failed ones
  curl -s "http://$GW_IP:9190/api/nodes" | python3 -c 'import json, sys
vols = json.load(sys.stdin)
nodes = [n for v in vols for n in v["nodes"]]
print(sum(n["read_only_checks"] for n in nodes), sum(n["read_only_checks_failed"] for n in nodes))'
}
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
run() { # binary, read_only_check_s -> "node CPU s, checks counted, failed"
  rm -rf "$W/data"
  "$1" serve --config "$W/rein.toml" 2>/dev/null & local node=$!
  PIDS+=("$node")
  wait_port "$NODE_IP" 10809
  gw_toml "$2"
  "$1" gateway --config "$W/gw.toml" 2>/dev/null & local gw=$!
  PIDS+=("$gw")
  wait_port "$GW_IP" 9190
  sleep 5
  local t0 c0 t1 c1
  t0=$(ticks "$node"); read -r c0 _ < <(checks)
  sleep "$SECONDS_RUN"
  t1=$(ticks "$node"); read -r c1 f1 < <(checks)
  kill "$gw" "$node"; wait "$gw" "$node" 2>/dev/null || true
  python3 -c "import sys; print(f'{(int(sys.argv[2]) - int(sys.argv[1])) / int(sys.argv[3]):.2f}', end=' ')" \
    "$t0" "$t1" "$(getconf CLK_TCK)"
  echo "$((c1 - c0)) $f1"
}
echo "$VOLUMES volumes, TLS=$TLS, $SECONDS_RUN s: node CPU s, checks counted, failed"
for b in "${CARGO_TARGET_DIR:-target}/release/rein" ${BASE:-}; do
  echo "$b read_only_check_s = $PERIOD: $(run "$b" "$PERIOD")"
  echo "$b read_only_check_s = 0: $(run "$b" 0)"
done
