#!/usr/bin/env bash
# cluster.sh: what Redis Cluster and the replica acknowledgement (WAIT) cost on the claim path,
# measured side by side.
#
# Starts, on loopback, a private single redis-server and a private Redis Cluster of 3 masters
# with one replica each (6 redis-server processes), then per round alternating runs of
# `wrk -t$THREADS -c$CONNS -d${DURATION_S}s --latency -s wrk/post.lua` (every claim of one unit
# on one hot SKU, BUYERS distinct buyers, every request wins) against:
#   single   dropgate on the single Redis (the multiplexed ConnectionManager)
#   cluster  dropgate on the cluster, DROPGATE_REDIS_WAIT_REPLICAS=0 (the cluster connection)
#   wait1    dropgate on the cluster, DROPGATE_REDIS_WAIT_REPLICAS=1 (the default on a cluster)
# Per run: claims/s, p50/p99, the Redis CPU (INFO cpu of every node of the run's deployment,
# replicas included) and the gateway's CPU, read before the run and after its writer drained
# the SKU, divided by the units sold.
#
# Environment: ROUNDS (3), DURATION_S (10), CONNS (64), THREADS (2), BUYERS (5000), DRAIN_S
# (120), SKIP_BUILD=1 (use the built release binary), DROPGATE_BIN, KEEP_TMP=1.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
# shellcheck source=lib.sh
source "$HERE/lib.sh"

ROUNDS=${ROUNDS:-3}
DURATION_S=${DURATION_S:-10}
CONNS=${CONNS:-64}
THREADS=${THREADS:-2}
BUYERS=${BUYERS:-5000}
DRAIN_S=${DRAIN_S:-120}
LIFE_S=$((ROUNDS * 3 * (DURATION_S + 40) + ROUNDS * DRAIN_S + 300))
UNITS=1000000000000
PER_USER_LIMIT=1000000

trap cleanup EXIT
trap 'exit 130' INT TERM

need_tools wrk jq curl redis-cli redis-server psql timeout

if [[ ${SKIP_BUILD:-0} != 1 ]]; then
  say "building the release binary"
  (cd "$ROOT" && cargo build --release -q)
fi
cp "${DROPGATE_BIN:-$(target_dir)/release/dropgate}" "$TMP/dropgate"
DROPGATE_BIN=$TMP/dropgate

# redis_node PORT [ARGS...]: a private redis-server on PORT, waited for.
redis_node() {
  local port=$1
  shift
  mkdir -p "$TMP/r$port"
  start_bg "$TMP/r$port/log" redis-server --bind 127.0.0.1 --port "$port" --save '' \
    --appendonly no --dir "$TMP/r$port" "$@"
  for _ in $(seq 100); do
    [[ $(redis-cli -p "$port" PING 2>/dev/null) == PONG ]] && return 0
    sleep 0.1
  done
  die "redis-server on $port did not start"
}

SINGLE_PORT=$(free_port)
redis_node "$SINGLE_PORT"
CLUSTER_PORTS=()
for _ in 1 2 3 4 5 6; do
  p=$(free_port)
  # The bus port is given: the default (port + 10000) may not exist.
  redis_node "$p" --cluster-enabled yes --cluster-config-file "$TMP/r$p/nodes.conf" \
    --cluster-node-timeout 2000 --cluster-port "$(free_port)" --repl-diskless-sync-delay 0
  CLUSTER_PORTS+=("$p")
done
redis-cli --cluster create $(printf '127.0.0.1:%s ' "${CLUSTER_PORTS[@]}") \
  --cluster-replicas 1 --cluster-yes >"$TMP/cluster-create.log" 2>&1 ||
  die "redis-cli --cluster create failed (see $TMP/cluster-create.log)"
for _ in $(seq 200); do
  ok=1
  for p in "${CLUSTER_PORTS[@]}"; do
    redis-cli -p "$p" CLUSTER INFO | grep -q 'cluster_state:ok' || ok=0
  done
  ((ok == 1)) && break
  sleep 0.1
done
((ok == 1)) || die "the cluster did not become ok"
CLUSTER_URL=$(printf 'redis://127.0.0.1:%s,' "${CLUSTER_PORTS[@]:0:3}")
CLUSTER_URL=${CLUSTER_URL%,}

