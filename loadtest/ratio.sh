#!/usr/bin/env bash
# ratio.sh: what the gateway costs over the least a claim server can do, measured side by side.
#
# Per round, alternating runs of `wrk -t$THREADS -c<C> -d${DURATION_S}s --latency -s wrk/post.lua`
# (every claim of one unit on one hot SKU):
# 1. For each C in CONNS_LIST (64 256): dropgate, then `reference` (loadtest/src/bin/reference.rs:
#    one EVALSHA per POST, no token check, no idempotency, no journal), then BASE_BIN's dropgate
#    when given (a second build, e.g. before a change). Every request wins: a fresh SKU per run
#    with 10^12 units and a per-user limit of 10^6. Around each run: Redis `INFO cpu`
#    (used_cpu_sys + used_cpu_user) and the gateway's CPU (/proc/PID/stat utime + stime), read
#    before the run and after the journal writer drained it, divided by the units sold; and
#    Redis commands (INFO commandstats, scripts' own calls included; every server's idle
#    background work included, not subtracted) over the same span, divided the same way; and
#    the CPU of the PostgreSQL backends connected to the gateway's own database (the writer,
#    the outbox relay: what the reference never spends), divided the same way.
# 2. After sell-out: a SKU of one unit, so every request but the first is refused (409), on
#    dropgate (the fast path), on dropgate with DROPGATE_SOLD_OUT_TRUST_MS=0 (every refusal a
#    claim.lua call: the path before the fast path) and on the reference. Answered attempts/s,
#    and Redis commands per refused attempt (INFO commandstats, all commands and EVALSHA).
#
# Buyers (BUYERS, default 5000): distinct users, tokens pre-minted (`dropgate token --count`),
# cycled by wrk, each thread from its own offset; the reference gets the same users as X-User.
# BUYERS=1 is the earlier single-buyer measurement.
#
# Redis: by default a private redis-server on a free loopback port (RATIO_REDIS=private),
# because INFO counts the whole server and the shared Redis on 6379 serves others too;
# RATIO_REDIS=shared uses 127.0.0.1:6379 with unique key prefixes (figures then include others).
#
# Environment: ROUNDS (3), DURATION_S (10), CONNS_LIST ("64 256"), THREADS (2), BUYERS (5000),
# DRAIN_S (120), RATIO_REDIS (private), SOLD_OUT=0 (skip part 2), BASE_BIN (a second dropgate
# binary run alongside), SKIP_BUILD=1 (use built binaries), DROPGATE_BIN, REFERENCE_BIN,
# KEEP_TMP=1 (keep logs), REDIS_BREAKDOWN=1 (Redis's CPU per unit by command, after each run). Everything is bounded in time; every server started is stopped on
# exit. Loopback only.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
# shellcheck source=lib.sh
source "$HERE/lib.sh"

