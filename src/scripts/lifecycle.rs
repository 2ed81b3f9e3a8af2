//! The lifecycle's scripts (with `lua/lib/fresh.lua` and `lua/lib/lifecycle.lua` prepended):
//! confirm or cancel a hold (`decide_hold.lua`), expire due holds (`expire_holds.lua`), join
//! and leave a waitlist (`join_waitlist.lua`, `leave_waitlist.lua`), and fence or give back a
//! parked claim (`compensate.lua`). Each takes the SKU's eight lifecycle keys
//! ([`SkuKeys::lifecycle`]) first.

use redis::aio::ConnectionLike;
use uuid::Uuid;

use super::{Floor, SCRIPTS};
use crate::error::StoreError;
use crate::keys::SkuKeys;
use crate::status::ClaimStatus;

/// What a buyer asked of a hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldOp {
    Confirm,
    Cancel,
}

impl HoldOp {
    fn arg(self) -> &'static str {
        match self {
            HoldOp::Confirm => "confirm",
            HoldOp::Cancel => "cancel",
        }
    }

    /// The status the operation leads to.
    pub fn target(self) -> ClaimStatus {
        match self {
            HoldOp::Confirm => ClaimStatus::Confirmed,
            HoldOp::Cancel => ClaimStatus::Cancelled,
        }
    }
}

/// The answer to a confirm or cancel. Business outcomes, not errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HoldAnswer {
    /// Not a claim of this caller's (or no claim at all).
    NotFound,
    /// The claim is now (or was already) in the operation's status.
    Done,
    /// The claim already ended otherwise: its status (`cancelled`, `expired`, `confirmed`,
    /// `compensated`, or `issued` for a claim that was final at once).
    Refused(ClaimStatus),
}

/// Confirms or cancels the hold `id` for `caller` (`None`: the admin) on the Redis SKU of
/// `keys` (`decide_hold.lua`). [`HoldAnswer::NotFound`] when Redis holds no hold of this id for
/// this caller (not a hold, not the caller's, or its record dropped after its final status was
/// written: the ledger answers).
///
/// # Errors
/// [`StoreError::SkuLost`] / [`StoreError::Stale`] when the state fails closed (nothing
/// changes), [`StoreError::Protocol`] for a status the table does not know, or the Redis error
/// of the call.
pub async fn decide_hold<C: ConnectionLike>(
    con: &mut C,
    keys: &SkuKeys,
    op: HoldOp,
    id: &Uuid,
    caller: Option<&str>,
    floor: Floor,
) -> Result<HoldAnswer, StoreError> {
    let mut inv = SCRIPTS.decide_hold.prepare_invoke();
    for k in keys.lifecycle() {
        inv.key(k);
    }
    inv.arg(op.arg())
        .arg(id.to_string())
        .arg(caller.unwrap_or(""))
        .arg(floor);
    let (code, status, _expires): (i64, String, i64) = inv.invoke_async(con).await?;
    match code {
        1 => Ok(HoldAnswer::Done),
        2 => match status.parse() {
            Ok(status) => Ok(HoldAnswer::Refused(status)),
            Err(e) => Err(StoreError::Protocol(format!("decide_hold.lua: {e}"))),
        },
        -1 => Err(StoreError::SkuLost),
        -3 => Err(StoreError::Stale),
        _ => Ok(HoldAnswer::NotFound),
    }
}

/// Expires up to `batch` due holds of the SKU of `keys` for the worker `owner`, under its lease
/// of `lease_ms` (`expire_holds.lua`). Returns, per hold expired now, how long after its
/// `expires_ms` it expired (ms, Redis's clock); none when none was due, another worker holds
/// the lease, or the state is missing or stale (marked stale).
///
/// # Errors
/// The Redis error of the call (what it expired stays expired; the rest stays due).
pub async fn expire_holds<C: ConnectionLike>(
    con: &mut C,
    keys: &SkuKeys,
    owner: &Uuid,
    lease_ms: u64,
    batch: usize,
    floor: Floor,
) -> Result<Vec<i64>, StoreError> {
    let mut inv = SCRIPTS.expire_holds.prepare_invoke();
    for k in keys.lifecycle() {
        inv.key(k);
    }
    inv.key(keys.expiry_lease())
        .arg(owner.to_string())
        .arg(lease_ms)
        .arg(batch)
        .arg(floor);
    let reply: Vec<i64> = inv.invoke_async(con).await?;
    Ok(match reply.split_first() {
        Some((&n, lags)) if n > 0 => lags.to_vec(),
        _ => Vec::new(),
    })
}

