#!/usr/bin/env bash
# FUA write benchmark: qemu-img bench writes COUNT 4 KiB blocks at queue depth 16 to rein serve over NBD,
# with FUA on every write (cache=writethrough: qemu sets NBD_CMD_FLAG_FUA when the server offers it) and
# without (cache=writeback), under both IO engines (io_uring: the write, then an fdatasync of its own in
# the same ring slot, uring.rs invariant 4; threads: pwrite, then fdatasync). The backing file is a
# regular file in a scratch directory on the disk that holds /tmp, so every FUA write waits for that
# disk. Every row runs ROUNDS times, interleaved; the table gives the median IOPS and the spread.
# With BASE=path/to/an/older/rein, every row also runs with that binary in the same rounds, and the table
# ends with the ratios (this build over the base).
# Usage: [BASE=rein-before] bash scripts/bench-fua.sh [COUNT] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
COUNT=${1:-20000}
ROUNDS=${2:-3}
for t in qemu-img python3; do command -v $t >/dev/null || { echo "needs $t (apt-get install qemu-utils python3)" >&2; exit 1; }; done
source scripts/bench-common.sh
# Runs binary $1 with engine $2, qemu-img bench with cache mode $3; prints the IOPS.
run() {
  serve_toml "$W/fua.toml" 127.0.0.34 fifo "$2"
  "$1" serve --config "$W/fua.toml" 2>/dev/null & local pid=$!
  PIDS+=("$pid")
  wait_port 127.0.0.34 10809
  local out
  out=$(qemu-img bench -w -f raw -t "$3" -c "$COUNT" -d 16 -s 4096 nbd://127.0.0.34:10809/bench 2>&1)
  kill "$pid"; wait "$pid" 2>/dev/null || true
  python3 -c 'import re,sys; t=sys.argv[1]; s=float(re.search(r"Run completed in ([0-9.]+) seconds", t).group(1)); print(round(int(sys.argv[2]) / s))' "$out" "$COUNT"
}
declare -A R
ROWS=("uring writethrough" "uring writeback" "threads writethrough" "threads writeback")
for round in $(seq "$ROUNDS"); do
  for row in "${ROWS[@]}"; do
    set -- $row
    R["new $row"]+="$(run ./target/release/rein "$1" "$2") "
    if [ -n "${BASE:-}" ]; then R["base $row"]+="$(run "$BASE" "$1" "$2") "; fi
  done
  echo "round $round of $ROUNDS done" >&2
done
for row in "${ROWS[@]}"; do
  echo "new|$row|${R["new $row"]}"
  if [ -n "${BASE:-}" ]; then echo "base|$row|${R["base $row"]}"; fi
done | python3 -c '
import statistics, sys
rows = {}
for line in sys.stdin:
    who, row, vals = line.rstrip("\n").split("|")
    rows[(who, row)] = [int(v) for v in vals.split()]
print("%-5s %-22s %11s %8s   %s" % ("build", "engine / cache", "median IOPS", "spread", "each round (4 KiB writes, depth 16; writethrough = FUA on every write)"))
for (who, row), v in rows.items():
    m = statistics.median(v)
    print("%-5s %-22s %11.0f %7.1f%%   %s" % (who, row, m, 100 * (max(v) - min(v)) / m, " ".join(map(str, v))))
for (who, row), v in rows.items():
    if who == "new" and ("base", row) in rows:
        print("ratio %-22s %.3fx (this build / base)" % (row, statistics.median(v) / statistics.median(rows[("base", row)])))
'
