//! Declaring, restocking and viewing SKUs.

use serde_json::Value;

use crate::helpers::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redeclaring_a_sku_never_reseeds_its_stock() {
    let app = spawn_app().await;
    let r = app.declare("seed", 3, 1).await;
    assert_eq!(r.status(), 201);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["remaining"], 3);
    assert_eq!(app.claim("seed", "a", 1, None).await.status(), 201);

    // Same total again: 200, the sold unit stays sold; the limit may change.
    let r = app.declare("seed", 3, 2).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["remaining"], 2);
    assert_eq!(v["per_user_limit"], 2);
    assert_eq!(app.stock("seed").await, Some(2));
    // The new limit is what Redis enforces.
    assert_eq!(app.claim("seed", "a", 1, None).await.status(), 201);

    // Another total: 409 sku_exists, nothing changes.
    let r = app.declare("seed", 50, 1).await;
    assert_eq!(r.status(), 409);
    assert_eq!(code(&r.json().await.unwrap()), "sku_exists");
    assert_eq!(app.stock("seed").await, Some(1));
    let total: i64 = sqlx::query_scalar("SELECT total FROM skus WHERE sku = 'seed'")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(total, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_gateway_does_not_reseed_a_sold_sku() {
    let iso = Isolation::new();
    let first = spawn_with_config(iso.raw_config(REDIS_URL)).await;
    first.declare("restart", 2, 1).await;
    assert_eq!(first.claim("restart", "a", 1, None).await.status(), 201);
    first.stop().await;

    let second = spawn_with_config(iso.raw_config(REDIS_URL)).await;
    assert_eq!(second.declare("restart", 2, 1).await.status(), 200);
    assert_eq!(second.stock("restart").await, Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restock_moves_total_and_stock_together_and_never_below_zero() {
    let app = spawn_app().await;
    app.declare("rs", 5, 5).await;
    assert_eq!(app.claim("rs", "a", 3, None).await.status(), 201);

    let r = app.restock("rs", 10).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["total"], 15);
    assert_eq!(v["remaining"], 12);

    // 12 remain: taking 13 would go below 0.
    let r = app.restock("rs", -13).await;
    assert_eq!(r.status(), 409);
    assert_eq!(code(&r.json().await.unwrap()), "insufficient_stock");
    assert_eq!(app.stock("rs").await, Some(12));

    let r = app.restock("rs", -12).await;
    assert_eq!(r.status(), 200);
    let v = app.drained("rs").await;
    assert_eq!(v["total"], 3);
    assert_eq!(v["remaining"], 0);
    assert_eq!(v["consistent"], true);

    assert_eq!(app.restock("nope", 1).await.status(), 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_routes_need_the_admin_token_and_valid_bodies() {
    let app = spawn_app().await;
    let url = format!("{}/admin/skus/x", app.base);
    let r = app
        .http
        .put(&url)
        .json(&serde_json::json!({"total": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = app
        .http
        .put(&url)
        .bearer_auth(token("buyer"))
        .json(&serde_json::json!({"total": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    for bad in [
        serde_json::json!({"total": -1}),
        serde_json::json!({"total": 1, "per_user_limit": 0}),
        serde_json::json!({"total": "many"}),
        serde_json::json!({"total": 1, "surprise": true}),
        serde_json::json!({"total": 1, "hold_seconds": -1}),
        serde_json::json!({"total": 1, "offer_seconds": 8 * 24 * 3600}),
        serde_json::json!({"total": 1, "opens_at": "tomorrow"}),
        serde_json::json!({"total": 1, "opens_at": "2030-01-02T00:00:00Z",
                           "closes_at": "2030-01-01T00:00:00Z"}),
    ] {
        let r = app
            .http
            .put(&url)
            .bearer_auth(ADMIN)
            .json(&bad)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{bad}");
        assert_eq!(code(&r.json().await.unwrap()), "bad_request");
    }
    let exists: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM skus WHERE sku = 'x')")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert!(!exists);
    assert_eq!(app.stock("x").await, None);
}

/// Sends a raw admin body; a dropped connection (a panicking handler) is status 0.
async fn admin_raw(app: &TestApp, method: reqwest::Method, path: &str, body: &str) -> (u16, Value) {
    let r = app
        .http
        .request(method, format!("{}{path}", app.base))
        .bearer_auth(ADMIN)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await;
    match r {
        Ok(r) => (r.status().as_u16(), r.json().await.unwrap_or(Value::Null)),
        Err(_) => (0, Value::Null),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extreme_totals_and_deltas_are_refused_without_a_panic_and_change_nothing() {
    let app = spawn_app().await;
    app.declare("ext", 10, 1).await;
    let post = reqwest::Method::POST;
    for delta in [
        "-9223372036854775808",
        "9223372036854775807",
        "-9223372036854775809",
        "18446744073709551616",
        "1e30",
        "-1e30",
        "1.0",
        "1e3",
        "-0",
        "0",
        "\"1\"",
        "null",
        "1000000000001",
        "-1000000000001",
    ] {
        let (status, body) = admin_raw(
            &app,
            post.clone(),
            "/admin/skus/ext/restock",
            &format!("{{\"delta\": {delta}}}"),
        )
        .await;
        assert_eq!(status, 400, "delta {delta}: {body}");
        assert_eq!(code(&body), "bad_request", "delta {delta}");
    }
    // The total may not pass 10^12, neither declared nor grown by restocks.
    for total in ["1000000000001", "9223372036854775807", "-1", "1e12"] {
        let (status, body) = admin_raw(
            &app,
            reqwest::Method::PUT,
            "/admin/skus/big",
            &format!("{{\"total\": {total}}}"),
        )
        .await;
        assert_eq!(status, 400, "total {total}: {body}");
    }
    let max = 1_000_000_000_000i64;
    assert_eq!(app.restock("ext", max - 10).await.status(), 200);
    let r = app.restock("ext", 1).await;
    assert_eq!(r.status(), 400);
    assert_eq!(code(&r.json().await.unwrap()), "bad_request");
    let v = app.view("ext").await;
    assert_eq!(v["total"], max);
    assert_eq!(v["remaining"], max);
    assert_eq!(app.get("/healthz").await.status(), 200);
}
