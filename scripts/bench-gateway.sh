#!/usr/bin/env bash
# Gateway benchmark: fio's nbd engine, 4 KiB random reads at iodepth 16 for SECONDS s, against one rein serve
# directly and against rein gateway striping a 1 GiB volume (64 KiB units) over three rein serve nodes, in the
# same sitting, ROUNDS times interleaved (medians, and the spread). Every server reads the same page-cached
# file (no device model), so the rows differ only by the gateway's hop. CPU per IO: the server's CPU for the
# direct row; the gateway's plus the three nodes' for the gateway row (from /proc/PID/stat). Sleeps per IO:
# the same processes' voluntary context switches (every thread's, /proc/PID/task/*/status), each a sleep
# and a wake-up. Servers listen on their own 127.0.0.x addresses and are stopped at the end.
# With PERF=1, the last gateway run is profiled with `perf record -g` (gateway process only) and the top
# symbols are printed.
# GW_THREADS sets the gateway's worker_threads, GW_CONNS its connections_per_node (default: the gateway's
# own defaults, 1 and 1). NODE_TLS=psk runs the gateway's links to
# the nodes over TLS (the nodes require it, `[tls] psk_file`; the gateway's `[node_tls] psk_file`); VMs
# still reach the gateway, and the direct server, in plain NBD.
# NODE_THREADS sets the tokio worker threads of every rein serve (the direct one and the nodes; default: the
# number of CPUs).
# FLOOR=1 adds two rows that say what one more hop costs on this machine whatever the gateway does: HAProxy
# in TCP mode (a byte forwarder that does not parse NBD: one backend connection, one thread) in front of one
# rein serve, and rein gateway over that same one node (plain NBD, one connection, one thread). Needs
# haproxy (apt-get install haproxy); it is started with a config in the scratch directory and stopped at
# the end.
# UNIX=1 adds a row in the same rounds: the same gateway and nodes with the links between them over Unix
# sockets (the nodes' listen_unix, the gateway's address = "unix:PATH"), as for nodes on the gateway's
# own host; fio still reaches the gateway over TCP.
# GWNODE_THREADS and GWNODE_IO_ENGINE set the worker threads and io_engine of the gateway's three nodes
# only (the direct server keeps NODE_THREADS / IO_ENGINE). VARIANT="NAME=VALUE ..." adds a row in the same
# rounds: the gateway run again with those variables set (for example VARIANT="GWNODE_THREADS=1"), for an
# A/B comparison within one sitting. RATE=n caps fio at n IOPS (CPU per IO at a fixed load, not saturated).
# PERF_ALL=1 with PERF=1 profiles the whole machine (every process, `perf record -a`) instead of the
# gateway alone, and prints the share of each process and library.
# HALT_POLL_NS=ns sets the guest kernel's halt polling (cpuidle-haltpoll's guest_halt_poll_ns; needs root
# and a guest with that driver) for each fio run, and puts the old value back after it and at exit; in
# VARIANT it applies to the variant's row only (VARIANT="HALT_POLL_NS=200000": an A/B in the same rounds).
# A virtual CPU that polls before it halts is woken without an interrupt: on a VM of 2026-11-30 (polling off
# at boot) 200 us of polling took the gateway from 0.52-0.54x to 0.58-0.60x of direct (docs/gateway.md).
# GW_RT=prio runs the gateway and its nodes (every thread) at SCHED_FIFO priority prio, GW_NICE=n at nice n,
# once they listen (fio stays as it is): tried on 2026-12-05 in VARIANT rows, neither helps (below).
# REIN names the binary (default ./target/release/rein). BASE=path adds a row in the same rounds: the
# gateway (and its nodes) of another build, with that build's defaults unless BASE_GW_THREADS /
# BASE_GW_CONNS say otherwise.
# Usage: [PERF=1 [PERF_ALL=1]] [FLOOR=1] [UNIX=1] [GW_THREADS=n] [GW_CONNS=n] [NODE_THREADS=n] [GWNODE_THREADS=n]
#   [GWNODE_IO_ENGINE=e] [NODE_TLS=psk] [RATE=n] [HALT_POLL_NS=ns] [GW_RT=prio] [GW_NICE=n] [VARIANT="K=V ..."] [REIN=path] [BASE=path] bash scripts/bench-gateway.sh [SECONDS] [ROUNDS] [PROTOCOL: nbd | auto | rein]
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-10}
ROUNDS=${2:-3}
PROTOCOL=${3:-nbd}
tools=(fio python3); [ "${FLOOR:-0}" = 1 ] && tools+=(haproxy)
for t in "${tools[@]}"; do command -v $t >/dev/null || { echo "needs $t (apt-get install fio python3)" >&2; exit 1; }; done
source scripts/bench-common.sh
HP=/sys/module/haltpoll/parameters/guest_halt_poll_ns
HP_ORIG=$(cat "$HP" 2>/dev/null || true)
if [ -n "${HALT_POLL_NS:-}" ] || [[ "${VARIANT:-}" == *HALT_POLL_NS=* ]]; then
  [ -w "$HP" ] && [ -n "$HP_ORIG" ] || { echo "HALT_POLL_NS needs a writable $HP (root, a guest kernel with cpuidle-haltpoll)" >&2; exit 1; }
