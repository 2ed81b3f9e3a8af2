#!/usr/bin/env bash
# ratio.sh: what the gateway costs over the least a claim server can do.
#
# 1. Throughput and p99 of dropgate against `reference` (loadtest/src/bin/reference.rs: one
#    EVALSHA per POST, no token check, no idempotency, no journal), alternating runs of
#    `wrk -t$THREADS -c$CONNS -d${DURATION_S}s --latency -s wrk/post.lua`, and their ratio.
# 2. Redis CPU per decided claim on one hot SKU, with claim coalescing (DROPGATE_COALESCE=1,
#    the default) and without (DROPGATE_COALESCE=0): `INFO cpu` (used_cpu_sys + used_cpu_user)
#    before the run and after the journal writer drained it, divided by the units sold.
#
# Every request is a winner: each run gets a fresh SKU with 10^12 units and a per-user limit
# of 10^6 (the gateway's maximum), and wrk sends one token (one buyer), so the SKU never
# sells out and the buyer never reaches the limit within a run.
#
# Redis: by default a private redis-server on a free loopback port (RATIO_REDIS=private),
# because INFO cpu counts the whole server and the shared Redis on 6379 serves others too;
# RATIO_REDIS=shared uses 127.0.0.1:6379 with a unique key prefix.
#
# Environment: ROUNDS (3), DURATION_S (10), CONNS (64), THREADS (2), DRAIN_S (120),
# RATIO_REDIS (private), SKIP_BUILD=1 (use built binaries), DROPGATE_BIN, REFERENCE_BIN,
# KEEP_TMP=1 (keep logs). Everything is bounded in time; every server started is stopped on
# exit. Loopback only.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
# shellcheck source=lib.sh
source "$HERE/lib.sh"

ROUNDS=${ROUNDS:-3}
DURATION_S=${DURATION_S:-10}
CONNS=${CONNS:-64}
THREADS=${THREADS:-2}
DRAIN_S=${DRAIN_S:-120}
RATIO_REDIS=${RATIO_REDIS:-private}
# Each server outlives the whole run by a margin, and no more.
LIFE_S=$((ROUNDS * 3 * (DURATION_S + DRAIN_S + 40) + 300))
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

ID=$(date +%s)$$
SECRET=$(rand_hex 24)
ADMIN=$(rand_hex 24)

if [[ $RATIO_REDIS == private ]]; then
  RPORT=$(free_port)
  start_bg "$TMP/redis.log" redis-server --bind 127.0.0.1 --port "$RPORT" --save '' \
    --appendonly no --dir "$TMP" --protected-mode yes
  RCLI=(redis-cli -h 127.0.0.1 -p "$RPORT")
  for _ in $(seq 100); do
    [[ $("${RCLI[@]}" PING 2>/dev/null) == PONG ]] && break
    sleep 0.1
  done
  [[ $("${RCLI[@]}" PING 2>/dev/null) == PONG ]] || die "the private redis-server did not start"
else
  RPORT=6379
  RCLI=("${SHARED_REDIS_CLI[@]}")
  PREFIXES+=("ratio${ID}c" "ratio${ID}n" "ratio${ID}r")
fi
export REDIS_URL=redis://127.0.0.1:$RPORT

redis_cpu() {
  "${RCLI[@]}" INFO cpu | tr -d '\r' |
    awk -F: '$1 == "used_cpu_sys" || $1 == "used_cpu_user" { s += $2 } END { printf "%.6f", s }'
}

start_gateway gw-coalesced "dg_ratio_${ID}_c" "ratio${ID}c" DROPGATE_COALESCE=1
URL_C=$GW_URL
start_gateway gw-uncoalesced "dg_ratio_${ID}_n" "ratio${ID}n" DROPGATE_COALESCE=0
URL_N=$GW_URL
start_bg "$TMP/reference.log" env REFERENCE_LISTEN=127.0.0.1:0 REDIS_URL="$REDIS_URL" \
  REFERENCE_KEY_PREFIX="ratio${ID}r" REFERENCE_PER_USER_LIMIT=$PER_USER_LIMIT "$REFERENCE_BIN"
