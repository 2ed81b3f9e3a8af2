//! A claim's row, as `GET /v1/claims/{id}` shows it, found in the ledger's tables by id.

use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use crate::error::DbError;
use crate::status::ClaimStatus;

/// A claim as `GET /v1/claims/{id}` shows it.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct ClaimRow {
    pub claim_id: Uuid,
    pub sku: String,
    pub user: String,
    pub quantity: i32,
    pub status: ClaimStatus,
    pub expires_at: Option<chrono::DateTime<chrono::Utc>>,
    pub created_at: chrono::DateTime<chrono::Utc>,
    /// A seated claim's seats (API.md "Reserved seating").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seats: Option<Vec<String>>,
}

/// Finds a claim in `issuances`, else among the claims PostgreSQL refused (still `issued` to
/// the buyer until compensated), else in the quarantine (it won; an operator settles it). A winner not yet written is not found (the writer's lag is
/// milliseconds).
///
/// # Errors
/// The database error.
pub async fn find_claim(db: &PgPool, id: Uuid) -> Result<Option<ClaimRow>, DbError> {
    Ok(sqlx::query_as(
        "SELECT claim_id, sku, user_id AS user, quantity, status, expires_at, created_at, seats
           FROM issuances WHERE claim_id = $1
         UNION ALL
         SELECT claim_id, sku, user_id, quantity,
                CASE WHEN status = 'compensated' THEN 'compensated' ELSE claim_status END,
                expires_at, created_at, seats
           FROM persistence_pending WHERE claim_id = $1 AND status <> 'resolved'
         UNION ALL
         SELECT claim_id, sku, COALESCE(user_id, ''), COALESCE(quantity, 0), 'issued',
                NULL::timestamptz, created_at, NULL::text[]
           FROM quarantine WHERE claim_id = $1 AND resolved_at IS NULL
         LIMIT 1",
    )
    .bind(id)
    .fetch_optional(db)
    .await?)
}
