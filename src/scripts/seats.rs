//! A seated SKU's claim (`claim_seats.lua`): exact seats or best available, one atomic call.

use redis::aio::ConnectionLike;
use redis::Value;
use uuid::Uuid;

use super::{Floor, SCRIPTS};
use crate::error::StoreError;
use crate::keys::{idempotency_field, SkuKeys};
use crate::seating::{PlanError, SeatPlan};

/// What a seat claim asks for, checked against the plan and spelled as the script reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeatAsk {
    mode: &'static str,
    n: usize,
    spec: std::sync::Arc<str>,
    /// The request in one string (a replay must be the same request).
    print: String,
    /// The ask reads every free seat (exact seats, or best available in every section), so
    /// its `sold_out` with 0 free means the whole SKU is gone; a section's does not.
    whole: bool,
}

impl SeatAsk {
    /// Exactly these seats, all or none.
    ///
    /// # Errors
    /// An unknown or repeated seat, or no seat at all.
    pub fn exact(plan: &SeatPlan, ids: &[String]) -> Result<SeatAsk, PlanError> {
        if ids.is_empty() {
            return Err(PlanError("seats: at least one seat".into()));
        }
        let mut bits = Vec::with_capacity(ids.len());
        for id in ids {
            let b = plan.bit_of(id)?;
            if bits.contains(&b) {
                return Err(PlanError(format!("seat {id} asked twice")));
            }
            bits.push(b);
        }
        let spec: Vec<String> = bits
            .iter()
            .zip(ids)
            .map(|(b, id)| format!("{b}:{id}"))
            .collect();
        Ok(SeatAsk {
            mode: "x",
            n: ids.len(),
            print: digest(&format!("x;{}", ids.join(","))),
            spec: spec.join(";").into(),
            whole: true,
        })
    }

    /// The best `n` seats of one section (or every section, in order): adjacent in one row,
    /// or anywhere when `adjacent` is false.
    ///
    /// # Errors
    /// An unknown section, or `n` of 0.
    pub fn best(
        plan: &SeatPlan,
        section: Option<&str>,
        n: usize,
        adjacent: bool,
    ) -> Result<SeatAsk, PlanError> {
        if n == 0 {
            return Err(PlanError("quantity must be at least 1".into()));
        }
        if let Some(s) = section {
            if plan.section(s).is_none() {
                return Err(PlanError(format!("unknown section {s:?}")));
            }
        }
        let mode = if adjacent { "b" } else { "f" };
        Ok(SeatAsk {
            mode,
            n,
            print: digest(&format!("{mode};{n};{}", section.unwrap_or(""))),
            spec: plan.rows_spec(section),
            whole: section.is_none(),
        })
    }

    /// The number of seats asked for.
    pub fn seats(&self) -> usize {
        self.n
    }

    /// Whether a `sold_out` answer to this ask speaks for the whole SKU (see `whole`): only
    /// such an answer may teach the gateway's sold-out memory, which refuses every ask.
    pub fn spans_every_section(&self) -> bool {
        self.whole
    }
}

