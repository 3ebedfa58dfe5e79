#!/usr/bin/env bash
# Run-time changes at scale: adds N tenants to rein serve one `POST /api/tenants` at a time (one client,
# one keep-alive connection, each request answered before the next: what a provisioning tool does), then
# changes each one's spec once (`PUT`), reads them back (`GET /api/tenants`, one tenant's
# `GET /api/tenants/NAME`, a `/metrics` scrape), reloads the unchanged file (SIGHUP: the state applied over
# it again), and restarts the server on the state it kept. Prints, per binary, the seconds the adds took
# (and the last thousand's ms per change), the seconds of the PUTs, the ms per read of each kind (the median
# of several), the ms from the SIGHUP to the log's `configuration reloaded`, the bytes the server wrote
# over the adds and PUTs (write(2) bytes, /proc/PID/io wchar: the state's files and the answers), the files
# left in the data directory, and how long the restart took to apply them (until /healthz answers).
# With BASE=path/to/an/older/rein the same runs with that binary alternate with this build's, ROUNDS
# times each, and the table ends with the ratios of the medians (this build over the base).
# Usage: [BASE=rein-before] bash scripts/bench-admin.sh [N] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-4096}
ROUNDS=${2:-1}
. scripts/bench-admin-common.sh
run() { # binary -> one row: adds_s last1000_ms_per_change puts_s list_ms one_ms metrics_ms reload_ms written_MB restart_s files
  rm -rf "$W/data"
  start "$1" >/dev/null
  local times; times=$(python3 - "$N" "$PID" "$W/log" <<'PY'
import datetime, http.client, json, os, signal, sys, time
n = int(sys.argv[1])
def wchar():  # bytes the server has written (its answers too)
    return next(int(l.split()[1]) for l in open(f"/proc/{sys.argv[2]}/io") if l.startswith("wchar"))
c = http.client.HTTPConnection("127.0.0.34", 9180)
def call(method, path, body=None):
    c.request(method, path, body=None if body is None else json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse(); data = r.read()
    if r.status not in (200, 201):
        sys.exit(f"{method} {path}: {r.status} {data[:200]!r}")
def ms_per(path, times):
    took = []
    for _ in range(times):
        t = time.monotonic(); call("GET", path); took.append(1000 * (time.monotonic() - t))
    return sorted(took)[len(took) // 2]
w0 = wchar(); t0 = time.monotonic(); mark = t0
for i in range(n):
    if i == n - 1000: mark = time.monotonic()
    call("POST", "/api/tenants", {"name": f"t{i:06}", "reservation": 0, "weight": 1})
t1 = time.monotonic()
for i in range(n):
    call("PUT", f"/api/tenants/t{i:06}", {"weight": 2})
t2 = time.monotonic(); w1 = wchar()
reads = [ms_per("/api/tenants", 9), ms_per(f"/api/tenants/t{n // 2:06}", 99), ms_per("/metrics", 9)]
def reloaded():  # the timestamps of the log's "configuration reloaded" lines
    return [datetime.datetime.fromisoformat(l.split()[0]).timestamp() for l in open(sys.argv[3]) if "configuration reloaded" in l]
before = len(reloaded()); sent = time.time(); os.kill(int(sys.argv[2]), signal.SIGHUP)
while len(reloaded()) == before:
    if time.time() - sent > 120: sys.exit("no reload within 120 s")
    time.sleep(0.01)
reads.append(1000 * (reloaded()[-1] - sent))
print(f"{t1 - t0:.2f} {1000 * (t1 - mark) / min(n, 1000):.2f} {t2 - t1:.2f} " + " ".join(f"{x:.2f}" for x in reads) + f" {(w1 - w0) // 1000000}")
PY
)
  stop
  local files; files=$(cd "$W/data" && ls -1 | grep -v '^rein.lock$' | while read -r f; do printf '%s:%sKB ' "$f" $(( $(stat -c %s "$f") / 1024 )); done)
  start "$1" > "$W/restart"; local restart; restart=$(cat "$W/restart")
  local count; count=$(curl -sf http://127.0.0.34:9180/api/tenants | python3 -c 'import json,sys; t=json.load(sys.stdin); print(sum(1 for x in t if x["weight"] == 2))')
  stop
  [ "$count" = "$N" ] || { echo "after the restart $count of $N tenants have their changed spec" >&2; exit 1; }
  echo "$times $restart ${files:-none}"
}
echo "N=$N tenants, $ROUNDS round(s); columns: adds_s ms_per_add(last 1000) puts_s list_ms one_ms metrics_ms reload_ms written_MB restart_s files"
for r in $(seq "$ROUNDS"); do
  if [ -n "${BASE:-}" ]; then run "$BASE" > "$W/row"; echo "base  $(cat "$W/row")" | tee -a "$W/rows"; fi
  run ./target/release/rein > "$W/row"; echo "this  $(cat "$W/row")" | tee -a "$W/rows"
done
if [ -n "${BASE:-}" ]; then print_ratios adds_s ms_per_add puts_s list_ms one_ms metrics_ms reload_ms written_MB restart_s; fi
