-- The indexes of `issuances`, for what the gateway reads and for what each winner's row costs
-- (docs/performance.md, "PostgreSQL's CPU per winner", measured with loadtest/row-cost.sh).
--
-- (sku, user_id) goes: no gateway query looks a buyer up, and with buyers arriving in no order
-- every row entered it at a random place: a third of the row's cost to PostgreSQL (9.1-9.6 µs
-- per row with it, 6.1 without). An operator's question about one buyer reads that SKU's rows
-- through (sku, seq) instead (about 0.1 µs a row).
DROP INDEX issuances_sku_user;
-- Every row now, not only those with a state sequence: it is the SKU's index for every
-- `WHERE sku = $1` read (the SKU view's sums, a restore, reconcile), and the writer's clash
-- check (src/freshness.rs) reads it by (sku, seq) as before. Sequences rise within a SKU, so a
-- batch appends at the SKU's end of it.
DROP INDEX issuances_sku_seq;
CREATE INDEX issuances_sku_seq ON issuances (sku, seq);
-- The ledger's held claims of a SKU, by expiry: the observer counts each SKU's overdue holds
-- every round on every gateway (src/observe.rs), and a restore reads a SKU's holds
-- (src/restore/lifecycle.rs). Without it both read every row of the SKU, one per unit sold
-- (88 ms a round on a SKU of 700k rows). Partial: the writer's `issued` rows, most of the
-- table, never enter it.
CREATE INDEX issuances_held ON issuances (sku, expires_at) WHERE status = 'held';
