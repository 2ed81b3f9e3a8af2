//! A hold's change (confirmed, cancelled, expired) meets its win in the ledger whatever its age
//! and whatever the gateways' clocks say: the writer orders a change after its win by the
//! journal (the win is an earlier entry of the same stream), never by a wall clock.

use std::time::Duration;

use serde_json::json;
use uuid::Uuid;

use crate::helpers::*;
use crate::lifecycle::{
    claim_id, claim_one, declare_with, get_as, ledger_statuses, post_as, settled,
};
use crate::services::{GatewayProcess, PrivateRedis};

const FAKETIME_LIB: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

/// libfaketime (Debian's `faketime`), installed when missing: a test that needs it fails when
/// it cannot have it, it never skips.
pub fn faketime_lib() -> &'static str {
    if std::path::Path::new(FAKETIME_LIB).exists() {
        return FAKETIME_LIB;
    }
    let install = || {
        std::process::Command::new("apt-get")
            .args(["install", "-y", "faketime"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .is_ok_and(|s| s.success())
    };
    if !install() {
        let _ = std::process::Command::new("apt-get").arg("update").status();
        assert!(install(), "apt-get install faketime failed");
    }
    assert!(
        std::path::Path::new(FAKETIME_LIB).exists(),
        "faketime is installed but {FAKETIME_LIB} is missing"
    );
    FAKETIME_LIB
}

/// The environment that runs a gateway with its wall clock `offset` ahead (libfaketime; the
/// monotonic clock stays real, so its timers do).
pub fn skewed_clock(offset: &str) -> Vec<(&'static str, String)> {
    vec![
        ("LD_PRELOAD", faketime_lib().to_string()),
        ("FAKETIME", offset.to_string()),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_string()),
        ("FAKETIME_NO_CACHE", "1".to_string()),
    ]
}

/// How far the gateway's clock is from this process's, from its `Date` header (seconds).
async fn clock_offset(api: &Api) -> i64 {
    let r = api.get("/healthz").await;
    let date = r
        .headers()
        .get("date")
        .expect("the gateway sends a Date header")
        .to_str()
        .unwrap()
        .to_string();
    let theirs = chrono::DateTime::parse_from_rfc2822(&date).unwrap();
    theirs.timestamp() - chrono::Utc::now().timestamp()
}

/// (entry id, has a hold change) of every journal entry, and the ids delivered to a writer
/// and not acknowledged.
async fn journal(probe: &Probe, sku: &str) -> (Vec<(String, bool)>, Vec<String>) {
    let keys = dropgate::keys::SkuKeys::new(&probe.prefix, sku);
    let mut con = probe.redis.clone();
    let entries: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
        .arg(keys.journal())
        .arg("-")
        .arg("+")
        .query_async(&mut con)
        .await
        .unwrap();
    let pending: Vec<(String, String, i64, i64)> = redis::cmd("XPENDING")
        .arg(keys.journal())
        .arg("writers")
        .arg("-")
        .arg("+")
        .arg(1000)
        .query_async(&mut con)
        .await
        .unwrap();
    (
        entries
            .into_iter()
            .map(|(id, fields)| (id, fields.iter().any(|(f, _)| f == "s")))
            .collect(),
        pending.into_iter().map(|p| p.0).collect(),
    )
}

async fn hold_status(probe: &Probe, sku: &str, id: &str) -> Option<String> {
    let keys = dropgate::keys::SkuKeys::new(&probe.prefix, sku);
    let mut con = probe.redis.clone();
    let rec: Option<String> = redis::cmd("HGET")
        .arg(keys.holds())
        .arg(id)
        .query_async(&mut con)
        .await
        .unwrap();
    rec.map(|r| r.split('|').next().unwrap_or_default().to_string())
}