/// What a join did. Business outcomes, not errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Joined {
    /// A new entry, with its place in line.
    New {
        entry_id: Uuid,
        position: i64,
    },
    /// The user's live entry (waiting, or offered: position 0).
    Existing {
        entry_id: Uuid,
        position: i64,
    },
    InStock,
    LimitReached,
    NotOpen,
    Closed,
}

/// A join: `user` at the end of the line under the new entry id `entry_id`, waiting for
/// `quantity` units (a seated SKU's entry is offered the best seats for it; 1 elsewhere).
/// `in_stock_elsewhere`: another shard holds units or a transfer is in flight (always `false`
/// on a SKU of one shard); `ticket`: the join's order in a sharded SKU's one line (`None` on a
/// SKU of one shard).
#[derive(Debug, Clone, Copy)]
pub struct JoinAsk<'a> {
    pub entry_id: &'a Uuid,
    pub user: &'a str,
    pub quantity: u32,
    pub in_stock_elsewhere: bool,
    pub ticket: Option<i64>,
}

/// Puts the joiner of `ask` at the end of the waitlist of the SKU (or shard) of `keys`
/// (`join_waitlist.lua`). A position is this line's.
///
/// # Errors
/// [`StoreError::SkuLost`] / [`StoreError::Stale`] when the state fails closed (nothing
/// changes), [`StoreError::Protocol`] for an entry id that is no id, or the Redis error of the
/// call.
pub async fn join_waitlist<C: ConnectionLike>(
    con: &mut C,
    keys: &SkuKeys,
    ask: JoinAsk<'_>,
    floor: Floor,
) -> Result<Joined, StoreError> {
    let mut inv = SCRIPTS.join_waitlist.prepare_invoke();
    for k in keys.lifecycle() {
        inv.key(k);
    }
    inv.arg(ask.entry_id.to_string())
        .arg(ask.user)
        .arg(if ask.in_stock_elsewhere { "1" } else { "0" })
        .arg(ask.ticket.map_or(String::new(), |t| t.to_string()))
        .arg(floor)
        .arg(ask.quantity);
    let (code, id, position): (i64, String, i64) = inv.invoke_async(con).await?;
    let entry_id =
        || Uuid::parse_str(&id).map_err(|_| StoreError::Protocol(format!("join: entry {id:?}")));
    Ok(match code {
        1 => Joined::New {
            entry_id: entry_id()?,
            position,
        },
        2 => Joined::Existing {
            entry_id: entry_id()?,
            position,
        },
        3 => Joined::InStock,
        4 => Joined::LimitReached,
        5 => Joined::NotOpen,
        6 => Joined::Closed,
        -3 => return Err(StoreError::Stale),
        _ => return Err(StoreError::SkuLost),
    })
}

/// What a leave did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Left {
    NotFound,
    /// The entry has left (now or before); an offer it held was declined.
    Left,
    /// The entry had already ended (claimed, expired): nothing changed.
    Ended,
}

/// Takes the entry `entry_id` of `caller` (`None`: the admin) out of the line of the SKU (or
/// shard) of `keys`, declining its offer if it holds one (`leave_waitlist.lua`).
/// [`Left::NotFound`] when this line holds no such entry for this caller.
///
/// # Errors
/// [`StoreError::SkuLost`] / [`StoreError::Stale`] when the state fails closed (nothing
/// changes), or the Redis error of the call.
pub async fn leave_waitlist<C: ConnectionLike>(
    con: &mut C,
    keys: &SkuKeys,
    entry_id: &Uuid,
    caller: Option<&str>,
    floor: Floor,
) -> Result<Left, StoreError> {
    let mut inv = SCRIPTS.leave_waitlist.prepare_invoke();
    for k in keys.lifecycle() {
        inv.key(k);
    }
    inv.arg(entry_id.to_string())
        .arg(caller.unwrap_or(""))
        .arg(floor);
    let (code, _status): (i64, String) = inv.invoke_async(con).await?;
    match code {
        1 => Ok(Left::Left),
        2 => Ok(Left::Ended),
        -1 => Err(StoreError::SkuLost),
        -3 => Err(StoreError::Stale),
        _ => Ok(Left::NotFound),
    }
}

