#!/usr/bin/env bash
# Pod configuration on one node: how fast a ConfigMap edit reaches a running pod's file, and
# what the node agent spends on many pods that each mount a ConfigMap and a projected
# service-account token. `setpoint up --no-node` runs the control plane and `setpoint agent
# --container-runtime $RUNTIME` the node, and then:
#
#   edit   one pod mounts the ConfigMap `cfg` at /etc/app and checks /etc/app/value every
#          50 ms; when it changes, it prints the value and the machine's uptime (/proc/uptime,
#          10 ms resolution, the same clock inside a container). The ConfigMap is edited
#          EDITS times with `kubectl patch`, each time to the uptime at the moment of the edit,
#          and the next edit waits until the pod has printed the previous value; the latency
#          is the pod's uptime at the change minus the edit's. p50 and p99.
#   cost   PODS pods, each mounting a ConfigMap (its own copy of `cfg`'s content is not needed:
#          they share `cfg`) and a projected service-account token (expirationSeconds 600,
#          the shortest the API allows, so refreshes are due at 480 s), created and Running;
#          then the agent's CPU (utime + stime from /proc/<pid>/stat) over WINDOW seconds,
#          twice in a row, and its RSS. The two windows show whether the work grows with time.
#
# Usage: bench/podconfig.sh
# Environment: RUNTIME (process), EDITS (20), PODS (1000), WINDOW (30), SETPOINT_BIN (run that
# binary instead of building one). Needs root (volume mounts of process pods use a mount
# namespace), cargo and kubectl; for RUNTIME=cri also containerd, runc, the CNI plugins and a
# static busybox.
set -euo pipefail

runtime=${RUNTIME:-process}
edits=${EDITS:-20}
pods=${PODS:-1000}
window=${WINDOW:-30}
image=setpoint.local/busybox:1
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"

command -v kubectl >/dev/null || { echo "podconfig.sh needs kubectl" >&2; exit 1; }

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
k() { kubectl --kubeconfig "$kubeconfig" "$@"; }
cleanup() {
  [[ $BASHPID == "$$" ]] || return 0
  if [[ -n "$agent_pid" ]] && kill -0 "$agent_pid" 2>/dev/null; then
    k delete deployments,pods --all --grace-period=1 --wait=false >/dev/null 2>&1 || true
    local deadline=$((SECONDS + 300))
    while ((SECONDS < deadline)) && [[ -n $(k get pods -o name 2>/dev/null) ]]; do sleep 0.5; done
  fi
  local p
  for p in "$agent_pid" "$up_pid"; do
    if [[ -n "$p" ]] && kill -0 "$p" 2>/dev/null; then
      kill "$p" 2>/dev/null || true
      wait "$p" 2>/dev/null || true
    fi
  done
  if [[ -f "$work/agent/containerd/pod-subnet" ]]; then
    ip link del "sp-n$(cat "$work/agent/containerd/pod-subnet")" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

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

clk_tck=$(getconf CLK_TCK)
ticks() { sed -E 's/^.*\) //' "/proc/$1/stat" | awk '{print $12 + $13}'; }
rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }
uptime_now() { awk '{print $1}' /proc/uptime; }

"$bin" up --no-node --listen 127.0.0.1:0 --data-dir "$work/data" >"$work/up.out" 2>"$work/up.err" &
up_pid=$!
kubeconfig="$work/data/kubeconfig"
wait_for "setpoint up" 120 eval 'grep -q "^Setpoint is running at" "$work/up.out" 2>/dev/null && [[ -s $kubeconfig ]]'
# Process pods on the node's network (loopback addresses), as the recorded figures were
# measured: `auto` would give them network namespaces on a bridge as root.
SETPOINT_LOG=warn "$bin" agent --node-name bench-config --address 127.0.0.1 --listen 127.0.0.1:0 \
  --container-runtime "$runtime" --process-pod-network host --max-pods "$((pods + 10))" --kubeconfig "$kubeconfig" \
  --data-dir "$work/agent" >"$work/agent.out" 2>"$work/agent.err" &
