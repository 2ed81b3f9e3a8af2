//! Finishes transfers that a gateway began and did not finish (it died, or lost Redis's answer
//! between two steps), and feeds the waitlists: units kept in the shards' pools are offered
//! across a sharded SKU's lines in ticket order, and given back to open stock once nobody
//! waits ([`super::feed::feed`]). Runs in every gateway; every step is fenced by the
//! transfer id, so two gateways finishing the same transfer, or feeding the same line, move
//! each unit once.

use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use super::transfer;
use crate::error::{DbError, TaskError};
use crate::layout::Layout;
use crate::sku::SkuId;
use crate::store::Store;

/// How often the pending transfers of the sharded SKUs are looked at.
const EVERY: Duration = Duration::from_secs(1);
/// A transfer younger than this is left to the gateway that began it (it is most likely
/// finishing it right now; finishing it twice would be harmless, only wasted).
pub const RECOVER_AFTER: Duration = Duration::from_secs(3);

/// The recovery task.
pub struct Recovery {
    pub store: Store,
    pub db: PgPool,
}

impl Recovery {
    pub async fn run(self, shutdown: CancellationToken) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(EVERY) => {}
                _ = shutdown.cancelled() => break,
            }
            if let Err(e) = self.round(RECOVER_AFTER).await {
                tracing::debug!(error = %e, "shard transfer recovery round failed; retrying");
            }
        }
        tracing::info!("shard transfer recovery stopped");
    }

    /// Finishes every pending transfer older than `older_than` of every sharded SKU with a
    /// shard in the active set (or marked by this gateway lately), then feeds each SKU's
    /// waitlists ([`super::feed::feed`]). Returns how many transfers it finished.
    ///
    /// Only active SKUs: a shard with a pending transfer or pooled units has work and stays
    /// in the set until they are done ([`crate::activity::has_work`]; the transfer steps and the
    /// feed mark the shards they leave work on), so an idle catalog costs nothing here,
    /// however many sharded SKUs it holds.
    ///
    /// # Errors
    /// The active set's or the catalog's error (a shard's Redis errors are logged and
    /// skipped).
    pub async fn round(&self, older_than: Duration) -> Result<usize, TaskError> {
        let mut active = crate::activity::members(&self.store).await?;
        active.extend(self.store.recent_marks().recent());
        let mut catalog_skus: Vec<&str> = active
            .iter()
            .map(|n| crate::keys::split_shard(n).0)
            .collect();
        catalog_skus.sort_unstable();
        catalog_skus.dedup();
        let skus: Vec<(String, i32, Vec<i32>)> = sqlx::query_as(
            "SELECT sku, shards, shard_salts FROM skus
              WHERE sku = ANY($1) AND shards > 1 ORDER BY sku",
        )
        .bind(&catalog_skus)
        .fetch_all(&self.db)
        .await
        .map_err(DbError::from)?;
        let before = crate::clock::now_ms() - older_than.as_millis() as i64;
        let mut finished = 0;
        for (sku, shards, salts) in skus {
            let id = SkuId::trusted(&sku);
            let layout = Layout::stored(shards, &salts);
            for donor in 0..shards as u16 {
                // One SKU failing closed (a shard lost or stale until restore) must not keep
                // the others' transfers waiting: its errors are logged and the round goes on.
                let found = match transfer::pending(&self.store, id, layout, donor).await {
                    Ok(found) => found,
                    Err(e) => {
                        tracing::debug!(sku, donor, error = %e, "could not read a shard's pending transfers");
                        continue;
                    }
                };
                for p in found.into_iter().filter(|p| p.created_ms <= before) {
                    let applied = match transfer::complete(&self.store, id, layout, &p).await {
                        Ok(applied) => applied,
                        Err(e) => {
                            tracing::debug!(sku, transfer = %p.id, error = %e, "could not finish a pending transfer; retrying");
                            continue;
                        }
                    };
                    finished += 1;
                    tracing::info!(
                        sku,
                        transfer = %p.id,
                        donor = p.donor,
                        recipient = p.recipient,
                        units = p.units,
                        applied,
                        "finished a transfer between shards that its gateway left pending"
                    );
                }
            }
            match super::feed::feed(&self.store, id, layout).await {
                Ok(0) => {}
                Ok(units) => {
                    tracing::debug!(sku, units, "offered pooled units to the SKU's waitlists");
                }
                Err(e) => {
                    tracing::debug!(sku, error = %e, "could not feed the waitlist; retrying");
                }
            }
        }
        Ok(finished)
    }
}
