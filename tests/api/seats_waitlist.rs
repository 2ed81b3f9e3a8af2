//! The waitlist of a seated SKU (API.md "Reserved seating"): a join says how many seats it
//! waits for (`{"quantity": N}`), and the seats a cancel, an expiry or a compensation frees
//! are offered, in line order, as holds of the best available seats for each entry's quantity,
//! in the same atomic step that frees them: never to open stock while an entry can take them.
//! An entry asking for more seats than came back keeps its place; the next that fits is
//! offered. A restore brings the line back with its quantities. Before, the join was 409.

use std::time::Duration;

use serde_json::{json, Value};

use crate::helpers::{code, spawn_app, wait_for, TestApp};
use crate::seat_support::{act, declare_hall, join, ledger_status, live_seats, map, read, take};

/// Fills the eight seats: `u-left` holds 1–4 (exact), `u-right` 5–8.
async fn fill(app: &TestApp, sku: &str) -> (String, String) {
    let (s, a) = take(
        app,
        sku,
        "u-left",
        json!({"seats": ["A-1-1", "A-1-2", "A-1-3", "A-1-4"]}),
    )
    .await;
    assert_eq!(s, 201, "{a}");
    let (s, b) = take(
        app,
        sku,
        "u-right",
        json!({"seats": ["A-1-5", "A-1-6", "A-1-7", "A-1-8"]}),
    )
    .await;
    assert_eq!(s, 201, "{b}");
    let id = |v: &Value| v["claim_id"].as_str().unwrap().to_string();
    (id(&a), id(&b))
}

