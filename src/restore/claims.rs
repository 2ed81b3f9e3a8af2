//! Restore's claims part: the live claims streamed from the ledger, their idempotency records
//! written and their buyers' counts staged, and the records of keyed claims that ended, a chunk
//! at a time ([`super::pipes`]).

use std::collections::HashMap;

use futures_util::TryStreamExt;

use super::pipes::ShardPipes;
use crate::config::RECORD_TTL_SECS;
use crate::error::InventoryError;
use crate::keys::{idempotency_field, SkuKeys};
use crate::record::IdemRecord;
use crate::sku::SkuId;
use crate::store::{RedisConn, Store};

#[derive(sqlx::FromRow)]
struct LiveClaim {
    claim_id: uuid::Uuid,
    /// `None` for a quarantined winner whose entry could not be read.
    user_id: Option<String>,
    quantity: i64,
    idempotency_key: Option<String>,
    remaining_after: Option<i64>,
    /// A hold's expiry as it was given: its replay answers it, as the first answer did.
    expires_at: Option<chrono::DateTime<chrono::Utc>>,
    /// A claim PostgreSQL refused, still with the reprocessor.
    parked: bool,
    /// A parked claim whose compensation the ledger decided (its `issuances` row
    /// `compensated`): it is never recorded live, so its units are the stock's. (Only the live
    /// claims' query reads it.)
    #[sqlx(default)]
    compensating: bool,
    /// A seated claim's seats: its record is written in `claim_seats.lua`'s layout.
    #[sqlx(default)]
    seats: Option<Vec<String>>,
}

/// Streams the claims that hold units (written and live, refused and not yet compensated, or
/// quarantined and not yet settled by an operator), writes their idempotency records and stages
/// the per-user counts, a chunk at a time.
/// Returns the live units, the number of users holding them, and the parked claims whose units
/// a compensation already gave back (with their marker: "compensated" or "ended").
pub(super) async fn stage_live_claims(
    store: &Store,
    con: &mut RedisConn,
    keys: &[SkuKeys],
    staged: &[String],
    db: &sqlx::PgPool,
    sku: &SkuId,
) -> Result<(i64, usize, Given), InventoryError> {
    let mut rows = sqlx::query_as::<_, LiveClaim>(
        "SELECT claim_id, user_id, quantity::bigint AS quantity, idempotency_key,
                remaining_after, expires_at, false AS parked, false AS compensating, seats
           FROM issuances WHERE sku = $1 AND status IN ('issued', 'held', 'confirmed')
         UNION ALL
         SELECT p.claim_id, p.user_id, p.quantity::bigint, p.idempotency_key, p.remaining_after,
                p.expires_at, true,
                EXISTS (SELECT 1 FROM issuances i
                         WHERE i.claim_id = p.claim_id AND i.status = 'compensated'),
                p.seats
           FROM persistence_pending p
          WHERE p.sku = $1 AND p.status IN ('pending', 'reprocessing')
            AND p.claim_status NOT IN ('cancelled', 'expired')
         UNION ALL
         SELECT COALESCE(q.claim_id, '00000000-0000-0000-0000-000000000000'), q.user_id,
                COALESCE(q.quantity, 0)::bigint, NULL, NULL, NULL, false, false, NULL
           FROM quarantine q
          WHERE q.sku = $1 AND q.resolved_at IS NULL
            AND NOT EXISTS (SELECT 1 FROM issuances i WHERE i.claim_id = q.claim_id)
            AND NOT EXISTS (SELECT 1 FROM persistence_pending p WHERE p.claim_id = q.claim_id)",
    )
    .bind(sku)
    .fetch(db);
    let shards = keys.len() as i32;
    // Each buyer's count and records go to the buyer's shard, each shard's in pipelines of
    // its own (a pipeline reaches one slot's node on a cluster).
    let shard_of = |user: &str| usize::from(crate::layout::shard_of_user(user, shards));
    let mut held: HashMap<String, i64> = HashMap::new();
    let mut units = 0i64;
    let mut pipes = ShardPipes::new(keys.len());
    let mut parked = Vec::new();
    while let Some(c) = rows.try_next().await.map_err(crate::error::DbError::from)? {
        if c.parked {
            parked.push(c);
            continue;
        }
        count(c, &mut units, &mut held, &mut pipes, keys, &shard_of);
        pipes.flush_full(store, con).await?;
    }
    drop(rows);
    // A parked claim whose units a reprocessor already gave back (to the state this restore
    // closed) holds none, whatever its row says yet: its compensation marker tells. One whose
    // compensation the ledger decided holds none either, even when Redis lost the give-back
    // and its marker (a rollback): the ledger never records it live, so its units are the
    // stock's, and the marker is set again so that nothing gives them back twice. Counted live
    // instead, its units were lost for good when the reprocessor's give-back had reached the
    // state this restore replaces (the reprocessor then only closes the row: a SKU a unit
    // short, soak MODEL_SEED=15609882117256404618). Its hold comes back compensated and an
    // offer's entry ended (src/restore/lifecycle.rs; the reprocessor ends the entry in the
    // ledger, src/reprocess/rows.rs).
    let mut given = Given::new();
    for c in parked {
        let shard = shard_of(c.user_id.as_deref().unwrap_or(""));
        let home = &keys[shard];
        let marker: Option<String> = store
            .bounded(async {
                Ok(redis::cmd("GET")
                    .arg(home.compensation(&c.claim_id))
                    .query_async(&mut *con)
                    .await?)
            })
            .await?;
        match marker.as_deref() {
            Some(m @ ("compensated" | "ended")) => {
                given.insert(c.claim_id, m.to_string());
            }
            _ if c.compensating => {
                pipes
                    .add(shard)
                    .set_ex(
                        home.compensation(&c.claim_id),
                        "compensated",
                        crate::keys::COMPENSATION_MARKER_TTL_SECS,
                    )
                    .ignore();
                given.insert(c.claim_id, "compensated".to_string());
            }
            _ => count(c, &mut units, &mut held, &mut pipes, keys, &shard_of),
        }
    }
    pipes.flush_all(store, con).await?;
    for (user, n) in &held {
        let shard = shard_of(user);
        pipes.add(shard).hset(&staged[shard], user, *n).ignore();
        pipes.flush_full(store, con).await?;
    }
    pipes.flush_all(store, con).await?;
    Ok((units, held.len(), given))
}

