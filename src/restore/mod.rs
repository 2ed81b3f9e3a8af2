//! Restore: rebuilding a SKU's Redis state from the ledger, after Redis lost it or came back
//! with older data (a stale state).
//!
//! Work grows with the ledger, so it is done in bounded chunks: the live claims are streamed
//! from PostgreSQL, idempotency records and per-user counts are written [`pipes::CHUNK`] at a
//! time (`claims.rs`), the counts into a staging key that the final script moves into place
//! with the state hash itself, so claims stay closed until everything is back; the holds and
//! the waitlist's line are rebuilt the same way before it (`lifecycle.rs`).

use std::time::Duration;

use crate::catalog::{self, Catalog};
use crate::error::{InventoryError, Refusal, StoreError};
use crate::inventory::SkuLock;
use crate::keys::SkuKeys;
// Answered while this action holds the SKU's operator lock: the view must not wait for it.
use crate::ledger::{view_under_lock as view, SkuView};
use crate::scripts;
use crate::sku::SkuId;
use crate::store::Store;

mod claims;
mod lifecycle;
mod pipes;
mod seats;

use claims::{stage_ended_records, stage_live_claims};

/// How long a restore waits for the writer to empty the SKU's journal.
const JOURNAL_DRAIN_LIMIT: Duration = Duration::from_secs(15);

