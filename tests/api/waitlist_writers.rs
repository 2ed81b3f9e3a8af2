//! Two gateways' writers share a SKU's journal, so one entry's records can reach the ledger out
//! of order: a join read by a writer that stalls (or is killed, its entries taken over later)
//! is written after the leave another writer read. The ledger must still tell the entry's
//! story: found by the gateway model (`MODEL_SEED=12011016677555986856`), where a client read a
//! claim id on a left entry and the claim was never there.

use std::time::Duration;

use serde_json::json;
use uuid::Uuid;

use crate::gate::RowGate;
use crate::helpers::*;
use crate::lifecycle::{claim_one, declare_with, delete_as, get_as, settled};
use crate::parked_holds::join;

/// The advisory lock the test holds to keep a writer's insert of a `waiting` entry waiting.
const JOIN_GATE: i64 = 220_312_031;

async fn entry_row(db: &sqlx::PgPool, entry: Uuid) -> Option<(String, Option<Uuid>)> {
    sqlx::query_as("SELECT status, claim_id FROM waitlist WHERE entry_id = $1")
        .bind(entry)
        .fetch_optional(db)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_left_before_its_join_is_written_names_no_claim() {
    let iso = Isolation::new();
    let a = spawn_with_config(iso.raw_config(REDIS_URL)).await;
    let b = spawn_with_config(iso.raw_config(REDIS_URL)).await;
    let r = declare_with(&a, "wo", json!({"total": 1, "hold_seconds": 600})).await;
    assert_eq!(r.status(), 201);
    let (s, body) = claim_one(&a, "wo", "winner").await;
    assert_eq!(s, 201, "{body}");
    settled(&a, &a.probe, "wo").await;

    let gate = RowGate::close(
        &a.db,
        "test_join_gate",
        "BEFORE INSERT ON waitlist",
        "NEW.status = 'waiting'",
        JOIN_GATE,
    )
    .await;
    let (s, body) = join(&a, "wo", "ann").await;
    assert_eq!(s, 201, "{body}");
    let entry: Uuid = body["entry_id"].as_str().unwrap().parse().unwrap();
    // One writer holds the join, waiting at the gate.
    wait_for(Duration::from_secs(20), || gate.holds_one(&b.db)).await;
    // The other writer takes the leave and writes it first.
    let (s, body) = delete_as(&a, &format!("/v1/waitlist/{entry}"), &token("ann")).await;
    assert_eq!(s, 200, "{body}");
    wait_for(Duration::from_secs(20), || async {
        entry_row(&a.db, entry).await.is_some()
    })
    .await;
    gate.open().await;
    settled(&a, &a.probe, "wo").await;

    assert_eq!(
        entry_row(&a.db, entry).await,
        Some(("left".to_string(), None)),
        "an entry never offered names no claim"
    );
    for api in [&a, &b] {
        let (s, body) = get_as(api, &format!("/v1/waitlist/{entry}"), &token("ann")).await;
        assert_eq!((s, body["status"].as_str()), (200, Some("left")), "{body}");
        assert!(body["claim_id"].is_null(), "no claim to name: {body}");
    }
}

/// A ledger written before the fix keeps its offers' claims and loses only the claim ids of
/// entries never offered.
#[tokio::test]
async fn the_migration_clears_only_the_claims_no_table_holds() {
    let iso = Isolation::new();
    let db = dropgate::db::connect_and_migrate(&iso.database_url)
        .await
        .expect("PostgreSQL at 127.0.0.1:5432");
    let (offered, never) = (Uuid::new_v4(), Uuid::new_v4());
    sqlx::query(
        "INSERT INTO issuances (claim_id, sku, user_id, quantity, status, created_at)
         VALUES ($1, 'wm', 'ann', 1, 'expired', now())",
    )
    .bind(offered)
    .execute(&db)
    .await
    .unwrap();
    for (entry, position) in [(offered, 1), (never, 2)] {
        sqlx::query(
            "INSERT INTO waitlist (entry_id, sku, user_id, position, status, claim_id, created_at)
             VALUES ($1, 'wm', 'ann', $2, 'expired', $1, now())",
        )
        .bind(entry)
        .bind(position)
        .execute(&db)
        .await
        .unwrap();
    }
    sqlx::raw_sql(include_str!(
        "../../migrations/0016_waitlist_claims_never_offered.sql"
    ))
    .execute(&db)
    .await
    .unwrap();
    assert_eq!(entry_row(&db, offered).await.unwrap().1, Some(offered));
    assert_eq!(entry_row(&db, never).await.unwrap().1, None);
}