/// Parked claims whose units are back, with their marker: "compensated" (a compensation gave
/// them back, or the ledger decided it and this restore counts them back) or "ended" (the
/// compensation found the hold ended). Restore counts none of their units and stages no hold
/// or offer of theirs that could give them back again (src/restore/lifecycle.rs).
pub(super) type Given = std::collections::HashMap<uuid::Uuid, String>;

/// Counts one live claim's units (and its buyer's), and queues its idempotency record on its
/// buyer's shard.
fn count(
    c: LiveClaim,
    units: &mut i64,
    held: &mut HashMap<String, i64>,
    pipes: &mut ShardPipes,
    keys: &[SkuKeys],
    shard_of: &impl Fn(&str) -> usize,
) {
    *units += c.quantity;
    let Some(user_id) = c.user_id.as_deref() else {
        return;
    };
    *held.entry(user_id.to_string()).or_default() += c.quantity;
    record(c, pipes, keys, shard_of);
}

/// Queues a keyed claim's idempotency record, as `claim.lua` wrote it, on its buyer's shard.
fn record(
    c: LiveClaim,
    pipes: &mut ShardPipes,
    keys: &[SkuKeys],
    shard_of: &impl Fn(&str) -> usize,
) {
    let (Some(user_id), Some(k)) = (c.user_id, c.idempotency_key) else {
        return;
    };
    let shard = shard_of(&user_id);
    let record = match &c.seats {
        // claim_seats.lua's layout; the ledger keeps the seats, not the request that took
        // them, so "*" lets the same key's retry replay them (a new key decides afresh).
        Some(seats) => format!(
            "*|{}|{}|{}|{}",
            c.claim_id,
            c.remaining_after.unwrap_or(0),
            seats.join(","),
            c.expires_at.map_or(0, |t| t.timestamp_millis())
        ),
        None => IdemRecord {
            claim_id: c.claim_id,
            quantity: c.quantity as u32,
            remaining: c.remaining_after.unwrap_or(0),
            expires_ms: c.expires_at.map(|t| t.timestamp_millis()),
        }
        .render(),
    };
    pipes
        .add(shard)
        .hset(
            keys[shard].idempotency(),
            &idempotency_field(&user_id, &k)[..],
            record,
        )
        .ignore();
}

/// Writes the idempotency records of keyed claims that won and then ended without their units
/// (a hold cancelled or expired) within the records' lifetime: a retry under such a key
/// replays its first answer, as it would have before Redis lost the record (I4); a seated
/// claim's in `claim_seats.lua`'s layout (before, a seated hold's was written as a count
/// claim's, and its retry answered 422: the gateway model's seated SKU). A compensated
/// claim's record is not rebuilt: its compensation dropped it, so a retry is decided afresh.
pub(super) async fn stage_ended_records(
    store: &Store,
    con: &mut RedisConn,
    keys: &[SkuKeys],
    db: &sqlx::PgPool,
    sku: &SkuId,
) -> Result<(), InventoryError> {
    let mut rows = sqlx::query_as::<_, LiveClaim>(
        "SELECT claim_id, user_id, quantity::bigint AS quantity, idempotency_key,
                remaining_after, expires_at, false AS parked, seats
           FROM issuances
          WHERE sku = $1 AND status IN ('cancelled', 'expired') AND idempotency_key IS NOT NULL
            AND created_at > now() - make_interval(secs => $2)
         UNION ALL
         SELECT claim_id, user_id, quantity::bigint, idempotency_key, remaining_after,
                expires_at, true, seats
           FROM persistence_pending
          WHERE sku = $1 AND status IN ('pending', 'reprocessing')
            AND claim_status IN ('cancelled', 'expired') AND idempotency_key IS NOT NULL
            AND created_at > now() - make_interval(secs => $2)",
    )
    .bind(sku)
    .bind(RECORD_TTL_SECS as f64)
    .fetch(db);
    let shards = keys.len() as i32;
    let shard_of = |user: &str| usize::from(crate::layout::shard_of_user(user, shards));
    let mut pipes = ShardPipes::new(keys.len());
    while let Some(c) = rows.try_next().await.map_err(crate::error::DbError::from)? {
        record(c, &mut pipes, keys, &shard_of);
        pipes.flush_full(store, con).await?;
    }
    drop(rows);
    pipes.flush_all(store, con).await?;
    Ok(())
}
