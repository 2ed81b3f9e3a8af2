//! A gateway whose database is dropped under it (issue 37.6): `/readyz` answers 503 naming
//! PostgreSQL within about two seconds (each probe is bounded), and SIGTERM stops it promptly
//! (the stop is bounded, whatever a backend does).

use std::time::{Duration, Instant};

use serde_json::Value;
use sqlx::PgPool;

use crate::helpers::*;
use crate::services::GatewayProcess;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_whose_database_was_dropped_reads_unready_and_stops_on_sigterm() {
    let iso = Isolation::new();
    let mut gw =
        GatewayProcess::start(&iso, REDIS_URL, &[("DROPGATE_SHUTDOWN_GRACE_MS", "3000")]).await;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    let ready = http
        .get(format!("{}/readyz", gw.base))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);

    let name = iso.database_url.rsplit('/').next().unwrap().to_string();
    let server = PgPool::connect(&format!("{PG_BASE}/postgres"))
        .await
        .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE {name} WITH (FORCE)"
    )))
    .execute(&server)
    .await
    .unwrap();

    // Every answer within the client's 3 s; 503 naming PostgreSQL within a few probes.
    let dropped = Instant::now();
    let body = loop {
        let r = http
            .get(format!("{}/readyz", gw.base))
            .send()
            .await
            .expect("/readyz answers within 3 s");
        if r.status() == 503 {
            break r.json::<Value>().await.unwrap();
        }
        assert!(dropped.elapsed() < Duration::from_secs(10), "still ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(body["postgres"], "unreachable", "{body}");
    assert_eq!(body["redis"], "ok", "{body}");
    let health = http
        .get(format!("{}/healthz", gw.base))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200, "the process runs");

    // Two grace periods (3 s each) and a little more at most; here it is far less.
    let asked = Instant::now();
    let status = gw.sigterm(Duration::from_secs(15)).await;
    eprintln!("stopped in {:?} with {status}", asked.elapsed());
    assert!(
        asked.elapsed() < Duration::from_secs(10),
        "{:?}",
        asked.elapsed()
    );
}
