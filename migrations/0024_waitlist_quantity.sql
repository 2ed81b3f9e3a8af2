-- A waitlist entry on a seated SKU waits for N seats (API.md "Reserved seating": the join takes
-- `{"quantity": N}`, and its offer holds the best available seats for N); a restore brings the
-- entry back with it. Every entry of a SKU without seats waits for one unit.
ALTER TABLE waitlist ADD COLUMN quantity integer NOT NULL DEFAULT 1 CHECK (quantity > 0);