agent_pid=$!
wait_for "the node Ready" 120 eval \
  '[[ $(k get node bench-config -o jsonpath="{.status.conditions[?(@.type==\"Ready\")].status}" 2>/dev/null) == True ]]'

k create configmap cfg --from-literal=value=0 >/dev/null

# --- edit -----------------------------------------------------------------------------------
watcher='last=; while :; do read -r v < /etc/app/value; if [ "$v" != "$last" ]; then read -r u _ < /proc/uptime; echo "$u $v"; last=$v; fi; sleep 0.05; done'
k apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: watcher}
spec:
  containers:
  - name: w
    image: $image
    command: ["sh", "-c", $(printf '%s' "$watcher" | python3 -c 'import json,sys; print(json.dumps(sys.stdin.read()))')]
    volumeMounts: [{name: cfg, mountPath: /etc/app}]
  volumes: [{name: cfg, configMap: {name: cfg}}]
EOF
wait_for "the watcher Running" 120 eval '[[ $(k get pod watcher -o jsonpath="{.status.phase}") == Running ]]'
seen() { k logs watcher 2>/dev/null | awk -v v="$1" '$2 == v {found = 1} END {exit !found}'; }
wait_for "the first value" 60 seen 0
declare -a sent=()
for ((i = 0; i < edits; i++)); do
  t=$(uptime_now)
  k patch configmap cfg --type merge -p "{\"data\":{\"value\":\"$t\"}}" >/dev/null
  sent+=("$t")
  wait_for "edit $i in the pod" 120 seen "$t"
done
k logs watcher | awk 'NR > 1 {printf "%.3f\n", $1 - $2}' >"$work/edit"
k delete pod watcher --grace-period=1 >/dev/null

# --- cost -----------------------------------------------------------------------------------
k apply -f - >/dev/null <<EOF
apiVersion: apps/v1
kind: Deployment
metadata: {name: many}
spec:
  replicas: $pods
  selector: {matchLabels: {app: many}}
  template:
    metadata: {labels: {app: many}}
    spec:
      containers:
      - name: s
        image: $image
        command: [sleep, "100000"]
        volumeMounts:
        - {name: cfg, mountPath: /etc/app}
        - {name: token, mountPath: /var/run/bench}
      volumes:
      - {name: cfg, configMap: {name: cfg}}
      - name: token
        projected:
          sources:
          - serviceAccountToken: {path: token, expirationSeconds: 600}
EOF
t0=$(date +%s.%N)
running() { [[ $(k get pods -l app=many --no-headers 2>/dev/null | awk '$3 == "Running"' | wc -l) -eq $pods ]]; }
wait_for "$pods pods Running" 1800 running
density=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
cpu_window() {
  local before
  before=$(ticks "$agent_pid")
  sleep "$window"
  awk -v t="$(($(ticks "$agent_pid") - before))" -v hz="$clk_tck" -v w="$window" 'BEGIN {printf "%.1f", t / hz / w * 1000}'
}
first=$(cpu_window)
second=$(cpu_window)
rss=$(rss_kib "$agent_pid")

percentile() {
  sort -g | awk -v p="$1" '{a[NR] = $1} END {if (NR == 0) {print "-"; exit} r = int((p / 100) * NR + 0.999999); if (r < 1) r = 1; print a[r]}'
}
echo "pod configuration on one $runtime node"
printf '%-58s %s\n' "ConfigMap edit -> file changed in the pod, p50 (s)" "$(percentile 50 <"$work/edit")"
printf '%-58s %s\n' "ConfigMap edit -> file changed in the pod, p99 (s)" "$(percentile 99 <"$work/edit")"
printf '%-58s %s\n' "edits measured" "$(wc -l <"$work/edit")"
printf '%-58s %s\n' "$pods pods (ConfigMap + token volumes) created -> Running (s)" "$density"
printf '%-58s %s\n' "agent CPU with $pods pods, first $window s (ms/s)" "$first"
printf '%-58s %s\n' "agent CPU with $pods pods, next $window s (ms/s)" "$second"
printf '%-58s %s\n' "agent RSS with $pods pods (KiB)" "$rss"
