-- Detecting a Redis that came back with older data, and declares that cannot adopt or re-seed.

-- The highest state sequence PostgreSQL has recorded for the SKU (journal entries written,
-- restocks applied). A Redis state whose sequence is behind it is stale.
ALTER TABLE skus ADD COLUMN redis_seq bigint NOT NULL DEFAULT 0;
-- Stamped on the Redis state when it is seeded: a declare recognises its own seed after a lost
-- answer, and never adopts a state it did not seed.
ALTER TABLE skus ADD COLUMN declare_id uuid NOT NULL DEFAULT gen_random_uuid();

-- The state sequence each winner produced. Two winners of one SKU with the same sequence mean
-- Redis sold from a state it had already sold from: the writer checks for it on every batch.
ALTER TABLE issuances ADD COLUMN seq bigint;
CREATE INDEX issuances_sku_seq ON issuances (sku, seq) WHERE seq IS NOT NULL;
ALTER TABLE persistence_pending ADD COLUMN seq bigint;
