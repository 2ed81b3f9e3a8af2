-- The incarnation of each SKU's (and shard's) Redis state that PostgreSQL has recorded (see
-- src/freshness.rs, lua/lib/fresh.lua): a Redis-clock time stamped on the state by restore and
-- advanced by the gateways' rotation (lua/rotate.lua) once the state is found fresh, recorded
-- here after the replicas hold it. A Redis state whose `inc` is below this column is an older
-- copy (an old snapshot, a lost AOF tail, a lagging replica), whatever its sequence became
-- since: it is closed until restore. 0: nothing recorded (every state passes).
ALTER TABLE skus ADD COLUMN redis_inc bigint NOT NULL DEFAULT 0;
ALTER TABLE sku_shard_marks ADD COLUMN redis_inc bigint NOT NULL DEFAULT 0;
