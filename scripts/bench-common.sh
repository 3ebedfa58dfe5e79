# Shared by the NBD benchmarks (sourced, not run): builds the release binary, makes the scratch directory
# $W (removed at exit, with every server pid in PIDS killed) and the 1 GiB backing file $FILE (random
# bytes, in the page cache after this), and defines wait_port.
cargo build --release --locked -p rein -q
W=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$W"; }
trap cleanup EXIT
FILE=$W/disk.img
head -c $((1 << 30)) /dev/urandom > "$FILE"
# Waits until something listens on address $1, port $2 (10 s at most).
wait_port() { for _ in $(seq 100); do (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null && return 0; sleep 0.1; done; echo "no server on $1:$2" >&2; exit 1; }
