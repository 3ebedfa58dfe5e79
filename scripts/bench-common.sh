# Shared by the NBD benchmarks (sourced, not run): builds the release binary, makes the scratch directory
# $W (removed at exit, with every server pid in PIDS killed) and the 1 GiB backing file $FILE (random
# bytes, in the page cache after this), and defines wait_port and serve_toml.
cargo build --release --locked -p rein -q
W=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$W"; }
trap cleanup EXIT
FILE=$W/disk.img
head -c $((1 << 30)) /dev/urandom > "$FILE"
# Waits until something listens on address $1, port $2 (10 s at most).
wait_port() { for _ in $(seq 100); do (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null && return 0; sleep 0.1; done; echo "no server on $1:$2" >&2; exit 1; }
# Writes to $1 a rein serve configuration: NBD on $2:10809, admin on $2:9180, scheduler $3, IO engine $4,
# and $FILE (1 GiB) as the export "bench".
serve_toml() {
  cat > "$1" <<TOML
listen = "$2:10809"
admin = "$2:9180"
data_dir = "$W/data"
scheduler = "$3"
io_engine = "$4"
[[exports]]
name = "bench"
path = "$FILE"
size_mb = 1024
TOML
}
