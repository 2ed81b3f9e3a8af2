//! Reserved seating (docs/seats.md): a seated SKU declared with its plan and its seat map, and
//! seats claimed at once by far more buyers than seats, through claim_seats.lua, the journal,
//! the writer and `issuances.seats`: no seat in two live claims, in Redis or in PostgreSQL.

use std::collections::HashSet;

use dropgate::scripts::seats::{claim_seats, SeatAsk, SeatOutcome};
use dropgate::scripts::Floor;
use dropgate::seating::SeatPlan;
use serde_json::{json, Value};

use crate::helpers::{all_at_once, code, spawn_app, wait_for, TestApp, ADMIN};

async fn declare_seated(app: &TestApp, sku: &str, seats: Value) -> reqwest::Response {
    app.http
        .put(format!("{}/admin/skus/{sku}", app.base))
        .bearer_auth(ADMIN)
        .json(&json!({"seats": seats, "per_user_limit": 6}))
        .send()
        .await
        .unwrap()
}

async fn seat_map(app: &TestApp, sku: &str) -> Vec<u8> {
    let mut con = app.probe.redis.clone();
    redis::cmd("GET")
        .arg(format!("{}:{{{sku}}}:seats", app.probe.prefix))
        .query_async(&mut con)
        .await
        .unwrap()
}

fn taken_bits(map: &[u8]) -> HashSet<u32> {
    (0..map.len() as u32 * 8)
        .filter(|b| map[(*b / 8) as usize] & (0x80 >> (b % 8)) != 0)
        .collect()
}

#[tokio::test]
async fn a_seated_sku_is_declared_with_its_plan_and_an_empty_seat_map_seeded_once() {
    let app = spawn_app().await;
    let plan = json!({"sections": [
        {"name": "A", "rows": [{"name": "1", "count": 10}, {"name": "2", "count": 12}]},
        {"name": "B", "rows": 3, "count": 20}]});
    let r = declare_seated(&app, "hall", plan.clone()).await;
    assert_eq!(r.status(), 201);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["total"], 82);
    assert_eq!(app.probe.stock("hall").await, Some(82));
    assert_eq!(seat_map(&app, "hall").await, vec![0u8; 11]);
    let stored: Option<String> = sqlx::query_scalar("SELECT seats FROM skus WHERE sku = 'hall'")
        .fetch_one(&app.db)
        .await
        .unwrap();
    let stored: Value = serde_json::from_str(&stored.unwrap()).unwrap();
    assert_eq!(
        SeatPlan::parse(&stored).unwrap(),
        SeatPlan::parse(&plan).unwrap()
    );
    // The same plan again: 200, nothing re-seeded; another plan: 409 sku_exists.
    let mut con = app.probe.redis.clone();
    let _: () = redis::cmd("SETBIT")
        .arg(format!("{}:{{hall}}:seats", app.probe.prefix))
        .arg(3)
        .arg(1)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(declare_seated(&app, "hall", plan).await.status(), 200);
    assert_eq!(taken_bits(&seat_map(&app, "hall").await).len(), 1);
    let other = json!({"sections": [{"name": "A", "rows": 1, "count": 82}]});
    let r = declare_seated(&app, "hall", other).await;
    assert_eq!(r.status(), 409);
    assert_eq!(code(&r.json().await.unwrap()), "sku_exists");
    // A plan that names a seat two ways is refused with words, and nothing is stored.
    let bad = json!({"sections": [{"name": "A-1", "rows": 1, "count": 5}]});
    let r = declare_seated(&app, "bad", bad).await;
    assert_eq!(r.status(), 400);
    assert_eq!(code(&r.json().await.unwrap()), "bad_request");
    assert!(app.probe.stock("bad").await.is_none());
}

#[tokio::test]
async fn a_hundred_thousand_seat_stadium_is_a_map_of_at_most_64_kib() {
    let app = spawn_app().await;
    let plan = json!({"sections": [{"name": "N", "rows": 100, "count": 500},
                                   {"name": "S", "rows": 100, "count": 500}]});
    assert_eq!(declare_seated(&app, "stadium", plan).await.status(), 201);
    let mut con = app.probe.redis.clone();
    let bytes: i64 = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(format!("{}:{{stadium}}:seats", app.probe.prefix))
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(bytes <= 64 * 1024, "{bytes} bytes");
    assert_eq!(seat_map(&app, "stadium").await.len(), 12_500);
}

