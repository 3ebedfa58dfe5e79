#!/usr/bin/env bash
# The same scenario files in the simulator and on real daemons (issue 13 point 5): for each scenario,
# `rein sim --check --out` and `rein cluster run --check --out` (rein serve nodes on 127.0.0.x, a rein
# gateway per tenant over several servers, the scenario's duration in real time), then per tenant
# paper | sim | real IOPS after warm-up and real/sim, and every [[expect]] as measured by both. The paper
# column is the scenario's own `[[expect]] metric = "iops", equals = ...` without a window (the figures its
# notes quote), "-" where it has none.
#
#   scripts/cluster-vs-sim.sh                 # the issue's eleven scenarios and three pShift ones (about 16 minutes)
#   scripts/cluster-vs-sim.sh one-server      # the 23 files of one server (mClock's Part 1, RBFQ, traces; 55 min)
#   scripts/cluster-vs-sim.sh traces          # RBFQ §4.2's four trace files, routed by device (about 3 minutes)
#   scripts/cluster-vs-sim.sh dmclock-fig9-resv rbfq-fig11a-uniform   # some of them
#   JOBS=3 scripts/cluster-vs-sim.sh one-server   # three scenarios at a time (tables printed in order)
#   GROUPS_AT_ONCE=1 scripts/cluster-vs-sim.sh parda-fig5-workloads   # the real run a group at a time
#                                             # (`rein cluster run --groups-at-once 1`; about 14 minutes)
#
# Runs are in real time on a shared machine: the real column varies from run to run. The release binary
# is built first; every process a run starts is stopped by `rein cluster run` itself. With JOBS > 1 the
# runs share the machine: fine for runs of a few thousand IOPS (trace-websearch, 800 IOPS, used 0.14 of a CPU
# in the release build), not for the pShift files, whose load is heavier.
set -euo pipefail
cd "$(dirname "$0")/.."
SCENARIOS=("$@")
if [ "${SCENARIOS[*]}" = one-server ]; then
  SCENARIOS=(mclock-sec2-1 mclock-fig4-limits mclock-fig5 mclock-fig6-reservations mclock-fig6-sfq mclock-fig7-table3
    mclock-fig7-table3-iocost mclock-fig7-sfq mclock-fig8 mclock-fig8-sfq mclock-table4 mclock-table4-r1
    mclock-table5-sigma1 mclock-table5-sigma64 mclock-table5-batch mclock-overload-recovery
    mclock-overload-recovery-paper rbfq-fig6-7-reservations rbfq-fig8-capacity rbfq-fig13-dtfq rbfq-fig13-lfq
    trace-websearch trace-websearch-sfq)
elif [ "${SCENARIOS[*]}" = traces ]; then
  SCENARIOS=(rbfq-sec4-2-oltp-a rbfq-sec4-2-oltp-b rbfq-sec4-2-websearch1-r100 rbfq-sec4-2-websearch1-r20)
elif [ ${#SCENARIOS[@]} -eq 0 ]; then
  SCENARIOS=(dmclock-fig9-noresv dmclock-fig9-noresv-pool dmclock-fig9-resv dmclock-fig9-resv-pool
    dmclock-fig10 dmclock-fig10-pool rbfq-fig11a-uniform rbfq-fig11b-hotspot2 rbfq-fig11c-hotspot1
    rbfq-fig13-rbfq rbfq-fig14-adjust pshift-exp1-small pshift-exp3-limits-small pshift-exp4-small)
fi
jobs=${JOBS:-1}
case $jobs in '' | *[!0-9]* | 0) echo "JOBS must be a whole number of at least 1, got '$jobs'" >&2; exit 2 ;; esac
groups=()
if [ -n "${GROUPS_AT_ONCE:-}" ]; then
  case $GROUPS_AT_ONCE in *[!0-9]* | 0) echo "GROUPS_AT_ONCE must be a whole number of at least 1, got '$GROUPS_AT_ONCE'" >&2; exit 2 ;; esac
  groups=(--groups-at-once "$GROUPS_AT_ONCE")
fi
for s in "${SCENARIOS[@]}"; do
  [ -f "scenarios/$s.toml" ] || { echo "no scenario scenarios/$s.toml" >&2; exit 2; }
