//! The claim's scripts: `claim.lua` decides a call of up to [`crate::ids::CALL_CLAIMS`]
//! claims at once; `resolve_claim.lua` reads back (or fences) a call that got no answer.

use redis::aio::ConnectionLike;
use redis::Value;
use uuid::Uuid;

use super::{Floor, SCRIPTS};
use crate::config::CLAIM_RECORD_TTL_SECS;
use crate::error::StoreError;
use crate::keys::SkuKeys;
use crate::record::IdemRecord;

mod args;

use args::CallArgs;

/// One claim to decide. Its id is its call's (see [`crate::ids::claim_in`]): minted when the
/// call is formed, before it is sent.
#[derive(Debug, Clone)]
pub struct ClaimInput {
    pub user: String,
    pub quantity: u32,
    pub idempotency_key: Option<String>,
}

/// What Redis decided for one claim. Business outcomes are values, not errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Won {
        remaining: i64,
        /// When the hold expires (unix ms, Redis's clock); `None`: final at once.
        expires_ms: Option<i64>,
    },
    /// The same Idempotency-Key won earlier with the same request.
    Replay {
        claim_id: Uuid,
        quantity: u32,
        remaining: i64,
        expires_ms: Option<i64>,
    },
    /// The sale window has not opened yet.
    NotOpen,
    /// The sale window has closed.
    Closed,
    SoldOut {
        remaining: i64,
    },
    LimitReached {
        held: i64,
    },
    KeyReused,
    /// The call had a record already: a resolver fenced it after an earlier timeout (it
    /// decided nothing), or it is a resend of a call that ran (read its outcome back).
    Fenced,
    /// Never sent to Redis: the gateway shed it (its SKU's queue was full).
    Shed,
}

/// Decides `claims` (all on the SKU of `keys`) in order, in one script call: the call
/// `call_id` (see [`crate::ids::mint_call`]; claim i is [`crate::ids::claim_in`]`(call_id, i)`).
/// `floor` is the highest state sequence this gateway knows PostgreSQL recorded: a state
/// behind it is stale.
///
/// # Errors
/// [`StoreError::SkuLost`] when Redis holds no state for the SKU, [`StoreError::Stale`] when
/// the state is older than the ledger (nothing was written either way), or the Redis error of
/// the call.
pub async fn claim<C: ConnectionLike>(
    con: &mut C,
    keys: &SkuKeys,
    call_id: &Uuid,
    claims: &[ClaimInput],
    now_ms: i64,
    floor: i64,
) -> Result<Vec<Decision>, StoreError> {
    claim_at(con, keys, call_id, claims, now_ms, Floor::seq(floor)).await
}

/// As [`claim`], with the whole floor: the ledger's mark and incarnation as this gateway knows
/// them (a state older than either is stale: see `lua/lib/fresh.lua`).
///
/// # Errors
/// As [`claim`].
pub async fn claim_at<C: ConnectionLike>(
    con: &mut C,
    keys: &SkuKeys,
    call_id: &Uuid,
    claims: &[ClaimInput],
    now_ms: i64,
    floor: Floor,
) -> Result<Vec<Decision>, StoreError> {
    if claims.is_empty() {
        return Ok(Vec::new());
    }
    let reply: Value = claim_invocation_at(keys, call_id, claims, now_ms, floor)?
        .invoke_async(con)
        .await?;
    parse_claim_reply(reply, claims)
}

/// The `claim.lua` call `call_id` deciding `claims` (1 to [`crate::ids::CALL_CLAIMS`]), built
/// but not sent: its keys and arguments in the script's order, one per claim and one per
/// buyer (`claim/args.rs`; `benches/instructions.rs` counts what this costs).
///
/// # Errors
/// [`StoreError::Protocol`] when `claims` is empty or more than one call holds.
pub fn claim_invocation<'a>(
    keys: &SkuKeys,
    call_id: &Uuid,
    claims: &[ClaimInput],
    now_ms: i64,
    floor: i64,
) -> Result<redis::ScriptInvocation<'a>, StoreError> {
    claim_invocation_at(keys, call_id, claims, now_ms, Floor::seq(floor))
}

/// As [`claim_invocation`], with the whole floor (see [`claim_at`]).
///
/// # Errors
/// As [`claim_invocation`].
pub fn claim_invocation_at<'a>(
    keys: &SkuKeys,
    call_id: &Uuid,
    claims: &[ClaimInput],
    now_ms: i64,
    floor: Floor,
) -> Result<redis::ScriptInvocation<'a>, StoreError> {
    if claims.is_empty() || claims.len() > crate::ids::CALL_CLAIMS {
        return Err(StoreError::Protocol(format!(
            "a call decides 1 to {} claims, not {}",
            crate::ids::CALL_CLAIMS,
            claims.len()
        )));
    }
    let args = CallArgs::new(claims);
    let mut inv = SCRIPTS.claim.prepare_invoke();
    inv.key(keys.state())
        .key(keys.users())
        .key(keys.journal())
        .key(keys.claim(call_id))
        .key(keys.holds())
        .key(keys.expiry())
        .key(keys.idempotency())
        .arg(now_ms)
        .arg(args.fields.as_slice())
        .arg(CLAIM_RECORD_TTL_SECS)
        .arg(floor)
        .arg(call_id.to_string())
        .arg(claims.len());
    args.push(&mut inv);
    Ok(inv)
}