/// Far more buyers than seats, all at once, in groups of 1-4, most best available and some
/// picking the same seats: every seat goes to at most one claim, in Redis's map and in
/// PostgreSQL's `issuances.seats` (and its unique `issuance_seats`), and the two agree.
#[tokio::test]
async fn concurrent_seat_claims_never_give_a_seat_twice_in_redis_or_postgres() {
    let app = spawn_app().await;
    let plan_json = json!({"sections": [{"name": "A", "rows": 4, "count": 12}]});
    assert_eq!(
        declare_seated(&app, "arena", plan_json.clone())
            .await
            .status(),
        201
    );
    let plan = std::sync::Arc::new(SeatPlan::parse(&plan_json).unwrap());
    let tag: i32 = sqlx::query_scalar("SELECT tag FROM skus WHERE sku = 'arena'")
        .fetch_one(&app.db)
        .await
        .unwrap();
    let keys = dropgate::keys::SkuKeys::new(&app.probe.prefix, "arena");
    let outcomes = all_at_once(200, |i| {
        let (mut con, keys, plan) = (app.probe.redis.clone(), keys.clone(), plan.clone());
        async move {
            let ask = if i % 5 == 0 {
                let n = 5 + i % 3;
                let ids: Vec<String> = (n..n + 2).map(|s| format!("A-1-{s}")).collect();
                SeatAsk::exact(&plan, &ids).unwrap()
            } else {
                SeatAsk::best(&plan, Some("A"), 1 + i % 4, true).unwrap()
            };
            let id = dropgate::ids::mint_call(tag);
            let user = format!("u{i}");
            claim_seats(&mut con, &keys, Floor::seq(0), &id, &user, &ask, None, 0)
                .await
                .unwrap()
        }
    })
    .await;
    let mut sold: Vec<String> = Vec::new();
    for o in &outcomes {
        if let SeatOutcome::Won { seats, .. } = o {
            sold.extend(seats.iter().cloned());
        }
    }
    let unique: HashSet<&String> = sold.iter().collect();
    assert_eq!(unique.len(), sold.len(), "a seat was given twice");
    assert!(outcomes.iter().any(|o| matches!(o, SeatOutcome::Taken(_))));
    let bits = taken_bits(&seat_map(&app, "arena").await);
    let won_bits: HashSet<u32> = sold.iter().map(|s| plan.bit_of(s).unwrap()).collect();
    assert_eq!(bits, won_bits, "the map is exactly the seats won");
    assert_eq!(app.probe.stock("arena").await, Some(48 - sold.len() as i64));
    // The writer records every winner with its seats; the ledger equals the map.
    let db = app.db.clone();
    let n = sold.len() as i64;
    wait_for(std::time::Duration::from_secs(30), || {
        let db = db.clone();
        async move {
            let c: i64 =
                sqlx::query_scalar("SELECT count(*) FROM issuance_seats WHERE sku = 'arena'")
                    .fetch_one(&db)
                    .await
                    .unwrap();
            c == n
        }
    })
    .await;
    let ledger: Vec<String> = sqlx::query_scalar(
        "SELECT unnest(seats) FROM issuances WHERE sku = 'arena' AND status = 'issued'",
    )
    .fetch_all(&app.db)
    .await
    .unwrap();
    let ledger: HashSet<u32> = ledger.iter().map(|s| plan.bit_of(s).unwrap()).collect();
    assert_eq!(ledger, bits);
}

/// PostgreSQL's second line: a second live claim of a seat is refused by the unique index
/// over live claims' seats, and a seat is free again once its claim stops being live.
#[tokio::test]
async fn postgres_refuses_a_seat_held_by_two_live_claims() {
    let app = spawn_app().await;
    assert_eq!(app.declare("x", 10, 1).await.status(), 201);
    let insert = |seat: &'static str| {
        let db = app.db.clone();
        async move {
            sqlx::query(
                "INSERT INTO issuances (claim_id, sku, user_id, quantity, status, seats, created_at)
                 VALUES ($1, 'x', 'u', 1, 'issued', ARRAY[$2], now())",
            )
            .bind(uuid::Uuid::now_v7())
            .bind(seat)
            .execute(&db)
            .await
        }
    };
    insert("A-1-1").await.unwrap();
    let twice = insert("A-1-1").await.unwrap_err();
    assert!(twice.to_string().contains("issuance_seats"), "{twice}");
    sqlx::query("UPDATE issuances SET status = 'cancelled' WHERE sku = 'x'")
        .execute(&app.db)
        .await
        .unwrap();
    insert("A-1-1").await.unwrap();
}

/// Until the claim route serves seats (docs/seats.md, "Not built yet"), a count claim or a
/// restock on a seated SKU is refused and moves nothing: a unit sold without a seat would
/// leave the seat map and the stock telling two stories.
#[tokio::test]
async fn a_count_claim_or_a_restock_on_a_seated_sku_is_refused_and_moves_nothing() {
    let app = spawn_app().await;
    let plan = json!({"sections": [{"name": "A", "rows": 2, "count": 5}]});
    assert_eq!(declare_seated(&app, "guarded", plan).await.status(), 201);
    let r = app.claim("guarded", "u1", 1, None).await;
    assert_eq!(r.status(), 400);
    assert_eq!(code(&r.json().await.unwrap()), "bad_request");
    let r = app.restock("guarded", 3).await;
    assert_eq!(r.status(), 400);
    assert_eq!(app.probe.stock("guarded").await, Some(10));
    assert_eq!(seat_map(&app, "guarded").await, vec![0u8; 2]);
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM issuances WHERE sku = 'guarded'")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(rows, 0);
    let total: i64 = sqlx::query_scalar("SELECT total FROM skus WHERE sku = 'guarded'")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(total, 10);
}
