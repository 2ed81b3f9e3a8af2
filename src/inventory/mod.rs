//! Operator actions on a SKU (declare, restock; restore is in [`crate::restore`]).
//!
//! Each action keeps PostgreSQL (the catalog and the ledger) and Redis (the stock) in step,
//! under the SKU's lock ([`SkuLock`], held across the Redis step), so two operator actions on
//! one SKU never interleave. Where an answer from Redis is lost, the action reads it back
//! (never sends it twice) and moves PostgreSQL only on a definite answer; while it cannot
//! know, it leaves the stores in the order that can only undersell.

use sqlx::PgPool;

use crate::catalog::{self, Catalog};
use crate::error::{DbError, InventoryError, Refusal};
// Answered while this action holds the SKU's operator lock: the view must not wait for it.
use crate::ledger::{view_under_lock as view, SkuView};
use crate::scripts::{self, Declared};
use crate::sku::SkuId;
use crate::store::Store;

mod lock;
mod restock;

pub use lock::SkuLock;
pub use restock::{restock, settle_restocks, settle_stuck_restocks, RestockSweeper};

/// The result of a declare: whether the SKU is new (201) or already existed (200).
pub struct Declaration {
    pub created: bool,
    pub view: SkuView,
}

/// What a declare sets besides the total (and may change on an existing SKU).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkuTerms {
    pub per_user_limit: i32,
    pub hold_seconds: i32,
    /// 0: offers are held `hold_seconds` (see [`crate::catalog::Sku::terms`]).
    pub offer_seconds: i32,
    pub opens_at: Option<chrono::DateTime<chrono::Utc>>,
    pub closes_at: Option<chrono::DateTime<chrono::Utc>>,
    /// Redis shards (1..=16, see [`crate::shards`]); fixed at the first declare: another count
    /// later is refused like another total.
    pub shards: i32,
    /// The waiting room's settings; `None` leaves a SKU's queue as it is (a queue, once
    /// declared, stays: its visitors hold tickets).
    pub queue: Option<QueueTerms>,
    /// A seated SKU's plan (its total is the number of seats; docs/seats.md): fixed at the
    /// first declare, another plan later is refused like another total.
    pub seats: Option<std::sync::Arc<crate::seating::SeatPlan>>,
}

/// The `queue` of a declare (validated by the HTTP layer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueTerms {
    pub admit_per_second: i32,
    pub admission_ttl_seconds: i32,
    pub prequeue_from: Option<chrono::DateTime<chrono::Utc>>,
    /// `overbook` in thousandths.
    pub overbook_milli: i32,
    /// The waiting page's settings, checked.
    pub page: Option<crate::queue::page::PageSettings>,
}

