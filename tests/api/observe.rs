//! The observer's gauges as an operator reads them on /metrics while a SKU fails closed.

use std::time::{Duration, Instant};

use crate::helpers::*;

/// The value of one series (`name{labels}`) on /metrics, once `accept` holds for it.
async fn series_until(app: &TestApp, series: &str, accept: impl Fn(f64) -> bool) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let text = app.get("/metrics").await.text().await.unwrap();
        let value = text.lines().find_map(|l| {
            l.strip_prefix(series)?
                .strip_prefix(' ')?
                .parse::<f64>()
                .ok()
        });
        if let Some(v) = value.filter(|v| accept(*v)) {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "{series} is {value:?}, still not as expected"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sku_whose_redis_state_is_lost_is_exported_as_closed_until_it_is_restored() {
    let app = spawn_app_with(|raw| raw.sku_gauges_interval_ms = "100".into()).await;
    // Gauges are process-wide in this test binary: a SKU id no other test uses.
    let sku = format!("obs-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let s = |name: &str| format!("{name}{{sku=\"{sku}\"}}");
    let lost = format!("dropgate_sku_closed{{sku=\"{sku}\",reason=\"lost\"}}");
    app.declare(&sku, 5, 1).await;
    assert_eq!(app.claim(&sku, "a", 1, None).await.status(), 201);
    app.drained(&sku).await;
    series_until(&app, &s("dropgate_sku_recorded_units"), |v| v == 1.0).await;
    assert_eq!(
        series_until(&app, &s("dropgate_sku_remaining_units"), |_| true).await,
        4.0
    );
    assert_eq!(
        series_until(&app, &s("dropgate_sku_consistent"), |_| true).await,
        1.0
    );
    assert_eq!(series_until(&app, &lost, |_| true).await, 0.0);

    // Redis loses the SKU's state.
    let mut con = app.probe.redis.clone();
    let state = format!("{}:{{{sku}}}:state", app.probe.prefix);
    redis::cmd("DEL")
        .arg(&state)
        .query_async::<()>(&mut con)
        .await
        .unwrap();

    series_until(&app, &lost, |v| v == 1.0).await;
    // What Redis cannot tell is NaN, never the last value seen.
    series_until(&app, &s("dropgate_sku_remaining_units"), f64::is_nan).await;
    series_until(&app, &s("dropgate_sku_consistent"), f64::is_nan).await;
    let r = app.claim(&sku, "b", 1, None).await;
    assert_eq!(r.status(), 503);

    assert_eq!(app.restore(&sku, false).await.status(), 200);
    series_until(&app, &lost, |v| v == 0.0).await;
    series_until(&app, &s("dropgate_sku_consistent"), |v| v == 1.0).await;
    assert_eq!(
        series_until(&app, &s("dropgate_sku_remaining_units"), |_| true).await,
        4.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_sku_with_one_shard_lost_is_exported_as_closed_until_it_is_restored() {
    let app = spawn_app_with(|raw| raw.sku_gauges_interval_ms = "100".into()).await;
    let sku = format!("obsh-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let lost = format!("dropgate_sku_closed{{sku=\"{sku}\",reason=\"lost\"}}");
    let r =
        crate::lifecycle::declare_with(&app, &sku, serde_json::json!({"total": 6, "shards": 3}))
            .await;
    assert_eq!(r.status(), 201);
    assert_eq!(series_until(&app, &lost, |_| true).await, 0.0);

    // Redis loses shard 2 only: the SKU fails closed as a whole, and the gauge says so.
    let mut con = app.probe.redis.clone();
    let state = format!("{}:{{{sku}#2}}:state", app.probe.prefix);
    redis::cmd("DEL")
        .arg(&state)
        .query_async::<()>(&mut con)
        .await
        .unwrap();
    series_until(&app, &lost, |v| v == 1.0).await;

    assert_eq!(app.restore(&sku, false).await.status(), 200);
    series_until(&app, &lost, |v| v == 0.0).await;
}
