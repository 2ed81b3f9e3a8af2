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
#
# SHARDS="1 3" (a list of shard counts) measures one hot SKU spread over that many Redis shards
# (src/shards/) instead, on the cluster only, through one gateway with
# DROPGATE_REDIS_WAIT_REPLICAS=$SHARDS_WAIT (1): per round one run per count, alternating. The
# gateway places the SKU's shards on different masters at its first declare (with more shards
# than masters some share one); the run checks that from the SKU view's shard names. Per run: claims/s, p99,
# the Redis CPU of every master (INFO cpu; replicas left out) in total and per master, the
# gateway's CPU, each divided by the claims answered, and the transfers between shards
# (dropgate_shard_transfers_total) per 1,000 claims. SHARD_UNITS (default: more than any run
# sells, so every claim wins and no shard runs dry) sets the SKU's total: a smaller one makes
# the run a drop that sells out, the case where shards borrow from each other. SHARDS_ENV
# ("VAR=VALUE ...") is passed to that gateway, e.g. SHARDS_ENV=DROPGATE_COALESCE=0.
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
TOKENS=$TMP/tokens.tsv
DROPGATE_ADMISSION_SECRET=$SECRET "$DROPGATE_BIN" token --user buyer --count "$BUYERS" --ttl 86400 >"$TOKENS"
RESULTS=$TMP/results.tsv
: >"$RESULTS"

