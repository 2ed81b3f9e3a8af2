//! The writer and the reprocessor under faults that are about one row or one moment: a row
//! no table takes, a table an operator locks, a writer that wakes up late, PostgreSQL gone
//! mid-batch, and gateways that went away for good.

use std::time::Duration;

use redis::Value as RedisValue;
use serde_json::Value;
use uuid::Uuid;

use crate::helpers::*;
use crate::services::PrivatePostgres;

fn journal_key(probe: &Probe, sku: &str) -> String {
    format!("{}:{{{sku}}}:journal", probe.prefix)
}

/// `(name, pending, idle ms)` of every consumer of the SKU's writer group.
async fn consumers(probe: &Probe, sku: &str) -> Vec<(String, i64, i64)> {
    let mut con = probe.redis.clone();
    let reply: Vec<Vec<RedisValue>> = redis::cmd("XINFO")
        .arg("CONSUMERS")
        .arg(journal_key(probe, sku))
        .arg("writers")
        .query_async(&mut con)
        .await
        .unwrap();
    reply
        .into_iter()
        .map(|fields| {
            let (mut name, mut pending, mut idle) = (String::new(), 0, 0);
            for pair in fields.chunks(2) {
                let key: String = redis::from_redis_value_ref(&pair[0]).unwrap();
                match key.as_str() {
                    "name" => name = redis::from_redis_value_ref(&pair[1]).unwrap(),
                    "pending" => pending = redis::from_redis_value_ref(&pair[1]).unwrap(),
                    "idle" => idle = redis::from_redis_value_ref(&pair[1]).unwrap(),
                    _ => {}
                }
            }
            (name, pending, idle)
        })
        .collect()
}

/// Journal entries delivered to a writer and not yet acknowledged.
async fn unacknowledged(probe: &Probe, sku: &str) -> i64 {
    let mut con = probe.redis.clone();
    let reply: Vec<RedisValue> = redis::cmd("XPENDING")
        .arg(journal_key(probe, sku))
        .arg("writers")
        .query_async(&mut con)
        .await
        .unwrap();
    redis::from_redis_value_ref(&reply[0]).unwrap()
}

async fn parked_statuses(probe: &Probe) -> Vec<String> {
    sqlx::query_scalar("SELECT status FROM persistence_pending ORDER BY claim_id")
        .fetch_all(&probe.db)
        .await
        .unwrap()
}

fn claim_id(body: &Value) -> Uuid {
    body["claim_id"].as_str().unwrap().parse().unwrap()
}

