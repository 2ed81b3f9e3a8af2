//! The SKU view is one consistent reading (API.md, issue 19.6 and 19.9): restocks running
//! while it is read never show balanced books as `consistent: false`, neither does a journal
//! entry whose rows PostgreSQL already holds (a writer stopped, or killed, between its write
//! and its acknowledgement), and `unwritten_entries` tells whether the ledger has caught up
//! where `in_flight` nets wins against give-backs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dropgate::ids::{claim_in, mint_call};
use dropgate::scripts::{self, ClaimInput, Decision};
use dropgate::store::Store;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::helpers::*;
use crate::lifecycle::{claim_id, claim_one, declare_with, post_as};
use crate::services::GatewayProcess;

/// Views read while two operators restock `sku` by +3 and -3 in a loop; no buyer at all.
async fn views_during_restocks(api: &Api, sku: &str, views: usize) -> Vec<Value> {
    let stop = Arc::new(AtomicBool::new(false));
    let mut restockers = Vec::new();
    for first in [3, -3] {
        let (api, sku, stop) = (api.clone(), sku.to_string(), stop.clone());
        restockers.push(tokio::spawn(async move {
            let mut applied = 0;
            while !stop.load(Ordering::Relaxed) {
                for delta in [first, -first] {
                    let r = api.restock(&sku, delta).await;
                    assert_eq!(
                        r.status(),
                        200,
                        "restock {delta}: {}",
                        r.text().await.unwrap()
                    );
                    applied += 1;
                }
            }
            applied
        }));
    }
    const READERS: usize = 4;
    let seen = all_at_once(READERS, |_| {
        let (api, sku) = (api.clone(), sku.to_string());
        async move {
            let mut out = Vec::with_capacity(views / READERS);
            for _ in 0..views / READERS {
                out.push(api.view(&sku).await);
            }
            out
        }
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    let mut restocks = 0;
    for r in restockers {
        restocks += r.await.unwrap();
    }
    assert!(
        restocks >= 20,
        "only {restocks} restocks ran beside the views"
    );
    seen.into_iter().flatten().collect()
}

/// Every view balanced with nothing sold: `total` is what Redis holds (with units in transit
/// between shards), nothing in flight, nothing unwritten.
fn assert_balanced(views: &[Value]) {
    // The false alarm first, on its own: what monitoring pages on.
    let alarms: Vec<&Value> = views.iter().filter(|v| v["consistent"] != true).collect();
    assert!(
        alarms.is_empty(),
        "{} of {} views said consistent: false, first: {}",
        alarms.len(),
        views.len(),
        alarms[0]
    );
    let wrong: Vec<&Value> = views
        .iter()
        .filter(|v| {
            let held =
                v["remaining"].as_i64().unwrap_or(-1) + v["in_transit"].as_i64().unwrap_or(0);
            v["consistent"] != true
                || v["total"].as_i64() != Some(held)
                || v["in_flight"] != 0
                || v["unwritten_entries"] != 0
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "{} of {} views wrong, first: {}",
        wrong.len(),
        views.len(),
        wrong[0]
    );
}

/// The total PostgreSQL holds and the stock every shard of `sku` holds in Redis.
async fn books(probe: &Probe, sku: &str, names: &[String]) -> (i64, i64) {
    let total: i64 = sqlx::query_scalar("SELECT total FROM skus WHERE sku = $1")
        .bind(sku)
        .fetch_one(&probe.db)
        .await
        .unwrap();
    let mut stock = 0;
    for name in names {
        stock += probe.stock(name).await.expect("the shard's stock");
        let pool: Option<i64> = redis::cmd("HGET")
            .arg(format!("{}:{{{name}}}:state", probe.prefix))
            .arg("wl_pool")
            .query_async(&mut probe.redis.clone())
            .await
            .unwrap();
        stock += pool.unwrap_or(0);
    }
    (total, stock)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_restocks_with_no_buyer_never_show_a_view_out_of_balance_on_one_shard() {
    let app = spawn_app().await;
    assert_eq!(app.declare("swing", 1000, 1).await.status(), 201);
    let views = views_during_restocks(&app.api, "swing", 2000).await;
    assert_balanced(&views);
    assert_eq!(
        books(&app.probe, "swing", &["swing".into()]).await,
        (1000, 1000)
    );
    assert_balanced(&[app.view("swing").await]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_restocks_with_no_buyer_never_show_a_view_out_of_balance_on_four_shards() {
    let app = spawn_app().await;
    let r = declare_with(&app.api, "swing4", json!({"total": 1000, "shards": 4})).await;
    assert_eq!(r.status(), 201);
    let views = views_during_restocks(&app.api, "swing4", 2000).await;
    assert_balanced(&views);
    let last = app.view("swing4").await;
    assert_balanced(std::slice::from_ref(&last));
    let names: Vec<String> = last["shards"]
        .as_array()
        .expect("a sharded SKU's view lists its shards")
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names.len(), 4);
    wait_for(Duration::from_secs(20), || async {
        app.view("swing4").await["in_transit"] == 0
    })
    .await;
    assert_eq!(books(&app.probe, "swing4", &names).await, (1000, 1000));
}

/// Journal entries delivered to a writer and not yet acknowledged.
pub(crate) async fn unacknowledged(probe: &Probe, sku: &str) -> i64 {
    let reply: Vec<redis::Value> = redis::cmd("XPENDING")
        .arg(format!("{}:{{{sku}}}:journal", probe.prefix))
        .arg("writers")
        .query_async(&mut probe.redis.clone())
        .await
        .unwrap();
    redis::from_redis_value_ref(&reply[0]).unwrap()
}

/// Decides one call of 128 buyers (one unit each) on `sku`, as a gateway's lane would: one
/// journal entry, so a writer holds all of them in one batch.
pub(crate) async fn one_call(probe: &Probe, sku: &str) -> Vec<Uuid> {
    let store = Store::connect(REDIS_URL, &probe.prefix, Duration::from_secs(2))
        .await
        .unwrap();
    let tag: i32 = sqlx::query_scalar("SELECT tag FROM skus WHERE sku = $1")
        .bind(sku)
        .fetch_one(&probe.db)
        .await
        .unwrap();
    let call = mint_call(tag);
    let claims: Vec<ClaimInput> = users("t", 128)
        .into_iter()
        .map(|user| ClaimInput {
            user,
            quantity: 1,
            idempotency_key: None,
        })
        .collect();
    let mut con = store.hot();
    let keys = store.keys(sku);
    let now = dropgate::clock::now_ms();
    let sent = scripts::claim(&mut con, &keys, &call, &claims, now, 0);
    // With the SKU's activity mark, as a lane sends it: that is how a writer finds the SKU.
    let d = dropgate::activity::with_mark(&store, sku, sent)
        .await
        .unwrap();
    assert!(d.iter().all(|d| matches!(d, Decision::Won { .. })));
    let mut ids: Vec<Uuid> = (0..128).map(|i| claim_in(&call, i)).collect();
    ids.sort();
    ids
}

/// The view counts a winner once whatever its entry's state: here its rows are committed and
/// its entry is not acknowledged, first because the writer is stopped right between the two,
/// then because that writer was SIGKILLed there and nobody has taken its entries over yet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_killed_between_its_postgres_write_and_its_redis_ack_never_shows_the_books_out_of_balance(
) {
    let iso = Isolation::new();
    let mut gw = GatewayProcess::start(&iso, REDIS_URL, &[]).await;
    let api = Api::new(gw.base.clone());
    assert_eq!(api.declare("twice", 500, 1).await.status(), 201);
    let probe = Probe::new(&iso.database_url, REDIS_URL, &iso.prefix).await;
    // The writer commits its rows, then raises the SKU's mark in `skus` before it
    // acknowledges: holding the SKU's row stops it right between the two.
    let mut hold = probe.db.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM skus WHERE sku = 'twice' FOR NO KEY UPDATE")
        .execute(&mut *hold)
        .await
        .unwrap();
    let won = one_call(&probe, "twice").await;
    wait_for(Duration::from_secs(30), || async {
        probe.issued_ids("twice").await.len() == 128
    })
    .await;
    assert_eq!(unacknowledged(&probe, "twice").await, 1);
    let stopped: Vec<Value> = all_at_once(4, |_| {
        let api = api.clone();
        async move {
            let mut out = Vec::new();
            for _ in 0..25 {
                out.push(api.view("twice").await);
            }
            out
        }
    })
    .await
    .into_iter()
    .flatten()
    .collect();
    for v in &stopped {
        assert_eq!(v["consistent"], true, "writer stopped before its ack: {v}");
        assert_eq!(
            (v["recorded"].as_i64(), v["in_flight"].as_i64()),
            (Some(128), Some(0)),
            "{v}"
        );
        assert_eq!(v["unwritten_entries"], 0, "{v}");
    }

    gw.sigkill().await;
    hold.rollback().await.unwrap();
    assert!(unacknowledged(&probe, "twice").await > 0);
    let gw2 = GatewayProcess::start(&iso, REDIS_URL, &[]).await;
    let api2 = Api::new(gw2.base.clone());
    // Read until the new gateway has taken the dead one's entries over and acknowledged them.
    let (mut during, mut views) = (0, Vec::new());
    loop {
        let pending = unacknowledged(&probe, "twice").await;
        views.push(api2.view("twice").await);
        if pending == 0 {
            break;
        }
        during += 1;
        assert!(views.len() < 5000, "the entries were never taken over");
    }
    assert!(
        during > 0,
        "no view was read while the entries were unacknowledged"
    );
    for v in &views {
        assert_eq!(v["consistent"], true, "after the kill: {v}");
        assert_eq!(v["recorded"], 128, "{v}");
    }
    assert_eq!(probe.issued_ids("twice").await, won);
    assert_eq!(probe.stock("twice").await, Some(372));
    let v = api2.view("twice").await;
    assert_eq!(
        (v["in_flight"].as_i64(), v["unwritten_entries"].as_i64()),
        (Some(0), Some(0))
    );
}

/// `in_flight` nets an unwritten win against an unwritten give-back: 0 while the ledger lacks
/// both. `unwritten_entries` counts them, and is 0 exactly when the ledger has caught up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unwritten_entries_show_a_ledger_behind_while_in_flight_nets_to_zero() {
    let app = spawn_app_with(|raw| raw.sku_gauges_interval_ms = "100".into()).await;
    let r = declare_with(
        &app.api,
        "behind",
        json!({"total": 10, "per_user_limit": 1, "hold_seconds": 600}),
    )
    .await;
    assert_eq!(r.status(), 201);
    let (status, first) = claim_one(&app.api, "behind", "b-1").await;
    assert_eq!(status, 201, "{first}");
    let first = claim_id(&first);
    wait_for(Duration::from_secs(20), || async {
        app.view("behind").await["recorded"] == 1
    })
    .await;

    // PostgreSQL takes no write to `issuances` (reads go on): a win and a cancel wait.
    let mut lock = app.db.begin().await.unwrap();
    sqlx::query("LOCK TABLE issuances IN EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();
    let (status, second) = claim_one(&app.api, "behind", "b-2").await;
    assert_eq!(status, 201, "{second}");
    let second = claim_id(&second);
    let (status, body) = post_as(
        &app.api,
        &format!("/v1/claims/{first}/cancel"),
        &token("b-1"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let v = app.view("behind").await;
    assert_eq!(v["consistent"], true, "{v}");
    assert_eq!(v["in_flight"], 0, "a win and a give-back net out: {v}");
    assert_eq!(v["unwritten_entries"], 2, "the ledger lacks both: {v}");
    assert_eq!(
        (v["recorded"].as_i64(), v["remaining"].as_i64()),
        (Some(1), Some(9)),
        "{v}"
    );
    // The same on the SKU's gauge, which the observer publishes from the view.
    let series = "dropgate_sku_unwritten_entries{sku=\"behind\"} 2";
    wait_for(Duration::from_secs(20), || async {
        let m = app.get("/metrics").await.text().await.unwrap();
        m.contains("# HELP dropgate_sku_unwritten_entries ") && m.lines().any(|l| l == series)
    })
    .await;

    lock.rollback().await.unwrap();
    wait_for(Duration::from_secs(30), || async {
        app.view("behind").await["unwritten_entries"] == 0
    })
    .await;
    let series = "dropgate_sku_unwritten_entries{sku=\"behind\"} 0";
    wait_for(Duration::from_secs(20), || async {
        let m = app.get("/metrics").await.text().await.unwrap();
        m.lines().any(|l| l == series)
    })
    .await;
    let statuses = crate::lifecycle::ledger_statuses(&app.probe, "behind").await;
    assert_eq!(statuses[&first.parse().unwrap()], "cancelled");
    assert_eq!(statuses[&second.parse().unwrap()], "held");
    let v = app.view("behind").await;
    assert_eq!(v["consistent"], true, "{v}");
    assert_eq!(
        (v["in_flight"].as_i64(), v["recorded"].as_i64()),
        (Some(0), Some(1)),
        "{v}"
    );
}

/// Refuses to record a parked claim's compensation (its row going to `compensated`) while
/// `test_comp_fault.refuse` is true: the reprocessor has given the units back in Redis and
/// cannot say so in PostgreSQL.
const REFUSE_COMPENSATION_RECORD: &str = r#"
CREATE TABLE test_comp_fault (refuse boolean NOT NULL);
INSERT INTO test_comp_fault VALUES (true);
CREATE FUNCTION test_refuse_comp() RETURNS trigger AS $$
BEGIN
  IF NEW.status = 'compensated' AND OLD.status <> 'compensated'
     AND (SELECT refuse FROM test_comp_fault LIMIT 1) THEN
    RAISE EXCEPTION 'test trigger refuses the compensation''s record';
  END IF;
  RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER test_refuse_comp BEFORE UPDATE ON persistence_pending
  FOR EACH ROW EXECUTE FUNCTION test_refuse_comp();
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compensation_given_back_in_redis_and_not_yet_recorded_never_shows_the_books_out_of_balance(
) {
    let app = spawn_app_with(|c| c.reprocess_max_attempts = "1".into()).await;
    crate::durability::install_trigger(&app.db).await;
    sqlx::raw_sql(REFUSE_COMPENSATION_RECORD)
        .execute(&app.db)
        .await
        .unwrap();
    app.declare("cv", 5, 1).await;
    let (s, body) = claim_one(&app, "cv", "bad-a").await;
    assert_eq!(s, 201, "{body}");
    let claim: Uuid = claim_id(&body).parse().unwrap();
    // The reprocessor gives the unit back in Redis; its row stays `reprocessing`.
    crate::parked_holds::wait_marker(&app.probe, "cv", claim, "compensated").await;
    let status: String =
        sqlx::query_scalar("SELECT status FROM persistence_pending WHERE claim_id = $1")
            .bind(claim)
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(status, "reprocessing");
    assert_eq!(app.stock("cv").await, Some(5));
    for _ in 0..20 {
        let v = app.view("cv").await;
        assert_eq!(
            v["consistent"], true,
            "the unit counts once, in the stock: {v}"
        );
        assert_eq!(v["pending"], 0, "{v}");
    }
    // Recorded at last (by the next reprocessor once the 30 s lease ran out): still one
    // reading that balances.
    sqlx::query("UPDATE test_comp_fault SET refuse = false")
        .execute(&app.db)
        .await
        .unwrap();
    wait_for(Duration::from_secs(60), || async {
        app.view("cv").await["compensated"] == 1
    })
    .await;
    let v = app.view("cv").await;
    assert_eq!(
        (v["consistent"].clone(), v["pending"].clone()),
        (json!(true), json!(0)),
        "{v}"
    );
}

/// Readings of the books (their first query: the total with the restocks not finished)
/// queued behind a lock, in this database.
async fn lock_waiters(probe: &Probe) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
          WHERE NOT l.granted AND a.datname = current_database()
            AND a.query LIKE '%array_agg(r.op_id%'",
    )
    .fetch_one(&probe.db)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_view_says_in_its_header_whether_redis_stood_still_while_postgres_was_read() {
    // The gauges read the same books: only the view under test may queue behind the lock.
    let app = spawn_app_with(|raw| raw.sku_gauges_interval_ms = "3600000".into()).await;
    assert_eq!(app.declare("still", 10, 1).await.status(), 201);
    assert_eq!(claim_one(&app.api, "still", "u-1").await.0, 201);
    app.drained("still").await;
    let header = |r: &reqwest::Response| {
        r.headers()
            .get("dropgate-reading")
            .map(|h| h.to_str().unwrap().to_string())
    };
    let get = || {
        app.api
            .http
            .get(format!("{}/admin/skus/still", app.api.base))
            .bearer_auth(ADMIN)
            .send()
    };
    // Quiet: the first reading is one instant's.
    let quiet = get().await.unwrap();
    assert_eq!(header(&quiet).as_deref(), Some("fenced; attempts=1"));

    // The view's snapshot waits behind a lock (restock_ops: read by the reading, not by the
    // catalog look-up before it) while a buyer moves Redis.
    let mut lock = app.probe.db.begin().await.unwrap();
    sqlx::query("LOCK TABLE restock_ops IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();
    let view = tokio::spawn(get());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while lock_waiters(&app.probe).await == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the view never read the ledger"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(claim_one(&app.api, "still", "u-2").await.0, 201);
    lock.rollback().await.unwrap();
    let moved = view.await.unwrap().unwrap();
    assert_eq!(moved.status(), 200);
    // A claim moves Redis alone, so the locked reading is still exact (fenced by the
    // acknowledgements, src/books.rs) unless the writer acknowledged the new claim during it;
    // then a later reading is fenced.
    let h = header(&moved).expect("the header");
    let attempts: u32 = h
        .strip_prefix("fenced; attempts=")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("a fenced reading: {h}"));
    assert!((1..=10).contains(&attempts), "{h}");
    let v: Value = moved.json().await.unwrap();
    assert_eq!(v["consistent"], true, "{v}");
}
