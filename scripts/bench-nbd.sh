#!/usr/bin/env bash
# NBD server benchmark: the same backing file and the same client (fio's nbd engine, 4 KiB random reads,
# iodepth 16, SECONDS s per run) against qemu-nbd (default thread-pool AIO and io_uring), nbdkit's file
# plugin, and rein serve (mClock and FIFO, with 1 and with 100 tenants). Every configuration runs ROUNDS
# times, interleaved, and the table gives the median (and the spread) so a busy machine skews all rows
# alike. Servers listen on their own 127.0.0.x addresses and are stopped at the end.
# With BASE=path/to/an/older/rein, the rein rows also run with that binary, interleaved in the same rounds,
# and the table ends with the ratios (this build over the base): the build before a change, in one sitting.
# Usage: [BASE=rein-before] bash scripts/bench-nbd.sh [SECONDS] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-10}
ROUNDS=${2:-3}
for t in qemu-nbd nbdkit fio python3; do command -v $t >/dev/null || { echo "needs $t (apt-get install qemu-utils nbdkit fio python3)" >&2; exit 1; }; done
source scripts/bench-common.sh
# CPU seconds (user + system) a process has used so far.
cpu_of() { awk -v hz="$(getconf CLK_TCK)" '{ printf "%.3f", ($14 + $15) / hz }' "/proc/$1/stat"; }
# Runs a client command against server $1 (pid) and prints "IOPS CPU-us-per-IO" (server CPU during the run).
measure() { local pid=$1; shift; local c0 c1 iops; c0=$(cpu_of "$pid"); iops=$("$@"); c1=$(cpu_of "$pid")
  python3 -c "import sys; i,a,b,s=map(float,sys.argv[1:]); print(f'{i:.0f} {1e6*(b-a)/max(i*s,1):.2f}')" "$iops" "$c0" "$c1" "$SECS"; }
iops_of() { python3 -c 'import json,sys; t=sys.stdin.read(); print(round(json.loads(t[t.index("{"):])["jobs"][0]["read"]["iops"]))'; }
fio_one() { # uri -> IOPS (one job, iodepth 16)
  fio --name=b --ioengine=nbd --uri="$1" --rw=randread --bs=4k --iodepth=16 --time_based --runtime="$SECS" \
      --size=1g --output-format=json 2>/dev/null | iops_of
}
fio_many() { # base uri, n exports -> total IOPS (one job per export, iodepth 1 each; fio threads, not
           # 100 processes, so the client's own scheduling noise stays small)
  local base=$1 n=$2 args=()
  for i in $(seq 0 $((n - 1))); do args+=(--name=t$i --uri="$base/t$i"); done
  fio --thread --ioengine=nbd --rw=randread --bs=4k --iodepth=1 --time_based --runtime="$SECS" --size=1g --group_reporting \
      --output-format=json "${args[@]}" 2>/dev/null | iops_of
}
qemu_run() { # aio -> IOPS
  qemu-nbd -f raw -t -b 127.0.0.31 -p 10809 -x bench --aio="$1" "$FILE" & local pid=$!
  wait_port 127.0.0.31 10809
  measure $pid fio_one nbd://127.0.0.31:10809/bench
  kill $pid; wait $pid 2>/dev/null || true
}
nbdkit_run() {
  nbdkit -f -i 127.0.0.32 -p 10809 -e bench file file="$FILE" & local pid=$!
  wait_port 127.0.0.32 10809
  measure $pid fio_one nbd://127.0.0.32:10809/bench
  kill $pid; wait $pid 2>/dev/null || true
}
REIN=./target/release/rein
rein_one() { # scheduler -> IOPS with one unlimited tenant (binary $REIN)
  serve_toml "$W/one-$1.toml" 127.0.0.33 "$1" "${IO_ENGINE:-uring}"
  "$REIN" serve --config "$W/one-$1.toml" 2>/dev/null & local pid=$!
  wait_port 127.0.0.33 10809
  measure $pid fio_one nbd://127.0.0.33:10809/bench
  kill $pid; wait $pid 2>/dev/null || true
}
rein_many() { # scheduler -> total IOPS with 100 tenants (one read-only export each, same file), one fio job per tenant (binary $REIN)
  { echo "listen = \"127.0.0.34:10809\""; echo "admin = \"127.0.0.34:9180\""; echo "data_dir = \"$W/data\""; echo "scheduler = \"$1\""
    echo "io_engine = \"${IO_ENGINE:-uring}\""
    for i in $(seq 0 99); do printf '[[exports]]\nname = "t%d"\npath = "%s"\nsize_mb = 1024\nread_only = true\n' $i "$FILE"; done; } > "$W/many-$1.toml"
  "$REIN" serve --config "$W/many-$1.toml" 2>/dev/null & local pid=$!
  wait_port 127.0.0.34 10809
  measure $pid fio_many nbd://127.0.0.34:10809 100
  kill $pid; wait $pid 2>/dev/null || true
}
declare -A R
for r in $(seq "$ROUNDS"); do
  echo "round $r/$ROUNDS ..." >&2
  R[qemu_threads]+="$(qemu_run threads),"
  R[qemu_uring]+="$(qemu_run io_uring),"
  R[nbdkit]+="$(nbdkit_run),"
  R[rein_mclock]+="$(rein_one mclock),"
  R[rein_fifo]+="$(rein_one fifo),"
  R[many_mclock]+="$(rein_many mclock),"
  R[many_fifo]+="$(rein_many fifo),"
  if [ -n "${BASE:-}" ]; then
    REIN=$BASE
    R[base_mclock]+="$(rein_one mclock),"
    R[base_fifo]+="$(rein_one fifo),"
    R[base_many_mclock]+="$(rein_many mclock),"
    R[base_many_fifo]+="$(rein_many fifo),"
    REIN=./target/release/rein
  fi
