#!/usr/bin/env bash
# The density benchmark with every component on its own identity, against the same benchmark
# with everything in one process. Each round runs, one after the other:
#
#   in-process  `setpoint up --no-node --simulate N`: API server, controllers, scheduler and
#               the simulated nodes in one process, on in-process clients.
#   separate    `setpoint server`, then `setpoint controller-manager` (its own kubeconfig,
#               --use-service-account-credentials: each controller as its own ServiceAccount),
#               `setpoint scheduler` (its own kubeconfig) and `setpoint agent --simulate N`
#               joined with a bootstrap token, so that every simulated node has a certificate
#               of its own (system:node:<name>); all of them over HTTPS.
#
# and then `setpoint bench density --reuse-nodes` (D Deployments × R replicas on the N nodes)
# against the cluster. Recorded per run: the report's time to all Running, p50/p99 pod
# startup (created → Running), the CPU seconds the cluster's processes spent during the
# benchmark (utime + stime from /proc/<pid>/stat, read before and after it), and the sum of
# their peak RSS (VmHWM). The benchmark process itself is not counted.
#
# Client-side rate limits: the controller manager's clients default to 50 requests/s with a
# burst of 100 (upstream's --kube-api-qps and --kube-api-burst defaults are lower still); with
# --use-service-account-credentials each controller has its own client and limit. The
# in-process controllers have none, so the separate controller manager gets
# --kube-api-qps $CM_QPS --kube-api-burst $CM_BURST (default 5000/10000: in effect no limit)
# to compare the components rather than a limiter; set CM_QPS=50 CM_BURST=100 to see the
# defaults. The scheduler and the node agent send unthrottled by default.
#
# Usage: bench/identities.sh [rounds (3)]
# Environment: NODES (100), DEPLOYMENTS (100), REPLICAS (10), CM_QPS, CM_BURST, SETPOINT_BIN
# (run that binary instead of building one). Needs cargo, kubectl and jq.
set -euo pipefail

rounds=${1:-3}
nodes=${NODES:-100}
deployments=${DEPLOYMENTS:-100}
replicas=${REPLICAS:-10}
cm_qps=${CM_QPS:-5000}
cm_burst=${CM_BURST:-10000}
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"

for tool in kubectl jq; do
  command -v "$tool" >/dev/null || { echo "identities.sh needs $tool" >&2; exit 1; }
done

if [[ -n "${SETPOINT_BIN:-}" ]]; then
  bin=$SETPOINT_BIN
else
  echo "building the release binary" >&2
  cargo build --release -p setpoint >&2
  bin="${CARGO_TARGET_DIR:-$repo/target}/release/setpoint"
fi

work=$(mktemp -d)
pids=()
stop_all() {
  # Nodes first, the API server last, as an operator would.
  local i
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    if kill -0 "${pids[i]}" 2>/dev/null; then
      kill "${pids[i]}" 2>/dev/null || true
      wait "${pids[i]}" 2>/dev/null || true
    fi
  done
  pids=()
}
cleanup() {
  stop_all
  rm -rf "$work"
}
trap cleanup EXIT

clk_tck=$(getconf CLK_TCK)

# utime + stime of the process, in clock ticks (fields 14 and 15; the name in field 2 is cut
# off first, since it may hold spaces).
ticks() {
  sed -E 's/^.*\) //' "/proc/$1/stat" | awk '{print $12 + $13}'
}

# Sum of ticks over the running cluster processes.
cluster_ticks() {
  local total=0 p
  for p in "${pids[@]}"; do
    total=$((total + $(ticks "$p")))
  done
  echo "$total"
}

# Sum of VmHWM (KiB) over the running cluster processes.
cluster_hwm_kib() {
  local total=0 p kib
  for p in "${pids[@]}"; do
    kib=$(awk '/^VmHWM:/ {print $2}' "/proc/$p/status")
    total=$((total + kib))
  done
  echo "$total"
}

# Waits until `$1` holds the line starting with `$2` (and the kubeconfig `$3` exists).
wait_for_start() {
  local out=$1 line=$2 kubeconfig=$3 deadline=$((SECONDS + 120))
  until grep -q "^$line" "$out" 2>/dev/null && [[ -s "$kubeconfig" ]]; do
    if ((SECONDS > deadline)); then
      echo "no '$line' in $out within 120 s:" >&2
      cat "$out" >&2
      exit 1
    fi
    sleep 0.2
  done
}

# Starts a process in the background, recording its pid as a cluster process.
start() {
  local out=$1
  shift
  "$@" >"$out" 2>"${out%.out}.err" &
  pids+=($!)
}

# Runs the density benchmark against the admin kubeconfig `$1`, writing `$2`.json, and
# appends a result line `mode all_running p50 p99 cpu hwm_mib` to $work/results.
measure() {
  local kubeconfig=$1 name=$2 mode=$3 before after p
  local -A was=()
  for p in "${pids[@]}"; do was[$p]=$(ticks "$p"); done
  before=$(cluster_ticks)
  "$bin" bench density --kubeconfig "$kubeconfig" --nodes "$nodes" --reuse-nodes \
    --deployments "$deployments" --replicas "$replicas" --quiet \
    --json "$work/$name.json" >"$work/$name.table"
  after=$(cluster_ticks)
  # Each process's share, to see where the CPU went.
  for p in "${pids[@]}"; do
    awk -v t="$(($(ticks "$p") - was[$p]))" -v hz="$clk_tck" -v what="$(tr '\0' ' ' <"/proc/$p/cmdline" | cut -d' ' -f2)" \
      'BEGIN {printf "  %s: %.1f CPU s\n", what, t / hz}' >&2
  done
  local hwm
  hwm=$(cluster_hwm_kib)
  jq -r --arg mode "$mode" --arg cpu "$(awk -v t="$((after - before))" -v hz="$clk_tck" 'BEGIN {printf "%.1f", t / hz}')" \
    --arg hwm "$((hwm / 1024))" \
    '[$mode, .total_seconds, .latency_ms.created_to_running.p50, .latency_ms.created_to_running.p99, $cpu, $hwm] | @tsv' \
    "$work/$name.json" >>"$work/results"
  tail -n1 "$work/results" >&2
}

