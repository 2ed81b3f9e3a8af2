-- The waiting room of a SKU (src/queue/): set by `queue` on PUT /admin/skus/{sku}. A SKU with
-- `queue_admit_per_second` set is sold only to buyers its queue admitted. `queue_seed` (hex of
-- 32 random bytes) orders the pre-queue at `opens_at`; it is chosen at the first declare with
-- a queue and never changed, its SHA-256 shown from then on and the seed itself from
-- `opens_at` on (docs/waiting-room.md).
ALTER TABLE skus ADD COLUMN queue_admit_per_second integer;
ALTER TABLE skus ADD COLUMN queue_admission_ttl_seconds integer;
ALTER TABLE skus ADD COLUMN queue_prequeue_from timestamptz;
ALTER TABLE skus ADD COLUMN queue_seed text;