// === a poison row ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_winner_no_table_accepts_is_quarantined_and_the_writer_keeps_going() {
    let app = spawn_app().await;
    app.declare("poison", 50, 1).await;
    // PostgreSQL text refuses a NUL byte, in issuances and persistence_pending alike. The edge
    // now refuses such a user id (401), so the winner is decided by the script directly, as a
    // gateway of an older version (or any other bad row) would have put it in the journal.
    let store =
        dropgate::store::Store::connect(REDIS_URL, &app.probe.prefix, Duration::from_secs(2))
            .await
            .unwrap();
    let input = dropgate::scripts::ClaimInput {
        user: "bad\0user".into(),
        quantity: 1,
        idempotency_key: Some("k-1".into()),
    };
    let keys = store.keys("poison");
    let call = dropgate::ids::mint_call(0);
    let d = dropgate::scripts::claim(
        &mut store.hot(),
        &keys,
        &call,
        std::slice::from_ref(&input),
        1,
        0,
    )
    .await
    .unwrap();
    assert!(matches!(d[0], dropgate::scripts::Decision::Won { .. }));
    let poison = dropgate::ids::claim_in(&call, 0);
    let first = release_buyers(&app.api, "poison", users("p", 20)).await;
    assert_eq!(won_ids(&first).len(), 20);

    wait_for(Duration::from_secs(15), || async {
        app.issued_ids("poison").await.len() == 20
    })
    .await;
    // The SKU's writer still reads what comes after.
    let later = release_buyers(&app.api, "poison", users("q", 5)).await;
    let mut won = won_ids(&first);
    won.extend(won_ids(&later));
    won.sort();
    let v = app.drained("poison").await;
    assert_eq!(app.issued_ids("poison").await, won);
    assert_eq!(v["in_flight"], 0);
    assert_eq!(v["recorded"], 25);
    assert_eq!(v["quarantined"], 1);
    assert_eq!(v["remaining"], 24);
    assert_eq!(v["consistent"], true, "{v}");

    let (sku, id, units, raw, error): (String, Option<Uuid>, Option<i32>, Vec<u8>, String) =
        sqlx::query_as("SELECT sku, claim_id, quantity, raw_entry, error FROM quarantine")
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!((sku.as_str(), id, units), ("poison", Some(poison), Some(1)));
    let needle = b"bad\0user";
    assert!(
        raw.windows(needle.len()).any(|w| w == needle),
        "the raw entry keeps the bytes as Redis held them: {raw:?}"
    );
    assert!(error.contains("0x00"), "{error}");
    let metrics = app.get("/metrics").await.text().await.unwrap();
    assert!(metrics.contains("dropgate_quarantined_total"), "{metrics}");
    // Nothing was parked for the reprocessor (it could not be), nothing compensated.
    assert!(parked_statuses(&app.probe).await.is_empty());
    assert_eq!(app.stock("poison").await, Some(24));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_entry_the_writer_cannot_read_is_quarantined_byte_for_byte() {
    let app = spawn_app().await;
    app.declare("garbled", 10, 1).await;
    // A winner as claim.lua records one (stock down, units in flight, an entry), but whose
    // entry is not UTF-8.
    let id = Uuid::now_v7();
    let mut packed = format!("{id}|1|{}|9|1|3|", dropgate::clock::now_ms()).into_bytes();
    packed.extend_from_slice(b"\xff\xfe\xfd");
    let mut con = app.probe.redis.clone();
    let state = format!("{}:{{garbled}}:state", app.probe.prefix);
    let _: () = redis::pipe()
        .atomic()
        .hincr(&state, "stock", -1)
        .hincr(&state, "inflight", 1)
        .cmd("XADD")
        .arg(journal_key(&app.probe, "garbled"))
        .arg("*")
        .arg("c")
        .arg(&packed)
        .query_async(&mut con)
        .await
        .unwrap();
    let after = release_buyers(&app.api, "garbled", users("g", 5)).await;

    let v = app.drained("garbled").await;
    assert_eq!(app.issued_ids("garbled").await, won_ids(&after));
    assert_eq!(v["in_flight"], 0);
    assert_eq!(v["quarantined"], 1);
    assert_eq!(v["remaining"], 4);
    assert_eq!(v["consistent"], true, "{v}");
    let (claim, raw): (Option<Uuid>, Vec<u8>) =
        sqlx::query_as("SELECT claim_id, raw_entry FROM quarantine WHERE sku = 'garbled'")
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(claim, Some(id));
    assert_eq!(raw, [b"c=".as_slice(), &packed].concat());
}

