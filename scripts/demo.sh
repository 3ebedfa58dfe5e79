#!/usr/bin/env bash
# Rein's main job on a built-in default: builds the CLI and runs `rein demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || {
  if command -v apt-get >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq fonts-dejavu-core >/dev/null
  fi
}
cargo run --release --locked -p rein -- demo "$@"
