//! Background work follows the active set, not the catalog: winners of a dead gateway are found
//! through the set (or, when the set was lost, by the catalog walk), holds expire on SKUs nobody
//! claimed on for long, and a SKU leaves the set only when it is idle and has nothing left.

use std::time::Duration;

use dropgate::activity::{self, Upkeep};
use dropgate::keys::active_skus;
use dropgate::store::Store;
use serde_json::json;
use uuid::Uuid;

use crate::helpers::*;
use crate::lifecycle::{claim_id, claim_one, declare_with, ledger_statuses};
use crate::services::GatewayProcess;

/// The SKU's score in the active set (`None`: not a member).
async fn score(probe: &Probe, sku: &str) -> Option<f64> {
    let mut con = probe.redis.clone();
    redis::cmd("ZSCORE")
        .arg(active_skus(&probe.prefix))
        .arg(sku)
        .query_async(&mut con)
        .await
        .unwrap()
}

/// Winners waiting in the SKU's journal (an entry holds every winner of one claim.lua call, a
/// field `c` each).
async fn journal_winners(probe: &Probe, sku: &str) -> usize {
    let mut con = probe.redis.clone();
    let entries: Vec<(String, Vec<(String, redis::Value)>)> = redis::cmd("XRANGE")
        .arg(format!("{}:{{{sku}}}:journal", probe.prefix))
        .arg("-")
        .arg("+")
        .query_async(&mut con)
        .await
        .unwrap();
    entries
        .iter()
        .flat_map(|(_, fields)| fields.iter().filter(|(f, _)| f == "c"))
        .count()
}

async fn journal_len(probe: &Probe, sku: &str) -> i64 {
    let mut con = probe.redis.clone();
    redis::cmd("XLEN")
        .arg(format!("{}:{{{sku}}}:journal", probe.prefix))
        .query_async(&mut con)
        .await
        .unwrap()
}

/// A gateway process wins 20 claims on `sku` while `issuances` is locked, so its writer cannot
/// write them, and is SIGKILLed: the winners are left in the journal alone. Returns their ids.
async fn winners_left_by_a_sigkilled_gateway(iso: &Isolation, sku: &str) -> Vec<Uuid> {
    let db = dropgate::db::connect_and_migrate(&iso.database_url)
        .await
        .unwrap();
    // Its writer's insert gives up on the lock quickly instead of waiting behind it (a waiting
    // statement could still commit after the kill).
    let name = iso.database_url.rsplit('/').next().unwrap().to_string();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "ALTER DATABASE \"{name}\" SET lock_timeout = '200ms'"
    )))
    .execute(&db)
    .await
    .unwrap();
    let mut gw = GatewayProcess::start(iso, REDIS_URL, &[]).await;
    let api = Api::new(gw.base.clone());
    assert_eq!(api.declare(sku, 50, 1).await.status(), 201);
    let mut lock = db.begin().await.unwrap();
    sqlx::query("LOCK TABLE issuances IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();
    let won = won_ids(&release_buyers(&api, sku, users("k", 20)).await);
    assert_eq!(won.len(), 20);
    gw.sigkill().await;
    // No statement of the dead gateway may still be waiting for the lock when it is released.
    wait_for(Duration::from_secs(10), || async {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND wait_event_type = 'Lock'",
        )
        .bind(&name)
        .fetch_one(&db)
        .await
        .unwrap();
        waiting == 0
    })
    .await;
    lock.rollback().await.unwrap();
    won
}

