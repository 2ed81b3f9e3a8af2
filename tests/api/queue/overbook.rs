//! Admission knows the stock (API.md "Waiting room": `overbook`), and the settings have an
//! order: a gateway writing settings it read before a change never puts the older rate back.

use serde_json::json;

use super::*;
use crate::helpers::{spawn_app, wait_for};

/// Waits until the admitting gateway has run rounds for another second of Redis's clock: a
/// count that held over it held over some twenty rounds (one every 50 ms).
async fn a_second_of_rounds(probe: &Probe, sku: &str) {
    let from: i64 = qfield(probe, sku, "last_ms")
        .await
        .and_then(|t| t.parse().ok())
        .unwrap_or(0);
    wait_for(LONG, || async {
        qfield(probe, sku, "last_ms")
            .await
            .and_then(|t| t.parse::<i64>().ok())
            .is_some_and(|t| t >= from + 1000)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_never_passes_overbook_times_the_units_left() {
    let app = spawn_app().await;
    // 4 units at 1.5: at most 6 admitted and unused, however fast the rate.
    let r = declare_queued(
        &app,
        "q-over",
        4,
        json!({"admit_per_second": 1000, "overbook": 1.5}),
        json!({}),
    )
    .await;
    assert_eq!(r.status(), 201);
    let tickets = join_all(&app, "q-over", "v", 20).await;
    wait_for(LONG, || async { counts(&app.probe, "q-over").await.1 >= 6 }).await;
    a_second_of_rounds(&app.probe, "q-over").await;
    assert_eq!(
        counts(&app.probe, "q-over").await,
        (14, 6),
        "6 admitted, 14 in line"
    );

    // The first four admitted buy every unit: sold out, nobody more is admitted.
    let adm = admitted(&app.probe, "q-over").await;
    let mut bought = 0;
    for (j, id) in tickets.iter().enumerate() {
        if bought == 4 {
            break;
        }
        let (_, t) = ticket(&app, id, &visitor(&format!("v-{j}"))).await;
        if t["state"] == "admitted" {
            let (s, b) = claim_with(&app, "q-over", t["admission_token"].as_str().unwrap()).await;
            assert_eq!(s, 201, "{b}");
            bought += 1;
        }
    }
    assert_eq!(bought, 4);
    assert_eq!(adm.len(), 6);
    // Two units back: ceil(1.5 × 2) = 3, two admitted still unused: exactly one more.
    assert_eq!(app.restock("q-over", 2).await.status(), 200);
    wait_for(LONG, || async { counts(&app.probe, "q-over").await.1 >= 7 }).await;
    a_second_of_rounds(&app.probe, "q-over").await;
    assert_eq!(counts(&app.probe, "q-over").await, (13, 7));
    assert_eq!(
        app.probe.stock("q-over").await,
        Some(2),
        "admission moves no stock"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_that_read_the_settings_before_a_change_never_puts_the_old_rate_back() {
    let app = spawn_app().await;
    let r = declare_queued(
        &app,
        "q-ver",
        10,
        json!({"admit_per_second": 100}),
        json!({}),
    )
    .await;
    assert_eq!(r.status(), 201);
    let r = declare_queued(
        &app,
        "q-ver",
        10,
        json!({"admit_per_second": 200}),
        json!({}),
    )
    .await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        qfield(&app.probe, "q-ver", "rate").await.as_deref(),
        Some("200")
    );
    let version: i64 = sqlx::query_scalar("SELECT queue_version FROM skus WHERE sku = 'q-ver'")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(version, 2);
    // Another gateway's write of the row it read before the change, arriving after it.
    let keys = dropgate::keys::SkuKeys::new(&app.probe.prefix, "q-ver");
    let older = dropgate::queue::RedisSettings {
        rate: 100,
        ttl_seconds: 120,
        prequeue_ms: 0,
        overbook_milli: 1500,
        version: 1,
    };
    let mut con = app.probe.redis.clone();
    assert!(dropgate::queue::calls::configure(&mut con, &keys, &older)
        .await
        .unwrap());
    assert_eq!(
        qfield(&app.probe, "q-ver", "rate").await.as_deref(),
        Some("200")
    );
    assert_eq!(
        qfield(&app.probe, "q-ver", "version").await.as_deref(),
        Some("2")
    );
}
