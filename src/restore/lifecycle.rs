//! Restore's lifecycle part: the holds still `held` (with their expiries), every parked hold's
//! record with its status, and the waitlist's line, in order, rebuilt from the ledger before the
//! SKU's state is written back (claims stay closed until then).

use futures_util::TryStreamExt;

use super::pipes::ShardPipes;
use crate::error::DbError;
use crate::keys::SkuKeys;
use crate::sku::SkuId;
use crate::store::{RedisConn, Store};

#[derive(sqlx::FromRow)]
struct HeldRow {
    claim_id: uuid::Uuid,
    user_id: String,
    quantity: i32,
    expires_ms: i64,
    offer: bool,
    status: crate::status::ClaimStatus,
    /// A seated hold's seats: its record carries their bits, which its end frees.
    seats: Option<Vec<String>>,
}

#[derive(sqlx::FromRow)]
struct EntryRow {
    entry_id: uuid::Uuid,
    user_id: String,
    position: i64,
    status: crate::status::EntryStatus,
    joined_ms: i64,
    quantity: i32,
}

/// Writes the SKU's holds and line from the ledger (replacing whatever Redis has of them).
/// Returns the highest join order, which every shard's `wl_order` continues from.
///
/// # Errors
/// Infrastructure errors; nothing of the state hash is written here.
pub(super) async fn stage(
    store: &Store,
    con: &mut RedisConn,
    shards: &[SkuKeys],
    db: &sqlx::PgPool,
    sku: &SkuId,
    given: &super::claims::Given,
    plan: Option<&crate::seating::SeatPlan>,
) -> Result<i64, crate::error::InventoryError> {
    // Every hold (an offer too), waitlist entry and line position goes back to its buyer's
    // shard (src/shards/line.rs: a sharded SKU has one line per shard).
    let home = |user: &str| usize::from(crate::layout::shard_of_user(user, shards.len() as i32));
    // One pipeline per shard: a pipeline reaches one slot's node on a cluster.
    let mut pipes = ShardPipes::new(shards.len());
    for (i, k) in shards.iter().enumerate() {
        pipes
            .add(i)
            .del(k.holds())
            .ignore()
            .del(k.expiry())
            .ignore()
            .del(k.waitlist())
            .ignore()
            .del(k.waitlist_entries())
            .ignore()
            .del(k.waitlist_users())
            .ignore();
    }
    // A parked hold's record comes back whatever its status: the compensation reads it to tell
    // a hold whose units already came back (cancelled, expired) from one still holding them
    // (lua/compensate.lua), and an offer's ends its entry with it.
    let mut holds = sqlx::query_as::<_, HeldRow>(
        "SELECT i.claim_id, i.user_id, i.quantity,
                (extract(epoch FROM i.expires_at) * 1000)::bigint AS expires_ms,
                EXISTS (SELECT 1 FROM waitlist w WHERE w.claim_id = i.claim_id) AS offer,
                i.status, i.seats
           FROM issuances i WHERE i.sku = $1 AND i.status = 'held' AND i.expires_at IS NOT NULL
         UNION ALL
         SELECT p.claim_id, p.user_id, p.quantity,
                (extract(epoch FROM p.expires_at) * 1000)::bigint, p.offer, p.claim_status,
                p.seats
           FROM persistence_pending p
          WHERE p.sku = $1 AND p.expires_at IS NOT NULL
            AND p.status IN ('pending', 'reprocessing')",
    )
    .bind(sku)
    .fetch(db);
    while let Some(mut h) = holds.try_next().await.map_err(DbError::from)? {
        // A parked hold whose units came back (a compensation gave them back, or the ledger
        // decided it and this restore counts them back) holds none, whatever its row's status
        // says: it comes back ended, never due to expire or to be cancelled, so its units do
        // not come back a second time (src/restore/claims.rs).
        if h.status == crate::status::ClaimStatus::Held {
            match given.get(&h.claim_id).map(String::as_str) {
                Some("compensated") => h.status = crate::status::ClaimStatus::Compensated,
                // A hold that had ended (cancelled or expired) before its compensation.
                Some(_) => h.status = crate::status::ClaimStatus::Expired,
                None => {}
            }
        }
        let id = h.claim_id.to_string();
        let mut rec = format!(
            "{}|{}|{}|{}|{}|{}",
            h.status,
            h.quantity,
            h.expires_ms,
            u8::from(h.offer),
            h.user_id.len(),
            h.user_id
        );
        if let (Some(plan), Some(seats)) = (plan, &h.seats) {
            // lib/lifecycle.lua's pack_hold: the seats and their bits, so its end frees
            // exactly them.
            let bits: Vec<String> = seats
                .iter()
                .filter_map(|id| plan.bit_of(id).ok().map(|b| format!("{b}:{id}")))
                .collect();
            rec.push('|');
            rec.push_str(&bits.join(","));
        }
        let shard = home(&h.user_id);
        let pipe = pipes.add(shard);
        pipe.hset(shards[shard].holds(), &id, rec).ignore();
        // Only a hold still held is due to expire.
        if h.status == crate::status::ClaimStatus::Held {
            pipe.zadd(shards[shard].expiry(), &id, h.expires_ms)
                .ignore();
        }
        pipes.flush_full(store, con).await?;
    }
    drop(holds);
    let mut entries = sqlx::query_as::<_, EntryRow>(
        "SELECT entry_id, user_id, position, status, quantity,
                (extract(epoch FROM created_at) * 1000)::bigint AS joined_ms
           FROM waitlist WHERE sku = $1 AND status IN ('waiting', 'offered')
          ORDER BY position",
    )
    .bind(sku)
    .fetch(db);
    while let Some(e) = entries.try_next().await.map_err(DbError::from)? {
        // An offer whose hold came back ended has ended with it (its claim id is its entry
        // id): it is neither anyone's place in line nor an offer open to take. The ledger's row
        // reads `offered` until the compensation closes it (src/reprocess/rows.rs).
        if given.contains_key(&e.entry_id) {
            continue;
        }
        let id = e.entry_id.to_string();
        // lua/lib/lifecycle.lua's pack_entry: the quantity only above 1.
        let rec = format!(
            "{}|{}|{}|{}|{}{}",
            e.status,
            e.position,
            e.joined_ms,
            e.user_id.len(),
            e.user_id,
            if e.quantity > 1 {
                format!("|{}", e.quantity)
            } else {
                String::new()
            }
        );
        let keys = &shards[home(&e.user_id)];
        let pipe = pipes.add(home(&e.user_id));
        pipe.hset(keys.waitlist_entries(), &id, rec)
            .ignore()
            .hset(keys.waitlist_users(), &e.user_id, &id)
            .ignore();
        if e.status == crate::status::EntryStatus::Waiting {
            pipe.zadd(keys.waitlist(), &id, e.position).ignore();
        }
        pipes.flush_full(store, con).await?;
    }
    drop(entries);
    pipes.flush_all(store, con).await?;
    let order: Option<i64> =
        sqlx::query_scalar("SELECT max(position) FROM waitlist WHERE sku = $1")
            .bind(sku)
            .fetch_one(db)
            .await
            .map_err(DbError::from)?;
    Ok(order.unwrap_or(0))
}