/// A claim PostgreSQL refused, as `compensate.lua` needs it.
#[derive(Debug, Clone, Copy)]
pub struct Parked<'a> {
    pub claim_id: Uuid,
    pub user: &'a str,
    pub quantity: i32,
    pub idempotency_key: Option<&'a str>,
    /// A seated claim's seats, as bits of the SKU's seat map (empty otherwise): a give-back
    /// frees exactly them.
    pub seat_bits: &'a [u32],
}

impl Parked<'_> {
    /// The claim's idempotency record's field, empty when it has no key (`compensate.lua`).
    fn idempotency_field(&self) -> Vec<u8> {
        self.idempotency_key
            .map(|k| crate::keys::idempotency_field(self.user, k).to_vec())
            .unwrap_or_default()
    }
}

/// What giving a parked claim's units back did (`compensate.lua`, "give").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GiveBack {
    /// The units went back now (to the waitlist's head first); `confirmed`: the claim was a
    /// confirmed hold.
    Given { confirmed: bool },
    /// The claim was a hold that had already ended so (its units came back then; only the
    /// marker is set now): `cancelled` or `expired`.
    HoldEnded(ClaimStatus),
    /// Compensated already (by an earlier owner): nothing changes.
    Already,
    /// Another owner fenced the claim since: this one's lease is stale, nothing changes.
    Superseded,
}

/// Runs compensate.lua in `mode` ("fence" or "give") for `owner` on the buyer's shard.
fn compensate_call<'a>(
    keys: &SkuKeys,
    claim: Parked<'_>,
    mode: &str,
    owner: &Uuid,
    marker_ttl_secs: u64,
    floor: Floor,
) -> redis::ScriptInvocation<'a> {
    let mut inv = SCRIPTS.compensate.prepare_invoke();
    for k in keys.lifecycle() {
        inv.key(k);
    }
    inv.key(keys.compensation(&claim.claim_id))
        .key(keys.idempotency())
        .arg(mode)
        .arg(owner.to_string())
        .arg(claim.user)
        .arg(claim.quantity)
        .arg(claim.claim_id.to_string())
        .arg(marker_ttl_secs)
        .arg(floor)
        .arg(claim.idempotency_field())
        .arg(
            claim
                .seat_bits
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(","),
        );
    inv
}

/// Fences the parked `claim` for the reprocessor `owner` before an attempt: its marker names
/// `owner` for `marker_ttl_secs` (`floor` is sent as by every call, read only by a give).
/// Returns `false` when the claim is compensated already.
///
/// # Errors
/// The Redis error of the call.
pub async fn fence_parked<C: ConnectionLike>(
    con: &mut C,
    keys: &SkuKeys,
    claim: Parked<'_>,
    owner: &Uuid,
    marker_ttl_secs: u64,
    floor: Floor,
) -> Result<bool, StoreError> {
    let code: i64 = compensate_call(keys, claim, "fence", owner, marker_ttl_secs, floor)
        .invoke_async(con)
        .await?;
    Ok(code != 0)
}

/// Gives the parked `claim`'s units back, once, as the owner that fenced it last.
///
/// # Errors
/// [`StoreError::SkuLost`] when the state is missing, stale or older than `floor` (marked
/// stale; nothing else changes: compensate after a restore), or the Redis error of the call.
pub async fn give_back_parked<C: ConnectionLike>(
    con: &mut C,
    keys: &SkuKeys,
    claim: Parked<'_>,
    owner: &Uuid,
    marker_ttl_secs: u64,
    floor: Floor,
) -> Result<GiveBack, StoreError> {
    let code: i64 = compensate_call(keys, claim, "give", owner, marker_ttl_secs, floor)
        .invoke_async(con)
        .await?;
    match code {
        1 => Ok(GiveBack::Given { confirmed: false }),
        4 => Ok(GiveBack::Given { confirmed: true }),
        3 => Ok(GiveBack::HoldEnded(ClaimStatus::Cancelled)),
        5 => Ok(GiveBack::HoldEnded(ClaimStatus::Expired)),
        0 => Ok(GiveBack::Already),
        -2 => Ok(GiveBack::Superseded),
        _ => Err(StoreError::SkuLost),
    }
}
