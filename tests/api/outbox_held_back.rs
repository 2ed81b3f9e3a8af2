//! The relay says why it waits (issue 37.5): a transaction left open in another database of the
//! same PostgreSQL server holds every new `claim.won` back (`pg_snapshot_xmin`); `/readyz`,
//! `dropgate_outbox_held_back_seconds` and the log name it, and once it ends every event flows,
//! each once and in order. The server is the test's own: a transaction held open on the
//! shared server would hold back every other test's relay and outbox cursor for as long.

use std::time::Duration;

use serde_json::Value;
use sqlx::{Connection, PgConnection, PgPool};
use uuid::Uuid;

use crate::helpers::*;
use crate::outbox::{check_once_in_order, stream_events, stream_len, unsent};
use crate::services::{PrivateNats, PrivatePostgres};

/// The held-back gauge as `/metrics` shows it.
async fn held_back_metric(api: &Api) -> Option<f64> {
    let text = api.get("/metrics").await.text().await.unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("dropgate_outbox_held_back_seconds "))
        .and_then(|v| v.trim().parse().ok())
}

async fn readyz_outbox(api: &Api) -> Value {
    let r = api.get("/readyz").await;
    let body: Value = r.json().await.unwrap();
    body["outbox"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_transaction_in_another_database_is_named_then_events_flow_once_in_order() {
    let nats = PrivateNats::start().await;
    let pg = PrivatePostgres::start().await;
    let app = spawn_app_with(|c| {
        c.nats_url = Some(nats.url());
        c.database_url = pg.url("dropgate");
    })
    .await;
    app.declare("held", 10, 1).await;
    // Another database of the same server, and a session in it that took a transaction id
    // and went idle, as a forgotten psql session does.
    let other = format!(
        "dg_test_idle_{}",
        &Uuid::new_v4().simple().to_string()[..12]
    );
    let server = PgPool::connect(&pg.url("postgres")).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {other}")))
        .execute(&server)
        .await
        .unwrap();
    let mut idle = PgConnection::connect(&pg.url(&other)).await.unwrap();
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut idle)
        .await
        .unwrap();
    sqlx::query("BEGIN").execute(&mut idle).await.unwrap();
    sqlx::query("SELECT txid_current()")
        .execute(&mut idle)
        .await
        .unwrap();

    let mut won = Vec::new();
    for i in 0..5 {
        let r = app.claim("held", &format!("h-{i}"), 1, None).await;
        assert_eq!(r.status(), 201);
        let b: Value = r.json().await.unwrap();
        won.push(b["claim_id"].as_str().unwrap().parse::<Uuid>().unwrap());
    }
    app.drained("held").await;
    // Named within a few samples of the relay (once a second).
    wait_for(Duration::from_secs(20), || async {
        let o = readyz_outbox(&app).await;
        o["held_back_by"]["pid"] == pid
            && o["held_back_by"]["database"] == other.as_str()
            && o["held_back_by"]["state"] == "idle in transaction"
            && o["held_back_by"]["age_seconds"].as_f64().unwrap_or(0.0) >= 1.0
            && held_back_metric(&app).await.unwrap_or(0.0) >= 1.0
    })
    .await;
    assert_eq!(
        stream_len(&nats).await,
        0,
        "nothing published while held back"
    );
    assert_eq!(
        app.api.get("/readyz").await.status(),
        200,
        "shown, never a 503"
    );

    sqlx::query("COMMIT").execute(&mut idle).await.unwrap();
    wait_for(Duration::from_secs(30), || async {
        unsent(&app.db).await == 0 && stream_len(&nats).await >= 5
    })
    .await;
    let events = stream_events(&nats).await;
    assert_eq!(events.len(), 5);
    let per_claim = check_once_in_order(&events);
    let mut published: Vec<Uuid> = per_claim.keys().copied().collect();
    published.sort();
    won.sort();
    assert_eq!(published, won, "each claim.won once");
    wait_for(Duration::from_secs(10), || async {
        readyz_outbox(&app).await.get("held_back_by").is_none()
            && held_back_metric(&app).await == Some(0.0)
    })
    .await;
    drop(idle);
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE {other} WITH (FORCE)"
    )))
    .execute(&server)
    .await
    .unwrap();
}
