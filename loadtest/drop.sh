#!/usr/bin/env bash
# drop.sh: a million-attempt drop. ATTEMPTS (1,000,000) claims from BUYERS (200,000) distinct
# buyers, cycling, on UNITS (10,000) units of one SKU (per-user limit 1), through
# `wrk -t$THREADS -c$CONNS -s wrk/post.lua` with WRK_MAX_REQUESTS (wrk, not goose: goose's own
# CPU caps it near 20k requests/s on this machine).
#
# Per drop it prints: attempts/s overall and after sell-out (attempts the gateway answered
# after Redis's stock first read 0, from dropgate_claims_total, over the time left), p50 / p99 /
# p99.9, Redis CPU for the whole drop (INFO cpu, start to the writer drained), the gateway's
# CPU, Redis commands per attempt after sell-out, and the time from the last response (wrk's
# exit) to the last winner in PostgreSQL (the newest `issuances.updated_at`; negative when every
# winner was there before the last response).
#
# MODES ("fast nofast"): each drop runs on a fresh gateway and SKU; "nofast" is the same build
# with DROPGATE_SOLD_OUT_TRUST_MS=0 (every refusal a claim.lua call), run alternately ROUNDS
# (1) times, so the fast path's effect is a side-by-side ratio.
#
# Environment: ATTEMPTS, BUYERS, UNITS, CONNS (256), THREADS (2), ROUNDS (1), MODES, DRAIN_S
# (120), RATIO_REDIS (private), SKIP_BUILD=1, DROPGATE_BIN, KEEP_TMP=1. Loopback only.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
# shellcheck source=lib.sh
source "$HERE/lib.sh"

