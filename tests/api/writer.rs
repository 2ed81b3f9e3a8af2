//! The writer and the reprocessor under faults that are about one row or one moment: a row
//! no table takes, a table an operator locks, a writer that wakes up late, PostgreSQL gone
//! mid-batch, and gateways that went away for good.

use std::time::Duration;

use uuid::Uuid;

use crate::helpers::*;

async fn parked_statuses(probe: &Probe) -> Vec<String> {
    sqlx::query_scalar("SELECT status FROM persistence_pending ORDER BY claim_id")
        .fetch_all(&probe.db)
        .await
        .unwrap()
}

// === transient errors ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_lock_held_past_lock_timeout_delays_winners_and_compensates_none() {
    let iso = Isolation::new();
    // The operator's setting applies to sessions opened after it: set it before the gateway
    // connects.
    let db = dropgate::db::connect_and_migrate(&iso.database_url)
        .await
        .unwrap();
    let name = iso.database_url.rsplit('/').next().unwrap().to_string();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "ALTER DATABASE \"{name}\" SET lock_timeout = '200ms'"
    )))
    .execute(&db)
    .await
    .unwrap();
    let mut raw = iso.raw_config(REDIS_URL);
    raw.reprocess_max_attempts = "3".into();
    raw.reprocess_backoff_ms = "50".into();
    let app = spawn_with_config(raw).await;
    app.declare("locked", 100, 1).await;

    let mut lock = db.begin().await.unwrap();
    sqlx::query("LOCK TABLE issuances IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();
    // A claim the writer parked earlier, on its last attempt, comes due while the lock holds.
    let parked = Uuid::now_v7();
    let mut con = app.probe.redis.clone();
    let state = format!("{}:{{locked}}:state", app.probe.prefix);
    let users_key = format!("{}:{{locked}}:users", app.probe.prefix);
    let _: () = redis::pipe()
        .hincr(&state, "stock", -1)
        .hincr(&users_key, "parked-0", 1)
        .query_async(&mut con)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO persistence_pending
           (claim_id, sku, user_id, quantity, created_at, failure_reason, attempts)
         VALUES ($1, 'locked', 'parked-0', 1, now(), 'refused earlier', 2)",
    )
    .bind(parked)
    .execute(&db)
    .await
    .unwrap();
    let results = release_buyers(&app.api, "locked", users("l", 20)).await;
    let mut won = won_ids(&results);
    assert_eq!(won.len(), 20);
    // The fault: the lock is held this long, many lock timeouts and retry delays over.
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert!(
        !parked_statuses(&app.probe)
            .await
            .iter()
            .any(|s| s == "compensated"),
        "a lock timeout is no refusal of the row"
    );
    lock.rollback().await.unwrap();

    won.push(parked);
    won.sort();
    let v = app.drained("locked").await;
    assert_eq!(app.issued_ids("locked").await, won);
    let statuses: Vec<String> = sqlx::query_scalar(
        "SELECT status FROM issuances WHERE sku = 'locked' GROUP BY status ORDER BY status",
    )
    .fetch_all(&db)
    .await
    .unwrap();
    assert_eq!(statuses, vec!["issued".to_string()]);
    assert_eq!(parked_statuses(&app.probe).await, vec!["resolved"]);
    let attempts: i32 = sqlx::query_scalar("SELECT attempts FROM persistence_pending")
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!(attempts, 3, "only the successful write spent an attempt");
    assert_eq!(v["compensated"], 0);
    assert_eq!(v["remaining"], 79);
    assert_eq!(v["consistent"], true, "{v}");
    assert_eq!(app.stock("locked").await, Some(79));
}
