//! The sold-out fast path: refusals from memory once Redis said the stock is 0, and units that
//! come back (restock, compensation, a lost notification, a lost subscription) sell again.

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::Value;

use crate::helpers::*;
use crate::services::PrivateRedis;

/// Long enough that only a notification (or a lost subscription) can end a cached sold-out
/// within a test's wait: what these tests prove is not the 100 ms bound.
const TRUST_LONG_MS: &str = "60000";
const PROMPTLY: Duration = Duration::from_secs(5);

async fn gateway(redis_url: &str, trust_ms: &str) -> TestApp {
    let app = spawn_app_with(|c| {
        c.redis_url = redis_url.to_string();
        c.sold_out_trust_ms = trust_ms.into();
    })
    .await;
    wait_subscribed(&app).await;
    app
}

/// Waits for the gateway's subscription to its units-back channel.
async fn wait_subscribed(app: &TestApp) {
    let channel = dropgate::keys::units_back_channel(&app.probe.prefix);
    let redis = app.probe.redis.clone();
    wait_for(PROMPTLY, || {
        let (mut redis, channel) = (redis.clone(), channel.clone());
        async move {
            let n: (String, i64) = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg(&channel)
                .query_async(&mut redis)
                .await
                .unwrap();
            n.1 >= 1
        }
    })
    .await;
}

/// Declares `sku` with one unit, sells it, and has one more buyer refused: the gateway now
/// knows the SKU is sold out. Returns the winner's claim id.
async fn sell_out(app: &TestApp, sku: &str) -> uuid::Uuid {
    assert_eq!(app.declare(sku, 1, 1).await.status(), 201);
    let r = app.claim(sku, "first", 1, None).await;
    assert_eq!(r.status(), 201);
    let won: Value = r.json().await.unwrap();
    let r = app.claim(sku, "second", 1, None).await;
    assert_eq!(r.status(), 409);
    assert_eq!(code(&r.json().await.unwrap()), "sold_out");
    won["claim_id"].as_str().unwrap().parse().unwrap()
}

/// Whether `user` wins a unit of `sku` now.
async fn wins(app: &TestApp, sku: &str, user: &str) -> bool {
    app.claim(sku, user, 1, None).await.status() == 201
}

