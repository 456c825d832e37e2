#!/usr/bin/env bash
# Pods in containers (containerd) against pods as local processes, on one node: for each
# runtime and round, `setpoint up --no-node` runs the control plane and `setpoint agent
# --container-runtime <runtime>` the node (for cri: a private containerd under its data dir,
# or the system one if running), and then:
#
#   replace   a one-replica Deployment of `sleep`; its pod is deleted REPLACEMENTS times, and
#             each time the time from the delete to the replacement pod reported Running (its
#             container started) is taken from a `kubectl get -w` stream, timestamped as the
#             lines arrive. p50 and p99 over all rounds' samples.
#   density   a Deployment of PODS replicas created: the time until all are Running (polled
#             every 0.2 s).
#   cost      with the PODS pods Running, the agent's CPU over WINDOW seconds (utime + stime
#             from /proc/<pid>/stat) and its RSS (VmRSS), against the same with no pods: per
#             running pod, CPU in milliseconds per second and RSS in KiB. For cri the private
#             containerd's figures and the containers' shims are reported too, since the
#             agent hands that work to them.
#
# Every container runs `setpoint.local/busybox:1` (built locally, no registry); with the
# process runtime the same pods run `sleep` on the host.
#
# Usage: bench/containers.sh [rounds (3)]
# Environment: PODS (100), REPLACEMENTS (20), WINDOW (20), RUNTIMES ("cri process"),
# SETPOINT_BIN (run that binary instead of building one), AGENT_LOG (the agent's SETPOINT_LOG;
# "warn,setpoint_node::cri::client=trace" logs every CRI call's duration) and LOG_DIR (where
# the agents' logs are kept). Needs root, cargo, kubectl and, for
# cri, containerd, runc, the CNI plugins and a static busybox.
set -euo pipefail

rounds=${1:-3}
pods=${PODS:-100}
replacements=${REPLACEMENTS:-20}
window=${WINDOW:-20}
runtimes=${RUNTIMES:-cri process}
image=setpoint.local/busybox:1
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"

command -v kubectl >/dev/null || { echo "containers.sh needs kubectl" >&2; exit 1; }

if [[ -n "${SETPOINT_BIN:-}" ]]; then
  bin=$SETPOINT_BIN
else
  echo "building the release binary" >&2
  cargo build --release -p setpoint >&2
  bin="${CARGO_TARGET_DIR:-$repo/target}/release/setpoint"
fi

work=$(mktemp -d)
up_pid=""
agent_pid=""
watch_pid=""
stop_all() {
  local p
  for p in "$watch_pid" "$agent_pid" "$up_pid"; do
    if [[ -n "$p" ]] && kill -0 "$p" 2>/dev/null; then
      kill "$p" 2>/dev/null || true
      wait "$p" 2>/dev/null || true
    fi
  done
  watch_pid="" agent_pid="" up_pid=""
}
cleanup() {
  # Subshells (a pipeline's parts) inherit the trap; only the script itself cleans up.
  [[ $BASHPID == "$$" ]] || return 0
  # Pods first, so that no container outlives the run (they would outlive the agent).
  if [[ -n "$agent_pid" ]] && kill -0 "$agent_pid" 2>/dev/null; then
    k delete deployments,pods --all --grace-period=1 --wait=false >/dev/null 2>&1 || true
    local deadline=$((SECONDS + 120))
    while ((SECONDS < deadline)) && [[ -n $(k get pods -o name 2>/dev/null) ]]; do sleep 0.5; done
  fi
  stop_all
  rm -rf "$work"
}
trap cleanup EXIT

clk_tck=$(getconf CLK_TCK)
now() { date +%s.%N; }

# utime + stime of the process, in clock ticks (fields 14 and 15; the name in field 2 is cut
# off first, since it may hold spaces).
ticks() {
  sed -E 's/^.*\) //' "/proc/$1/stat" | awk '{print $12 + $13}'
}
rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }

# The containerd the agent started (its child), if any.
containerd_pid() { pgrep -P "$agent_pid" -x containerd || true; }

# Every containerd-shim serving the private containerd's socket.
shim_pids() {
  local sock=$1 p
  for p in $(pgrep -f containerd-shim-runc-v2 || true); do
    tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -q -- "$sock" && echo "$p"
  done | sort -u
}

k() { kubectl --kubeconfig "$kubeconfig" "$@"; }

