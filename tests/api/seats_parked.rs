//! Seated claims PostgreSQL refused at first (API.md "Reserved seating": every path that frees
//! units frees exactly the seats; docs/seats.md): written later by the reprocessor, a claim
//! keeps its seats in the ledger (`issuances.seats`, the unique index over live seats) and in
//! its events; given
//! back after its last attempt, exactly its seats are free again and can be sold. Before, the
//! reprocessor wrote the row without its seats, and a compensation gave the stock back but
//! left the seats marked taken until a restore.

use std::time::Duration;

use serde_json::{json, Value};

use crate::durability::install_trigger;
use crate::helpers::{spawn_app_with, token, wait_for, TestApp};
use crate::seat_support::{self, declare_hall, map};

/// Exactly `seats` for `user`, which must win.
async fn take(app: &TestApp, sku: &str, user: &str, seats: &[&str]) -> Value {
    let (status, body) = seat_support::take(app, sku, user, json!({ "seats": seats })).await;
    assert_eq!(status, 201, "{body}");
    body
}

async fn unrefuse(app: &TestApp) {
    sqlx::query("UPDATE test_fault SET refuse = false")
        .execute(&app.db)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_seated_claim_written_later_keeps_its_seats_in_the_ledger() {
    let app = spawn_app_with(|c| {
        c.reprocess_max_attempts = "100".into();
        c.reprocess_backoff_ms = "200".into();
    })
    .await;
    install_trigger(&app.db).await;
    declare_hall(&app, "parkhall", 0).await;
    let won = take(&app, "parkhall", "bad-1", &["A-1-2", "A-1-3"]).await;
    let id = won["claim_id"].as_str().unwrap().to_string();
    take(&app, "parkhall", "good-1", &["A-1-6"]).await;
    wait_for(Duration::from_secs(30), || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM persistence_pending")
            .fetch_one(&app.db)
            .await
            .unwrap()
            == 1
    })
    .await;
    unrefuse(&app).await;
    let seats = crate::queue::until(Duration::from_secs(30), || async {
        sqlx::query_scalar::<_, Option<Vec<String>>>(
            "SELECT seats FROM issuances WHERE claim_id = $1::uuid",
        )
        .bind(&id)
        .fetch_optional(&app.db)
        .await
        .unwrap()
    })
    .await;
    assert_eq!(seats, Some(vec!["A-1-2".to_string(), "A-1-3".to_string()]));
    let held: Vec<String> =
        sqlx::query_scalar("SELECT seat FROM issuance_seats WHERE sku = 'parkhall' ORDER BY seat")
            .fetch_all(&app.db)
            .await
            .unwrap();
    assert_eq!(
        held,
        ["A-1-2", "A-1-3", "A-1-6"],
        "the unique index does not hold them"
    );
    assert_eq!(map(&app, "parkhall").await, ".xx..x..");
    let v = app.view("parkhall").await;
    assert_eq!(v["consistent"], true, "{v}");
    assert_eq!(v["remaining"], 5);
    // Their events carry the seats: the writer's win (read past the relay's cursor) and the
    // reprocessor's (an outbox row of its transaction).
    let won = dropgate::outbox::cursor::take(&app.db, 100).await.unwrap();
    let bodies: Vec<Value> = won
        .iter()
        .map(|w| serde_json::to_value(w.event.body()).unwrap())
        .collect();
    assert!(
        bodies
            .iter()
            .any(|b| b["user"] == "good-1" && b["seats"] == json!(["A-1-6"])),
        "{bodies:?}"
    );
    let parked = dropgate::outbox::store::take(&app.db, 100, 0)
        .await
        .unwrap();
    let bodies: Vec<Value> = parked
        .iter()
        .map(|r| serde_json::to_value(r.body()).unwrap())
        .collect();
    assert!(
        bodies.iter().any(|b| b["user"] == "bad-1"
            && b["type"] == "claim.won"
            && b["seats"] == json!(["A-1-2", "A-1-3"])),
        "{bodies:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compensated_seated_claim_frees_exactly_its_seats_and_they_sell_again() {
    let app = spawn_app_with(|c| {
        c.reprocess_max_attempts = "1".into();
        c.reprocess_backoff_ms = "50".into();
    })
    .await;
    install_trigger(&app.db).await;
    declare_hall(&app, "comphall", 0).await;
    take(&app, "comphall", "good-1", &["A-1-1"]).await;
    let won = take(&app, "comphall", "bad-2", &["A-1-4", "A-1-5"]).await;
    let id = won["claim_id"].as_str().unwrap().to_string();
    assert_eq!(map(&app, "comphall").await, "x..xx...");
    wait_for(Duration::from_secs(30), || async {
        sqlx::query_scalar::<_, String>(
            "SELECT status FROM persistence_pending WHERE claim_id = $1::uuid",
        )
        .bind(&id)
        .fetch_optional(&app.db)
        .await
        .unwrap()
        .is_some_and(|s| s == "compensated")
    })
    .await;
    assert_eq!(map(&app, "comphall").await, "x.......");
    assert_eq!(app.probe.stock("comphall").await, Some(7));
    let v = app.view("comphall").await;
    assert_eq!(v["consistent"], true, "{v}");
    assert_eq!(v["seats"], json!({"free": 7, "taken": 1, "single_gaps": 0}));
    unrefuse(&app).await;
    let again = take(&app, "comphall", "good-3", &["A-1-4", "A-1-5"]).await;
    assert_eq!(again["seats"], json!(["A-1-4", "A-1-5"]));
}

/// Redis loses a seated SKU while one of its claims waits in `persistence_pending`: the
/// restore keeps that claim's seats taken (its units out of the stock), so nobody buys them
/// again. Before, the parked row carried no seats and the restore freed them: a seat sold
/// twice once the parked claim was written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_keeps_the_seats_of_a_parked_claim_taken() {
    let app = spawn_app_with(|c| c.reprocess_max_attempts = "100".into()).await;
    install_trigger(&app.db).await;
    declare_hall(&app, "losthall", 0).await;
    take(&app, "losthall", "bad-1", &["A-1-6", "A-1-7"]).await;
    take(&app, "losthall", "good-1", &["A-1-1"]).await;
    wait_for(Duration::from_secs(30), || async {
        let parked: i64 = sqlx::query_scalar("SELECT count(*) FROM persistence_pending")
            .fetch_one(&app.db)
            .await
            .unwrap();
        parked == 1 && app.issued_ids("losthall").await.len() == 1
    })
    .await;
    let mut con = app.probe.redis.clone();
    let _: () = redis::cmd("DEL")
        .arg(format!("{}:{{losthall}}:state", app.probe.prefix))
        .arg(format!("{}:{{losthall}}:seats", app.probe.prefix))
        .query_async(&mut con)
        .await
        .unwrap();
    let r = app.restore("losthall", false).await;
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    assert_eq!(map(&app, "losthall").await, "x....xx.");
    assert_eq!(app.probe.stock("losthall").await, Some(5));
    let r = app
        .http
        .post(format!("{}/v1/skus/losthall/claims", app.base))
        .bearer_auth(token("good-2"))
        .json(&json!({"seats": ["A-1-7"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 409, "a parked claim's seat sold again");
}
