//! dropgate: a flash-sale inventory gateway.
//!
//! # Map
//!
//! - [`http`]: hyper front end, the route table (`http/router.rs`, described by
//!   `http/openapi.json` at `GET /openapi.json`), what a client may hold (`http/limits.rs`:
//!   connections, header and body bounds), and the one place errors become problem+json.
//! - [`auth`]: admission tokens (JWT HS256) and the admin token.
//! - [`catalog`]: SKUs in PostgreSQL, cached in process (unknown SKU = 404, no Redis trip).
//! - [`claims`]: the decision: coalesce same-SKU claims into calls, mint each call's id (its
//!   claims' ids derive from it), one Lua call, resolve a call that got no answer by reading,
//!   and ask a SKU whose last call got no answer a read before its next call (`claims/call.rs`).
//! - [`lifecycle`]: holds (confirm, cancel: `lifecycle/holds.rs`), the waitlist
//!   (`lifecycle/waitlist.rs`), the expiry worker (`lifecycle/expiry.rs`) and restore's part of
//!   them (`lifecycle/restore.rs`), the one lifecycle table of claim and entry statuses and
//!   their allowed transitions (`lifecycle/status.rs`, docs/lifecycle.md); each decision one
//!   script call on Redis's clock, journaled like a win. [`ids`]: claim and entry ids carry
//!   their SKU's tag, so a claim is found by id alone before the writer has it; a claim's id is
//!   its call's id and its index in the call.
//! - [`soldout`]: the sold-out fast path: SKUs Redis said have no stock, refused from
//!   memory until a script publishes that units came back (at most 100 ms stale).
//! - [`settle`]: keeps reading back the claims whose outcome stayed unknown (503
//!   `outcome_unknown`) until each is won or fenced.
//! - [`freshness`]: the state sequence and incarnation, and the ledger's marks of both: a Redis
//!   that came back with older data is refused by every script that would move it, per SKU,
//!   and closed until restore (`lua/lib/fresh.lua`, docs/freshness.md).
//! - [`scripts`] and `lua/`: the Lua scripts and their typed wrappers; [`keys`] names the keys;
//!   [`record`] is a winner's record in full (idempotency record, an entry of one winner).
//! - [`store`]: Redis connections, on a single Redis (multiplexed hot path, bb8 pool for
//!   background readers) or a Redis Cluster (cluster connections); [`replicas`]: how many
//!   replicas a decision waits for (`WAIT`) before it is answered, per master.
//! - [`writer`]: the journal (a Redis Stream; `writer/journal.rs` is the one parser of its
//!   entries) to `issuances`, batched (`writer/postgres.rs`); refused rows to `persistence_pending`;
//!   entries no table takes to the quarantine (`writer/quarantine.rs`); a batch that met a
//!   transient error held in memory and retried first; a hold's change read before its win
//!   is written waits for it by the journal's order, never a clock (`writer/order.rs`;
//!   docs/lifecycle-writer.md); consumer names of stopped gateways removed
//!   (`writer/consumers.rs`).
//! - [`activity`]: the active set, the SKUs with background work (journal entries, holds, a
//!   waitlist): marked with every script call that can give them some, retired when idle and
//!   empty, found again by a slow catalog walk; the writer and the expiry worker serve only
//!   these, so an idle SKU costs nothing however large the catalog.
//! - [`reprocess`]: retries parked rows (`reprocess/rows.rs`: the PostgreSQL side); after the
//!   last attempt records the compensation in `issuances`, then gives the units back, once.
//! - [`outbox`]: claim events for the order system: rows of `outbox` written in the ledger's
//!   own transactions (`outbox/events.rs`: kinds, body, subject; `outbox/store.rs`), relayed
//!   to NATS JetStream by a leased, fenced relay in every gateway (`outbox/relay.rs`,
//!   `outbox/jetstream.rs`); `dropgate events tail` (`outbox/tail.rs`).
//! - [`error`]: infrastructure errors per boundary; PostgreSQL errors classified by SQLSTATE
//!   (transient, the row refused, other).
//! - [`inventory`]: declare, restock (each under the SKU's operator lock); [`restore`]: the
//!   SKU's Redis state rebuilt from the ledger, in chunks; [`ledger`]: the SKU view
//!   (accounting), claim lookup, the reconcile table.
//! - [`observe`]: what an operator watches that no request produces: the per-SKU gauges
//!   (`dropgate_sku_*`) and the backends' `_up` gauges, refreshed by a periodic task at a
//!   bounded cost per round, and each SKU's fail-closed transitions logged once;
//!   [`repeats`]: a background task's repeated warnings, logged when a fault starts or
//!   changes, then at most every 10 s with a count, and once when it ends; [`pace`]: the
//!   retry pace of background loops and of parked claims (exponential backoff, `backon`).
//! - [`live`]: the live drop page's data (`/admin/live`, served by `http/live.rs`): per-SKU
//!   claim counts of this gateway, rates, p99, journal lag, the SKU view, once a second.
//! - [`shards`]: one hot SKU spread over several Redis SKUs (`sku`, `sku#1`, ...): buyers
//!   routed by a stable hash of the user id, units borrowed between shards by fenced
//!   transfers (`shards/transfer.rs`, `shards/borrow.rs`), transfers left half done finished
//!   by a task in every gateway (`shards/recovery.rs`), which also feeds the waitlists
//!   (`shards/feed.rs`: units given back under a line lease wait in the shard's pool and are
//!   offered across the lines in ticket order; `shards/line.rs`: a line per shard, joined by
//!   the buyers routed there with a ticket from shard 0), the shards summed for the SKU view
//!   (`shards/view.rs`), each shard's high-water mark (`shards/marks.rs`); every shard's name
//!   built from the catalog row's layout (`shards/layout.rs`: count and placement salts),
//!   the salts chosen at the first declare on a cluster so the shards sit on different
//!   masters (`shards/placement.rs`).
//! - [`queue`]: the waiting room of a SKU declared with a `queue`: tickets, the pre-queue's
//!   order from a committed seed (`queue/order.rs`), the leased admission worker
//!   (`queue/admit.rs`), the admission tokens the claim route of such a SKU requires.
//! - [`config`], [`db`] (the ledger's pool and the request path's, kept apart), [`metrics`],
//!   [`app`] (build, bind, run), [`cli`] (subcommands), [`startup`] (start-up failures said
//!   once, without passwords, and their exit statuses).
//! - [`demo`]: `dropgate demo`, a whole drop on this machine through a gateway of its own.
//! - [`books`]: the SKU view's one reading of both stores (`lua/read_books.lua` between two
//!   Redis reads, one PostgreSQL snapshot): a journal entry already written counts once, a
//!   restock half done counts as Redis has it; `unwritten_entries` (docs/ledger-view.md).
//!
//! # The path of a claim
//!
//! `POST /v1/skus/{sku}/claims` → [`http`] checks the token, the body and the SKU (catalog
//! cache) → [`claims::ClaimService::claim`] refuses a SKU known sold out from memory
//! ([`soldout`]), or queues on the SKU's lane → the lane forms a call of up to 128 queued
//! claims and mints its id ([`ids::mint_call`]; claim i's id is [`ids::claim_in`]) → one
//! `claim.lua` call decides them: the call's fence, idempotency records, per-user counts, stock,
//! decrement, one record of the call's winners and one journal entry carrying them all,
//! atomically, unless the state is behind the ledger's mark (stale: 503) (a call that gets no
//! answer is settled by `resolve_claim.lua`, reading the call's record or fencing the call;
//! when even that gets no answer, 503 `outcome_unknown` with the claim id and the [`settle`]
//! task goes on) → 201/409/422, the claim id learned from the lane → the [`writer`] reads the
//! journal, turns each entry into its winners, inserts them into `issuances` (and, in the same
//! statement, their `claim.won` into `outbox`), then acknowledges the entry once; a row
//! PostgreSQL refuses is parked for the [`reprocess`] loop → the [`outbox`] relay publishes the
//! event to JetStream. On a SKU with holds the winner is `held`
//! until `POST /v1/claims/{id}/confirm` or `/cancel` ([`lifecycle`]) or the expiry worker ends
//! it; the change is journaled by its script and written by the same writer, and units that come
//! back go to the waitlist's head as offers before open stock.
#![forbid(unsafe_code)]

pub mod activity;
pub mod app;
pub mod auth;
pub mod books;
pub mod catalog;
pub mod claims;
pub mod cli;
pub mod config;
pub mod db;
pub mod demo;
pub mod error;
pub mod freshness;
pub mod http;
pub mod ids;
pub mod inventory;
pub mod keys;
pub mod ledger;
pub mod lifecycle;
pub mod live;
pub mod metrics;
pub mod observe;
pub mod outbox;
pub mod pace;
pub mod queue;
pub mod record;
pub mod repeats;
pub mod replicas;
pub mod reprocess;
pub mod restore;
pub mod scripts;
pub mod settle;
pub mod shards;
pub mod soldout;
pub mod startup;
pub mod store;
pub mod writer;
