//! Redis failing: fail closed, recover by itself, and never re-sell after losing its data.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::helpers::*;
use crate::services::PrivateRedis;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_answers_503_fast_and_claims_resume_when_it_returns() {
    let mut redis = PrivateRedis::start().await;
    let app = spawn_app_on(&redis.url()).await;
    app.declare("fc", 10, 1).await;
    assert_eq!(app.claim("fc", "before", 1, None).await.status(), 201);

    redis.kill();
    let mut unknown = Vec::new();
    for i in 0..5 {
        let started = Instant::now();
        let r = app.claim("fc", &format!("down-{i}"), 1, None).await;
        let took = started.elapsed();
        assert_eq!(r.status(), 503);
        assert_eq!(r.headers()["retry-after"], "1");
        let body: Value = r.json().await.unwrap();
        assert!(took < Duration::from_millis(1500), "503 took {took:?}");
        // The first call may have been written to the socket Redis dropped: the gateway
        // cannot know it never ran, so it says so. Once the connection is known dead, nothing
        // is sent and the answer is a promise that nothing moved.
        match (i, code(&body)) {
            (_, "unavailable") => {}
            (0, "outcome_unknown") => unknown.push((format!("down-{i}"), body["claim_id"].clone())),
            other => panic!("unexpected answer {other:?}: {body}"),
        }
    }
    let r = app.get("/readyz").await;
    assert_eq!(r.status(), 503);
    assert_eq!(r.json::<Value>().await.unwrap()["redis"], "unreachable");

    redis.restart().await;
    let mut attempt = 0;
    wait_for(Duration::from_secs(15), || {
        attempt += 1;
        let user = format!("after-{attempt}");
        let app = &app;
        async move { app.claim("fc", &user, 1, None).await.status() == 201 }
    })
    .await;
    // An unknown outcome settles once Redis answers: it never ran, so it is fenced (404).
    for (user, id) in &unknown {
        let id = id
            .as_str()
            .expect("outcome_unknown carries the claim id")
            .to_string();
        wait_for(Duration::from_secs(10), || {
            let (app, id, user) = (&app, id.clone(), user.clone());
            async move {
                let r = app
                    .http
                    .get(format!("{}/v1/claims/{id}", app.base))
                    .bearer_auth(token(&user))
                    .send()
                    .await
                    .unwrap();
                r.status() == 404
            }
        })
        .await;
    }
    // Exactly the two wins moved stock; every 503 moved nothing.
    assert_eq!(app.stock("fc").await, Some(8));
    let v = app.drained("fc").await;
    assert_eq!(v["recorded"], 2);
    assert_eq!(v["consistent"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restarted_empty_closes_the_sku_until_restore_then_sells_exactly_the_rest() {
    let mut redis = PrivateRedis::start().await;
    let app = spawn_app_with(|c| c.redis_url = redis.url()).await;
    app.declare("lost", 10, 1).await;
    let first = release_buyers(&app.api, "lost", users("early", 4)).await;
    assert_eq!(won_ids(&first).len(), 4);
    let keyed = app.claim("lost", "keyed", 1, Some("k-1")).await;
    assert_eq!(keyed.status(), 201);
    let keyed: Value = keyed.json().await.unwrap();
    app.drained("lost").await;

    redis.kill();
    redis.wipe();
    redis.restart().await;
    wait_for(Duration::from_secs(10), || async {
        app.get("/readyz").await.status() == 200
    })
    .await;

    // Fail closed: neither "unlimited" nor "sold out".
    let r = app.claim("lost", "during", 1, None).await;
    assert_eq!(r.status(), 503);
    assert_eq!(code(&r.json().await.unwrap()), "unavailable");
    // Declaring again does not re-seed the total.
    let r = app.declare("lost", 10, 1).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap()["remaining"], Value::Null);
    assert_eq!(app.stock("lost").await, None);

    let r = app.restore("lost", false).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["remaining"], 5);
    assert_eq!(v["consistent"], true);
    // The idempotency record came back with the ledger: a retry replays, moves nothing.
    let again = app.claim("lost", "keyed", 1, Some("k-1")).await;
    assert_eq!(again.headers()["idempotency-replayed"], "true");
    assert_eq!(
        again.json::<Value>().await.unwrap()["claim_id"],
        keyed["claim_id"]
    );
    // Present now: a second restore is refused unless forced.
    let r = app.restore("lost", false).await;
    assert_eq!(r.status(), 409);
    assert_eq!(code(&r.json().await.unwrap()), "state_present");
    assert_eq!(app.restore("lost", true).await.status(), 200);
    assert_eq!(app.stock("lost").await, Some(5));

    // Early buyers still hold their unit (limit 1), the remainder sells exactly.
    assert_eq!(app.claim("lost", "early-0", 1, None).await.status(), 409);
    let rest = release_buyers(&app.api, "lost", users("late", 50)).await;
    assert_eq!(won_ids(&rest).len(), 5);
    assert_eq!(app.stock("lost").await, Some(0));
    let v = app.drained("lost").await;
    assert_eq!(v["recorded"], 10);
    assert_eq!(v["consistent"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_call_timed_out_is_settled_by_reading_not_by_sending_it_again() {
    let redis = PrivateRedis::start().await;
    let app = spawn_app_on(&redis.url()).await;
    app.declare("slow", 5, 1).await;
    // Freeze every client of this Redis for 600 ms: the claim's call times out (250 ms) while
    // it is still queued, then runs when the pause ends.
    redis.pause(600).await;
    let started = Instant::now();
    let r = app.claim("slow", "patient", 1, Some("k")).await;
    let took = started.elapsed();
    assert!(
        took > Duration::from_millis(250),
        "the call was not delayed: {took:?}"
    );
    // Either the read found the win (201), or it found nothing and fenced the id first (503);
    // whichever it answered, the state agrees with it and nothing was decided twice.
    let status = r.status().as_u16();
    let body: Value = r.json().await.unwrap();
    let v = app.drained("slow").await;
    let ids = app.issued_ids("slow").await;
    match status {
        201 => {
            assert_eq!(v["recorded"], 1);
            assert_eq!(app.stock("slow").await, Some(4));
            assert_eq!(app.held("slow", "patient").await, 1);
            assert_eq!(ids.len(), 1);
            assert_eq!(ids[0].to_string(), body["claim_id"].as_str().unwrap());
        }
        503 => {
            assert_eq!(v["recorded"], 0);
            assert_eq!(app.stock("slow").await, Some(5));
            assert!(ids.is_empty());
        }
        other => panic!("unexpected status {other}: {body}"),
    }
    assert_eq!(v["consistent"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_sku_queue_sheds_claims_with_429_and_moves_nothing_for_them() {
    let redis = PrivateRedis::start().await;
    let app = spawn_app_with(|c| {
        c.redis_url = redis.url();
        c.max_queue = "8".into();
    })
    .await;
    app.declare("shed", 100, 1).await;
    // While Redis is paused, the first call hangs and everyone else queues behind it.
    redis.pause(700).await;
    let results = release_buyers(&app.api, "shed", users("s", 40)).await;
    let shed: Vec<&(u16, Value)> = results.iter().filter(|(s, _)| *s == 429).collect();
    assert!(!shed.is_empty(), "nothing was shed");
    assert!(shed.iter().all(|(_, b)| code(b) == "overloaded"));
    let won = won_ids(&results).len();
    assert_eq!(
        won + shed.len(),
        40,
        "every claim was either decided or shed"
    );
    assert_eq!(app.stock("shed").await, Some(100 - won as i64));
    let v = app.drained("shed").await;
    assert_eq!(v["recorded"], won);
    assert_eq!(v["consistent"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_restore_during_a_drop_neither_resells_nor_forgets_a_winner() {
    let app = spawn_app().await;
    app.declare("force", 30, 1).await;
    let first = release_buyers(&app.api, "force", users("f", 10)).await;
    assert_eq!(won_ids(&first).len(), 10);
    // Straight away: some winners may still be in the journal, not yet in the ledger.
    let r = app.restore("force", true).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap()["remaining"], 20);
    let rest = release_buyers(&app.api, "force", users("g", 60)).await;
    assert_eq!(won_ids(&rest).len(), 20);
    let v = app.drained("force").await;
    assert_eq!(v["recorded"], 30);
    assert_eq!(v["remaining"], 0);
    assert_eq!(v["consistent"], true);
}
