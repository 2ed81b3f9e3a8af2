//! Finding a claim by id (before and after the writer has it), and confirming or cancelling a
//! hold: the decision is Redis's (`lua/decide_hold.lua`); PostgreSQL answers for claims whose
//! final status it already holds.

use uuid::Uuid;

use super::records::{claim_in_call_record, Hold};
use super::status::ClaimStatus;
use super::{sku_of, LifecycleError};
use crate::catalog::Catalog;
use crate::error::StoreError;
use crate::ledger::{self, ClaimRow};
use crate::scripts::SCRIPTS;
use crate::store::Store;

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

/// The claim as `GET /v1/claims/{id}` shows it: the ledger's row, with a hold's status as
/// Redis has it when Redis is ahead of the writer, or Redis's record before the writer has
/// written the claim at all. `None` when neither knows it.
///
/// # Errors
/// Infrastructure errors of PostgreSQL, or of Redis when the ledger has no row.
pub async fn find_claim(
    store: &Store,
    catalog: &Catalog,
    id: Uuid,
) -> Result<Option<ClaimRow>, LifecycleError> {
    let row = ledger::find_claim(catalog.db(), id).await?;
    if let Some(r) = &row {
        if r.status != ClaimStatus::Held {
            return Ok(row);
        }
    }
    let Some(sku) = sku_of(catalog, &id).await? else {
        return Ok(row);
    };
    // A claim of a sharded SKU was decided on its buyer's shard, which the id does not name:
    // each shard is asked in turn until one holds the call's record.
    let mut read = Ok((None, None));
    for name in sku.layout.names(&sku.sku) {
        read = read_records(store, &name, &id).await;
        if !matches!(read, Ok((None, None))) {
            break;
        }
    }
    let (record, hold) = match (read, row) {
        (Ok(r), _) => r,
        // The ledger's row stands when Redis cannot add to it.
        (Err(_), Some(row)) => return Ok(Some(row)),
        (Err(e), None) => return Err(super::read_error(e).into()),
    };
    let hold = hold.as_deref().and_then(Hold::parse);
    let created_at = crate::ids::created_at(&id);
    let won = record
        .as_deref()
        .and_then(|r| claim_in_call_record(r, crate::ids::index_of(&id)));
    let claim = match (hold, won) {
        (Some(h), _) => ClaimRow {
            claim_id: id,
            sku: sku.sku.clone(),
            user: h.user,
            quantity: h.quantity,
            status: h.status,
            expires_at: chrono::DateTime::from_timestamp_millis(h.expires_ms),
            created_at,
        },
        (None, Some((quantity, user))) => ClaimRow {
            claim_id: id,
            sku: sku.sku.clone(),
            user,
            quantity,
            status: ClaimStatus::Issued,
            expires_at: None,
            created_at,
        },
        (None, None) => return Ok(ledger::find_claim(catalog.db(), id).await?),
    };
    Ok(Some(claim))
}

/// Runs decide_hold.lua on the Redis SKU `name`; `None` when it holds no hold of this id for
/// this caller.
async fn decide_on(
    store: &Store,
    name: &str,
    id: Uuid,
    caller: Option<&str>,
    op: HoldOp,
) -> Result<Option<HoldAnswer>, LifecycleError> {
    let keys = store.keys(name);
    let mut inv = SCRIPTS.decide_hold.prepare_invoke();
    for k in keys.lifecycle() {
        inv.key(k);
    }
    inv.arg(op.arg())
        .arg(id.to_string())
        .arg(caller.unwrap_or(""))
        .arg(store.floor(name));
    let mut con = store.hot();
    let call = store.bounded(async { Ok(inv.invoke_async(&mut con).await?) });
    let (code, status, _expires): (i64, String, i64) =
        crate::activity::with_mark(store, name, call).await?;
    match code {
        1 => {
            super::expiry::count_decision(op.target().as_str());
            // Answered only once the replicas hold it, as a win is (src/claims/call.rs): without
            // that a failover could undo it, so its outcome is as unknown as a timeout's;
            // the client's retry is idempotent and answers from what Redis then holds.
            if !store.replicated(&keys).await? {
                crate::metrics::wait_short();
                return Err(StoreError::Timeout.into());
            }
            Ok(Some(HoldAnswer::Done))
        }
        2 => match status.parse() {
            Ok(status) => Ok(Some(HoldAnswer::Refused(status))),
            Err(e) => Err(StoreError::Protocol(format!("decide_hold.lua: {e}")).into()),
        },
        -1 => Err(StoreError::SkuLost.into()),
        -3 => Err(StoreError::Stale.into()),
        _ => Ok(None),
    }
}

