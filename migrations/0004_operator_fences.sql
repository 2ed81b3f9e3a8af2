-- Operator actions that survive a gateway's death and a lost lock.

-- Each operator action (restock, restore) takes the next epoch under the SKU's lock and
-- carries it into Redis, where a state touched by a newer action refuses an older one: the
-- advisory lock serialises actions while its connection lives, the epoch fences a holder whose
-- connection (and so lock) was lost without it knowing.
ALTER TABLE skus ADD COLUMN op_epoch bigint NOT NULL DEFAULT 0;

-- Restocks in flight: written before the Redis step, finished (applied or not) after it, so
-- one whose gateway died, or whose answer was lost, is settled later by reading Redis back
-- (never by sending it again), before any restore reads the total.
CREATE TABLE restock_ops (
    op_id      uuid        PRIMARY KEY,
    sku        text        NOT NULL,
    delta      bigint      NOT NULL,
    status     text        NOT NULL DEFAULT 'pending'
               CHECK (status IN ('pending', 'applied', 'not_applied')),
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX restock_ops_pending ON restock_ops (sku, created_at) WHERE status = 'pending';
