#!/usr/bin/env bash
# What ValidatingAdmissionPolicies cost API writes: `setpoint bench api` against one
# `setpoint server`, alternately with no policy and with 5 policies bound to the bench's
# namespace (each matching ConfigMap creates and updates; one reads a ConfigMap parameter
# through paramRef, one uses variables and a messageExpression), round by round so that drift
# on a shared machine hits both alike.
#
# Around each run the server process's CPU time (utime + stime from /proc/<pid>/stat) is read,
# so the table also gives server CPU per request.
#
# Usage: bench/admission_policies.sh [rounds (3)] [seconds per run (10)]
# Needs cargo, kubectl and jq. SETPOINT_BIN runs that binary instead of building a release
# one; extra `setpoint bench api` flags go in VAP_BENCH_FLAGS.
set -euo pipefail

rounds=${1:-3}
seconds=${2:-10}
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"

for tool in kubectl jq; do
  command -v "$tool" >/dev/null || { echo "admission_policies.sh needs $tool" >&2; exit 1; }
done

if [[ -n "${SETPOINT_BIN:-}" ]]; then
  bin=$SETPOINT_BIN
else
  echo "building the release binary" >&2
  cargo build --release -p setpoint >&2
  bin="${CARGO_TARGET_DIR:-$repo/target}/release/setpoint"
fi

work=$(mktemp -d)
server_pid=""
cleanup() {
  if [[ -n "$server_pid" ]] && kill -0 "$server_pid" 2>/dev/null; then
    kill "$server_pid"
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

"$bin" server --listen 127.0.0.1:0 --data-dir "$work/data" >"$work/server.out" 2>"$work/server.err" &
server_pid=$!
admin="$work/data/kubeconfig"
deadline=$((SECONDS + 120))
until [[ -s "$admin" ]] && kubectl --kubeconfig "$admin" get --raw /readyz >/dev/null 2>&1; do
  if ! kill -0 "$server_pid" 2>/dev/null; then
    echo "setpoint server exited:" >&2
    cat "$work/server.err" >&2
    exit 1
  fi
  if ((SECONDS > deadline)); then
    echo "setpoint server not ready after 120 s" >&2
    exit 1
  fi
  sleep 0.2
done

ns=vap-bench
k() { kubectl --kubeconfig "$admin" "$@"; }
k create namespace "$ns" >/dev/null
k -n "$ns" create configmap bench-limits --from-literal=maxKeys=16 >/dev/null

# Five policies on ConfigMap creates and updates, each bound to the bench's namespace.
policies() {
  local rules='    resourceRules:
    - apiGroups: [""]
      apiVersions: [v1]
      operations: [CREATE, UPDATE]
      resources: [configmaps]'
  for i in 1 2 3 4 5; do
    local extra="" validation param_ref=""
    case $i in
      1) validation="    - expression: \"!has(object.data) || !('forbidden' in object.data)\"
      message: the key forbidden is not allowed" ;;
      2) validation="    - expression: object.metadata.name.size() <= 253" ;;
      3) extra="  variables:
  - name: keys
    expression: \"has(object.data) ? size(object.data) : 0\""
         validation="    - expression: variables.keys <= 64
      messageExpression: \"'too many keys: ' + string(variables.keys)\"" ;;
      4) validation="    - expression: \"!has(object.metadata.labels) || !('bench-blocked' in object.metadata.labels)\"
      reason: Forbidden" ;;
      5) extra="  paramKind:
    apiVersion: v1
    kind: ConfigMap"
         validation="    - expression: \"!has(object.data) || size(object.data) <= int(params.data.maxKeys)\""
         param_ref="  paramRef:
    name: bench-limits
    parameterNotFoundAction: Deny" ;;
    esac
    cat <<EOF
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: bench-$i
spec:
$extra
  matchConstraints:
$rules
  validations:
$validation
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: bench-$i
spec:
  policyName: bench-$i
  validationActions: [Deny]
$param_ref
  matchResources:
    namespaceSelector:
      matchLabels:
        kubernetes.io/metadata.name: $ns
---
EOF
  done
}
policies >"$work/policies.yaml"

# Whether a ConfigMap policy 1 forbids is refused now (the policies are in effect).
refused() {
  if k -n "$ns" create configmap probe --from-literal=forbidden=yes >/dev/null 2>&1; then
    k -n "$ns" delete configmap probe >/dev/null
    return 1
  fi
  return 0
}
set_mode() {
  local mode=$1 deadline=$((SECONDS + 30))
  if [[ $mode == policies ]]; then
    k apply -f "$work/policies.yaml" >/dev/null
    until refused; do
      ((SECONDS < deadline)) || { echo "the policies did not take effect" >&2; exit 1; }
      sleep 0.1
    done
  else
    k delete -f "$work/policies.yaml" --ignore-not-found >/dev/null
    while refused; do
      ((SECONDS < deadline)) || { echo "the policies did not go away" >&2; exit 1; }
      sleep 0.1
    done
  fi
}

clk_tck=$(getconf CLK_TCK)
cpu_ticks() {
  local stat
  stat=$(<"/proc/$server_pid/stat")
  stat=${stat##*) }
  awk '{print $12 + $13}' <<<"$stat"
}

modes=(none policies)
results="$work/results.tsv"
: >"$results"
for ((round = 1; round <= rounds; round++)); do
  for mode in "${modes[@]}"; do
    set_mode "$mode"
    json="$work/$mode-$round.json"
    before=$(cpu_ticks)
    # shellcheck disable=SC2086
    "$bin" bench api --kubeconfig "$admin" --namespace "$ns" \
      --duration "$seconds" --quiet --json "$json" ${VAP_BENCH_FLAGS:-} >/dev/null
    after=$(cpu_ticks)
    requests=$(jq '.requests' "$json")
    errors=$(jq '.errors' "$json")
    rps=$(jq '.requests_per_second' "$json")
    creates=$(jq '.per_second.create // 0' "$json")
    us_per_req=$(awk -v d=$((after - before)) -v t="$clk_tck" -v n="$requests" \
      'BEGIN { printf "%.1f", (n > 0 ? d / t * 1e6 / n : 0) }')
    printf '%s\t%d\t%.1f\t%.1f\t%s\t%s\n' "$mode" "$round" "$rps" "$creates" "$us_per_req" "$errors" >>"$results"
    printf 'round %d %-8s %8.0f req/s %7.0f creates/s %7s server CPU us/req  errors %s\n' \
      "$round" "$mode" "$rps" "$creates" "$us_per_req" "$errors" >&2
    if ((errors > 0)); then
      echo "the $mode run had $errors failed requests; see $json" >&2
      exit 1
    fi
  done
done

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
column_of() { awk -F'\t' -v m="$1" -v c="$2" '$1 == m { print $c }' "$results" | median; }

base_creates=$(column_of none 4)
base_cpu=$(column_of none 5)
echo
echo "setpoint bench api, $rounds rounds x $seconds s per mode, interleaved (medians)"
printf '%-9s %10s %10s %8s %18s %8s\n' mode "req/s" "creates/s" ratio "server CPU us/req" ratio
for mode in "${modes[@]}"; do
  rps=$(column_of "$mode" 3)
  creates=$(column_of "$mode" 4)
  cpu=$(column_of "$mode" 5)
  awk -v m="$mode" -v r="$rps" -v c="$creates" -v u="$cpu" -v bc="$base_creates" -v bu="$base_cpu" \
    'BEGIN { printf "%-9s %10.0f %10.0f %8.3f %18.1f %8.3f\n", m, r, c, c / bc, u, u / bu }'
done
