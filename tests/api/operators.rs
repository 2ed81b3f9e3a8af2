//! Operator actions under lost answers and concurrency: restock, declare and restore never
//! leave more units for sale than the total allows.

use std::time::Duration;

use serde_json::{json, Value};

use crate::helpers::*;
use crate::services::PrivateRedis;

/// total == remaining + recorded once the writer has drained.
async fn balanced(app: &TestApp, sku: &str) -> Value {
    let v = app.drained(sku).await;
    assert_eq!(v["consistent"], true, "{v}");
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restock_whose_answer_was_lost_is_read_back_and_never_leaves_more_stock_than_total() {
    let redis = PrivateRedis::start().await;
    let app = spawn_app_on(&redis.url()).await;
    app.declare("rs", 10, 1).await;
    // The apply and its first read-backs get no answer; Redis runs them when it resumes.
    redis.pause(1500).await;
    let r = app.restock("rs", 5).await;
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    let v = balanced(&app, "rs").await;
    assert_eq!(
        (v["total"].clone(), v["remaining"].clone()),
        (15.into(), 15.into())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restock_still_unknown_after_its_read_backs_answers_503_and_settles_in_the_background() {
    let redis = PrivateRedis::start().await;
    let app = spawn_app_on(&redis.url()).await;
    app.declare("late", 10, 1).await;
    redis.pause(6500).await;
    let r = app.restock("late", -4).await;
    assert_eq!(r.status(), 503);
    assert_eq!(code(&r.json().await.unwrap()), "outcome_unknown");
    // Once Redis answers, the operation is found applied and the total follows it.
    wait_for(Duration::from_secs(20), || async {
        let v = app.view("late").await;
        v["total"] == 6 && v["remaining"] == 6
    })
    .await;
    balanced(&app, "late").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declare_whose_answer_was_lost_never_reseeds_after_redis_loses_its_data() {
    let mut redis = PrivateRedis::start().await;
    let app = spawn_app_on(&redis.url()).await;
    redis.pause(1000).await;
    let r = app.declare("lostseed", 10, 1).await;
    assert_eq!(r.status(), 503, "{:?}", r.text().await);
    // The seed ran once Redis resumed: the drop sells its 10 units.
    wait_for(Duration::from_secs(10), || async {
        app.view("lostseed").await["remaining"] == 10
    })
    .await;
    let sold = won_ids(&release_buyers(&app.api, "lostseed", users("b", 30)).await).len();
    assert_eq!(sold, 10);
    app.drained("lostseed").await;
    redis.kill();
    redis.wipe();
    redis.restart().await;
    wait_for(Duration::from_secs(10), || async {
        app.get("/readyz").await.status() == 200
    })
    .await;
    // The re-declare finds claims in the ledger: it must not seed the total again.
    let r = app.declare("lostseed", 10, 1).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap()["remaining"], Value::Null);
    let r = app.claim("lostseed", "after-loss", 1, None).await;
    assert_eq!(r.status(), 503);
    assert_eq!(code(&r.json().await.unwrap()), "unavailable");
    assert_eq!(app.restore("lostseed", false).await.status(), 200);
    assert_eq!(app.stock("lostseed").await, Some(0));
    assert_eq!(app.issued_ids("lostseed").await.len(), 10);
}

#[tokio::test]
async fn a_new_sku_whose_id_redis_already_holds_state_for_is_refused_and_not_adopted() {
    let app = spawn_app().await;
    let state = format!("{}:{{foreign}}:state", app.probe.prefix);
    let _: () = redis::cmd("HSET")
        .arg(&state)
        .arg("stock")
        .arg(500)
        .arg("limit")
        .arg(1)
        .query_async(&mut app.probe.redis.clone())
        .await
        .unwrap();
    let r = app.declare("foreign", 10, 1).await;
    assert_eq!(r.status(), 409);
    assert_eq!(code(&r.json().await.unwrap()), "state_present");
    // Nothing was adopted: the SKU is not in the catalog and cannot be claimed.
    let r = app.claim("foreign", "buyer", 1, None).await;
    assert_eq!(code(&r.json().await.unwrap()), "unknown_sku");
    assert_eq!(app.stock("foreign").await, Some(500));
    let _: () = redis::cmd("DEL")
        .arg(&state)
        .query_async(&mut app.probe.redis.clone())
        .await
        .unwrap();
    assert_eq!(app.declare("foreign", 10, 1).await.status(), 201);
    assert_eq!(app.stock("foreign").await, Some(10));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restores_and_restocks_racing_on_one_sku_keep_it_balanced() {
    let app = spawn_app().await;
    app.declare("race", 20, 1).await;
    assert_eq!(
        won_ids(&release_buyers(&app.api, "race", users("r", 5)).await).len(),
        5
    );
    for _ in 0..10 {
        let (a, b, c) = tokio::join!(
            app.restore("race", true),
            app.restock("race", 3),
            app.restock("race", -1)
        );
        assert_eq!(a.status(), 200);
        assert!(
            matches!(b.status().as_u16(), 200 | 503),
            "{:?}",
            b.text().await
        );
        assert!(
            matches!(c.status().as_u16(), 200 | 503),
            "{:?}",
            c.text().await
        );
        let v = app.view("race").await;
        if v["remaining"].is_null() {
            continue;
        }
        balanced(&app, "race").await;
    }
    let v = balanced(&app, "race").await;
    assert_eq!(v["recorded"], 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sku_with_a_million_claims_restores_in_bounded_chunks() {
    let _heavy = crate::helpers::heavy().await;
    let app = spawn_app().await;
    app.declare("big", 1_000_010, 1_000).await;
    // A million live claims over 100,000 buyers, a tenth of them with an Idempotency-Key.
    sqlx::query(
        "INSERT INTO issuances (claim_id, sku, user_id, quantity, idempotency_key, created_at, seq)
         SELECT gen_random_uuid(), 'big', 'u' || (i % 100000), 1,
                CASE WHEN i % 10 = 0 THEN 'k' || i END, now(), i
           FROM generate_series(1, 1000000) AS i",
    )
    .execute(&app.db)
    .await
    .unwrap();
    let r = app.restore("big", true).await;
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["remaining"], json!(10));
    assert_eq!(v["consistent"], true);
    assert_eq!(app.held("big", "u42").await, 10);
    let replay = app.claim("big", "u10", 1, Some("k10")).await;
    assert_eq!(replay.status(), 201);
    assert_eq!(replay.headers()["idempotency-replayed"], "true");
}
