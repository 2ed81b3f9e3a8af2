-- A parked claim's lifecycle, so that its events can be told in order when it leaves
-- persistence_pending (src/reprocess/rows.rs): whether it is a waitlist offer (its creation is
-- `waitlist.offered`, not `claim.won`), and when its hold changed while parked (the time of the
-- change's event).
ALTER TABLE persistence_pending ADD COLUMN offer boolean NOT NULL DEFAULT false;
ALTER TABLE persistence_pending ADD COLUMN claim_status_at timestamptz;
