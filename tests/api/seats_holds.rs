//! Holds on a seated SKU (API.md "Holds" and "Reserved seating"): a won claim holds its seats
//! until it is confirmed, cancelled or expires; a confirm keeps exactly its seats, a cancel or
//! an expiry frees exactly them (in Redis's map and in PostgreSQL's live seats), in the same
//! step as its units, and they sell again. A restore brings a live hold back with its seats,
//! and it still frees them when it ends. Before, a seated SKU refused `hold_seconds` at declare.

use std::time::Duration;

use serde_json::{json, Value};

use crate::helpers::{code, spawn_app, token, wait_for};
use crate::seat_support::{act, declare_hall, ledger_status, live_seats, map, take};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirmed_seated_hold_keeps_its_seats_and_a_cancelled_one_frees_exactly_them() {
    let app = spawn_app().await;
    declare_hall(&app, "heldhall", 300).await;
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
    declare_hall(&app, "exphall", 3).await;
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
