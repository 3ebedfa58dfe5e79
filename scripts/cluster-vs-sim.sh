#!/usr/bin/env bash
# The same scenario files in the simulator and on real daemons (issue 13 point 5): for each scenario,
# `rein sim --check --out` and `rein cluster run --check --out` (rein serve nodes on 127.0.0.x, a rein
# gateway per tenant over several servers, the scenario's duration in real time), then per tenant
# paper | sim | real IOPS after warm-up and real/sim, and every [[expect]] as measured by both. The paper
# column is the scenario's own `[[expect]] metric = "iops", equals = ...` without a window (the figures its
# notes quote), "-" where it has none.
#
#   scripts/cluster-vs-sim.sh                 # the issue's eleven scenarios and three pShift ones (about 16 minutes)
#   scripts/cluster-vs-sim.sh dmclock-fig9-resv rbfq-fig11a-uniform   # some of them
#
# Runs are in real time on a shared machine: the real column varies from run to run. The release binary
# is built first; every process a run starts is stopped by `rein cluster run` itself.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p rein -q
REIN=${CARGO_TARGET_DIR:-target}/release/rein
SCENARIOS=("$@")
if [ ${#SCENARIOS[@]} -eq 0 ]; then
  SCENARIOS=(dmclock-fig9-noresv dmclock-fig9-noresv-pool dmclock-fig9-resv dmclock-fig9-resv-pool
    dmclock-fig10 dmclock-fig10-pool rbfq-fig11a-uniform rbfq-fig11b-hotspot2 rbfq-fig11c-hotspot1
    rbfq-fig13-rbfq rbfq-fig14-adjust pshift-exp1-small pshift-exp3-limits-small pshift-exp4-small)
fi
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
trap 'exit 1' INT TERM
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
for s in "${SCENARIOS[@]}"; do
  f=scenarios/$s.toml
  rm -rf "$W/sim" "$W/real"
  # --check exits 1 on a missed expectation: the table shows it; only a missing summary is a failure.
  "$REIN" sim "$f" --check --quiet --out "$W/sim" > /dev/null 2>&1 || true
  "$REIN" cluster run "$f" --base-port 0 --check --quiet --out "$W/real" > /dev/null 2> "$W/real.err" || true
  if [ ! -f "$W/real/summary.json" ]; then
    echo "$s: rein cluster run failed:" >&2
    cat "$W/real.err" >&2
    continue
  fi
  python3 "$W/table.py" "$f" "$W/sim" "$W/real" "$s" || echo "$s: could not read the outputs" >&2
done
