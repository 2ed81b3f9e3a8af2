#!/usr/bin/env bash
# Runs every shell block of docs/runbook.md marked ```sh title="runbook:NAME"```, in the order
# they appear, against a gateway of its own: the debug binary, a Redis of its own with the
# persistence the runbook asks for (AOF, appendfsync always), and a fresh PostgreSQL database.
# Before some blocks it plays what the block reacts to (buyers arriving, a Redis that lost its
# data, a Redis that came back with older data). Fails on the first block that exits non-zero,
# and on any shell block of the runbook that is not marked (so none escapes the check).
#
# Usage: docs/runbook-check.sh [path/to/dropgate]   (default: $CARGO_TARGET_DIR/debug/dropgate)
# Needs: redis-server, redis-cli, psql, curl, jq, python3; PostgreSQL on 127.0.0.1:5432.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN="$(realpath "${1:-${CARGO_TARGET_DIR:-target}/debug/dropgate}")"
test -x "$BIN" || { echo "runbook-check: no gateway binary at $BIN (cargo build first)" >&2; exit 2; }
RUNBOOK=docs/runbook.md
WORK="$(mktemp -d)"
ID="$(head -c 6 /dev/urandom | od -An -tx1 | tr -d ' \n')"
# dg_test_ so that .ci/run's sweep of leftover test databases removes it if this run dies.
DB="dg_test_runbook_$ID"
PG="postgres://postgres@127.0.0.1:5432"
REDIS_PORT="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
GW_PID=""

