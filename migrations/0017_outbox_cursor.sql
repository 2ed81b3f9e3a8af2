-- `claim.won` (and `waitlist.offered`) of the journal writer's claims are read from `issuances`
-- itself, past a cursor, instead of from an `outbox` row each: the event row, leased, marked
-- and trimmed, cost PostgreSQL several times the claim's own row (docs/performance.md, "The
-- ledger's event designs"). Every other event (a hold's end, everything the reprocessor
-- writes) stays a row of `outbox` (src/outbox/, docs/outbox.md).
--
-- won_xid: the transaction that inserted the row, set by the writer's insert alone
-- (pg_current_xact_id()). NULL on the reprocessor's rows (their events are outbox rows) and on
-- every row written before this migration (their events are outbox rows already).
ALTER TABLE issuances ADD COLUMN won_xid xid8;
-- The claim is a waitlist offer: its first event is `waitlist.offered`, not `claim.won`.
-- (A column with a constant default costs no rewrite of the table.)
ALTER TABLE issuances ADD COLUMN offer boolean NOT NULL DEFAULT false;
-- What the leading relay walks, in its order; rows of other writers never enter it.
CREATE INDEX issuances_won ON issuances (won_xid, claim_id) WHERE won_xid IS NOT NULL;

-- The last (won_xid, claim_id) whose event JetStream acknowledged. Only moved forward, and only
-- past rows below pg_snapshot_xmin() (every transaction with a smaller xid has ended, so no row
-- can appear behind it later). Starts below every xid: the rows before this migration have no
-- won_xid, so nothing is published twice.
CREATE TABLE outbox_cursor (
    id       integer PRIMARY KEY CHECK (id = 1),
    won_xid  xid8    NOT NULL,
    claim_id uuid    NOT NULL
);
INSERT INTO outbox_cursor VALUES (1, '0', '00000000-0000-0000-0000-000000000000');

-- The relays wake on the writer's insert as they did on its outbox row (one NOTIFY per
-- statement, folded per transaction, delivered at commit).
CREATE TRIGGER issuances_notify AFTER INSERT ON issuances
  FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();

-- Every event of the ledger as one relation, for operators and tests: the outbox's rows, and the
-- creation events the cursor stands for (published once at or below the cursor; never trimmed).
CREATE VIEW claim_events AS
  SELECT o.claim_id, o.seq, o.event, o.sku, o.user_id, o.quantity, o.status, o.occurred_at,
         o.sent_at IS NOT NULL AS sent
    FROM outbox o
  UNION ALL
  SELECT i.claim_id, 1, CASE WHEN i.offer THEN 'waitlist.offered' ELSE 'claim.won' END,
         i.sku, i.user_id, i.quantity,
         CASE WHEN i.expires_at IS NULL THEN 'issued' ELSE 'held' END, i.created_at,
         (i.won_xid, i.claim_id) <= (c.won_xid, c.claim_id)
    FROM issuances i CROSS JOIN outbox_cursor c
   WHERE i.won_xid IS NOT NULL;
