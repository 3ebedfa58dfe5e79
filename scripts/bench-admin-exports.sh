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
[ "$N" -ge 200 ] && [ "$N" -le 4095 ] || { echo "N must be 200..=4095 (4,096 exports at most, one configured)" >&2; exit 1; }
. scripts/bench-admin-common.sh
run() { # binary -> one row: adds_s ms_per_add(last 200)
  rm -rf "$W/data"
  start "$1" >/dev/null
  python3 - "$N" <<'PY'
import http.client, json, sys, time
n = int(sys.argv[1])
c = http.client.HTTPConnection("127.0.0.34", 9180)
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
  stop
}
echo "N=$N exports, $ROUNDS round(s); columns: adds_s ms_per_add(last 200)"
for r in $(seq "$ROUNDS"); do
  if [ -n "${BASE:-}" ]; then echo "base  $(run "$BASE")" | tee -a "$W/rows"; fi
  echo "this  $(run ./target/release/rein)" | tee -a "$W/rows"
done
if [ -n "${BASE:-}" ]; then print_ratios adds_s ms_per_add; fi