fn digest(s: &str) -> String {
    use sha2::{Digest, Sha256};
    let d = Sha256::digest(s.as_bytes());
    d[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// The script's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SeatOutcome {
    /// `expires_ms`: a hold's expiry on Redis's clock (a SKU that holds its claims).
    Won {
        remaining: i64,
        seats: Vec<String>,
        expires_ms: Option<i64>,
    },
    /// The same request under the same key won before: its claim and seats.
    Replay {
        claim_id: Uuid,
        remaining: i64,
        seats: Vec<String>,
        expires_ms: Option<i64>,
    },
    Reused,
    Limit {
        held: i64,
    },
    NotOpen(i64),
    Closed(i64),
    SoldOut {
        free: i64,
    },
    Taken(Vec<String>),
    NoAdjacent {
        largest: i64,
    },
    Lost,
    Stale,
}

/// Decides one claim on a seated SKU (`claim_seats.lua`): `claim_id` is a call of one claim.
///
/// # Errors
/// The Redis error of the call, or [`StoreError::Protocol`] for an answer it cannot read.
#[allow(clippy::too_many_arguments)]
pub async fn claim_seats<C: ConnectionLike>(
    con: &mut C,
    keys: &SkuKeys,
    floor: Floor,
    claim_id: &Uuid,
    user: &str,
    ask: &SeatAsk,
    idempotency_key: Option<&str>,
    now_ms: i64,
) -> Result<SeatOutcome, StoreError> {
    let field = idempotency_key.map(|k| idempotency_field(user, k).to_vec());
    let reply: Vec<Value> = SCRIPTS
        .claim_seats
        .key(keys.state())
        .key(keys.users())
        .key(keys.journal())
        .key(keys.seats())
        .key(keys.idempotency())
        .key(keys.holds())
        .key(keys.expiry())
        .key(keys.claim(claim_id))
        .arg(now_ms)
        .arg(floor)
        .arg(claim_id.to_string())
        .arg(user)
        .arg(ask.mode)
        .arg(ask.n)
        .arg(&*ask.spec)
        .arg(field.unwrap_or_default())
        .arg(idempotency_key.unwrap_or(""))
        .arg(&ask.print)
        .arg(crate::config::CLAIM_RECORD_TTL_SECS)
        .invoke_async(con)
        .await?;
    parse(&reply).ok_or_else(|| StoreError::Protocol(format!("claim_seats.lua: {reply:?}")))
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(i) => Some(i.to_string()),
        _ => None,
    }
}

fn parse(reply: &[Value]) -> Option<SeatOutcome> {
    let words: Vec<String> = reply.iter().map(text).collect::<Option<_>>()?;
    let num = |i: usize| words.get(i)?.parse::<i64>().ok();
    Some(match words.first()?.as_str() {
        "won" => SeatOutcome::Won {
            remaining: num(1)?,
            expires_ms: num(2).filter(|e| *e > 0),
            seats: words.get(3..)?.to_vec(),
        },
        "replay" => {
            // "fingerprint|claim_id|remaining|ids|expires_ms" (a record written before holds
            // had no expiry: 0).
            let mut it = words.get(1)?.splitn(5, '|').skip(1);
            SeatOutcome::Replay {
                claim_id: it.next()?.parse().ok()?,
                remaining: it.next()?.parse().ok()?,
                seats: it.next()?.split(',').map(str::to_string).collect(),
                expires_ms: match it.next() {
                    Some(e) => Some(e.parse::<i64>().ok()?).filter(|e| *e > 0),
                    None => None,
                },
            }
        }
        "reused" => SeatOutcome::Reused,
        "limit" => SeatOutcome::Limit { held: num(1)? },
        "not_open" => SeatOutcome::NotOpen(num(1)?),
        "closed" => SeatOutcome::Closed(num(1)?),
        "sold_out" => SeatOutcome::SoldOut { free: num(1)? },
        "taken" => SeatOutcome::Taken(words[1..].to_vec()),
        "no_adjacent" => SeatOutcome::NoAdjacent { largest: num(1)? },
        "lost" => SeatOutcome::Lost,
        "stale" => SeatOutcome::Stale,
        _ => return None,
    })
}

/// Writes a seated SKU's rows into its state (`seat_rows.lua`), for the waitlist's offers.
/// Returns `false` when the state is missing (nothing is written; a restore writes them).
///
/// # Errors
/// The Redis error of the call.
pub async fn set_rows<C: ConnectionLike>(
    con: &mut C,
    keys: &SkuKeys,
    plan: &SeatPlan,
) -> Result<bool, StoreError> {
    let written: i64 = SCRIPTS
        .seat_rows
        .key(keys.state())
        .arg(&*plan.rows_spec(None))
        .invoke_async(con)
        .await?;
    Ok(written == 1)
}
