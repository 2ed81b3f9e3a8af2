//! dropgate: a flash-sale inventory gateway.
//!
//! # Map
//!
//! - [`http`]: hyper front end, routing, and the one place errors become problem+json.
//! - [`auth`]: admission tokens (JWT HS256) and the admin token.
//! - [`catalog`]: SKUs in PostgreSQL, cached in process (unknown SKU = 404, no Redis trip).
//! - [`claims`]: the decision: mint a claim id, coalesce same-SKU claims, one Lua call,
//!   resolve a timed-out call by reading.
//! - [`scripts`] and `lua/`: the Lua scripts and their typed wrappers; [`keys`] names the keys.
//! - [`store`]: Redis connections (multiplexed hot path, bb8 pool for background readers).
//! - [`writer`]: the journal (a Redis Stream; `writer/journal.rs` is the one parser of its
//!   entries) to `issuances`, batched (`writer/postgres.rs`); refused rows to `persistence_pending`;
//!   entries no table takes to the quarantine (`writer/quarantine.rs`); a batch that met a
//!   transient error held in memory and retried first; consumer names of stopped gateways
//!   removed (`writer/consumers.rs`).
//! - [`reprocess`]: retries parked rows (`reprocess/rows.rs`: the PostgreSQL side); after the
//!   last attempt records the compensation in `issuances`, then gives the units back, once.
//! - [`error`]: infrastructure errors per boundary; PostgreSQL errors classified by SQLSTATE
//!   (transient, the row refused, other).
//! - [`inventory`]: declare, restock, restore; [`ledger`]: the SKU view (accounting), claim
//!   lookup, the reconcile table.
//! - [`config`], [`db`], [`metrics`], [`app`] (build, bind, run), [`cli`] (subcommands).
//!
//! # The path of a claim
//!
//! `POST /v1/skus/{sku}/claims` → [`http`] checks the token, the body and the SKU (catalog
//! cache) → [`claims::ClaimService::claim`] mints a UUIDv7 and queues on the SKU's lane → one
//! `claim.lua` call decides the lane's queued claims: idempotency record, per-user count,
//! stock, decrement, and a journal entry, atomically (a call that gets no answer is settled
//! by `resolve_claim.lua`, reading) → 201/409/422 → the [`writer`] reads the journal, inserts
//! into `issuances`, then acknowledges the entry; a row PostgreSQL refuses is parked for the
//! [`reprocess`] loop.
#![forbid(unsafe_code)]

pub mod app;
pub mod auth;
pub mod catalog;
pub mod claims;
pub mod cli;
pub mod config;
pub mod db;
pub mod demo;
pub mod error;
pub mod http;
pub mod inventory;
pub mod keys;
pub mod ledger;
pub mod metrics;
pub mod reprocess;
pub mod scripts;
pub mod store;
pub mod writer;
