#!/usr/bin/env bash
# Runs every cargo-fuzz target in fuzz/ for SECONDS each (default 30), starting from the committed corpus
# (fuzz/corpus/<target>) and seeds (fuzz/seeds/<target>), and from 60 s on also fuzz/corpus-slow/<target>:
# inputs whose replay alone outlasts a short run (libFuzzer replays the whole corpus before it counts
# the time, so a 10 s run of `scenario` with them did no fuzzing at all: 122 s of replay). The stable
# corpus tests replay all three. Needs a nightly toolchain (`cargo +nightly`);
# installs cargo-fuzz if it is missing; without nightly it says so and exits 0 (the stable corpus tests in
# rein-proto and rein-runtime still replay the corpus).
#
# New inputs the fuzzer finds go to a temporary directory, so the repository is left as it was; with
# REIN_FUZZ_GROW=1 they go to fuzz/corpus/<target> instead (then minimise: see fuzz/README.md). A crash or
# a hang (an input running over 10 s; 30 s for `scenario`, below) fails the script, naming the target and
# the input saved under fuzz/artifacts/<target>/.
#
# `scenario`'s largest accepted inputs are slow, not hung: a generated pShift cluster at the bound of 10 M
# generated demands (376,002 buckets x 3 phases x 8 servers) takes 3.3 s alone in this instrumented build
# (debug assertions on, coverage counters), and a mutation found one that ran 11 s beside four busy builds: a hang
# past 10 s there would be the machine's load, not Rein's.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
secs=${1:-30}
case $secs in '' | *[!0-9]*) echo "usage: scripts/fuzz.sh [SECONDS]" >&2; exit 2 ;; esac

if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "== fuzz: skipped, no nightly toolchain (rustup toolchain install nightly; then scripts/fuzz.sh)" >&2
  exit 0
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  echo "== fuzz: installing cargo-fuzz" >&2
  cargo +nightly install --locked cargo-fuzz
fi
# No sanitizer: the fuzzed crates are safe Rust (rein-proto forbids unsafe code), so ASan would only cost
# a factor of 3 in speed; debug assertions and overflow checks stay on (-a), so an overflow is a crash.
flags=(-O -a -s none)
started=$(date +%s)
echo "== fuzz: building the targets" >&2
cargo +nightly fuzz build "${flags[@]}"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
status=0
for t in $(cargo +nightly fuzz list); do
  mkdir -p "artifacts/$t" "corpus/$t"
  if [ "${REIN_FUZZ_GROW:-0}" = 1 ]; then out=corpus/$t; else out=$scratch/$t; mkdir -p "$out"; fi
  dirs=("$out")
  [ "$out" = "corpus/$t" ] || dirs+=("corpus/$t")
  [ -d "seeds/$t" ] && dirs+=("seeds/$t")
  [ "$secs" -ge 60 ] && [ -d "corpus-slow/$t" ] && dirs+=("corpus-slow/$t")
  extra=()
  [ -f "dicts/$t.dict" ] && extra+=("-dict=dicts/$t.dict")
  log=$scratch/$t.log
  hang=10
  [ "$t" = scenario ] && hang=30
  if cargo +nightly fuzz run "${flags[@]}" "$t" "${dirs[@]}" -- -max_total_time="$secs" -timeout="$hang" \
    -use_value_profile=1 -artifact_prefix="artifacts/$t/" -print_final_stats=1 "${extra[@]}" >"$log" 2>&1; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    rate=$(grep -o 'exec/s: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
    echo "== fuzz: $t: ${runs:-?} runs in ${secs} s (${rate:-?} exec/s), no crash" >&2
  else
    echo "== fuzz: $t FAILED; the input is in fuzz/artifacts/$t/. The fuzzer's last lines:" >&2
    tail -n 30 "$log" >&2
    status=1
  fi
done
echo "== fuzz: done in $(($(date +%s) - started)) s" >&2
exit "$status"
