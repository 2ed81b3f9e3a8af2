//! Settings, joins, tickets and the claim route's `not_admitted`.

use redis::AsyncCommands;
use serde_json::{json, Value};

use super::*;
use crate::helpers::{code, spawn_app, token, token_for};

#[tokio::test]
async fn bad_queue_settings_are_refused_with_a_code_and_change_nothing() {
    let app = spawn_app().await;
    let opens = (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    let early = (chrono::Utc::now() + chrono::Duration::minutes(10)).to_rfc3339();
    let bad: Vec<(Value, Value)> = vec![
        (json!({"admit_per_second": 0}), json!({})),
        (json!({"admit_per_second": 100001}), json!({})),
        (
            json!({"admit_per_second": 10, "admission_ttl_seconds": 5}),
            json!({}),
        ),
        (
            json!({"admit_per_second": 10, "prequeue_from": early}),
            json!({}),
        ),
        (
            json!({"admit_per_second": 10, "prequeue_from": opens}),
            json!({"opens_at": early}),
        ),
        (json!({"admit_per_second": 10, "surprise": 1}), json!({})),
        (json!({"admit_per_second": "fast"}), json!({})),
        (json!({"admit_per_second": 10}), json!({"shards": 2})),
        (json!({"admit_per_second": 10, "overbook": 0.5}), json!({})),
        (json!({"admit_per_second": 10, "overbook": 101}), json!({})),
        (
            json!({"admit_per_second": 10, "overbook": "lots"}),
            json!({}),
        ),
    ];
    for (queue, extra) in &bad {
        let r = declare_queued(&app, "q-bad", 10, queue.clone(), extra.clone()).await;
        assert_eq!(r.status(), 400, "{queue} {extra}");
        let b: Value = r.json().await.unwrap();
        assert_eq!(code(&b), "bad_request", "{b}");
    }
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM skus WHERE sku = 'q-bad'")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(rows, 0, "a refused declare stored nothing");
    // An existing queue's settings stay as they were after a refused change.
    let r = declare_queued(&app, "q-ok", 10, json!({"admit_per_second": 7}), json!({})).await;
    assert_eq!(r.status(), 201);
    let r = declare_queued(&app, "q-ok", 10, json!({"admit_per_second": -1}), json!({})).await;
    assert_eq!(r.status(), 400);
    let v = app.view("q-ok").await;
    assert_eq!(v["queue"]["admit_per_second"], 7, "{v}");
    let stored: Option<i32> =
        sqlx::query_scalar("SELECT queue_admit_per_second FROM skus WHERE sku = 'q-ok'")
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(stored, Some(7));
    assert_eq!(
        qfield(&app.probe, "q-ok", "rate").await.as_deref(),
        Some("7")
    );
}

#[tokio::test]
async fn a_visitor_has_one_ticket_per_sku_and_joining_again_answers_it() {
    let app = spawn_app().await;
    let opens = (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    let r = declare_queued(
        &app,
        "q-one",
        10,
        json!({"admit_per_second": 10}),
        json!({"opens_at": opens}),
    )
    .await;
    assert_eq!(r.status(), 201);
    let v = visitor("v-1");
    let (s1, first) = join(&app, "q-one", &v).await;
    assert_eq!(s1, 201, "{first}");
    assert_eq!(first["state"], "prequeue", "{first}");
    assert!(
        first["position"].is_null(),
        "a pre-queue ticket has no position yet: {first}"
    );
    let (s2, again) = join(&app, "q-one", &v).await;
    assert_eq!(s2, 200, "{again}");
    assert_eq!(again["ticket_id"], first["ticket_id"]);
    assert_eq!(counts(&app.probe, "q-one").await, (1, 0));
    // The visitor reads its ticket; another visitor, or an admission token, does not.
    let id = first["ticket_id"].as_str().unwrap();
    let (s, t) = ticket(&app, id, &v).await;
    assert_eq!((s, t["state"].as_str()), (200, Some("prequeue")), "{t}");
    let (s, t) = ticket(&app, id, &visitor("v-2")).await;
    assert_eq!((s, code(&t)), (404, "unknown_ticket"), "{t}");
    let (s, t) = ticket(&app, id, &token("v-1")).await;
    assert_eq!((s, code(&t)), (401, "unauthorized"), "{t}");
    let (s, t) = ticket(&app, id, ADMIN).await;
    assert_eq!((s, t["state"].as_str()), (200, Some("prequeue")), "{t}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_join_rate_is_per_visitor_never_per_address() {
    // A Redis of its own: the shared one is busy with every other test on this machine.
    let redis = crate::services::PrivateRedis::start().await;
    let url = redis.url();
    let app = crate::helpers::spawn_app_with(|c| c.redis_url = url).await;
    let r = declare_queued(
        &app,
        "q-rate",
        10,
        json!({"admit_per_second": 1}),
        json!({"opens_at": (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339()}),
    )
    .await;
    assert_eq!(r.status(), 201);
    // One visitor past its join rate: 429 with Retry-After.
    let v = visitor("hammer");
    let mut statuses = Vec::new();
    let mut retry_after = None;
    for _ in 0..12 {
        let r = app
            .http
            .post(format!("{}/v1/skus/q-rate/queue", app.base))
            .bearer_auth(&v)
            .send()
            .await
            .unwrap();
        statuses.push(r.status().as_u16());
        if r.status() == 429 {
            retry_after = r.headers().get("retry-after").cloned();
            let b: Value = r.json().await.unwrap();
            assert_eq!(code(&b), "overloaded");
        }
    }
    assert!(statuses.contains(&429), "{statuses:?}");
    assert!(retry_after.is_some(), "a 429 carries Retry-After");
    // Thousands of visitors through one front end (one address, all at once): none is throttled.
    let n = 1000;
    let results = crate::helpers::all_at_once(n, |i| {
        let api = app.api.clone();
        async move {
            let v = visitor(&format!("fe-{i}"));
            // A 503 (this machine's Redis or PostgreSQL too slow to answer in time: fail
            // closed) is retried as a front end does after Retry-After; a 429 never is.
            loop {
                let (s, _) = join(&api, "q-rate", &v).await;
                if s != 503 {
                    return s;
                }
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
        }
    })
    .await;
    let throttled = results.iter().filter(|s| **s == 429).count();
    assert_eq!(throttled, 0, "no visitor of a shared address is throttled");
    assert!(
        results.iter().all(|s| *s == 201 || *s == 200),
        "{:?}",
        results
            .iter()
            .filter(|s| **s != 201 && **s != 200)
            .take(5)
            .collect::<Vec<_>>()
    );
    assert_eq!(counts(&app.probe, "q-rate").await, (n as i64 + 1, 0));
}

#[tokio::test]
async fn the_wrong_kind_of_token_and_a_sku_without_a_queue_are_refused() {
    let app = spawn_app().await;
    assert_eq!(app.declare("plain", 5, 1).await.status(), 201);
    let (s, b) = join(&app, "plain", &visitor("v")).await;
    assert_eq!((s, code(&b)), (409, "not_queued"), "{b}");
    let (s, b) = join(&app, "nope", &visitor("v")).await;
    assert_eq!((s, code(&b)), (404, "unknown_sku"), "{b}");
    // An admission token joins nothing; a visitor token buys nothing, anywhere.
    let (s, b) = join(&app, "plain", &token("v")).await;
    assert_eq!((s, code(&b)), (401, "unauthorized"), "{b}");
    let (s, b) = claim_with(&app, "plain", &visitor("v")).await;
    assert_eq!((s, code(&b)), (401, "unauthorized"), "{b}");
    assert_eq!(app.stock("plain").await, Some(5), "nothing sold");
}

#[tokio::test]
async fn a_queued_sku_sells_only_to_the_tokens_its_queue_minted() {
    let app = spawn_app().await;
    let r = declare_queued(
        &app,
        "q-sell",
        5,
        json!({"admit_per_second": 50, "admission_ttl_seconds": 30}),
        json!({}),
    )
    .await;
    assert_eq!(r.status(), 201);
    assert_eq!(
        declare_queued(
            &app,
            "q-other",
            5,
            json!({"admit_per_second": 50}),
            json!({})
        )
        .await
        .status(),
        201
    );
    // Tokens the queue did not mint: 403 not_admitted, nothing sold.
    for t in [token("buyer"), token_for("buyer", "q-sell")] {
        let (s, b) = claim_with(&app, "q-sell", &t).await;
        assert_eq!((s, code(&b)), (403, "not_admitted"), "{b}");
    }
    let (_, joined) = join(&app, "q-sell", &visitor("buyer")).await;
    let id = joined["ticket_id"].as_str().unwrap().to_string();
    // A forged `tid` (another visitor's ticket, or none of this SKU) is refused too.
    let (_, other) = join(&app, "q-sell", &visitor("someone")).await;
    let forged = dropgate::auth::sign(
        &dropgate::config::Secret::new(SECRET),
        &dropgate::auth::AdmissionClaims {
            sub: "buyer".into(),
            exp: jsonwebtoken_exp(60),
            sku: Some("q-sell".into()),
            scope: None,
            tid: Some(other["ticket_id"].as_str().unwrap().into()),
        },
    )
    .unwrap();
    let (s, b) = claim_with(&app, "q-sell", &forged).await;
    assert_eq!((s, code(&b)), (403, "not_admitted"), "{b}");
    assert_eq!(app.stock("q-sell").await, Some(5));
    // Admitted: the ticket's token is for this SKU and ticket, valid the admission's ttl.
    let v = visitor("buyer");
    let admitted = until(LONG, || {
        let (api, id, v) = (app.api.clone(), id.clone(), v.clone());
        async move {
            let (_, t) = ticket(&api, &id, &v).await;
            (t["state"] == "admitted").then_some(t)
        }
    })
    .await;
    let admission = admitted["admission_token"].as_str().unwrap().to_string();
    let claims = decode(&admission);
    assert_eq!(claims["sub"], "buyer");
    assert_eq!(claims["sku"], "q-sell");
    assert_eq!(claims["tid"], id.as_str());
    let now = chrono::Utc::now().timestamp();
    let exp = claims["exp"].as_i64().unwrap();
    assert!(
        exp <= now + 31 && exp >= now + 25,
        "valid about 30 s: exp {exp}, now {now}"
    );
    // The admin reads the ticket without its token.
    let (_, by_admin) = ticket(&app, &id, ADMIN).await;
    assert_eq!(by_admin["state"], "admitted");
    assert!(by_admin.get("admission_token").is_none(), "{by_admin}");
    // It buys here, once per the limit, and nowhere else.
    let (s, b) = claim_with(&app, "q-other", &admission).await;
    assert_eq!((s, code(&b)), (401, "unauthorized"), "{b}");
    let (s, b) = claim_with(&app, "q-sell", &admission).await;
    assert_eq!(s, 201, "{b}");
    let (s, b) = claim_with(&app, "q-sell", &admission).await;
    assert_eq!((s, code(&b)), (409, "limit_reached"), "{b}");
    assert_eq!(app.stock("q-sell").await, Some(4));
    assert_eq!(app.drained("q-sell").await["recorded"], 1);
    // The SKU view shows the queue.
    let v = app.view("q-sell").await;
    assert_eq!(v["queue"]["admit_per_second"], 50, "{v}");
    assert!(v["queue"]["admitted"].as_i64().unwrap() >= 2, "{v}");
}

#[tokio::test]
async fn a_lost_queue_fails_closed() {
    let app = spawn_app().await;
    let r = declare_queued(
        &app,
        "q-lost",
        5,
        json!({"admit_per_second": 1}),
        json!({"opens_at": (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339()}),
    )
    .await;
    assert_eq!(r.status(), 201);
    let (_, t) = join(&app, "q-lost", &visitor("a")).await;
    let id = t["ticket_id"].as_str().unwrap().to_string();
    // Redis loses the SKU (its state and its queue).
    let k = qkeys(&app.probe, "q-lost");
    let mut con = app.probe.redis.clone();
    let _: i64 = con.del(&k[..3]).await.unwrap();
    let _: i64 = con.del(&k[3]).await.unwrap();
    let (s, b) = join(&app, "q-lost", &visitor("b")).await;
    assert_eq!((s, code(&b)), (503, "unavailable"), "{b}");
    let (s, b) = ticket(&app, &id, &visitor("a")).await;
    assert_eq!((s, code(&b)), (503, "unavailable"), "{b}");
    // Nothing was created in its place.
    assert_eq!(counts(&app.probe, "q-lost").await, (0, 0));
    let exists: bool = con.exists(&k[3]).await.unwrap();
    assert!(!exists, "the queue adopted no state");
}

fn jsonwebtoken_exp(secs: i64) -> u64 {
    (chrono::Utc::now().timestamp() + secs) as u64
}

/// The claims of a JWT the gateway minted, verified with the test's secret.
pub fn decode(jwt: &str) -> Value {
    use jsonwebtoken::{Algorithm, DecodingKey, Validation};
    jsonwebtoken::decode::<Value>(
        jwt,
        &DecodingKey::from_secret(SECRET.as_bytes()).unwrap(),
        &Validation::new(Algorithm::HS256),
    )
    .unwrap()
    .claims
}