if [[ -n ${SHARDS:-} ]]; then
  SHARDS_WAIT=${SHARDS_WAIT:-1}
  SHARD_UNITS=${SHARD_UNITS:-$UNITS}
  read -r -a SHARDS_ENV_ARGS <<<"${SHARDS_ENV:-}"
  REDIS_URL=$CLUSTER_URL start_gateway sharded "dg_cluster_${ID}_h" "cl${ID}h" \
    DROPGATE_REDIS_WAIT_REPLICAS="$SHARDS_WAIT" "${SHARDS_ENV_ARGS[@]}"
  GW=$GW_URL GWPID=$GW_PID
  # The masters, and the slot ranges each serves ("start end port" lines).
  MASTERS=() RANGES=$TMP/ranges
  redis-cli -p "${CLUSTER_PORTS[0]}" CLUSTER NODES | tr -d '\r' | awk '
    $3 ~ /master/ { split($2, a, "[:@]"); for (i = 9; i <= NF; i++) if ($i !~ /^\[/) {
      n = split($i, r, "-"); print r[1], (n > 1 ? r[2] : r[1]), a[2] } }' >"$RANGES"
  read -r -a MASTERS <<<"$(awk '{ print $3 }' "$RANGES" | sort -u | tr '\n' ' ')"
  master_of() { # master_of KEY: the port of the master serving KEY's slot
    local slot
    slot=$(redis-cli -p "${CLUSTER_PORTS[0]}" CLUSTER KEYSLOT "$1" | tr -d '\r')
    awk -v s="$slot" '$1 <= s && s <= $2 { print $3; exit }' "$RANGES"
  }
  # spread_check VIEW N: dies unless the N shards of the SKU VIEW shows sit on min(N, masters)
  # different masters (the first declare places them: src/shards/placement.rs).
  spread_check() {
    local view=$1 n=$2 want name
    want=$((n < ${#MASTERS[@]} ? n : ${#MASTERS[@]}))
    local -A seen=()
    if ((n == 1)); then return 0; fi
    for name in $(jq -r '.shards[].name' <<<"$view"); do seen[$(master_of "{$name}")]=1; done
    ((${#seen[@]} == want)) || die "the $n shards of $(jq -r .sku <<<"$view") are on ${#seen[@]} masters, not $want"
  }
  transfers() {
    curl -sS -m 5 "$GW/metrics" | awk '$1 == "dropgate_shard_transfers_total" { print $2 }'
  }
  say "sharded runs on ${GW} (cluster masters ${MASTERS[*]}, WAIT $SHARDS_WAIT${SHARDS_ENV:+, $SHARDS_ENV}), shard counts: $SHARDS, units $SHARD_UNITS"
  say "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
  shard_run() {
    local n=$1 round=$2 sku view units c0 c1 g0 g1 t0 t1 rc=0 per=() m
    sku="cls$n-$round-$ID"
    view=$(admin PUT "$GW/admin/skus/$sku" \
      "{\"total\":$SHARD_UNITS,\"per_user_limit\":$PER_USER_LIMIT,\"shards\":$n}")
    [[ $(jq -r .remaining <<<"$view") == "$SHARD_UNITS" ]] || die "declaring $sku: $view"
    spread_check "$view" "$n"
    local -A m0=()
    for m in "${MASTERS[@]}"; do m0[$m]=$(node_cpu "$m"); done
    c0=$(node_cpu "${MASTERS[@]}") g0=$(proc_cpu "$GWPID") t0=$(transfers)
    wrk_run "s$n-$round" "$GW/v1/skus/$sku/claims" "$CONNS"
    view=$(wait_drained "$GW" "$sku" "$DRAIN_S") || rc=$?
    ((rc == 2)) && die "the gateway stopped answering on $sku; see $TMP/*.log"
    ((rc == 0)) || say "WARNING: the writer did not drain $sku within ${DRAIN_S}s"
    units=$(jq -r "$SHARD_UNITS - .remaining" <<<"$view")
    c1=$(node_cpu "${MASTERS[@]}") g1=$(proc_cpu "$GWPID") t1=$(transfers)
    for m in "${MASTERS[@]}"; do per+=("$(sub "$(node_cpu "$m")" "${m0[$m]}")"); done
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "s$n" "$round" "$R_requests" \
      "$R_duration_us" "$R_p99_us" "$units" "$(sub "$c1" "$c0")" "$(sub "$g1" "$g0")" \
      "$(sub "$t1" "$t0")" "$R_non2xx" "$(
        IFS=,
        echo "${per[*]}"
      )" >>"$RESULTS"
    awk -F'\t' '{ printf "%-4s round %s: %8.0f claims/s  p99 %6.2f ms  won %d  masters cpu %.3f s (%s)  gateway cpu %.3f s  transfers %d\n",
      $1, $2, $3 / ($4 / 1e6), $5 / 1000, $6, $7, $11, $8, $9 }' <<<"$(tail -1 "$RESULTS")" >&2
  }
  for round in $(seq "$ROUNDS"); do
    for n in $SHARDS; do shard_run "$n" "$round"; done
  done
  say "done; per shard count (median of rounds; per claim = per request answered):"
  awk -F'\t' '
    { k = $1; n[k]++; r[k, n[k]] = $3 / ($4 / 1e6); p99[k, n[k]] = $5 / 1000
      rc[k, n[k]] = $7 / $3 * 1e6; gc[k, n[k]] = $8 / $3 * 1e6; tr[k, n[k]] = $9 / $3 * 1000
      won[k, n[k]] = $6; split($11, pm, ","); mx = 0; for (i in pm) if (pm[i] > mx) mx = pm[i]
      busiest[k, n[k]] = mx / ($4 / 1e6) * 100 }
    function med(a, k, m,   i, j, t, v) {
      for (i = 1; i <= m; i++) v[i] = a[k, i]
      for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
      return v[int((m + 1) / 2)]
    }
    END {
      base = med(r, "s1", n["s1"]); bcpu = med(rc, "s1", n["s1"])
      for (k in n) printf "%-4s %8.0f claims/s (%.2fx s1)  p99 %6.2f ms  masters cpu %5.1f us/claim (%.2fx s1)  busiest master %3.0f%% of a core  gateway cpu %5.1f us/claim  transfers %.2f per 1000 claims  won %d  (%d runs)\n",
        k, med(r, k, n[k]), base ? med(r, k, n[k]) / base : 0, med(p99, k, n[k]), med(rc, k, n[k]),
        bcpu ? med(rc, k, n[k]) / bcpu : 0, med(busiest, k, n[k]), med(gc, k, n[k]), med(tr, k, n[k]), med(won, k, n[k]), n[k]
    }' "$RESULTS"
  exit 0
fi

REDIS_URL=redis://127.0.0.1:$SINGLE_PORT start_gateway single "dg_cluster_${ID}_s" "cl${ID}s"
URL[single]=$GW_URL PID[single]=$GW_PID NODES[single]=$SINGLE_PORT
REDIS_URL=$CLUSTER_URL start_gateway cluster "dg_cluster_${ID}_c" "cl${ID}c" DROPGATE_REDIS_WAIT_REPLICAS=0
URL[cluster]=$GW_URL PID[cluster]=$GW_PID NODES[cluster]="${CLUSTER_PORTS[*]}"
REDIS_URL=$CLUSTER_URL start_gateway wait1 "dg_cluster_${ID}_w" "cl${ID}w" DROPGATE_REDIS_WAIT_REPLICAS=1
URL[wait1]=$GW_URL PID[wait1]=$GW_PID NODES[wait1]="${CLUSTER_PORTS[*]}"
say "single ${URL[single]} (redis :$SINGLE_PORT), cluster ${URL[cluster]}, wait1 ${URL[wait1]} (cluster ${CLUSTER_PORTS[*]}), $BUYERS buyers"
say "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"


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
