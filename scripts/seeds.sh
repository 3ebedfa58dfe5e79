#!/usr/bin/env bash
# Runs every scenario's checks for seeds FIRST..LAST (default 1..20) with the release build, two at a time,
# and prints one line per scenario: the seeds whose checks all held, and each miss with its seed.
# usage: bash scripts/seeds.sh [FIRST] [LAST]      (ONLY=REGEX limits it to scenarios whose name matches)
set -euo pipefail
cd "$(dirname "$0")/.."
first=${1:-1}
last=${2:-20}
cargo build --release -q -p rein
bin=target/release/rein
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
touch "$out/misses"
files=$(ls scenarios/*.toml | grep -E "${ONLY:-.}")
for f in $files; do
  for seed in $(seq "$first" "$last"); do
    echo "$f $seed"
  done
done | xargs -P 2 -n 2 sh -c '
  name=$(basename "$0" .toml)
  if ! "'"$bin"'" sim "$0" --seed "$1" --check --quiet > "'"$out"'/$name.$1.log" 2>&1; then
    echo "$name seed $1" >> "'"$out"'/misses"
  fi'
total=0
missed=0
for f in $files; do
  name=$(basename "$f" .toml)
  n=$((last - first + 1))
  bad=$(grep -c "^$name seed " "$out/misses" 2>/dev/null || true)
  total=$((total + n))
  missed=$((missed + bad))
  if [ "$bad" = 0 ]; then
    printf '%-34s all %d seeds pass\n' "$name" "$n"
  else
    printf '%-34s %d of %d seeds miss:\n' "$name" "$bad" "$n"
    for s in $(grep "^$name seed " "$out/misses" | awk '{print $3}' | sort -n); do
      grep '^MISS' "$out/$name.$s.log" | sed "s/^/    seed $s: /"
    done
  fi
done
echo "runs: $total, with a miss: $missed"
[ "$missed" = 0 ]
