#!/usr/bin/env bash
# Rein's main job on a built-in default: builds the CLI and runs `rein demo`. Arguments go to `rein demo`
# (--seconds S, --scheduler fifo, --out DIR, --simulated, --help). Outputs: out/rein-demo/ (git ignores out/).
# Every step says what it is doing before it starts; the README's Prerequisites give the times.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { echo "demo.sh: $*" >&2; }

# Plots need a TrueType font (Debian: fonts-dejavu-core); without one they are skipped with a warning.
if [ ! -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ]; then
  if command -v apt-get >/dev/null 2>&1; then
    say "installing a font for the plots (apt-get install fonts-dejavu-core) ..."
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq fonts-dejavu-core >/dev/null
  else
    say "no DejaVu font and no apt-get: install a TrueType sans font (DejaVu, Liberation or FreeSans) for the plots"
  fi
fi
# The build links OpenSSL (TLS on NBD): its headers and pkg-config (Debian: libssl-dev, pkg-config).
if ! { command -v pkg-config >/dev/null 2>&1 && pkg-config --exists openssl 2>/dev/null; }; then
  if command -v apt-get >/dev/null 2>&1; then
    say "installing OpenSSL's headers for the build (apt-get install libssl-dev pkg-config) ..."
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq libssl-dev pkg-config >/dev/null
  else
    say "the build needs OpenSSL's headers and pkg-config: install them (Debian: libssl-dev pkg-config)"
    exit 1
  fi
fi
if ! command -v cargo >/dev/null 2>&1; then
  say "cargo is required: install Rust with rustup (https://rustup.rs)"
  exit 1
fi
# The debug build (the same one scripts/test.sh uses; the workspace optimises rein-core and rein-sim even there):
# the demo's device is modelled at 2,400 IOPS, so its results do not depend on the build, and a fresh release
# build takes three times as long. Benchmarks (`rein bench`, scripts/bench-nbd.sh) use the release build.
if [ -x target/debug/rein ]; then
  say "building rein (seconds if nothing changed) ..."
else
  say "building rein (first time: about 1.5 minutes on a 2-core machine) ..."
fi
cargo build --locked -p rein
exec ./target/debug/rein demo "$@"
