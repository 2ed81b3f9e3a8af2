//! The waitlist: joining a sold-out SKU's line, reading an entry, leaving. Offers are made by
//! the scripts that give units back (`give_back` in `lua/lib/lifecycle.lua`), never here. A
//! sharded SKU has a line per shard (src/shards/line.rs): a buyer's entry lives on the shard
//! its claims route to, so every call here names the owner's shard (the admin's tries each).

use serde::Serialize;
use uuid::Uuid;

use super::records::{Entry, Hold};
use super::{sku_of, LifecycleError};
use crate::catalog::{Catalog, Sku};
use crate::error::StoreError;
use crate::scripts;
use crate::sku::SkuId;
use crate::status::EntryStatus;
use crate::store::Store;

// The scripts' answers, named here where the HTTP layer asks for them.
pub use crate::scripts::lifecycle::{Joined, Left};

/// A waitlist entry as `GET /v1/waitlist/{entry_id}` shows it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, sqlx::FromRow)]
pub struct EntryView {
    pub entry_id: Uuid,
    pub sku: String,
    pub user: String,
    /// `waiting`, `offered`, `claimed`, `expired` or `left`.
    pub status: EntryStatus,
    /// The place in line while waiting (1: next to be offered); `null` otherwise.
    pub position: Option<i64>,
    /// The held claim of the offer, once offered.
    pub claim_id: Option<Uuid>,
    /// When the offer lapses, while offered.
    pub expires_at: Option<chrono::DateTime<chrono::Utc>>,
    /// The units the entry waits for: the seats its offer holds on a seated SKU, else 1.
    pub quantity: i32,
}

/// Joins the SKU's waitlist for `user`, waiting for `quantity` units (seats, on a seated SKU;
/// the caller checked it against the SKU).
///
/// # Errors
/// Redis could not decide (fail closed).
pub async fn join(
    store: &Store,
    sku: &Sku,
    user: &str,
    quantity: u32,
) -> Result<Joined, LifecycleError> {
    // A sharded SKU's buyer joins the line of its own shard, where its claims and its offer
    // are counted, ordered by a ticket of the SKU's; the other shards are checked first, not
    // atomically with the join (src/shards/line.rs).
    let home = sku.layout.shard_of_user(user);
    let check = if sku.layout.is_sharded() {
        Some(crate::shards::line::before_join(store, sku.id(), sku.layout, home).await?)
    } else {
        None
    };
    let name = sku.layout.name(sku.id(), home);
    let keys = store.keys(&name);
    let entry_id = crate::ids::mint(sku.tag);
    let mut con = store.hot();
    let ask = scripts::lifecycle::JoinAsk {
        entry_id: &entry_id,
        user,
        quantity,
        in_stock_elsewhere: check.is_some_and(|c| c.in_stock_elsewhere),
        ticket: check.map(|c| c.ticket),
    };
    let call = store.bounded(scripts::lifecycle::join_waitlist(
        &mut con,
        &keys,
        ask,
        store.floor(&name),
    ));
    let mut joined = crate::activity::with_mark(store, &name, call).await?;
    if let Joined::New { entry_id, position } | Joined::Existing { entry_id, position } =
        &mut joined
    {
        if sku.layout.is_sharded() && *position > 0 {
            // The script counts its own line; the buyer's place is in the SKU's.
            *position = sku_position(store, sku, home, &entry_id.to_string())
                .await
                .unwrap_or(*position);
        }
    }
    Ok(joined)
}

/// The entry, if it is `caller`'s (`None`: the admin): from Redis while it is live there, else
/// from the `waitlist` table.
///
/// # Errors
/// Infrastructure errors.
pub async fn find(
    store: &Store,
    catalog: &Catalog,
    entry_id: Uuid,
    caller: Option<&str>,
) -> Result<Option<EntryView>, LifecycleError> {
    let mut view = None;
    if let Some(sku) = sku_of(catalog, &entry_id).await? {
        for name in entry_shards(&sku, caller) {
            view = from_redis(store, sku.id(), &name, entry_id).await?;
            if let Some(v) = view.as_mut() {
                if sku.layout.is_sharded() && v.position.is_some() {
                    let home = sku.layout.shard_of_user(&v.user);
                    let id = entry_id.to_string();
                    v.position = sku_position(store, &sku, home, &id).await.or(v.position);
                }
                break;
            }
        }
    }
    let view = match view {
        Some(v) => Some(v),
        None => from_ledger(catalog, entry_id).await?,
    };
    Ok(view.filter(|v| caller.is_none_or(|u| u == v.user)))
}

