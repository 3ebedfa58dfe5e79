#!/usr/bin/env bash
# A copy of a sparse gateway volume (docs/gateway.md, block status): three rein serve storage nodes
# (protocol rein, sparse file exports of 1,600 MiB) and a rein gateway with a 4 GiB volume over them
# (64 KiB units, widths 1, 1, 1), all on this host; 8 runs of 512 KiB written through the gateway (4 MiB
# of data), then `nbdcopy` of the volume to a sparse file: its wall time and the bytes the nodes moved
# meanwhile (rein_tenant_bytes_total summed over them and their tenants) and the gateway's READ bytes for
# the volume, and the copy's data checked. REIN=path/to/a/rein runs that binary for nodes and gateway
# instead of this tree's release build (an older build: the gateway offered no metadata context, and the
# copy read all 4 GiB). PROTOCOL=nbd has the gateway speak plain NBD to the nodes (their block status
# then comes over its status connections; before, plain nodes were not asked).
# Usage: [REIN=rein-before] [PROTOCOL=rein|nbd] [IP_PREFIX=127.0.0.] [FIRST=107] \
#   bash scripts/bench-gateway-block-status.sh
set -euo pipefail
cd "$(dirname "$0")/.."
for t in nbdcopy nbdsh curl bc; do command -v $t >/dev/null || { echo "needs $t" >&2; exit 1; }; done
if [ -z "${REIN:-}" ]; then
  cargo build --release --locked -p rein -q
  REIN=${CARGO_TARGET_DIR:-target}/release/rein
fi
P=${IP_PREFIX:-127.0.0.}
F=${FIRST:-107}
PROTOCOL=${PROTOCOL:-rein}
NODES="$F $((F + 1)) $((F + 2))"
GW=$P$((F + 3))
W=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$W"' EXIT
for h in $NODES; do
  mkdir -p "$W/n$h"
  truncate -s 1600M "$W/n$h/v.img"
  cat > "$W/n$h/rein.toml" <<EOT
listen = "$P$h:10809"
admin = "$P$h:9190"
data_dir = "$W/n$h/data"
capacity_iops = 100000
scheduler = "dmclock"
[[exports]]
name = "v"
path = "$W/n$h/v.img"
[node]
enabled = true
specs = "gateway"
EOT
  "$REIN" serve --config "$W/n$h/rein.toml" 2>"$W/n$h/log" &
done
{
  echo "listen = \"$GW:10809\""
  echo "admin = \"$GW:9190\""
  i=0
  for h in $NODES; do
    i=$((i + 1))
    printf '[[nodes]]\nname = "s%s"\naddress = "%s%s:10809"\nprotocol = "%s"\n' $i "$P" $h "$PROTOCOL"
  done
  printf '[[tenants]]\nname = "c"\n[[exports]]\nname = "v"\ntenant = "c"\nsize_mb = 4096\nstripe_kb = 64\n'
} > "$W/gw.toml"
sleep 1
"$REIN" gateway --config "$W/gw.toml" 2>"$W/gw.log" &
URI=nbd://$GW:10809/v
for _ in $(seq 100); do nbdinfo --size "$URI" >/dev/null 2>&1 && break; sleep 0.2; done
PATH=/usr/bin:$PATH nbdsh -c "
h.connect_uri('$URI')
for i in range(8):
    h.pwrite(bytes([0x41 + i]) * 524288, i * 512 * 1048576 + 12345 * 4096)
h.flush()
"
moved() {
  for h in $NODES; do
    curl -s "$P$h:9190/metrics" | grep '^rein_tenant_bytes_total{' | awk '{print $2}'
  done | awk '{s += $1} END {printf "%.0f\n", s}'
}
gw_read() {
  curl -s "$GW:9190/metrics" | grep '^rein_gateway_read_bytes_total{export="v"}' | awk '{printf "%.0f\n", $2}'
}
before=$(moved)
gw_before=$(gw_read)
truncate -s 4G "$W/copy.img"
start=$(date +%s.%N)
nbdcopy "$URI" "$W/copy.img"
end=$(date +%s.%N)
after=$(moved)
gw_after=$(gw_read)
echo "nbdcopy of a 4 GiB volume with 4 MiB of data (protocol $PROTOCOL): $(echo "$end - $start" | bc) s, $((after - before)) bytes at the nodes, $((gw_after - gw_before)) bytes read through the gateway"
for i in 0 1 2 3 4 5 6 7; do
  want=$(printf "\\\\x%x" $((0x41 + i)))
  got=$(dd if="$W/copy.img" bs=4096 skip=$((i * 512 * 256 + 12345)) count=128 2>/dev/null | tr -d "$(printf "$want")" | wc -c)
  [ "$got" = 0 ] || { echo "run $i not copied" >&2; exit 1; }
done
echo "the copy holds the data"
