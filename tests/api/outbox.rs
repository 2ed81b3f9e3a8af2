//! Claim events: recorded in the ledger's transactions, relayed to JetStream once per event for
//! a consumer, in order per claim, through relay crashes and NATS outages. Every test runs its
//! own nats-server, so no two share a stream.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::Value;
use uuid::Uuid;

use crate::durability::install_trigger;
use crate::helpers::*;
use crate::services::{GatewayProcess, PrivateNats};

const STREAM: &str = "DROPGATE";
const PREFIX: &str = "dropgate";

/// One message of the stream as a consumer would see it.
#[derive(Debug)]
pub(crate) struct StreamEvent {
    subject: String,
    msg_id: String,
    pub body: Value,
}

/// Every message of the stream, in stream order.
pub(crate) async fn stream_events(nats: &PrivateNats) -> Vec<StreamEvent> {
    let js = nats.jetstream().await;
    let mut stream = js.get_stream(STREAM).await.unwrap();
    let last = stream.info().await.unwrap().state.last_sequence;
    let mut out = Vec::new();
    for seq in 1..=last {
        let m = stream.get_raw_message(seq).await.unwrap();
        out.push(StreamEvent {
            subject: m.subject.to_string(),
            msg_id: m
                .headers
                .get(async_nats::header::NATS_MESSAGE_ID)
                .map(|v| v.to_string())
                .unwrap_or_default(),
            body: serde_json::from_slice(&m.payload).unwrap(),
        });
    }
    out
}

/// Messages the stream holds (0 while it does not exist yet).
pub(crate) async fn stream_len(nats: &PrivateNats) -> u64 {
    let Ok(c) = async_nats::connect(nats.url()).await else {
        return 0;
    };
    match async_nats::jetstream::new(c).get_stream(STREAM).await {
        Ok(mut s) => s.info().await.map_or(0, |i| i.state.messages),
        Err(_) => 0,
    }
}

async fn wait_for_stream(nats: &PrivateNats, n: u64, limit: Duration) {
    wait_for(limit, || async { stream_len(nats).await >= n }).await;
}

pub(crate) async fn unsent(db: &sqlx::PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM claim_events WHERE NOT sent")
        .fetch_one(db)
        .await
        .unwrap()
}

/// The consumer's guarantees on what the stream holds: each event once (by id), its
/// `Nats-Msg-Id` the event id, its subject `<prefix>.<sku>.<type>`, and each claim's events in
/// their sequence. Returns the events per claim, in stream order.
pub(crate) fn check_once_in_order(events: &[StreamEvent]) -> HashMap<Uuid, Vec<&Value>> {
    let mut seen = std::collections::HashSet::new();
    let mut per_claim: HashMap<Uuid, Vec<&Value>> = HashMap::new();
    for e in events {
        let id = e.body["id"].as_str().unwrap();
        assert!(seen.insert(id.to_string()), "event {id} delivered twice");
        assert_eq!(e.msg_id, id);
        let sku = e.body["sku"].as_str().unwrap().replace('.', "%2E");
        let kind = e.body["type"].as_str().unwrap();
        assert_eq!(e.subject, format!("{PREFIX}.{sku}.{kind}"));
        let claim: Uuid = e.body["claim_id"].as_str().unwrap().parse().unwrap();
        assert_eq!(id, format!("{claim}:{}", e.body["seq"]));
        per_claim.entry(claim).or_default().push(&e.body);
    }
    for (claim, list) in &per_claim {
        let seqs: Vec<i64> = list.iter().map(|b| b["seq"].as_i64().unwrap()).collect();
        let expected: Vec<i64> = (1..=seqs.len() as i64).collect();
        assert_eq!(seqs, expected, "claim {claim}: events out of order");
    }
    per_claim
}

fn won_claims(per_claim: &HashMap<Uuid, Vec<&Value>>) -> Vec<Uuid> {
    let mut ids: Vec<Uuid> = per_claim
        .iter()
        .filter(|(_, l)| l.iter().any(|b| b["type"] == "claim.won"))
        .map(|(c, _)| *c)
        .collect();
    ids.sort();
    ids
}

