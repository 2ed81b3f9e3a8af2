//! What the gateway logs while a fault lasts: one line when the fault starts (and a count of
//! the repeats at most every few seconds), saying what is true, not one line per retry.

use std::time::Duration;

use serde_json::json;

use crate::helpers::*;
use crate::lifecycle::declare_with;
use crate::services::{GatewayProcess, PrivateRedis};

/// The WARN and ERROR lines of `log` that contain `needle`.
fn warnings<'a>(log: &'a [String], needle: &str) -> Vec<&'a String> {
    log.iter()
        .filter(|l| (l.contains("WARN") || l.contains("ERROR")) && l.contains(needle))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_outage_gives_a_few_expiry_warnings_not_one_per_tick() {
    let mut redis = PrivateRedis::start().await;
    let iso = Isolation::new();
    let gw = GatewayProcess::start(&iso, &redis.url(), &[]).await;
    let api = Api::new(gw.base.clone());
    let r = declare_with(&api, "hold", json!({"total": 5, "hold_seconds": 600})).await;
    assert_eq!(r.status(), 201);
    assert_eq!(api.claim("hold", "u-1", 1, None).await.status(), 201);
    // The expiry worker serves the SKU (it has a hold) before Redis goes away.
    tokio::time::sleep(Duration::from_millis(1500)).await;

    redis.kill();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let log = gw.log_lines();
    let expiry = warnings(&log, "expiry");
    // Ten seconds of outage at a 100 ms tick: one line when it starts, and at most one
    // summary of the repeats every few seconds.
    assert!(
        (1..=5).contains(&expiry.len()),
        "{} expiry warnings in 10 s of outage:\n{}",
        expiry.len(),
        expiry
            .iter()
            .take(20)
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
    // A line that repeats says how many it stands for.
    assert!(
        expiry.iter().skip(1).all(|l| l.contains("repeated")),
        "{expiry:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sku_redis_lost_is_logged_as_lost_by_the_writer_not_as_no_answer() {
    let redis = PrivateRedis::start().await;
    let iso = Isolation::new();
    let gw = GatewayProcess::start(&iso, &redis.url(), &[]).await;
    let api = Api::new(gw.base.clone());
    assert_eq!(api.declare("lost", 10, 1).await.status(), 201);
    for u in ["a", "b", "c"] {
        assert_eq!(api.claim("lost", u, 1, None).await.status(), 201);
    }
    api.drained("lost").await;

    // Redis keeps answering; only the SKU's keys are gone (a FLUSHALL, a key evicted).
    let mut con = redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    redis::cmd("FLUSHALL")
        .query_async::<()>(&mut con)
        .await
        .unwrap();
    // Buyers keep coming: each is answered 503 (fail closed).
    for u in ["d", "e"] {
        assert_eq!(api.claim("lost", u, 1, None).await.status(), 503);
    }
    tokio::time::sleep(Duration::from_secs(8)).await;
    let log = gw.log_lines();
    let no_answer = warnings(&log, "got no answer");
    assert!(
        no_answer.is_empty(),
        "Redis answered every call, yet the log says:\n{no_answer:#?}\n{log:#?}"
    );
    let writer = warnings(&log, "writer");
    assert!(writer.len() <= 2, "{writer:#?}");
    eprintln!("{log:#?}");
}
