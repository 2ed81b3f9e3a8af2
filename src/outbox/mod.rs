//! Claim events for the order system: a transactional outbox relayed to NATS JetStream.
//!
//! - **Recorded with the change.** Each event is written by the same transaction as the ledger
//!   change it describes. `claim.won` (or `waitlist.offered`) of the journal writer is the
//!   `issuances` row itself: the writer's insert stamps the rows it actually inserts with its
//!   transaction's id (`won_xid`), so a redelivered journal entry produces none, and no event
//!   row is written, leased, marked or trimmed for it ([`cursor`]). Every other event is a row
//!   of `outbox`: a hold's change by the writer's update of its `issuances` row; a parked
//!   claim's whole life so far (its creation with the status it won with, the change of its
//!   hold while parked) by the reprocessor's transaction that writes it, or that closes it as
//!   compensated, followed there by `claim.compensated` (every claim's events begin with its
//!   creation). Nothing is published from the claim path ([`events`], [`store`]).
//! - **Relayed by one leader** ([`relay`]). Every gateway runs a relay; the one holding the
//!   lead (a lease on one row, renewed once per batch) publishes, each batch, first the
//!   writer's creation events past the cursor (in transaction-id order, only below the oldest
//!   transaction still running, so nothing can commit behind the cursor), then a batch of
//!   unsent `outbox` rows, in order, with the event id as `Nats-Msg-Id`; it awaits the
//!   acknowledgements, then moves the cursor over the acknowledged creation events and marks
//!   the acknowledged rows sent. A leader that dies or stalls loses the lead when its lease
//!   runs out; the next one publishes from the cursor and the unsent rows again and
//!   JetStream's duplicate window drops the copies (the cursor only moves forward). A claim's
//!   event is taken only once its earlier events are published (its creation at or below the
//!   cursor, its earlier rows sent), so each claim's events reach the stream in order whichever
//!   relay leads. (Rows were leased one by one before: an UPDATE per event, a third of its
//!   cost to PostgreSQL; `migrations/0015_outbox_leader.sql`; the cursor:
//!   `migrations/0017_outbox_cursor.sql`.)
//! - **NATS down** costs the claim path nothing: events wait in PostgreSQL, the backlog (unsent
//!   rows and creation events past the cursor) shows in `/readyz` (`outbox`) and `/metrics`,
//!   and drains in order when NATS is back.
//! - `dropgate events tail` ([`tail`]) is the example consumer.

use std::sync::atomic::{AtomicI64, AtomicU8, Ordering};
use std::time::Duration;

use serde::Serialize;

use crate::error::DbError;

pub mod cursor;
pub mod events;
pub mod held_back;
pub mod jetstream;
pub mod relay;
pub mod store;
pub mod tail;

pub use events::{EventKind, OutboxRow};
pub use relay::Relay;
pub use store::{record, NewEvent};

/// How long a relay's lead lasts unless renewed. Longer than one batch can take (its sends,
/// then [`jetstream::ACK_TIMEOUT`] for the acknowledgements), shorter than anyone should wait
/// for a dead gateway's events.
pub const LEASE: Duration = Duration::from_secs(10);

/// A relay's failure. Every one leaves the rows unsent (or acknowledged and to be marked), to
/// be tried again.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error(transparent)]
    Db(#[from] DbError),
    /// The NATS connection is down (the client keeps reconnecting).
    #[error("nats is unreachable")]
    Unreachable,
    /// JetStream answered that no stream takes the subject (deleted, or never created).
    #[error("no JetStream stream takes the event subjects")]
    NoStream,
    /// Finding or creating the stream failed.
    #[error("jetstream stream: {0}")]
    Stream(String),
    /// A publish or its acknowledgement failed (timed out, connection lost).
    #[error("publish: {0}")]
    Publish(String),
    /// The NATS address cannot be used at all.
    #[error("nats configuration: {0}")]
    Config(String),
}