ATTEMPTS=${ATTEMPTS:-1000000}
BUYERS=${BUYERS:-200000}
UNITS=${UNITS:-10000}
CONNS=${CONNS:-256}
THREADS=${THREADS:-2}
ROUNDS=${ROUNDS:-1}
read -r -a MODES <<<"${MODES:-fast nofast}"
DRAIN_S=${DRAIN_S:-120}
# wrk's own bound: far above what a million attempts take here.
DURATION_S=${DURATION_S:-600}
LIFE_S=$((ROUNDS * ${#MODES[@]} * (DURATION_S + DRAIN_S + 60) + 300))

trap cleanup EXIT
trap 'exit 130' INT TERM
need_tools wrk jq curl redis-cli psql timeout
[[ ${RATIO_REDIS:-private} == private ]] && need_tools redis-server

if [[ ${SKIP_BUILD:-0} != 1 ]]; then
  say "building the release gateway"
  (cd "$ROOT" && cargo build --release -q)
fi
cp "${DROPGATE_BIN:-$(target_dir)/release/dropgate}" "$TMP/dropgate"
DROPGATE_BIN=$TMP/dropgate

ID=$(date +%s)$$
SECRET=$(rand_hex 24)
ADMIN=$(rand_hex 24)
start_private_redis_or_shared "drop${ID}"
say "minting $BUYERS tokens"
TOKENS=$TMP/tokens.tsv
DROPGATE_ADMISSION_SECRET=$SECRET "$DROPGATE_BIN" token --user buyer --count "$BUYERS" --ttl 86400 >"$TOKENS"
say "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"

now() { date +%s.%N; }
claims_answered() {
  curl -sS -m 5 "$1/metrics" | awk '/^dropgate_claims_total\{/ { s += $2 } END { printf "%d", s }'
}

# drop MODE ROUND: one drop on a fresh gateway; prints its figures.
drop() {
  local mode=$1 round=$2 db="dg_drop_${ID}_$1_$2" prefix="drop${ID}$1$2" sku=drop-$2
  local env=() url pid out=$TMP/drop-$1-$2 c0 c1 g0 g1 k0 k1 t0 t_end wrk_pid deadline t_sold n_sold n_end t_pg t_last_win view line kv
  [[ $mode == nofast ]] && env=(DROPGATE_SOLD_OUT_TRUST_MS=0)
  start_gateway "gw-$mode-$round" "$db" "$prefix" "${env[@]}"
  url=$GW_URL pid=$GW_PID
  view=$(admin PUT "$url/admin/skus/$sku" "{\"total\":$UNITS,\"per_user_limit\":1}")
  [[ $(jq -r .remaining <<<"$view") == "$UNITS" ]] || die "declaring $sku: $view"
  local state="$prefix:{$sku}:state"
  # The moment Redis's stock first reads 0 (polled every 50 ms, to disturb little), with the
  # answers and Redis commands counted by then.
  (
    while [[ $("${RCLI[@]}" HGET "$state" stock) != 0 ]]; do sleep 0.05; done
    echo "$(now) $(claims_answered "$url") $(redis_calls all)" >"$out.sold"
  ) &
  local sold_watch=$!
  # The idle command rate (the gateway's background work, this script's watcher), subtracted
  # from the commands counted after sell-out.
  local i0 i1
  i0=$(redis_calls all)
  sleep 3
  i1=$(redis_calls all)
  c0=$(redis_cpu) g0=$(proc_cpu "$pid") t0=$(now)
  WRK_TOKENS=$TOKENS WRK_THREADS=$THREADS WRK_MAX_REQUESTS=$ATTEMPTS \
    wrk -t"$THREADS" -c"$CONNS" -d"${DURATION_S}s" --latency -s "$HERE/wrk/post.lua" \
    "$url/v1/skus/$sku/claims" >"$out.wrk" 2>&1 &
  local wrk_pid=$! deadline=$((SECONDS + DURATION_S + 30))
  # wrk waits out -d even when every thread stopped: interrupt it (it then reports) once the
  # gateway answered every attempt.
  while kill -0 "$wrk_pid" 2>/dev/null; do
    (($(claims_answered "$url") >= ATTEMPTS)) && { sleep 0.5; kill -INT "$wrk_pid" 2>/dev/null || true; break; }
    ((SECONDS < deadline)) || { kill -INT "$wrk_pid" 2>/dev/null || true; break; }
    sleep 0.2
  done
  wait "$wrk_pid" || say "wrk exited with $?"
  n_end=$(claims_answered "$url")
  k1=$(redis_calls all)
  wait "$sold_watch" || true
  wait_drained "$url" "$sku" "$DRAIN_S" >/dev/null || say "WARNING: the writer did not drain $sku"
  c1=$(redis_cpu) g1=$(proc_cpu "$pid")
  read -r t_sold n_sold k0 <"$out.sold" || die "the SKU never sold out"
  # The last winner's insert (its transaction's start: the commit follows within the batch,
  # milliseconds), and the last winner's decision (the time its claim call was sent).
  read -r t_pg t_last_win < <("${PG[@]}" -F' ' -d "$db" -c \
    "SELECT extract(epoch FROM max(updated_at)), extract(epoch FROM max(created_at)) FROM issuances WHERE sku = '$sku'")
  line=$(sed -n 's/^WRK_RESULT //p' "$out.wrk")
  [[ -n $line ]] || { cat "$out.wrk" >&2; die "wrk printed no result"; }
  for kv in $line; do printf -v "R_${kv%%=*}" '%s' "${kv#*=}"; done
  # The last response, as the wrk threads saw it (wall clock, like `now` and PostgreSQL).
  # shellcheck disable=SC2154
  t_end=$(awk -v l="$R_last_us" -v f="$R_first_us" 'BEGIN { printf "%.6f", l / 1e6 }')
  # shellcheck disable=SC2154
  R_duration_us=$((R_last_us - R_first_us))
  # shellcheck disable=SC2154 # R_* set above
  awk -v mode="$mode" -v round="$round" -v req="$R_requests" -v non2xx="$R_non2xx" \
    -v dur="$R_duration_us" -v p50="$R_p50_us" -v p99="$R_p99_us" -v p999="$R_p999_us" \
    -v t0="$t0" -v t_sold="$t_sold" -v t_end="$t_end" -v n_sold="$n_sold" -v n_end="$n_end" \
    -v t_pg="$t_pg" -v t_last_win="$t_last_win" -v k0="$k0" -v k1="$k1" -v idle_calls="$(awk -v a="$i0" -v b="$i1" 'BEGIN { print (b - a) / 3 }')" -v rcpu="$(sub "$c1" "$c0")" \
    -v gcpu="$(sub "$g1" "$g0")" -v units="$UNITS" 'BEGIN {
      printf "%-6s round %s: %d attempts in %.2f s = %.0f attempts/s; 201s %d (units %d)\n", mode, round, req, dur / 1e6, req / (dur / 1e6), req - non2xx, units
      printf "       last unit won %.2f s after the start (seen sold out at %.2f s); after sell-out %.0f attempts/s (%d answers in %.2f s), %.4f Redis commands per attempt (idle %.0f/s subtracted)\n", t_last_win - t0, t_sold - t0, (n_end - n_sold) / (t_end - t_sold), n_end - n_sold, t_end - t_sold, (k1 - k0 - idle_calls * (t_end - t_sold)) / (n_end - n_sold), idle_calls
      printf "       latency p50 %.2f ms  p99 %.2f ms  p99.9 %.2f ms\n", p50 / 1000, p99 / 1000, p999 / 1000
      printf "       Redis CPU for the drop %.3f s (%.2f us per attempt); gateway CPU %.3f s (%.2f us per attempt)\n", rcpu, rcpu / req * 1e6, gcpu, gcpu / req * 1e6
      printf "       last winner in PostgreSQL %+.3f s after the last response (%.3f s after the last unit was won)\n", t_pg - t_end, t_pg - t_last_win
    }'
  stop "$GW_WRAPPER"
}

for round in $(seq "$ROUNDS"); do
  for mode in "${MODES[@]}"; do drop "$mode" "$round"; done
done