run_in_process() {
  local d="$work/in-$1"
  mkdir -p "$d"
  start "$d/up.out" "$bin" up --no-node --simulate "$nodes" --start-delay-ms 0 --ready-delay-ms 0 \
    --listen 127.0.0.1:0 --data-dir "$d/data"
  wait_for_start "$d/up.out" "Hosting $nodes simulated nodes" "$d/data/kubeconfig"
  measure "$d/data/kubeconfig" "in-process-$1" in-process
  stop_all
}

run_separate() {
  local d="$work/sep-$1"
  mkdir -p "$d"
  start "$d/server.out" "$bin" server --listen 127.0.0.1:0 --data-dir "$d/data"
  wait_for_start "$d/server.out" "Setpoint is running at" "$d/data/kubeconfig"
  local admin="$d/data/kubeconfig" url
  url=$(sed -n 's/^Setpoint is running at \([^ ]*\).*/\1/p' "$d/server.out")
  start "$d/cm.out" "$bin" controller-manager --kubeconfig "$d/data/controller-manager.kubeconfig" \
    --use-service-account-credentials --secure-port 0 \
    --cluster-signing-cert-file "$d/data/pki/ca.crt" --cluster-signing-key-file "$d/data/pki/ca.key" \
    --kube-api-qps "$cm_qps" --kube-api-burst "$cm_burst"
  start "$d/scheduler.out" "$bin" scheduler --kubeconfig "$d/data/scheduler.kubeconfig" --secure-port 0
  # A bootstrap token (a Secret of upstream's shape) and a bootstrap kubeconfig naming it.
  local id secret expiration boot="$d/bootstrap.kubeconfig"
  id=$(head -c 64 /dev/urandom | tr -dc 'a-z0-9' | head -c 6)
  secret=$(head -c 256 /dev/urandom | tr -dc 'a-z0-9' | head -c 16)
  expiration=$(date -u -d '+1 hour' +%Y-%m-%dT%H:%M:%SZ)
  kubectl --kubeconfig "$admin" -n kube-system create secret generic "bootstrap-token-$id" \
    --type bootstrap.kubernetes.io/token --from-literal "token-id=$id" \
    --from-literal "token-secret=$secret" --from-literal "expiration=$expiration" \
    --from-literal usage-bootstrap-authentication=true >/dev/null
  kubectl config --kubeconfig "$boot" set-cluster setpoint --server "$url" \
    --certificate-authority "$d/data/pki/ca.crt" --embed-certs >/dev/null
  kubectl config --kubeconfig "$boot" set-credentials bootstrap --token "$id.$secret" >/dev/null
  kubectl config --kubeconfig "$boot" set-context setpoint --cluster setpoint --user bootstrap >/dev/null
  kubectl config --kubeconfig "$boot" use-context setpoint >/dev/null
  local joined=$SECONDS
  start "$d/agent.out" "$bin" agent --bootstrap-kubeconfig "$boot" --simulate "$nodes" \
    --start-delay-ms 0 --ready-delay-ms 0 --listen 127.0.0.1:0 --data-dir "$d/agent"
  wait_for_start "$d/agent.out" "Simulating $nodes nodes" "$admin"
  echo "separate round $1: $nodes node certificates issued in $((SECONDS - joined)) s" >&2
  measure "$admin" "separate-$1" separate
  local csrs
  csrs=$(kubectl --kubeconfig "$admin" get csr --no-headers | grep -c "system:bootstrap:$id.*Approved,Issued" || true)
  echo "separate round $1: $csrs CSRs from system:bootstrap:$id Approved,Issued" >&2
  stop_all
}

: >"$work/results"
echo "density: $deployments Deployments × $replicas replicas on $nodes simulated nodes, $rounds rounds" >&2
echo "separate controller manager: --kube-api-qps $cm_qps --kube-api-burst $cm_burst" >&2
for ((r = 1; r <= rounds; r++)); do
  # Alternate which setup goes first, so drift on a shared machine hits both alike.
  if ((r % 2)); then
    run_in_process "$r"
    run_separate "$r"
  else
    run_separate "$r"
    run_in_process "$r"
  fi
done

median() {
  sort -g | awk '{a[NR] = $1} END {if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2}'
}
col() {
  awk -v m="$1" -v c="$2" -F'\t' '$1 == m {print $c}' "$work/results" | median
}

echo
echo "density, $deployments × $replicas pods on $nodes simulated nodes; medians of $rounds rounds"
echo "(separate controller manager at --kube-api-qps $cm_qps --kube-api-burst $cm_burst)"
echo
printf '%-28s %12s %12s %10s\n' "figure" "in-process" "separate" "ratio"
for spec in "all Running (s):2" "pod startup p50 (ms):3" "pod startup p99 (ms):4" \
  "cluster CPU (s):5" "summed peak RSS (MiB):6"; do
  name=${spec%:*}
  c=${spec##*:}
  a=$(col in-process "$c")
  b=$(col separate "$c")
  ratio=$(awk -v a="$a" -v b="$b" 'BEGIN {if (a > 0) printf "%.2f", b / a; else print "-"}')
  printf '%-28s %12s %12s %10s\n' "$name" "$a" "$b" "$ratio"
done
echo
echo "every run (mode, all Running s, p50 ms, p99 ms, CPU s, summed peak RSS MiB):"
cat "$work/results"