fi
trap '[ -z "$HP_ORIG" ] || [ ! -w "$HP" ] || echo "$HP_ORIG" > "$HP"; cleanup' EXIT
cpu_of() { awk -v hz="$(getconf CLK_TCK)" '{ printf "%.3f", ($14 + $15) / hz }' "/proc/$1/stat"; }
cpu_sum() { local s=0 p; for p in "$@"; do s=$(python3 -c "print($s + $(cpu_of "$p"))"); done; echo "$s"; }
iops_of() { python3 -c 'import json,sys; t=sys.stdin.read(); print(round(json.loads(t[t.index("{"):])["jobs"][0]["read"]["iops"]))'; }
fio_one() {
  fio --name=b --ioengine=nbd --uri="$1" --rw=randread --bs=4k --iodepth=16 ${RATE:+--rate_iops=$RATE} --time_based --runtime="$SECS" \
      --size=1g --output-format=json 2>/dev/null | iops_of
}
# Voluntary context switches (sleeps) of every thread of the processes $@, summed.
sleeps_sum() { local s=0 p t; for p in "$@"; do for t in /proc/$p/task/*/status; do
  s=$((s + $(awk '/^voluntary_ctxt_switches/ {print $2}' "$t" 2>/dev/null || echo 0))); done; done; echo "$s"; }
# Runs fio against uri $1 while the processes $2.. serve it: prints "IOPS CPU-us-per-IO sleeps-per-IO".
measure() { local uri=$1; shift; local c0 c1 v0 v1 iops; c0=$(cpu_sum "$@"); v0=$(sleeps_sum "$@")
  if [ -n "${HALT_POLL_NS:-}" ]; then echo "$HALT_POLL_NS" > "$HP"; fi
  iops=$(fio_one "$uri"); c1=$(cpu_sum "$@"); v1=$(sleeps_sum "$@")
  if [ -n "${HALT_POLL_NS:-}" ]; then echo "$HP_ORIG" > "$HP"; fi
  python3 -c "import sys; i,a,b,s,u,v=map(float,sys.argv[1:]); n=max(i*s,1); print(f'{i:.0f} {1e6*(b-a)/n:.2f} {(v-u)/n:.3f}')" "$iops" "$c0" "$c1" "$SECS" "$v0" "$v1"; }
REIN=${REIN:-./target/release/rein}
if [ "${NODE_TLS:-}" = psk ]; then
  printf 'gw:%s\n' "$(python3 -c 'import os; print(os.urandom(32).hex())')" > "$W/gw.psk"
fi
node_config() { # host [node] [unix] -> config path: one read-only export "bench" over $FILE (with "node"
               # and a PROTOCOL other than nbd: a storage node, [node] enabled; with "unix": also on
               # the Unix socket $W/node-HOST.sock)
  cat > "$W/node-$1.toml" <<TOML
listen = "127.0.0.$1:10809"
$([ "${3:-}" = unix ] && echo "listen_unix = \"$W/node-$1.sock\"")
admin = "127.0.0.$1:9180"
data_dir = "$W/data-$1"
io_engine = "$([ "$2" = node ] && echo "${GWNODE_IO_ENGINE:-${IO_ENGINE:-uring}}" || echo "${IO_ENGINE:-uring}")"
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
gateway_run() { # [perf | unix] -> "IOPS CPU-us-per-IO sleeps-per-IO" (measure)
  local pids=() h a
  for h in 42 43 44; do TOKIO_WORKER_THREADS=${GWNODE_THREADS:-${NODE_THREADS:-$(nproc)}} "$REIN" serve --config "$(node_config $h node "${1:-}")" 2>/dev/null & pids+=($!); done
  for h in 42 43 44; do wait_port 127.0.0.$h 10809; done
  { echo 'listen = "127.0.0.45:10809"'
    if [ -n "${GW_CONNS:-}" ]; then echo "connections_per_node = $GW_CONNS"; fi
    if [ -n "${GW_THREADS:-}" ]; then echo "worker_threads = $GW_THREADS"; fi
    if [ "${NODE_TLS:-}" = psk ]; then printf '[node_tls]\npsk_file = "%s"\n' "$W/gw.psk"; fi
    for h in 42 43 44; do
      if [ "${1:-}" = unix ]; then a="unix:$W/node-$h.sock"; else a="127.0.0.$h:10809"; fi
      printf '[[nodes]]\nname = "s%d"\naddress = "%s"\nprotocol = "%s"\nexport = "bench"\n' $h "$a" "$PROTOCOL"
    done
    printf '[[exports]]\nname = "vol"\nsize_mb = 1024\nstripe_kb = 64\n'; } > "$W/gw.toml"
  "$REIN" gateway --config "$W/gw.toml" 2>/dev/null & local gw=$!
  wait_port 127.0.0.45 10809
  if [ -n "${GW_RT:-}" ]; then for p in $gw "${pids[@]}"; do chrt -f -a -p "$GW_RT" $p >/dev/null; done; fi
  if [ -n "${GW_NICE:-}" ]; then for p in $gw "${pids[@]}"; do for t in /proc/$p/task/*; do renice -n "$GW_NICE" -p "${t##*/}" >/dev/null; done; done; fi
  if [ "${1:-}" = perf ]; then
    perf record -g -o "$W/perf.data" $([ -n "${PERF_ALL:-}" ] && echo -a || echo -p $gw) -- sleep "$SECS" >/dev/null 2>&1 & local perf=$!
  fi
  measure nbd://127.0.0.45:10809/vol $gw "${pids[@]}"
  if [ "${1:-}" = perf ]; then wait $perf || true; fi
  kill $gw "${pids[@]}"; wait $gw "${pids[@]}" 2>/dev/null || true
}
floor_run() { # -> measure's line for haproxy, then for rein gateway, each over one plain node
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
  if [ "${UNIX:-0}" = 1 ]; then R[unix]+="$(gateway_run unix),"; fi
  if [ -n "${VARIANT:-}" ]; then R[variant]+="$(export $VARIANT; gateway_run),"; fi
  if [ -n "${BASE:-}" ]; then R[base]+="$(REIN=$BASE GW_THREADS=${BASE_GW_THREADS:-} GW_CONNS=${BASE_GW_CONNS:-} gateway_run),"; fi
  if [ "${FLOOR:-0}" = 1 ]; then f=$(floor_run); R[haproxy]+="${f%%,*},"; R[gw1]+="${f##*,},"; fi
done
rows=(direct "rein serve directly"
      gateway "rein gateway over 3 rein serve nodes (protocol $PROTOCOL, 64 KiB stripes)")
if [ "${UNIX:-0}" = 1 ]; then rows+=(unix "the same, the gateway's links to its nodes over Unix sockets (nodes on its host)"); fi
if [ -n "${VARIANT:-}" ]; then rows+=(variant "the same with $VARIANT"); fi
if [ -n "${BASE:-}" ]; then rows+=(base "the same, BASE build (${BASE_GW_THREADS:+worker_threads $BASE_GW_THREADS, }${BASE_GW_CONNS:+connections_per_node $BASE_GW_CONNS, }otherwise its defaults)"); fi
if [ "${FLOOR:-0}" = 1 ]; then
  rows+=(haproxy "HAProxy, TCP mode, in front of 1 rein serve (a byte forwarder: the cost of one more hop)"
         gw1 "rein gateway over 1 rein serve node (protocol nbd, 1 thread, 1 connection)")
fi
args=(); for ((i = 0; i < ${#rows[@]}; i += 2)); do args+=("${rows[i]}" "${rows[i+1]}" "${R[${rows[i]}]}"); done
python3 - "$SECS" "$ROUNDS" "${args[@]}" <<'PY'
import statistics, sys
secs, rounds = sys.argv[1:3]
rest = sys.argv[3:]
keys, names, data = rest[0::3], rest[1::3], rest[2::3]
pairs = [[tuple(map(float, x.split())) for x in a.strip(",").split(",")] for a in data]
runs = {k: [p[0] for p in ps] for k, ps in zip(keys, pairs)}
cpu = {k: statistics.median(p[1] for p in ps) for k, ps in zip(keys, pairs)}
sleeps = {k: statistics.median(p[2] for p in ps) for k, ps in zip(keys, pairs)}
med = {k: statistics.median(r) for k, r in runs.items()}
print(f"| path (fio nbd, 4 KiB random reads, iodepth 16, {secs} s x {rounds} rounds) | median IOPS | min-max | / direct (per round, median) | CPU us/IO (all servers) | sleeps/IO (all servers) |")
print("|---|---:|---:|---:|---:|---:|")
for k, n in zip(keys, names):
    r = runs[k]
    ratio = statistics.median(x / d for x, d in zip(r, runs["direct"]))
    print(f"| {n} | {med[k]:,.0f} | {min(r):,.0f}-{max(r):,.0f} | {ratio:.2f}x | {cpu[k]:.1f} | {sleeps[k]:.3f} |")
print(f"\ngateway / direct: IOPS {med['gateway']/med['direct']:.2f}x (target >= 0.60); CPU per IO {cpu['gateway']/cpu['direct']:.2f}x")
if "base" in med:
    per_round = statistics.median(x / b for x, b in zip(runs["gateway"], runs["base"]))
    print(f"gateway / BASE gateway: IOPS {per_round:.2f}x (per round, median); CPU per IO {cpu['gateway']/cpu['base']:.2f}x")
if "haproxy" in med:
    print(f"one more hop through HAProxy / direct: IOPS {med['haproxy']/med['direct']:.2f}x; rein gateway over one node / HAProxy: {med['gw1']/med['haproxy']:.2f}x")
PY
if [ "${PERF:-0}" = 1 ] && [ -f "$W/perf.data" ]; then
  echo; echo "gateway profile (perf report --no-children, top 25):"
  perf report -i "$W/perf.data" --no-children --stdio --sort symbol 2>/dev/null | grep -E '^ +[0-9]' | head -25 || true
  if [ -n "${PERF_ALL:-}" ]; then perf report -i "$W/perf.data" --no-children --stdio --sort pid,dso 2>/dev/null | grep -E "^ +[0-9]" | head -40; cp "$W/perf.data" /tmp/perf-all.data; fi
fi
