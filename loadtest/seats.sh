#!/usr/bin/env bash
# seats.sh: best-available seated claims beside plain quantity claims (issue 38's 0.8× goal),
# one release gateway, measured side by side in one run.
#
#   loadtest/seats.sh
#
# Two kinds of SKU on the same gateway and Redis: `plain` (a count, PLAIN_UNITS) and `hall`
# (SEATS seats: 10 sections of 50 rows of SEATS/500), a fresh one of each per round (so no
# round finds its SKU sold out or its buyers at their limit). Each round runs wrk
# (`wrk/post.lua`, every request `{"quantity":1}`: best available on the hall, one unit on the
# plain SKU) for DURATION_S on one, then the other, in alternating order, at CONNS connections;
# every request is a winner (BUYERS distinct buyers at 4 each; PLAIN_UNITS and SEATS above
# what a round sells: a plain SKU sold out mid-round would cap its rate and flatter the ratio). Prints claims/s, p99 and Redis
# CPU per claim of each, and the ratio hall / plain per round and overall.
# Environment: ROUNDS (3), DURATION_S (5), CONNS (64), THREADS (2), BUYERS (100000),
# SEATS (200000, the most a plan may have), PLAIN_UNITS (1000000), SKIP_BUILD=1, DROPGATE_BIN,
# KEEP_TMP=1.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
# shellcheck source=lib.sh
source "$HERE/lib.sh"

ROUNDS=${ROUNDS:-3}
DURATION_S=${DURATION_S:-5}
CONNS=${CONNS:-64}
THREADS=${THREADS:-2}
BUYERS=${BUYERS:-100000}
SEATS=${SEATS:-200000}
PLAIN_UNITS=${PLAIN_UNITS:-1000000}
LIFE_S=$((ROUNDS * DURATION_S * 4 + 300))

trap cleanup EXIT
trap 'exit 130' INT TERM
need_tools wrk jq curl psql timeout redis-cli

if [[ ${SKIP_BUILD:-0} != 1 ]]; then
  say "building the release gateway"
  (cd "$ROOT" && cargo build --release -q --bin dropgate)
fi
TARGET=$(target_dir)
cp "${DROPGATE_BIN:-$TARGET/release/dropgate}" "$TMP/dropgate"
DROPGATE_BIN=$TMP/dropgate

ID=$(date +%s)$$
SECRET=$(rand_hex 24)
ADMIN=$(rand_hex 24)
start_private_redis_or_shared "s$ID"
PREFIXES+=("s$ID")
start_gateway gateway "dg_seats_$ID" "s$ID"
per_row=$((SEATS / 500))
sections=$(jq -nc --argjson c "$per_row" '[range(0;10) | {name: ("S" + tostring), rows: 50, count: $c}]')
declare_round() {
  local round=$1
  admin PUT "$GW_URL/admin/skus/plain-$ID-$round" "{\"total\":$PLAIN_UNITS,\"per_user_limit\":4}" >/dev/null
  admin PUT "$GW_URL/admin/skus/hall-$ID-$round" \
    "{\"seats\":{\"sections\":$sections},\"per_user_limit\":4}" |
    jq -e '.total' >/dev/null || die "the hall of round $round was not declared"
}
for round in $(seq 1 "$ROUNDS"); do declare_round "$round"; done
say "gateway $GW_URL; per round a plain SKU ($PLAIN_UNITS units) and a hall ($SEATS seats, rows of $per_row)"
say "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"

DROPGATE_ADMISSION_SECRET=$SECRET "$DROPGATE_BIN" token --user buyer --count "$BUYERS" \
  --ttl 86400 >"$TMP/buyers.tsv"
TOKENS=$TMP/buyers.tsv

RESULTS=$TMP/results.tsv
: >"$RESULTS"
run_one() {
  local kind=$1 sku=$2 round=$3 r0 g0
  r0=$(redis_cpu)
  g0=$(proc_cpu "$GW_PID")
  wrk_run "$kind-$round" "$GW_URL/v1/skus/$sku/claims" "$CONNS"
  record "$kind" seats "$CONNS" "$round" 1 "$(sub "$(redis_cpu)" "$r0")" \
    "$(sub "$(proc_cpu "$GW_PID")" "$g0")" 0 0
}
for round in $(seq 1 "$ROUNDS"); do
  if ((round % 2)); then
    run_one plain "plain-$ID-$round" "$round"
    run_one hall "hall-$ID-$round" "$round"
  else
    run_one hall "hall-$ID-$round" "$round"
    run_one plain "plain-$ID-$round" "$round"
  fi
done

awk -F'\t' '
  { rate = ($10 - $11) / ($12 / 1e6); won[$1] += $10 - $11; us[$1] += $12; r[$1, $4] = rate
    rcpu[$1] += $6; p99[$1] = (p99[$1] > $14 ? p99[$1] : $14); rounds = ($4 > rounds ? $4 : rounds) }
  END {
    for (i = 1; i <= rounds; i++)
      printf "round %d: hall %.0f claims/s, plain %.0f claims/s, ratio %.3f\n", i, r["hall", i], r["plain", i], r["hall", i] / r["plain", i]
    h = won["hall"] / (us["hall"] / 1e6); p = won["plain"] / (us["plain"] / 1e6)
    printf "overall: hall %.0f claims/s (p99 max %.2f ms, Redis %.2f us/claim), plain %.0f claims/s (p99 max %.2f ms, Redis %.2f us/claim): ratio %.3f\n",
      h, p99["hall"] / 1000, rcpu["hall"] * 1e6 / won["hall"], p, p99["plain"] / 1000, rcpu["plain"] * 1e6 / won["plain"], h / p
  }' "$RESULTS"
for round in $(seq 1 "$ROUNDS"); do
  v=$(admin GET "$GW_URL/admin/skus/hall-$ID-$round")
  say "hall of round $round after the run: $(jq -c '{remaining, seats, consistent}' <<<"$v")"
done
