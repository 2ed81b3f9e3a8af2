//! The waiting room in front of a SKU declared with a `queue` (API.md, "Waiting room";
//! docs/waiting-room.md): visitors join with a visitor token and get a ticket, the pre-queue is
//! put in an order anyone can recompute from a seed committed in advance, a leased worker
//! admits the line's head at the set rate while the SKU has units, and an admitted ticket reads
//! an admission token bound to the SKU and the ticket. The claim route of such a SKU takes only
//! those tokens (403 `not_admitted`).
//!
//! - [`calls`]: the typed wrappers of the queue's scripts (`lua/lib/queue.lua` and the four
//!   `lua/*queue*.lua`, `lua/read_ticket.lua`); [`admit`]: the admission worker;
//!   [`order`]: ticket ids, the shuffle key and the seed's commitment (what an auditor
//!   recomputes); [`tickets`]: every ticket recorded in PostgreSQL from the line's log, and the
//!   line's mark an older line is refused by; [`rebuild`]: a restore's rebuild of the line.
//!
//! Redis holds the queue in the SKU's own hash tag (one Cluster slot with its stock): per
//! waiting ticket one member of the line (16 bytes and its order), nothing else.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::postgres::PgRow;
use sqlx::Row;

use crate::auth::AdmissionClaims;
use crate::sku::SkuId;
use crate::status::TicketState;

pub mod admit;
pub mod calls;
pub mod order;
pub mod page;
pub mod rebuild;
pub mod tickets;

/// Joins a visitor may make per [`JOIN_WINDOW`] on one SKU (a front end retrying a join, a
/// reload): past it, 429 `overloaded`. Per visitor, never per address.
pub const JOINS_PER_WINDOW: u32 = 5;
pub const JOIN_WINDOW: Duration = Duration::from_secs(1);
/// Bounds of the settings (checked on PUT).
pub const MAX_ADMIT_PER_SECOND: i64 = 100_000;
pub const MIN_ADMISSION_TTL: i64 = 10;
pub const MAX_ADMISSION_TTL: i64 = 24 * 3600;
pub const DEFAULT_ADMISSION_TTL: i64 = 120;
/// Admitted tickets not yet used or expired per unit that can still be sold (API.md).
pub const DEFAULT_OVERBOOK: f64 = 1.5;
pub const DEFAULT_OVERBOOK_MILLI: i32 = 1500;
pub const MAX_OVERBOOK: f64 = 100.0;

/// What `queue_config.lua` writes into Redis: one version of a SKU's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisSettings {
    pub rate: i32,
    pub ttl_seconds: i32,
    /// When the pre-queue opens, unix ms (0: from the declare on).
    pub prequeue_ms: i64,
    pub overbook_milli: i32,
    pub version: i64,
}

impl From<&QueueSettings> for RedisSettings {
    fn from(q: &QueueSettings) -> Self {
        RedisSettings {
            rate: q.admit_per_second,
            ttl_seconds: q.admission_ttl_seconds,
            prequeue_ms: q.prequeue_from.map_or(0, |t| t.timestamp_millis()),
            overbook_milli: q.overbook_milli,
            version: q.version,
        }
    }
}

/// A SKU's waiting room as its catalog row holds it (`migrations/0014_queue.sql`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct QueueRow(pub Option<QueueSettings>);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueSettings {
    pub admit_per_second: i32,
    pub admission_ttl_seconds: i32,
    pub prequeue_from: Option<DateTime<Utc>>,
    /// Hex of the 32 bytes that order the pre-queue; secret until `opens_at`.
    pub seed: String,
    /// `overbook` in thousandths.
    pub overbook_milli: i32,
    /// Raised by every declare with a queue (migration 0022): Redis keeps the highest.
    pub version: i64,
    /// The waiting page's look and hand-over (`None`: the plain page).
    pub page: Option<page::PageSettings>,
}

impl<'r> sqlx::FromRow<'r, PgRow> for QueueRow {
    fn from_row(row: &'r PgRow) -> Result<Self, sqlx::Error> {
        let rate: Option<i32> = row.try_get("queue_admit_per_second")?;
        let Some(admit_per_second) = rate else {
            return Ok(QueueRow(None));
        };
        Ok(QueueRow(Some(QueueSettings {
            admit_per_second,
            admission_ttl_seconds: row
                .try_get::<Option<i32>, _>("queue_admission_ttl_seconds")?
                .unwrap_or(DEFAULT_ADMISSION_TTL as i32),
            prequeue_from: row.try_get("queue_prequeue_from")?,
            seed: row
                .try_get::<Option<String>, _>("queue_seed")?
                .unwrap_or_default(),
            overbook_milli: row
                .try_get::<Option<i32>, _>("queue_overbook_milli")?
                .unwrap_or(DEFAULT_OVERBOOK_MILLI),
            version: row.try_get("queue_version")?,
            page: row
                .try_get::<Option<String>, _>("queue_page")?
                .and_then(|j| serde_json::from_str(&j).ok()),
        })))
    }
}

