-- Each SKU's sums of `issuances` (the ledger side of the SKU view), kept in the transaction of
-- every change to the table, so that the view reads one row whatever the SKU's history
-- (docs/ledger-view.md, "The ledger's sums in one row"). Before, the view summed every row of
-- the SKU: the time between its two Redis reads grew with history until a fenced reading no
-- longer fit (issue 37). Triggers, not the writer's statements: every writer (the journal
-- writer, the reprocessor, a restore, an operator by hand) keeps them right.
--
-- Statement-level with transition tables: one upsert per statement and SKU, not per row (the
-- writer inserts a batch in one statement). SKUs are updated in their order, so two
-- transactions touching the same SKUs lock them in one order.
CREATE TABLE sku_books (
    sku       text   PRIMARY KEY,
    recorded  bigint NOT NULL DEFAULT 0,
    held      bigint NOT NULL DEFAULT 0,
    confirmed bigint NOT NULL DEFAULT 0
);

-- The change of one statement, per SKU: +rows it wrote, -rows it replaced or removed.
CREATE FUNCTION sku_books_apply(d_sku text[], d_qty bigint[], d_status text[]) RETURNS void
LANGUAGE sql AS $$
  INSERT INTO sku_books AS b (sku, recorded, held, confirmed)
  SELECT sku,
         COALESCE(SUM(qty) FILTER (WHERE status IN ('issued', 'held', 'confirmed')), 0),
         COALESCE(SUM(qty) FILTER (WHERE status = 'held'), 0),
         COALESCE(SUM(qty) FILTER (WHERE status = 'confirmed'), 0)
    FROM unnest(d_sku, d_qty, d_status) AS d(sku, qty, status)
   WHERE status IN ('issued', 'held', 'confirmed')
   GROUP BY sku
   ORDER BY sku
  ON CONFLICT (sku) DO UPDATE
     SET recorded  = b.recorded  + EXCLUDED.recorded,
         held      = b.held      + EXCLUDED.held,
         confirmed = b.confirmed + EXCLUDED.confirmed
$$;

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

-- The full recount `reconcile` checks the kept sums against (and the tests): SKUs whose row
-- differs from their rows' sums.
CREATE VIEW sku_books_drift AS
  SELECT COALESCE(b.sku, r.sku) AS sku,
         COALESCE(b.recorded, 0) AS kept_recorded, COALESCE(r.recorded, 0) AS recounted,
         COALESCE(b.held, 0) AS kept_held, COALESCE(r.held, 0) AS recounted_held,
         COALESCE(b.confirmed, 0) AS kept_confirmed, COALESCE(r.confirmed, 0) AS recounted_confirmed
    FROM sku_books b
    FULL JOIN (SELECT sku,
                      COALESCE(SUM(quantity) FILTER (WHERE status IN ('issued', 'held', 'confirmed')), 0) AS recorded,
                      COALESCE(SUM(quantity) FILTER (WHERE status = 'held'), 0) AS held,
                      COALESCE(SUM(quantity) FILTER (WHERE status = 'confirmed'), 0) AS confirmed
                 FROM issuances GROUP BY sku) r ON r.sku = b.sku
   WHERE COALESCE(b.recorded, 0) <> COALESCE(r.recorded, 0)
      OR COALESCE(b.held, 0) <> COALESCE(r.held, 0)
      OR COALESCE(b.confirmed, 0) <> COALESCE(r.confirmed, 0);