wait_for() {
  local what=$1 deadline=$((SECONDS + $2))
  shift 2
  until "$@"; do
    if ((SECONDS > deadline)); then
      echo "timed out waiting for $what" >&2
      exit 1
    fi
    sleep 0.2
  done
}

running_count() {
  k get pods -l "app=$1" --no-headers 2>/dev/null | awk '$3 == "Running"' | wc -l
}
n_running() { [[ $(running_count "$1") -eq $2 ]]; }
none_left() { [[ -z $(k get pods -o name 2>/dev/null) ]]; }

start_cluster() {
  local runtime=$1 dir=$2
  "$bin" up --no-node --listen 127.0.0.1:0 --data-dir "$dir/data" >"$dir/up.out" 2>"$dir/up.err" &
  up_pid=$!
  kubeconfig="$dir/data/kubeconfig"
  wait_for "setpoint up" 120 eval 'grep -q "^Setpoint is running at" "$dir/up.out" 2>/dev/null && [[ -s $kubeconfig ]]'
  # Process pods on the node's network (loopback addresses), as the recorded figures were
  # measured: `auto` would give them network namespaces on a bridge as root.
  SETPOINT_LOG=${AGENT_LOG:-warn} "$bin" agent --node-name "bench-$runtime" --address 127.0.0.1 \
    --listen 127.0.0.1:0 --container-runtime "$runtime" --process-pod-network host \
    --kubeconfig "$kubeconfig" \
    --data-dir "$dir/agent" >"$dir/agent.out" 2>"$dir/agent.err" &
  agent_pid=$!
  wait_for "the node Ready" 120 eval \
    '[[ $(k get node "bench-$runtime" -o jsonpath="{.status.conditions[?(@.type==\"Ready\")].status}" 2>/dev/null) == True ]]'
  head -1 "$dir/agent.out" >&2
}

# Deployment $1 of $2 replicas running `sleep` (as the container's command, so the process
# runtime runs it too).
deploy() {
  k create deployment "$1" --image="$image" --replicas="$2" -- sleep 100000 >/dev/null
}

# The replace benchmark: one sample per line, seconds.
replace() {
  local dir=$1 i name t0 line
  deploy rep 1
  wait_for "the rep pod" 120 n_running rep 1
  # Every pod change as it arrives: arrival time, name, phase, whether being deleted.
  (
    k get pods -l app=rep -w -o jsonpath='{.metadata.name} {.status.phase} {.metadata.deletionTimestamp}{"\n"}' |
      while read -r n p d; do echo "$(now) $n $p ${d:-}"; done >"$dir/watch"
  ) &
  watch_pid=$!
  name=$(k get pods -l app=rep -o jsonpath='{.items[0].metadata.name}')
  for ((i = 0; i < replacements; i++)); do
    t0=$(now)
    k delete pod "$name" --grace-period=1 --wait=false >/dev/null
    # The first line, after the delete, of another pod Running and not being deleted.
    wait_for "the replacement of $name" 120 eval \
      'line=$(awk -v t0="$t0" -v old="$name" "\$1 >= t0 && \$2 != old && \$3 == \"Running\" && NF == 3 {print; exit}" "$dir/watch") && [[ -n $line ]]'
    awk -v t0="$t0" '{printf "%.3f\n", $1 - t0}' <<<"$line"
    # The replacement is the next one deleted.
    name=$(awk '{print $2}' <<<"$line")
  done
  # The watch's kubectl and reader are the subshell's children.
  pkill -P "$watch_pid" 2>/dev/null || true
  kill "$watch_pid" 2>/dev/null || true
  wait "$watch_pid" 2>/dev/null || true
  watch_pid=""
  k delete deployment rep >/dev/null
  k delete pods -l app=rep --grace-period=1 --wait=false >/dev/null 2>&1 || true
  wait_for "the rep pods gone" 120 none_left
}

# CPU (ms per s) and RSS (KiB) of each process given, over the same window: "cpu rss" a
# line, in order.
cost() {
  local p
  local -a before=()
  for p in "$@"; do before+=("$(ticks "$p")"); done
  sleep "$window"
  local i=0
  for p in "$@"; do
    awk -v t="$(($(ticks "$p") - before[i]))" -v hz="$clk_tck" -v w="$window" -v r="$(rss_kib "$p")" \
      'BEGIN {printf "%.2f %d\n", t / hz / w * 1000, r}'
    i=$((i + 1))
  done
}