impl RelayError {
    /// Whether the same work may succeed later without anyone changing the configuration.
    pub fn is_retryable(&self) -> bool {
        match self {
            RelayError::Db(e) => e.is_retryable(),
            RelayError::Unreachable | RelayError::Publish(_) => true,
            // A stream may be created (by this relay, next round) or fixed by an operator.
            RelayError::NoStream | RelayError::Stream(_) => true,
            RelayError::Config(_) => false,
        }
    }
}

/// How the relay of this gateway is doing, for `/readyz`. Written by the relay, read by
/// requests: atomics, never a lock on the request path.
pub struct OutboxStatus {
    /// Unsent events of all gateways at the last sample; -1 before the first.
    backlog: AtomicI64,
    /// Age of the oldest unsent event in ms at the last sample; -1 when none.
    oldest_ms: AtomicI64,
    nats: AtomicU8,
    /// The transaction the relay waits for, at the last sample ([`held_back`]); only
    /// `/readyz` reads it.
    held_back: parking_lot::Mutex<Option<held_back::HeldBack>>,
}

/// The state of the relay's NATS side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum NatsState {
    /// `DROPGATE_NATS_URL` is not set: events wait in the outbox.
    NotConfigured = 0,
    /// The last round published (or had nothing to publish).
    Ok = 1,
    /// Not connected; the client keeps reconnecting.
    Unreachable = 2,
    /// Connected, and publishing fails (no stream, no acknowledgements).
    Failing = 3,
}

impl NatsState {
    pub fn as_str(self) -> &'static str {
        match self {
            NatsState::NotConfigured => "not_configured",
            NatsState::Ok => "ok",
            NatsState::Unreachable => "unreachable",
            NatsState::Failing => "failing",
        }
    }
}

/// What `/readyz` shows under `outbox`. Readiness never depends on it: a gateway with NATS
/// down still takes claims.
#[derive(Debug, Serialize)]
pub struct OutboxReport {
    pub backlog: Option<i64>,
    pub oldest_unsent_seconds: Option<f64>,
    pub nats: &'static str,
    /// The oldest transaction of the PostgreSQL server that the next event waits for, when it
    /// has waited at least [`HELD_BACK_SHOWN_AFTER_SECS`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_back_by: Option<held_back::HeldBack>,
}

/// A writer's own transactions hold the next event back for milliseconds; a transaction older
/// than this is news.
pub const HELD_BACK_SHOWN_AFTER_SECS: f64 = 1.0;

impl Default for OutboxStatus {
    fn default() -> Self {
        OutboxStatus {
            backlog: AtomicI64::new(-1),
            oldest_ms: AtomicI64::new(-1),
            nats: AtomicU8::new(NatsState::NotConfigured as u8),
            held_back: parking_lot::Mutex::new(None),
        }
    }
}

impl OutboxStatus {
    pub fn report(&self) -> OutboxReport {
        let backlog = self.backlog.load(Ordering::Relaxed);
        let oldest = self.oldest_ms.load(Ordering::Relaxed);
        let nats = match self.nats.load(Ordering::Relaxed) {
            1 => NatsState::Ok,
            2 => NatsState::Unreachable,
            3 => NatsState::Failing,
            _ => NatsState::NotConfigured,
        };
        OutboxReport {
            backlog: (backlog >= 0).then_some(backlog),
            oldest_unsent_seconds: (oldest >= 0).then(|| oldest as f64 / 1000.0),
            nats: nats.as_str(),
            held_back_by: self.held_back.lock().clone(),
        }
    }

    fn set_held_back(&self, by: Option<held_back::HeldBack>) {
        *self.held_back.lock() = by;
    }

    fn set_backlog(&self, events: i64, oldest: Option<f64>) {
        self.backlog.store(events, Ordering::Relaxed);
        let ms = oldest.map_or(-1, |s| (s.max(0.0) * 1000.0) as i64);
        self.oldest_ms.store(ms, Ordering::Relaxed);
    }

    fn set_nats(&self, state: NatsState) {
        self.nats.store(state as u8, Ordering::Relaxed);
    }
}
