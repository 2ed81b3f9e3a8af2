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
    // Far more buyers than seats: some are refused, by a seat taken or by none left (which of
    // the two depends on the order the 200 calls reach Redis in).
    assert!(outcomes
        .iter()
        .any(|o| matches!(o, SeatOutcome::Taken(_) | SeatOutcome::SoldOut { .. })));
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

/// A restock of a seated SKU is refused (409 `seated_sku`) and moves nothing: a unit sold
/// without a seat would leave the seat map and the stock telling two stories. A claim with a
/// bare quantity is best available: it takes seats, never a count.
#[tokio::test]
async fn a_restock_of_a_seated_sku_is_refused_and_a_bare_quantity_claim_takes_seats() {
    let app = spawn_app().await;
    let plan = json!({"sections": [{"name": "A", "rows": 2, "count": 5}]});
    assert_eq!(declare_seated(&app, "guarded", plan).await.status(), 201);
    let r = app.restock("guarded", 3).await;
    assert_eq!(r.status(), 409);
    assert_eq!(code(&r.json().await.unwrap()), "seated_sku");
    assert_eq!(app.probe.stock("guarded").await, Some(10));
    assert_eq!(seat_map(&app, "guarded").await, vec![0u8; 2]);
    let total: i64 = sqlx::query_scalar("SELECT total FROM skus WHERE sku = 'guarded'")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(total, 10);
    let r = app.claim("guarded", "u1", 1, None).await;
    assert_eq!(r.status(), 201);
    let body: Value = r.json().await.unwrap();
    // Row 1's middle seat: the best single seat.
    assert_eq!(body["seats"], json!(["A-1-3"]), "{body}");
    assert_eq!(app.probe.stock("guarded").await, Some(9));
    assert_eq!(
        taken_bits(&seat_map(&app, "guarded").await),
        HashSet::from([2])
    );
}

/// POST a seated claim body as `user`; (status, body, replayed header).
async fn claim_body(
    app: &TestApp,
    user: &str,
    body: Value,
    key: Option<&str>,
) -> (u16, Value, bool) {
    let mut req = app
        .http
        .post(format!("{}/v1/skus/hall/claims", app.base))
        .bearer_auth(crate::helpers::token(user))
        .json(&body);
    if let Some(k) = key {
        req = req.header("Idempotency-Key", k);
    }
    let r = req.send().await.unwrap();
    let replayed = r.headers().get("idempotency-replayed").is_some();
    (
        r.status().as_u16(),
        r.json().await.unwrap_or(Value::Null),
        replayed,
    )
}

/// The claim route on a seated SKU: exact seats all or none (409 `seats_taken` naming them),
/// best available in one row nearest the middle, 409 `no_adjacent_seats` with the largest
/// block, seats apart on request, a replay with the same seats, and bad bodies refused with
/// nothing moved; the seats answered are the map's and the ledger's.
#[tokio::test]
async fn seat_claims_over_http_take_exact_or_best_seats_and_refuse_with_their_codes() {
    let app = spawn_app().await;
    let plan = json!({"sections": [{"name": "A", "rows": 2, "count": 6}]});
    assert_eq!(
        declare_seated(&app, "hall", plan.clone()).await.status(),
        201
    );
    let plan = SeatPlan::parse(&plan).unwrap();
    let (s, b, _) = claim_body(&app, "u1", json!({"seats": ["A-1-3", "A-1-4"]}), Some("k1")).await;
    assert_eq!((s, &b["seats"]), (201, &json!(["A-1-3", "A-1-4"])), "{b}");
    assert_eq!(b["remaining"], 10);
    let first = b["claim_id"].clone();
    let (s, b, replayed) =
        claim_body(&app, "u1", json!({"seats": ["A-1-3", "A-1-4"]}), Some("k1")).await;
    assert_eq!((s, replayed, &b["claim_id"]), (201, true, &first), "{b}");
    assert_eq!(b["seats"], json!(["A-1-3", "A-1-4"]));
    let (s, b, _) = claim_body(&app, "u2", json!({"seats": ["A-1-4", "A-1-5"]}), None).await;
    assert_eq!((s, code(&b)), (409, "seats_taken"), "{b}");
    assert_eq!(b["taken"], json!(["A-1-4"]), "{b}");
    // Row 1 has runs of 2 only: four adjacent come from row 2. Its middle run (2-5) would
    // strand seats 1 and 6; of the two that strand none, equally near the middle, the lower.
    let (s, b, _) = claim_body(&app, "u3", json!({"quantity": 4, "section": "A"}), None).await;
    assert_eq!(
        (s, &b["seats"]),
        (201, &json!(["A-2-1", "A-2-2", "A-2-3", "A-2-4"])),
        "{b}"
    );
    let (s, b, _) = claim_body(&app, "u4", json!({"quantity": 3}), None).await;
    assert_eq!((s, code(&b)), (409, "no_adjacent_seats"), "{b}");
    assert_eq!(b["largest_block"], 2, "{b}");
    let (s, b, _) = claim_body(&app, "u4", json!({"quantity": 3, "adjacent": false}), None).await;
    assert_eq!(s, 201, "{b}");
    assert_eq!(b["seats"].as_array().unwrap().len(), 3);
    // Refused, nothing moved: unknown seat, a seat twice, past the limit, seats with a
    // section, an unknown section, quantity 0.
    let stock = app.probe.stock("hall").await;
    let map = seat_map(&app, "hall").await;
    for bad in [
        json!({"seats": ["A-9-1"]}),
        json!({"seats": ["A-1-1", "A-1-1"]}),
        json!({"seats": ["A-1-1", "A-1-2", "A-2-1", "A-2-6", "A-1-6", "B-1-1", "A-2-9"]}),
        json!({"seats": ["A-1-1"], "section": "A"}),
        json!({"quantity": 1, "section": "Z"}),
        json!({"quantity": 0}),
        json!({"seats": "A-1-1"}),
    ] {
        let (s, b, _) = claim_body(&app, "u5", bad.clone(), None).await;
        assert_eq!((s, code(&b)), (400, "bad_request"), "{bad}: {b}");
    }
    assert_eq!(app.probe.stock("hall").await, stock);
    assert_eq!(seat_map(&app, "hall").await, map);
    // Every seat answered is the map's and, once written, the ledger's.
    let sold = taken_bits(&seat_map(&app, "hall").await);
    assert_eq!(sold.len(), 9);
    assert_eq!(app.probe.stock("hall").await, Some(12 - 9));
    let db = app.db.clone();
    wait_for(std::time::Duration::from_secs(30), || {
        let db = db.clone();
        async move {
            let c: i64 =
                sqlx::query_scalar("SELECT count(*) FROM issuance_seats WHERE sku = 'hall'")
                    .fetch_one(&db)
                    .await
                    .unwrap();
            c == 9
        }
    })
    .await;
    let ledger: Vec<String> =
        sqlx::query_scalar("SELECT unnest(seats) FROM issuances WHERE sku = 'hall'")
            .fetch_all(&app.db)
            .await
            .unwrap();
    let ledger: HashSet<u32> = ledger.iter().map(|s| plan.bit_of(s).unwrap()).collect();
    assert_eq!(ledger, sold);
}