/// Rebuilds the SKU's Redis state from the ledger. A state marked stale is rebuilt without
/// `force` (it is known to be wrong); any other present state needs `force`.
///
/// # Errors
/// [`Refusal::StatePresent`] when Redis holds the SKU and `force` is off, or infrastructure
/// errors.
pub async fn restore(
    store: &Store,
    catalog: &Catalog,
    sku: &SkuId,
    force: bool,
) -> Result<SkuView, InventoryError> {
    let db = catalog.db();
    // One operator action per SKU at a time, across gateways: no restock moves the total
    // while the stock is computed from it.
    let mut lock = SkuLock::acquire(db, sku).await?;
    // Before anything is rebuilt: the holds and waitlist staged below need the expiry worker,
    // and a forced restore waits for the writers to empty the journal.
    crate::activity::mark(store, sku.as_str()).await;
    // Restocks in flight move the total: settle them before it is read.
    crate::inventory::settle_restocks(store, db, sku, &mut lock, Duration::ZERO).await?;
    let row = catalog::fetch(db, sku)
        .await?
        .ok_or(InventoryError::Refused(Refusal::UnknownSku))?;
    // Every shard of the SKU is rebuilt together (one shard for most SKUs: src/shards/).
    let names = row.layout.names(sku);
    let keys: Vec<SkuKeys> = names.iter().map(|n| store.keys(n)).collect();
    for name in names.iter().skip(1) {
        crate::activity::mark(store, name).await;
    }
    let mut con = store.hot();
    // A state behind the ledger's mark is an older copy (a rollback) even when no script has
    // run on it since to mark it stale: nobody claiming from it, it would keep what Redis
    // lost (a restock's -3 showed as 3 units over for good) while every restore was refused.
    let floors = crate::freshness::shard_marks::read_floors(db, &names).await?;
    let mut seqs = Vec::with_capacity(keys.len());
    let (mut present, mut missing, mut stale) = (false, false, None::<String>);
    for (k, name) in keys.iter().zip(&names) {
        let (stock, seq, why, inc): (Option<i64>, Option<i64>, Option<String>, Option<i64>) = store
            .bounded(async {
                Ok(redis::cmd("HMGET")
                    .arg(k.state())
                    .arg("stock")
                    .arg("seq")
                    .arg("stale")
                    .arg("inc")
                    .query_async(&mut con)
                    .await?)
            })
            .await?;
        present |= stock.is_some();
        missing |= stock.is_none();
        let floor = floors.iter().find(|(n, _)| n == name).map(|(_, f)| *f);
        let behind = floor.filter(|f| stock.is_some() && f.is_above(seq, inc));
        stale = stale
            .or(why)
            .or(behind.map(|f| format!("behind the ledger's mark {}", f.seq)));
        seqs.push(seq.unwrap_or(0));
    }
    // A SKU with a shard lost fails closed as a whole: like a lost SKU, it needs no force.
    if present && !missing && stale.is_none() && !force {
        return Err(InventoryError::Refused(Refusal::StatePresent));
    }
    let epoch = lock.epoch().await?;
    // Close the SKU first (claims fail closed), so the ledger stops moving under us; a state a
    // newer operator action touched means this restore's lock is gone.
    for k in &keys {
        if !store
            .bounded(scripts::close_sku(&mut con, k, epoch))
            .await?
        {
            return Err(
                StoreError::Unavailable("a newer operator action holds the SKU".into()).into(),
            );
        }
    }
    // Winners decided before the close must be in the ledger before it is read, or their units
    // would be counted nowhere (and sold again).
    for k in &keys {
        wait_for_empty_journal(store, k).await?;
    }
    // Above every sequence either store has seen, so no gateway's mark is ahead of it; each
    // shard in its own range.
    let mut new_seqs = Vec::with_capacity(keys.len());
    for (i, name) in names.iter().enumerate() {
        let mark = crate::freshness::shard_marks::of(db, name).await?;
        let base = crate::layout::seq_base(i as u16);
        new_seqs.push(mark.max(seqs[i]).max(base) + 1);
    }
    // The waiting room's line, from the tickets the ledger holds, while the state is out of
    // Redis (every queue script answers `lost` until the state is back).
    let line = match &row.queue.0 {
        Some(_) => Some(crate::queue::rebuild::rebuild(store, db, sku.as_str()).await?),
        None => None,
    };
    let restore_id = uuid::Uuid::new_v4();
    let staged: Vec<String> = keys.iter().map(|k| k.users_restore(&restore_id)).collect();
    let (units, users, given) = stage_live_claims(store, &mut con, &keys, &staged, db, sku).await?;
    stage_ended_records(store, &mut con, &keys, db, sku).await?;
    let wl_order =
        lifecycle::stage(store, &mut con, &keys, db, sku, &given, row.plan.as_deref()).await?;
    // A seated SKU's map, while claims are closed: no seat sold before is free again.
    if let Some(plan) = &row.plan {
        seats::rebuild_map(store, &mut con, &keys[0], db, sku, plan, &given).await?;
    }
    let terms = row.terms();
    // The total as it is now, and proof that no newer operator action (which would have taken
    // a newer epoch) has moved it since this restore's lock: a lock lost with its connection
    // would otherwise let a restock finish in between, and the stock computed from a total it
    // changed would sell what it took back.
    let (total, current): (i64, i64) =
        sqlx::query_as("SELECT total, op_epoch FROM skus WHERE sku = $1")
            .bind(sku)
            .fetch_one(db)
            .await?;
    if current != epoch {
        return Err(StoreError::Unavailable("a newer operator action holds the SKU".into()).into());
    }
    let mut stock = total - units;
    if stock < 0 {
        tracing::error!(
            sku = sku.as_str(),
            oversold = -stock,
            "the ledger holds more live units than the total"
        );
        stock = 0;
    }
    // The remaining stock all on shard 0, rebuilt last: the others (stock 0) first, so no
    // shard opens with units while a sibling is still closed.
    let sharded = keys.len() > 1;
    for i in (0..keys.len()).rev() {
        let rebuild = scripts::operator::Rebuild {
            staged: &staged[i],
            stock: if i == 0 { stock } else { 0 },
            per_user_limit: row.per_user_limit,
            seq: new_seqs[i],
            declare_id: row.declare_id,
            epoch,
            terms,
            // Every shard's line continues above the highest join order the ledger has (each
            // shard numbers its own line's joins; src/shards/line.rs).
            wl_order,
            // The generation: no transfer begun before this restore applies to its states.
            generation: sharded.then_some(epoch),
            rows: row.plan.as_ref().map(|p| p.rows_spec(None).to_string()),
        };
        let applied = store
            .bounded(scripts::operator::restore_sku(&mut con, &keys[i], &rebuild))
            .await?;
        if !applied {
            // Another restore (whose lock this one's replaced) rebuilt it first, from the
            // same ledger: drop what this one staged.
            for key in &staged {
                let _ = store
                    .bounded(async {
                        Ok(redis::cmd("DEL")
                            .arg(key)
                            .query_async::<()>(&mut con)
                            .await?)
                    })
                    .await;
            }
            return Err(InventoryError::Refused(Refusal::StatePresent));
        }
    }
    // The queue's settings at once, not at the admitter's next catalog read: a line lost with
    // its hash has no rate until then.
    if let Some(q) = &row.queue.0 {
        store
            .bounded(crate::queue::calls::configure(
                &mut con,
                &keys[0],
                &crate::queue::RedisSettings::from(q),
            ))
            .await?;
    }
    for (name, seq) in names.iter().zip(&new_seqs).skip(1) {
        crate::freshness::shard_marks::raise(db, name, *seq).await?;
    }
    let new_seq = new_seqs[0];
    sqlx::query(
        "UPDATE skus SET seeded = true, redis_seq = GREATEST(redis_seq, $2) WHERE sku = $1",
    )
    .bind(sku)
    .bind(new_seq)
    .execute(db)
    .await?;
    tracing::info!(
        sku = sku.as_str(),
        units,
        users,
        force,
        stale = stale.as_deref().unwrap_or(""),
        waiting = line.map_or(0, |l| l.waiting),
        admitted = line.map_or(0, |l| l.admitted),
        "restored the SKU's Redis state from the ledger"
    );
    view(store, catalog, sku).await
}

async fn wait_for_empty_journal(store: &Store, keys: &SkuKeys) -> Result<(), StoreError> {
    let deadline = tokio::time::Instant::now() + JOURNAL_DRAIN_LIMIT;
    loop {
        let mut con = store.hot();
        let len: i64 = store
            .bounded(async {
                Ok(redis::cmd("XLEN")
                    .arg(keys.journal())
                    .query_async(&mut con)
                    .await?)
            })
            .await?;
        if len == 0 {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            tracing::warn!(
                journal = len,
                "restore gave up waiting for the writer; the SKU stays closed"
            );
            return Err(StoreError::Unavailable(format!(
                "{len} journal entries not yet written"
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
