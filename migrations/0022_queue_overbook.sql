-- The waiting room's admission knows the stock, and its settings have an order (issue 37,
-- API.md "Waiting room"):
-- - `queue_overbook_milli`: admitted tickets not yet used or expired never exceed
--   overbook × (remaining units + units in live holds), rounded up; kept in thousandths
--   (1500: the default 1.5). NULL on rows declared before it: the default.
-- - `queue_version`: every declare that carries a queue adds one. Each gateway writes the
--   settings it read from here into Redis every few seconds; Redis keeps the highest version
--   it was given, so a gateway that read the row before an operator's change never puts the
--   older rate back (lua/queue_config.lua).
ALTER TABLE skus ADD COLUMN queue_overbook_milli integer;
ALTER TABLE skus ADD COLUMN queue_version bigint NOT NULL DEFAULT 0;
-- - `queue_page`: how the waiting page looks and where it hands an admitted visitor back
--   (JSON: return_url, site_name, colour, background, logo; docs/waiting-room.md "The page").
ALTER TABLE skus ADD COLUMN queue_page text;
