#!/usr/bin/env bash
# run-scenarios.sh: runs goose scenarios, one after the other, against a fresh release gateway
# (fresh database, unique Redis key prefix, free loopback port), then stops it.
#
#   loadtest/run-scenarios.sh [SCENARIO...]     (default: hot_sku_drop many_skus retry_storm;
#                                                also: checkout)
#
# Environment: USERS (200), RUN_TIME (15s), REPORT_DIR (HTML reports; default: the temp dir,
# kept), SKIP_BUILD=1, DROPGATE_BIN, LOADTEST_BIN, KEEP_TMP=1. Any other goose flag can be
# passed through GOOSE_ARGS. Exits non-zero when a scenario's invariants fail.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
# shellcheck source=lib.sh
source "$HERE/lib.sh"

USERS=${USERS:-200}
RUN_TIME=${RUN_TIME:-15s}
SCENARIOS=("$@")
((${#SCENARIOS[@]})) || SCENARIOS=(hot_sku_drop many_skus retry_storm)
# A scenario takes its run time, the drain wait and goose's shutdown; the gateway lives that
# long for each, and no longer.
LIFE_S=$((${#SCENARIOS[@]} * 240 + 120))

trap cleanup EXIT
trap 'exit 130' INT TERM
need_tools jq curl psql timeout

if [[ ${SKIP_BUILD:-0} != 1 ]]; then
  say "building release binaries"
  (cd "$ROOT" && cargo build --release -q && cargo build --release -q -p dropgate-loadtest)
fi
TARGET=$(target_dir)
cp "${DROPGATE_BIN:-$TARGET/release/dropgate}" "$TMP/dropgate"
cp "${LOADTEST_BIN:-$TARGET/release/dropgate-loadtest}" "$TMP/dropgate-loadtest"
DROPGATE_BIN=$TMP/dropgate
REPORT_DIR=${REPORT_DIR:-$TMP}
mkdir -p "$REPORT_DIR"

ID=$(date +%s)$$
SECRET=$(rand_hex 24)
ADMIN=$(rand_hex 24)
PREFIXES+=("lt$ID")
start_gateway gateway "dg_load_$ID" "lt$ID"
say "gateway $GW_URL (log $TMP/gateway.log); machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"

failed=()
for s in "${SCENARIOS[@]}"; do
  say "scenario $s: $USERS users for $RUN_TIME"
  rc=0
  # shellcheck disable=SC2086
  DROPGATE_URL=$GW_URL DROPGATE_ADMISSION_SECRET=$SECRET DROPGATE_ADMIN_TOKEN=$ADMIN \
    DROPGATE_LOAD_RUN_ID="$ID-$s" DATABASE_URL="postgres://postgres@127.0.0.1:5432/dg_load_$ID" \
    timeout -k 5 220 "$TMP/dropgate-loadtest" --scenarios "$s" --users "$USERS" \
    --run-time "$RUN_TIME" --report-file "$REPORT_DIR/$s.html" ${GOOSE_ARGS:-} \
    >"$TMP/$s.out" 2>"$TMP/$s.err" || rc=$?
  # The goose summary (from its per-request table on) and the invariant checks.
  sed -n '/=== PER REQUEST METRICS ===/,/=== OVERVIEW ===/p; /^report:/,$p' "$TMP/$s.out"
  ((rc == 0)) || { failed+=("$s (exit $rc, log $TMP/$s.err)"); KEEP_TMP=1; }
done

say "reports: $REPORT_DIR"
if ((${#failed[@]})); then
  say "FAILED: ${failed[*]}"
  exit 1
fi
say "every scenario passed"
[[ $REPORT_DIR != "$TMP" ]] || KEEP_TMP=1
