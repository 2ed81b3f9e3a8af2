#!/usr/bin/env bash
# Schemathesis (from PyPI) against a live gateway: the debug binary, a PostgreSQL database and a
# Redis key prefix of its own, secrets set, and a valid token for each security scheme.
#
#   1. conformance: stateless (examples, coverage, fuzzing) and stateful (the document's links)
#      phases; every answer must match the description (status, headers, content type, body
#      schema), and no answer may be a 5xx (both backends are up: a 503 would be a bug too).
#   2. refusals change nothing: once the writer has drained, Redis (every key of the prefix)
#      and PostgreSQL (every table) are fingerprinted; then only requests that must be refused
#      (negative data on every operation, claims on the SKU sold out to the buyer; positive claims on that SKU;
#      every read) are sent; the fingerprints must not move.
#
# Usage: tests/schemathesis.sh [path/to/dropgate]   (default: $CARGO_TARGET_DIR/debug/dropgate)
# Needs: python3 (venv), redis-cli, psql, curl, jq; PostgreSQL on 127.0.0.1:5432, Redis on :6379.
# Time: about three minutes (bounded by --max-time per run: 60 + 3 x 25 + 2 x 15 s).
set -euo pipefail
cd "$(dirname "$0")/.."

BIN="$(realpath "${1:-${CARGO_TARGET_DIR:-target}/debug/dropgate}")"
test -x "$BIN" || { echo "schemathesis: no gateway binary at $BIN (cargo build first)" >&2; exit 2; }
VENV="${DROPGATE_VENV:-/var/tmp/dropgate-venv}"
ST_VERSION="4.32.5"
CONFIG="tests/schemathesis/schemathesis.toml"
WORK="$(mktemp -d)"
ID="$(head -c 6 /dev/urandom | od -An -tx1 | tr -d ' \n')"
# dg_test_ and t<16 hex>: .ci/run's sweep removes what a dead run leaves behind.
DB="dg_test_st_$ID"
PREFIX="t$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')"
REDIS="redis-cli -h 127.0.0.1 -p 6379"
GW_PID=""

cleanup() {
  local rc=$?
  if [ -n "$GW_PID" ]; then kill "$GW_PID" 2>/dev/null || true; wait "$GW_PID" 2>/dev/null || true; fi
  dropdb -h 127.0.0.1 -U postgres --if-exists "$DB" 2>/dev/null || true
  $REDIS --scan --pattern "$PREFIX:*" | xargs -r -n 500 $REDIS del >/dev/null 2>&1 || true
  if [ "$rc" -ne 0 ] && [ -f "$WORK/gateway.log" ]; then
    echo "--- gateway log (last 30 lines)" >&2
    tail -n 30 "$WORK/gateway.log" >&2 || true
  fi
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT

# === schemathesis, pinned, in a venv of its own ===

if ! "$VENV/bin/st" --version 2>/dev/null | grep -qF "$ST_VERSION"; then
  echo "schemathesis: installing schemathesis==$ST_VERSION into $VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "schemathesis==$ST_VERSION"
fi

# === the gateway ===

export DATABASE_URL="postgres://postgres@127.0.0.1:5432/$DB" REDIS_URL="redis://127.0.0.1:6379"
export DROPGATE_KEY_PREFIX="$PREFIX"
export DROPGATE_ADMIN_TOKEN="st-admin-$ID-0123456789"
export DROPGATE_ADMISSION_SECRET="st-secret-$ID-0123456789"
DROPGATE_LISTEN=127.0.0.1:0 RUST_LOG=info "$BIN" serve >"$WORK/gateway.log" 2>&1 &
GW_PID=$!
addr=""
for _ in $(seq 1 300); do
  addr="$(grep -o 'listening on [0-9.:]*' "$WORK/gateway.log" | head -n 1 | cut -d' ' -f3 || true)"
  [ -n "$addr" ] && break
  kill -0 "$GW_PID" 2>/dev/null || { echo "schemathesis: the gateway exited" >&2; exit 1; }
  sleep 0.1
done
[ -n "$addr" ] || { echo "schemathesis: the gateway did not log its address" >&2; exit 1; }
DG="http://$addr"
echo "schemathesis: gateway $DG, database $DB, prefix $PREFIX"

export ST_ADMIN_TOKEN="$DROPGATE_ADMIN_TOKEN"
export ST_BUYER_TOKEN="$("$BIN" token --user st-buyer --ttl 3600)"
admin() { curl -fsS -H "authorization: Bearer $ST_ADMIN_TOKEN" "$@"; }

# A SKU the buyer already holds its one unit of, sold out: every claim on it must be refused.
admin -X PUT "$DG/admin/skus/st-sold" -d '{"total": 1, "per_user_limit": 1}' >/dev/null
curl -fsS -X POST "$DG/v1/skus/st-sold/claims" -H "authorization: Bearer $ST_BUYER_TOKEN" \
  -H "idempotency-key: st-first" -d '{"quantity": 1}' >/dev/null

# Every request and answer of each run, kept as an artifact (HAR), for reading a failure.
REPORTS="${ST_REPORTS:-${CARGO_TARGET_DIR:-target}/schemathesis}"
rm -rf "$REPORTS" && mkdir -p "$REPORTS"
run=0
# The live stream never ends by itself; tests/api/live.rs covers it.
st() {
  run=$((run + 1))
  "$VENV/bin/st" --config-file "${ST_CONFIG:-$CONFIG}" --no-color run "$DG/openapi.json" \
    --exclude-path /admin/live/stream --workers 1 --seed 20261130 \
    --suppress-health-check too_slow,filter_too_much --request-timeout 10 \
    --report har --report-har-path "$REPORTS/run-$run.har" "$@"
}

# === 1. conformance ===

echo "== schemathesis: conformance, stateless and stateful"
st --checks all --exclude-checks positive_data_acceptance,ignored_auth \
  --phases examples,coverage,fuzzing,stateful --max-examples 40 --max-time 60

# === 2. refused requests change nothing ===

drained() { # every SKU's winners written: nothing in flight, nothing pending
  local skus sku v
  skus="$(psql -h 127.0.0.1 -U postgres -d "$DB" -Atc 'SELECT sku FROM skus')"
  for sku in $skus; do
    v="$(admin "$DG/admin/skus/$sku")" || return 1
    [ "$(jq -r '.in_flight == 0 and .pending == 0 and .consistent' <<<"$v")" = true ] || return 1
  done
}
fingerprint() { # every key of the prefix with its contents, every row of every table
  {
    # Contents by type, not DUMP: a stream's DUMP also holds its consumer group's consumers,
    # which a writer's read registers whatever the requests did.
    # The active-SKU set (<prefix>:active) is left out too: it is an index of which SKUs have
    # background work, scored by when a gateway last used each, and its upkeep retires idle
    # SKUs on its own clock (src/activity/); no request's outcome is in it. So are the
    # expiry workers' leases (<prefix>:{sku}:expiry:lease, 1.5 s): which gateway serves a SKU's
    # expiries next, taken and lapsing on their own clock (src/lifecycle/expiry.rs). And in a
    # waiting room's state (<prefix>:{sku}:q) the admission lease's clock fields (lease_until,
    # last_ms, credit): the admission worker renews them every round whether or not anyone
    # waits (lua/admit_queue.lua); its owner and fence stay, and would show a lease changing hands.
    $REDIS --scan --pattern "$PREFIX:*" | grep -vx "$PREFIX:active" | grep -v ':expiry:lease$' |
      sort | while read -r key; do
      t="$($REDIS type "$key")"
      echo "key $key $t"
      case "$t" in
        hash) $REDIS hgetall "$key" | paste - - | sort |
                if [[ $key == *'}:q' ]]; then { grep -Ev '^(lease_until|last_ms|credit)'$'\t' || true; }; else cat; fi ;;
        string) $REDIS get "$key" ;;
        stream) $REDIS xrange "$key" - + ;;
        set) $REDIS smembers "$key" | sort ;;
        zset) $REDIS zrange "$key" 0 -1 withscores ;;
        list) $REDIS lrange "$key" 0 -1 ;;
      esac
    done
    for t in $(psql -h 127.0.0.1 -U postgres -d "$DB" -Atc \
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1"); do
      echo "table $t"
      psql -h 127.0.0.1 -U postgres -d "$DB" -Atc "SELECT r::text FROM $t r ORDER BY 1"
    done
  } >"$WORK/state.$1"
}

