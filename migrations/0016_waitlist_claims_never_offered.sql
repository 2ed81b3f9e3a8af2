-- Before this release the writer gave an entry whose first written record was its end (its
-- leave, or its end at the per-user limit, written before its join by another gateway's
-- writer) a `claim_id`, though it was never offered: `GET /v1/waitlist/{entry}` then named a
-- claim that never existed (docs/lifecycle.md, "Entry steps"). An entry names a claim only if
-- its offer's record was written, and that record is written with the offer's win, so a claim
-- id that no table holds was never an offer's. An offer whose win is still unwritten gets its
-- claim id back when its record arrives (src/writer/lifecycle.rs, APPLY_WAITS).
UPDATE waitlist w
   SET claim_id = NULL
 WHERE w.status IN ('expired', 'left')
   AND w.claim_id IS NOT NULL
   AND NOT EXISTS (SELECT 1 FROM issuances i WHERE i.claim_id = w.claim_id)
   AND NOT EXISTS (SELECT 1 FROM persistence_pending p WHERE p.claim_id = w.claim_id)
   AND NOT EXISTS (SELECT 1 FROM quarantine q WHERE q.claim_id = w.claim_id);
