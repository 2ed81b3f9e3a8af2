-- Each SKU's sums of `issuances` (the ledger side of the SKU view), kept in the transaction of
-- every change to the table, so that the view reads a few rows whatever the SKU's history
-- (docs/ledger-view.md, "The ledger's sums in one row"). Before, the view summed every row of
-- the SKU: the time between its two Redis reads grew with history until a fenced reading no
-- longer fit (issue 37). Triggers, not the writer's statements: every writer (the journal
-- writer, the reprocessor, a restore, an operator by hand) keeps them right.
--
-- A change only ever appends a row to `sku_books_delta`: no writer waits for another. Adding
-- into one row per SKU instead made every transaction that wrote a SKU hold that row's lock
-- until it ended, so one slow transaction stopped every other writer of the SKU and changed
-- the order claims commit in (the outbox cursor's order). The deltas are folded into
-- `sku_books` by whichever transaction holds the fold lock; the others skip the fold, never
-- wait for it. `sku_books_kept` (the folded row plus the deltas not yet folded) is what the
-- view reads.
CREATE TABLE sku_books (
    sku       text   PRIMARY KEY,
    recorded  bigint NOT NULL DEFAULT 0,
    held      bigint NOT NULL DEFAULT 0,
    confirmed bigint NOT NULL DEFAULT 0
);

CREATE TABLE sku_books_delta (
    id        bigserial PRIMARY KEY,
    sku       text   NOT NULL,
    recorded  bigint NOT NULL,
    held      bigint NOT NULL,
    confirmed bigint NOT NULL
);
CREATE INDEX sku_books_delta_sku ON sku_books_delta (sku);

-- The change of one statement, per SKU: +rows it wrote, -rows it replaced or removed.
CREATE FUNCTION sku_books_apply(d_sku text[], d_qty bigint[], d_status text[]) RETURNS void
LANGUAGE sql AS $$
  INSERT INTO sku_books_delta (sku, recorded, held, confirmed)
  SELECT sku,
         COALESCE(SUM(qty) FILTER (WHERE status IN ('issued', 'held', 'confirmed')), 0),
         COALESCE(SUM(qty) FILTER (WHERE status = 'held'), 0),
         COALESCE(SUM(qty) FILTER (WHERE status = 'confirmed'), 0)
    FROM unnest(d_sku, d_qty, d_status) AS d(sku, qty, status)
   WHERE status IN ('issued', 'held', 'confirmed')
   GROUP BY sku
$$;

-- Folds every delta this transaction sees into `sku_books`, if no other transaction is
-- folding (a try-lock: a writer never waits here). Only the fold lock's holder deletes deltas
-- or writes `sku_books`, so folds never conflict; a reader sees the fold whole or not at all.
-- Only a read-committed transaction folds: one with an older snapshot would fail to serialize
-- on deltas a fold since then removed.
CREATE FUNCTION sku_books_fold() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  IF current_setting('transaction_isolation') <> 'read committed'
     OR NOT pg_try_advisory_xact_lock(hashtext('dropgate.sku_books_fold')) THEN
    RETURN;
  END IF;
  WITH gone AS (DELETE FROM sku_books_delta RETURNING sku, recorded, held, confirmed)
  INSERT INTO sku_books AS b (sku, recorded, held, confirmed)
  SELECT sku, SUM(recorded), SUM(held), SUM(confirmed) FROM gone GROUP BY sku
  ON CONFLICT (sku) DO UPDATE
     SET recorded  = b.recorded  + EXCLUDED.recorded,
         held      = b.held      + EXCLUDED.held,
         confirmed = b.confirmed + EXCLUDED.confirmed;
END $$;

-- One function for the three triggers (PL/pgSQL plans a statement when it first runs it, so
-- the branch of another event never names a transition table this trigger lacks).
CREATE FUNCTION sku_books_delta() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    PERFORM sku_books_apply(array_agg(sku), array_agg(quantity::bigint), array_agg(status))
       FROM new_rows WHERE status IN ('issued', 'held', 'confirmed');
  ELSIF TG_OP = 'DELETE' THEN
    PERFORM sku_books_apply(array_agg(sku), array_agg(-quantity::bigint), array_agg(status))
       FROM old_rows WHERE status IN ('issued', 'held', 'confirmed');
  ELSE
    PERFORM sku_books_apply(array_agg(sku), array_agg(qty), array_agg(status))
       FROM (SELECT sku, quantity::bigint AS qty, status FROM new_rows
             UNION ALL
             SELECT sku, -quantity::bigint, status FROM old_rows) d
      WHERE status IN ('issued', 'held', 'confirmed');
  END IF;
  PERFORM sku_books_fold();
  RETURN NULL;
END $$;

CREATE TRIGGER issuances_books_insert AFTER INSERT ON issuances
  REFERENCING NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION sku_books_delta();
CREATE TRIGGER issuances_books_update AFTER UPDATE ON issuances
  REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION sku_books_delta();
CREATE TRIGGER issuances_books_delete AFTER DELETE ON issuances
  REFERENCING OLD TABLE AS old_rows
  FOR EACH STATEMENT EXECUTE FUNCTION sku_books_delta();

-- The rows written before this migration.
INSERT INTO sku_books (sku, recorded, held, confirmed)
SELECT sku,
       COALESCE(SUM(quantity) FILTER (WHERE status IN ('issued', 'held', 'confirmed')), 0),
       COALESCE(SUM(quantity) FILTER (WHERE status = 'held'), 0),
       COALESCE(SUM(quantity) FILTER (WHERE status = 'confirmed'), 0)
  FROM issuances GROUP BY sku;

-- What the kept sums say now: the folded row plus the deltas not yet folded.
CREATE VIEW sku_books_kept AS
  SELECT sku, SUM(recorded)::bigint AS recorded, SUM(held)::bigint AS held,
         SUM(confirmed)::bigint AS confirmed
    FROM (SELECT sku, recorded, held, confirmed FROM sku_books
          UNION ALL
          SELECT sku, recorded, held, confirmed FROM sku_books_delta) k
   GROUP BY sku;

-- The full recount `reconcile` checks the kept sums against (and the tests): SKUs whose kept
-- sums differ from their rows' sums.
CREATE VIEW sku_books_drift AS
  SELECT COALESCE(b.sku, r.sku) AS sku,
         COALESCE(b.recorded, 0) AS kept_recorded, COALESCE(r.recorded, 0) AS recounted,
         COALESCE(b.held, 0) AS kept_held, COALESCE(r.held, 0) AS recounted_held,
         COALESCE(b.confirmed, 0) AS kept_confirmed, COALESCE(r.confirmed, 0) AS recounted_confirmed
    FROM sku_books_kept b
    FULL JOIN (SELECT sku,
                      COALESCE(SUM(quantity) FILTER (WHERE status IN ('issued', 'held', 'confirmed')), 0) AS recorded,
                      COALESCE(SUM(quantity) FILTER (WHERE status = 'held'), 0) AS held,
                      COALESCE(SUM(quantity) FILTER (WHERE status = 'confirmed'), 0) AS confirmed
                 FROM issuances GROUP BY sku) r ON r.sku = b.sku
   WHERE COALESCE(b.recorded, 0) <> COALESCE(r.recorded, 0)
      OR COALESCE(b.held, 0) <> COALESCE(r.held, 0)
      OR COALESCE(b.confirmed, 0) <> COALESCE(r.confirmed, 0);
