//! Per-call bookkeeping seen from outside: a call's claims are found by id before the writer
//! has them, and a journal entry carrying a whole call's winners is written exactly once
//! through a writer killed between its insert and its acknowledgement.

use std::time::Duration;

use dropgate::ids::{claim_in, mint_call};
use dropgate::scripts::{self, ClaimInput, Decision};
use dropgate::store::Store;
use uuid::Uuid;

use crate::helpers::*;
use crate::services::GatewayProcess;

/// The catalog tag of `sku`, which claim ids carry (so GET finds the SKU from the id).
async fn tag(db: &sqlx::PgPool, sku: &str) -> i32 {
    sqlx::query_scalar("SELECT tag FROM skus WHERE sku = $1")
        .bind(sku)
        .fetch_one(db)
        .await
        .unwrap()
}

/// Decides one call of `users` (one unit each) on `sku`, as a gateway's lane would.
async fn one_call(probe: &Probe, sku: &str, users: &[String]) -> (Uuid, Vec<Decision>) {
    let store = Store::connect(REDIS_URL, &probe.prefix, Duration::from_secs(2))
        .await
        .unwrap();
    let call = mint_call(tag(&probe.db, sku).await);
    let claims: Vec<ClaimInput> = users
        .iter()
        .map(|u| ClaimInput {
            user: u.clone(),
            quantity: 1,
            idempotency_key: None,
        })
        .collect();
    let mut con = store.hot();
    let keys = store.keys(sku);
    let sent = scripts::claim(
        &mut con,
        &keys,
        &call,
        &claims,
        dropgate::clock::now_ms(),
        0,
    );
    // With the SKU's activity mark, as a lane sends it: that is how a writer finds the SKU.
    let d = dropgate::activity::with_mark(&store, sku, sent)
        .await
        .unwrap();
    (call, d)
}

async fn get_claim(api: &Api, id: &Uuid, bearer: &str) -> (u16, serde_json::Value) {
    let r = api
        .http
        .get(format!("{}/v1/claims/{id}", api.base))
        .bearer_auth(bearer)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_claim_of_a_call_is_found_by_id_before_the_writer_has_it() {
    let app = spawn_app().await;
    app.declare("ahead", 100, 1).await;
    // The writer cannot insert (reads still go through): every answer below comes from the
    // call's record in Redis.
    let mut lock = app.db.begin().await.unwrap();
    sqlx::query("LOCK TABLE issuances IN EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();
    // 40 buyers; the last one's second claim passes the limit and loses.
    let mut buyers = users("g", 40);
    buyers.push("g-39".into());
    let (call, d) = one_call(&app.probe, "ahead", &buyers).await;
    assert!(d[..40].iter().all(|d| matches!(d, Decision::Won { .. })));
    assert_eq!(d[40], Decision::LimitReached { held: 1 });

    for (i, user) in buyers.iter().enumerate().take(40) {
        let id = claim_in(&call, i);
        let (status, body) = get_claim(&app.api, &id, &token(user)).await;
        assert_eq!(status, 200, "claim {i}: {body}");
        assert_eq!(body["claim_id"], id.to_string());
        assert_eq!(body["user"], user.as_str());
        assert_eq!(body["quantity"], 1);
        assert_eq!(body["status"], "issued");
        // Someone else's claim is not found.
        let (status, _) = get_claim(&app.api, &id, &token("intruder")).await;
        assert_eq!(status, 404, "claim {i} shown to another buyer");
    }
    let (status, body) = get_claim(&app.api, &claim_in(&call, 3), ADMIN).await;
    assert_eq!((status, body["user"].as_str()), (200, Some("g-3")));
    // The claim that lost moved nothing and is no claim.
    let (status, _) = get_claim(&app.api, &claim_in(&call, 40), &token("g-39")).await;
    assert_eq!(status, 404);
    assert_eq!(app.issued_ids("ahead").await, Vec::<Uuid>::new());

    lock.rollback().await.unwrap();
    let v = app.drained("ahead").await;
    let mut want: Vec<Uuid> = (0..40).map(|i| claim_in(&call, i)).collect();
    want.sort();
    assert_eq!(app.issued_ids("ahead").await, want);
    assert_eq!(
        (v["recorded"].as_i64(), v["remaining"].as_i64()),
        (Some(40), Some(60))
    );
    assert_eq!(v["consistent"], true, "{v}");
}

/// Journal entries delivered to a writer and not yet acknowledged.
async fn unacknowledged(probe: &Probe, sku: &str) -> i64 {
    let reply: Vec<redis::Value> = redis::cmd("XPENDING")
        .arg(format!("{}:{{{sku}}}:journal", probe.prefix))
        .arg("writers")
        .query_async(&mut probe.redis.clone())
        .await
        .unwrap();
    redis::from_redis_value_ref(&reply[0]).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_entry_of_128_winners_is_written_as_128_rows_once_through_a_sigkill_between_insert_and_ack(
) {
    let iso = Isolation::new();
    let mut gw = GatewayProcess::start(&iso, REDIS_URL, &[]).await;
    let api = Api::new(gw.base.clone());
    assert_eq!(api.declare("whole", 500, 1).await.status(), 201);
    let probe = Probe::new(&iso.database_url, REDIS_URL, &iso.prefix).await;
    // The writer commits its insert, then raises the SKU's mark in `skus` before it
    // acknowledges: holding the SKU's row stops it right between the two.
    let mut hold = probe.db.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM skus WHERE sku = 'whole' FOR NO KEY UPDATE")
        .execute(&mut *hold)
        .await
        .unwrap();
    let buyers = users("w", 128);
    let (call, d) = one_call(&probe, "whole", &buyers).await;
    assert!(d.iter().all(|d| matches!(d, Decision::Won { .. })));
    wait_for(Duration::from_secs(20), || async {
        probe.issued_ids("whole").await.len() == 128
    })
    .await;
    assert_eq!(unacknowledged(&probe, "whole").await, 1);

    gw.sigkill().await;
    hold.rollback().await.unwrap();
    // Another gateway takes the dead one's entry over and writes it again: nothing doubles.
    let gw2 = GatewayProcess::start(&iso, REDIS_URL, &[]).await;
    let api2 = Api::new(gw2.base.clone());
    let v = api2.drained("whole").await;
    wait_for(Duration::from_secs(20), || async {
        unacknowledged(&probe, "whole").await == 0
    })
    .await;
    let mut want: Vec<Uuid> = (0..128).map(|i| claim_in(&call, i)).collect();
    want.sort();
    assert_eq!(probe.issued_ids("whole").await, want);
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM issuances WHERE sku = 'whole'")
        .fetch_one(&probe.db)
        .await
        .unwrap();
    let events: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM claim_events WHERE sku = 'whole' AND event = 'claim.won'",
    )
    .fetch_one(&probe.db)
    .await
    .unwrap();
    assert_eq!((rows, events), (128, 128));
    assert_eq!(v["recorded"], 128);
    assert_eq!(v["in_flight"], 0);
    assert_eq!(v["remaining"], 372);
    assert_eq!(v["consistent"], true, "{v}");
    let journal: i64 = redis::cmd("XLEN")
        .arg(format!("{}:{{whole}}:journal", probe.prefix))
        .query_async(&mut probe.redis.clone())
        .await
        .unwrap();
    assert_eq!(journal, 0, "the entry was acknowledged and trimmed");
}
