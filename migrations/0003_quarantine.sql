-- Journal entries that no table would take: PostgreSQL refused the winner in issuances and in
-- persistence_pending (a NUL byte in a text value, say), or the entry holds no winner the
-- gateway can read. The writer stores them here, acknowledges them and reads on, so one bad
-- entry never stops a SKU's writer. Their units left Redis stock: the SKU view counts them as
-- `quarantined` until an operator resolves the row (records or compensates the claim, then
-- sets resolved_at).

CREATE TABLE quarantine (
    id          bigserial   PRIMARY KEY,
    sku         text        NOT NULL,
    -- The journal stream entry id; with sku, what makes a second writer's copy a no-op.
    entry_id    text        NOT NULL,
    -- What could be read of the entry (NULL when it could not).
    claim_id    uuid,
    -- The buyer, with bytes text cannot hold replaced by U+FFFD; raw_entry has the original.
    user_id     text,
    quantity    integer,
    -- The entry's fields exactly as Redis held them, `field=value` joined by newlines.
    raw_entry   bytea       NOT NULL,
    -- Why it is here: each table's refusal as PostgreSQL worded it, with its SQLSTATE.
    error       text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    resolved_at timestamptz,
    UNIQUE (sku, entry_id)
);
CREATE INDEX quarantine_open ON quarantine (sku) WHERE resolved_at IS NULL;
