#!/usr/bin/env bash
# The resource metrics pipeline's CPU per 10,000 pods: one simulated node's runtime holding
# PODS running pods is measured and written as the kubelet Summary (the agent's half), which
# is then parsed and folded into the API server's in-memory figures with CPU rated against
# the previous round (the API server's half); each half's thread CPU time averaged over
# ROUNDS scrapes. See crates/setpoint/examples/resource_metrics_bench.rs.
#
# Usage: bench/resource_metrics.sh
# Environment: PODS (10000), ROUNDS (20), PROFILE (release; `dev` for a debug build).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
profile=${PROFILE:-release}
PODS=${PODS:-10000} ROUNDS=${ROUNDS:-20} \
  cargo run -q --profile "$profile" -p setpoint --example resource_metrics_bench
