#!/usr/bin/env bash
# What authentication and authorization cost per request: `setpoint bench api` against one
# `setpoint up` cluster as three identities, interleaved round by round so that drift on a
# shared machine hits them alike:
#
#   admin  the admin client certificate (group system:masters: no RBAC evaluation)
#   token  a static bearer token (--token-auth-file) bound by RBAC to a Role on ConfigMaps
#   sa     a ServiceAccount token (kubectl create token: an ES256 JWT) bound to the same Role
#
# Around each run the server process's CPU time (utime + stime from /proc/<pid>/stat) is read,
# so the table also gives server CPU per request, which a busy 2-core machine disturbs less
# than throughput.
#
# Usage: bench/authz.sh [rounds (5)] [seconds per run (10)]
# Needs cargo, kubectl and jq. Extra `setpoint bench api` flags can be passed in
# AUTHZ_BENCH_FLAGS (e.g. "--concurrency 8 --watchers 0"); SETPOINT_BIN runs that binary
# instead of building one.
set -euo pipefail

rounds=${1:-5}
seconds=${2:-10}
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"

for tool in kubectl jq; do
  command -v "$tool" >/dev/null || { echo "authz.sh needs $tool" >&2; exit 1; }
done

if [[ -n "${SETPOINT_BIN:-}" ]]; then
  # A binary built elsewhere (to compare two builds with the same script).
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

# The static token (random, never printed) and its user.
static_token=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
printf '%s,bench-user,bench-user-uid\n' "$static_token" >"$work/tokens.csv"
chmod 600 "$work/tokens.csv"

"$bin" up --container-runtime process --process-pod-network host --listen 127.0.0.1:0 \
  --data-dir "$work/data" \
  --token-auth-file "$work/tokens.csv" >"$work/up.out" 2>"$work/up.err" &
server_pid=$!

admin="$work/data/kubeconfig"
deadline=$((SECONDS + 120))
until grep -q '^Setpoint is running at' "$work/up.out" 2>/dev/null && [[ -s "$admin" ]] &&
  kubectl --kubeconfig "$admin" get --raw /readyz >/dev/null 2>&1; do
  if ! kill -0 "$server_pid" 2>/dev/null; then
    echo "setpoint up exited:" >&2
    cat "$work/up.err" >&2
    exit 1
  fi
  if ((SECONDS > deadline)); then
    echo "setpoint up not ready after 120 s" >&2
    exit 1
  fi
  sleep 0.2
done
url=$(sed -n 's/^Setpoint is running at \(https:[^ ]*\).*/\1/p' "$work/up.out" | head -1)
echo "cluster at $url (server pid $server_pid)" >&2

ns=authz-bench
k() { kubectl --kubeconfig "$admin" "$@"; }
k create namespace "$ns" >/dev/null
k -n "$ns" create serviceaccount bench >/dev/null
k -n "$ns" create role bench --resource=configmaps \
  --verb=create,get,list,watch,update,patch,delete >/dev/null
k -n "$ns" create rolebinding bench --role=bench \
  --serviceaccount="$ns:bench" --user=bench-user >/dev/null
sa_token=$(k -n "$ns" create token bench --duration=6h)

# Kubeconfigs with the cluster's CA and a bearer token (files only this user reads).
ca_data=$(k config view --raw --minify -o jsonpath='{.clusters[0].cluster.certificate-authority-data}')
token_kubeconfig() {
  local file=$1 user=$2 token=$3
  (
    umask 077
    cat >"$file" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: setpoint
  cluster:
    server: $url
    certificate-authority-data: $ca_data
users:
- name: $user
  user:
    token: $token
contexts:
- name: $user
  context: {cluster: setpoint, user: $user, namespace: $ns}
current-context: $user
EOF
  )
}
token_kubeconfig "$work/token.kubeconfig" bench-user "$static_token"
token_kubeconfig "$work/sa.kubeconfig" bench-sa "$sa_token"
declare -A kubeconfig=([admin]="$admin" [token]="$work/token.kubeconfig" [sa]="$work/sa.kubeconfig")

# Both token identities may do what the bench does, and no more.
for id in token sa; do
  here=$(kubectl --kubeconfig "${kubeconfig[$id]}" auth can-i create configmaps -n "$ns" || true)
  elsewhere=$(kubectl --kubeconfig "${kubeconfig[$id]}" auth can-i create configmaps -n default || true)
  if [[ $here != yes || $elsewhere != no ]]; then
    echo "$id: may create configmaps in $ns: '$here', in default: '$elsewhere' (want yes, no)" >&2
    exit 1
  fi
done

clk_tck=$(getconf CLK_TCK)
# utime + stime of the server, in clock ticks (fields 14 and 15; the name field may hold
# spaces, so count from the closing parenthesis).
cpu_ticks() {
  local stat
  stat=$(<"/proc/$server_pid/stat")
  stat=${stat##*) }
  # After "pid (comm) " the fields start at 3 (state): utime is the 12th, stime the 13th.
  awk '{print $12 + $13}' <<<"$stat"
}

identities=(admin token sa)
results="$work/results.tsv"
: >"$results"
for ((round = 1; round <= rounds; round++)); do
  for id in "${identities[@]}"; do
    json="$work/$id-$round.json"
    before=$(cpu_ticks)
    # shellcheck disable=SC2086
    "$bin" bench api --kubeconfig "${kubeconfig[$id]}" --namespace "$ns" \
      --duration "$seconds" --quiet --json "$json" ${AUTHZ_BENCH_FLAGS:-} >/dev/null
    after=$(cpu_ticks)
    requests=$(jq '.requests' "$json")
    errors=$(jq '.errors' "$json")
    rps=$(jq '.requests_per_second' "$json")
    creates=$(jq '.per_second.create // 0' "$json")
    us_per_req=$(awk -v d=$((after - before)) -v t="$clk_tck" -v n="$requests" \
      'BEGIN { printf "%.1f", (n > 0 ? d / t * 1e6 / n : 0) }')
    printf '%s\t%d\t%.1f\t%.1f\t%s\t%s\n' "$id" "$round" "$rps" "$creates" "$us_per_req" "$errors" >>"$results"
    printf 'round %d %-5s %8.0f req/s %7.0f creates/s %7s server CPU us/req  errors %s\n' \
      "$round" "$id" "$rps" "$creates" "$us_per_req" "$errors" >&2
    if ((errors > 0)); then
      echo "the $id run had $errors failed requests; see $json" >&2
      exit 1
    fi
  done
done

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
column_of() { awk -F'\t' -v id="$1" -v c="$2" '$1 == id { print $c }' "$results" | median; }

base_rps=$(column_of admin 3)
base_cpu=$(column_of admin 5)
echo
echo "setpoint bench api, $rounds rounds x $seconds s per identity, interleaved (medians)"
printf '%-8s %10s %8s %10s %16s %8s\n' identity "req/s" ratio "creates/s" "server CPU us/req" ratio
for id in "${identities[@]}"; do
  rps=$(column_of "$id" 3)
  creates=$(column_of "$id" 4)
  cpu=$(column_of "$id" 5)
  awk -v id="$id" -v r="$rps" -v c="$creates" -v u="$cpu" -v br="$base_rps" -v bu="$base_cpu" \
    'BEGIN { printf "%-8s %10.0f %8.3f %10.0f %16.1f %8.3f\n", id, r, r / br, c, u, u / bu }'
done
echo
echo "per run (identity, round, req/s, creates/s, server CPU us/req):"
awk -F'\t' '{ printf "  %-6s %2d %8.0f %8.0f %8.1f\n", $1, $2, $3, $4, $5 }' "$results"