done
dup=$(printf '%s\n' "${SCENARIOS[@]}" | sort | uniq -d | head -n 1)
[ -z "$dup" ] || { echo "scenario $dup is named twice" >&2; exit 2; }
cargo build --release --locked -p rein -q
REIN=${CARGO_TARGET_DIR:-target}/release/rein
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
# The runs go in the background (JOBS), where a non-interactive shell has them ignore SIGINT: on Ctrl-C or
# SIGTERM each run's rein process gets SIGTERM, on which `rein cluster run` stops every process it started.
stop_runs() {
  trap - INT TERM
  for p in $(jobs -p); do pkill -TERM -P "$p" 2>/dev/null || true; done
  wait
  exit 1
}
trap stop_runs INT TERM
cat > "$W/table.py" <<'PY'
import json, os, sys, tomllib
scenario, sim, real, name = sys.argv[1:]
with open(scenario, "rb") as fh:
    sc = tomllib.load(fh)
paper = {}
for e in sc.get("expect", []):
    if e.get("metric") == "iops" and "tenant" in e and "equals" in e and "window" not in e:
        paper.setdefault(e["tenant"], e["equals"])
def load(d, f):
    p = os.path.join(d, f)
    return json.load(open(p)) if os.path.exists(p) else []
S, R = load(sim, "summary.json"), load(real, "summary.json")
print(f"\n{name}: IOPS after warm-up")
print(f"  {'tenant':<8} {'paper':>8} {'sim':>9} {'real':>9} {'real/sim':>9}")
real_iops = {t["name"]: t["iops"] for t in R["tenants"]}
for t in S["tenants"]:
    s, r, p = t["iops"], real_iops.get(t["name"], float("nan")), paper.get(t["name"])
    ratio = r / s if s else float("nan")
    print(f"  {t['name']:<8} {p if p is not None else '-':>8} {s:9.1f} {r:9.1f} {ratio:9.3f}")
cs, cr = load(sim, "check.json"), load(real, "check.json")
if cs:
    print("  expectations, measured by sim | real (ok = met):")
    num = lambda x: f"{x:9.3f}" if isinstance(x, (int, float)) else f"{'-':>9}"
    for a, b in zip(cs, cr):
        d = a["description"].split(" = ")[0]
        want = a["description"].split(", expected ")[-1]
        print(f"    {d:<40} {want[:40]:<40} {num(a['measured'])} {'ok' if a['ok'] else 'MISS':<4} | "
              f"{num(b['measured'])} {'ok' if b['ok'] else 'MISS'}")
PY
# One scenario: both runs in a directory of its own, then its table (or why not) in $W/$s.out.
compare() {
  local s=$1 f=scenarios/$1.toml d=$W/$1
  mkdir -p "$d"
  # --check exits 1 on a missed expectation: the table shows it; only a missing summary is a failure.
  "$REIN" sim "$f" --check --quiet --out "$d/sim" > /dev/null 2>&1 || true
  "$REIN" cluster run "$f" --base-port 0 --check --quiet "${groups[@]}" --out "$d/real" > /dev/null 2> "$d/real.err" || true
  if [ ! -f "$d/real/summary.json" ]; then
    { echo "$s: rein cluster run failed:"; cat "$d/real.err"; } > "$W/$s.out"
  else
    python3 "$W/table.py" "$f" "$d/sim" "$d/real" "$s" > "$W/$s.out" 2>&1 || echo "$s: could not read the outputs" >> "$W/$s.out"
  fi
  rm -rf "$d"
}
running=0 next=0
for s in "${SCENARIOS[@]}"; do
  if [ "$running" -ge "$jobs" ]; then
    wait -n || true
    running=$((running - 1))
  fi
  compare "$s" &
  running=$((running + 1))
  # Print, in the given order, every table whose run has ended.
  while [ "$next" -lt ${#SCENARIOS[@]} ] && [ -f "$W/${SCENARIOS[$next]}.out" ] && [ ! -d "$W/${SCENARIOS[$next]}" ]; do
    cat "$W/${SCENARIOS[$next]}.out"
    next=$((next + 1))
  done
done
wait
for ((; next < ${#SCENARIOS[@]}; next++)); do
  cat "$W/${SCENARIOS[$next]}.out"
done