/// Three holds expire in Redis while PostgreSQL refuses writes (`LOCK TABLE issuances IN SHARE
/// MODE`: reads go on), so the first gateway's writer holds their wins unwritten and never reads
/// the expiries; it is SIGKILLed. After `outage` a second gateway (its clock as `env` sets it)
/// takes over: it reads the expiries first (new entries) while the wins wait in the dead
/// gateway's pending list. Every hold must end `expired` in the ledger, with its events, and
/// the books must balance.
///
/// Returns how far the second gateway's clock is from this process's (seconds).
async fn expiries_read_before_their_wins_end_the_holds(
    outage: Duration,
    env: &[(&str, &str)],
) -> i64 {
    let iso = Isolation::new();
    let mut gw1 = GatewayProcess::start(&iso, REDIS_URL, &[]).await;
    let api1 = Api::new(gw1.base.clone());
    let probe = Probe::new(&iso.database_url, REDIS_URL, &iso.prefix).await;
    let r = declare_with(&api1, "exp", json!({"total": 5, "hold_seconds": 1})).await;
    assert_eq!(r.status(), 201);

    let mut lock = probe.db.begin().await.unwrap();
    sqlx::query("LOCK TABLE issuances IN SHARE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();
    let mut ids = Vec::new();
    for u in ["a", "b", "c"] {
        let (s, body) = claim_one(&api1, "exp", u).await;
        assert_eq!(s, 201, "{body}");
        assert_eq!(body["status"], "held");
        ids.push(claim_id(&body));
    }
    // The expiry worker ends them in Redis; the writer is stuck on the wins' insert.
    wait_for(Duration::from_secs(20), || async {
        let mut all = true;
        for id in &ids {
            all &= hold_status(&probe, "exp", id).await.as_deref() == Some("expired");
        }
        all
    })
    .await;
    let (entries, pending) = journal(&probe, "exp").await;
    let changes: Vec<&String> = entries.iter().filter(|e| e.1).map(|e| &e.0).collect();
    assert_eq!(changes.len(), 3, "{entries:?}");
    assert!(!pending.is_empty(), "the first writer read the wins");
    assert!(
        changes.iter().all(|c| !pending.contains(c)),
        "no writer read the expiries yet: {pending:?}"
    );

    gw1.sigkill().await;
    lock.rollback().await.unwrap();
    tokio::time::sleep(outage).await;

    let gw2 = GatewayProcess::start(&iso, REDIS_URL, env).await;
    let api2 = Api::new(gw2.base.clone());
    let v = settled(&api2, &probe, "exp").await;

    let statuses = ledger_statuses(&probe, "exp").await;
    for id in &ids {
        let id_u: Uuid = id.parse().unwrap();
        assert_eq!(statuses[&id_u], "expired", "ledger of {id}: {statuses:?}");
        let (s, body) = get_as(&api2, &format!("/v1/claims/{id}"), ADMIN).await;
        assert_eq!((s, body["status"].as_str()), (200, Some("expired")));
        let events: Vec<(String, i32, String)> = sqlx::query_as(
            "SELECT event, seq, status FROM claim_events WHERE claim_id = $1 ORDER BY seq",
        )
        .bind(id_u)
        .fetch_all(&probe.db)
        .await
        .unwrap();
        assert_eq!(
            events,
            [
                ("claim.won".into(), 1, "held".into()),
                ("claim.expired".into(), 2, "expired".into())
            ]
        );
    }
    assert_eq!(v["consistent"], true, "{v}");
    assert_eq!(
        (v["remaining"].as_i64(), v["recorded"].as_i64()),
        (Some(5), Some(0)),
        "{v}"
    );
    let (entries, pending) = journal(&probe, "exp").await;
    assert!(
        entries.is_empty() && pending.is_empty(),
        "{entries:?} {pending:?}"
    );
    clock_offset(&api2).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_that_expired_during_a_35_s_outage_before_their_wins_were_written_end_expired() {
    let offset = expiries_read_before_their_wins_end_the_holds(Duration::from_secs(35), &[]).await;
    assert!(offset.abs() <= 2, "clock offset {offset} s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_30_s_fast_that_takes_over_applies_each_expiry_to_its_win() {
    let env = skewed_clock("+30s");
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let offset = expiries_read_before_their_wins_end_the_holds(Duration::ZERO, &env).await;
    // The clock really was fast in the gateway that took over (else this proves nothing).
    assert!((28..=32).contains(&offset), "clock offset {offset} s");
}

/// A change whose win will never reach the ledger (its entry cannot be read, so it is
/// quarantined without a claim id) waits only while that entry is unacknowledged, here in the
/// pending list of a consumer that is gone, and is acknowledged once the entry is quarantined:
/// decided from the journal, not after a time. The writer goes on with the SKU meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_whose_win_is_unreadable_waits_for_its_quarantine_and_no_longer() {
    let app = spawn_app().await;
    let r = declare_with(&app, "orphan", json!({"total": 10, "hold_seconds": 600})).await;
    assert_eq!(r.status(), 201);
    let keys = dropgate::keys::SkuKeys::new(&app.probe.prefix, "orphan");
    let claim = Uuid::now_v7();
    let change = format!("{claim}|cancelled|1|{}|2", dropgate::clock::now_ms());
    let mut con = app.probe.redis.clone();
    // As end_hold writes a cancel: the unit leaves `inflight` until the change is written.
    // The garbled win is delivered to a consumer that never comes back; the change is not.
    let _: redis::Value = redis::pipe()
        .atomic()
        .hincr(keys.state(), "inflight", -1)
        .cmd("XADD")
        .arg(keys.journal())
        .arg("*")
        .arg("c")
        .arg(b"\xff\xfe not a winner".as_slice())
        .cmd("XREADGROUP")
        .arg("GROUP")
        .arg("writers")
        .arg("gone")
        .arg("COUNT")
        .arg(1)
        .arg("STREAMS")
        .arg(keys.journal())
        .arg(">")
        .cmd("XADD")
        .arg(keys.journal())
        .arg("*")
        .arg("s")
        .arg(&change)
        .query_async(&mut con)
        .await
        .unwrap();
    let (s, body) = claim_one(&app, "orphan", "later").await;
    assert_eq!(s, 201, "{body}");

    let v = settled(&app, &app.probe, "orphan").await;
    let (entries, pending) = journal(&app.probe, "orphan").await;
    assert!(
        entries.is_empty() && pending.is_empty(),
        "{entries:?} {pending:?}"
    );
    let quarantined: Vec<Option<Uuid>> =
        sqlx::query_scalar("SELECT claim_id FROM quarantine WHERE sku = 'orphan'")
            .fetch_all(&app.db)
            .await
            .unwrap();
    assert_eq!(quarantined, [None]);
    let statuses = ledger_statuses(&app.probe, "orphan").await;
    assert_eq!(statuses.len(), 1, "{statuses:?}");
    assert_eq!(statuses[&claim_id(&body).parse::<Uuid>().unwrap()], "held");
    assert_eq!(
        (v["in_flight"].as_i64(), v["recorded"].as_i64()),
        (Some(0), Some(1)),
        "{v}"
    );
}

/// A confirm decided in Redis is written by the writer a moment later. While Redis cannot be
/// read and the ledger still says `held`, GET cannot know the hold's status: it answers 503,
/// never the ledger's `held` after the buyer's 200 `confirmed` (MODEL_SEED=432000426898927635).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirmed_hold_is_never_read_held_from_a_ledger_behind_an_unreadable_redis() {
    let redis = PrivateRedis::start().await;
    let app = spawn_app_on(&redis.url()).await;
    let r = declare_with(&app, "behind", json!({"total": 2, "hold_seconds": 600})).await;
    assert_eq!(r.status(), 201);
    let (status, body) = claim_one(&app, "behind", "b-1").await;
    assert_eq!(
        (status, body["status"].as_str()),
        (201, Some("held")),
        "{body}"
    );
    let id = claim_id(&body);
    let uuid: Uuid = id.parse().unwrap();
    settled(&app, &app.probe, "behind").await;
    assert_eq!(ledger_statuses(&app.probe, "behind").await[&uuid], "held");

    // The writer cannot write the confirm (reads still go through).
    let mut lock = app.db.begin().await.unwrap();
    sqlx::query("LOCK TABLE issuances IN EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();
    let (status, body) = post_as(&app, &format!("/v1/claims/{id}/confirm"), &token("b-1")).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("confirmed")),
        "{body}"
    );

    // Redis frozen: the ledger alone says `held`.
    redis.pause(3000).await;
    let (status, body) = get_as(&app, &format!("/v1/claims/{id}"), &token("b-1")).await;
    assert_eq!(status, 503, "GET told {body} while Redis could not be read");
    assert_eq!(code(&body), "unavailable", "{body}");
    assert_eq!(ledger_statuses(&app.probe, "behind").await[&uuid], "held");

    // Once both answer, the confirm is read and written.
    lock.rollback().await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = get_as(&app, &format!("/v1/claims/{id}"), &token("b-1")).await;
        if status == 200 && ledger_statuses(&app.probe, "behind").await[&uuid] == "confirmed" {
            assert_eq!(body["status"], "confirmed", "{body}");
            break;
        }
        assert!(
            matches!(status, 200 | 503),
            "GET answered {status} {body} after Redis came back"
        );
        if status == 200 {
            assert_eq!(body["status"], "confirmed", "{body}");
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the confirm never reached the ledger"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