/// Declares a SKU, seeding its stock in Redis only if absent.
///
/// The stock is seeded only while the catalog has never seen Redis hold it, the ledger holds
/// no claim for the SKU and no state sequence was ever recorded: after that, a missing state
/// means Redis lost it, and only restore (from the ledger) may bring it back.
///
/// # Errors
/// [`Refusal::SkuExists`] for another total, [`Refusal::StatePresent`] for a new row whose id
/// Redis holds a state for; infrastructure errors otherwise.
pub async fn declare(
    store: &Store,
    catalog: &Catalog,
    sku: &SkuId,
    total: i64,
    terms: &SkuTerms,
) -> Result<Declaration, InventoryError> {
    let db = catalog.db();
    let _lock = SkuLock::acquire(db, sku).await?;
    // The shards' placement is chosen only for a SKU the catalog does not hold yet, and
    // written by the INSERT that creates its row: a re-declare, or a second gateway declaring
    // the same SKU with another view of the cluster, reads the first row's salts back below.
    let layout = if catalog::fetch(db, sku).await?.is_none() {
        crate::shards::placement::for_new_sku(store, sku, terms.shards).await
    } else {
        crate::layout::Layout::unsalted(terms.shards)
    };
    let inserted = sqlx::query(
        "INSERT INTO skus (sku, total, per_user_limit, hold_seconds, offer_seconds, opens_at,
                           closes_at, shards, shard_salts, seats)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
         ON CONFLICT (sku) DO NOTHING",
    )
    .bind(sku)
    .bind(total)
    .bind(terms.per_user_limit)
    .bind(terms.hold_seconds)
    .bind(terms.offer_seconds)
    .bind(terms.opens_at)
    .bind(terms.closes_at)
    .bind(terms.shards)
    .bind(layout.stored_salts())
    .bind(terms.seats.as_ref().map(|p| p.to_json().to_string()))
    .execute(db)
    .await?
    .rows_affected()
        == 1;
    let row = catalog::fetch(db, sku)
        .await?
        .ok_or(InventoryError::Refused(Refusal::UnknownSku))?;
    if !inserted {
        if row.total != total || row.layout.count() != terms.shards || row.plan != terms.seats {
            return Err(InventoryError::Refused(Refusal::SkuExists));
        }
        sqlx::query(
            "UPDATE skus SET per_user_limit = $2, hold_seconds = $3, offer_seconds = $4,
                    opens_at = $5, closes_at = $6, updated_at = now()
             WHERE sku = $1",
        )
        .bind(sku)
        .bind(terms.per_user_limit)
        .bind(terms.hold_seconds)
        .bind(terms.offer_seconds)
        .bind(terms.opens_at)
        .bind(terms.closes_at)
        .execute(db)
        .await?;
    }
    if let Some(q) = &terms.queue {
        // The seed is chosen once, by the first declare with a queue, and never replaced: its
        // commitment is public from then on (docs/waiting-room.md).
        sqlx::query(
            "UPDATE skus SET queue_admit_per_second = $2, queue_admission_ttl_seconds = $3,
                    queue_prequeue_from = $4, queue_seed = COALESCE(queue_seed, $5),
                    queue_overbook_milli = $6, queue_version = queue_version + 1,
                    queue_page = $7
             WHERE sku = $1",
        )
        .bind(sku)
        .bind(q.admit_per_second)
        .bind(q.admission_ttl_seconds)
        .bind(q.prequeue_from)
        .bind(crate::queue::order::new_seed())
        .bind(q.overbook_milli)
        .bind(
            q.page
                .as_ref()
                .map(|p| serde_json::to_string(p).unwrap_or_default()),
        )
        .execute(db)
        .await?;
    }
    let row = catalog::fetch(db, sku)
        .await?
        .ok_or(InventoryError::Refused(Refusal::UnknownSku))?;
    let seed = !row.seeded && row.redis_seq == 0 && !ledger_has_claims(db, sku).await?;
    let mut con = store.hot();
    // Each shard is seeded (or updated) as a SKU of its own: the total split evenly, the
    // remainder to the lowest shards, each shard's sequence in its own range. One shard found
    // holding a state stamped by another declare refuses the whole declare.
    let mut declared = Declared::Seeded;
    let parts = crate::layout::split_total(total, row.layout.count());
    for (i, part) in parts.into_iter().enumerate() {
        let shard = i as u16;
        let keys = store.keys(&row.layout.name(sku, shard));
        // A lost answer is safe to send again: the seed is stamped with the row's declare id,
        // so a second send finds its own seed and changes nothing.
        let one = store
            .bounded(scripts::declare_shard(
                &mut con,
                &keys,
                seed,
                part,
                &row.terms(),
                &row.declare_id,
                crate::layout::seq_base(shard),
            ))
            .await?;
        declared = match (declared, one) {
            (Declared::Foreign, _) | (_, Declared::Foreign) => Declared::Foreign,
            (Declared::Lost, _) | (_, Declared::Lost) => Declared::Lost,
            (Declared::AlreadyPresent, _) | (_, Declared::AlreadyPresent) => {
                Declared::AlreadyPresent
            }
            _ => Declared::Seeded,
        };
    }
    match declared {
        Declared::Seeded | Declared::AlreadyPresent => {
            if let Some(plan) = &row.plan {
                seed_seat_map(store, sku, plan).await?;
            }
            if !row.seeded {
                sqlx::query("UPDATE skus SET seeded = true WHERE sku = $1")
                    .bind(sku)
                    .execute(db)
                    .await?;
            }
        }
        Declared::Foreign => {
            if inserted {
                sqlx::query("DELETE FROM skus WHERE sku = $1 AND declare_id = $2 AND NOT seeded")
                    .bind(sku)
                    .bind(row.declare_id)
                    .execute(db)
                    .await?;
            }
            catalog.load(sku).await?;
            tracing::warn!(
                sku = sku.as_str(),
                "declare refused: redis holds a state this catalog did not seed"
            );
            return Err(InventoryError::Refused(Refusal::StatePresent));
        }
        Declared::Lost => {}
    }
    if let Some(q) = &row.queue.0 {
        let keys = store.keys(sku.as_str());
        store
            .bounded(crate::queue::calls::configure(
                &mut con,
                &keys,
                &crate::queue::RedisSettings::from(q),
            ))
            .await?;
    }
    catalog.load(sku).await?;
    Ok(Declaration {
        created: inserted,
        view: view(store, catalog, sku).await?,
    })
}

/// Seeds a seated SKU's seat map (every seat free) only if absent, like its stock: a map that
/// is there holds sold seats.
async fn seed_seat_map(
    store: &Store,
    sku: &SkuId,
    plan: &crate::seating::SeatPlan,
) -> Result<(), InventoryError> {
    let key = store.keys(sku.as_str()).seats();
    let zeros = vec![0u8; plan.map_bytes()];
    let mut con = store.hot();
    let _: Option<String> = store
        .bounded(async {
            redis::cmd("SET")
                .arg(&key)
                .arg(zeros)
                .arg("NX")
                .query_async(&mut con)
                .await
                .map_err(crate::error::StoreError::from)
        })
        .await?;
    // The rows go into the state on every declare (an earlier gateway's seated SKU gets them
    // too): the waitlist's offers search them for an entry's best seats.
    store
        .bounded(crate::scripts::seats::set_rows(
            &mut con,
            &store.keys(sku.as_str()),
            plan,
        ))
        .await?;
    Ok(())
}

async fn ledger_has_claims(db: &PgPool, sku: &SkuId) -> Result<bool, DbError> {
    Ok(sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM issuances WHERE sku = $1)
             OR EXISTS (SELECT 1 FROM persistence_pending WHERE sku = $1)",
    )
    .bind(sku)
    .fetch_one(db)
    .await?)
}