/// Waits (at most [`PROMPTLY`]) until a fresh buyer, named `who-<n>`, wins a unit of `sku`.
async fn sells_again(app: &TestApp, sku: &str, who: &str) {
    let n = std::sync::atomic::AtomicUsize::new(0);
    wait_for(PROMPTLY, || {
        let user = format!(
            "{who}-{}",
            n.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        async move { wins(app, sku, &user).await }
    })
    .await;
}

/// Writes `sku`'s stock behind the scripts' back: no notification, as if it were lost.
async fn set_stock_unannounced(app: &TestApp, sku: &str, units: i64) {
    let keys = dropgate::keys::SkuKeys::new(&app.probe.prefix, sku);
    let mut con = app.probe.redis.clone();
    let _: i64 = redis::cmd("HSET")
        .arg(keys.state())
        .arg("stock")
        .arg(units)
        .query_async(&mut con)
        .await
        .unwrap();
}

async fn fast_refusals(app: &TestApp) -> u64 {
    let text = app.get("/metrics").await.text().await.unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("dropgate_claim_fast_refusals_total "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or(0.0) as u64
}

#[tokio::test]
async fn refusals_on_a_sku_known_sold_out_make_no_claim_call() {
    let redis = PrivateRedis::start().await;
    let app = gateway(&redis.url(), TRUST_LONG_MS).await;
    sell_out(&app, "so-1").await;
    // Every command this Redis runs from here on, as MONITOR shows it.
    let mut monitor = redis::Client::open(redis.url())
        .unwrap()
        .get_async_monitor()
        .await
        .unwrap()
        .into_on_message::<String>();
    let mut probe = app.probe.redis.clone();
    let echo = |m: &'static str| redis::cmd("ECHO").arg(m).to_owned();
    let _: String = echo("refusals-start")
        .query_async(&mut probe)
        .await
        .unwrap();
    let before = fast_refusals(&app).await;

    for i in 0..40 {
        let r = app.claim("so-1", &format!("late-{i}"), 1, None).await;
        assert_eq!(r.status(), 409);
        assert_eq!(code(&r.json().await.unwrap()), "sold_out");
    }

    let _: String = echo("refusals-end").query_async(&mut probe).await.unwrap();
    let claim_sha = dropgate::scripts::SCRIPTS.claim.get_hash().to_string();
    let (mut started, mut claim_calls) = (false, 0);
    while let Some(line) = tokio::time::timeout(PROMPTLY, monitor.next())
        .await
        .expect("MONITOR shows the end marker")
    {
        if line.contains("refusals-start") {
            started = true;
        } else if line.contains("refusals-end") {
            break;
        } else if started && line.contains(&claim_sha) {
            claim_calls += 1;
        }
    }
    assert!(started, "MONITOR saw the start marker");
    assert_eq!(
        claim_calls, 0,
        "refusals of a SKU known sold out call claim.lua"
    );
    // The metric is process-wide (other tests share it): at least ours.
    assert!(fast_refusals(&app).await >= before + 40);
    // A keyed claim may be a replay: it still asks Redis, and is refused there.
    let r = app.claim("so-1", "late-keyed", 1, Some("k-1")).await;
    assert_eq!(code(&r.json().await.unwrap()), "sold_out");
}

#[tokio::test]
async fn a_restock_sells_again_promptly() {
    let app = gateway(REDIS_URL, TRUST_LONG_MS).await;
    sell_out(&app, "so-2").await;
    assert!(!wins(&app, "so-2", "before-restock").await);

    assert_eq!(app.restock("so-2", 2).await.status(), 200);

    // Only the restock's notification can end the cached sold-out within this wait.
    sells_again(&app, "so-2", "after-restock").await;
}

#[tokio::test]
async fn a_compensation_sells_again_promptly() {
    let app = gateway(REDIS_URL, TRUST_LONG_MS).await;
    let claim = sell_out(&app, "so-3").await;
    app.drained("so-3").await;
    assert!(!wins(&app, "so-3", "before-compensation").await);

    // What the reprocessor does after a parked claim's last attempt: fence, then give back.
    let keys = dropgate::keys::SkuKeys::new(&app.probe.prefix, "so-3");
    let mut con = app.probe.redis.clone();
    for mode in ["fence", "give"] {
        let mut inv = dropgate::scripts::SCRIPTS.compensate.prepare_invoke();
        for k in keys.lifecycle() {
            inv.key(k);
        }
        let done: i64 = inv
            .key(keys.compensation(&claim))
            .key(keys.idempotency())
            .arg(mode)
            .arg("test-owner")
            .arg("first")
            .arg(1)
            .arg(claim.to_string())
            .arg(60)
            .invoke_async(&mut con)
            .await
            .unwrap();
        assert_eq!(done, 1, "{mode}");
    }

    sells_again(&app, "so-3", "after-comp").await;
}

#[tokio::test]
async fn units_back_without_a_notification_sell_again_within_the_bound() {
    // The default bound (100 ms): a stock raised behind the scripts' back (no PUBLISH, as a
    // lost message would leave it) is seen by the next re-check.
    let app = gateway(REDIS_URL, "100").await;
    sell_out(&app, "so-4").await;

    set_stock_unannounced(&app, "so-4", 1).await;

    sells_again(&app, "so-4", "unnotified").await;
}

#[tokio::test]
async fn a_killed_subscription_does_not_leave_a_sku_refusing() {
    let redis = PrivateRedis::start().await;
    let app = gateway(&redis.url(), TRUST_LONG_MS).await;
    sell_out(&app, "so-5").await;
    let mut con = app.probe.redis.clone();

    // The subscription dies; units come back with nobody listening (the message is lost).
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(killed, 1);
    set_stock_unannounced(&app, "so-5", 1).await;

    // Within a wait far shorter than the 60 s trust: the loss itself forgot the SKU.
    sells_again(&app, "so-5", "after-kill").await;
    // And the gateway subscribes again.
    wait_subscribed(&app).await;
}