cleanup() {
  local rc=$?
  if [ -n "$GW_PID" ]; then kill "$GW_PID" 2>/dev/null || true; wait "$GW_PID" 2>/dev/null || true; fi
  redis-cli -p "$REDIS_PORT" shutdown nosave >/dev/null 2>&1 || true
  dropdb -h 127.0.0.1 -U postgres --if-exists "$DB" 2>/dev/null || true
  if [ "$rc" -ne 0 ] && [ -f "$WORK/gateway.log" ]; then
    echo "--- gateway log (last 40 lines)" >&2
    tail -n 40 "$WORK/gateway.log" >&2 || true
    tail -n 20 "$WORK/gateway.out" >&2 || true
  fi
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT

# === Redis of its own ===

start_redis() {
  redis-server --daemonize yes --bind 127.0.0.1 --port "$REDIS_PORT" --dir "$WORK/redis" \
    --appendonly yes --appendfsync always --save "" --maxmemory-policy noeviction \
    --logfile "$WORK/redis.log" >/dev/null
  for _ in $(seq 1 100); do
    redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && return 0
    sleep 0.05
  done
  echo "runbook-check: redis did not start" >&2
  return 1
}

stop_redis() {
  # SHUTDOWN flushes the AOF; wait until the port is closed so a restart can bind it.
  redis-cli -p "$REDIS_PORT" shutdown >/dev/null 2>&1 || true
  for _ in $(seq 1 100); do
    redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 || return 0
    sleep 0.05
  done
  return 1
}

mkdir -p "$WORK/redis" "$WORK/blocks"
start_redis

# === the gateway ===

export DG="" SKU="runbook-$ID" DATABASE_URL="$PG/$DB" REDIS_URL="redis://127.0.0.1:$REDIS_PORT"
export DROPGATE_KEY_PREFIX="rb$ID"
export DROPGATE_ADMIN_TOKEN="runbook-admin-$ID-0123456789"
export DROPGATE_ADMISSION_SECRET="runbook-secret-$ID-0123456789"
export DROPGATE_LOG="$WORK/gateway.log"
export PATH="$(dirname "$BIN"):$PATH"

DROPGATE_LISTEN=127.0.0.1:0 DROPGATE_LOG_JSON=1 RUST_LOG=info,dropgate=debug \
  DROPGATE_SKU_GAUGES_INTERVAL_MS=200 DROPGATE_REPROCESS_BACKOFF_MS=50 \
  "$BIN" serve >"$WORK/gateway.out" 2>"$DROPGATE_LOG" &
GW_PID=$!
for _ in $(seq 1 300); do
  addr="$(jq -r 'select(.fields.message | startswith("listening on ")) | .fields.message[13:]' \
          "$DROPGATE_LOG" 2>/dev/null | head -n 1)"
  [ -n "$addr" ] && break
  kill -0 "$GW_PID" 2>/dev/null || { echo "runbook-check: the gateway exited" >&2; exit 1; }
  sleep 0.1
done
[ -n "$addr" ] || { echo "runbook-check: the gateway did not log its address" >&2; exit 1; }
export DG="http://$addr" GATEWAYS="http://$addr"
echo "runbook-check: gateway $DG, redis :$REDIS_PORT, database $DB, SKU $SKU"

admin() { curl -fsS -H "authorization: Bearer $DROPGATE_ADMIN_TOKEN" "$@"; }

wait_until() { # wait_until SECONDS COMMAND...: polls COMMAND until it succeeds
  local deadline=$((SECONDS + $1)); shift
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || { echo "runbook-check: timed out waiting for: $*" >&2; return 1; }
    sleep 0.1
  done
}

buyers() { # buyers N PREFIX: N buyers claim one unit each, all at once
  local pids=() i t
  for i in $(seq 1 "$1"); do
    t="$("$BIN" token --user "$2-$i" --sku "$SKU" --ttl 60)"
    curl -s -o /dev/null -X POST "$DG/v1/skus/$SKU/claims" -H "authorization: Bearer $t" \
         -d '{"quantity": 1}' &
    pids+=($!)
  done
  wait "${pids[@]}"
}

sku_gauge() { # sku_gauge NAME LABELS VALUE: the gateway exports NAME{LABELS} VALUE
  curl -fsS "$DG/metrics" | grep -qxF "$1{$2} $3"
}

# === what the blocks react to ===

before_watch() {
  buyers 30 buyer
  wait_until 10 sku_gauge dropgate_sku_recorded_units "sku=\"$SKU\"" 30
}

before_restore_lost() {
  echo "runbook-check: redis restarts without its data"
  stop_redis
  rm -rf "$WORK/redis" && mkdir -p "$WORK/redis"
  start_redis
  wait_until 10 sku_gauge dropgate_sku_closed "sku=\"$SKU\",reason=\"lost\"" 1
}

before_restore_stale() {
  echo "runbook-check: redis comes back from an older copy of its data"
  stop_redis
  rm -rf "$WORK/redis-old" && cp -a "$WORK/redis" "$WORK/redis-old"
  start_redis
  wait_until 10 curl -fsS "$DG/readyz"
  # Sales the older copy will not hold: a restock and its buyers, recorded in the ledger.
  admin -X POST "$DG/admin/skus/$SKU/restock" -d '{"delta": 5}' >/dev/null
  buyers 3 late
  wait_until 10 sku_gauge dropgate_sku_recorded_units "sku=\"$SKU\"" 33
  stop_redis
  rm -rf "$WORK/redis" && mv "$WORK/redis-old" "$WORK/redis"
  start_redis
  wait_until 15 sku_gauge dropgate_sku_closed "sku=\"$SKU\",reason=\"stale\"" 1
}

# === extract and run the blocks ===

# Any shell block without the marker would escape the check.
unmarked="$(grep -nE '^```(sh|bash|shell|console)' "$RUNBOOK" | grep -vE '^[0-9]+:```sh title="runbook:[a-z0-9-]+"$' || true)"
if [ -n "$unmarked" ]; then
  echo "runbook-check: shell blocks without a runbook:NAME title:" >&2
  echo "$unmarked" >&2
  exit 1
fi
awk -v dir="$WORK/blocks" '
  /^```sh title="runbook:[a-z0-9-]+"$/ {
    match($0, /runbook:[a-z0-9-]+/)
    n++; file = sprintf("%s/%02d-%s.sh", dir, n, substr($0, RSTART + 8, RLENGTH - 8))
    next
  }
  /^```/ && file != "" { file = ""; next }
  file != "" { print > file }
' "$RUNBOOK"

STATE="$WORK/state.sh"
export -p | grep -vE '^declare -[a-zA-Z]*r' >"$STATE"
count=0
started=$SECONDS
for block in "$WORK"/blocks/*.sh; do
  name="$(basename "$block" .sh)"; name="${name#*-}"
  hook="before_${name//-/_}"
  if declare -F "$hook" >/dev/null; then "$hook"; fi
  echo "== runbook:$name"
  # Each block in its own strict shell; what it exports carries to the next block.
  if ! bash -euo pipefail -c '
        source "$1"
        source "$2"
        export -p | grep -vE "^declare -[a-zA-Z]*r" >"$1"' _ "$STATE" "$block" \
        >"$WORK/out" 2>&1; then
    sed 's/^/   | /' "$WORK/out"
    echo "runbook-check: block runbook:$name failed" >&2
    exit 1
  fi
  sed 's/^/   | /' "$WORK/out" | head -n 15
  count=$((count + 1))
done
test "$count" -gt 0 || { echo "runbook-check: no block found in $RUNBOOK" >&2; exit 1; }
echo "runbook-check: $count blocks ran in $((SECONDS - started)) s, all passed"
