#!/usr/bin/env bash
# row-cost.sh: what one winner's `issuances` row costs PostgreSQL, index by index: the floor
# under issue 23's "PostgreSQL CPU per winner ≤ 6 µs".
#
#   loadtest/row-cost.sh        # on the local cluster (127.0.0.1, PGPORT or 5432)
#
# The writer's statement as src/writer/postgres.rs sends it (an UNNEST batch, the
# `persistence_pending` probe, ON CONFLICT DO NOTHING, the row stamped with its transaction id),
# driven by pgbench on a scratch database migrated by the gateway itself (`dropgate serve`),
# with the table's secondary indexes dropped one design at a time:
#
#   migrated      every index the migrations leave (primary key, (sku, seq), the cursor's
#                 (won_xid, claim_id), the held claims' partial (sku, expires_at))
#   sku_user      the same plus (sku, user_id), the index migrations/0018 dropped
#   pk_only       the primary key alone: the row, its WAL and one index entry
#
# Claim ids rise like the gateway's UUIDv7 (each batch appends to the primary key's right
# edge); buyers are random (each enters (sku, user_id) anywhere). Per design: ROUNDS (3) runs of
# TXS (400) batches of BATCH (512) rows, designs alternating per round; the CPU of the whole
# cluster (cluster-cpu.sh) around each run, VACUUM and CHECKPOINT after it included, per row.
# DROPGATE_BIN (the release build) migrates the scratch database. Run it on a quiet machine.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROUNDS=${ROUNDS:-3}
TXS=${TXS:-400}
BATCH=${BATCH:-512}
DB=dg_row_cost
BIN=${DROPGATE_BIN:-$(cd "$HERE/.." && cargo metadata --format-version 1 --no-deps | jq -r .target_directory)/release/dropgate}
export PGOPTIONS="-c client_min_messages=warning"
PSQL=(psql -h 127.0.0.1 -U postgres -X -q -v ON_ERROR_STOP=1)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"; "${PSQL[@]}" -c "DROP DATABASE IF EXISTS $DB" >/dev/null 2>&1 || true' EXIT

"${PSQL[@]}" -c "DROP DATABASE IF EXISTS $DB" -c "CREATE DATABASE $DB"
# `dropgate serve` applies the migrations at start; it is stopped once it listens.
DROPGATE_ADMISSION_SECRET=$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n') DROPGATE_LISTEN=127.0.0.1:0 \
  DATABASE_URL="postgres://postgres@127.0.0.1:${PGPORT:-5432}/$DB" DROPGATE_KEY_PREFIX="rowcost$$" \
  timeout -k 5 120 "$BIN" serve >"$TMP/serve.log" 2>&1 &
SERVE=$!
for _ in $(seq 600); do
  grep -q 'listening on' "$TMP/serve.log" 2>/dev/null && break
  kill -0 "$SERVE" 2>/dev/null || { cat "$TMP/serve.log" >&2; exit 1; }
  sleep 0.1
done
kill "$SERVE"
wait "$SERVE" 2>/dev/null || true
"${PSQL[@]}" -d "$DB" -c "CREATE SEQUENCE claim_ids"
# The indexes each design drops, and how to make them again.
declare -A DROPS=(
  [migrated]=""
  [sku_user]=""
  [pk_only]="issuances_sku_seq issuances_won issuances_held"
)
"${PSQL[@]}" -d "$DB" -Atc "SELECT indexname, indexdef FROM pg_indexes
  WHERE tablename = 'issuances' AND indexname <> 'issuances_pkey'" >"$TMP/indexes"

cat >"$TMP/insert.sql" <<SQL
INSERT INTO issuances
      (claim_id, sku, user_id, quantity, idempotency_key, remaining_after, created_at, seq,
       status, expires_at, offer, won_xid)
    SELECT c, s, u, q, k, r, to_timestamp(ms::double precision / 1000), n,
           CASE WHEN ex IS NULL THEN 'issued' ELSE 'held' END,
           to_timestamp(ex::double precision / 1000), o, pg_current_xact_id()
      FROM (SELECT ('00000000-0000-7000-8000-' || lpad(to_hex(nextval('claim_ids')), 12, '0'))::uuid,
                   'bench', 'user-' || (random() * 1e9)::bigint, 1, NULL::text, 1000::bigint,
                   (extract(epoch FROM clock_timestamp()) * 1000)::bigint, g::bigint,
                   NULL::bigint, false
              FROM generate_series(1, $BATCH) g) AS t(c, s, u, q, k, r, ms, n, ex, o)
     WHERE NOT EXISTS (SELECT 1 FROM persistence_pending p WHERE p.claim_id = t.c)
    ON CONFLICT (claim_id) DO NOTHING;
SQL

# shellcheck source=cluster-cpu.sh
source "$HERE/cluster-cpu.sh"

echo "design round rows cpu_s us_per_row wall_s"
for round in $(seq "$ROUNDS"); do
  for design in migrated sku_user pk_only; do
    # Every index back, then this design's drops.
    while IFS='|' read -r name def; do
      "${PSQL[@]}" -d "$DB" -c "DROP INDEX IF EXISTS $name" -c "$def"
    done <"$TMP/indexes"
    for name in ${DROPS[$design]}; do "${PSQL[@]}" -d "$DB" -c "DROP INDEX $name"; done
    "${PSQL[@]}" -d "$DB" -c "DROP INDEX IF EXISTS issuances_sku_user"
    [[ $design == sku_user ]] && "${PSQL[@]}" -d "$DB" -c "CREATE INDEX issuances_sku_user ON issuances (sku, user_id)"
    "${PSQL[@]}" -d "$DB" -c "TRUNCATE issuances" -c "VACUUM ANALYZE issuances" -c "CHECKPOINT"
    pgbench_cpu "$DB" "$TMP/insert.sql" "$design" "$round" issuances
  done
done