async fn readyz(api: &Api) -> (u16, Value) {
    let r = api.get("/readyz").await;
    (r.status().as_u16(), r.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drop_of_1000_buyers_on_100_units_publishes_exactly_100_claim_won_events() {
    let _heavy = crate::helpers::heavy().await;
    let nats = PrivateNats::start().await;
    let app = spawn_app_with(|c| c.nats_url = Some(nats.url())).await;
    app.declare("evt", 100, 1).await;
    let results = release_buyers(&app.api, "evt", users("e", 1000)).await;
    let won = won_ids(&results);
    assert_eq!(won.len(), 100);
    app.drained("evt").await;

    wait_for(Duration::from_secs(30), || async {
        unsent(&app.db).await == 0 && stream_len(&nats).await >= 100
    })
    .await;
    let events = stream_events(&nats).await;
    assert_eq!(events.len(), 100);
    let per_claim = check_once_in_order(&events);
    assert_eq!(won_claims(&per_claim), won);
    for e in &events {
        assert_eq!(e.body["type"], "claim.won");
        assert_eq!(e.body["status"], "issued");
        assert_eq!(e.body["quantity"], 1);
        assert!(e.body["user"].as_str().unwrap().starts_with("e-"));
    }
    // Every row is marked sent; none was published by the claim path.
    let sent: i64 = sqlx::query_scalar("SELECT count(*) FROM claim_events WHERE sent")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(sent, 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_sigkilled_mid_relay_beside_a_second_one_loses_no_event_and_repeats_none() {
    let _heavy = crate::helpers::heavy().await;
    let nats = PrivateNats::start().await;
    let iso = Isolation::new();
    let url = nats.url();
    let env = [("DROPGATE_NATS_URL", url.as_str())];
    let mut gw1 = GatewayProcess::start(&iso, REDIS_URL, &env).await;
    let gw2 = GatewayProcess::start(&iso, REDIS_URL, &env).await;
    let (api1, api2) = (Api::new(gw1.base.clone()), Api::new(gw2.base.clone()));
    let probe = Probe::new(&iso.database_url, REDIS_URL, &iso.prefix).await;
    assert_eq!(api1.declare("kill", 3000, 1).await.status(), 201);

    // A backlog builds while NATS is away, so both relays have plenty to do when it is back.
    let mut nats = nats;
    nats.stop();
    let (a, b) = tokio::join!(
        release_buyers(&api1, "kill", users("a", 1500)),
        release_buyers(&api2, "kill", users("b", 1500))
    );
    let mut won = won_ids(&a);
    won.extend(won_ids(&b));
    won.sort();
    assert_eq!(won.len(), 3000);
    api1.drained("kill").await;
    assert_eq!(unsent(&probe.db).await, 3000);

    nats.restart().await;
    wait_for(Duration::from_secs(60), || async {
        stream_len(&nats).await > 0
    })
    .await;
    gw1.sigkill().await;
    let left_at_kill = unsent(&probe.db).await;
    assert!(left_at_kill > 0, "the relays finished before the kill");
    let _gw1 = GatewayProcess::start(&iso, REDIS_URL, &env).await;

    // The dead relay's leases run out; the others publish its rows again (JetStream drops
    // what it already holds by Nats-Msg-Id) and mark them.
    wait_for(Duration::from_secs(90), || async {
        unsent(&probe.db).await == 0
    })
    .await;
    let events = stream_events(&nats).await;
    let per_claim = check_once_in_order(&events);
    assert_eq!(events.len(), 3000, "killed with {left_at_kill} unsent");
    assert_eq!(won_claims(&per_claim), won);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_stopped_for_10_s_during_a_drop_leaves_claims_unaffected_and_every_event_arrives_after(
) {
    let mut nats = PrivateNats::start().await;
    let app = spawn_app_with(|c| c.nats_url = Some(nats.url())).await;
    app.declare("out", 300, 1).await;
    let before = release_buyers(&app.api, "out", users("pre", 100)).await;
    wait_for_stream(&nats, 100, Duration::from_secs(30)).await;

    nats.stop();
    let stopped = Instant::now();
    let during = release_buyers(&app.api, "out", users("mid", 300)).await;
    // Claims do not notice: every buyer is answered, 200 win, the rest are sold out.
    assert_eq!(won_ids(&during).len(), 200);
    assert!(
        during
            .iter()
            .all(|(s, b)| *s == 201 || (*s == 409 && code(b) == "sold_out")),
        "claims were affected by NATS being down"
    );
    app.drained("out").await;
    // The backlog shows, and readiness stays green.
    wait_for(Duration::from_secs(10), || async {
        let (status, body) = readyz(&app.api).await;
        status == 200 && body["outbox"]["backlog"] == 200 && body["outbox"]["nats"] != "ok"
    })
    .await;
    let metrics = app.get("/metrics").await.text().await.unwrap();
    assert!(
        metrics.contains("dropgate_outbox_backlog_events 200"),
        "{metrics}"
    );
    // The outage lasts 10 s (its length is the fault, not a synchronisation).
    tokio::time::sleep(Duration::from_secs(10).saturating_sub(stopped.elapsed())).await;

    nats.restart().await;
    wait_for(Duration::from_secs(30), || async {
        unsent(&app.db).await == 0
    })
    .await;
    let events = stream_events(&nats).await;
    assert_eq!(events.len(), 300);
    let per_claim = check_once_in_order(&events);
    let mut all = won_ids(&before);
    all.extend(won_ids(&during));
    all.sort();
    assert_eq!(won_claims(&per_claim), all);
    let (status, body) = readyz(&app.api).await;
    assert_eq!(status, 200);
    assert_eq!(body["outbox"]["nats"], "ok");
    let metrics = app.get("/metrics").await.text().await.unwrap();
    assert!(
        metrics.contains("dropgate_outbox_published_total"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compensated_claim_publishes_claim_won_then_claim_compensated() {
    let nats = PrivateNats::start().await;
    let app = spawn_app_with(|c| {
        c.nats_url = Some(nats.url());
        c.reprocess_max_attempts = "2".into();
    })
    .await;
    install_trigger(&app.db).await;
    app.declare("comp", 10, 1).await;
    let bad = app.claim("comp", "bad-1", 1, None).await;
    let bad: Uuid = bad.json::<Value>().await.unwrap()["claim_id"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let good = app.claim("comp", "good-1", 1, None).await;
    let good: Uuid = good.json::<Value>().await.unwrap()["claim_id"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();

    app.drained("comp").await;
    // The units go back in Redis a moment before the parked row is closed as compensated (the
    // view counts them once in between: view_consistency::): await the record.
    wait_for(Duration::from_secs(30), || async {
        app.view("comp").await["compensated"] == 1
    })
    .await;
    wait_for(Duration::from_secs(30), || async {
        unsent(&app.db).await == 0 && stream_len(&nats).await >= 3
    })
    .await;
    let events = stream_events(&nats).await;
    assert_eq!(events.len(), 3);
    let per_claim = check_once_in_order(&events);
    let kinds = |c: &Uuid| -> Vec<String> {
        per_claim[c]
            .iter()
            .map(|b| b["type"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(kinds(&bad), ["claim.won", "claim.compensated"]);
    assert_eq!(per_claim[&bad][1]["status"], "compensated");
    assert_eq!(per_claim[&bad][1]["user"], "bad-1");
    assert_eq!(kinds(&good), ["claim.won"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_nats_events_wait_in_the_outbox_and_readyz_shows_the_backlog_while_ready() {
    let app = spawn_app().await;
    app.declare("nonats", 10, 1).await;
    let results = release_buyers(&app.api, "nonats", users("n", 5)).await;
    assert_eq!(won_ids(&results).len(), 5);
    app.drained("nonats").await;
    wait_for(Duration::from_secs(10), || async {
        readyz(&app.api).await.1["outbox"]["backlog"] == 5
    })
    .await;
    let (status, body) = readyz(&app.api).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["outbox"]["nats"], "not_configured");
    let ids: Vec<Uuid> = sqlx::query_scalar(
        "SELECT claim_id FROM claim_events WHERE event = 'claim.won' AND seq = 1 AND NOT sent
          ORDER BY claim_id",
    )
    .fetch_all(&app.db)
    .await
    .unwrap();
    assert_eq!(ids, won_ids(&results));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_tail_prints_json_lines_of_its_sku_and_resumes_where_it_stopped() {
    let nats = PrivateNats::start().await;
    let app = spawn_app_with(|c| c.nats_url = Some(nats.url())).await;
    app.declare("tail.1", 10, 1).await;
    app.declare("other", 10, 1).await;
    let mut ids = Vec::new();
    for u in ["t1", "t2", "t3"] {
        let r = app.claim("tail.1", u, 1, None).await;
        ids.push(r.json::<Value>().await.unwrap()["claim_id"].clone());
    }
    app.claim("other", "o1", 1, None).await;
    wait_for(Duration::from_secs(30), || async {
        unsent(&app.db).await == 0 && stream_len(&nats).await >= 4
    })
    .await;

    let tail = |count: &str| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_dropgate"))
            .args(["events", "tail", "--sku", "tail.1", "--count", count])
            .env_clear()
            .env("DROPGATE_NATS_URL", nats.url())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .collect::<Vec<_>>()
    };
    let mut lines = tail("2");
    assert_eq!(lines.len(), 2);
    lines.extend(tail("1"));
    let mut got: Vec<String> = lines.iter().map(|l| l["claim_id"].to_string()).collect();
    let mut want: Vec<String> = ids.iter().map(|v| v.to_string()).collect();
    got.sort();
    want.sort();
    assert_eq!(got, want, "each event once across the two runs");
    assert!(lines
        .iter()
        .all(|l| l["sku"] == "tail.1" && l["type"] == "claim.won"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_relay_leads_until_its_lease_runs_out_and_a_claim_waits_for_its_earlier_event() {
    use dropgate::outbox::{record, store, EventKind, NewEvent};
    // No NATS: the gateway's own relay only counts, so the test drives the relay's steps.
    let app = spawn_app().await;
    let claim = Uuid::now_v7();
    let mut tx = app.db.begin().await.unwrap();
    for kind in [EventKind::Won, EventKind::Compensated] {
        let event = NewEvent {
            kind,
            seq: if kind.creates() { 1 } else { 2 },
            claim_id: claim,
            sku: "fence",
            user: "u",
            quantity: 1,
            status: "issued".parse().unwrap(),
            occurred_at: None,
        };
        record(&mut tx, &event).await.unwrap();
    }
    tx.commit().await.unwrap();
    let (a, b) = (Uuid::new_v4(), Uuid::new_v4());

    // One relay leads at a time: A (with a lease of zero, run out at once) is replaced by B,
    // which keeps the lead until it gives it up; A leads again only then.
    assert!(store::lead(&app.db, a, Duration::ZERO).await.unwrap());
    assert!(store::lead(&app.db, b, Duration::from_secs(60))
        .await
        .unwrap());
    assert!(!store::lead(&app.db, a, Duration::from_secs(60))
        .await
        .unwrap());
    assert!(store::lead(&app.db, b, Duration::from_secs(60))
        .await
        .unwrap());
    store::resign(&app.db, b).await.unwrap();
    assert!(store::lead(&app.db, a, Duration::from_secs(60))
        .await
        .unwrap());
    // Only the claim's first event is taken while it is unsent.
    let taken = store::take(&app.db, 10, 0).await.unwrap();
    assert_eq!(taken.iter().map(|r| r.seq).collect::<Vec<_>>(), [1]);
    // Marked once, whoever marks it (it is marked only once JetStream acknowledged it).
    assert_eq!(store::mark_sent(&app.db, &[taken[0].id]).await.unwrap(), 1);
    assert_eq!(store::mark_sent(&app.db, &[taken[0].id]).await.unwrap(), 0);
    // Now the second event is free, and sent rows go after the retention period.
    let next = store::take(&app.db, 10, 0).await.unwrap();
    assert_eq!(next.iter().map(|r| r.seq).collect::<Vec<_>>(), [2]);
    assert_eq!(store::trim(&app.db, Duration::ZERO, 1).await.unwrap(), 1);
    let left: Vec<i32> = sqlx::query_scalar("SELECT seq FROM outbox")
        .fetch_all(&app.db)
        .await
        .unwrap();
    assert_eq!(left, [2]);
}

/// The claim's outbox rows: (event, seq, status).
async fn outbox_rows(db: &sqlx::PgPool, claim: Uuid) -> Vec<(String, i32, String)> {
    sqlx::query_as("SELECT event, seq, status FROM claim_events WHERE claim_id = $1 ORDER BY seq")
        .bind(claim)
        .fetch_all(db)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_entry_written_twice_records_one_claim_won() {
    let app = spawn_app().await;
    let winner = dropgate::writer::Winner {
        entry_id: "1-0".into(),
        claim_id: Uuid::now_v7(),
        sku: "twice".into(),
        user: "u".into(),
        quantity: 2,
        idempotency_key: None,
        remaining_after: Some(3),
        created_ms: dropgate::clock::now_ms(),
        seq: 1,
        expires_ms: None,
        offer: false,
        seats: None,
    };
    for _ in 0..2 {
        dropgate::writer::write_batch(
            &app.db,
            std::slice::from_ref(&winner),
            Duration::from_millis(50),
        )
        .await
        .unwrap();
    }
    assert_eq!(
        outbox_rows(&app.db, winner.claim_id).await,
        [("claim.won".to_string(), 1, "issued".to_string())]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_claim_written_later_records_its_claim_won_then() {
    let app = spawn_app_with(|c| c.reprocess_max_attempts = "100".into()).await;
    install_trigger(&app.db).await;
    app.declare("late", 10, 1).await;
    let r = app.claim("late", "bad-1", 1, None).await;
    let claim: Uuid = r.json::<Value>().await.unwrap()["claim_id"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    wait_for(Duration::from_secs(20), || async {
        let parked: i64 = sqlx::query_scalar("SELECT count(*) FROM persistence_pending")
            .fetch_one(&app.db)
            .await
            .unwrap();
        parked == 1
    })
    .await;
    // Refused: no event yet, as the ledger holds no live claim.
    assert!(outbox_rows(&app.db, claim).await.is_empty());

    sqlx::query("UPDATE test_fault SET refuse = false")
        .execute(&app.db)
        .await
        .unwrap();
    app.drained("late").await;
    assert_eq!(app.issued_ids("late").await, [claim]);
    assert_eq!(
        outbox_rows(&app.db, claim).await,
        [("claim.won".to_string(), 1, "issued".to_string())]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_publish_their_end_and_offers_their_start_in_order_per_claim() {
    use crate::lifecycle::{claim_id, claim_one, declare_with, post_as};
    let nats = PrivateNats::start().await;
    let app = spawn_app_with(|c| c.nats_url = Some(nats.url())).await;
    declare_with(
        &app,
        "life",
        serde_json::json!({"total": 3, "hold_seconds": 600}),
    )
    .await;
    let mut ids = Vec::new();
    for u in ["keep", "drop", "late"] {
        ids.push(claim_id(&claim_one(&app, "life", u).await.1));
    }
    let (s, _) = post_as(&app, "/v1/skus/life/waitlist", &token("waiter")).await;
    assert_eq!(s, 201);
    post_as(
        &app,
        &format!("/v1/claims/{}/confirm", ids[0]),
        &token("keep"),
    )
    .await;
    post_as(
        &app,
        &format!("/v1/claims/{}/cancel", ids[1]),
        &token("drop"),
    )
    .await;

    // won x3, confirmed, cancelled, and the cancelled unit offered to the waiter.
    wait_for(Duration::from_secs(30), || async {
        unsent(&app.db).await == 0 && stream_len(&nats).await >= 6
    })
    .await;
    let events = stream_events(&nats).await;
    assert_eq!(events.len(), 6);
    let per_claim = check_once_in_order(&events);
    let kinds = |id: &str| -> Vec<String> {
        per_claim[&id.parse::<Uuid>().unwrap()]
            .iter()
            .map(|b| b["type"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(kinds(&ids[0]), ["claim.won", "claim.confirmed"]);
    assert_eq!(kinds(&ids[1]), ["claim.won", "claim.cancelled"]);
    assert_eq!(kinds(&ids[2]), ["claim.won"]);
    let offer = events
        .iter()
        .find(|e| e.body["type"] == "waitlist.offered")
        .expect("an offer event");
    assert_eq!(offer.body["user"], "waiter");
    assert_eq!(offer.body["status"], "held");
}