// === transient errors ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_lock_held_past_lock_timeout_delays_winners_and_compensates_none() {
    let iso = Isolation::new();
    // The operator's setting applies to sessions opened after it: set it before the gateway
    // connects.
    let db = dropgate::db::connect_and_migrate(&iso.database_url)
        .await
        .unwrap();
    let name = iso.database_url.rsplit('/').next().unwrap().to_string();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "ALTER DATABASE \"{name}\" SET lock_timeout = '200ms'"
    )))
    .execute(&db)
    .await
    .unwrap();
    let mut raw = iso.raw_config(REDIS_URL);
    raw.reprocess_max_attempts = "3".into();
    raw.reprocess_backoff_ms = "50".into();
    let app = spawn_with_config(raw).await;
    app.declare("locked", 100, 1).await;

    let mut lock = db.begin().await.unwrap();
    sqlx::query("LOCK TABLE issuances IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();
    // A claim the writer parked earlier, on its last attempt, comes due while the lock holds.
    let parked = Uuid::now_v7();
    let mut con = app.probe.redis.clone();
    let state = format!("{}:{{locked}}:state", app.probe.prefix);
    let users_key = format!("{}:{{locked}}:users", app.probe.prefix);
    let _: () = redis::pipe()
        .hincr(&state, "stock", -1)
        .hincr(&users_key, "parked-0", 1)
        .query_async(&mut con)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO persistence_pending
           (claim_id, sku, user_id, quantity, created_at, failure_reason, attempts)
         VALUES ($1, 'locked', 'parked-0', 1, now(), 'refused earlier', 2)",
    )
    .bind(parked)
    .execute(&db)
    .await
    .unwrap();
    let results = release_buyers(&app.api, "locked", users("l", 20)).await;
    let mut won = won_ids(&results);
    assert_eq!(won.len(), 20);
    // The fault: the lock is held this long, many lock timeouts and retry delays over.
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert!(
        !parked_statuses(&app.probe)
            .await
            .iter()
            .any(|s| s == "compensated"),
        "a lock timeout is no refusal of the row"
    );
    lock.rollback().await.unwrap();

    won.push(parked);
    won.sort();
    let v = app.drained("locked").await;
    assert_eq!(app.issued_ids("locked").await, won);
    let statuses: Vec<String> = sqlx::query_scalar(
        "SELECT status FROM issuances WHERE sku = 'locked' GROUP BY status ORDER BY status",
    )
    .fetch_all(&db)
    .await
    .unwrap();
    assert_eq!(statuses, vec!["issued".to_string()]);
    assert_eq!(parked_statuses(&app.probe).await, vec!["resolved"]);
    let attempts: i32 = sqlx::query_scalar("SELECT attempts FROM persistence_pending")
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!(attempts, 3, "only the successful write spent an attempt");
    assert_eq!(v["compensated"], 0);
    assert_eq!(v["remaining"], 79);
    assert_eq!(v["consistent"], true, "{v}");
    assert_eq!(app.stock("locked").await, Some(79));
}

// === a late writer ===

/// Refuses the live rows of `late-*` users; `all_statuses` refuses their compensated rows too.
async fn refuse_late_users(db: &sqlx::PgPool, all_statuses: bool) {
    let status_check = if all_statuses {
        ""
    } else {
        "AND NEW.status <> 'compensated'"
    };
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        r#"
        CREATE OR REPLACE FUNCTION test_refuse_late() RETURNS trigger AS $$
        BEGIN
          IF NEW.user_id LIKE 'late-%' {status_check} THEN
            RAISE EXCEPTION 'test trigger refuses %', NEW.user_id;
          END IF;
          RETURN NEW;
        END $$ LANGUAGE plpgsql;
        CREATE TRIGGER test_refuse_late BEFORE INSERT ON issuances
          FOR EACH ROW EXECUTE FUNCTION test_refuse_late();
        "#
    )))
    .execute(db)
    .await
    .unwrap();
}