/// The `queue` of the SKU view.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct QueueView {
    /// Tickets in line (pre-queue included); `None` when Redis cannot tell.
    pub waiting: Option<i64>,
    /// Tickets admitted so far.
    pub admitted: Option<i64>,
    pub admit_per_second: i32,
    pub admission_ttl_seconds: i32,
    /// Admitted and unused tickets per unit that can still be sold (the declare's `overbook`).
    pub overbook: f64,
    pub prequeue_from: Option<String>,
    /// SHA-256 of the seed (hex), from the declare on.
    pub seed_commitment: String,
    /// The seed (hex), from `opens_at` on; `null` before.
    pub seed: Option<String>,
}

impl QueueView {
    /// `counts`: the line, the admitted and Redis's clock (unix ms) as Redis answered them.
    /// The seed is shown from `opens_at` on by Redis's clock, the one the pre-queue closes on
    /// (`lua/join_queue.lua`): a gateway whose clock runs ahead never shows it while visitors
    /// still join the pre-queue; while Redis does not answer, it stays hidden.
    pub fn of(
        q: &QueueSettings,
        opens_at: Option<DateTime<Utc>>,
        counts: Option<(i64, i64, i64)>,
    ) -> QueueView {
        let open = match (opens_at, counts) {
            (None, _) => true,
            (Some(o), Some((_, _, now_ms))) => now_ms >= o.timestamp_millis(),
            (Some(_), None) => false,
        };
        QueueView {
            waiting: counts.map(|c| c.0),
            admitted: counts.map(|c| c.1),
            admit_per_second: q.admit_per_second,
            admission_ttl_seconds: q.admission_ttl_seconds,
            overbook: f64::from(q.overbook_milli) / 1000.0,
            prequeue_from: q.prequeue_from.map(|t| rfc3339(&t)),
            seed_commitment: order::commitment(&q.seed),
            seed: open.then(|| q.seed.clone()),
        }
    }
}

pub fn rfc3339(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// The admission token of an admitted ticket: for this SKU and ticket only, valid until
/// `expires_ms`, the expiry Redis fixed when it admitted the ticket (reading the ticket again
/// mints the same expiry, so polling never extends it, and a ttl changed later leaves it).
///
/// # Errors
/// The signing error (does not happen with an HMAC key).
pub fn admission_token<'a>(
    secret: impl Into<crate::auth::Signer<'a>>,
    sku: &SkuId,
    visitor: &str,
    ticket: &uuid::Uuid,
    expires_ms: i64,
) -> Result<String, jsonwebtoken::errors::Error> {
    crate::auth::sign(
        secret,
        &AdmissionClaims {
            sub: visitor.to_string(),
            exp: (expires_ms / 1000).max(0) as u64,
            sku: Some(sku.to_string()),
            scope: None,
            tid: Some(ticket.to_string()),
        },
    )
}

/// The ETA of a waiting ticket in seconds: its position over the rate actually achieved (the
/// admissions of the last ten seconds), or the set rate before there is one; before the
/// opening, the time to `opens_at` on top.
pub fn eta_seconds(r: &calls::Report, position: i64) -> Option<i64> {
    let set = f64::from(r.rate.max(0) as i32);
    let achieved = if r.window_ms >= 2000 {
        r.recent as f64 * 1000.0 / r.window_ms as f64
    } else {
        set
    };
    let rate = if achieved > 0.0 { achieved } else { set };
    if rate <= 0.0 {
        return None;
    }
    let before_open = ((r.opens_ms - r.now_ms).max(0) as f64) / 1000.0;
    Some((before_open + position as f64 / rate).ceil() as i64)
}

/// How long a visitor's page waits before reading its ticket again: soon near the head, rarely
/// far back (a million pollers must not cost more than the admissions they wait for).
pub fn poll_after_ms(state: TicketState, position: i64, eta: Option<i64>) -> u64 {
    match state {
        TicketState::Waiting => match eta {
            Some(s) if s <= 5 || position <= 10 => 500,
            Some(s) if s <= 60 => 1000,
            _ => 3000,
        },
        TicketState::Prequeue | TicketState::SoldOut => 2000,
        TicketState::Admitted | TicketState::Expired | TicketState::Closed => 5000,
    }
}
