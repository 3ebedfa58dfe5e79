# Shared by the admin API benchmarks (sourced, not run): builds the release binary, makes the scratch
# directory $W (removed at exit, with the server $PID killed) holding rein.toml (rein serve on 127.0.0.34,
# admin :9180, data in $W/data, one memory export), and defines start, stop and print_ratios.
command -v python3 >/dev/null || { echo "needs python3 (apt-get install python3)" >&2; exit 1; }
cargo build --release --locked -p rein -q
W=$(mktemp -d)
PID=
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT
cat > "$W/rein.toml" <<TOML
listen = "127.0.0.34:10809"
admin = "127.0.0.34:9180"
data_dir = "$W/data"
[[exports]]
name = "x"
backend = "memory"
size_mb = 1
TOML
start() { # binary -> sets PID, waits for /healthz, prints the seconds it took
  local t0; t0=$(date +%s.%N)
  "$1" serve --config "$W/rein.toml" >"$W/log" 2>&1 & PID=$!
  for _ in $(seq 600); do
    if curl -sf http://127.0.0.34:9180/healthz >/dev/null 2>&1; then
      python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$t0" "$(date +%s.%N)"
      return
    fi
    kill -0 "$PID" 2>/dev/null || { cat "$W/log" >&2; exit 1; }
    sleep 0.1
  done
  echo "rein serve did not answer in 60 s" >&2; exit 1
}
stop() { kill "$PID"; wait "$PID" 2>/dev/null || true; PID=; }
print_ratios() { # column names... -> the ratios of the medians of $W/rows' "this" and "base" rows
  python3 - "$W/rows" "$@" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
cols = sys.argv[2:]
med = {who: [statistics.median(float(r[i + 1]) for r in rows if r[0] == who) for i in range(len(cols))] for who in ("base", "this")}
print("this/base  " + "  ".join(f"{c} {t / b:.3f}x" if b else f"{c} -" for c, t, b in zip(cols, med["this"], med["base"])))
PY
}
