#!/usr/bin/env bash
# Runs every scenario in scenarios/ with --check, writing outputs and plots to out/<name>/.
# Exit status is non-zero if any scenario misses an expectation. Pass scenario files to run only those.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p rein -q
files=("$@")
[ ${#files[@]} -gt 0 ] || files=(scenarios/*.toml)
fail=0
for f in "${files[@]}"; do
  name=$(basename "$f" .toml)
  mkdir -p "out/$name"
  if ./target/release/rein sim "$f" --check --quiet --out "out/$name" > "out/$name/run.log" 2>&1; then
    echo "ok    $name"
  else
    echo "MISS  $name (see out/$name/run.log)"; fail=1
  fi
done
exit $fail
