#!/usr/bin/env bash
# flame.sh: a flame graph of the gateway's CPU during ratio.sh's c64 run (issue 39).
#
# One gateway on a private redis-server, one SKU where every request wins, BUYERS buyers
# cycling (as ratio.sh), `wrk -t2 -c$CONNS` for DURATION_S seconds; after WARMUP_S of it,
# `perf record --call-graph dwarf` samples the gateway (its threads only, user and kernel) for
# RECORD_S seconds at FREQ Hz. Then `perf script | inferno-collapse-perf | inferno-flamegraph`
# writes OUT (an SVG), and the folded stacks beside it (OUT.folded), from which the top costs
# are counted: `loadtest/flame-top.sh OUT.folded`.
#
# The binary needs line tables for DWARF unwinding:
#   CARGO_PROFILE_RELEASE_DEBUG=line-tables-only cargo build --release
# Tools: perf (Debian's linux-perf), inferno (`cargo install inferno`), wrk, redis-server, psql.
#
# Environment: DROPGATE_BIN (default <target>/release/dropgate), OUT (docs/flame-c64.svg),
# CONNS (64), THREADS (2), BUYERS (5000), DURATION_S (14), WARMUP_S (3), RECORD_S (8), FREQ (999).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
# shellcheck source=lib.sh
source "$HERE/lib.sh"

CONNS=${CONNS:-64}
THREADS=${THREADS:-2}
BUYERS=${BUYERS:-5000}
DURATION_S=${DURATION_S:-14}
WARMUP_S=${WARMUP_S:-3}
RECORD_S=${RECORD_S:-8}
FREQ=${FREQ:-999}
OUT=${OUT:-$ROOT/docs/flame-c64.svg}
LIFE_S=$((DURATION_S + 300))
RATIO_REDIS=private
UNITS=1000000000000

trap cleanup EXIT
trap 'exit 130' INT TERM
need_tools wrk jq curl redis-cli redis-server psql timeout perf inferno-collapse-perf inferno-flamegraph

TARGET=$(target_dir)
cp "${DROPGATE_BIN:-$TARGET/release/dropgate}" "$TMP/dropgate"
DROPGATE_BIN=$TMP/dropgate
ID=$(date +%s)$$
SECRET=$(rand_hex 24)
ADMIN=$(rand_hex 24)
start_private_redis_or_shared "flame${ID}"
start_gateway gw "dg_flame_${ID}" "flame${ID}"
say "gateway $GW_URL (pid $GW_PID), redis :$RPORT, load average $(cut -d' ' -f1-3 /proc/loadavg)"

TOKENS=$TMP/tokens.tsv
DROPGATE_ADMISSION_SECRET=$SECRET "$DROPGATE_BIN" token --user buyer --count "$BUYERS" --ttl 86400 >"$TOKENS"
view=$(admin PUT "$GW_URL/admin/skus/flame" "{\"total\":$UNITS,\"per_user_limit\":1000000}")
[[ $(jq -r .remaining <<<"$view") == "$UNITS" ]] || die "declaring the SKU: $view"

# In the background: wrk_run's results (R_*) are read back from its output below.
wrk_run flame "$GW_URL/v1/skus/flame/claims" "$CONNS" &
WRK=$!
sleep "$WARMUP_S"
perf record -F "$FREQ" -g --call-graph dwarf,16384 -p "$GW_PID" -o "$TMP/perf.data" \
  -- sleep "$RECORD_S" 2>"$TMP/perf.log" || die "perf record failed: $(cat "$TMP/perf.log")"
wait "$WRK"
say "wrk: $(sed -n 's/^WRK_RESULT //p' "$TMP/flame.wrk")"
perf script -i "$TMP/perf.data" 2>/dev/null | inferno-collapse-perf --all >"$OUT.folded"
inferno-flamegraph --title "dropgate gateway, c$CONNS, every request a winner" \
  --width 1600 <"$OUT.folded" >"$OUT"
say "wrote $OUT and $OUT.folded ($(wc -l <"$OUT.folded") stacks)"