done
python3 - "$SECS" "$ROUNDS" "$(qemu-nbd --version | head -1 | awk '{print $2}')" "$(nbdkit --version | awk '{print $2}')" \
  "${R[qemu_threads]}" "${R[qemu_uring]}" "${R[nbdkit]}" "${R[rein_mclock]}" "${R[rein_fifo]}" "${R[many_mclock]}" "${R[many_fifo]}" \
  ${BASE:+"${R[base_mclock]}" "${R[base_fifo]}" "${R[base_many_mclock]}" "${R[base_many_fifo]}"} <<'PY'
import statistics, sys
secs, rounds, qv, kv = sys.argv[1:5]
pairs = [[tuple(map(float, x.split())) for x in a.strip(",").split(",")] for a in sys.argv[5:]]
runs = [[p[0] for p in ps] for ps in pairs]
cpus = [[p[1] for p in ps] for ps in pairs]
med = [statistics.median(r) for r in runs]
cpu = [statistics.median(c) for c in cpus]
names = [f"qemu-nbd {qv} (--aio=threads, its default)", f"qemu-nbd {qv} (--aio=io_uring)", f"nbdkit {kv} file plugin",
         "rein serve, 1 tenant, mclock (iodepth 16)", "rein serve, 1 tenant, fifo (iodepth 16)",
         "rein serve, 100 tenants, mclock (100 jobs x iodepth 1)", "rein serve, 100 tenants, fifo (100 jobs x iodepth 1)"]
print(f"| server (fio nbd, 4 KiB random reads, {secs} s x {rounds} rounds) | median IOPS | min-max | server CPU us/IO |")
print("|---|---:|---:|---:|")
for n, m, r, c in zip(names, med, runs, cpu):
    print(f"| {n} | {m:,.0f} | {min(r):,.0f}-{max(r):,.0f} | {c:.1f} |")
best = max(med[0], med[1], med[2])
print(f"\nrein (mclock, 1 tenant) vs the fastest of qemu-nbd and nbdkit: {med[3]/best:.2f}x")
print(f"mClock cost vs fifo (median): 1 tenant {100*(1-med[3]/med[4]):+.1f}%, 100 tenants {100*(1-med[5]/med[6]):+.1f}% of throughput;")
print(f"  server CPU per IO: 1 tenant {100*(cpu[3]/cpu[4]-1):+.1f}%, 100 tenants {100*(cpu[5]/cpu[6]-1):+.1f}%")
if len(med) > 7:
    print("\nthis build / the base build (median IOPS; server CPU per IO):")
    for label, i, j in [("1 tenant, mclock", 3, 7), ("1 tenant, fifo", 4, 8), ("100 tenants, mclock", 5, 9), ("100 tenants, fifo", 6, 10)]:
        print(f"  {label}: IOPS {med[i]/med[j]:.3f}x ({med[j]:,.0f} -> {med[i]:,.0f}); CPU/IO {cpu[i]/cpu[j]:.3f}x")
PY
