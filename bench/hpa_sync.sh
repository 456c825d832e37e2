#!/usr/bin/env bash
# The HorizontalPodAutoscaler controller's sync cost: HPAS autoscalers, each over a Deployment
# of one simulated pod, synced every --horizontal-pod-autoscaler-sync-period (15 s, upstream's
# default) by `setpoint up --simulate NODES`.
#
# Each pod requests 100m of CPU and its simulated node reports 70m of use
# (`setpoint.dev/simulated-cpu`), exactly the 70 % target: every autoscaler reads its scale and
# its pods' metrics and computes a count each period, and none rescales, so what is measured is
# the steady sync, not the pods' churn. Two windows of WINDOW seconds are measured on the
# cluster's process, the same cluster without autoscalers and then with all of them computing
# (`ScalingActive` True):
#
#   syncs/period     the HPA controller's reconciles per sync period (from the runtime's
#                    `controller_runtime_reconcile_total` on the API server's /metrics)
#   reconcile p50    the median reconcile's wall time (its histogram's buckets)
#   busy/period      the sum of the reconciles' wall time per period
#   CPU/period       the process's CPU (utime + stime from /proc/<pid>/stat) per period with
#                    the autoscalers, less the same without them: what HPAS autoscalers cost,
#                    reading the API included; and that as a share of one core over a period
#
# Usage: bench/hpa_sync.sh
# Environment: HPAS (1000), NODES (20), WINDOW (60), PERIOD (15s), SETPOINT_BIN (run that
# binary instead of building the release one). Needs cargo and kubectl.
set -euo pipefail

hpas=${HPAS:-1000}
nodes=${NODES:-20}
window=${WINDOW:-60}
period=${PERIOD:-15s}
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"

command -v kubectl >/dev/null || { echo "hpa_sync.sh needs kubectl" >&2; exit 1; }

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
  [[ $BASHPID == "$$" ]] || return 0
  if [[ -n "$up_pid" ]] && kill -0 "$up_pid" 2>/dev/null; then
    kill "$up_pid" 2>/dev/null || true
    wait "$up_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

clk_tck=$(getconf CLK_TCK)
ticks() { sed -E 's/^.*\) //' "/proc/$1/stat" | awk '{print $12 + $13}'; }
k() { kubectl --kubeconfig "$kubeconfig" --request-timeout=60s "$@"; }

wait_for() {
  local what=$1 deadline=$((SECONDS + $2))
  shift 2
  until "$@"; do
    if ((SECONDS > deadline)); then
      echo "timed out waiting for $what" >&2
      exit 1
    fi
    sleep 1
  done
}

# The sync period in seconds (the flag takes Go durations; this script only whole seconds).
period_s=${period%s}

"$bin" up --simulate "$nodes" --process-pod-network host --listen 127.0.0.1:0 \
  --data-dir "$work/data" \
  --horizontal-pod-autoscaler-sync-period "$period" >"$work/up.out" 2>"$work/up.err" &
up_pid=$!
kubeconfig="$work/data/kubeconfig"
wait_for "setpoint up" 120 eval 'grep -q "^Setpoint is running at" "$work/up.out" 2>/dev/null && [[ -s $kubeconfig ]]'

manifest() {
  local kind=$1 i
  for ((i = 0; i < hpas; i++)); do
    if [[ $kind == deployments ]]; then
      cat <<EOF
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: d$i}
spec:
  replicas: 1
  selector: {matchLabels: {app: d$i}}
  template:
    metadata:
      labels: {app: d$i}
      annotations: {setpoint.dev/simulated-cpu: 70m}
    spec:
      nodeSelector: {setpoint.dev/simulated: "true"}
      containers:
      - {name: app, image: nginx:1.25, resources: {requests: {cpu: 100m}}}
EOF
    else
      cat <<EOF
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: d$i}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: d$i}
  minReplicas: 1
  maxReplicas: 3
  metrics:
  - type: Resource
    resource: {name: cpu, target: {type: Utilization, averageUtilization: 70}}
EOF
    fi
  done
}

running() { [[ $(k get pods --no-headers 2>/dev/null | awk '$3 == "Running"' | wc -l) -ge $hpas ]]; }
active() {
  [[ $(k get hpa -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="ScalingActive")].status}{"\n"}{end}' 2>/dev/null |
    grep -c '^True$') -ge $hpas ]]
}

# The HPA controller's reconcile count, time sum and histogram buckets from /metrics.
hpa_metrics() {
  k get --raw /metrics | grep -E '^controller_runtime_reconcile(_time_seconds_(sum|bucket))?(_total)?\{[^}]*controller="horizontalpodautoscaling"' || true
}
count_of() { awk '/^controller_runtime_reconcile_total\{/ {s += $NF} END {print s + 0}' "$1"; }
sum_of() { awk '/_time_seconds_sum\{/ {s += $NF} END {print s + 0}' "$1"; }

# CPU ticks of the cluster's process over the window, and the HPA metrics before and after.
measure() {
  local name=$1 t0 t1
  hpa_metrics >"$work/$name.before"
  t0=$(ticks "$up_pid")
  sleep "$window"
  t1=$(ticks "$up_pid")
  hpa_metrics >"$work/$name.after"
  echo $((t1 - t0))
}

echo "creating $hpas Deployments on $nodes simulated nodes" >&2
manifest deployments | k apply -f - >/dev/null
wait_for "$hpas pods Running" 900 running
base_ticks=$(measure base)

echo "creating $hpas HorizontalPodAutoscalers (sync period $period)" >&2
manifest hpas | k apply -f - >/dev/null
wait_for "$hpas autoscalers computing" 900 active
with_ticks=$(measure with)

periods=$(awk -v w="$window" -v p="$period_s" 'BEGIN {print w / p}')
syncs=$(($(count_of "$work/with.after") - $(count_of "$work/with.before")))
busy=$(awk -v a="$(sum_of "$work/with.after")" -v b="$(sum_of "$work/with.before")" 'BEGIN {print a - b}')
# The median from the histogram's cumulative buckets of the window: the first bound holding
# half the reconciles.
buckets() { awk '/_bucket\{/ {match($0, /le="[^"]*"/); n = split($0, w, " "); print substr($0, RSTART + 4, RLENGTH - 5), w[n]}' "$1" | sort; }
p50=$(join <(buckets "$work/with.before") <(buckets "$work/with.after") |
  awk -v n="$syncs" '{d[$1] = $3 - $2} END {best = "+Inf"; for (b in d) if (b != "+Inf" && d[b] >= n / 2 && (best == "+Inf" || b + 0 < best + 0)) best = b; print best}')

awk -v hpas="$hpas" -v nodes="$nodes" -v periods="$periods" -v p="$period_s" -v syncs="$syncs" \
  -v busy="$busy" -v p50="$p50" -v base="$base_ticks" -v with="$with_ticks" -v hz="$clk_tck" -v w="$window" 'BEGIN {
  cpu = (with - base) / hz / periods
  printf "HPAs %d on %d simulated nodes, sync period %ds, window %ds (%.0f periods)\n", hpas, nodes, p, w, periods
  printf "syncs/period      %.0f (of %d autoscalers)\n", syncs / periods, hpas
  printf "reconcile p50     <= %s s\n", p50
  printf "busy/period       %.3f s of reconcile wall time\n", busy / periods
  printf "CPU/period        %.3f s without autoscalers, %.3f s with: %.3f s for them (%.1f %% of one core over %ds)\n", base / hz / periods, with / hz / periods, cpu, 100 * cpu / p, p
}'
