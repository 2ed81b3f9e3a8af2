-- A journal entry now carries every winner of one claim.lua call (up to 128), so one entry may
-- put several rows in the quarantine: one per winner no table takes, each with the entry's
-- bytes. What makes a second writer's copy a no-op is now the entry and the claim; an entry
-- that could not be read at all (claim_id NULL when nothing could be made out) stays one row.
ALTER TABLE quarantine DROP CONSTRAINT quarantine_sku_entry_id_key;
ALTER TABLE quarantine ADD CONSTRAINT quarantine_entry_claim
    UNIQUE NULLS NOT DISTINCT (sku, entry_id, claim_id);
