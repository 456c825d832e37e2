#!/usr/bin/env bash
# What one validating admission webhook adds to a write (p50/p90/p99), against no webhook:
# ConfigMap creates one at a time over HTTPS against an in-process API server, alternating
# between a namespace no webhook matches and one a validating webhook (served over HTTPS by
# the same process, answering allowed) must approve. See
# crates/setpoint-bench/examples/webhook_latency.rs.
#
# Usage: bench/webhook_latency.sh [writes per side (2000)]
# WEBHOOK_BENCH_PROFILE=release builds with optimizations (the default is the debug build
# the test suites use).
set -euo pipefail

writes=${1:-2000}
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"

profile=()
if [[ "${WEBHOOK_BENCH_PROFILE:-debug}" == release ]]; then
  profile=(--release)
fi
cargo run "${profile[@]}" -q -p setpoint-bench --example webhook_latency -- "$writes"
