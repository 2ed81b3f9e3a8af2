//! The one lifecycle of a claim, of a waitlist entry and of a waiting-room ticket: their
//! statuses, and the table of the steps between them, each with the scripts that make it in
//! Redis, the statements that record it in PostgreSQL and the event that tells it
//! (docs/lifecycle.md draws the same tables).
//!
//! The strings are the wire's, the ledger's and the scripts' (`issuances.status`,
//! `waitlist.status`, the hold and entry records of `lua/lib/lifecycle.lua`, a ticket's state
//! as `lua/lib/queue.lua` reads it, the JSON of API.md). `tests/api/lifecycle_table.rs` holds
//! the Lua scripts' status literals, the SQL CHECKs, the outbox's events, the writer's
//! statements and the ticket route's answers to this table: a status or a step that is not
//! here fails it.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A claim's status (`issuances.status`, a hold record in Redis, `GET /v1/claims/{id}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClaimStatus {
    /// Won and final at once (a SKU without holds).
    Issued,
    /// Won and held until confirmed, cancelled or expired (a SKU with holds, or an offer).
    Held,
    Confirmed,
    Cancelled,
    Expired,
    /// Never recorded (PostgreSQL refused it for good): its units went back to the stock.
    Compensated,
}

/// A waitlist entry's status (`waitlist.status`, an entry record in Redis).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EntryStatus {
    Waiting,
    /// Holds an offer: a held claim whose id is the entry's.
    Offered,
    /// Its offer was confirmed.
    Claimed,
    /// Its offer lapsed (or was cancelled or compensated), or its user reached the limit.
    Expired,
    Left,
}

/// A waiting-room ticket's state (`GET /v1/queue/{ticket_id}`, `lua/lib/queue.lua`'s
/// `q_report`). Redis alone holds a ticket (its place in the line or in the admitted set); the
/// state is read from that place, the SKU's stock and Redis's clock, so most steps are made by
/// time or by the stock, not by a write to the ticket. No ledger row, no event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TicketState {
    /// Joined before `opens_at`: in the line by its shuffle key, no position yet.
    Prequeue,
    /// In the line, with a position.
    Waiting,
    /// In the admitted set, its admission valid (or used: its visitor holds units).
    Admitted,
    /// In the line, and the SKU has no units and no hold that could give some back.
    SoldOut,
    /// Admitted, and not used within the admission's ttl.
    Expired,
    /// In the line at or after `closes_at` (Redis's clock): nobody is admitted any more.
    Closed,
}

/// The status string is none of the lifecycle's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown status {0:?}")]
pub struct UnknownStatus(pub String);

/// One step of a lifecycle. `from: None` is the creation.
#[derive(Debug, Clone, Copy)]
pub struct Step<S: 'static> {
    pub from: Option<S>,
    pub to: S,
    /// The scripts that decide it in Redis (paths from the repository's root).
    pub decided_by: &'static [&'static str],
    /// The statements that record it in PostgreSQL, as "path: const or fn".
    pub recorded_by: &'static [&'static str],
    /// The claim events that tell it (an entry's step is told by its offer's claim).
    pub events: &'static [&'static str],
}

mod steps;

pub use steps::{CLAIM_STEPS, ENTRY_STEPS, TICKET_STEPS};

/// Whether `to` is one step of `steps` from `from` (`None`: created as `to`).
fn step<S: PartialEq + Copy>(steps: &[Step<S>], from: Option<S>, to: S) -> bool {
    steps.iter().any(|s| s.from == from && s.to == to)
}

/// Whether `to` is reached from `from` by one or more steps. The ledger may record several
/// at once: a parked claim is written with the change its hold went through meanwhile, and an
/// entry whose offer's record was quarantined moves on from `waiting`.
fn reach<S: PartialEq + Copy>(steps: &[Step<S>], from: Option<S>, to: S) -> bool {
    let mut seen: Vec<S> = Vec::new();
    let mut front: Vec<Option<S>> = vec![from];
    while let Some(f) = front.pop() {
        for s in steps.iter().filter(|s| s.from == f) {
            if s.to == to {
                return true;
            }
            if !seen.contains(&s.to) {
                seen.push(s.to);
                front.push(Some(s.to));
            }
        }
    }
    false
}

