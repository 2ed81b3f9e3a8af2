#!/usr/bin/env bash
# queue.sh: the waiting room under load (issue 22's figures), against a fresh release gateway.
#
#   loadtest/queue.sh
#
# 1. VISITORS (20,000) distinct visitors join one queued SKU from this one machine, at CONNS
#    (64) connections for DURATION_S (10 s) with `wrk -s wrk/queue.lua` (WRK_MODE=join; a
#    visitor met again rejoins: 200, the same ticket): join p50/p99, and how many 429s (the
#    join rate is per visitor, never per address: there must be none).
# 2. Position reads of those tickets (`GET /v1/queue/{ticket}`, the admin token) at CONNS
#    connections for DURATION_S: p50/p99.
# The SKU admits 1 visitor a second (the line stays long). Redis is the shared one, under a key
# prefix of its own. Environment: VISITORS, CONNS, DURATION_S, THREADS (2), SKIP_BUILD=1,
# DROPGATE_BIN, KEEP_TMP=1.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
# shellcheck source=lib.sh
source "$HERE/lib.sh"

VISITORS=${VISITORS:-20000}
CONNS=${CONNS:-64}
DURATION_S=${DURATION_S:-10}
THREADS=${THREADS:-2}
LIFE_S=$((DURATION_S * 2 + 300))

trap cleanup EXIT
trap 'exit 130' INT TERM
need_tools wrk jq curl psql timeout

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
PREFIXES+=("q$ID")
start_gateway gateway "dg_queue_$ID" "q$ID"
SKU="queue-$ID"
admin PUT "$GW_URL/admin/skus/$SKU" '{"total":10,"per_user_limit":1,"queue":{"admit_per_second":1}}' >/dev/null
say "gateway $GW_URL, SKU $SKU; machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"

DROPGATE_ADMISSION_SECRET=$SECRET "$DROPGATE_BIN" token --visitor --user visitor --count "$VISITORS" \
  --ttl 86400 >"$TMP/visitors.tsv"

# run MODE: one wrk run; prints its WRK_QUEUE line.
run() {
  WRK_MODE=$1 WRK_SKU=$SKU WRK_TOKENS=$TMP/visitors.tsv WRK_TICKETS_OUT=$TMP/tickets \
    WRK_TICKETS=$TMP/tickets.txt WRK_ADMIN=$ADMIN timeout -k 5 $((DURATION_S + 30)) \
    wrk -t"$THREADS" -c"$CONNS" -d"${DURATION_S}s" --latency -s "$HERE/wrk/queue.lua" "$GW_URL" \
    >"$TMP/$1.wrk" 2>&1 || say "wrk $1 exited with $?"
  grep '^WRK_QUEUE' "$TMP/$1.wrk" || { cat "$TMP/$1.wrk" >&2; die "wrk $1 printed no result"; }
}

say "join: $VISITORS visitors, c$CONNS, ${DURATION_S}s"
join=$(run join)
cat "$TMP"/tickets.* >"$TMP/tickets.txt"
say "read: $(wc -l <"$TMP/tickets.txt") tickets, c$CONNS, ${DURATION_S}s"
read_=$(run read)
view=$(admin GET "$GW_URL/admin/skus/$SKU")
report() {
  awk -v what="$1" '{ for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
    printf "%-5s %8.0f req/s  p50 %6.2f ms  p99 %6.2f ms  p99.9 %6.2f ms  201 %d  200 %d  429 %d  other %d  socket errors %d\n",
      what, v["requests"] / (v["duration_us"] / 1e6), v["p50_us"] / 1000, v["p99_us"] / 1000,
      v["p999_us"] / 1000, v["s201"], v["s200"], v["s429"], v["other"], v["errors"] }' <<<"$2"
}
report join "$join"
report read "$read_"
echo "line: $(jq -c '.queue | {waiting, admitted, admit_per_second}' <<<"$view")"
if grep -q ' s429=0 ' <<<"$join" && grep -q ' other=0 ' <<<"$join" && grep -q ' other=0 ' <<<"$read_"; then
  say "no 429 and no other refusal"
else
  say "FAILED: refusals above"
  exit 1
fi
