//! Admission: the set rate measured from the admissions' own timestamps (Redis's clock, the
//! admitted set's scores), a rate changed while admitting, sold out told to the whole line and
//! reopened by units that come back, and a gateway SIGKILLed while admitting.

use redis::AsyncCommands;
use serde_json::json;

use super::*;
use crate::helpers::{spawn_app, wait_for, Isolation, REDIS_URL};
use crate::services::GatewayProcess;

/// Admissions per second between `from` and `to` (ms), from the admitted set's timestamps.
fn rate_between(admitted: &[(uuid::Uuid, i64)], from: i64, to: i64) -> f64 {
    let n = admitted
        .iter()
        .filter(|(_, t)| *t > from && *t <= to)
        .count();
    n as f64 * 1000.0 / (to - from) as f64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_keeps_the_set_rate_and_follows_a_change_while_running() {
    let app = spawn_app().await;
    // Joined before the opening, so the whole line waits when admission starts.
    let opens = chrono::Utc::now() + chrono::Duration::seconds(20);
    let r = declare_queued(
        &app,
        "q-pace",
        10_000,
        json!({"admit_per_second": 100}),
        json!({"opens_at": opens.to_rfc3339()}),
    )
    .await;
    assert_eq!(r.status(), 201);
    let n = 1500;
    join_many(&app, "q-pace", "p", n, 200).await;
    assert!(
        chrono::Utc::now() < opens,
        "joined before the opening (machine too slow?)"
    );
    // Let 100/s run for a while, then double it.
    wait_for(LONG, || async {
        counts(&app.probe, "q-pace").await.1 >= 400
    })
    .await;
    let r = declare_queued(
        &app,
        "q-pace",
        10_000,
        json!({"admit_per_second": 200}),
        json!({"opens_at": opens.to_rfc3339()}),
    )
    .await;
    assert_eq!(r.status(), 200);
    let mut con = app.probe.redis.clone();
    let t: (i64, i64) = redis::cmd("TIME").query_async(&mut con).await.unwrap();
    let changed_ms = t.0 * 1000 + t.1 / 1000;
    wait_for(LONG, || async { counts(&app.probe, "q-pace").await.0 == 0 }).await;
    let adm = admitted(&app.probe, "q-pace").await;
    assert_eq!(adm.len(), n, "every ticket admitted once");
    let first = adm.first().unwrap().1;
    let last = adm.last().unwrap().1;
    // Steady windows: past the first round, before the change; after the change took hold,
    // before the line ran dry.
    let slow = rate_between(&adm, first + 300, changed_ms - 100);
    let fast = rate_between(&adm, changed_ms + 300, last - 300);
    println!(
        "admitted/s: {slow:.1} at 100/s, {fast:.1} at 200/s ({} s, {} s)",
        (changed_ms - first) / 1000,
        (last - changed_ms) / 1000
    );
    assert!(
        (95.0..=105.0).contains(&slow),
        "100/s within ±5 %: {slow:.1}"
    );
    assert!(
        (190.0..=210.0).contains(&fast),
        "200/s within ±5 %: {fast:.1}"
    );
    let m = app.get("/metrics").await.text().await.unwrap();
    let queue_lines: Vec<&str> = m
        .lines()
        .filter(|l| l.starts_with("dropgate_queue_"))
        .collect();
    // The recorder is the test process's: other tests' gateways count into it too.
    let total: f64 = queue_lines
        .iter()
        .find_map(|l| l.strip_prefix("dropgate_queue_admitted_total "))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    assert!(total >= 1500.0, "{queue_lines:?}");
    assert!(queue_lines
        .iter()
        .any(|l| l.starts_with("dropgate_queue_waiting ")));
    assert!(queue_lines
        .iter()
        .any(|l| l.starts_with("dropgate_queue_admission_lag_seconds ")));
}

#[tokio::test]
async fn sold_out_reaches_the_whole_line_and_units_coming_back_reopen_admission() {
    let app = spawn_app().await;
    let r = declare_queued(&app, "q-out", 3, json!({"admit_per_second": 3}), json!({})).await;
    assert_eq!(r.status(), 201);
    let n = 60;
    let tickets = join_all(&app, "q-out", "o", n).await;
    // The first admitted buy every unit.
    let mut bought = 0;
    let mut i = 0;
    while bought < 3 {
        let (_, t) = ticket(&app, &tickets[i], &visitor(&format!("o-{i}"))).await;
        match t["state"].as_str() {
            Some("admitted") => {
                let (s, b) =
                    claim_with(&app, "q-out", t["admission_token"].as_str().unwrap()).await;
                assert_eq!(s, 201, "{b}");
                bought += 1;
                i += 1;
            }
            Some("waiting") => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
            other => panic!("{other:?}: {t}"),
        }
    }
    let sold_out_at = std::time::Instant::now();
    // Every ticket still in line reads sold_out within a second.
    let (line_now, _) = counts(&app.probe, "q-out").await;
    let mut told = 0;
    for (j, id) in tickets.iter().enumerate() {
        let (_, t) = ticket(&app, id, &visitor(&format!("o-{j}"))).await;
        if t["state"] == "sold_out" {
            told += 1;
            assert!(t["eta_seconds"].is_null(), "{t}");
        }
    }
    assert!(
        sold_out_at.elapsed() < std::time::Duration::from_secs(1),
        "read the line within a second"
    );
    assert_eq!(
        told as i64, line_now,
        "every waiting ticket was told sold_out"
    );
    // Admission stopped: nobody else is admitted while nothing remains.
    let (_, admitted_then) = counts(&app.probe, "q-out").await;
    let mut con = app.probe.redis.clone();
    let _: () = redis::cmd("PING").query_async(&mut con).await.unwrap();
    wait_for(LONG, || async {
        qfield(&app.probe, "q-out", "last_ms")
            .await
            .is_some_and(|t| {
                t.parse::<i64>().unwrap_or(0) > chrono::Utc::now().timestamp_millis() - 100
            })
    })
    .await;
    tokio::time::timeout(std::time::Duration::from_millis(1500), async {
        loop {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            assert_eq!(
                counts(&app.probe, "q-out").await.1,
                admitted_then,
                "admitted while sold out"
            );
        }
    })
    .await
    .unwrap_err();
    // Units come back (restock), nobody on the waitlist: admission reopens.
    assert_eq!(app.restock("q-out", 2).await.status(), 200);
    wait_for(LONG, || async {
        counts(&app.probe, "q-out").await.1 > admitted_then
    })
    .await;
    let (_, t) = ticket(
        &app,
        tickets.last().unwrap(),
        &visitor(&format!("o-{}", n - 1)),
    )
    .await;
    assert_eq!(t["state"], "waiting", "{t}");
    let _: Option<String> = con.get("nothing").await.unwrap();
}

#[tokio::test]
async fn a_gateway_killed_while_admitting_is_taken_over_and_no_ticket_is_admitted_twice() {
    let iso = Isolation::new();
    let mut a = GatewayProcess::start(&iso, REDIS_URL, &[]).await;
    let api_a = crate::helpers::Api::new(a.base.clone());
    let r = declare_queued(
        &api_a,
        "q-kill",
        10_000,
        json!({"admit_per_second": 50}),
        json!({}),
    )
    .await;
    assert_eq!(r.status(), 201);
    let n = 400;
    join_many(&api_a, "q-kill", "k", n, 50).await;
    let probe = crate::helpers::Probe::new(&iso.database_url, REDIS_URL, &iso.prefix).await;
    wait_for(LONG, || async { counts(&probe, "q-kill").await.1 >= 20 }).await;
    let fence_a = qfield(&probe, "q-kill", "fence").await;
    assert_eq!(fence_a.as_deref(), Some("1"), "gateway A admits");
    let b = GatewayProcess::start(&iso, REDIS_URL, &[]).await;
    a.sigkill().await;
    let (_, at_kill) = counts(&probe, "q-kill").await;
    assert!(at_kill < n as i64, "A was still admitting when killed");
    wait_for(LONG, || async { counts(&probe, "q-kill").await.0 == 0 }).await;
    assert_eq!(
        qfield(&probe, "q-kill", "fence").await.as_deref(),
        Some("2"),
        "B took the lease with the next fence"
    );
    let adm = admitted(&probe, "q-kill").await;
    assert_eq!(adm.len(), n);
    let total: i64 = qfield(&probe, "q-kill", "admitted_total")
        .await
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        total, n as i64,
        "as many admissions as tickets: none admitted twice"
    );
    drop(b);
}