macro_rules! status_enum {
    ($ty:ident, $steps:ident, [$($v:ident => $s:literal),+ $(,)?]) => {
        impl $ty {
            pub const ALL: &'static [$ty] = &[$($ty::$v),+];

            /// The string of the wire, the ledger and the scripts.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($ty::$v => $s),+
                }
            }

            /// Whether the table has the step `from` → `to` (`from: None`: created as `to`).
            pub fn allowed(from: Option<$ty>, to: $ty) -> bool {
                step($steps, from, to)
            }

            /// Whether `to` follows `from` by one or more steps of the table.
            pub fn reaches(from: Option<$ty>, to: $ty) -> bool {
                reach($steps, from, to)
            }
        }

        impl FromStr for $ty {
            type Err = UnknownStatus;

            fn from_str(s: &str) -> Result<Self, UnknownStatus> {
                match s {
                    $($s => Ok($ty::$v),)+
                    other => Err(UnknownStatus(other.to_string())),
                }
            }
        }

        impl TryFrom<String> for $ty {
            type Error = UnknownStatus;

            fn try_from(s: String) -> Result<Self, UnknownStatus> {
                s.parse()
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl PartialEq<&str> for $ty {
            fn eq(&self, other: &&str) -> bool {
                self.as_str() == *other
            }
        }

        // Text in PostgreSQL, as the column's CHECK has it.
        impl sqlx::Type<sqlx::Postgres> for $ty {
            fn type_info() -> sqlx::postgres::PgTypeInfo {
                <&str as sqlx::Type<sqlx::Postgres>>::type_info()
            }

            fn compatible(ty: &sqlx::postgres::PgTypeInfo) -> bool {
                <&str as sqlx::Type<sqlx::Postgres>>::compatible(ty)
            }
        }

        impl sqlx::postgres::PgHasArrayType for $ty {
            fn array_type_info() -> sqlx::postgres::PgTypeInfo {
                <&str as sqlx::postgres::PgHasArrayType>::array_type_info()
            }
        }

        impl<'q> sqlx::Encode<'q, sqlx::Postgres> for $ty {
            fn encode_by_ref(
                &self,
                buf: &mut sqlx::postgres::PgArgumentBuffer,
            ) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
                <&str as sqlx::Encode<'q, sqlx::Postgres>>::encode_by_ref(&self.as_str(), buf)
            }
        }

        impl<'r> sqlx::Decode<'r, sqlx::Postgres> for $ty {
            fn decode(
                value: sqlx::postgres::PgValueRef<'r>,
            ) -> Result<Self, sqlx::error::BoxDynError> {
                let s = <&str as sqlx::Decode<'r, sqlx::Postgres>>::decode(value)?;
                Ok(s.parse()?)
            }
        }
    };
}

status_enum!(ClaimStatus, CLAIM_STEPS, [
    Issued => "issued",
    Held => "held",
    Confirmed => "confirmed",
    Cancelled => "cancelled",
    Expired => "expired",
    Compensated => "compensated",
]);

status_enum!(EntryStatus, ENTRY_STEPS, [
    Waiting => "waiting",
    Offered => "offered",
    Claimed => "claimed",
    Expired => "expired",
    Left => "left",
]);

status_enum!(TicketState, TICKET_STEPS, [
    Prequeue => "prequeue",
    Waiting => "waiting",
    Admitted => "admitted",
    SoldOut => "sold_out",
    Expired => "expired",
    Closed => "closed",
]);

impl TicketState {
    /// In the line (a place the admission has not reached): the states with a position, and
    /// the pre-queue's.
    pub fn in_line(self) -> bool {
        matches!(
            self,
            TicketState::Prequeue
                | TicketState::Waiting
                | TicketState::SoldOut
                | TicketState::Closed
        )
    }
}

impl ClaimStatus {
    /// A hold's end as the journal carries it (`s` records, lua/lib/lifecycle.lua): the steps
    /// out of `held` that the writer records. A compensation is not journaled (the reprocessor
    /// writes it).
    pub fn is_hold_change(self) -> bool {
        matches!(
            self,
            ClaimStatus::Confirmed | ClaimStatus::Cancelled | ClaimStatus::Expired
        )
    }

    /// Whether the claim's units went back to the stock with this status (the buyer does not
    /// have them).
    pub fn gave_back(self) -> bool {
        matches!(
            self,
            ClaimStatus::Cancelled | ClaimStatus::Expired | ClaimStatus::Compensated
        )
    }
}

impl EntryStatus {
    /// The entry's place in its forward order: waiting 0, offered 1, ended 2 (the writer
    /// applies a batch's changes rank by rank, and never moves an entry back).
    pub fn rank(self) -> u8 {
        match self {
            EntryStatus::Waiting => 0,
            EntryStatus::Offered => 1,
            EntryStatus::Claimed | EntryStatus::Expired | EntryStatus::Left => 2,
        }
    }

    /// Still in line (waiting) or holding an offer.
    pub fn is_live(self) -> bool {
        self.rank() < 2
    }
}

#[cfg(test)]
mod tests;
