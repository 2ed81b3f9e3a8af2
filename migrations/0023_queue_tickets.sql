-- The waiting room's tickets, as durable as claims (issue 37.1, API.md "Waiting room"): every
-- join and every admission is logged in Redis in the same atomic step that makes it
-- (`{sku}:q:log`) and recorded here by a batched recorder (src/queue/tickets.rs), so a restore
-- rebuilds the line in place and state after Redis lost it or came back older.
-- - `ord`: the ticket's place in line (the pre-queue shuffle key, or 2^52 + its arrival number);
-- - `admitted_ms` / `expires_ms`: the admission and its fixed expiry (Redis's clock), the first
--   one recorded (a ticket is admitted once, I4); NULL while it waits.
CREATE TABLE queue_tickets (
    sku         text   NOT NULL,
    ticket      uuid   NOT NULL,
    visitor     text   NOT NULL,
    ord         bigint NOT NULL,
    admitted_ms bigint,
    expires_ms  bigint,
    PRIMARY KEY (sku, ticket)
);
-- The line's sequence PostgreSQL holds (every logged change has the next one): a line in Redis
-- behind it is an older copy and fails closed (lua/lib/queue.lua).
ALTER TABLE skus ADD COLUMN queue_seq bigint NOT NULL DEFAULT 0;
