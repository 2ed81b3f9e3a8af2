//! dropgate: a flash-sale inventory gateway.
//!
//! # Layers
//!
//! The map of the modules, one layer at a time from the ground up. Each module is in one layer
//! and imports only from its own layer and the layers listed before it; `tests/layers.rs`
//! reads this list (the one table of the layers) and fails on an import that runs up, or on
//! modules that import each other round a circle. docs/layers.md says why each one sits where
//! it does.
//!
//! 1. **core** ([`auth`], [`clock`], [`config`], [`error`], [`ids`], [`keys`], [`layout`],
//!    [`metrics`], [`pace`], [`record`], [`repeats`], [`seating`], [`sku`], [`startup`],
//!    [`status`]): the
//!    domain's words and rules, with no Redis or PostgreSQL call.
//!    - [`sku`]: a catalog SKU's id, a type of its own ([`sku::SkuId`], checked once at the
//!      edge), so it cannot be mistaken for a shard's Redis name ([`keys::ShardName`]).
//!    - [`ids`]: claim, call and entry ids carry their SKU's tag, so a claim is found by id
//!      alone before the writer has it; a claim's id is its call's id and its index in it.
//!    - [`status`]: the one lifecycle table of claim, waitlist-entry and ticket states and
//!      their allowed steps (docs/lifecycle.md); [`record`]: a winner's record in full.
//!    - [`keys`]: the Redis key names (every key of a SKU shares its hash tag) and the
//!      journal's consumer group; [`layout`]: a SKU's shards (count, placement salts, names)
//!      and which shard a buyer's claims go to.
//!    - [`error`]: infrastructure errors per boundary, PostgreSQL's classified by SQLSTATE,
//!      and an operator's refusals; [`config`]; [`startup`]: start-up failures said once,
//!      without passwords, and their exit statuses; [`auth`]: admission and visitor tokens
//!      (JWTs: HS256 secrets by `kid`, public keys of a JWKS file) and the admin token.
//!    - [`seating`]: reserved seating's plan (sections, rows, seat counts), seat ids and their
//!      bits in a seated SKU's seat map (docs/seats.md).
//!    - [`metrics`]: every metric's name, registered once, and their recorders; [`clock`]:
//!      this gateway's milliseconds; [`pace`]: the retry pace of background loops
//!      (exponential backoff); [`repeats`]: a background task's repeated warnings, logged
//!      when a fault starts or changes, then at most every 10 s, and once when it ends.
//! 2. **stores** ([`activity`], [`catalog`], [`db`], [`freshness`], [`journal`], [`queue`],
//!    [`scripts`], [`seatmaps`], [`store`]): Redis and PostgreSQL, and what reads or writes
//!    one SKU's state in them.
//!    - [`scripts`] and `lua/`: the Lua scripts, loaded once, and a typed wrapper for each
//!      (the only place that knows a script's KEYS and ARGV order).
//!    - [`store`]: Redis connections, on a single Redis (multiplexed hot path, bb8 pool for
//!      background readers) or a Redis Cluster; the replicas a decision waits for (`WAIT`),
//!      the ledger's marks this gateway sends as floors, its marks of active SKUs.
//!    - [`seatmaps`]: each seated SKU's seat map as this gateway last read it (at most a
//!      second old, one Redis read a half second whatever the number of readers).
//!    - [`db`]: the ledger's pool and the request path's, kept apart; [`catalog`]: SKUs in
//!      PostgreSQL, cached in process (unknown SKU = 404, no Redis trip).
//!    - [`journal`]: a SKU's journal (a Redis Stream), read and acknowledged in a consumer
//!      group, an entry's layout and its one parser, the writer's wake-up.
//!    - [`activity`]: the active set, the SKUs with background work: marked with every script
//!      call that can give them some, retired when idle and empty, found again by a slow
//!      catalog walk, so an idle SKU costs nothing however large the catalog.
//!    - [`freshness`]: the state sequence and incarnation against the ledger's marks of both:
//!      a Redis that came back with older data is refused by every script that would move it,
//!      and closed until restore (`lua/lib/fresh.lua`, docs/freshness.md).
//!    - [`queue`]: the waiting room of a SKU declared with a `queue`: tickets, the pre-queue's
//!      order from a committed seed, the leased admission worker, the admission tokens; every
//!      ticket recorded in PostgreSQL from the line's log, a line older than the record
//!      refused, a restore's rebuild of the line.
//! 3. **shards** ([`shards`]): one hot SKU spread over several Redis SKUs: units borrowed
//!    between shards by fenced transfers, transfers left half done finished by a task in every
//!    gateway, one waitlist line per shard fed in ticket order, the shards summed for the view,
//!    their salts chosen so the shards sit on different masters of a cluster.
//! 4. **decisions** ([`claims`], [`lifecycle`], [`settle`], [`soldout`]): what Redis decides
//!    for a buyer, each decision one script call on Redis's clock.
//!    - [`claims`]: coalesce same-SKU claims into calls, one Lua call each, a call that got no
//!      answer resolved by reading, a SKU whose last call got none read before its next.
//!    - [`soldout`]: SKUs Redis said have no stock, refused from memory until a script
//!      publishes that units came back (at most 100 ms stale); [`settle`]: keeps reading back
//!      the claims whose outcome stayed unknown until each is won or fenced.
//!    - [`lifecycle`]: holds (confirm, cancel), the waitlist, the expiry worker, and a claim
//!      found by id in Redis or in the ledger.
//! 5. **ledger** ([`books`], [`ledger`]): the SKU view: [`books`] reads both stores at one
//!    instant (a journal entry already written counts once, a restock half done counts as
//!    Redis has it; docs/ledger-view.md); [`ledger`] turns readings into the view and the
//!    reconcile table.
//! 6. **operator** ([`inventory`], [`restore`]): declare and restock (each under the SKU's
//!    operator lock, a lost answer read back, never sent twice), and restore: the SKU's Redis
//!    state rebuilt from the ledger, in chunks.
//! 7. **delivery** ([`outbox`], [`reprocess`], [`writer`]): decisions delivered.
//!    - [`writer`]: journal entries to `issuances` in batches, refused rows to
//!      `persistence_pending`, entries no table takes to the quarantine, a hold's change held
//!      back until its win is written (by the journal's order, never a clock).
//!    - [`reprocess`]: retries parked rows; after the last attempt records the compensation,
//!      then gives the units back, once.
//!    - [`outbox`]: claim events written in the ledger's own transactions (the writer's
//!      `claim.won` is its `issuances` row, read past a cursor; the rest are `outbox` rows),
//!      relayed to NATS JetStream by one leading relay (every gateway runs one, ready to lead);
//!      `dropgate events tail`.
//! 8. **observe** ([`live`], [`observe`]): what an operator watches that no request produces:
//!    the per-SKU and backend gauges, each SKU's fail-closed transitions logged once
//!    ([`observe`]); the live drop page's data, once a second ([`live`]).
//! 9. **http** ([`http`]): hyper front end, the route table (described by
//!    `docs/openapi.json`), what a client may hold, the state every handler shares, and the
//!    one place errors become problem+json.
//! 10. **app** ([`app`], [`cli`], [`demo`]): build, bind and run a gateway ([`app`]); the
//!     subcommands ([`cli`]); `dropgate demo`, a whole drop through a gateway of its own.
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
//! [`journal`], turns each entry into its winners, inserts them into `issuances` (each row
//! stamped with its transaction's id: that row is the claim's `claim.won`), then acknowledges
//! the entry once; a row PostgreSQL refuses is parked for the [`reprocess`] loop → the
//! [`outbox`] relay reads the row past its cursor and publishes the event to JetStream. On a SKU with holds the winner is `held`
//! until `POST /v1/claims/{id}/confirm` or `/cancel` ([`lifecycle`]) or the expiry worker ends
//! it; the change is journaled by its script and written by the same writer, and units that come
//! back go to the waitlist's head as offers before open stock.
#![forbid(unsafe_code)]

// 1. core
pub mod auth;
pub mod clock;
pub mod config;
pub mod error;
pub mod ids;
pub mod keys;
pub mod layout;
pub mod metrics;
pub mod pace;
pub mod record;
pub mod repeats;
pub mod seating;
pub mod seatmaps;
pub mod sku;
pub mod startup;
pub mod status;

// 2. stores
pub mod activity;
pub mod catalog;
pub mod db;
pub mod freshness;
pub mod journal;
pub mod queue;
pub mod scripts;
pub mod store;

// 3. shards
pub mod shards;

// 4. decisions
pub mod claims;
pub mod lifecycle;
pub mod settle;
pub mod soldout;

// 5. ledger
pub mod books;
pub mod ledger;

// 6. operator
pub mod inventory;
pub mod restore;

// 7. delivery
pub mod outbox;
pub mod reprocess;
pub mod writer;

// 8. observe
pub mod live;
pub mod observe;

// 9. http
pub mod http;

// 10. app
pub mod app;
pub mod cli;
pub mod demo;
