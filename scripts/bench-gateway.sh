#!/usr/bin/env bash
# Gateway benchmark: fio's nbd engine, 4 KiB random reads at iodepth 16 for SECONDS s, against one rein serve
# directly and against rein gateway striping a 1 GiB volume (64 KiB units) over three rein serve nodes, in the
# same sitting, ROUNDS times interleaved (medians, and the spread). Every server reads the same page-cached
# file (no device model), so the rows differ only by the gateway's hop. CPU per IO: the server's CPU for the
# direct row; the gateway's plus the three nodes' for the gateway row (from /proc/PID/stat). Servers listen
# on their own 127.0.0.x addresses and are stopped at the end.
# With PERF=1, the last gateway run is profiled with `perf record -g` (gateway process only) and the top
# symbols are printed.
# GW_THREADS sets the gateway's tokio worker threads (default: the number of CPUs); GW_CONNS its
# connections_per_node (default 2, the gateway's own default). NODE_TLS=psk runs the gateway's links to
# the nodes over TLS (the nodes require it, `[tls] psk_file`; the gateway's `[node_tls] psk_file`); VMs
# still reach the gateway, and the direct server, in plain NBD.
# NODE_THREADS sets the tokio worker threads of every rein serve (the direct one and the nodes; default: the
# number of CPUs).
# FLOOR=1 adds two rows that say what one more hop costs on this machine whatever the gateway does: HAProxy
# in TCP mode (a byte forwarder that does not parse NBD: one backend connection, one thread) in front of one
# rein serve, and rein gateway over that same one node (plain NBD, one connection, one thread). Needs
# haproxy (apt-get install haproxy); it is started with a config in the scratch directory and stopped at
# the end.
# REIN names the binary (default ./target/release/rein).
# Usage: [PERF=1] [FLOOR=1] [GW_THREADS=n] [GW_CONNS=n] [NODE_THREADS=n] [NODE_TLS=psk] [REIN=path] bash scripts/bench-gateway.sh [SECONDS] [ROUNDS] [PROTOCOL: nbd | auto | rein]
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-10}
ROUNDS=${2:-3}
PROTOCOL=${3:-nbd}
tools=(fio python3); [ "${FLOOR:-0}" = 1 ] && tools+=(haproxy)
for t in "${tools[@]}"; do command -v $t >/dev/null || { echo "needs $t (apt-get install fio python3)" >&2; exit 1; }; done
source scripts/bench-common.sh
cpu_of() { awk -v hz="$(getconf CLK_TCK)" '{ printf "%.3f", ($14 + $15) / hz }' "/proc/$1/stat"; }
cpu_sum() { local s=0 p; for p in "$@"; do s=$(python3 -c "print($s + $(cpu_of "$p"))"); done; echo "$s"; }
iops_of() { python3 -c 'import json,sys; t=sys.stdin.read(); print(round(json.loads(t[t.index("{"):])["jobs"][0]["read"]["iops"]))'; }
fio_one() {
  fio --name=b --ioengine=nbd --uri="$1" --rw=randread --bs=4k --iodepth=16 --time_based --runtime="$SECS" \
      --size=1g --output-format=json 2>/dev/null | iops_of
}
# Runs fio against uri $1 while the processes $2.. serve it: prints "IOPS CPU-us-per-IO".
measure() { local uri=$1; shift; local c0 c1 iops; c0=$(cpu_sum "$@"); iops=$(fio_one "$uri"); c1=$(cpu_sum "$@")
  python3 -c "import sys; i,a,b,s=map(float,sys.argv[1:]); print(f'{i:.0f} {1e6*(b-a)/max(i*s,1):.2f}')" "$iops" "$c0" "$c1" "$SECS"; }
REIN=${REIN:-./target/release/rein}
if [ "${NODE_TLS:-}" = psk ]; then
  printf 'gw:%s\n' "$(python3 -c 'import os; print(os.urandom(32).hex())')" > "$W/gw.psk"
