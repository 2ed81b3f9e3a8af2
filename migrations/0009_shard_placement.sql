-- Where the shards of a sharded SKU sit on a Redis Cluster (src/shards/placement.rs).
--
-- `shard_salts[i + 1]`: the placement salt of shard i (PostgreSQL arrays count from 1). Shard
-- i >= 1 is named `sku#i` when its salt is 0 and `sku#i.s` otherwise: the salt moves the
-- shard's hash tag, so its slot, onto the master the declare chose for it. Empty (the
-- default, every SKU declared before this, every SKU on a single Redis) means every salt 0,
-- so those SKUs keep their names. Written once, by the INSERT that creates the row: every
-- gateway names the shards from this row alone, and a re-declare never changes it.
ALTER TABLE skus ADD COLUMN shard_salts integer[] NOT NULL DEFAULT '{}'
    CHECK (cardinality(shard_salts) <= 16
           AND array_position(shard_salts, NULL) IS NULL
           AND 0 <= ALL (shard_salts) AND 65535 >= ALL (shard_salts));
