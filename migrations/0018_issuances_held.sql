-- The ledger's held claims of a SKU, by expiry: the observer counts each SKU's overdue holds
-- every round on every gateway (src/observe.rs), and a restore reads a SKU's holds
-- (src/restore/lifecycle.rs). Without it both read every row of the SKU, one per unit sold
-- (88 ms a round on a SKU of 700k rows; docs/performance.md, "PostgreSQL's CPU per winner").
-- Partial: the writer's `issued` rows, most of the table, never enter it.
CREATE INDEX issuances_held ON issuances (sku, expires_at) WHERE status = 'held';