URL_R=http://$(wait_listen "$BG_PID" "$TMP/reference.log")
say "dropgate (coalesced) $URL_C, dropgate (DROPGATE_COALESCE=0) $URL_N, reference $URL_R, redis :$RPORT ($RATIO_REDIS)"
say "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"

# The idle Redis CPU rate (both gateways' background readers, and others on a shared Redis).
c0=$(redis_cpu)
sleep 5
IDLE_CPU_PER_S=$(awk -v a="$c0" -v b="$(redis_cpu)" 'BEGIN { printf "%.6f", (b - a) / 5 }')

RESULTS=$TMP/results.tsv
: >"$RESULTS"

# wrk_run NAME URL TOKEN: one bounded wrk run; sets R_* from its WRK_RESULT line.
wrk_run() {
  local name=$1 url=$2 token=$3 out=$TMP/$1.wrk line kv
  WRK_TOKEN=$token timeout -k 5 $((DURATION_S + 30)) \
    wrk -t"$THREADS" -c"$CONNS" -d"${DURATION_S}s" --latency -s "$HERE/wrk/post.lua" "$url" >"$out" 2>&1 ||
    say "wrk $name exited with $?"
  line=$(sed -n 's/^WRK_RESULT //p' "$out")
  [[ -n $line ]] || { cat "$out" >&2; die "wrk $name printed no result"; }
  for kv in $line; do printf -v "R_${kv%%=*}" '%s' "${kv#*=}"; done
}

# gateway_run MODE ROUND: one run on a fresh SKU of the gateway MODE (c or n).
gateway_run() {
  local mode=$1 round=$2 url sku token c0 c1 view drained=yes units
  [[ $mode == c ]] && url=$URL_C || url=$URL_N
  sku=ratio-$mode-$round
  view=$(admin PUT "$url/admin/skus/$sku" "{\"total\":$UNITS,\"per_user_limit\":$PER_USER_LIMIT}")
  [[ $(jq -r .remaining <<<"$view") == "$UNITS" ]] || die "declaring $sku: $view"
  token=$(DROPGATE_ADMISSION_SECRET=$SECRET "$DROPGATE_BIN" token --user ratio-buyer --sku "$sku" --ttl 3600)
  c0=$(redis_cpu)
  wrk_run "dropgate-$mode-$round" "$url/v1/skus/$sku/claims" "$token"
  local rc=0
  view=$(wait_drained "$url" "$sku" "$DRAIN_S") || rc=$?
  ((rc == 2)) && die "dropgate ($mode) stopped answering during or after the run on $sku; see $TMP/gw-*.log and $TMP/dropgate-$mode-$round.wrk"
  ((rc == 0)) || drained=no
  c1=$(redis_cpu)
  units=$(jq -r "$UNITS - .remaining" <<<"$view")
  record "dropgate-$mode" "$round" "$units" "$(awk -v a="$c0" -v b="$c1" 'BEGIN { printf "%.6f", b - a }')" "$drained"
}

reference_run() {
  local round=$1 sku=ratio-ref-$1 c0 c1 left units
  "${RCLI[@]}" SET "ratio${ID}r:{$sku}:stock" "$UNITS" >/dev/null
  c0=$(redis_cpu)
  wrk_run "reference-$round" "$URL_R/v1/skus/$sku/claims" ""
  c1=$(redis_cpu)
  left=$("${RCLI[@]}" GET "ratio${ID}r:{$sku}:stock")
  units=$((UNITS - left))
  record reference "$round" "$units" "$(awk -v a="$c0" -v b="$c1" 'BEGIN { printf "%.6f", b - a }')" yes
}

