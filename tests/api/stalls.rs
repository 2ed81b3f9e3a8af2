//! A Redis that stalls longer than a claim's call and both read-backs: no buyer answered
//! "nothing moved" holds a unit, and every unknown outcome settles.

use std::collections::HashSet;
use std::time::Duration;

use serde_json::Value;
use uuid::Uuid;

use crate::helpers::*;
use crate::services::PrivateRedis;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_past_the_read_backs_answers_outcome_unknown_and_every_503_unavailable_moved_nothing(
) {
    let redis = PrivateRedis::start().await;
    let app = spawn_app_on(&redis.url()).await;
    app.declare("stall", 100, 1).await;
    let buyers = users("stalled", 60);
    redis.pause(1500).await;
    let results = release_buyers(&app.api, "stall", buyers.clone()).await;

    let mut promised_nothing = Vec::new();
    let mut unknown = Vec::new();
    let mut won: HashSet<Uuid> = won_ids(&results).into_iter().collect();
    for (user, (status, body)) in buyers.iter().zip(&results) {
        match (*status, code(body)) {
            (201, _) => {}
            (503, "unavailable") => promised_nothing.push(user.clone()),
            (503, "outcome_unknown") => {
                let id: Uuid = body["claim_id"].as_str().unwrap().parse().unwrap();
                unknown.push((user.clone(), id));
            }
            other => panic!("unexpected answer {other:?}: {body}"),
        }
    }
    // Once Redis resumes, whatever was queued in it has run: nobody answered 503
    // `unavailable` may hold a unit.
    app.drained("stall").await;
    for user in &promised_nothing {
        assert_eq!(
            app.held("stall", user).await,
            0,
            "{user} was promised nothing"
        );
    }
    assert!(
        !unknown.is_empty(),
        "a 1.5 s stall must leave some outcomes unknown"
    );
    // Every unknown outcome settles once Redis answers: the claim (it won) or 404 (never).
    for (user, id) in &unknown {
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        let settled = loop {
            let r = app
                .http
                .get(format!("{}/v1/claims/{id}", app.base))
                .bearer_auth(token(user))
                .send()
                .await
                .unwrap();
            if matches!(r.status().as_u16(), 200 | 404) {
                break r.status().as_u16();
            }
            assert!(std::time::Instant::now() < deadline, "{id} never settled");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        if settled == 200 {
            won.insert(*id);
        }
    }
    let v = app.drained("stall").await;
    assert_eq!(v["consistent"], true, "{v}");
    // The ledger holds exactly the 201s and the unknown outcomes that settled as won...
    let issued: HashSet<Uuid> = app.issued_ids("stall").await.into_iter().collect();
    assert_eq!(issued, won);
    assert_eq!(app.stock("stall").await, Some(100 - won.len() as i64));
    // ...and nobody answered 503 `unavailable` holds a unit.
    for user in &promised_nothing {
        assert_eq!(
            app.held("stall", user).await,
            0,
            "{user} was promised nothing"
        );
    }
    let metrics = app.get("/metrics").await.text().await.unwrap();
    assert!(metrics.contains("dropgate_claim_outcome_unknown_total"));
    assert!(metrics.contains("dropgate_claim_outcome_settled_total"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_with_the_same_key_settles_an_unknown_outcome_without_a_second_unit() {
    let redis = PrivateRedis::start().await;
    let app = spawn_app_with(|c| {
        c.redis_url = redis.url();
        c.redis_timeout_ms = "100".into();
    })
    .await;
    app.declare("retry", 5, 2).await;
    redis.pause(800).await;
    let first = app.claim("retry", "buyer", 1, Some("once")).await;
    assert_eq!(first.status(), 503);
    let first: Value = first.json().await.unwrap();
    assert_eq!(code(&first), "outcome_unknown", "{first}");
    // The buyer retries with the same key until an answer comes: one unit, the same claim.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let answer: Value = loop {
        let r = app.claim("retry", "buyer", 1, Some("once")).await;
        if r.status() == 201 {
            break r.json().await.unwrap();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the retry never got an answer"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(answer["claim_id"], first["claim_id"]);
    let v = app.drained("retry").await;
    assert_eq!(v["recorded"], 1, "{v}");
    assert_eq!(app.held("retry", "buyer").await, 1);
    assert_eq!(app.stock("retry").await, Some(4));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_outcome_on_a_later_shard_is_told_as_unknown_to_a_token_scoped_to_its_sku() {
    let redis = PrivateRedis::start().await;
    let app = spawn_app_with(|c| {
        c.redis_url = redis.url();
        c.redis_timeout_ms = "100".into();
    })
    .await;
    let made = crate::lifecycle::declare_with(
        &app.api,
        "striped",
        serde_json::json!({"total": 20, "per_user_limit": 1, "shards": 4}),
    )
    .await;
    assert_eq!(made.status(), 201);
    // A buyer whose claims go to a shard past the first: its Redis name is not the SKU.
    let user = (0..)
        .map(|i| format!("striped-{i}"))
        .find(|u| dropgate::layout::shard_of_user(u, 4) >= 1)
        .unwrap();
    let scoped = token_for(&user, "striped");
    redis.pause(3000).await;
    let r = app
        .http
        .post(format!("{}/v1/skus/striped/claims", app.base))
        .bearer_auth(&scoped)
        .json(&serde_json::json!({"quantity": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    let body: Value = r.json().await.unwrap();
    assert_eq!(code(&body), "outcome_unknown", "{body}");
    let id = body["claim_id"].as_str().unwrap().to_string();
    let get = || {
        app.http
            .get(format!("{}/v1/claims/{id}", app.base))
            .bearer_auth(&scoped)
            .send()
    };
    // Still settling (Redis paused): unknown, as for any buyer, not a Redis error (the
    // settler's record was held to the token's SKU by its shard's name).
    let r = get().await.unwrap();
    assert_eq!(r.status(), 503);
    let told: Value = r.json().await.unwrap();
    assert_eq!(code(&told), "outcome_unknown", "{told}");
    // Once Redis answers: the claim, of its catalog SKU.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let claim: Value = loop {
        let r = get().await.unwrap();
        if r.status() == 200 {
            break r.json().await.unwrap();
        }
        assert_ne!(r.status(), 404, "the claim ran once Redis resumed");
        assert!(std::time::Instant::now() < deadline, "{id} never settled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(claim["sku"], "striped", "{claim}");
    assert_eq!(claim["user"], user.as_str(), "{claim}");
    let v = app.drained("striped").await;
    assert_eq!(v["recorded"], 1, "{v}");
}
