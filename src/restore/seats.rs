//! A restore's part for a seated SKU: the seat map rebuilt from the ledger, so a seat sold
//! before Redis lost its data (or came back older) is never free again (I1, docs/seats.md).
//! Taken: every seat of a live written claim (`issuance_seats`, kept by PostgreSQL's trigger)
//! and of a parked claim whose units were not given back (the same claims whose units the
//! restore keeps out of the stock, so the map's free seats are the stock).

use super::claims::Given;
use crate::error::InventoryError;
use crate::keys::SkuKeys;
use crate::seating::SeatPlan;
use crate::sku::SkuId;
use crate::store::{RedisConn, Store};

/// Writes the map anew: all free, then each taken seat set, in one pipeline (a map is at most
/// 12.5 KB and a venue's taken seats a few hundred thousand commands at most).
pub(super) async fn rebuild_map(
    store: &Store,
    con: &mut RedisConn,
    keys: &SkuKeys,
    db: &sqlx::PgPool,
    sku: &SkuId,
    plan: &SeatPlan,
    given: &Given,
) -> Result<usize, InventoryError> {
    let live: Vec<String> = sqlx::query_scalar("SELECT seat FROM issuance_seats WHERE sku = $1")
        .bind(sku)
        .fetch_all(db)
        .await?;
    let parked: Vec<(uuid::Uuid, Vec<String>)> = sqlx::query_as(
        // The parked claims the restore counts live (src/restore/claims.rs): still with the
        // reprocessor, not ended in Redis before they were written (a hold that expired or was
        // cancelled gave its seats back then). Before, every parked row's seats were marked
        // taken, resolved and ended ones too: seats nobody held, left out of the stock for
        // good (the gateway model's seated SKU, MODEL_SEED=1111).
        "SELECT claim_id, seats FROM persistence_pending
          WHERE sku = $1 AND seats IS NOT NULL AND status IN ('pending', 'reprocessing')
            AND claim_status NOT IN ('cancelled', 'expired')",
    )
    .bind(sku)
    .fetch_all(db)
    .await?;
    let taken: Vec<String> = live
        .into_iter()
        .chain(
            parked
                .into_iter()
                .filter(|(id, _)| !given.contains_key(id))
                .flat_map(|(_, seats)| seats),
        )
        .collect();
    let mut pipe = redis::pipe();
    pipe.cmd("SET")
        .arg(keys.seats())
        .arg(vec![0u8; plan.map_bytes()])
        .ignore();
    for seat in &taken {
        match plan.bit_of(seat) {
            Ok(bit) => {
                pipe.cmd("SETBIT")
                    .arg(keys.seats())
                    .arg(bit)
                    .arg(1)
                    .ignore();
            }
            Err(e) => {
                tracing::error!(sku = sku.as_str(), seat, error = %e, "a ledger seat the plan does not have")
            }
        }
    }
    store
        .bounded(async { Ok(pipe.query_async::<()>(con).await?) })
        .await?;
    Ok(taken.len())
}
