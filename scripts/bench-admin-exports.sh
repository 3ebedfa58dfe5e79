#!/usr/bin/env bash
# Exports added at run time at scale: adds N file exports (1 MiB images in the data directory) to rein
# serve one `POST /api/exports` at a time (one keep-alive connection, each answered before the next), and
# prints the seconds the adds took and the ms per add over the last 200 (each add checks the new file
# against every running export's, and keeps the change in the state file).
# With BASE=path/to/an/older/rein the same runs with that binary alternate with this build's, ROUNDS times
# each, and the table ends with the ratios of the medians (this build over the base).
# Usage: [BASE=rein-before] bash scripts/bench-admin-exports.sh [N (at most 4095)] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-4000}
ROUNDS=${2:-1}
command -v python3 >/dev/null || { echo "needs python3 (apt-get install python3)" >&2; exit 1; }
[ "$N" -ge 200 ] && [ "$N" -le 4095 ] || { echo "N must be 200..=4095 (4,096 exports at most, one configured)" >&2; exit 1; }
cargo build --release --locked -p rein -q
W=$(mktemp -d)
PID=
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT
cat > "$W/rein.toml" <<TOML
listen = "127.0.0.35:10809"
admin = "127.0.0.35:9180"
data_dir = "$W/data"
[[exports]]
name = "x"
backend = "memory"
size_mb = 1
TOML
run() { # binary -> one row: adds_s ms_per_add(last 200)
  rm -rf "$W/data"
  "$1" serve --config "$W/rein.toml" >"$W/log" 2>&1 & PID=$!
  for _ in $(seq 600); do
    curl -sf http://127.0.0.35:9180/healthz >/dev/null 2>&1 && break
    kill -0 "$PID" 2>/dev/null || { cat "$W/log" >&2; exit 1; }
    sleep 0.1
  done
  python3 - "$N" <<'PY'
import http.client, json, sys, time
n = int(sys.argv[1])
c = http.client.HTTPConnection("127.0.0.35", 9180)
def call(method, path, body):
    c.request(method, path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse(); data = r.read()
    if r.status not in (200, 201):
        sys.exit(f"{method} {path}: {r.status} {data[:200]!r}")
call("POST", "/api/tenants", {"name": "t"})
t0 = time.monotonic(); mark = t0
for i in range(n):
    if i == n - 200: mark = time.monotonic()
    call("POST", "/api/exports", {"name": f"e{i:05}", "size_mb": 1, "tenant": "t"})
t1 = time.monotonic()
print(f"{t1 - t0:.2f} {1000 * (t1 - mark) / 200:.2f}")
PY
  kill "$PID"; wait "$PID" 2>/dev/null || true; PID=
}
echo "N=$N exports, $ROUNDS round(s); columns: adds_s ms_per_add(last 200)"
for r in $(seq "$ROUNDS"); do
  if [ -n "${BASE:-}" ]; then echo "base  $(run "$BASE")" | tee -a "$W/rows"; fi
  echo "this  $(run ./target/release/rein)" | tee -a "$W/rows"
done
if [ -n "${BASE:-}" ]; then
  python3 - "$W/rows" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
cols = ["adds_s", "ms_per_add"]
med = {who: [statistics.median(float(r[i + 1]) for r in rows if r[0] == who) for i in range(len(cols))] for who in ("base", "this")}
print("this/base  " + "  ".join(f"{c} {t / b:.3f}x" for c, t, b in zip(cols, med["this"], med["base"])))
PY
fi