fi
node_config() { # host [node] -> config path: one read-only export "bench" over $FILE (with "node" and a
               # PROTOCOL other than nbd: a storage node, [node] enabled)
  cat > "$W/node-$1.toml" <<TOML
listen = "127.0.0.$1:10809"
admin = "127.0.0.$1:9180"
data_dir = "$W/data-$1"
io_engine = "${IO_ENGINE:-uring}"
[[exports]]
name = "bench"
path = "$FILE"
size_mb = 1024
read_only = true
TOML
  if [ "$2" = node ] && [ "${NODE_TLS:-}" = psk ]; then
    printf '[tls]\nmode = "require"\npsk_file = "%s"\n' "$W/gw.psk" >> "$W/node-$1.toml"
  fi
  if [ "$2" = node ] && [ "$PROTOCOL" != nbd ]; then
    # The storage-node protocol: dmClock at the node, the gateway's tenant adopted.
    { echo 'scheduler = "dmclock"'; cat "$W/node-$1.toml"; printf '[node]\nenabled = true\nspecs = "gateway"\n'; } > "$W/node-$1.tmp"
    mv "$W/node-$1.tmp" "$W/node-$1.toml"
  fi
  echo "$W/node-$1.toml"
}
direct_run() {
  TOKIO_WORKER_THREADS=${NODE_THREADS:-$(nproc)} "$REIN" serve --config "$(node_config 41 direct)" 2>/dev/null & local pid=$!
  wait_port 127.0.0.41 10809
  measure nbd://127.0.0.41:10809/bench $pid
  kill $pid; wait $pid 2>/dev/null || true
}
gateway_run() { # [perf] -> "IOPS CPU-us-per-IO"
  local pids=() h
  for h in 42 43 44; do TOKIO_WORKER_THREADS=${NODE_THREADS:-$(nproc)} "$REIN" serve --config "$(node_config $h node)" 2>/dev/null & pids+=($!); done
  for h in 42 43 44; do wait_port 127.0.0.$h 10809; done
  { echo 'listen = "127.0.0.45:10809"'; echo "connections_per_node = ${GW_CONNS:-2}"
    if [ "${NODE_TLS:-}" = psk ]; then printf '[node_tls]\npsk_file = "%s"\n' "$W/gw.psk"; fi
    for h in 42 43 44; do printf '[[nodes]]\nname = "s%d"\naddress = "127.0.0.%d:10809"\nprotocol = "%s"\nexport = "bench"\n' $h $h "$PROTOCOL"; done
    printf '[[exports]]\nname = "vol"\nsize_mb = 1024\nstripe_kb = 64\n'; } > "$W/gw.toml"
  TOKIO_WORKER_THREADS=${GW_THREADS:-$(nproc)} "$REIN" gateway --config "$W/gw.toml" 2>/dev/null & local gw=$!
  wait_port 127.0.0.45 10809
  if [ "${1:-}" = perf ]; then
    perf record -g -o "$W/perf.data" -p $gw -- sleep "$SECS" >/dev/null 2>&1 & local perf=$!
  fi
  measure nbd://127.0.0.45:10809/vol $gw "${pids[@]}"
  if [ "${1:-}" = perf ]; then wait $perf || true; fi
  kill $gw "${pids[@]}"; wait $gw "${pids[@]}" 2>/dev/null || true
}
floor_run() { # -> "IOPS CPU-us-per-IO" for haproxy, then for rein gateway, each over one plain node
  local node gw hap out
  TOKIO_WORKER_THREADS=${NODE_THREADS:-$(nproc)} "$REIN" serve --config "$(node_config 46 direct)" 2>/dev/null & node=$!
  wait_port 127.0.0.46 10809
  printf 'global\n    nbthread 1\n    maxconn 64\ndefaults\n    mode tcp\n    timeout connect 5s\n    timeout client 120s\n    timeout server 120s\nfrontend front\n    bind 127.0.0.47:10809\n    default_backend node\nbackend node\n    server n 127.0.0.46:10809\n' > "$W/haproxy.cfg"
  haproxy -f "$W/haproxy.cfg" -db 2>/dev/null & hap=$!
  wait_port 127.0.0.47 10809
  out="$(measure nbd://127.0.0.47:10809/bench $hap $node)"
  kill $hap; wait $hap 2>/dev/null || true
  { echo 'listen = "127.0.0.48:10809"'; echo "connections_per_node = 1"; echo "worker_threads = 1"
    printf '[[nodes]]\nname = "n"\naddress = "127.0.0.46:10809"\nprotocol = "nbd"\nexport = "bench"\n'
    printf '[[exports]]\nname = "vol"\nsize_mb = 1024\nstripe_kb = 64\n'; } > "$W/gw1.toml"
  "$REIN" gateway --config "$W/gw1.toml" 2>/dev/null & gw=$!
  wait_port 127.0.0.48 10809
  out="$out,$(measure nbd://127.0.0.48:10809/vol $gw $node)"
  kill $gw $node; wait $gw $node 2>/dev/null || true
  echo "$out"
}
declare -A R
for r in $(seq "$ROUNDS"); do
  echo "round $r/$ROUNDS ..." >&2
  R[direct]+="$(direct_run),"
  if [ "${PERF:-0}" = 1 ] && [ "$r" = "$ROUNDS" ]; then R[gateway]+="$(gateway_run perf),"; else R[gateway]+="$(gateway_run),"; fi
  if [ "${FLOOR:-0}" = 1 ]; then f=$(floor_run); R[haproxy]+="${f%%,*},"; R[gw1]+="${f##*,},"; fi
