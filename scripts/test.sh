#!/usr/bin/env bash
# Runs Rein's whole test suite on a fresh machine: installs what it needs, checks formatting, lints and
# docs, then builds and tests.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd -P)
# Each step's line says when it began, in seconds since the script started.
step() { echo "== [${SECONDS} s] $*" >&2; }
# A command that ends the script under set -e says which, and with what status, once.
# (Only while set -e is on: where the script turns it off it reads the status itself.)
trap 'rc=$?; [[ $- != *e* ]] || echo "== [${SECONDS} s] stopped: line $LINENO, status $rc: $BASH_COMMAND" >&2' ERR

need_apt=()
# Plots need a TrueType font (Debian: fonts-dejavu-core).
[ -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || need_apt+=(fonts-dejavu-core)
# OpenSSL headers for TLS on NBD (the openssl crate), and the openssl tool the TLS tests make certificates with.
command -v pkg-config >/dev/null 2>&1 || need_apt+=(pkg-config)
pkg-config --exists openssl 2>/dev/null || need_apt+=(libssl-dev)
command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)
# The NBD server's integration tests drive real clients.
command -v qemu-img >/dev/null 2>&1 || need_apt+=(qemu-utils)
command -v nbdinfo >/dev/null 2>&1 || need_apt+=(libnbd-bin)
command -v nbdcopy >/dev/null 2>&1 || need_apt+=(libnbd-bin)
# libnbd with optional TLS (nbdsh, its Python module), which no nbdinfo URI asks for (serve_tls.rs).
command -v nbdsh >/dev/null 2>&1 || need_apt+=(python3-libnbd)
command -v fio >/dev/null 2>&1 || need_apt+=(fio)
command -v nbdkit >/dev/null 2>&1 || need_apt+=(nbdkit)
# A test reads the NBD server's TCP keepalive timer with ss (crates/rein/tests/bounds.rs).
command -v ss >/dev/null 2>&1 || need_apt+=(iproute2)
# The admin endpoint's HTTPS tests (crates/rein/tests/admin_https.rs) drive curl.
command -v curl >/dev/null 2>&1 || need_apt+=(curl)
# The systemd units in contrib/systemd are checked with systemd-analyze verify (service_manager.rs).
command -v systemd-analyze >/dev/null 2>&1 || need_apt+=(systemd)
# The alerting rules in contrib/prometheus are checked and unit-tested with promtool (alerts.rs), which
# comes with the prometheus package: installed without its recommends, and the server it brings is
# stopped and disabled where systemd runs (the tests need the tool, not a server listening on :9090).
need_promtool=""; command -v promtool >/dev/null 2>&1 || need_promtool=1
if [ ${#need_apt[@]} -gt 0 ] || [ -n "$need_promtool" ]; then
  if command -v apt-get >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    [ ${#need_apt[@]} -eq 0 ] || DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
    if [ -n "$need_promtool" ]; then
      DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
      if [ -d /run/systemd/system ]; then $SUDO systemctl disable --now prometheus >/dev/null 2>&1 || true; fi
    fi
  else
    echo "please install: ${need_apt[*]}${need_promtool:+ prometheus (for promtool)}" >&2
  fi
fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "cargo is required: install Rust with rustup (https://rustup.rs)" >&2
  exit 1
fi
# The fuzz stage at the end (scripts/fuzz.sh) needs cargo-fuzz and its targets built: both happen now, in
# the background at the lowest CPU priority (nice 19), so that they take the CPU the steps below leave idle
# instead of adding minutes at the end (on a fresh machine, 2026-11-30, installing cargo-fuzz and then
# building the targets after the tests took the run to 28.7 min, the build alone 3.6 min). The fuzz targets are a workspace of their own (fuzz/target), so this build never
# waits for the main one's lock. Without a nightly toolchain there is nothing to build (fuzz.sh says so).
fuzz_build_log=$(mktemp)
fuzz_build_pid=""
if cargo +nightly --version >/dev/null 2>&1; then
  (
    cd fuzz
    if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
      echo "== fuzz: installing cargo-fuzz (nice 19, in the background)"
      nice -n 19 cargo +nightly install --locked cargo-fuzz
    fi
    exec nice -n 19 cargo +nightly fuzz build -O -a -s none
  ) >"$fuzz_build_log" 2>&1 &
  fuzz_build_pid=$!
fi
stop_fuzz_build() { [ -z "$fuzz_build_pid" ] || { pkill -P "$fuzz_build_pid" 2>/dev/null; kill "$fuzz_build_pid" 2>/dev/null; } || true; }
trap 'stop_fuzz_build; rm -f "$fuzz_build_log"' EXIT
# The house style first: formatting, clippy with warnings as errors (the [workspace.lints] table), and the
# docs with rustdoc warnings as errors. rustfmt and clippy come with rustup's default profile; add them if
# this toolchain lacks them.
if command -v rustup >/dev/null 2>&1; then
  for c in rustfmt clippy; do
    rustup component list --installed 2>/dev/null | grep -q "^$c" || rustup component add "$c"
  done
fi
step "cargo fmt --check"
cargo fmt --all --check
step "cargo clippy (warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings
step "cargo doc (warnings are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --document-private-items --locked
step "build and tests"
cargo build --workspace --all-targets --locked
log=$(mktemp)
# The tests get a temp directory of their own, which must be empty again when they end: every test removes
# what it creates. The repository must not gain untracked files either.
tests_tmp=$(mktemp -d)
trap 'stop_fuzz_build; rm -f "$log" "$fuzz_build_log"; rm -rf "$tests_tmp"' EXIT
untracked() { git status --porcelain --untracked-files=all 2>/dev/null | grep '^??' || true; }
untracked_before=$(untracked)
# Three sets of tests do nothing but compute (no daemon, no real time), and together they are most of the
# tests' CPU: rein-core's one-hour exactness test (one_hour_at_one_million_iops_is_exact: 3.6e9 requests
# through the mClock scheduler on one thread, #[ignore]d in a plain cargo test), and rein-sim's scenario
# test (every scenario file, run again with another seed and under a wrong scheduler) and fuzz-corpus
# replay. They start now, at the lowest CPU priorities (below), and take the CPU the tests below leave
# idle while those wait on daemons and device models (on 2026-11-30 the scenario test alone held both
# CPUs for 340 s of the tests' 13.5 min when it ran among them), then the rest beside the fuzz stage.
# The main run skips their tests by name (--skip, exact names), and their results join the closing
# summary. Their binaries are run directly, from their package's directory as cargo runs them (a second
# cargo would wait for the first's lock).
bg_names=() bg_pids=() bg_logs=() bg_started=()
# The test executables, as "source path, executable" lines. The workspace's own --no-run (a no-op after the
# build above): `cargo test -p PACKAGE` would unify features over that package alone and rebuild it.
test_exes=$(cargo test --workspace --locked --no-run --message-format=json 2>/dev/null |
  sed -n 's/.*"src_path":"\([^"]*\)".*"executable":"\([^"]*\)".*/\1 \2/p')
# (awk reads its whole input: a reader that stops at its first match may close the pipe before echo has
# written all, and echo's SIGPIPE is status 141 under pipefail and set -e. A CI run of 2026-12-03 ended
# with status 141 right after the step below, where this is the one pipeline that can end early; not
# reproduced in 1,300 tries here (200 of them beside two busy loops).)
test_exe() { echo "$test_exes" | awk -v src="$root/$1" '$1 == src && !found { print $2; found = 1 }'; } # source path
# The one-hour test is one thread and the longest of the three: it runs at nice 19, the other two below
# it (SCHED_IDLE where chrt can set it), so that it has a CPU to itself whenever the tests leave one idle.
# (All three at nice 19, 2026-12-01: it got about half a CPU, ended 1,155 s after its start and last, and
# the run took 1,696 s; the scenario test ended 296 s before it.)
lowest=(nice -n 19)
if command -v chrt >/dev/null 2>&1 && chrt --idle 0 true 2>/dev/null; then lowest=(chrt --idle 0); fi
start_bg() { # name, priority (low: nice 19; lowest), package directory, executable, its arguments
  local name=$1 prio=$2 dir=$3 exe=$4 l
  local run=(nice -n 19)
  [ "$prio" = low ] || run=("${lowest[@]}")
  shift 4
  [ -x "$exe" ] || { echo "== no test executable for $name" >&2; exit 1; }
  l=$(mktemp)
  (
    cd "$dir" || exit 1
    TMPDIR=$tests_tmp "${run[@]}" "$exe" "$@"
    rc=$?
    date +%s >"$l.end"
    exit "$rc"
  ) >"$l" 2>&1 &
  bg_names+=("$name") bg_pids+=($!) bg_logs+=("$l") bg_started+=("$(date +%s)")
}
stop_bg() {
  for p in "${bg_pids[@]}"; do { pkill -P "$p" 2>/dev/null; kill "$p" 2>/dev/null; } || true; done
  for l in "${bg_logs[@]}"; do rm -f "$l" "$l.end"; done
}
trap 'stop_bg; stop_fuzz_build; rm -f "$log" "$fuzz_build_log"; rm -rf "$tests_tmp"' EXIT
step "in the background, beside the tests and the fuzz stage: the one-hour exactness test (nice 19), rein-sim's scenario and corpus tests (${lowest[*]})"
hour_test=sched::mclock::tests::one_hour_at_one_million_iops_is_exact
start_bg "the one-hour exactness test" low crates/rein-core "$(test_exe crates/rein-core/src/lib.rs)" --ignored --exact "$hour_test"
skip=()
for t in scenarios corpus; do
  exe=$(test_exe "crates/rein-sim/tests/$t.rs")
  start_bg "rein-sim's $t test" lowest crates/rein-sim "$exe"
  # Each of its tests by exact name (the list from the binary itself, so a test added there is skipped too).
  for name in $("$exe" --list 2>/dev/null | sed -n 's/: test$//p'); do skip+=(--skip "$name"); done
done
set +e
TMPDIR=$tests_tmp cargo test --workspace --locked --no-fail-fast -- --exact "${skip[@]}" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
# The systemd units under a real systemd (about 10 s): booted as PID 1 of namespaces of its own, so also
# where PID 1 is not systemd; it installs with scripts/install.sh and follows docs/operations.md's runbook
# (start, reload, stop, socket activation, the token as a credential) for the three daemons. Its exit
# status 2 is a machine it cannot run on (not root, no cgroup2, a tool missing): said, not a failure.
step "the systemd units under a real systemd (scripts/systemd-check.sh)"
set +e
REIN=target/debug/rein bash scripts/systemd-check.sh >"$log.systemd" 2>&1
rc=$?
set -e
case $rc in
  0) tail -n 1 "$log.systemd" >&2 ;;
  2) echo "== the systemd check cannot run on this machine: $(tail -n 1 "$log.systemd")" >&2 ;;
  *) echo "== the systemd check FAILED (status $rc); its output:" >&2; cat "$log.systemd" >&2; status=1 ;;
esac
rm -f "$log.systemd"
# A short coverage-guided fuzz run of every decoder from the committed corpus (fuzz/README.md); it needs a
# nightly toolchain and says so when there is none (the corpus tests above replay the corpus on stable).
# (Its build, started above, is waited for: scripts/fuzz.sh's own build is then a no-op.) 5 s per target
# after the corpus replay: CI's CPU is spent to the last second (the background tests end after this
# stage), and 10 s per target cost 90 s more of it; the long runs are scripts/fuzz.sh's (30 s by default)
# and fuzz/README.md's counts.
if [ -n "$fuzz_build_pid" ]; then
  wait "$fuzz_build_pid" || { echo "== fuzz: the background build failed; its last lines:" >&2; tail -n 20 "$fuzz_build_log" >&2; }
  grep '^== fuzz: installing' "$fuzz_build_log" >&2 || true
fi
step "fuzz (5 s per target)"
bash scripts/fuzz.sh 5 || status=1
for i in "${!bg_pids[@]}"; do
  if wait "${bg_pids[$i]}"; then
    # Its own time ("finished in"), when it ended, and how long before the script waited for it (after
    # the fuzz stage): which of them ended last.
    echo "== ${bg_names[$i]} passed ($(grep -o 'finished in [0-9.]*s' "${bg_logs[$i]}" | tail -n 1); ended $(($(cat "${bg_logs[$i]}.end") - bg_started[i])) s after its start, $(($(date +%s) - $(cat "${bg_logs[$i]}.end"))) s before this wait)" >&2
  else
    echo "== ${bg_names[$i]} FAILED; the last lines of its output:" >&2
    tail -n 60 "${bg_logs[$i]}" >&2
    status=1
  fi
  grep '^test result:' "${bg_logs[$i]}" >>"$log" || true
done
step "done"
# One closing line over every test binary (cargo prints one "test result" line per binary), the background
# ones included.
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i) ~ /^passed/) p += $(i-1); if ($(i) ~ /^failed/) f += $(i-1) } }
     END { printf "Summary: %d passed, %d failed\n", p, f }' "$log"
left=$(find "$tests_tmp" -mindepth 1 -maxdepth 1)
if [ -n "$left" ]; then
  echo "The tests left files in the temp directory ($(du -sh "$tests_tmp" | cut -f1)):" >&2
  echo "$left" | sed "s|^$tests_tmp/|  |" >&2
  status=1
fi
new_files=$(comm -13 <(echo "$untracked_before" | sort) <(untracked | sort))
if [ -n "$new_files" ]; then
  echo "The tests left untracked files in the repository:" >&2
  echo "$new_files" >&2
  status=1
fi
exit "$status"
