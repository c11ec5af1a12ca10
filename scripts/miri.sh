#!/usr/bin/env bash
# Runs nnx-core's tensor, view and storage unit tests under Miri (nightly), which checks every
# `unsafe` path they reach (typed reads of owned and shared storage, views, gathers, casts) for
# undefined behaviour. Installs Miri into the nightly toolchain when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! cargo +nightly miri --version >/dev/null 2>&1; then
  rustup component add --toolchain nightly miri rust-src
fi
# Miri has its own target folder; `-Zmiri-disable-isolation` is not needed: the tests touch no
# files, clocks or environment.
cargo +nightly miri test -p nnx-core --lib -- tensor:: storage::