/// The record of the call that decided `id` and the hold `id`, on the Redis SKU `name`.
async fn read_records(
    store: &Store,
    name: &str,
    id: &Uuid,
) -> Result<(Option<String>, Option<String>), StoreError> {
    let keys = store.keys(name);
    let mut con = store.hot();
    store
        .bounded(async {
            Ok(redis::pipe()
                .cmd("HGET")
                .arg(keys.claim(id))
                .arg(crate::ids::call_of(id).to_string())
                .cmd("HGET")
                .arg(keys.holds())
                .arg(id.to_string())
                .query_async::<(Option<String>, Option<String>)>(&mut con)
                .await?)
        })
        .await
}

/// Confirms or cancels the hold `id` for `caller` (`None`: the admin, who may act on any).
///
/// # Errors
/// Redis cannot decide (unreachable, or the SKU's state is missing or stale: fail closed), or
/// PostgreSQL cannot answer for a claim Redis no longer holds.
pub async fn decide(
    store: &Store,
    catalog: &Catalog,
    id: Uuid,
    caller: Option<&str>,
    op: HoldOp,
) -> Result<HoldAnswer, LifecycleError> {
    if let Some(sku) = sku_of(catalog, &id).await? {
        // On a sharded SKU a hold lives in its buyer's shard, a waitlist offer too (the line
        // of the buyer's shard made it, src/shards/line.rs): the owner's is known from the
        // caller; the admin's is found by asking each shard in turn.
        let names = match caller {
            Some(user) if sku.layout.is_sharded() => {
                vec![sku.layout.name_for_user(&sku.sku, user)]
            }
            _ => sku.layout.names(&sku.sku),
        };
        for name in names {
            if let Some(answer) = decide_on(store, &name, id, caller, op).await? {
                if op == HoldOp::Cancel && answer == HoldAnswer::Done && sku.layout.is_sharded() {
                    // While anybody waits, the unit came back into its shard's pool: offer it
                    // to the line that comes first now rather than at the recovery task's next
                    // round. Best effort: the recovery task does the same within a second.
                    if let Err(e) = crate::shards::feed::feed(store, &sku.sku, sku.layout).await {
                        tracing::debug!(sku = %sku.sku, error = %e, "could not feed the waitlists after a cancel; the recovery task will");
                    }
                }
                return Ok(answer);
            }
        }
    }
    // Redis holds no hold of this id: the ledger has its final status, or it is no hold. A
    // claim final at once that the writer has not written yet is its owner's all the same
    // (GET finds it by its call record): it is confirmed already and cannot be cancelled.
    let row = match ledger::find_claim(catalog.db(), id).await? {
        Some(row) => row,
        None => match find_claim(store, catalog, id).await? {
            Some(row) => row,
            None => return Ok(HoldAnswer::NotFound),
        },
    };
    if caller.is_some_and(|u| u != row.user) {
        return Ok(HoldAnswer::NotFound);
    }
    Ok(match row.status {
        s if s == op.target() => HoldAnswer::Done,
        ClaimStatus::Issued if op == HoldOp::Confirm => HoldAnswer::Done,
        // A hold the ledger has and Redis does not: Redis lost it; fail closed until restore.
        ClaimStatus::Held => return Err(StoreError::SkuLost.into()),
        other => HoldAnswer::Refused(other),
    })
}
