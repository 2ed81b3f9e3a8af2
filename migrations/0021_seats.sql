-- Reserved seating (API.md, "Reserved seating"; docs/seats.md).
--
-- `skus.seats`: a seated SKU's plan as declared (sections -> rows -> seat counts, in order of
-- quality), JSON as text; null for a general-admission SKU.
ALTER TABLE skus ADD COLUMN seats text;
-- `issuances.seats`: the seat ids a claim on a seated SKU holds; null otherwise.
ALTER TABLE issuances ADD COLUMN seats text[];
ALTER TABLE persistence_pending ADD COLUMN seats text[];

-- The second line of defence of I1 for seats: one row per seat of a live claim, unique per
-- (sku, seat). Redis decides who gets a seat; this refuses a second live claim of the same seat
-- whatever Redis did (a rollback, a restore gone wrong). Kept by the trigger below in the very
-- transaction that writes the claim, so no writer path can forget it. A claim leaves it when it
-- stops being live (cancelled, expired, compensated).
CREATE TABLE issuance_seats (
    sku      text NOT NULL,
    seat     text NOT NULL,
    claim_id uuid NOT NULL,
    PRIMARY KEY (sku, seat)
);
CREATE INDEX issuance_seats_claim ON issuance_seats (claim_id);

CREATE FUNCTION issuance_seats_keep() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.seats IS NULL THEN
        RETURN NEW;
    END IF;
    IF NEW.status IN ('issued', 'held', 'confirmed') THEN
        IF TG_OP = 'INSERT' OR OLD.status NOT IN ('issued', 'held', 'confirmed') THEN
            -- A seat already held by another live claim: unique_violation, the row is refused.
            INSERT INTO issuance_seats (sku, seat, claim_id)
            SELECT NEW.sku, s, NEW.claim_id FROM unnest(NEW.seats) AS s;
        END IF;
    ELSE
        DELETE FROM issuance_seats WHERE claim_id = NEW.claim_id;
    END IF;
    RETURN NEW;
END $$;

-- Only rows that carry seats call the function: a general-admission winner pays nothing.
CREATE TRIGGER issuance_seats_keep
    AFTER INSERT OR UPDATE OF status ON issuances
    FOR EACH ROW WHEN (NEW.seats IS NOT NULL) EXECUTE FUNCTION issuance_seats_keep();
