#!/usr/bin/env bash
# footprint.sh: what a claimant costs Redis, and what a held connection costs the gateway,
# for this build and BASE_BIN (an earlier build) side by side, rounds alternated.
#
# 1. Redis bytes per claimant (writer drained): per round and kind, a fresh SKU of BUYERS units
#    (per-user limit 1); BUYERS distinct buyers claim one unit each (`wrk -s wrk/post.lua`,
#    WRK_MAX_REQUESTS=BUYERS, tokens pre-minted), with an Idempotency-Key (WRK_IDEM) and
#    without; after the writer drained the SKU, Redis's `used_memory` growth divided by the
#    units sold. One private redis-server serves both gateways; the other gateway is idle.
# 2. Gateway RSS per held connection: CONNS connections opened to the gateway and held
#    (loadtest/conns.py): `idle` (sent nothing), `partial` (the start of a request) and `kept`
#    (one request answered, then silence: a kept-alive connection whose buyer went away); the
#    gateway's VmRSS growth divided by CONNS, read within the 5 s header timeout.
#
# Environment: ROUNDS (2), BUYERS (20000), CONNS (9000), BASE_BIN, SKIP_BUILD=1, DROPGATE_BIN,
# THREADS (2), KEEP_TMP=1. Loopback only; every server started is stopped on exit.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
# shellcheck source=lib.sh
source "$HERE/lib.sh"

ROUNDS=${ROUNDS:-2}
BUYERS=${BUYERS:-20000}
CONNS=${CONNS:-9000}
THREADS=${THREADS:-2}
DURATION_S=10
LIFE_S=$((ROUNDS * 900 + 300))

trap cleanup EXIT
trap 'exit 130' INT TERM
need_tools wrk jq curl redis-cli redis-server psql timeout python3
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
((CONNS + 2000 <= $(ulimit -n))) || die "CONNS=$CONNS needs more file descriptors than $(ulimit -n)"

if [[ ${SKIP_BUILD:-0} != 1 ]]; then
  say "building the release binary"
  (cd "$ROOT" && cargo build --release -q)
fi
TARGET=$(target_dir)
cp "${DROPGATE_BIN:-$TARGET/release/dropgate}" "$TMP/dropgate"
DROPGATE_BIN=$TMP/dropgate
declare -A URL PID
ID=$(date +%s)$$
SECRET=$(rand_hex 24)
ADMIN=$(rand_hex 24)
RATIO_REDIS=private start_private_redis_or_shared "fp${ID}"
# Room for the held connections beside everything else.
start_gateway gw "dg_fp_${ID}_g" "fp${ID}g" DROPGATE_MAX_CONNECTIONS=$((CONNS + 1000))
URL[dropgate]=$GW_URL PID[dropgate]=$GW_PID
kinds=(dropgate)
if [[ -n ${BASE_BIN:-} ]]; then
  cp "$BASE_BIN" "$TMP/dropgate-base"
  BASE_BIN=$TMP/dropgate-base
  DROPGATE_BIN=$BASE_BIN start_gateway gw-base "dg_fp_${ID}_b" "fp${ID}b" \
    DROPGATE_MAX_CONNECTIONS=$((CONNS + 1000))
  URL[base]=$GW_URL PID[base]=$GW_PID
  kinds+=(base)
fi
say "dropgate ${URL[dropgate]}${BASE_BIN:+, base ${URL[base]}}, redis :$RPORT, $BUYERS buyers, $CONNS connections"
say "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
TOKENS=$TMP/tokens.tsv
DROPGATE_ADMISSION_SECRET=$SECRET "$DROPGATE_BIN" token --user fp --count "$BUYERS" --ttl 86400 >"$TOKENS"
used_memory() { "${RCLI[@]}" INFO memory | tr -d '\r' | awk -F: '$1 == "used_memory" { print $2 }'; }

# claimants KIND KEYED ROUND: BUYERS buyers claim one unit each of a fresh SKU; prints bytes
# of Redis per unit sold once the writer drained it.
claimants() {
  local kind=$1 keyed=$2 round=$3 sku="fp-$1-$2-$3" url=${URL[$1]} view m0 m1 units
  view=$(admin PUT "$url/admin/skus/$sku" "{\"total\":$BUYERS,\"per_user_limit\":1}")
  [[ $(jq -r .remaining <<<"$view") == "$BUYERS" ]] || die "declaring $sku: $view"
  wait_drained "$url" "$sku" 30 >/dev/null || die "$sku did not settle after its declaration"
  m0=$(used_memory)
  WRK_IDEM=$([[ $keyed == key ]] && echo "k$round" || true) WRK_MAX_REQUESTS=$BUYERS \
    wrk_run "$sku" "$url/v1/skus/$sku/claims" 64
  view=$(wait_drained "$url" "$sku" 120) || die "$kind: the writer did not drain $sku"
  units=$(jq -r "$BUYERS - .remaining" <<<"$view")
  ((units > BUYERS * 9 / 10)) || die "$sku: only $units of $BUYERS units sold"
  m1=$(used_memory)
  say "$kind $keyed round $round: $units units sold, used_memory +$((m1 - m0)) B: $(((m1 - m0) / units)) B per claimant"
  printf 'bytes\t%s\t%s\t%s\t%s\n' "$kind" "$keyed" "$round" "$(((m1 - m0) / units))" >>"$TMP/results.tsv"
}

# connections KIND MODE ROUND: CONNS held connections to a gateway of their own (an allocator
# keeps what earlier connections freed, which would hide the growth); its RSS growth per one.
connections() {
  local kind=$1 mode=$2 round=$3 bin=$DROPGATE_BIN addr line
  [[ $kind == base ]] && bin=$BASE_BIN
  DROPGATE_BIN=$bin start_gateway "conns-$kind-$mode-$round" "dg_fp_${ID}_$kind$mode$round" \
    "fp${ID}c" DROPGATE_MAX_CONNECTIONS=$((CONNS + 1000))
  addr=${GW_URL#http://}
  line=$(python3 "$HERE/conns.py" "${addr%:*}" "${addr##*:}" "$CONNS" "$mode" "$GW_PID") ||
    die "conns.py failed for $kind $mode"
  stop "$GW_WRAPPER"
  say "$kind $mode round $round: $line"
  printf 'rss\t%s\t%s\t%s\t%s\n' "$kind" "$mode" "$round" "$(sed 's/.*per_conn_b=//' <<<"$line")" >>"$TMP/results.tsv"
}

export WRK_THREADS=$THREADS
: >"$TMP/results.tsv"
for round in $(seq "$ROUNDS"); do
  for kind in "${kinds[@]}"; do
    for keyed in key nokey; do claimants "$kind" "$keyed" "$round"; done
    for mode in idle partial kept; do connections "$kind" "$mode" "$round"; done
  done
done

say "done; per round:"
awk -F'\t' '
  { k = $1 " " $2 " " $3; v[k] = v[k] (v[k] == "" ? "" : ", ") $5; s[k] += $5; n[k]++ }
  END { for (k in v) printf "%-28s %-24s mean %.0f\n", k, v[k], s[k] / n[k] }' "$TMP/results.tsv" | sort
