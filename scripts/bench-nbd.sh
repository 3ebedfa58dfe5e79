#!/usr/bin/env bash
# NBD server benchmark: the same backing file and the same client (fio's nbd engine, 4 KiB random reads,
# iodepth 16, SECONDS s) against qemu-nbd, nbdkit's file plugin, and rein serve (mClock and FIFO, with 1 and
# with 100 tenants). Prints a Markdown table of IOPS. Servers listen on their own 127.0.0.x addresses and
# are stopped at the end. Usage: bash scripts/bench-nbd.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-10}
for t in qemu-nbd nbdkit fio; do command -v $t >/dev/null || { echo "needs $t (apt-get install qemu-utils nbdkit fio)" >&2; exit 1; }; done
cargo build --release --locked -p rein -q
W=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$W"; }
trap cleanup EXIT
FILE=$W/disk.img
head -c $((1 << 30)) /dev/urandom > "$FILE"   # 1 GiB, in the page cache after this
wait_port() { for _ in $(seq 100); do (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null && return 0; sleep 0.1; done; echo "no server on $1:$2" >&2; exit 1; }
fio_iops() { # uri -> IOPS
  fio --name=b --ioengine=nbd --uri="$1" --rw=randread --bs=4k --iodepth=16 --time_based --runtime="$SECS" \
      --size=1g --output-format=json 2>/dev/null | python3 -c 'import json,sys; t=sys.stdin.read(); print(round(json.loads(t[t.index("{"):])["jobs"][0]["read"]["iops"]))'
}
fio_many() { # base uri, n exports -> total IOPS (one job per export, iodepth 1 each... 16 jobs x iodepth 16 / 16)
  local base=$1 n=$2 args=()
  for i in $(seq 0 $((n - 1))); do args+=(--name=t$i --uri="$base/t$i"); done
  fio --ioengine=nbd --rw=randread --bs=4k --iodepth=1 --time_based --runtime="$SECS" --size=1g --group_reporting \
      --output-format=json "${args[@]}" 2>/dev/null | python3 -c 'import json,sys; t=sys.stdin.read(); print(round(json.loads(t[t.index("{"):])["jobs"][0]["read"]["iops"]))'
}
qemu-nbd -f raw -t -b 127.0.0.31 -p 10809 -x bench "$FILE" & PIDS+=($!); wait_port 127.0.0.31 10809
nbdkit -f -i 127.0.0.32 -p 10809 -e bench file file="$FILE" & PIDS+=($!); wait_port 127.0.0.32 10809
q=$(fio_iops nbd://127.0.0.31:10809/bench)
k=$(fio_iops nbd://127.0.0.32:10809/bench)
rein_one() { # scheduler -> IOPS with one unlimited tenant
  cat > "$W/one-$1.toml" <<TOML
listen = "127.0.0.33:10809"
admin = "127.0.0.33:9180"
data_dir = "$W/data"
scheduler = "$1"
io_engine = "${IO_ENGINE:-uring}"
[[exports]]
name = "bench"
path = "$FILE"
size_mb = 1024
TOML
  ./target/release/rein serve --config "$W/one-$1.toml" 2>/dev/null & local pid=$!
  wait_port 127.0.0.33 10809
  fio_iops nbd://127.0.0.33:10809/bench
  kill $pid; wait $pid 2>/dev/null || true
}
rein_many() { # scheduler -> total IOPS with 100 tenants (one export each, same file), one fio job per tenant
  { echo "listen = \"127.0.0.34:10809\""; echo "admin = \"127.0.0.34:9180\""; echo "data_dir = \"$W/data\""; echo "scheduler = \"$1\""
    for i in $(seq 0 99); do printf '[[exports]]\nname = "t%d"\npath = "%s"\nsize_mb = 1024\n' $i "$FILE"; done; } > "$W/many-$1.toml"
  ./target/release/rein serve --config "$W/many-$1.toml" 2>/dev/null & local pid=$!
  wait_port 127.0.0.34 10809
  fio_many nbd://127.0.0.34:10809 100
  kill $pid; wait $pid 2>/dev/null || true
}
rm_=$(rein_one mclock); rf=$(rein_one fifo)
mm=$(rein_many mclock); mf=$(rein_many fifo)
echo "| server (fio nbd, 4 KiB random reads, ${SECS} s) | IOPS |"
echo "|---|---:|"
echo "| qemu-nbd $(qemu-nbd --version | head -1 | awk '{print $2}') | $q |"
echo "| nbdkit $(nbdkit --version | awk '{print $2}') file plugin | $k |"
echo "| rein serve, 1 tenant, mclock (iodepth 16) | $rm_ |"
echo "| rein serve, 1 tenant, fifo (iodepth 16) | $rf |"
echo "| rein serve, 100 tenants, mclock (100 jobs x iodepth 1) | $mm |"
echo "| rein serve, 100 tenants, fifo (100 jobs x iodepth 1) | $mf |"
python3 - "$q" "$k" "$rm_" "$rf" "$mm" "$mf" <<'PY'
import sys
q,k,rm,rf,mm,mf=map(float,sys.argv[1:])
best=max(q,k)
print(f"\nrein (mclock, 1 tenant) vs the faster of qemu-nbd and nbdkit: {rm/best:.2f}x")
print(f"mClock cost vs fifo: 1 tenant {100*(1-rm/rf):+.1f}%, 100 tenants {100*(1-mm/mf):+.1f}% of throughput")
PY
