//! The hot path: who wins, how often, and what state the decision leaves behind.

use serde_json::Value;

use crate::helpers::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn winners_never_exceed_stock_under_1000_buyers() {
    let app = spawn_app().await;
    assert_eq!(app.declare("drop-1", 100, 1).await.status(), 201);

    let app_ref = &app;
    let results = all_at_once(1000, |i| {
        let (http, base) = (app_ref.http.clone(), app_ref.base.clone());
        async move {
            let r = http
                .post(format!("{base}/v1/skus/drop-1/claims"))
                .bearer_auth(token(&format!("buyer-{i}")))
                .json(&serde_json::json!({"quantity": 1}))
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            let body: Value = r.json().await.unwrap();
            (status, body)
        }
    })
    .await;

    let won: Vec<&Value> = results
        .iter()
        .filter(|(s, _)| *s == 201)
        .map(|(_, b)| b)
        .collect();
    let sold_out = results
        .iter()
        .filter(|(s, b)| *s == 409 && code(b) == "sold_out")
        .count();
    assert_eq!(won.len(), 100);
    assert_eq!(sold_out, 900);
    assert_eq!(app.stock("drop-1").await, Some(0));
    // Every winner is a distinct buyer and lands in the ledger exactly once.
    let mut ids: Vec<uuid::Uuid> = won
        .iter()
        .map(|b| b["claim_id"].as_str().unwrap().parse().unwrap())
        .collect();
    ids.sort();
    let view = app.drained("drop-1").await;
    assert_eq!(app.issued_ids("drop-1").await, ids);
    assert_eq!(view["recorded"], 100);
    assert_eq!(view["consistent"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_buyer_with_50_concurrent_claims_wins_once_at_limit_1() {
    let app = spawn_app().await;
    app.declare("solo", 10, 1).await;
    let app_ref = &app;
    let statuses = all_at_once(50, |_| {
        let (http, base) = (app_ref.http.clone(), app_ref.base.clone());
        async move {
            http.post(format!("{base}/v1/skus/solo/claims"))
                .bearer_auth(token("greedy"))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    })
    .await;
    assert_eq!(statuses.iter().filter(|s| **s == 201).count(), 1);
    assert_eq!(statuses.iter().filter(|s| **s == 409).count(), 49);
    assert_eq!(app.stock("solo").await, Some(9));
    assert_eq!(app.held("solo", "greedy").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quantities_count_against_the_limit_and_never_fill_partially() {
    let app = spawn_app().await;
    app.declare("multi", 5, 3).await;

    let r = app.claim("multi", "a", 2, None).await;
    assert_eq!(r.status(), 201);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["quantity"], 2);
    assert_eq!(body["remaining"], 3);
    assert_eq!(body["status"], "issued");

    // 2 held + 2 asked passes the limit of 3.
    let r = app.claim("multi", "a", 2, None).await;
    assert_eq!(r.status(), 409);
    assert_eq!(code(&r.json().await.unwrap()), "limit_reached");
    assert_eq!(app.claim("multi", "a", 1, None).await.status(), 201);
    assert_eq!(app.held("multi", "a").await, 3);

    // 2 left: a claim of 3 is refused whole, not filled with 2.
    let r = app.claim("multi", "b", 3, None).await;
    assert_eq!(r.status(), 409);
    assert_eq!(code(&r.json().await.unwrap()), "sold_out");
    assert_eq!(app.stock("multi").await, Some(2));
    assert_eq!(app.held("multi", "b").await, 0);

    // Above the per-user limit is a bad request, decided before Redis.
    let r = app.claim("multi", "c", 4, None).await;
    assert_eq!(r.status(), 400);
    assert_eq!(app.stock("multi").await, Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_request_returns_the_first_body_and_moves_no_stock() {
    let app = spawn_app().await;
    app.declare("idem", 10, 2).await;
    let first = app.claim("idem", "u", 1, Some("key-1")).await;
    assert_eq!(first.status(), 201);
    assert!(first.headers().get("idempotency-replayed").is_none());
    let location = first.headers()["location"].to_str().unwrap().to_string();
    let first: Value = first.json().await.unwrap();

    let again = app.claim("idem", "u", 1, Some("key-1")).await;
    assert_eq!(again.status(), 201);
    assert_eq!(again.headers()["idempotency-replayed"], "true");
    assert_eq!(again.headers()["location"].to_str().unwrap(), location);
    assert_eq!(again.json::<Value>().await.unwrap(), first);
    assert_eq!(app.stock("idem").await, Some(9));
    assert_eq!(app.held("idem", "u").await, 1);

    // Same key, another request: 422, nothing changes.
    let reused = app.claim("idem", "u", 2, Some("key-1")).await;
    assert_eq!(reused.status(), 422);
    assert_eq!(
        code(&reused.json().await.unwrap()),
        "idempotency_key_reused"
    );
    assert_eq!(app.stock("idem").await, Some(9));

    // Keys are scoped per user: another user's same key is a new claim.
    assert_eq!(app.claim("idem", "v", 1, Some("key-1")).await.status(), 201);
    assert_eq!(app.stock("idem").await, Some(8));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_concurrent_retries_of_one_key_make_one_claim() {
    let app = spawn_app().await;
    app.declare("retry", 10, 5).await;
    let app_ref = &app;
    let bodies = all_at_once(30, |_| {
        let (http, base) = (app_ref.http.clone(), app_ref.base.clone());
        async move {
            let r = http
                .post(format!("{base}/v1/skus/retry/claims"))
                .bearer_auth(token("impatient"))
                .header("idempotency-key", "once")
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 201);
            r.json::<Value>().await.unwrap()["claim_id"].clone()
        }
    })
    .await;
    assert!(bodies.iter().all(|id| *id == bodies[0]));
    assert_eq!(app.stock("retry").await, Some(9));
    let view = app.drained("retry").await;
    assert_eq!(view["recorded"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_claim_is_decided_afresh_on_retry() {
    let app = spawn_app().await;
    app.declare("afresh", 1, 1).await;
    assert_eq!(app.claim("afresh", "first", 1, None).await.status(), 201);
    let r = app.claim("afresh", "late", 1, Some("k")).await;
    assert_eq!(r.status(), 409);
    assert_eq!(app.restock("afresh", 1).await.status(), 200);
    // The loss was not recorded under the key, so the retry can now win.
    assert_eq!(
        app.claim("afresh", "late", 1, Some("k")).await.status(),
        201
    );
    assert_eq!(app.stock("afresh").await, Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_refusal_of_the_claim_table_changes_nothing() {
    let app = spawn_app().await;
    app.declare("table", 5, 2).await;
    let url = format!("{}/v1/skus/table/claims", app.base);
    let cases: Vec<(reqwest::RequestBuilder, u16, &str)> = vec![
        (app.http.post(&url), 401, "unauthorized"),
        (
            app.http.post(&url).bearer_auth("not-a-jwt"),
            401,
            "unauthorized",
        ),
        (
            app.http.post(&url).bearer_auth(token_for("u", "other-sku")),
            401,
            "unauthorized",
        ),
        (
            app.http
                .post(format!("{}/v1/skus/nope/claims", app.base))
                .bearer_auth(token("u")),
            404,
            "unknown_sku",
        ),
        (
            app.http
                .post(format!("{}/v1/skus/bad%20id/claims", app.base))
                .bearer_auth(token("u")),
            400,
            "bad_request",
        ),
        (
            app.http
                .post(&url)
                .bearer_auth(token("u"))
                .body("{not json"),
            400,
            "bad_request",
        ),
        (
            app.http
                .post(&url)
                .bearer_auth(token("u"))
                .body(r#"{"quantity": 0}"#),
            400,
            "bad_request",
        ),
        (
            app.http
                .post(&url)
                .bearer_auth(token("u"))
                .body(r#"{"quantity": "1"}"#),
            400,
            "bad_request",
        ),
        (
            app.http
                .post(&url)
                .bearer_auth(token("u"))
                .header("idempotency-key", "has space"),
            400,
            "bad_request",
        ),
        (
            app.http
                .post(&url)
                .bearer_auth(token("u"))
                .body(vec![b' '; 17 * 1024]),
            413,
            "payload_too_large",
        ),
    ];
    for (req, status, expected) in cases {
        let r = req.send().await.unwrap();
        assert_eq!(r.status().as_u16(), status, "{expected}");
        assert_eq!(
            r.headers()["content-type"],
            "application/problem+json",
            "{expected}"
        );
        let body: Value = r.json().await.unwrap();
        assert_eq!(code(&body), expected);
        assert_eq!(body["status"], status);
    }
    assert_eq!(app.stock("table").await, Some(5));
    // A token scoped to this SKU is accepted.
    let r = app
        .http
        .post(&url)
        .bearer_auth(token_for("scoped", "table"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
}
