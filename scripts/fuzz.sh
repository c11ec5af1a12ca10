#!/usr/bin/env bash
# Fuzzes nnx's readers with cargo-fuzz (nightly, libFuzzer): builds every target in fuzz/, then
# runs each for SECONDS seconds (default 60), one at a time, from the seed corpus in
# fuzz/corpus/<target>/. Fails as soon as a target crashes; the crashing input is left in
# fuzz/artifacts/<target>/ (see fuzz/README.md for reproducing and minimizing it).
#
# Usage: scripts/fuzz.sh [SECONDS] [TARGET...]   (all targets when none are named)
# Needs cargo-fuzz (`cargo install cargo-fuzz --locked`) and the nightly toolchain.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-60}"
# With NNX_FUZZ_RUNS set, each target runs that many inputs from a fixed seed (NNX_FUZZ_SEED,
# default 1) instead of for SECONDS: the same inputs on every machine, so a run that passed
# here passes in CI, and exploring new inputs is left to timed runs.
# NNX_FUZZ_MAX_SECONDS (default 150) caps each target's time all the same, so that a target
# whose inputs are slow (templates rendered up to their 5 s deadline) keeps CI bounded.
if [ -n "${NNX_FUZZ_RUNS:-}" ]; then
  limit=(-runs="$NNX_FUZZ_RUNS" -seed="${NNX_FUZZ_SEED:-1}" -max_total_time="${NNX_FUZZ_MAX_SECONDS:-150}")
else
  limit=(-max_total_time="$seconds")
fi
shift || true
targets=("$@")
if [ "${#targets[@]}" -eq 0 ]; then
  targets=(header index quantized config torch dcp hub_json gguf gguf_tokenizer chat_template)
fi

# New inputs go to a scratch corpus, so that the committed seeds stay as they are; the targets
# write their files in a scratch folder of their own, removed on exit.
base=/dev/shm
[ -d "$base" ] && [ -w "$base" ] || base="${TMPDIR:-/tmp}"
work="$(mktemp -d "$base/nnx-fuzz.XXXXXX")"
trap 'rm -rf "$work"' EXIT
export NNX_FUZZ_DIR="$work"

cargo +nightly fuzz build --fuzz-dir fuzz
for target in "${targets[@]}"; do
  # An input is a hang past 10 s; a chat template is rendered twice, each within its 5 s
  # deadline, so its inputs get more.
  timeout=10
  [ "$target" = chat_template ] && timeout=30
  echo "== fuzzing \`$target\` (${limit[*]} -timeout=$timeout)"
  mkdir -p "$work/corpus/$target"
  cargo +nightly fuzz run --fuzz-dir fuzz "$target" "$work/corpus/$target" "fuzz/corpus/$target" -- \
    "${limit[@]}" -timeout="$timeout" -rss_limit_mb=2048 -print_final_stats=1
done
echo "== no crash in ${targets[*]}"