async fn entry(app: &TestApp, id: &str, user: &str) -> Value {
    let (s, v) = read(app, &format!("/v1/waitlist/{id}"), user).await;
    assert_eq!(s, 200, "{v}");
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn freed_seats_are_offered_in_line_order_as_the_best_seats_for_each_entrys_quantity() {
    let app = spawn_app().await;
    declare_hall(&app, "wlhall", 300).await;
    let (_, right) = fill(&app, "wlhall").await;
    let (s, big) = join(&app, "wlhall", "w-big", json!({"quantity": 3})).await;
    assert_eq!((s, big["position"].as_i64()), (201, Some(1)), "{big}");
    let (s, small) = join(&app, "wlhall", "w-small", json!({"quantity": 1})).await;
    assert_eq!((s, small["position"].as_i64()), (201, Some(2)), "{small}");
    let (s, huge) = join(&app, "wlhall", "w-huge", json!({"quantity": 4})).await;
    assert_eq!((s, huge["position"].as_i64()), (201, Some(3)), "{huge}");
    let (big_id, small_id, huge_id) = (
        big["entry_id"].as_str().unwrap(),
        small["entry_id"].as_str().unwrap(),
        huge["entry_id"].as_str().unwrap(),
    );
    assert_eq!(entry(&app, big_id, "w-big").await["quantity"], 3);

    // Four seats come back: the head gets the best three (5–7: both runs of three strand a
    // seat, 5–7 is nearer the middle), the next entry the last one; the entry of four keeps
    // its place, and nothing is left in open stock.
    let (s, body) = act(&app, &right, "u-right", "cancel").await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(map(&app, "wlhall").await, "xxxxxxxx");
    assert_eq!(app.probe.stock("wlhall").await, Some(0));
    let e = entry(&app, big_id, "w-big").await;
    assert_eq!(e["status"], "offered", "{e}");
    let (s, offer) = read(&app, &format!("/v1/claims/{big_id}"), "w-big").await;
    assert_eq!(s, 200, "{offer}");
    assert_eq!(
        (
            offer["status"].as_str(),
            &offer["seats"],
            offer["quantity"].as_i64()
        ),
        (Some("held"), &json!(["A-1-5", "A-1-6", "A-1-7"]), Some(3)),
        "{offer}"
    );
    let (_, offer) = read(&app, &format!("/v1/claims/{small_id}"), "w-small").await;
    assert_eq!(offer["seats"], json!(["A-1-8"]), "{offer}");
    let e = entry(&app, huge_id, "w-huge").await;
    assert_eq!(
        (e["status"].as_str(), e["position"].as_i64()),
        (Some("waiting"), Some(1))
    );

    // The big offer is taken; the small one is declined: its seat goes to the line's next
    // entry that fits (none: four are wanted, one is free), so to open stock.
    let (s, body) = act(&app, big_id, "w-big", "confirm").await;
    assert_eq!(
        (s, body["status"].as_str()),
        (200, Some("confirmed")),
        "{body}"
    );
    let (s, body) = act(&app, small_id, "w-small", "cancel").await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(map(&app, "wlhall").await, "xxxxxxx.");
    assert_eq!(app.probe.stock("wlhall").await, Some(1));
    wait_for(Duration::from_secs(20), || async {
        ledger_status(&app, big_id).await.as_deref() == Some("confirmed")
            && ledger_status(&app, small_id).await.as_deref() == Some("cancelled")
    })
    .await;
    // PostgreSQL's live seats are Redis's taken ones, each once.
    let live = live_seats(&app, "wlhall").await;
    assert_eq!(
        live,
        ["A-1-1", "A-1-2", "A-1-3", "A-1-4", "A-1-5", "A-1-6", "A-1-7"]
    );
    wait_for(Duration::from_secs(20), || async {
        let rows: Vec<(String, i32)> = sqlx::query_as(
            "SELECT status, quantity FROM waitlist WHERE sku = 'wlhall' ORDER BY position",
        )
        .fetch_all(&app.db)
        .await
        .unwrap();
        rows == [
            ("claimed".into(), 3),
            ("expired".into(), 1),
            ("waiting".into(), 4),
        ]
    })
    .await;
    let v = app.drained("wlhall").await;
    assert_eq!(v["consistent"], true, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_brings_the_line_back_with_its_quantities_and_offers_follow_it() {
    let app = spawn_app().await;
    declare_hall(&app, "wlrest", 300).await;
    let (left, _) = fill(&app, "wlrest").await;
    let (s, pair) = join(&app, "wlrest", "w-pair", json!({"quantity": 2})).await;
    assert_eq!(s, 201, "{pair}");
    let pair_id = pair["entry_id"].as_str().unwrap();
    wait_for(Duration::from_secs(20), || async {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM waitlist WHERE sku = 'wlrest' AND quantity = 2",
        )
        .fetch_one(&app.db)
        .await
        .unwrap();
        n == 1 && ledger_status(&app, &left).await.as_deref() == Some("held")
    })
    .await;
    // Redis loses the SKU; the restore rebuilds the map, the holds and the line.
    app.probe.lose_sku("wlrest").await;
    let r = app.restore("wlrest", false).await;
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    assert_eq!(map(&app, "wlrest").await, "xxxxxxxx");
    // Four seats come back: the entry gets two adjacent ones (3–4: 1–2 would strand nothing
    // either, 3–4 is nearer the middle), the other two go to open stock.
    let (s, body) = act(&app, &left, "u-left", "cancel").await;
    assert_eq!(s, 200, "{body}");
    let (s, offer) = read(&app, &format!("/v1/claims/{pair_id}"), "w-pair").await;
    assert_eq!(s, 200, "{offer}");
    assert_eq!(offer["seats"], json!(["A-1-3", "A-1-4"]), "{offer}");
    assert_eq!(map(&app, "wlrest").await, "..xxxxxx");
    assert_eq!(app.probe.stock("wlrest").await, Some(2));
    let v = app.drained("wlrest").await;
    assert_eq!(v["consistent"], true, "{v}");
    assert_eq!(
        live_seats(&app, "wlrest").await,
        ["A-1-3", "A-1-4", "A-1-5", "A-1-6", "A-1-7", "A-1-8"]
    );
}

#[tokio::test]
async fn a_waitlist_join_with_a_bad_quantity_is_refused_with_words_and_nothing_changes() {
    let app = spawn_app().await;
    declare_hall(&app, "wlbad", 300).await;
    fill(&app, "wlbad").await;
    for body in [
        json!({"quantity": 5}),
        json!({"quantity": 0}),
        json!({"quantity": "two"}),
        json!({"seats": ["A-1-1"]}),
    ] {
        let (s, v) = join(&app, "wlbad", "w-bad", body.clone()).await;
        assert_eq!((s, code(&v)), (400, "bad_request"), "{body}: {v}");
    }
    // A SKU sold by count offers one unit an entry.
    app.declare("plain", 1, 1).await;
    let (s, v) = take(&app, "plain", "u-one", json!({"quantity": 1})).await;
    assert_eq!(s, 201, "{v}");
    let (s, v) = join(&app, "plain", "w-bad", json!({"quantity": 2})).await;
    assert_eq!((s, code(&v)), (400, "bad_request"), "{v}");
    let entries: i64 = sqlx::query_scalar("SELECT count(*) FROM waitlist")
        .fetch_one(&app.db)
        .await
        .unwrap();
    let mut con = app.probe.redis.clone();
    let mut lines = 0;
    for sku in ["wlbad", "plain"] {
        let n: i64 = redis::cmd("ZCARD")
            .arg(format!("{}:{{{sku}}}:wl", app.probe.prefix))
            .query_async(&mut con)
            .await
            .unwrap();
        lines += n;
    }
    assert_eq!((entries, lines), (0, 0));
    // A quantity that fits is taken.
    let (s, v) = join(&app, "wlbad", "w-ok", json!({"quantity": 4})).await;
    assert_eq!(s, 201, "{v}");
}
