-- The drop lifecycle: the sale window, holds with expiry, and the waitlist.

-- The sale window (claims before opens_at are refused not_open, at or after closes_at closed,
-- on Redis's clock) and how long a waitlist offer is held.
ALTER TABLE skus ADD COLUMN opens_at timestamptz;
ALTER TABLE skus ADD COLUMN closes_at timestamptz;
ALTER TABLE skus ADD COLUMN offer_seconds integer NOT NULL DEFAULT 0 CHECK (offer_seconds >= 0);
-- A small number per SKU carried inside every claim id and waitlist entry id the gateway mints
-- (see src/ids.rs), so a claim can be found in Redis by its id alone before the writer has
-- written it.
ALTER TABLE skus ADD COLUMN tag integer GENERATED ALWAYS AS IDENTITY UNIQUE;

-- When a held claim expires (null for claims final at once).
ALTER TABLE issuances ADD COLUMN expires_at timestamptz;

-- A parked winner keeps its lifecycle: the status the reprocessor writes it with (a hold
-- cancelled or expired while parked is written so, and its units are not counted pending).
ALTER TABLE persistence_pending ADD COLUMN claim_status text NOT NULL DEFAULT 'issued'
    CHECK (claim_status IN ('issued', 'held', 'confirmed', 'cancelled', 'expired'));
ALTER TABLE persistence_pending ADD COLUMN expires_at timestamptz;

-- The waitlist: one row per entry, written by the writer from the journal like claims.
-- `position` is the entry's join order in its SKU's line (its place in line is the number of
-- entries still waiting before it, plus one). An offer is a held claim whose id is the entry id.
CREATE TABLE waitlist (
    entry_id   uuid        PRIMARY KEY,
    sku        text        NOT NULL,
    user_id    text        NOT NULL,
    position   bigint      NOT NULL,
    status     text        NOT NULL
               CHECK (status IN ('waiting', 'offered', 'claimed', 'expired', 'left')),
    claim_id   uuid,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX waitlist_line ON waitlist (sku, position) WHERE status IN ('waiting', 'offered');