results="$work/results"
: >"$results"
for ((round = 1; round <= rounds; round++)); do
  for runtime in $runtimes; do
    dir="$work/$runtime-$round"
    mkdir -p "$dir"
    echo "round $round: $runtime" >&2
    start_cluster "$runtime" "$dir"
    replace "$dir" | while read -r s; do printf '%s\treplace\t%s\n' "$runtime" "$s"; done >>"$results"
    ctrd=$(containerd_pid)
    # shellcheck disable=SC2086 # ctrd is one pid or none
    mapfile -t idle < <(cost "$agent_pid" $ctrd)
    t0=$(now)
    deploy many "$pods"
    wait_for "$pods pods Running" 600 n_running many "$pods"
    printf '%s\tdensity\t%s\n' "$runtime" "$(awk -v a="$t0" -v b="$(now)" 'BEGIN {printf "%.2f", b - a}')" >>"$results"
    # shellcheck disable=SC2086
    mapfile -t busy < <(cost "$agent_pid" $ctrd)
    per_pod() { # metric idle-line busy-line
      read -r ci ri <<<"$2"
      read -r cb rb <<<"$3"
      printf '%s\t%s_cpu\t%s\n' "$runtime" "$1" "$(awk -v a="$ci" -v b="$cb" -v n="$pods" 'BEGIN {printf "%.3f", (b - a) / n}')"
      printf '%s\t%s_rss\t%s\n' "$runtime" "$1" "$(awk -v a="$ri" -v b="$rb" -v n="$pods" 'BEGIN {printf "%.0f", (b - a) / n}')"
      printf '%s\t%s_rss_total\t%s\n' "$runtime" "$1" "$rb"
    }
    per_pod agent "${idle[0]}" "${busy[0]}" >>"$results"
    if [[ -n $ctrd ]]; then
      per_pod containerd "${idle[1]}" "${busy[1]}" >>"$results"
      sock="$dir/agent/containerd/containerd.sock"
      shim_rss=0
      for p in $(shim_pids "$sock"); do shim_rss=$((shim_rss + $(rss_kib "$p"))); done
      printf '%s\tshim_rss\t%s\n' "$runtime" "$((shim_rss / pods))" >>"$results"
    fi
    k delete deployment many >/dev/null
    k delete pods --all --grace-period=1 --wait=false >/dev/null 2>&1 || true
    wait_for "the pods gone" 600 none_left
    stop_all
    if [[ -n ${LOG_DIR:-} ]]; then cp "$dir/agent.err" "$LOG_DIR/$runtime-$round.agent.log"; fi
    # The bridge a private containerd's network made stays with the host otherwise.
    if [[ -f "$dir/agent/containerd/pod-subnet" ]]; then
      ip link del "sp-n$(cat "$dir/agent/containerd/pod-subnet")" 2>/dev/null || true
    fi
  done
done

median() {
  sort -g | awk '{a[NR] = $1} END {if (NR == 0) print "-"; else if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2}'
}
# The p-th percentile (nearest rank).
percentile() {
  sort -g | awk -v p="$1" '{a[NR] = $1} END {if (NR == 0) {print "-"; exit} r = int((p / 100) * NR + 0.999999); if (r < 1) r = 1; print a[r]}'
}
col() { awk -v r="$1" -v m="$2" -F'\t' '$1 == r && $2 == m {print $3}' "$results"; }

echo "containers vs processes on one node; $rounds rounds, $replacements replacements a round, $pods pods"
printf '%-44s' "runtime"
for runtime in $runtimes; do printf '%14s' "$runtime"; done
echo
row() {
  local label=$1 metric=$2 how=$3
  printf '%-44s' "$label"
  for runtime in $runtimes; do printf '%14s' "$(col "$runtime" "$metric" | $how)"; done
  echo
}
p50() { percentile 50; }
p99() { percentile 99; }
row "deleted pod -> replacement Running p50 (s)" replace p50
row "deleted pod -> replacement Running p99 (s)" replace p99
row "$pods pods created -> all Running (s)" density median
row "agent CPU per running pod (ms/s)" agent_cpu median
row "agent RSS per running pod (KiB)" agent_rss median
row "agent RSS with $pods pods (KiB)" agent_rss_total median
row "containerd CPU per running pod (ms/s)" containerd_cpu median
row "containerd RSS per running pod (KiB)" containerd_rss median
row "containerd RSS with $pods pods (KiB)" containerd_rss_total median
row "shim RSS per running pod (KiB)" shim_rss median
