//! Finding a claim by id (before and after the writer has it), and confirming or cancelling a
//! hold: the decision is Redis's (`lua/decide_hold.lua`); PostgreSQL answers for claims whose
//! final status it already holds.

use uuid::Uuid;

use super::records::{call_record_expiry, claim_in_call_record, Hold};
use super::rows::{self, ClaimRow};
use super::{sku_of, LifecycleError};
use crate::catalog::Catalog;
use crate::error::StoreError;
use crate::scripts;
use crate::status::ClaimStatus;
use crate::store::Store;

// The script's answers, named here where the HTTP layer asks for them.
pub use crate::scripts::lifecycle::{HoldAnswer, HoldOp};

/// The claim as `GET /v1/claims/{id}` shows it: the ledger's row, with a hold's status as
/// Redis has it when Redis is ahead of the writer, or Redis's record before the writer has
/// written the claim at all. `None` when neither knows it.
///
/// # Errors
/// Infrastructure errors of PostgreSQL, or of Redis when the ledger has no row or a row still
/// `held` (whose end Redis may have decided already).
pub async fn find_claim(
    store: &Store,
    catalog: &Catalog,
    id: Uuid,
) -> Result<Option<ClaimRow>, LifecycleError> {
    let row = rows::find_claim(catalog.db(), id).await?;
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
    for name in sku.layout.names(sku.id()) {
        read = read_records(store, &name, &id).await;
        if !matches!(read, Ok((None, None))) {
            break;
        }
    }
    // A row still `held` may be behind Redis (a confirm decided there, not yet written while
    // the writer cannot read the journal either): without Redis its status is not known, and a
    // reading of `held` after a 200 `confirmed` would tell the buyer two lives
    // (MODEL_SEED=432000426898927635). Fail closed, as the decisions do.
    let (record, hold) = read.map_err(super::read_error)?;
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
            seats: h.seats,
        },
        // Without its hold record, a held win is told as its call answered it, unless the
        // ledger has it by now. The writer drops a hold's record only once `issuances` holds
        // its final status, and the ledger's first read may be older than that drop (the
        // writer committed in between): read again after Redis, or an ended hold would read
        // `held` again after a reading of its end (MODEL_SEED=12045509090149232370).
        (None, Some((quantity, user))) => {
            if let Some(row) = rows::find_claim(catalog.db(), id).await? {
                return Ok(Some(row));
            }
            let expires_ms = record.as_deref().and_then(call_record_expiry);
            ClaimRow {
                claim_id: id,
                sku: sku.sku.clone(),
                user,
                quantity,
                status: if expires_ms.is_some() {
                    ClaimStatus::Held
                } else {
                    ClaimStatus::Issued
                },
                expires_at: expires_ms.and_then(chrono::DateTime::from_timestamp_millis),
                created_at,
                // A call record is a count claim's (claim.lua): a seated claim's is its hold.
                seats: None,
            }
        }
        (None, None) => return Ok(rows::find_claim(catalog.db(), id).await?),
    };
    Ok(Some(claim))
}

/// The claim right after Redis decided its hold (confirm, cancel): as [`find_claim`], but when
/// Redis cannot be read a moment later the ledger's row stands, if it has one, since the caller
/// knows what Redis decided and takes only the rest of the row from it.
///
/// # Errors
/// As [`find_claim`], but for Redis's.
pub async fn find_decided(
    store: &Store,
    catalog: &Catalog,
    id: Uuid,
) -> Result<Option<ClaimRow>, LifecycleError> {
    match find_claim(store, catalog, id).await {
        // Without a row (the writer has not written the claim) Redis's error stands: the
        // claim exists, so it is never answered as unknown.
        Err(LifecycleError::Store(e)) => match rows::find_claim(catalog.db(), id).await? {
            Some(row) => Ok(Some(row)),
            None => Err(LifecycleError::Store(e)),
        },
        other => other,
    }
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
    let mut con = store.hot();
    let call = store.bounded(scripts::lifecycle::decide_hold(
        &mut con,
        &keys,
        op,
        &id,
        caller,
        store.floor(name),
    ));
    match crate::activity::with_mark(store, name, call).await? {
        HoldAnswer::Done => {
            crate::metrics::hold_decided(op.target().as_str());
            // Answered only once the replicas hold it, as a win is (src/claims/call.rs): without
            // that a failover could undo it, so its outcome is as unknown as a timeout's;
            // the client's retry is idempotent and answers from what Redis then holds.
            if !store.replicated(&keys).await? {
                crate::metrics::wait_short();
                return Err(StoreError::Timeout.into());
            }
            Ok(Some(HoldAnswer::Done))
        }
        HoldAnswer::NotFound => Ok(None),
        refused => Ok(Some(refused)),
    }
}

/// Redis's refusal, unless the ledger decided the claim's compensation meanwhile. That decision
/// is written before Redis gives the units back (src/reprocess/rows.rs), and from its commit
/// GET reads the claim `compensated`; until the give-back reaches Redis (a fault can hold it
/// up for a lease), Redis may still cancel or expire the hold. Told as Redis has it, a buyer
/// would read two lives; `compensated` is where the claim ends either way. Read after Redis
/// decided, so a decision committed before it is seen. Best effort: without PostgreSQL,
/// Redis's answer stands. (A hold Redis confirmed or cancelled now is read back from the
/// ledger by the caller, which tells a `compensated` row the same way: src/http/lifecycle.rs.)
async fn unless_compensated(catalog: &Catalog, id: Uuid, answer: HoldAnswer) -> HoldAnswer {
    if matches!(
        answer,
        HoldAnswer::NotFound | HoldAnswer::Done | HoldAnswer::Refused(ClaimStatus::Compensated)
    ) {
        return answer;
    }
    match rows::find_claim(catalog.db(), id).await {
        Ok(Some(r)) if r.status == ClaimStatus::Compensated => {
            HoldAnswer::Refused(ClaimStatus::Compensated)
        }
        Ok(_) => answer,
        Err(e) => {
            tracing::debug!(claim_id = %id, error = %e, "could not read the ledger after a hold's decision; Redis's answer stands");
            answer
        }
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
                vec![sku.layout.name_for_user(sku.id(), user)]
            }
            _ => sku.layout.names(sku.id()),
        };
        for name in names {
            if let Some(answer) = decide_on(store, &name, id, caller, op).await? {
                let answer = unless_compensated(catalog, id, answer).await;
                if op == HoldOp::Cancel && answer == HoldAnswer::Done && sku.layout.is_sharded() {
                    // While anybody waits, the unit came back into its shard's pool: offer it
                    // to the line that comes first now rather than at the recovery task's next
                    // round. Best effort: the recovery task does the same within a second.
                    if let Err(e) = crate::shards::feed::feed(store, sku.id(), sku.layout).await {
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
    let row = match rows::find_claim(catalog.db(), id).await? {
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
