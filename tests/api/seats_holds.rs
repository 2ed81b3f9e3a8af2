//! Holds on a seated SKU (API.md "Holds" and "Reserved seating"): a won claim holds its seats
//! until it is confirmed, cancelled or expires; a confirm keeps exactly its seats, a cancel or
//! an expiry frees exactly them (in Redis's map and in PostgreSQL's live seats), in the same
//! step as its units, and they sell again. A restore brings a live hold back with its seats,
//! and it still frees them when it ends. Before, a seated SKU refused `hold_seconds` at declare.

use std::time::Duration;

use serde_json::{json, Value};

use crate::helpers::{code, spawn_app, token, wait_for, TestApp, ADMIN};

async fn declare_held_hall(app: &TestApp, sku: &str, hold_seconds: i64) {
    let r = app
        .http
        .put(format!("{}/admin/skus/{sku}", app.base))
        .bearer_auth(ADMIN)
        .json(
            &json!({"seats": {"sections": [{"name": "A", "rows": 1, "count": 8}]},
                      "per_user_limit": 4, "hold_seconds": hold_seconds}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "{:?}", r.text().await);
}

async fn take(app: &TestApp, sku: &str, user: &str, body: Value) -> (u16, Value) {
    let r = app
        .http
        .post(format!("{}/v1/skus/{sku}/claims", app.base))
        .bearer_auth(token(user))
        .json(&body)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

async fn act(app: &TestApp, claim: &str, user: &str, what: &str) -> (u16, Value) {
    let r = app
        .http
        .post(format!("{}/v1/claims/{claim}/{what}", app.base))
        .bearer_auth(token(user))
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

/// The map's taken bits as `x`/`.` (seat 1 first) of a one-row hall of 8 seats.
async fn map(app: &TestApp, sku: &str) -> String {
    let mut con = app.probe.redis.clone();
    let bits: Vec<u8> = redis::cmd("GET")
        .arg(format!("{}:{{{sku}}}:seats", app.probe.prefix))
        .query_async(&mut con)
        .await
        .unwrap();
    (0..8)
        .map(
            |b| match bits.first().is_some_and(|x| x & (0x80 >> b) != 0) {
                true => 'x',
                false => '.',
            },
        )
        .collect()
}

/// PostgreSQL's live seats of `sku` (the unique `issuance_seats`), sorted.
async fn live_seats(app: &TestApp, sku: &str) -> Vec<String> {
    sqlx::query_scalar("SELECT seat FROM issuance_seats WHERE sku = $1 ORDER BY seat")
        .bind(sku)
        .fetch_all(&app.db)
        .await
        .unwrap()
}

async fn ledger_status(app: &TestApp, claim: &str) -> Option<String> {
    sqlx::query_scalar("SELECT status FROM issuances WHERE claim_id = $1::uuid")
        .bind(claim)
        .fetch_optional(&app.db)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirmed_seated_hold_keeps_its_seats_and_a_cancelled_one_frees_exactly_them() {
    let app = spawn_app().await;
    declare_held_hall(&app, "heldhall", 300).await;
    let (s, keep) = take(
        &app,
        "heldhall",
        "u-keep",
        json!({"seats": ["A-1-1", "A-1-2"]}),
    )
    .await;
    assert_eq!(s, 201, "{keep}");
    assert_eq!(keep["status"], "held", "{keep}");
    assert!(keep["expires_at"].is_string(), "{keep}");
    let (s, drop) = take(&app, "heldhall", "u-drop", json!({"quantity": 3})).await;
    assert_eq!(s, 201, "{drop}");
    // Best available: the run nearest the middle that strands no seat.
    assert_eq!(drop["seats"], json!(["A-1-3", "A-1-4", "A-1-5"]), "{drop}");
    assert_eq!(map(&app, "heldhall").await, "xxxxx...");
    // Held seats are taken for everyone else.
    let (s, body) = take(&app, "heldhall", "u-late", json!({"seats": ["A-1-5"]})).await;
    assert_eq!((s, code(&body)), (409, "seats_taken"), "{body}");

    let (id_keep, id_drop) = (
        keep["claim_id"].as_str().unwrap(),
        drop["claim_id"].as_str().unwrap(),
    );
    // The claim carries its seats, read from Redis's hold before the ledger has it too.
    let got: Value = app
        .http
        .get(format!("{}/v1/claims/{id_keep}", app.base))
        .bearer_auth(token("u-keep"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (got["status"].as_str(), &got["seats"]),
        (Some("held"), &json!(["A-1-1", "A-1-2"])),
        "{got}"
    );
    let (s, body) = act(&app, id_keep, "u-keep", "confirm").await;
    assert_eq!(
        (s, body["status"].as_str()),
        (200, Some("confirmed")),
        "{body}"
    );
    let (s, body) = act(&app, id_drop, "u-drop", "cancel").await;
    assert_eq!(
        (s, body["status"].as_str()),
        (200, Some("cancelled")),
        "{body}"
    );
    assert_eq!(map(&app, "heldhall").await, "xx......");
    assert_eq!(app.probe.stock("heldhall").await, Some(6));
    wait_for(Duration::from_secs(20), || async {
        ledger_status(&app, id_drop).await.as_deref() == Some("cancelled")
            && ledger_status(&app, id_keep).await.as_deref() == Some("confirmed")
    })
    .await;
    assert_eq!(live_seats(&app, "heldhall").await, ["A-1-1", "A-1-2"]);
    // The cancelled seats sell again, to anyone.
    let (s, body) = take(
        &app,
        "heldhall",
        "u-late",
        json!({"seats": ["A-1-5", "A-1-6"]}),
    )
    .await;
    assert_eq!(s, 201, "{body}");
    let v = app.drained("heldhall").await;
    assert_eq!(v["consistent"], true, "{v}");
    assert_eq!(v["seats"]["taken"], 4, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_seated_hold_frees_exactly_its_seats_even_after_a_restore() {
    let app = spawn_app().await;
    declare_held_hall(&app, "exphall", 3).await;
    let (s, a) = take(&app, "exphall", "u-a", json!({"seats": ["A-1-3", "A-1-4"]})).await;
    assert_eq!(s, 201, "{a}");
    let (s, b) = take(&app, "exphall", "u-b", json!({"seats": ["A-1-7"]})).await;
    assert_eq!(s, 201, "{b}");
    let (id_a, id_b) = (
        a["claim_id"].as_str().unwrap(),
        b["claim_id"].as_str().unwrap(),
    );
    let (s, body) = act(&app, id_b, "u-b", "confirm").await;
    assert_eq!(s, 200, "{body}");
    wait_for(Duration::from_secs(20), || async {
        ledger_status(&app, id_a).await.as_deref() == Some("held")
            && ledger_status(&app, id_b).await.as_deref() == Some("confirmed")
    })
    .await;
    // Redis loses the SKU while the hold is live; the restore brings it back with its seats.
    let mut con = app.probe.redis.clone();
    let _: () = redis::cmd("DEL")
        .arg(format!("{}:{{exphall}}:state", app.probe.prefix))
        .arg(format!("{}:{{exphall}}:seats", app.probe.prefix))
        .arg(format!("{}:{{exphall}}:holds", app.probe.prefix))
        .arg(format!("{}:{{exphall}}:expiry", app.probe.prefix))
        .query_async(&mut con)
        .await
        .unwrap();
    let r = app.restore("exphall", false).await;
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    assert_eq!(map(&app, "exphall").await, "..xx..x.");
    // Its expiry frees exactly its seats, in Redis and in PostgreSQL.
    wait_for(Duration::from_secs(30), || async {
        ledger_status(&app, id_a).await.as_deref() == Some("expired")
    })
    .await;
    assert_eq!(map(&app, "exphall").await, "......x.");
    assert_eq!(app.probe.stock("exphall").await, Some(7));
    assert_eq!(live_seats(&app, "exphall").await, ["A-1-7"]);
    let (s, body) = act(&app, id_a, "u-a", "confirm").await;
    assert_eq!((s, code(&body)), (409, "hold_expired"), "{body}");
    let (s, body) = take(&app, "exphall", "u-c", json!({"seats": ["A-1-3", "A-1-4"]})).await;
    assert_eq!(s, 201, "{body}");
    let v = app.drained("exphall").await;
    assert_eq!(v["consistent"], true, "{v}");
}

#[tokio::test]
async fn a_seated_skus_waitlist_is_refused_with_words_and_nothing_changes() {
    let app = spawn_app().await;
    declare_held_hall(&app, "fullhall", 60).await;
    let four = json!({"seats": ["A-1-1", "A-1-2", "A-1-3", "A-1-4"]});
    let (s, body) = take(&app, "fullhall", "u-all", four).await;
    assert_eq!(s, 201, "{body}");
    let four = json!({"seats": ["A-1-5", "A-1-6", "A-1-7", "A-1-8"]});
    let (s, body) = take(&app, "fullhall", "u-all2", four).await;
    assert_eq!(s, 201, "{body}");
    let r = app
        .http
        .post(format!("{}/v1/skus/fullhall/waitlist", app.base))
        .bearer_auth(token("u-wait"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 409);
    assert_eq!(code(&r.json().await.unwrap()), "seated_sku");
    let entries: i64 = sqlx::query_scalar("SELECT count(*) FROM waitlist")
        .fetch_one(&app.db)
        .await
        .unwrap();
    let mut con = app.probe.redis.clone();
    let line: i64 = redis::cmd("ZCARD")
        .arg(format!("{}:{{fullhall}}:wl", app.probe.prefix))
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!((entries, line), (0, 0));
}