/// Reads `claim.lua`'s reply for the call that decided `claims`.
///
/// # Errors
/// [`StoreError::SkuLost`] and [`StoreError::Stale`] as the script says;
/// [`StoreError::Protocol`] for a reply of another shape.
pub fn parse_claim_reply(reply: Value, claims: &[ClaimInput]) -> Result<Vec<Decision>, StoreError> {
    let n = claims.len();
    let items = match reply {
        Value::Array(items) => items,
        other => return Err(StoreError::Protocol(format!("claim: {other:?}"))),
    };
    if let [Value::BulkString(b)] = items.as_slice() {
        match b.as_slice() {
            b"lost" => return Err(StoreError::SkuLost),
            b"stale" => return Err(StoreError::Stale),
            b"fenced" => return Ok(vec![Decision::Fenced; n]),
            _ => {}
        }
    }
    if let [expires, Value::Int(stock)] = items.as_slice() {
        // Every claim won: each one's stock left is the stock before the call less the
        // quantities up to it.
        let expires_ms = expires_of(expires)?;
        let mut left = *stock;
        return Ok(claims
            .iter()
            .map(|c| {
                left -= i64::from(c.quantity);
                Decision::Won {
                    remaining: left,
                    expires_ms,
                }
            })
            .collect());
    }
    if items.len() != 1 + 2 * n {
        return Err(StoreError::Protocol(format!(
            "claim: {} values for {n} claims",
            items.len()
        )));
    }
    let expires_ms = expires_of(&items[0])?;
    items[1..]
        .chunks_exact(2)
        .map(|pair| parse_decision(&pair[0], &pair[1], expires_ms))
        .collect()
}

/// The reply's first value: the winners' hold expiry, 0 when the SKU does not hold claims.
fn expires_of(v: &Value) -> Result<Option<i64>, StoreError> {
    match v {
        Value::Int(0) => Ok(None),
        Value::Int(ms) => Ok(Some(*ms)),
        other => Err(StoreError::Protocol(format!("claim expiry {other:?}"))),
    }
}

fn parse_decision(
    code: &Value,
    value: &Value,
    expires_ms: Option<i64>,
) -> Result<Decision, StoreError> {
    let bad = || StoreError::Protocol(format!("claim result {code:?} {value:?}"));
    let int = |v: &Value| match v {
        Value::Int(n) => Ok(*n),
        _ => Err(bad()),
    };
    Ok(match int(code)? {
        1 => Decision::Won {
            remaining: int(value)?,
            expires_ms,
        },
        2 => {
            let rec = match value {
                Value::BulkString(b) => std::str::from_utf8(b).ok().and_then(IdemRecord::parse),
                _ => None,
            }
            .ok_or_else(bad)?;
            Decision::Replay {
                claim_id: rec.claim_id,
                quantity: rec.quantity,
                remaining: rec.remaining,
                expires_ms: rec.expires_ms,
            }
        }
        3 => Decision::SoldOut {
            remaining: int(value)?,
        },
        4 => Decision::LimitReached { held: int(value)? },
        5 => Decision::KeyReused,
        7 => Decision::NotOpen,
        8 => Decision::Closed,
        _ => return Err(bad()),
    })
}

/// Reads whether each of `claim_ids` (all in one records bucket) won, fencing the calls that
/// did not run (see resolve_claim.lua). Returns, per id, the stock left right after it won,
/// or `None` when it did not (and now cannot) win.
///
/// # Errors
/// The Redis error of the call; the outcomes then stay unknown.
pub async fn resolve_claims<C: ConnectionLike>(
    con: &mut C,
    keys: &SkuKeys,
    claim_ids: &[Uuid],
) -> Result<Vec<Option<i64>>, StoreError> {
    Ok(read_back(con, keys, claim_ids)
        .await?
        .into_iter()
        .map(|w| w.map(|w| w.remaining))
        .collect())
}

/// A win read back from its call's record: what the call answered for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadBack {
    /// The stock left right after it won.
    pub remaining: i64,
    /// The hold's expiry (Redis's clock, unix ms) when the SKU held its claims.
    pub expires_ms: Option<i64>,
}

/// [`resolve_claims`], with each win's hold expiry: a win read back is answered as the first
/// answer would have been.
///
/// # Errors
/// The Redis error of the call; the outcomes then stay unknown.
pub async fn read_back<C: ConnectionLike>(
    con: &mut C,
    keys: &SkuKeys,
    claim_ids: &[Uuid],
) -> Result<Vec<Option<ReadBack>>, StoreError> {
    let Some(first) = claim_ids.first() else {
        return Ok(Vec::new());
    };
    let mut inv = SCRIPTS.resolve_claim.prepare_invoke();
    inv.key(keys.claim(first)).arg(CLAIM_RECORD_TTL_SECS);
    for id in claim_ids {
        inv.arg(crate::ids::call_of(id).to_string())
            .arg(crate::ids::index_of(id));
    }
    let raw: Vec<i64> = inv.invoke_async(con).await?;
    if raw.len() != 2 * claim_ids.len() {
        return Err(StoreError::Protocol(format!(
            "resolve: {} answers for {} ids",
            raw.len(),
            claim_ids.len()
        )));
    }
    Ok(raw
        .chunks(2)
        .map(|r| {
            (r[0] >= 0).then_some(ReadBack {
                remaining: r[0],
                expires_ms: (r[1] > 0).then_some(r[1]),
            })
        })
        .collect())
}

#[cfg(test)]
mod tests;
