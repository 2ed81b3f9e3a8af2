//! Refusals a client can act on (issue 41): a body sent as another type is 415 and changes
//! nothing, a wrong field is named in plain words, the not-found and conflict answers say what
//! to do, and the claim latency histogram tells the outcomes apart.

use serde_json::{json, Value};

use crate::helpers::*;

/// A claim of `sku` by `user`, its body and headers still to set.
fn claim_req(app: &TestApp, sku: &str, user: &str) -> reqwest::RequestBuilder {
    app.http
        .post(format!("{}/v1/skus/{sku}/claims", app.base))
        .bearer_auth(token(user))
}

async fn problem(r: reqwest::Response) -> (u16, Value) {
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_sent_as_another_type_is_415_and_changes_nothing() {
    let app = spawn_app().await;
    app.declare("mt", 10, 5).await;
    let send = |ct: &'static str, body: &'static str| {
        app.http
            .post(format!("{}/v1/skus/mt/claims", app.base))
            .bearer_auth(token("u1"))
            .header("content-type", ct)
            .body(body)
            .send()
    };
    for (ct, body) in [
        ("text/plain", r#"{"quantity": 1}"#),
        ("application/xml", "<claim><quantity>1</quantity></claim>"),
    ] {
        let (s, b) = problem(send(ct, body).await.unwrap()).await;
        assert_eq!(s, 415, "{ct}: {b}");
        assert_eq!(code(&b), "unsupported_media_type", "{b}");
        assert_eq!(b["type"], "/problems/unsupported-media-type", "{b}");
        assert!(
            b["detail"].as_str().unwrap().contains("application/json"),
            "{b}"
        );
    }
    // `curl -d` sends its body as a form unless told otherwise: read as JSON, so a form body
    // is 400 and a JSON one is taken.
    let (s, b) = problem(
        send("application/x-www-form-urlencoded", "quantity=1")
            .await
            .unwrap(),
    )
    .await;
    assert_eq!((s, code(&b)), (400, "bad_request"), "{b}");
    assert_eq!(app.probe.stock("mt").await, Some(10), "nothing moved");
    let (s, b) = problem(
        send("application/x-www-form-urlencoded", r#"{"quantity": 1}"#)
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(s, 201, "{b}");
    // JSON with a charset, a +json type, and no Content-Type at all are all read as JSON.
    for ct in [
        "application/json; charset=utf-8",
        "application/vnd.api+json",
    ] {
        let (s, b) = problem(send(ct, r#"{"quantity": 1}"#).await.unwrap()).await;
        assert_eq!(s, 201, "{ct}: {b}");
    }
    let r = claim_req(&app, "mt", "u2")
        .body(r#"{"quantity": 1}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    // An empty body has no type to be wrong: one unit.
    let r = claim_req(&app, "mt", "u3")
        .header("content-type", "text/plain")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    app.drained("mt").await;
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM issuances WHERE sku = 'mt'")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(
        rows, 5,
        "the four JSON claims (one sent as curl -d sends it) and the empty one, none refused"
    );
    // The admin routes read bodies the same way.
    let r = app
        .http
        .put(format!("{}/admin/skus/mt2", app.base))
        .bearer_auth(ADMIN)
        .header("content-type", "text/plain")
        .body(r#"{"total": 3}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 415);
    let none: i64 = sqlx::query_scalar("SELECT count(*) FROM skus WHERE sku = 'mt2'")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(none, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_field_is_named_in_plain_words_and_conflicts_say_what_to_do() {
    let app = spawn_app().await;
    app.declare("dt", 3, 2).await;
    let r = claim_req(&app, "dt", "u1")
        .json(&json!({"quantity": "2"}))
        .send()
        .await
        .unwrap();
    let (s, b) = problem(r).await;
    assert_eq!((s, code(&b)), (400, "bad_request"), "{b}");
    let detail = b["detail"].as_str().unwrap();
    assert!(detail.contains("quantity"), "{detail}");
    assert!(detail.contains("expected an integer"), "{detail}");
    assert!(!detail.contains("i64"), "{detail}");

    // Each of these answers says what the client can do next.
    let unknown = app.claim("nope", "u1", 1, None).await;
    let (s, b) = problem(unknown).await;
    assert_eq!((s, code(&b)), (404, "unknown_sku"));
    assert!(
        b["detail"].as_str().unwrap().contains("PUT /admin/skus"),
        "{b}"
    );
    let (s, b) = problem(app.restock("dt", -10).await).await;
    assert_eq!((s, code(&b)), (409, "insufficient_stock"));
    assert!(b["detail"].as_str().unwrap().contains("below 0"), "{b}");
    let big = "x".repeat(17 * 1024);
    let r = claim_req(&app, "dt", "u1")
        .header("content-type", "application/json")
        .body(big)
        .send()
        .await
        .unwrap();
    let (s, b) = problem(r).await;
    assert_eq!((s, code(&b)), (413, "payload_too_large"));
    assert!(b["detail"].as_str().unwrap().contains("16 KiB"), "{b}");
    let r = claim_req(&app, "dt", "u9")
        .header("idempotency-key", "k-1")
        .json(&json!({"quantity": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let r = claim_req(&app, "dt", "u9")
        .header("idempotency-key", "k-1")
        .json(&json!({"quantity": 2}))
        .send()
        .await
        .unwrap();
    let (s, b) = problem(r).await;
    assert_eq!((s, code(&b)), (422, "idempotency_key_reused"));
    assert!(b["detail"].as_str().unwrap().contains("new key"), "{b}");
    assert_eq!(
        app.probe.stock("dt").await,
        Some(2),
        "only the one claim moved stock"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_claim_latency_histogram_tells_the_outcomes_apart() {
    let app = spawn_app().await;
    app.declare("lat", 1, 1).await;
    assert_eq!(app.claim("lat", "a", 1, None).await.status(), 201);
    assert_eq!(app.claim("lat", "b", 1, None).await.status(), 409);
    let m = app.get("/metrics").await.text().await.unwrap();
    for outcome in ["won", "sold_out"] {
        let count = m
            .lines()
            .find_map(|l| {
                l.strip_prefix(&format!(
                    "dropgate_claim_latency_seconds_count{{outcome=\"{outcome}\"}} "
                ))
            })
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0);
        assert!(count >= 1.0, "{outcome}: {count}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_refuses_a_body_of_another_type_and_an_array_is_not_a_claim() {
    let app = spawn_app().await;
    app.declare("ot", 1, 1).await;
    let won = app.claim("ot", "a", 1, None).await;
    assert_eq!(won.status(), 201);
    let claim_id = won.json::<Value>().await.unwrap()["claim_id"]
        .as_str()
        .unwrap()
        .to_string();
    // Routes that read no body act on nothing when one of another type comes.
    for (path, bearer) in [
        ("/v1/skus/ot/waitlist".to_string(), token("b")),
        (format!("/v1/claims/{claim_id}/cancel"), token("a")),
        (
            "/admin/skus/ot/restore?force=true".to_string(),
            ADMIN.to_string(),
        ),
    ] {
        let r = app
            .http
            .post(format!("{}{path}", app.base))
            .bearer_auth(bearer)
            .header("content-type", "text/plain")
            .body("hello")
            .send()
            .await
            .unwrap();
        let (s, b) = problem(r).await;
        assert_eq!(
            (s, code(&b)),
            (415, "unsupported_media_type"),
            "{path}: {b}"
        );
    }
    let waiting: i64 = sqlx::query_scalar("SELECT count(*) FROM waitlist WHERE sku = 'ot'")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(waiting, 0, "nobody joined the waitlist");
    assert_eq!(
        app.get(&format!("/v1/claims/{claim_id}")).await.status(),
        401,
        "the claim route asks for its buyer's token (the claim is untouched)"
    );
    // A JSON array is no claim body.
    app.restock("ot", 1).await;
    let r = claim_req(&app, "ot", "c")
        .header("content-type", "application/json")
        .body("[1]")
        .send()
        .await
        .unwrap();
    let (s, b) = problem(r).await;
    assert_eq!((s, code(&b)), (400, "bad_request"), "{b}");
    assert_eq!(app.probe.stock("ot").await, Some(1), "nothing sold");
    // The operators' routes take bodies up to 1 MiB (a seated venue's plan): a declare of
    // 100 KiB (padding aside) is read.
    let padded = format!("{{\"total\": 5{}}}", " ".repeat(100 * 1024));
    let r = app
        .http
        .put(format!("{}/admin/skus/ot-big", app.base))
        .bearer_auth(ADMIN)
        .header("content-type", "application/json")
        .body(padded)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    // One of 2 MiB is refused 413 from its declared length before it is read (a client still
    // writing it may see the connection close first): http::a_declared_oversized_body_is_refused_before_it_is_read.
}
