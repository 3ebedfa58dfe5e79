#!/usr/bin/env bash
# What rein serve spends per IO, counted rather than timed, so that two builds can be compared on a machine
# whose speed drifts (this 2-core VM: +-20% between 6 s runs of scripts/bench-nbd.sh). For each binary
# (this build, and BASE if given) and each load (100 tenants x 100 fio jobs at iodepth 1, and 1 tenant at
# iodepth 16; 4 KiB random reads of a page-cached file, FIFO scheduler):
#   - user-space instructions per IO: `valgrind --tool=callgrind` on the server, run twice with N and 3N
#     IOs per job, the difference divided by the extra IOs (start-up and handshakes cancel out);
#   - system calls per IO: `perf stat` on the syscalls tracepoints of the server (not under valgrind).
# On a quiet machine the same binary repeated within about 1% (14,311 and 14,460 instructions per IO at 100
# tenants); with other work running they move (the build before issue 12: 13,054 beside two fuzzers,
# 13,782 quiet), because how many requests a wake-up finds changes the work per IO: compare builds in one
# sitting on a quiet machine. They leave out the kernel, which the system calls stand for. At iodepth 1
# the system calls per IO repeat (2.36-2.53); at iodepth 16 they follow the batching, which varies from
# run to run (1.5-2.7 per IO seen for one binary under load), so compare them there over several runs.
# Needs valgrind, perf (linux-perf), fio. Servers listen on 127.0.0.36 and are
# stopped at the end.
# Usage: [BASE=rein-before] [N=100] bash scripts/bench-nbd-cost.sh
set -euo pipefail
cd "$(dirname "$0")/.."
for t in valgrind perf fio python3; do command -v $t >/dev/null || { echo "needs $t (apt-get install valgrind linux-perf fio python3)" >&2; exit 1; }; done
source scripts/bench-common.sh
N=${N:-100}
config() { # load -> config path
  { echo 'listen = "127.0.0.36:10809"'; echo 'admin = "127.0.0.36:9180"'; echo "data_dir = \"$W/data\""
    echo 'scheduler = "fifo"'; echo 'io_engine = "uring"'
    local n=1; [ "$1" = many ] && n=100
    for i in $(seq 0 $((n - 1))); do printf '[[exports]]\nname = "t%d"\npath = "%s"\nsize_mb = 1024\nread_only = true\n' "$i" "$FILE"; done
  } > "$W/$1.toml"
  echo "$W/$1.toml"
}
load() { # load, IOs per job: runs fio to the end
  local args=()
  if [ "$1" = many ]; then
    for i in $(seq 0 99); do args+=(--name=t$i --uri=nbd://127.0.0.36:10809/t$i); done
    fio --thread --ioengine=nbd --rw=randread --bs=4k --iodepth=1 --number_ios="$2" --size=1g "${args[@]}" >/dev/null 2>&1
  else
    fio --ioengine=nbd --name=t0 --uri=nbd://127.0.0.36:10809/t0 --rw=randread --bs=4k --iodepth=16 \
        --number_ios="$(( $2 * 100 ))" --size=1g >/dev/null 2>&1
  fi
}
instructions() { # binary, load, IOs per job -> instructions (server, whole run)
  rm -rf "$W/data"
  valgrind --tool=callgrind --callgrind-out-file="$W/cg.out" "$1" serve --config "$(config "$2")" 2>"$W/vg.log" &
  local pid=$!; PIDS+=($pid)
  for _ in $(seq 600); do (exec 3<>/dev/tcp/127.0.0.36/10809) 2>/dev/null && break; sleep 0.1; done
  load "$2" "$3"
  kill -INT $pid; wait $pid || true
  awk '/^(summary|totals):/ { print $2; exit }' "$W/cg.out"
}
syscalls() { # binary, load -> "total per IO" and the main ones
  rm -rf "$W/data"
  "$1" serve --config "$(config "$2")" 2>/dev/null & local pid=$!; PIDS+=($pid)
  wait_port 127.0.0.36 10809
  local ev=writev,recvfrom,sendto,epoll_wait,io_uring_enter,futex,read,write
  perf stat -e "$(echo "$ev" | sed 's/\([a-z_]*\)/syscalls:sys_enter_\1/g')" -p $pid -o "$W/st.txt" & local ps=$!
  sleep 0.5
  load "$2" $((N * 10))
  kill -INT $ps; wait $ps || true
  kill $pid; wait $pid 2>/dev/null || true
  awk -v n=$((N * 10 * 100)) '/syscalls:/ { gsub(",", "", $1); sub("syscalls:sys_enter_", "", $2); s += $1; if ($1 / n >= 0.01) d = d sprintf(" %s %.2f", $2, $1 / n) }
       END { printf "%.2f (%s)", s / n, substr(d, 2) }' "$W/st.txt"
}
bins=(./target/release/rein); [ -n "${BASE:-}" ] && bins+=("$BASE")
echo "| binary | load | user instructions per IO | system calls per IO |"
echo "|---|---|---:|---|"
declare -A I
for l in many one; do
  for b in "${bins[@]}"; do
    echo "$b, $l ..." >&2
    a=$(instructions "$b" $l "$N"); c=$(instructions "$b" $l $((N * 3)))
    I[$b$l]=$(( (c - a) / (N * 2 * 100) ))
    echo "| $b | $([ $l = many ] && echo '100 tenants x iodepth 1' || echo '1 tenant, iodepth 16') | ${I[$b$l]} | $(syscalls "$b" $l) |"
  done
done
if [ -n "${BASE:-}" ]; then
  for l in many one; do
    python3 -c "import sys; a,b=map(int,sys.argv[1:3]); print(f'{sys.argv[3]}: this build / base, user instructions per IO {a/b:.3f}x')" \
      "${I[./target/release/rein$l]}" "${I[$BASE$l]}" "$l"
  done
fi
