#!/usr/bin/env bash
# outbox-designs.sh: PostgreSQL's CPU per winner of the ledger's event designs, side by side,
# with no gateway in the way (issue 23's "≤ 6 µs per winner with events"): the SQL each design
# runs per batch, driven by pgbench on a scratch database with the real schema.
#
#   now     the relay before migrations/0015_outbox_leader.sql: the writer's insert of
#           `issuances` and `outbox` in one statement (writer/postgres.rs), then the relay's
#           lease UPDATE, its mark UPDATE and the retention trim's DELETE, per row
#   leader  the relay since 0015: the same insert; one relay holds a lease row for all (one
#           UPDATE per batch), reads the unsent rows without locking them, marks them sent, and
#           the trim deletes them
#   cursor  `issuances` alone is the outbox of `claim.won`: the insert stamps each row with its
#           transaction's xid8, and one relay reads the rows below the snapshot's xmin past
#           its cursor, in (xid, claim id) order, and moves its cursor row (one UPDATE per batch)
#   bare    the `issuances` insert alone (no events: the floor)
#
# Per design: ROUNDS (3) runs of TXS (400) batches of BATCH (512) rows, alternating designs
# per round; the CPU of the whole cluster (every postgres process, and the backends that
# exited, from the postmaster's children's times), checkpointed and vacuumed before each run,
# divided by the rows. Needs the local PostgreSQL and pgbench, and a migrated dropgate
# database to copy the schema from (SCHEMA_FROM, default: the newest dg_test_* with an
# outbox). Run it on a quiet machine: the cluster's CPU includes everyone's.
set -euo pipefail

ROUNDS=${ROUNDS:-3}
TXS=${TXS:-400}
BATCH=${BATCH:-512}
DB=dg_outbox_designs
export PGOPTIONS="-c client_min_messages=warning"
PSQL=(psql -h 127.0.0.1 -U postgres -X -q -v ON_ERROR_STOP=1)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

from=${SCHEMA_FROM:-$("${PSQL[@]}" -Atc "SELECT datname FROM pg_database
  WHERE datname LIKE 'dg_test_%' ORDER BY oid DESC" | while read -r d; do
    if [[ $("${PSQL[@]}" -d "$d" -Atc "SELECT to_regclass('outbox') IS NOT NULL") == t ]]; then
      echo "$d"; break
    fi
  done)}
[[ -n $from ]] || { echo "no migrated dg_test_* database to copy the schema from" >&2; exit 1; }
"${PSQL[@]}" -c "DROP DATABASE IF EXISTS $DB" -c "CREATE DATABASE $DB"
pg_dump -h 127.0.0.1 -U postgres -s "$from" | "${PSQL[@]}" -d "$DB" >/dev/null
# The cursor design's column, index and cursor row.
"${PSQL[@]}" -d "$DB" <<'SQL'
-- (A schema migrated by 0017 has the column, its index and the writer's NOTIFY trigger already.)
ALTER TABLE issuances ADD COLUMN IF NOT EXISTS won_xid xid8;
-- The per-row lease of the relay before migrations/0015_outbox_leader.sql (the "now" design).
ALTER TABLE outbox ADD COLUMN IF NOT EXISTS lease_owner uuid,
                   ADD COLUMN IF NOT EXISTS lease_until timestamptz;
CREATE TABLE relay_cursor (id int PRIMARY KEY, owner uuid, lease_until timestamptz,
                           xid xid8 NOT NULL, claim_id uuid NOT NULL);
INSERT INTO relay_cursor VALUES (1, NULL, NULL, '0', '00000000-0000-0000-0000-000000000000');
SQL

insert_rows="SELECT gen_random_uuid() AS c, 'bench' AS s, 'u' || g AS u, 1 AS q, NULL::text AS k,
       1000::bigint AS r, now() AS t, g::bigint AS n FROM generate_series(1, $BATCH) g"
cat >"$TMP/bare.sql" <<SQL
INSERT INTO issuances (claim_id, sku, user_id, quantity, idempotency_key, remaining_after,
                       created_at, seq, status, expires_at)
SELECT c, s, u, q, k, r, t, n, 'issued', NULL FROM ($insert_rows) x;
SQL
with_outbox="WITH ins AS (
  INSERT INTO issuances (claim_id, sku, user_id, quantity, idempotency_key, remaining_after,
                         created_at, seq, status, expires_at)
  SELECT c, s, u, q, k, r, t, n, 'issued', NULL FROM ($insert_rows) x
  ON CONFLICT (claim_id) DO NOTHING
  RETURNING claim_id, sku, user_id, quantity, status, created_at)