/// A second gateway, one that never served `sku`, writes the winners `won` a SIGKILLed one
/// left behind: exactly them, the journal emptied, the ledger balanced.
async fn written_by_a_second_gateway(
    iso: &Isolation,
    probe: &Probe,
    sku: &str,
    mut won: Vec<Uuid>,
) {
    let gw2 = GatewayProcess::start(iso, REDIS_URL, &[]).await;
    let v = Api::new(gw2.base.clone()).drained(sku).await;
    won.sort();
    assert_eq!(probe.issued_ids(sku).await, won);
    // Written is not yet acknowledged: the writer trims the journal after its commit.
    wait_for(Duration::from_secs(10), || async {
        journal_len(probe, sku).await == 0
    })
    .await;
    assert_eq!(probe.stock(sku).await, Some(30));
    assert_eq!(v["consistent"], true, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn winners_of_a_sigkilled_gateway_are_written_by_one_that_never_served_the_sku() {
    let iso = Isolation::new();
    let won = winners_left_by_a_sigkilled_gateway(&iso, "dead").await;
    let probe = Probe::new(&iso.database_url, REDIS_URL, &iso.prefix).await;
    assert!(probe.issued_ids("dead").await.is_empty());
    assert_eq!(journal_winners(&probe, "dead").await, 20);
    // The claims marked the SKU active: that is how a gateway that never saw it finds it.
    assert!(score(&probe, "dead").await.is_some());

    written_by_a_second_gateway(&iso, &probe, "dead", won).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn winners_of_a_sigkilled_gateway_are_found_by_the_catalog_walk_when_the_active_set_was_lost()
{
    let iso = Isolation::new();
    let won = winners_left_by_a_sigkilled_gateway(&iso, "orphan").await;
    let probe = Probe::new(&iso.database_url, REDIS_URL, &iso.prefix).await;
    let mut con = probe.redis.clone();
    let _: () = redis::cmd("DEL")
        .arg(active_skus(&probe.prefix))
        .query_async(&mut con)
        .await
        .unwrap();

    written_by_a_second_gateway(&iso, &probe, "orphan", won).await;
    // The walk put it back (with the sentinel that tells a lost set from an empty one).
    assert!(score(&probe, "orphan").await.is_some());
    assert!(score(&probe, activity::SENTINEL).await.is_some());
}

/// Three held claims on a SKU with 1 s holds; returns their ids.
async fn three_holds(app: &TestApp, sku: &str) -> Vec<Uuid> {
    declare_with(app, sku, json!({"total": 5, "hold_seconds": 1})).await;
    let mut ids = Vec::new();
    for u in ["h1", "h2", "h3"] {
        let (s, body) = claim_one(app, sku, u).await;
        assert_eq!(s, 201, "{body}");
        assert_eq!(body["status"], "held", "{body}");
        ids.push(claim_id(&body).parse().unwrap());
    }
    ids
}

/// Waits until every one of `ids` is `expired` in the ledger and the stock is whole again.
async fn all_expired(app: &TestApp, sku: &str, ids: &[Uuid]) {
    wait_for(Duration::from_secs(20), || async {
        let statuses = ledger_statuses(&app.probe, sku).await;
        ids.iter()
            .all(|id| statuses.get(id).is_some_and(|s| s == "expired"))
    })
    .await;
    assert_eq!(app.stock(sku).await, Some(5));
    for u in ["h1", "h2", "h3"] {
        assert_eq!(app.held(sku, u).await, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_on_a_sku_nobody_marked_for_long_expire_and_then_it_leaves_the_active_set() {
    let app = spawn_app().await;
    let ids = three_holds(&app, "stale-mark").await;
    // As if the last claim had been an hour ago: past the horizon, yet holds keep it in the set.
    let mut con = app.probe.redis.clone();
    let _: () = redis::cmd("ZADD")
        .arg(active_skus(&app.probe.prefix))
        .arg(1)
        .arg("stale-mark")
        .query_async(&mut con)
        .await
        .unwrap();

    all_expired(&app, "stale-mark", &ids).await;
    // While it had holds the upkeep marked it again; unmarked for long once more, with nothing
    // left (holds ended, their changes written), it is retired.
    wait_for(Duration::from_secs(20), || async {
        journal_len(&app.probe, "stale-mark").await == 0
    })
    .await;
    let _: () = redis::cmd("ZADD")
        .arg(active_skus(&app.probe.prefix))
        .arg(1)
        .arg("stale-mark")
        .query_async(&mut con)
        .await
        .unwrap();
    wait_for(Duration::from_secs(20), || async {
        score(&app.probe, "stale-mark").await.is_none()
    })
    .await;
    assert_eq!(journal_len(&app.probe, "stale-mark").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_on_a_sku_the_active_set_lost_are_found_by_the_catalog_walk_and_expire() {
    let app = spawn_app().await;
    let ids = three_holds(&app, "lost-mark").await;
    let mut con = app.probe.redis.clone();
    let _: () = redis::cmd("ZREM")
        .arg(active_skus(&app.probe.prefix))
        .arg("lost-mark")
        .query_async(&mut con)
        .await
        .unwrap();

    all_expired(&app, "lost-mark", &ids).await;
    assert!(score(&app.probe, "lost-mark").await.is_some());
}

/// A store and an upkeep of their own (prefix and database), with a short horizon.
async fn own_upkeep(horizon: Duration) -> (Store, Upkeep, Probe) {
    let iso = Isolation::new();
    let db = dropgate::db::connect_and_migrate(&iso.database_url)
        .await
        .unwrap();
    let store = Store::connect(REDIS_URL, &iso.prefix, Duration::from_secs(2))
        .await
        .unwrap();
    let probe = Probe::new(&iso.database_url, REDIS_URL, &iso.prefix).await;
    (store.clone(), Upkeep::new(store, db, horizon), probe)
}

/// Gives `sku` an empty journal with the writers' group (as a declare leaves it), plus
/// `entries` unwritten entries.
async fn journal(probe: &Probe, sku: &str, entries: usize) {
    let key = format!("{}:{{{sku}}}:journal", probe.prefix);
    let mut con = probe.redis.clone();
    let _: () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&key)
        .arg("writers")
        .arg("$")
        .arg("MKSTREAM")
        .query_async(&mut con)
        .await
        .unwrap();
    for _ in 0..entries {
        let _: String = redis::cmd("XADD")
            .arg(&key)
            .arg("*")
            .arg("c")
            .arg("x")
            .query_async(&mut con)
            .await
            .unwrap();
    }
}

async fn members(store: &Store) -> Vec<String> {
    let mut m = activity::members(store).await.unwrap();
    m.sort();
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_sku_with_nothing_left_leaves_the_active_set_and_one_with_entries_holds_or_waiters_never_does(
) {
    let (store, upkeep, probe) = own_upkeep(Duration::from_secs(60)).await;
    let mut con = probe.redis.clone();
    let with_work = ["unwritten", "held", "waiting", "s#1", "s#2"];
    for sku in ["idle", "recent"].iter().chain(&with_work) {
        journal(&probe, sku, usize::from(*sku == "unwritten")).await;
    }
    // Shards of a sharded SKU: one with a transfer it began and has not finished, one with
    // units pooled for the SKU's waitlists (src/shards/line.rs).
    let p = &probe.prefix;
    let _: () = redis::pipe()
        .zadd(format!("{p}:{{held}}:expiry"), "hold-1", 4e12)
        .zadd(format!("{p}:{{waiting}}:wl"), "entry-1", 1)
        .hset(format!("{p}:{{s#1}}:xfer:out"), "t-1", "2|0||0|")
        .hset(format!("{p}:{{s#2}}:state"), "wl_pool", 2)
        .query_async(&mut con)
        .await
        .unwrap();
    // Marked two minutes ago (past the horizon), except "recent", marked now.
    let long_ago = dropgate::clock::now_ms() - 120_000;
    for sku in ["idle"].iter().chain(&with_work) {
        let _: () = redis::cmd("ZADD")
            .arg(active_skus(store.prefix()))
            .arg(long_ago)
            .arg(sku)
            .query_async(&mut con)
            .await
            .unwrap();
    }
    activity::mark(&store, "recent").await;

    let kept = ["held", "recent", "s#1", "s#2", "unwritten", "waiting"];
    assert_eq!(upkeep.retire().await.unwrap(), 1);
    assert_eq!(members(&store).await, kept);
    // Those with work were marked again (to the back of the line), so they are not even
    // candidates until another horizon has passed.
    assert!(score(&probe, "held").await.unwrap() > long_ago as f64);
    assert_eq!(upkeep.retire().await.unwrap(), 0);
    assert_eq!(members(&store).await, kept);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retirement_that_raced_a_mark_keeps_the_sku() {
    let (store, _upkeep, probe) = own_upkeep(Duration::from_secs(60)).await;
    let key = active_skus(store.prefix());
    let mut con = probe.redis.clone();
    let _: () = redis::cmd("ZADD")
        .arg(&key)
        .arg(1000)
        .arg("raced")
        .query_async(&mut con)
        .await
        .unwrap();
    // The retirer read 1000 and found the SKU empty; a gateway marked it before the removal.
    activity::mark(&store, "raced").await;
    let retire = redis::Script::new(include_str!("../../lua/retire_sku.lua"));
    let removed: i64 = retire
        .key(&key)
        .arg("raced")
        .arg("1000")
        .invoke_async(&mut con)
        .await
        .unwrap();
    assert_eq!(removed, 0);
    assert!(score(&probe, "raced").await.is_some());
    // Unraced, the same call removes it.
    let now: String = redis::cmd("ZSCORE")
        .arg(&key)
        .arg("raced")
        .query_async(&mut con)
        .await
        .unwrap();
    let removed: i64 = retire
        .key(&key)
        .arg("raced")
        .arg(&now)
        .invoke_async(&mut con)
        .await
        .unwrap();
    assert_eq!(removed, 1);
    assert!(score(&probe, "raced").await.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_catalog_walk_adds_back_only_skus_with_work_and_costs_a_bounded_page_per_round() {
    let (store, mut upkeep, probe) = own_upkeep(Duration::from_secs(60)).await;
    // More SKUs than one slow page: two with work, in the first and the last page.
    let n = activity::WALK_PAGE * 2 + 5;
    let skus: Vec<String> = (0..n).map(|i| format!("w-{i:04}")).collect();
    sqlx::query(
        "INSERT INTO skus (sku, total, per_user_limit) SELECT s, 10, 1 FROM UNNEST($1::text[]) s",
    )
    .bind(&skus)
    .execute(&probe.db)
    .await
    .unwrap();
    for sku in &skus {
        journal(&probe, sku, 0).await;
    }
    let first = skus[3].clone();
    let last = skus[skus.len() - 1].clone();
    journal_entries(&probe, &first).await;
    let mut con = probe.redis.clone();
    let _: () = redis::cmd("ZADD")
        .arg(format!("{}:{{{last}}}:expiry", probe.prefix))
        .arg(4e12)
        .arg("hold-1")
        .query_async(&mut con)
        .await
        .unwrap();

    // The sentinel exists (as after any gateway's first round): the slow pace.
    let _: () = redis::cmd("ZADD")
        .arg(active_skus(store.prefix()))
        .arg("+inf")
        .arg(activity::SENTINEL)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(upkeep.walk_page().await.unwrap(), 1);
    assert_eq!(members(&store).await, std::slice::from_ref(&first));
    assert_eq!(upkeep.walk_page().await.unwrap(), 0);
    assert_eq!(upkeep.walk_page().await.unwrap(), 1);
    assert_eq!(members(&store).await, [first.clone(), last.clone()]);
    // Back at the start: nothing new.
    assert_eq!(upkeep.walk_page().await.unwrap(), 0);

    // A lost set (no sentinel) is walked whole in one round.
    let _: () = redis::cmd("DEL")
        .arg(active_skus(store.prefix()))
        .query_async(&mut con)
        .await
        .unwrap();
    upkeep.round().await.unwrap();
    assert_eq!(members(&store).await, [first, last]);
}

async fn journal_entries(probe: &Probe, sku: &str) {
    let key = format!("{}:{{{sku}}}:journal", probe.prefix);
    let mut con = probe.redis.clone();
    let _: String = redis::cmd("XADD")
        .arg(&key)
        .arg("*")
        .arg("c")
        .arg("x")
        .query_async(&mut con)
        .await
        .unwrap();
}