/// Far more buyers than seats, all at once over HTTP, best available and exact seats mixed:
/// no seat in two 201 answers, the map holds exactly the seats answered, the stock is the
/// free seats, and the view balances once written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_seat_claims_over_http_never_answer_a_seat_twice() {
    let app = spawn_app().await;
    let plan = json!({"sections": [{"name": "A", "rows": 3, "count": 8}]});
    assert_eq!(declare_seated(&app, "hall", plan).await.status(), 201);
    let answers = all_at_once(120, |i| {
        let app_base = app.base.clone();
        let http = app.http.clone();
        async move {
            let body = if i % 4 == 0 {
                json!({"seats": [format!("A-{}-4", 1 + i % 3), format!("A-{}-5", 1 + i % 3)]})
            } else {
                json!({"quantity": 1 + i % 3})
            };
            let r = http
                .post(format!("{app_base}/v1/skus/hall/claims"))
                .bearer_auth(crate::helpers::token(&format!("c{i}")))
                .json(&body)
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    })
    .await;
    let mut sold = Vec::new();
    for (s, b) in &answers {
        match s {
            201 => sold.extend(
                b["seats"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_str().unwrap().to_string()),
            ),
            409 => assert!(
                ["seats_taken", "no_adjacent_seats", "sold_out"].contains(&code(b)),
                "{b}"
            ),
            _ => panic!("{s} {b}"),
        }
    }
    let unique: HashSet<&String> = sold.iter().collect();
    assert_eq!(unique.len(), sold.len(), "a seat was answered twice");
    assert_eq!(taken_bits(&seat_map(&app, "hall").await).len(), sold.len());
    assert_eq!(app.probe.stock("hall").await, Some(24 - sold.len() as i64));
    let v = app.drained("hall").await;
    assert_eq!(v["consistent"], true, "{v}");
    assert_eq!(v["recorded"].as_i64().unwrap(), sold.len() as i64, "{v}");
}

/// Redis loses a seated SKU (its state and its map): the restore rebuilds the map from the
/// ledger, so every seat sold before is still taken (a claim of it is 409 `seats_taken`) and
/// the stock is the map's free seats.
#[tokio::test]
async fn a_restore_rebuilds_the_seat_map_from_the_ledger() {
    let app = spawn_app().await;
    let plan = json!({"sections": [{"name": "A", "rows": 2, "count": 6}]});
    assert_eq!(declare_seated(&app, "hall", plan).await.status(), 201);
    let (s, b, _) = claim_body(&app, "u1", json!({"seats": ["A-1-3", "A-1-4"]}), None).await;
    assert_eq!(s, 201, "{b}");
    let (s, b, _) = claim_body(&app, "u2", json!({"quantity": 3, "section": "A"}), None).await;
    assert_eq!(s, 201, "{b}");
    let before = seat_map(&app, "hall").await;
    let v = app.drained("hall").await;
    assert_eq!(v["recorded"], 5, "{v}");
    let mut con = app.probe.redis.clone();
    let _: () = redis::cmd("DEL")
        .arg(format!("{}:{{hall}}:state", app.probe.prefix))
        .arg(format!("{}:{{hall}}:seats", app.probe.prefix))
        .query_async(&mut con)
        .await
        .unwrap();
    let (s, b, _) = claim_body(&app, "u3", json!({"seats": ["A-1-3"]}), None).await;
    assert_eq!((s, code(&b)), (503, "unavailable"), "{b}");
    let r = app.restore("hall", false).await;
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    assert_eq!(seat_map(&app, "hall").await, before);
    assert_eq!(app.probe.stock("hall").await, Some(7));
    let (s, b, _) = claim_body(&app, "u3", json!({"seats": ["A-1-3"]}), None).await;
    assert_eq!((s, code(&b)), (409, "seats_taken"), "{b}");
    let (s, b, _) = claim_body(&app, "u3", json!({"seats": ["A-1-1"]}), None).await;
    assert_eq!(s, 201, "{b}");
}
