//! The claim events an order system receives: their kinds, their JSON body and their subject.
//!
//! A claim's events form its life: one event creates it (`claim.won`, or `waitlist.offered`
//! for a waitlist offer), with the status it won with (`issued`, or `held` for a hold); then
//! one event per later change, in order: a hold's end (`claim.confirmed`, `claim.cancelled`,
//! `claim.expired`), and `claim.compensated` when a claim PostgreSQL refused for good is given
//! back (after the hold's change, if it had one while parked). The per-claim sequence is that
//! place: 1 for the creation, then 2, 3. The status of a claim's last event is its status in
//! `issuances`. A consumer that keeps the last sequence it applied per claim can drop anything
//! older, whatever reaches it.

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;
use uuid::Uuid;

use crate::status::ClaimStatus;

/// What happened to a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// Redis decided the claim for the buyer and the ledger recorded it (status `issued`, or
    /// `held` for a SKU with holds).
    Won,
    /// A held claim was confirmed.
    Confirmed,
    /// A held claim was cancelled by its owner.
    Cancelled,
    /// A hold passed its `expires_at`.
    Expired,
    /// Units that came back were offered to the head of the waitlist as a held claim.
    Offered,
    /// The claim could not be recorded and its units went back to the stock: the buyer does
    /// not have it.
    Compensated,
}

impl EventKind {
    pub const ALL: [EventKind; 6] = [
        EventKind::Won,
        EventKind::Confirmed,
        EventKind::Cancelled,
        EventKind::Expired,
        EventKind::Offered,
        EventKind::Compensated,
    ];

    /// The name on the wire and in `outbox.event`; the last tokens of the subject.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Won => "claim.won",
            EventKind::Confirmed => "claim.confirmed",
            EventKind::Cancelled => "claim.cancelled",
            EventKind::Expired => "claim.expired",
            EventKind::Offered => "waitlist.offered",
            EventKind::Compensated => "claim.compensated",
        }
    }

    pub fn parse(s: &str) -> Option<EventKind> {
        EventKind::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// Whether the event creates its claim (its sequence is then 1).
    pub fn creates(self) -> bool {
        matches!(self, EventKind::Won | EventKind::Offered)
    }

    /// The event of a hold's change to `status` (confirmed, cancelled, expired).
    pub fn of_change(status: ClaimStatus) -> Option<EventKind> {
        match status {
            ClaimStatus::Confirmed => Some(EventKind::Confirmed),
            ClaimStatus::Cancelled => Some(EventKind::Cancelled),
            ClaimStatus::Expired => Some(EventKind::Expired),
            _ => None,
        }
    }
}

/// One outbox row, as the relay reads it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct OutboxRow {
    pub id: i64,
    pub claim_id: Uuid,
    pub seq: i32,
    pub event: String,
    pub sku: String,
    pub user_id: String,
    pub quantity: i32,
    pub status: ClaimStatus,
    pub occurred_at: DateTime<Utc>,
    /// When the row was written (the relay's lag is measured from it).
    pub created_at: DateTime<Utc>,
    /// A seated claim's seats (API.md: its events carry them); `None` otherwise.
    pub seats: Option<Vec<String>>,
}

/// The JSON body of an event (field names after CloudEvents' `id`, `type`, `time`).
#[derive(Debug, Serialize)]
pub struct EventBody<'a> {
    /// `<claim_id>:<seq>`: stable for the event's life, and its `Nats-Msg-Id`.
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'a str,
    pub claim_id: Uuid,
    pub sku: &'a str,
    pub user: &'a str,
    pub quantity: i32,
    pub status: &'a str,
    pub seq: i32,
    /// RFC 3339, UTC, milliseconds.
    pub time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seats: Option<&'a [String]>,
}

impl OutboxRow {
    /// The event's id: the same for every publish of it, so JetStream drops a redelivery.
    pub fn event_id(&self) -> String {
        event_id(self.claim_id, self.seq)
    }

    pub fn body(&self) -> EventBody<'_> {
        EventBody {
            id: self.event_id(),
            kind: &self.event,
            claim_id: self.claim_id,
            sku: &self.sku,
            user: &self.user_id,
            quantity: self.quantity,
            status: self.status.as_str(),
            seq: self.seq,
            time: self
                .occurred_at
                .to_rfc3339_opts(SecondsFormat::Millis, true),
            seats: self.seats.as_deref(),
        }
    }

    /// `<prefix>.<sku>.<event>`.
    pub fn subject(&self, prefix: &str) -> String {
        format!("{prefix}.{}.{}", sku_token(&self.sku), self.event)
    }
}

pub fn event_id(claim_id: Uuid, seq: i32) -> String {
    format!("{claim_id}:{seq}")
}

/// A SKU id as one subject token. SKU ids may hold `.` (API.md: `[A-Za-z0-9._-]`), which would
/// split the token; it is written `%2E` (a SKU id never holds `%`, so this is reversible).
pub fn sku_token(sku: &str) -> String {
    sku.replace('.', "%2E")
}

/// The subject filter of one SKU's events, or of all of them.
pub fn filter(prefix: &str, sku: Option<&str>) -> String {
    match sku {
        Some(s) => format!("{prefix}.{}.>", sku_token(s)),
        None => format!("{prefix}.>"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(sku: &str, kind: EventKind) -> OutboxRow {
        OutboxRow {
            id: 1,
            claim_id: Uuid::nil(),
            seq: if kind.creates() { 1 } else { 2 },
            event: kind.as_str().into(),
            sku: sku.into(),
            user_id: "u-1".into(),
            quantity: 2,
            status: ClaimStatus::Issued,
            occurred_at: DateTime::from_timestamp_millis(1_700_000_000_123).unwrap(),
            created_at: DateTime::from_timestamp_millis(1_700_000_000_200).unwrap(),
            seats: None,
        }
    }

    #[test]
    fn a_dotted_sku_stays_one_subject_token() {
        let r = row("drop.1", EventKind::Won);
        assert_eq!(r.subject("dropgate"), "dropgate.drop%2E1.claim.won");
        assert_eq!(filter("a.b", Some("drop.1")), "a.b.drop%2E1.>");
    }

    #[test]
    fn every_kind_round_trips_and_creation_comes_first() {
        for k in EventKind::ALL {
            assert_eq!(EventKind::parse(k.as_str()), Some(k));
        }
        assert!(EventKind::Won.creates() && EventKind::Offered.creates());
        assert!(!EventKind::Compensated.creates());
        for s in ["confirmed", "cancelled", "expired"] {
            assert_eq!(
                EventKind::of_change(s.parse().unwrap()).map(|k| k.as_str()),
                Some(&*format!("claim.{s}"))
            );
        }
        assert_eq!(EventKind::of_change(ClaimStatus::Held), None);
    }

    #[test]
    fn the_body_carries_the_stable_id_and_the_claim() {
        let r = row("s", EventKind::Won);
        let v = serde_json::to_value(r.body()).unwrap();
        assert_eq!(v["id"], format!("{}:1", Uuid::nil()));
        assert_eq!(v["type"], "claim.won");
        assert_eq!(v["user"], "u-1");
        assert_eq!(v["quantity"], 2);
        assert_eq!(v["seq"], 1);
        assert_eq!(v["time"], "2023-11-14T22:13:20.123Z");
    }
}