done
python3 - "$SECS" "$ROUNDS" "$PROTOCOL" "${R[direct]}" "${R[gateway]}" ${R[haproxy]:+"${R[haproxy]}"} ${R[gw1]:+"${R[gw1]}"} <<'PY'
import statistics, sys
secs, rounds, protocol = sys.argv[1:4]
pairs = [[tuple(map(float, x.split())) for x in a.strip(",").split(",")] for a in sys.argv[4:]]
runs = [[p[0] for p in ps] for ps in pairs]
cpus = [[p[1] for p in ps] for ps in pairs]
med = [statistics.median(r) for r in runs]
cpu = [statistics.median(c) for c in cpus]
names = ["rein serve directly", f"rein gateway over 3 rein serve nodes (protocol {protocol}, 64 KiB stripes)",
         "HAProxy, TCP mode, in front of 1 rein serve (a byte forwarder: the cost of one more hop)",
         "rein gateway over 1 rein serve node (protocol nbd, 1 thread, 1 connection)"]
print(f"| path (fio nbd, 4 KiB random reads, iodepth 16, {secs} s x {rounds} rounds) | median IOPS | min-max | / direct (per round, median) | CPU us/IO (all servers) |")
print("|---|---:|---:|---:|---:|")
for n, m, r, c in zip(names, med, runs, cpu):
    ratio = statistics.median(x / d for x, d in zip(r, runs[0]))
    print(f"| {n} | {m:,.0f} | {min(r):,.0f}-{max(r):,.0f} | {ratio:.2f}x | {c:.1f} |")
print(f"\ngateway / direct: IOPS {med[1]/med[0]:.2f}x (target >= 0.60); CPU per IO {cpu[1]/cpu[0]:.2f}x")
if len(med) == 4:
    print(f"one more hop through HAProxy / direct: IOPS {med[2]/med[0]:.2f}x; rein gateway over one node / HAProxy: {med[3]/med[2]:.2f}x")
PY
if [ "${PERF:-0}" = 1 ] && [ -f "$W/perf.data" ]; then
  echo; echo "gateway profile (perf report --no-children, top 25):"
  perf report -i "$W/perf.data" --no-children --stdio --sort symbol 2>/dev/null | grep -E '^ +[0-9]' | head -25 || true
fi
