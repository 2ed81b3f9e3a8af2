//! Reading the ledger: one claim by id, and the accounting of every SKU (reconcile).

use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use crate::catalog::{self, Catalog};
use crate::error::DbError;
use crate::inventory::{self, InventoryError, SkuView};
use crate::store::Store;

/// A claim as `GET /v1/claims/{id}` shows it.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct ClaimRow {
    pub claim_id: Uuid,
    pub sku: String,
    pub user: String,
    pub quantity: i32,
    pub status: String,
    pub expires_at: Option<chrono::DateTime<chrono::Utc>>,
    pub created_at: chrono::DateTime<chrono::Utc>,
}

/// Finds a claim in `issuances`, else among the claims PostgreSQL refused (still `issued` to
/// the buyer until compensated). A winner not yet written is not found (the writer's lag is
/// milliseconds).
///
/// # Errors
/// The database error.
pub async fn find_claim(db: &PgPool, id: Uuid) -> Result<Option<ClaimRow>, DbError> {
    Ok(sqlx::query_as(
        "SELECT claim_id, sku, user_id AS user, quantity, status,
                NULL::timestamptz AS expires_at, created_at
           FROM issuances WHERE claim_id = $1
         UNION ALL
         SELECT claim_id, sku, user_id, quantity,
                CASE WHEN status = 'compensated' THEN 'compensated' ELSE 'issued' END,
                NULL::timestamptz, created_at
           FROM persistence_pending WHERE claim_id = $1 AND status <> 'resolved'
         LIMIT 1",
    )
    .bind(id)
    .fetch_optional(db)
    .await?)
}

/// The view of every SKU (or of one), for `dropgate reconcile`.
///
/// # Errors
/// Database errors; an unreachable Redis shows as `remaining: null`, not as an error.
pub async fn accounting(
    store: &Store,
    catalog: &Catalog,
    only: Option<&str>,
) -> Result<Vec<SkuView>, InventoryError> {
    let ids = match only {
        Some(s) => vec![s.to_string()],
        None => catalog::all_ids(catalog.db()).await?,
    };
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        out.push(inventory::view(store, catalog, &id).await?);
    }
    Ok(out)
}

/// Renders views as the table `dropgate reconcile` prints.
pub fn table(views: &[SkuView]) -> String {
    let mut s = format!(
        "{:<24} {:>10} {:>10} {:>10} {:>10} {:>10} {:>12} {:>10}\n",
        "sku", "total", "remaining", "recorded", "in_flight", "pending", "compensated", "status"
    );
    let opt = |v: Option<i64>| v.map_or("?".to_string(), |n| n.to_string());
    for v in views {
        s.push_str(&format!(
            "{:<24} {:>10} {:>10} {:>10} {:>10} {:>10} {:>12} {:>10}\n",
            v.sku,
            v.total,
            opt(v.remaining),
            v.recorded,
            opt(v.in_flight),
            v.pending,
            v.compensated,
            if v.consistent { "ok" } else { "MISMATCH" }
        ));
    }
    s
}