ROUNDS=${ROUNDS:-3}
DURATION_S=${DURATION_S:-10}
read -r -a CONNS_LIST <<<"${CONNS_LIST:-64 256}"
THREADS=${THREADS:-2}
BUYERS=${BUYERS:-5000}
DRAIN_S=${DRAIN_S:-120}
RATIO_REDIS=${RATIO_REDIS:-private}
SOLD_OUT=${SOLD_OUT:-1}
# Each server outlives the whole run by a margin, and no more.
LIFE_S=$((ROUNDS * (${#CONNS_LIST[@]} * 3 + 3) * (DURATION_S + 40) + ROUNDS * DRAIN_S + 300))
UNITS=1000000000000
PER_USER_LIMIT=1000000

trap cleanup EXIT
trap 'exit 130' INT TERM

need_tools wrk jq curl redis-cli psql timeout
[[ $RATIO_REDIS == private ]] && need_tools redis-server

if [[ ${SKIP_BUILD:-0} != 1 ]]; then
  say "building release binaries"
  (cd "$ROOT" && cargo build --release -q && cargo build --release -q -p dropgate-loadtest --bin reference)
fi
TARGET=$(target_dir)
# Copies, so that a rebuild in the shared target dir cannot swap them mid-run.
cp "${DROPGATE_BIN:-$TARGET/release/dropgate}" "$TMP/dropgate"
cp "${REFERENCE_BIN:-$TARGET/release/reference}" "$TMP/reference"
DROPGATE_BIN=$TMP/dropgate
REFERENCE_BIN=$TMP/reference
if [[ -n ${BASE_BIN:-} ]]; then
  cp "$BASE_BIN" "$TMP/dropgate-base"
  BASE_BIN=$TMP/dropgate-base
fi

declare -A URL PID DB
ID=$(date +%s)$$
SECRET=$(rand_hex 24)
ADMIN=$(rand_hex 24)
start_private_redis_or_shared "ratio${ID}"

start_gateway gw "dg_ratio_${ID}_g" "ratio${ID}g"
DB[dropgate]=dg_ratio_${ID}_g
URL[dropgate]=$GW_URL PID[dropgate]=$GW_PID
if [[ -n ${BASE_BIN:-} ]]; then
  DROPGATE_BIN=$BASE_BIN start_gateway gw-base "dg_ratio_${ID}_b" "ratio${ID}b"
  DB[base]=dg_ratio_${ID}_b
  URL[base]=$GW_URL PID[base]=$GW_PID
fi
if [[ $SOLD_OUT == 1 ]]; then
  start_gateway gw-nofast "dg_ratio_${ID}_n" "ratio${ID}n" DROPGATE_SOLD_OUT_TRUST_MS=0
  URL[nofast]=$GW_URL PID[nofast]=$GW_PID
fi
start_bg "$TMP/reference.log" env REFERENCE_LISTEN=127.0.0.1:0 REDIS_URL="$REDIS_URL" \
  REFERENCE_KEY_PREFIX="ratio${ID}r" REFERENCE_PER_USER_LIMIT=$PER_USER_LIMIT "$REFERENCE_BIN"
URL[reference]=http://$(wait_listen "$BG_PID" "$TMP/reference.log")
PID[reference]=$(server_pid "$BG_PID")
say "dropgate ${URL[dropgate]}, reference ${URL[reference]}${BASE_BIN:+, base ${URL[base]}}, redis :$RPORT ($RATIO_REDIS), $BUYERS buyer(s)"
say "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"

# The idle Redis CPU rate (the gateways' background readers, and others on a shared Redis).
# The idle Redis CPU and command rates (every server's background readers, and others on a
# shared Redis): the after-sell-out figures subtract the idle commands of the run's duration.
c0=$(redis_cpu) k0=$(redis_calls all) e0=$(redis_calls evalsha)
sleep 5
IDLE_CPU_PER_S=$(awk -v a="$c0" -v b="$(redis_cpu)" 'BEGIN { printf "%.6f", (b - a) / 5 }')
IDLE_CALLS_PER_S=$(awk -v a="$k0" -v b="$(redis_calls all)" 'BEGIN { printf "%.3f", (b - a) / 5 }')
IDLE_EVALS_PER_S=$(awk -v a="$e0" -v b="$(redis_calls evalsha)" 'BEGIN { printf "%.3f", (b - a) / 5 }')

# Tokens of the buyers, minted once per SKU name (a token may name its SKU; these do not).
TOKENS=$TMP/tokens.tsv
DROPGATE_ADMISSION_SECRET=$SECRET "$DROPGATE_BIN" token --user buyer --count "$BUYERS" --ttl 86400 >"$TOKENS"

RESULTS=$TMP/results.tsv
: >"$RESULTS"

# won_run KIND CONNS ROUND: one run where every request wins, on a fresh SKU.
won_run() {
  local kind=$1 conns=$2 round=$3 sku="ratio-$1-$2-$3" url=${URL[$1]} view units c0 c1 g0 g1 rc=0
  local k0 k1 e0 e1 p0=0 p1=0 pg=-
  if [[ $kind == reference ]]; then
    "${RCLI[@]}" SET "ratio${ID}r:{$sku}:stock" "$UNITS" >/dev/null
  else
    view=$(admin PUT "$url/admin/skus/$sku" "{\"total\":$UNITS,\"per_user_limit\":$PER_USER_LIMIT}")
    [[ $(jq -r .remaining <<<"$view") == "$UNITS" ]] || die "declaring $sku: $view"
  fi
  c0=$(redis_cpu) g0=$(proc_cpu "${PID[$kind]}") k0=$(redis_calls all) e0=$(redis_calls evalsha)
  [[ -n ${DB[$kind]:-} ]] && p0=$(pg_cpu "${DB[$kind]}")
  [[ ${REDIS_BREAKDOWN:-0} == 1 ]] && "${RCLI[@]}" INFO commandstats | tr -d '\r' >"$TMP/cmd0"
  wrk_run "$kind-$conns-$round" "$url/v1/skus/$sku/claims" "$conns"
  if [[ $kind == reference ]]; then
    units=$((UNITS - $("${RCLI[@]}" GET "ratio${ID}r:{$sku}:stock")))
  else
    view=$(wait_drained "$url" "$sku" "$DRAIN_S") || rc=$?
    ((rc == 2)) && die "$kind stopped answering during or after the run on $sku; see $TMP/*.log"
    ((rc == 0)) || say "WARNING: $kind: the writer did not drain $sku within ${DRAIN_S}s"
    units=$(jq -r "$UNITS - .remaining" <<<"$view")
  fi
  c1=$(redis_cpu) g1=$(proc_cpu "${PID[$kind]}") k1=$(redis_calls all) e1=$(redis_calls evalsha)
  [[ -n ${DB[$kind]:-} ]] && p1=$(pg_cpu "${DB[$kind]}") && pg=$(sub "$p1" "$p0")
  if [[ ${REDIS_BREAKDOWN:-0} == 1 ]]; then
    # Per command: calls and the CPU Redis counts inside it (INFO commandstats `usec`; a
    # script's own calls counted again inside EVALSHA's), per unit sold; the rest of
    # used_cpu is the event loop (reading, parsing, writing replies) and background work.
    "${RCLI[@]}" INFO commandstats | tr -d '\r' >"$TMP/cmd1"
    awk -v n="$units" -v cpu="$(sub "$c1" "$c0")" -v what="$kind c$conns round $round" \
      'BEGIN { printf "  redis breakdown, %s (%d units; used_cpu %.2f us/unit):\n", what, n, cpu * 1e6 / n }' >&2
    awk -F'[:=,]' -v n="$units" '
      /^cmdstat_/ { calls[$1] += (FILENAME ~ /cmd1$/ ? $3 : -$3); us[$1] += (FILENAME ~ /cmd1$/ ? $5 : -$5) }
      END {
        for (c in calls) if (calls[c] > 0) printf "    %-28s %8.4f calls/unit %7.3f us/unit\n", substr(c, 9), calls[c] / n, us[c] / n
      }' "$TMP/cmd0" "$TMP/cmd1" | sort -k4 -rn >&2
  fi
  record won "$kind" "$conns" "$round" "$units" "$(sub "$c1" "$c0")" "$(sub "$g1" "$g0")" \
    $((k1 - k0)) $((e1 - e0)) "$pg"
}

# sold_out_run KIND ROUND: a SKU of one unit; every request after the first is refused.
sold_out_run() {
  local kind=$1 round=$2 sku="ratio-so-$1-$2" url=${URL[$1]} view c0 c1 g0 g1 k0 k1 e0 e1
  local conns=${CONNS_LIST[0]}
  if [[ $kind == reference ]]; then
    "${RCLI[@]}" SET "ratio${ID}r:{$sku}:stock" 1 >/dev/null
  else
    view=$(admin PUT "$url/admin/skus/$sku" '{"total":1,"per_user_limit":1}')
    [[ $(jq -r .remaining <<<"$view") == 1 ]] || die "declaring $sku: $view"
  fi
  c0=$(redis_cpu) g0=$(proc_cpu "${PID[$kind]}") k0=$(redis_calls all) e0=$(redis_calls evalsha)
  wrk_run "so-$kind-$round" "$url/v1/skus/$sku/claims" "$conns"
  c1=$(redis_cpu) g1=$(proc_cpu "${PID[$kind]}") k1=$(redis_calls all) e1=$(redis_calls evalsha)
  record sold_out "$kind" "$conns" "$round" 1 "$(sub "$c1" "$c0")" "$(sub "$g1" "$g0")" \
    $((k1 - k0)) $((e1 - e0))
}

kinds=(dropgate reference)
[[ -n ${BASE_BIN:-} ]] && kinds+=(base)
for round in $(seq "$ROUNDS"); do
  for conns in "${CONNS_LIST[@]}"; do
    for kind in "${kinds[@]}"; do won_run "$kind" "$conns" "$round"; done
  done
  if [[ $SOLD_OUT == 1 ]]; then
    for kind in dropgate reference nofast; do sold_out_run "$kind" "$round"; done
  fi
done

say "done; summary:"
awk -F'\t' -v idle="$IDLE_CPU_PER_S" -v idle_calls="$IDLE_CALLS_PER_S" -v idle_evals="$IDLE_EVALS_PER_S" -v threads="$THREADS" -v dur="$DURATION_S" -v buyers="$BUYERS" \
  -f "$HERE/ratio-summary.awk" "$RESULTS"