/// The place of the waiting entry `id` of `home`'s line in the whole line of the sharded SKU
/// `sku` (src/shards/line.rs); `None` when Redis could not tell.
async fn sku_position(store: &Store, sku: &Sku, home: u16, id: &str) -> Option<i64> {
    match crate::shards::line::position(store, sku.id(), sku.layout, home, id).await {
        Ok(p) => p,
        Err(e) => {
            tracing::debug!(sku = %sku.sku, error = %e, "could not count the SKU's line; the shard's place is shown");
            None
        }
    }
}

/// The shards where `caller`'s entry may live: the owner's own shard (its line, src/shards/
/// line.rs), every shard for the admin; the SKU itself when it has one shard.
fn entry_shards(sku: &Sku, caller: Option<&str>) -> Vec<String> {
    match caller {
        Some(user) => vec![sku.layout.name_for_user(sku.id(), user)],
        None => sku.layout.names(sku.id()),
    }
}

/// The entry as `name`'s line holds it; `sku` in the view is the SKU, not the shard.
async fn from_redis(
    store: &Store,
    sku: &SkuId,
    name: &str,
    entry_id: Uuid,
) -> Result<Option<EntryView>, StoreError> {
    let keys = store.keys(name);
    let id = entry_id.to_string();
    let mut con = store.hot();
    let (entry, rank, hold): (Option<String>, Option<i64>, Option<String>) = store
        .bounded(async {
            Ok(redis::pipe()
                .cmd("HGET")
                .arg(keys.waitlist_entries())
                .arg(&id)
                .cmd("ZRANK")
                .arg(keys.waitlist())
                .arg(&id)
                .cmd("HGET")
                .arg(keys.holds())
                .arg(&id)
                .query_async(&mut con)
                .await?)
        })
        .await
        .map_err(super::read_error)?;
    let Some(e) = entry.as_deref().and_then(Entry::parse) else {
        return Ok(None);
    };
    let hold = hold.as_deref().and_then(Hold::parse);
    let offered = matches!(e.status, EntryStatus::Offered | EntryStatus::Claimed);
    Ok(Some(EntryView {
        entry_id,
        sku: sku.to_string(),
        user: e.user,
        position: (e.status == EntryStatus::Waiting)
            .then(|| rank.map(|r| r + 1))
            .flatten(),
        claim_id: offered.then_some(entry_id),
        expires_at: hold
            .filter(|_| e.status == EntryStatus::Offered)
            .and_then(|h| chrono::DateTime::from_timestamp_millis(h.expires_ms)),
        status: e.status,
        quantity: i32::try_from(e.quantity).unwrap_or(i32::MAX),
    }))
}

async fn from_ledger(
    catalog: &Catalog,
    entry_id: Uuid,
) -> Result<Option<EntryView>, LifecycleError> {
    Ok(sqlx::query_as(
        "SELECT w.entry_id, w.sku, w.user_id AS user, w.status,
                CASE WHEN w.status = 'waiting' THEN
                  (SELECT count(*) FROM waitlist o WHERE o.sku = w.sku AND o.status = 'waiting'
                      AND o.position <= w.position) END AS position,
                w.claim_id, w.quantity,
                CASE WHEN w.status = 'offered' THEN i.expires_at END AS expires_at
           FROM waitlist w LEFT JOIN issuances i ON i.claim_id = w.claim_id
          WHERE w.entry_id = $1",
    )
    .bind(entry_id)
    .fetch_optional(catalog.db())
    .await
    .map_err(crate::error::DbError::from)?)
}

/// Takes `caller`'s entry out of the line.
///
/// # Errors
/// Redis could not decide (fail closed).
pub async fn leave(
    store: &Store,
    catalog: &Catalog,
    entry_id: Uuid,
    caller: Option<&str>,
) -> Result<Left, LifecycleError> {
    if let Some(sku) = sku_of(catalog, &entry_id).await? {
        for name in entry_shards(&sku, caller) {
            let keys = store.keys(&name);
            let mut con = store.hot();
            let call = store.bounded(scripts::lifecycle::leave_waitlist(
                &mut con,
                &keys,
                &entry_id,
                caller,
                store.floor(&name),
            ));
            match crate::activity::with_mark(store, &name, call).await? {
                // Not on this shard (or not the caller's): the next, then the ledger.
                Left::NotFound => {}
                done => return Ok(done),
            }
        }
    }
    Ok(match find(store, catalog, entry_id, caller).await? {
        None => Left::NotFound,
        Some(v) if v.status == EntryStatus::Left => Left::Left,
        Some(v) if v.status.is_live() => {
            // The ledger has a live entry that Redis does not: Redis lost it (restore).
            return Err(StoreError::SkuLost.into());
        }
        Some(_) => Left::Ended,
    })
}