/// Issue 37.6: an admission token's `exp` is fixed when it is minted. Shortening
/// `admission_ttl_seconds` afterwards neither expires a ticket admitted before (which would
/// then read `admitted` again once the ttl grew back) nor lengthening it extends one.
#[tokio::test]
async fn an_admissions_expiry_is_fixed_when_minted_whatever_the_ttl_becomes() {
    let app = spawn_app().await;
    let sku = "q-ttl";
    let q = |ttl: i64| json!({"admit_per_second": 50, "admission_ttl_seconds": ttl});
    assert_eq!(
        declare_queued(&app, sku, 5, q(600), json!({}))
            .await
            .status(),
        201
    );
    let (_, t) = join_retrying(&app, sku, &visitor("t")).await;
    let id = t["ticket_id"].as_str().unwrap().to_string();
    let first = until(LONG, || {
        let (api, id) = (app.clone(), id.clone());
        async move {
            let (_, t) = ticket(&api, &id, &visitor("t")).await;
            (t["state"] == "admitted").then_some(t)
        }
    })
    .await;
    let expires = first["admission_expires_at"].clone();
    let adm_ms = admitted(&app.probe, sku).await[0].1;
    for ttl in [10, 3600] {
        assert_eq!(
            declare_queued(&app, sku, 5, q(ttl), json!({}))
                .await
                .status(),
            200
        );
        let want = (ttl * 1000).to_string();
        wait_for(LONG, || async {
            qfield(&app.probe, sku, "ttl_ms").await.as_deref() == Some(want.as_str())
        })
        .await;
        // Past where a 10 s ttl from the admission would end, on Redis's clock.
        wait_for(LONG, || async {
            let mut con = app.probe.redis.clone();
            let t: (i64, i64) = redis::cmd("TIME").query_async(&mut con).await.unwrap();
            t.0 * 1000 + t.1 / 1000 > adm_ms + 10_500
        })
        .await;
        let (s, t) = ticket(&app, &id, &visitor("t")).await;
        assert_eq!(s, 200);
        assert_eq!(t["state"], "admitted", "ttl {ttl}: {t}");
        assert_eq!(t["admission_expires_at"], expires, "ttl {ttl}: {t}");
        assert_eq!(t["admission_token"], first["admission_token"], "ttl {ttl}");
    }
    // The expiry Redis keeps for the ticket is the one minted.
    let k = qkeys(&app.probe, sku);
    let mut r = app.probe.redis.clone();
    let tid = uuid::Uuid::parse_str(&id).unwrap();
    let exp: Option<i64> = r.hget(&k[7], tid.as_bytes().as_slice()).await.unwrap();
    assert_eq!(exp, Some(adm_ms + 600_000));
}