# record KIND ROUND UNITS CPU_S DRAINED: one line of results, from R_* and the arguments.
# shellcheck disable=SC2154 # R_* are set by wrk_run through printf -v
record() {
  local won=$((R_requests - R_non2xx)) errors=$((R_connect + R_read + R_write + R_timeout))
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$R_requests" "$won" "$3" \
    "$R_duration_us" "$R_p50_us" "$R_p99_us" "$4" "$errors" "$5" >>"$RESULTS"
  awk -F'\t' -v line="$(tail -1 "$RESULTS")" 'BEGIN {
    split(line, f, "\t")
    printf "%-22s round %s: %9.0f claims/s  p50 %7.2f ms  p99 %7.2f ms  201s %d  units sold %d  non-201 %d  socket errors %d  redis cpu %.3f s%s\n",
      f[1], f[2], f[4] / (f[6] / 1e6), f[7] / 1000, f[8] / 1000, f[4], f[5], f[3] - f[4], f[10], f[9],
      (f[11] == "yes" ? "" : "  (writer NOT drained)")
  }' >&2
}

for round in $(seq "$ROUNDS"); do
  gateway_run c "$round"
  reference_run "$round"
  gateway_run n "$round"
done

say "done; summary:"
awk -F'\t' -v idle="$IDLE_CPU_PER_S" -v conns="$CONNS" -v threads="$THREADS" -v dur="$DURATION_S" '
  {
    k = $1; n[k]++
    rate[k] += $4 / ($6 / 1e6); p99[k] += $8 / 1000; p50[k] += $7 / 1000
    units[k] += $5; cpu[k] += $9; won[k] += $4; reqs[k] += $3; err[k] += $10
    if ($11 != "yes") undrained[k]++
  }
  END {
    printf "\nwrk -t%d -c%d -d%ds, %d round(s), runs alternated; means over the rounds\n", threads, conns, dur, n["reference"]
    split("dropgate-c reference dropgate-n", order, " ")
    label["dropgate-c"] = "dropgate (coalesced)"; label["reference"] = "reference (1 EVALSHA)"
    label["dropgate-n"] = "dropgate (COALESCE=0)"
    for (i = 1; i <= 3; i++) {
      k = order[i]
      printf "  %-24s %9.0f claims/s  p50 %7.2f ms  p99 %7.2f ms  non-201 %d  socket errors %d\n",
        label[k], rate[k] / n[k], p50[k] / n[k], p99[k] / n[k], reqs[k] - won[k], err[k]
    }
    rc = rate["dropgate-c"] / n["dropgate-c"]; rr = rate["reference"] / n["reference"]
    rn = rate["dropgate-n"] / n["dropgate-n"]
    printf "\nratio dropgate/reference at %d connections: %.3f (claims/s %.0f / %.0f); p99 %.2f ms vs %.2f ms\n",
      conns, rc / rr, rc, rr, p99["dropgate-c"] / n["dropgate-c"], p99["reference"] / n["reference"]
    printf "ratio dropgate(COALESCE=0)/reference: %.3f (claims/s %.0f / %.0f); p99 %.2f ms\n",
      rn / rr, rn, rr, p99["dropgate-n"] / n["dropgate-n"]
    uc = cpu["dropgate-c"] / units["dropgate-c"] * 1e6; un = cpu["dropgate-n"] / units["dropgate-n"] * 1e6
    ur = cpu["reference"] / units["reference"] * 1e6
    printf "\nRedis CPU per decided claim (one hot SKU; INFO cpu sys+user, before the run to after the writer drained):\n"
    printf "  dropgate DROPGATE_COALESCE=1: %.2f us/claim (%.3f s over %d claims)\n", uc, cpu["dropgate-c"], units["dropgate-c"]
    printf "  dropgate DROPGATE_COALESCE=0: %.2f us/claim (%.3f s over %d claims)\n", un, cpu["dropgate-n"], units["dropgate-n"]
    printf "  ratio uncoalesced/coalesced:  %.2f\n", un / uc
    printf "  (reference, one EVALSHA:      %.2f us/claim; idle Redis CPU during the measurement: %.4f s/s)\n", ur, idle
    bad = 0
    for (k in undrained) { printf "WARNING: %s: %d run(s) where the writer did not drain within the limit\n", k, undrained[k]; bad = 1 }
    exit bad
  }' "$RESULTS"
