#!/usr/bin/env bash
# TLS's cost on rein serve: nbdcopy reads a 1 GiB export (a file in the page cache, one unlimited tenant,
# the FIFO scheduler) to null: over one connection with 16 requests in flight, once in 4 KiB requests
# (per-request cost: IOPS) and once in 256 KiB requests (bulk: MB/s), from rein serve without TLS, over TLS
# with x509, and over TLS with a PSK. (fio's nbd engine, which scripts/bench-nbd.sh uses, refuses the
# local files of nbds:// URIs, so nbdcopy is the client here, for every row alike.) Every configuration
# runs ROUNDS times, interleaved; the table gives medians, spreads and the ratios to plain. With
# BASE=path/to/an/older/rein, "(base)" rows run that binary too (plain, x509 and PSK), in the same rounds.
# Usage: [BASE=rein-before] bash scripts/bench-nbd-tls.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
for t in nbdcopy openssl python3; do command -v $t >/dev/null || { echo "needs $t (apt-get install libnbd-bin openssl python3)" >&2; exit 1; }; done
source scripts/bench-common.sh
# A CA, a server certificate for 127.0.0.35 and a PSK, in libnbd's directory layout for the client.
mkdir -p "$W/client"
( cd "$W"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca-key.pem -out ca-cert.pem -subj /CN=bench-ca -days 1
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout server-key.pem -out server.csr -subj /CN=127.0.0.35
  printf 'subjectAltName=IP:127.0.0.35\n' > server.ext
  openssl x509 -req -in server.csr -CA ca-cert.pem -CAkey ca-key.pem -CAcreateserial -out server-cert.pem -days 1 -extfile server.ext
  cp ca-cert.pem client/
  echo "bench:$(openssl rand -hex 32)" > keys.psk ) 2>/dev/null
copy_rate() { # uri, request size -> requests per second and MB/s reading the whole export
  local t0 t1
  t0=$(date +%s.%N)
  nbdcopy --connections=1 --requests=16 --request-size="$2" "$1" null:
  t1=$(date +%s.%N)
  python3 -c "import sys; t=float(sys.argv[2])-float(sys.argv[1]); print(f'{(1<<30)/int(sys.argv[3])/t:.0f}/{(1<<30)/1e6/t:.0f}')" "$t0" "$t1" "$2"
}
rein_run() { # binary, tls table ("" for none), uri -> "IOPS-4k/MBps-4k IOPS-256k/MBps-256k"
  { echo 'listen = "127.0.0.35:10809"'; echo 'admin = "127.0.0.35:9180"'; echo "data_dir = \"$W/data\""
    echo 'scheduler = "fifo"'; echo "$2"
    printf '[[exports]]\nname = "bench"\npath = "%s"\nsize_mb = 1024\n' "$FILE"; } > "$W/rein.toml"
  "$1" serve --config "$W/rein.toml" 2>/dev/null & local pid=$!
  PIDS+=("$pid")
  wait_port 127.0.0.35 10809
  echo "$(copy_rate "$3" 4096) $(copy_rate "$3" 262144)"
  kill "$pid"; wait "$pid" 2>/dev/null || true
}
X509="[tls]
mode = \"on\"
cert = \"$W/server-cert.pem\"
key = \"$W/server-key.pem\""
PSK="[tls]
mode = \"on\"
psk_file = \"$W/keys.psk\""
declare -A R
ROWS=("plain" "tls-x509" "tls-psk")
[ -n "${BASE:-}" ] && ROWS+=("plain (base)" "x509 (base)" "psk (base)")
for r in $(seq "$ROUNDS"); do
  R[plain]+="$(rein_run ./target/release/rein "" nbd://127.0.0.35:10809/bench) "
  R[tls-x509]+="$(rein_run ./target/release/rein "$X509" "nbds://127.0.0.35:10809/bench?tls-certificates=$W/client") "
  R[tls-psk]+="$(rein_run ./target/release/rein "$PSK" "nbds://bench@127.0.0.35:10809/bench?tls-psk-file=$W/keys.psk") "
  if [ -n "${BASE:-}" ]; then
    R["plain (base)"]+="$(rein_run "$BASE" "" nbd://127.0.0.35:10809/bench) "
    R["x509 (base)"]+="$(rein_run "$BASE" "$X509" "nbds://127.0.0.35:10809/bench?tls-certificates=$W/client") "
    R["psk (base)"]+="$(rein_run "$BASE" "$PSK" "nbds://bench@127.0.0.35:10809/bench?tls-psk-file=$W/keys.psk") "
  fi
  echo "round $r/$ROUNDS done" >&2
done
for row in "${ROWS[@]}"; do echo "$row|${R[$row]}"; done | tee "$W/raw.txt" >&2
python3 - "$W/raw.txt" <<'PY'
import statistics, sys
runs = [(n, v.split()) for n, v in (l.rstrip("\n").split("|") for l in open(sys.argv[1]))]
# Each run: "iops/mbs" for 4 KiB, then for 256 KiB.
small = {n: [float(r.split("/")[0]) for r in v[0::2]] for n, v in runs}
large = {n: [float(r.split("/")[1]) for r in v[1::2]] for n, v in runs}
print("%-14s %14s %8s %8s %8s   %14s %8s %8s %8s" % ("rein serve", "4 KiB IOPS", "min", "max", "/ plain", "256 KiB MB/s", "min", "max", "/ plain"))
for n, _ in runs:
    a, b = statistics.median(small[n]), statistics.median(large[n])
    print("%-14s %14.0f %8.0f %8.0f %8.3f   %14.0f %8.0f %8.0f %8.3f" % (
        n, a, min(small[n]), max(small[n]), a / statistics.median(small["plain"]),
        b, min(large[n]), max(large[n]), b / statistics.median(large["plain"])))
PY