for _ in $(seq 1 100); do drained && break; sleep 0.1; done
drained || { echo "schemathesis: the writer did not drain" >&2; exit 1; }
fingerprint before
# Negative mode leaves the security schemes out: each token is given as a header instead, so
# invalid data reaches the validation behind authentication.
# (No examples phase: it sends the documented examples, which are valid, whatever the mode.)
negative=(--mode negative --checks not_a_server_error,negative_data_rejection,status_code_conformance,response_schema_conformance
          --phases coverage,fuzzing --max-examples 25 --max-time 25)
echo "== schemathesis: refusals (negative data on the operators' routes)"
# Restore is left out: negative mode also sends `restore?force=true`, a valid request that
# rebuilds the SKU (200) and so changes the stores the refusals must leave alone. Its refusals
# are tested in tests/api (operators.rs, faults.rs).
st --include-path-regex '^/admin/' --exclude-path-regex '/restore$' \
   -H "Authorization: Bearer $ST_ADMIN_TOKEN" "${negative[@]}"
echo "== schemathesis: refusals (negative data on the buyers' routes)"
# The claim is left out here and run below on the SKU sold out to the buyer: the claim's body
# is optional, so negative mode also sends a claim with no body and no key, a valid request
# that wins a unit of any SKU an earlier phase declared (it did, on a SKU named `U`).
st --include-path-regex '^/v1/' --exclude-operation-id claim \
   -H "Authorization: Bearer $ST_BUYER_TOKEN" "${negative[@]}"
echo "== schemathesis: refusals (negative data on claims, on the SKU sold out to the buyer)"
ST_CONFIG=tests/schemathesis/sold-out.toml st --include-operation-id claim \
   -H "Authorization: Bearer $ST_BUYER_TOKEN" "${negative[@]}"
refusals=(--mode positive --checks not_a_server_error,status_code_conformance,response_schema_conformance
          --phases coverage,fuzzing --max-examples 25 --max-time 15)
echo "== schemathesis: refusals (claims on a SKU sold out to the buyer)"
ST_CONFIG=tests/schemathesis/sold-out.toml st --include-operation-id claim "${refusals[@]}"
echo "== schemathesis: every read"
st --include-method GET "${refusals[@]}"
fingerprint after
if ! diff -u "$WORK/state.before" "$WORK/state.after" >"$WORK/state.diff"; then
  echo "schemathesis: refused requests changed the stores (requests: $REPORTS/run-[2-6].har):" >&2
  head -n 40 "$WORK/state.diff" >&2
  exit 1
fi
echo "schemathesis: refused requests left Redis ($($REDIS --scan --pattern "$PREFIX:*" | wc -l) keys) and PostgreSQL unchanged"
echo "schemathesis: all passed (requests and answers: $REPORTS/run-*.har)"