INSERT INTO outbox (claim_id, seq, event, sku, user_id, quantity, status, occurred_at)
SELECT claim_id, 1, 'claim.won', sku, user_id, quantity, status, created_at FROM ins
ON CONFLICT (claim_id, seq) DO NOTHING;"
owner=00000000-0000-0000-0000-0000000000aa
cat >"$TMP/now.sql" <<SQL
$with_outbox
UPDATE outbox o SET lease_owner = '$owner', lease_until = now() + interval '10 s'
 WHERE o.id = ANY(ARRAY(
       SELECT c.id FROM outbox c
        WHERE c.sent_at IS NULL AND c.id > 0
          AND (c.lease_until IS NULL OR c.lease_until < now() OR c.lease_owner = '$owner')
          AND NOT EXISTS (SELECT 1 FROM outbox e WHERE e.claim_id = c.claim_id AND e.seq < c.seq
                            AND e.sent_at IS NULL)
        ORDER BY c.id LIMIT $BATCH FOR UPDATE SKIP LOCKED))
RETURNING o.id, o.claim_id, o.seq, o.event, o.sku, o.user_id, o.quantity, o.status,
          o.occurred_at, o.created_at;
UPDATE outbox SET sent_at = now()
 WHERE id = ANY(ARRAY(SELECT id FROM outbox WHERE sent_at IS NULL AND lease_owner = '$owner'
                       ORDER BY id LIMIT $BATCH));
DELETE FROM outbox WHERE id IN (SELECT id FROM outbox WHERE sent_at < now() LIMIT 5000);
SQL
cat >"$TMP/leader.sql" <<SQL
$with_outbox
UPDATE relay_cursor SET owner = '$owner', lease_until = now() + interval '10 s'
 WHERE id = 1 AND (owner = '$owner' OR lease_until IS NULL OR lease_until < now());
SELECT c.id, c.claim_id, c.seq, c.event, c.sku, c.user_id, c.quantity, c.status,
       c.occurred_at, c.created_at
  FROM outbox c
 WHERE c.sent_at IS NULL
   AND NOT EXISTS (SELECT 1 FROM outbox e WHERE e.claim_id = c.claim_id AND e.seq < c.seq
                     AND e.sent_at IS NULL)
 ORDER BY c.id LIMIT $BATCH;
UPDATE outbox SET sent_at = now()
 WHERE id = ANY(ARRAY(SELECT id FROM outbox WHERE sent_at IS NULL ORDER BY id LIMIT $BATCH));
DELETE FROM outbox WHERE id IN (SELECT id FROM outbox WHERE sent_at < now() LIMIT 5000);
SQL
cat >"$TMP/cursor.sql" <<SQL
INSERT INTO issuances (claim_id, sku, user_id, quantity, idempotency_key, remaining_after,
                       created_at, seq, status, expires_at)
SELECT c, s, u, q, k, r, t, n, 'issued', NULL FROM ($insert_rows) x;
SELECT xid::text AS cx FROM relay_cursor WHERE id = 1 \\gset
WITH batch AS (
       SELECT i.won_xid, i.claim_id, i.sku, i.user_id, i.quantity, i.status, i.created_at
         FROM issuances i
        WHERE i.won_xid > :cx::text::xid8
          AND i.won_xid < pg_snapshot_xmin(pg_current_snapshot())
        ORDER BY i.won_xid, i.claim_id LIMIT $BATCH),
     last AS (SELECT max(won_xid::text::bigint) AS x FROM batch)
UPDATE relay_cursor r SET xid = last.x::text::xid8, owner = '$owner',
       lease_until = now() + interval '10 s'
  FROM last WHERE r.id = 1 AND last.x IS NOT NULL;
SQL

# shellcheck source=cluster-cpu.sh
source "$(dirname "${BASH_SOURCE[0]}")/cluster-cpu.sh"

echo "design round rows cpu_s us_per_row wall_s"
for round in $(seq "$ROUNDS"); do
  for design in bare now leader cursor; do
    # Only the cursor design stamps and indexes the transaction id.
    if [[ $design == cursor ]]; then
      setup=("ALTER TABLE issuances ALTER COLUMN won_xid SET DEFAULT pg_current_xact_id()"
             "CREATE INDEX IF NOT EXISTS issuances_won ON issuances (won_xid, claim_id)")
    else
      setup=("ALTER TABLE issuances ALTER COLUMN won_xid DROP DEFAULT"
             "DROP INDEX IF EXISTS issuances_won")
    fi
    "${PSQL[@]}" -d "$DB" -c "${setup[0]}" -c "${setup[1]}" -c "TRUNCATE issuances, outbox" -c "UPDATE relay_cursor SET xid = '0',
      claim_id = '00000000-0000-0000-0000-000000000000', owner = NULL, lease_until = NULL" \
      -c "VACUUM ANALYZE issuances" -c "VACUUM ANALYZE outbox" -c "CHECKPOINT"
    # Autovacuum and the checkpointer's share of what the run left behind, in the figure.
    pgbench_cpu "$DB" "$TMP/$design.sql" "$design" "$round" issuances outbox
  done
done
[[ -n ${KEEP_DB:-} ]] || "${PSQL[@]}" -c "DROP DATABASE $DB"
