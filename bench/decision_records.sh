#!/usr/bin/env bash
# What decision records and the write trail (`setpoint why`, docs/why.md) cost on the density
# benchmark: the same run on `setpoint up --simulate NODES` with SETPOINT_DECISION_RECORDS on
# and off, alternating, RUNS times each, every run on a fresh cluster.
#
# Per run it prints the seconds until every pod ran (the report's total_seconds) and the CPU
# seconds of the `setpoint up` process over the run (the report's server-side processes);
# then the medians per mode and the difference in per cent.
#
# Usage: bench/decision_records.sh
# Environment: NODES (100), DEPLOYMENTS (100), REPLICAS (10), RUNS (3), SETPOINT_BIN (run that
# binary instead of building the release one). Needs cargo and python3.
set -euo pipefail

nodes=${NODES:-100}
deployments=${DEPLOYMENTS:-100}
replicas=${REPLICAS:-10}
runs=${RUNS:-3}
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"

if [[ -n "${SETPOINT_BIN:-}" ]]; then
  bin=$SETPOINT_BIN
else
  echo "building the release binary" >&2
  cargo build --release -p setpoint >&2
  bin="${CARGO_TARGET_DIR:-$repo/target}/release/setpoint"
fi

work=$(mktemp -d)
up_pid=""
cleanup() {
  if [[ -n "$up_pid" ]]; then
    kill "$up_pid" 2>/dev/null || true
    wait "$up_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

results="$work/results.tsv"
: >"$results"
for run in $(seq 1 "$runs"); do
  for mode in on off; do
    dir="$work/$mode-$run"
    mkdir -p "$dir"
    SETPOINT_DECISION_RECORDS=$mode SETPOINT_LOG=error "$bin" up --data-dir "$dir/data" \
      --no-node --listen 127.0.0.1:0 --simulate "$nodes" \
      --start-delay-ms 0 --ready-delay-ms 0 >"$dir/up.log" 2>&1 &
    up_pid=$!
    for _ in $(seq 1 600); do
      grep -q "export KUBECONFIG=" "$dir/up.log" && break
      sleep 0.1
    done
    grep -q "export KUBECONFIG=" "$dir/up.log" || { cat "$dir/up.log" >&2; exit 1; }
    KUBECONFIG="$dir/data/kubeconfig" "$bin" bench density --nodes "$nodes" --reuse-nodes \
      --deployments "$deployments" --replicas "$replicas" --keep --json "$dir/report.json" >/dev/null
    python3 - "$dir/report.json" "$mode" "$run" >>"$results" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
# Every local Setpoint process serving the cluster: here the one `setpoint up`.
cpu = sum(p["cpu_seconds"] for p in r["processes"] if p["role"] != "benchmark")
print(f"{sys.argv[2]}\t{sys.argv[3]}\t{r['total_seconds']:.2f}\t{cpu:.2f}\t{r['pods_running']}")
EOF
    kill "$up_pid"
    wait "$up_pid" 2>/dev/null || true
    up_pid=""
    tail -1 "$results" >&2
  done
done

python3 - "$results" <<'EOF'
import statistics, sys
rows = [l.split("\t") for l in open(sys.argv[1]).read().splitlines()]
print("mode\trun\ttotal_s\tup_cpu_s\tpods")
for r in rows:
    print("\t".join(r))
med = {}
for mode in ("on", "off"):
    sel = [r for r in rows if r[0] == mode]
    med[mode] = (statistics.median(float(r[2]) for r in sel),
                 statistics.median(float(r[3]) for r in sel))
    print(f"median {mode}: total {med[mode][0]:.2f} s, setpoint up CPU {med[mode][1]:.2f} s")
for i, what in ((0, "total time"), (1, "setpoint up CPU")):
    on, off = med["on"][i], med["off"][i]
    print(f"records on vs off, {what}: {100 * (on - off) / off:+.1f} %")
EOF
