//! The durable handoff: every winner reaches PostgreSQL exactly once, through crashes,
//! refusals and outages.

use std::time::Duration;

use serde_json::Value;
use uuid::Uuid;

use crate::helpers::*;
use crate::services::{GatewayProcess, PrivatePostgres};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drop_of_2000_buyers_on_500_units_records_exactly_the_winners() {
    let _heavy = crate::helpers::heavy().await;
    let app = spawn_app().await;
    app.declare("big", 500, 1).await;
    let results = release_buyers(&app.api, "big", users("b", 2000)).await;
    let won = won_ids(&results);
    assert_eq!(won.len(), 500);
    let others: Vec<_> = results
        .iter()
        .filter(|(s, _)| ![201, 409].contains(s))
        .collect();
    assert_eq!(
        results.iter().filter(|(s, _)| *s == 409).count(),
        1500,
        "{others:?}"
    );
    let v = app.drained("big").await;
    assert_eq!(app.issued_ids("big").await, won);
    assert_eq!(v["remaining"], 0);
    assert_eq!(v["recorded"], 500);
    assert_eq!(v["consistent"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_sigkilled_mid_drop_loses_no_winner() {
    let _heavy = crate::helpers::heavy().await;
    let iso = Isolation::new();
    let mut gw = GatewayProcess::start(&iso, REDIS_URL, &[]).await;
    let api = Api::new(gw.base.clone());
    assert_eq!(api.declare("kill", 400, 1).await.status(), 201);

    // Buyers keep coming in waves; the gateway dies while they are in flight.
    let drop = tokio::spawn({
        let api = api.clone();
        async move {
            let mut all = Vec::new();
            for wave in 0..10 {
                all.extend(release_buyers(&api, "kill", users(&format!("w{wave}"), 100)).await);
            }
            all
        }
    });
    let probe = Probe::new(&iso.database_url, REDIS_URL, &iso.prefix).await;
    wait_for(Duration::from_secs(30), || async {
        probe.stock("kill").await.is_some_and(|s| s <= 300)
    })
    .await;
    gw.sigkill().await;
    let results = drop.await.unwrap();
    let answered_won = won_ids(&results);
    assert!(!answered_won.is_empty());

    // A new gateway takes over the dead one's journal entries.
    let gw2 = GatewayProcess::start(&iso, REDIS_URL, &[]).await;
    let api2 = Api::new(gw2.base.clone());
    let v = api2.drained("kill").await;
    let recorded = probe.issued_ids("kill").await;
    for id in &answered_won {
        assert!(recorded.binary_search(id).is_ok(), "winner {id} was lost");
    }
    assert_eq!(v["consistent"], true, "{v}");
    let stock = probe.stock("kill").await.unwrap();
    assert_eq!(stock + recorded.len() as i64, 400);
}

const REFUSE_TRIGGER: &str = r#"
CREATE TABLE IF NOT EXISTS test_fault (refuse boolean NOT NULL);
INSERT INTO test_fault VALUES (true);
CREATE OR REPLACE FUNCTION test_refuse() RETURNS trigger AS $$
BEGIN
  IF NEW.user_id LIKE 'bad-%' AND (SELECT refuse FROM test_fault LIMIT 1) THEN
    RAISE EXCEPTION 'test trigger refuses %', NEW.user_id;
  END IF;
  RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER test_refuse BEFORE INSERT ON issuances
  FOR EACH ROW EXECUTE FUNCTION test_refuse();
"#;

pub async fn install_trigger(db: &sqlx::PgPool) {
    sqlx::raw_sql(REFUSE_TRIGGER).execute(db).await.unwrap();
}

fn mixed_buyers() -> Vec<String> {
    // Good and refused buyers interleaved, so refusals share batches with good rows.
    (0..60)
        .map(|i| {
            if i % 3 == 0 {
                format!("bad-{i}")
            } else {
                format!("good-{i}")
            }
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_rows_are_parked_and_resolve_when_the_fault_clears() {
    let app = spawn_app_with(|c| c.reprocess_max_attempts = "100".into()).await;
    install_trigger(&app.db).await;
    app.declare("park", 100, 1).await;
    let results = release_buyers(&app.api, "park", mixed_buyers()).await;
    assert_eq!(won_ids(&results).len(), 60);

    // Good rows land; the 20 refused ones wait in persistence_pending with the reason.
    wait_for(Duration::from_secs(30), || async {
        let parked: i64 = sqlx::query_scalar("SELECT count(*) FROM persistence_pending")
            .fetch_one(&app.db)
            .await
            .unwrap();
        parked == 20 && app.issued_ids("park").await.len() == 40
    })
    .await;
    let reason: String =
        sqlx::query_scalar("SELECT failure_reason FROM persistence_pending LIMIT 1")
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert!(reason.contains("test trigger refuses"), "{reason}");
    let v = app.view("park").await;
    assert_eq!(v["pending"], 20);
    assert_eq!(v["consistent"], true, "{v}");

    sqlx::query("UPDATE test_fault SET refuse = false")
        .execute(&app.db)
        .await
        .unwrap();
    let v = app.drained("park").await;
    assert_eq!(v["recorded"], 60);
    assert_eq!(v["compensated"], 0);
    assert_eq!(v["consistent"], true);
    let statuses: Vec<String> =
        sqlx::query_scalar("SELECT DISTINCT status FROM persistence_pending")
            .fetch_all(&app.db)
            .await
            .unwrap();
    assert_eq!(statuses, vec!["resolved".to_string()]);
    assert_eq!(app.issued_ids("park").await, won_ids(&results));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_rows_are_compensated_exactly_once_with_two_gateways() {
    let iso = Isolation::new();
    let env = [("DROPGATE_REPROCESS_MAX_ATTEMPTS", "3")];
    let gw1 = GatewayProcess::start(&iso, REDIS_URL, &env).await;
    let probe = Probe::new(&iso.database_url, REDIS_URL, &iso.prefix).await;
    install_trigger(&probe.db).await;
    let gw2 = GatewayProcess::start(&iso, REDIS_URL, &env).await;
    let (api1, api2) = (Api::new(gw1.base.clone()), Api::new(gw2.base.clone()));
    api1.declare("comp", 100, 1).await;

    // Both gateways take claims, so both writers park rows and both reprocessors race.
    let buyers = mixed_buyers();
    let (a, b) = tokio::join!(
        release_buyers(&api1, "comp", buyers[..30].to_vec()),
        release_buyers(&api2, "comp", buyers[30..].to_vec())
    );
    assert_eq!(won_ids(&a).len() + won_ids(&b).len(), 60);

    api1.drained("comp").await;
    // The units go back in Redis a moment before each parked row is closed as compensated
    // (the view counts them once in between): await the records, then read the books.
    wait_for(Duration::from_secs(30), || async {
        api1.view("comp").await["compensated"] == 20
    })
    .await;
    let v = api1.drained("comp").await;
    assert_eq!(v["recorded"], 40);
    assert_eq!(v["compensated"], 20);
    assert_eq!(v["pending"], 0);
    // Units came back exactly once: 100 - 40 written.
    assert_eq!(v["remaining"], 60);
    assert_eq!(probe.stock("comp").await, Some(60));
    assert_eq!(v["consistent"], true);
    for i in (0..60).step_by(3) {
        assert_eq!(probe.held("comp", &format!("bad-{i}")).await, 0);
    }
    let rows: Vec<(String, i32)> =
        sqlx::query_as("SELECT status, attempts FROM persistence_pending ORDER BY claim_id")
            .fetch_all(&probe.db)
            .await
            .unwrap();
    assert_eq!(rows.len(), 20);
    assert!(
        rows.iter().all(|(s, n)| s == "compensated" && *n == 3),
        "{rows:?}"
    );
    // A compensated buyer may claim again: the units and the count came back.
    assert_eq!(api2.claim("comp", "bad-0", 1, None).await.status(), 201);
    // The buyer sees the compensated claim as such.
    let id: Uuid = sqlx::query_scalar("SELECT claim_id FROM persistence_pending LIMIT 1")
        .fetch_one(&probe.db)
        .await
        .unwrap();
    let r = api1
        .http
        .get(format!("{}/v1/claims/{id}", api1.base))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.json::<Value>().await.unwrap()["status"], "compensated");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_continue_while_postgres_is_down_and_every_winner_lands_after() {
    let pg = PrivatePostgres::start().await;
    let app = spawn_app_with(|c| c.database_url = pg.url("dropgate")).await;
    app.declare("pgdown", 200, 1).await;
    let before = release_buyers(&app.api, "pgdown", users("pre", 20)).await;
    app.drained("pgdown").await;

    pg.down();
    let during = release_buyers(&app.api, "pgdown", users("mid", 300)).await;
    let won_during = won_ids(&during);
    assert_eq!(
        won_during.len(),
        180,
        "claims must go on without PostgreSQL"
    );
    assert_eq!(app.stock("pgdown").await, Some(0));

    pg.up().await;
    let v = app.drained("pgdown").await;
    let recorded = app.issued_ids("pgdown").await;
    let mut all = won_ids(&before);
    all.extend(won_during);
    all.sort();
    assert_eq!(recorded, all);
    assert_eq!(v["consistent"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_in_flight_winners_and_exits_zero() {
    let iso = Isolation::new();
    let mut gw = GatewayProcess::start(&iso, REDIS_URL, &[]).await;
    let api = Api::new(gw.base.clone());
    api.declare("term", 50, 1).await;
    let results = release_buyers(&api, "term", users("t", 80)).await;
    let won = won_ids(&results);
    assert_eq!(won.len(), 50);
    let status = gw.sigterm(Duration::from_secs(20)).await;
    assert!(status.success(), "{status:?}");
    let probe = Probe::new(&iso.database_url, REDIS_URL, &iso.prefix).await;
    assert_eq!(probe.issued_ids("term").await, won);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_are_visible_to_their_owner_and_the_admin_only() {
    let app = spawn_app().await;
    app.declare("own", 5, 1).await;
    let r = app.claim("own", "alice", 1, None).await;
    let id = r.json::<Value>().await.unwrap()["claim_id"]
        .as_str()
        .unwrap()
        .to_string();
    app.drained("own").await;
    let get = |auth: String| {
        let (http, url) = (app.http.clone(), format!("{}/v1/claims/{id}", app.base));
        async move { http.get(url).bearer_auth(auth).send().await.unwrap() }
    };
    let r = get(token("alice")).await;
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["user"], "alice");
    assert_eq!(body["status"], "issued");
    assert_eq!(get(ADMIN.to_string()).await.status(), 200);
    let r = get(token("mallory")).await;
    assert_eq!(r.status(), 404);
    assert_eq!(code(&r.json().await.unwrap()), "unknown_claim");
}