# node_cpu PORT...: CPU seconds so far of the given redis-servers, summed.
node_cpu() {
  local p s=0 c
  for p in "$@"; do
    c=$(redis-cli -p "$p" INFO cpu | tr -d '\r' |
      awk -F: '$1 == "used_cpu_sys" || $1 == "used_cpu_user" { s += $2 } END { printf "%.6f", s }')
    s=$(awk -v a="$s" -v b="$c" 'BEGIN { printf "%.6f", a + b }')
  done
  echo "$s"
}

declare -A URL PID NODES
ID=$(date +%s)$$
SECRET=$(rand_hex 24)
ADMIN=$(rand_hex 24)
REDIS_URL=redis://127.0.0.1:$SINGLE_PORT start_gateway single "dg_cluster_${ID}_s" "cl${ID}s"
URL[single]=$GW_URL PID[single]=$GW_PID NODES[single]=$SINGLE_PORT
REDIS_URL=$CLUSTER_URL start_gateway cluster "dg_cluster_${ID}_c" "cl${ID}c" DROPGATE_REDIS_WAIT_REPLICAS=0
URL[cluster]=$GW_URL PID[cluster]=$GW_PID NODES[cluster]="${CLUSTER_PORTS[*]}"
REDIS_URL=$CLUSTER_URL start_gateway wait1 "dg_cluster_${ID}_w" "cl${ID}w" DROPGATE_REDIS_WAIT_REPLICAS=1
URL[wait1]=$GW_URL PID[wait1]=$GW_PID NODES[wait1]="${CLUSTER_PORTS[*]}"
say "single ${URL[single]} (redis :$SINGLE_PORT), cluster ${URL[cluster]}, wait1 ${URL[wait1]} (cluster ${CLUSTER_PORTS[*]}), $BUYERS buyers"
say "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"

TOKENS=$TMP/tokens.tsv
DROPGATE_ADMISSION_SECRET=$SECRET "$DROPGATE_BIN" token --user buyer --count "$BUYERS" --ttl 86400 >"$TOKENS"
RESULTS=$TMP/results.tsv
: >"$RESULTS"

run() {
  local kind=$1 round=$2 sku="cl-$1-$2" url=${URL[$1]} view units c0 c1 g0 g1 rc=0
  local -a nodes
  read -r -a nodes <<<"${NODES[$kind]}"
  view=$(admin PUT "$url/admin/skus/$sku" "{\"total\":$UNITS,\"per_user_limit\":$PER_USER_LIMIT}")
  [[ $(jq -r .remaining <<<"$view") == "$UNITS" ]] || die "declaring $sku: $view"
  c0=$(node_cpu "${nodes[@]}") g0=$(proc_cpu "${PID[$kind]}")
  wrk_run "$kind-$round" "$url/v1/skus/$sku/claims" "$CONNS"
  view=$(wait_drained "$url" "$sku" "$DRAIN_S") || rc=$?
  ((rc == 2)) && die "$kind stopped answering on $sku; see $TMP/*.log"
  ((rc == 0)) || say "WARNING: $kind: the writer did not drain $sku within ${DRAIN_S}s"
  units=$(jq -r "$UNITS - .remaining" <<<"$view")
  c1=$(node_cpu "${nodes[@]}") g1=$(proc_cpu "${PID[$kind]}")
  record won "$kind" "$CONNS" "$round" "$units" "$(sub "$c1" "$c0")" "$(sub "$g1" "$g0")" - -
}

for round in $(seq "$ROUNDS"); do
  for kind in single cluster wait1; do run "$kind" "$round"; done
done

say "done; per kind (median of rounds):"
awk -F'\t' '
  { rate = $10 / ($12 / 1e6); k = $2; n[k]++
    r[k, n[k]] = rate; p99[k, n[k]] = $14 / 1000
    rc[k, n[k]] = ($5 > 0) ? $6 / $5 * 1e6 : 0; gc[k, n[k]] = ($5 > 0) ? $7 / $5 * 1e6 : 0 }
  function med(a, k, m,   i, j, t, v) {
    for (i = 1; i <= m; i++) v[i] = a[k, i]
    for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
    return v[int((m + 1) / 2)]
  }
  END {
    base = med(r, "single", n["single"])
    for (k in n) printf "%-8s %9.0f claims/s (%.2fx single)  p99 %6.2f ms  redis cpu %5.1f us/claim  gateway cpu %5.1f us/claim  (%d runs)\n",
      k, med(r, k, n[k]), med(r, k, n[k]) / base, med(p99, k, n[k]), med(rc, k, n[k]), med(gc, k, n[k]), n[k]
  }' "$RESULTS"
