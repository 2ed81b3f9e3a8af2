-- One relay publishes at a time: the leader, holding this row's lease (owner, expiry) and
-- renewing it once per batch (src/outbox/relay.rs). Before, every relay leased each row it
-- took (an UPDATE per event, besides the UPDATE that marks it sent): a third of what an event
-- cost PostgreSQL (loadtest/outbox-designs.sh, docs/performance.md).
--
-- A leader that stalls past its lease and publishes late sends copies of what the next leader
-- sent; JetStream drops them by `Nats-Msg-Id` within its duplicate window, as it dropped the
-- copies of a relay whose row lease had run out. Marking a row sent needs no lease: it is
-- marked only after JetStream acknowledged it, whoever published it.
CREATE TABLE outbox_leader (
    id          integer     PRIMARY KEY CHECK (id = 1),
    owner       uuid,
    lease_until timestamptz
);
INSERT INTO outbox_leader (id) VALUES (1);

ALTER TABLE outbox DROP COLUMN lease_owner, DROP COLUMN lease_until;
