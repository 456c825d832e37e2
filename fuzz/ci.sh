#!/usr/bin/env bash
# The fuzz step of `.ci/run`: builds every fuzz target and runs each for a short fixed time
# from its committed seed corpus; fails on the first finding (a crash, a failed assertion, a
# timeout or running out of memory). README.md ("Fuzzing") says how to run one for longer.
#
# FUZZ_SECONDS sets the time per target (default 20).
set -euo pipefail
cd "$(dirname "$0")"

CARGO_FUZZ_VERSION=0.13.2
if ! cargo fuzz --version 2>/dev/null | grep -qF "$CARGO_FUZZ_VERSION"; then
  cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked
fi

# cargo-fuzz expects a nightly toolchain, and only the stable one is installed. Without a
# sanitizer (`--sanitizer none`) every flag it passes is a stable one; RUSTC_BOOTSTRAP lets it
# past its own nightly expectations all the same. What is lost is AddressSanitizer, which safe
# Rust needs least: the targets check their properties with assertions instead.
export RUSTC_BOOTSTRAP=1
opts=(--sanitizer none --codegen-units 16)
seconds="${FUZZ_SECONDS:-20}"
# A fixed seed makes a CI run repeatable: a finding there is the change's, not luck's, and
# can be replayed. Long runs (README, "Fuzzing") use random seeds. FUZZ_SEED overrides it.
seed="${FUZZ_SEED:-1}"

start=$(date +%s)
cargo fuzz build "${opts[@]}"
echo "fuzz targets built in $(( $(date +%s) - start )) s"

targets=$(cargo fuzz list)
failed=()
for target in $targets; do
  # New inputs go to a scratch directory, so a run leaves the committed corpus as it is.
  scratch=$(mktemp -d)
  echo "=== fuzzing $target for ${seconds} s"
  if ! cargo fuzz run "${opts[@]}" "$target" "$scratch" "corpus/$target" -- \
      -max_total_time="$seconds" -seed="$seed" -timeout=30 -rss_limit_mb=4096 -max_len=65536 \
      -print_final_stats=1 2>&1 | tail -n 40; then
    failed+=("$target")
  fi
  rm -rf "$scratch"
done

total=$(wc -w <<<"$targets")
echo "fuzzing: $(( total - ${#failed[@]} )) passed, ${#failed[@]} failed"
if (( ${#failed[@]} > 0 )); then
  echo "findings in: ${failed[*]} (the inputs are under fuzz/artifacts/)" >&2
  exit 1
fi