/// Parks and compensates one claim of `late-1`, then lets a writer that read its journal
/// entry before all that write it. Returns the claim id.
async fn compensate_then_write_late(app: &TestApp, sku: &str, all_statuses: bool) -> Uuid {
    refuse_late_users(&app.db, all_statuses).await;
    app.declare(sku, 10, 1).await;
    let r = app.claim(sku, "late-1", 1, Some("late-key")).await;
    assert_eq!(r.status(), 201);
    let body: Value = r.json().await.unwrap();
    let id = claim_id(&body);
    wait_for(Duration::from_secs(15), || async {
        parked_statuses(&app.probe).await == vec!["compensated"]
    })
    .await;
    assert_eq!(app.stock(sku).await, Some(10));

    // The writer that stalled holds the entry as it read it; the fault is gone by now.
    sqlx::query("DROP TRIGGER test_refuse_late ON issuances")
        .execute(&app.db)
        .await
        .unwrap();
    let stale = dropgate::writer::Winner {
        entry_id: "1-0".into(),
        claim_id: id,
        sku: sku.into(),
        user: "late-1".into(),
        quantity: 1,
        idempotency_key: Some("late-key".into()),
        remaining_after: body["remaining"].as_i64(),
        created_ms: dropgate::clock::now_ms(),
        seq: 1,
        expires_ms: None,
        offer: false,
        seats: None,
    };
    dropgate::writer::write_batch(&app.db, &[stale], Duration::from_millis(50))
        .await
        .unwrap();
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_wakes_up_after_the_compensation_does_not_resurrect_the_claim() {
    let app = spawn_app_with(|c| c.reprocess_max_attempts = "2".into()).await;
    let id = compensate_then_write_late(&app, "late", false).await;

    let rows: Vec<(Uuid, String)> =
        sqlx::query_as("SELECT claim_id, status FROM issuances WHERE sku = 'late'")
            .fetch_all(&app.db)
            .await
            .unwrap();
    assert_eq!(rows, vec![(id, "compensated".to_string())]);
    let v = app.drained("late").await;
    assert_eq!(v["recorded"], 0);
    assert_eq!(v["compensated"], 1);
    assert_eq!(v["remaining"], 10);
    assert_eq!(v["consistent"], true, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_writer_does_not_resurrect_a_claim_whose_compensated_row_was_refused_too() {
    let app = spawn_app_with(|c| c.reprocess_max_attempts = "2".into()).await;
    compensate_then_write_late(&app, "late2", true).await;

    assert!(app.issued_ids("late2").await.is_empty());
    let v = app.drained("late2").await;
    assert_eq!(v["recorded"], 0);
    assert_eq!(v["compensated"], 1);
    assert_eq!(v["remaining"], 10);
    assert_eq!(v["consistent"], true, "{v}");
}

// === PostgreSQL gone mid-batch ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn winners_a_writer_held_when_postgres_died_are_written_as_soon_as_it_returns() {
    let pg = PrivatePostgres::start().await;
    // Taking over entries by idle time would rescue them only after a minute: far beyond
    // this test's bound, so only the writer's own retry can pass it.
    let app = spawn_app_with(|c| {
        c.database_url = pg.url("dropgate");
        c.journal_claim_idle_ms = "60000".into();
    })
    .await;
    // The writer is past its first rounds once it has written a winner of another SKU.
    app.declare("warm", 1, 1).await;
    assert_eq!(app.claim("warm", "w", 1, None).await.status(), 201);
    app.drained("warm").await;
    app.declare("held", 100, 1).await;
    // Keep the writer's catalog read from seeing the new SKU before PostgreSQL goes: the
    // writer then knows it only from the claim path's signal.
    let mut lock = app.db.begin().await.unwrap();
    sqlx::query("LOCK TABLE skus IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();
    pg.down();
    drop(lock);
    let first = app.claim("held", "first", 1, None).await;
    assert_eq!(first.status(), 201);
    let mut won = vec![claim_id(&first.json().await.unwrap())];
    // The writer took it and could not write it.
    wait_for(Duration::from_secs(15), || async {
        unacknowledged(&app.probe, "held").await == 1
    })
    .await;
    // The fault: PostgreSQL stays down through several of the writer's rounds (each waits up
    // to the pool's 3 s acquire timeout).
    tokio::time::sleep(Duration::from_secs(8)).await;
    pg.up().await;
    let rest = release_buyers(&app.api, "held", users("h", 19)).await;
    won.extend(won_ids(&rest));
    won.sort();
    assert_eq!(won.len(), 20);

    wait_for(Duration::from_secs(20), || async {
        app.issued_ids("held").await.len() == 20
    })
    .await;
    assert_eq!(app.issued_ids("held").await, won);
    let v = app.drained("held").await;
    assert_eq!(v["consistent"], true, "{v}");
}

// === gateways that are gone ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_gateways_consumer_name_is_removed_once_idle_and_no_entry_is_lost() {
    let iso = Isolation::new();
    // A consumer holding nothing is gone after 10 claim-idle times: 5 s here, far longer than
    // the steps before the stop take, so only the stopped gateway's name can go.
    let mut raw = iso.raw_config(REDIS_URL);
    raw.journal_claim_idle_ms = "500".into();
    let app1 = spawn_with_config(raw.clone()).await;
    let app2 = spawn_with_config(raw).await;
    app1.declare("gone", 100, 1).await;
    let a = release_buyers(&app1.api, "gone", users("a", 10)).await;
    // A consumer exists once its gateway has read an entry: claim on the second gateway until
    // its writer (not the first one's sweep) has taken one.
    let mut b = Vec::new();
    for i in 0.. {
        b.extend(release_buyers(&app2.api, "gone", vec![format!("b-{i}")]).await);
        app1.drained("gone").await;
        if consumers(&app1.probe, "gone").await.len() == 2 {
            break;
        }
        assert!(i < 50, "the second gateway's writer never read the journal");
    }
    let before = consumers(&app1.probe, "gone").await;
    assert!(
        before.iter().all(|(_, pending, _)| *pending == 0),
        "{before:?}"
    );

    app2.stop().await;
    wait_for(Duration::from_secs(20), || async {
        consumers(&app1.probe, "gone").await.len() == 1
    })
    .await;
    let c = release_buyers(&app1.api, "gone", users("c", 10)).await;
    let v = app1.drained("gone").await;
    let mut won = won_ids(&a);
    won.extend(won_ids(&b));
    won.extend(won_ids(&c));
    won.sort();
    let refused: Vec<&(u16, Value)> = a.iter().chain(&c).filter(|(s, _)| *s != 201).collect();
    assert_eq!(won.len(), 20 + won_ids(&b).len(), "{refused:?}");
    assert_eq!(app1.issued_ids("gone").await, won);
    assert_eq!(v["consistent"], true, "{v}");
    // The one left is the live gateway's, and it is still reading.
    let after = consumers(&app1.probe, "gone").await;
    assert_eq!(after.len(), 1);
    assert!(before.iter().any(|(n, _, _)| *n == after[0].0));
    assert!(after[0].2 < 2000, "{after:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_holding_entries_is_never_removed_however_long_idle() {
    let prefix = format!("t{}", &Uuid::new_v4().simple().to_string()[..16]);
    let store = dropgate::store::Store::connect(REDIS_URL, &prefix, Duration::from_secs(2))
        .await
        .unwrap();
    let journal = store.keys("s").journal();
    let (mut con, _) = script_sku("s").await;
    let _: () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&journal)
        .arg("writers")
        .arg("0")
        .arg("MKSTREAM")
        .query_async(&mut con)
        .await
        .unwrap();
    let _: String = redis::cmd("XADD")
        .arg(&journal)
        .arg("*")
        .arg("c")
        .arg("x")
        .query_async(&mut con)
        .await
        .unwrap();
    // "holder" took the entry and never acknowledged it; the others hold nothing.
    let _: RedisValue = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg("writers")
        .arg("holder")
        .arg("STREAMS")
        .arg(&journal)
        .arg(">")
        .query_async(&mut con)
        .await
        .unwrap();
    for name in ["me", "empty"] {
        let _: i64 = redis::cmd("XGROUP")
            .arg("CREATECONSUMER")
            .arg(&journal)
            .arg("writers")
            .arg(name)
            .query_async(&mut con)
            .await
            .unwrap();
    }
    let names = |con: redis::aio::ConnectionManager| {
        let journal = journal.clone();
        async move {
            let mut con = con;
            let reply: Vec<Vec<RedisValue>> = redis::cmd("XINFO")
                .arg("CONSUMERS")
                .arg(&journal)
                .arg("writers")
                .query_async(&mut con)
                .await
                .unwrap();
            let mut names: Vec<String> = reply
                .iter()
                .map(|c| redis::from_redis_value_ref(&c[1]).unwrap())
                .collect();
            names.sort();
            names
        }
    };

    let hour = Duration::from_secs(3600);
    let removed = dropgate::journal::reap_idle_consumers(&store, "s", hour, "me")
        .await
        .unwrap();
    assert!(
        removed.is_empty(),
        "nobody has been idle an hour: {removed:?}"
    );
    let removed = dropgate::journal::reap_idle_consumers(&store, "s", Duration::ZERO, "me")
        .await
        .unwrap();
    assert_eq!(removed, vec!["empty".to_string()]);
    assert_eq!(names(con.clone()).await, vec!["holder", "me"]);
    // The entry is still pending under its holder, for XAUTOCLAIM to take over.
    let pending: Vec<RedisValue> = redis::cmd("XPENDING")
        .arg(&journal)
        .arg("writers")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(redis::from_redis_value_ref::<i64>(&pending[0]).unwrap(), 1);
    // A journal or group that does not exist has nobody to remove.
    let removed = dropgate::journal::reap_idle_consumers(&store, "none", Duration::ZERO, "me")
        .await
        .unwrap();
    assert!(removed.is_empty());
}
