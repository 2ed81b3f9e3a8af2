-- Claim events for the order system: a transactional outbox.
--
-- Each row is written in the same transaction as the ledger change it describes (claim.won with
-- the issuances insert, claim.compensated with the compensation record), so an event exists if
-- and only if its change committed. The relay (src/outbox/) publishes unsent rows to NATS
-- JetStream and sets sent_at after the publish acknowledgement; sent rows are deleted after
-- the retention period.

CREATE TABLE outbox (
    -- Insert order; the relay reads unsent rows in this order.
    id          bigserial   PRIMARY KEY,
    claim_id    uuid        NOT NULL,
    -- The event's place in its claim's life: 1 for the event that creates the claim
    -- (claim.won, waitlist.offered), 2 for the one that ends it (confirmed, cancelled,
    -- expired, compensated). (claim_id, seq) is the event's identity, and its id on the wire.
    seq         integer     NOT NULL CHECK (seq >= 1),
    event       text        NOT NULL
                CHECK (event IN ('claim.won', 'claim.confirmed', 'claim.cancelled',
                                 'claim.expired', 'waitlist.offered', 'claim.compensated')),
    sku         text        NOT NULL,
    user_id     text        NOT NULL,
    quantity    integer     NOT NULL,
    -- The claim's status right after the event.
    status      text        NOT NULL,
    -- When the transition happened (claim.won: when Redis decided the claim).
    occurred_at timestamptz NOT NULL,
    -- When the row was written; the relay measures its lag (written to acknowledged) from it.
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- The relay that took the row, and until when; after that another relay may take it. A
    -- relay marks a row sent only while it is still the row's lease owner (the fence).
    lease_owner uuid,
    lease_until timestamptz,
    -- Set once JetStream acknowledged the publish.
    sent_at     timestamptz,
    UNIQUE (claim_id, seq)
);
-- What the relay scans (unsent, in id order) and what the backlog counts.
CREATE INDEX outbox_unsent ON outbox (id) WHERE sent_at IS NULL;
-- What the retention trim deletes.
CREATE INDEX outbox_sent ON outbox (sent_at) WHERE sent_at IS NOT NULL;

-- Wakes the relays of every gateway when events commit (NOTIFY is delivered at commit, and
-- folded to one per transaction), so an event waits for no poll interval.
CREATE FUNCTION outbox_notify() RETURNS trigger AS $$
BEGIN
  PERFORM pg_notify('dropgate_outbox', '');
  RETURN NULL;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
  FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();
