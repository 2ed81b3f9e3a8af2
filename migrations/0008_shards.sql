-- One hot SKU spread over several Redis shards (src/shards/).
--
-- `shards`: how many "Redis SKUs" the SKU is split into (1 = as before). Shard 0 keeps the
-- SKU's own keys; shard i >= 1 lives under the name `sku#i` (its own hash tag, so its own
-- Cluster slot). Fixed at declare: a re-declare with another count is refused like another
-- total.
ALTER TABLE skus ADD COLUMN shards integer NOT NULL DEFAULT 1 CHECK (shards BETWEEN 1 AND 16);

-- The ledger's high-water mark of each shard's state sequence, for shards 1..15 (shard 0's
-- stays in skus.redis_seq, so a SKU of one shard reads and writes exactly what it did). A
-- shard's sequences start at shard << 36 (src/shards/mod.rs), so sequences of two shards never
-- meet and the writer's "a sequence used twice" check stays per SKU.
CREATE TABLE sku_shard_marks (
    sku       text    NOT NULL REFERENCES skus (sku) ON DELETE CASCADE,
    shard     integer NOT NULL CHECK (shard BETWEEN 1 AND 15),
    redis_seq bigint  NOT NULL DEFAULT 0,
    PRIMARY KEY (sku, shard)
);

-- The transfer recovery task of every gateway reads the sharded SKUs every second: an index of
-- those few, so an idle catalog of 100,000 SKUs costs it nothing.
CREATE INDEX skus_sharded ON skus (sku) WHERE shards > 1;
