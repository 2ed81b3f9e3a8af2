//! The end of the sale window in the waiting room: at `closes_at`, on Redis's clock as the
//! claim script reads it, admission stops, the line reads `closed` and joins are refused.

use redis::AsyncCommands;
use serde_json::json;

use super::{counts, declare_queued, join, join_all, qfield, qkeys, ticket, until, visitor, LONG};
use crate::helpers::{spawn_app, wait_for, Probe};

/// The `last_ms` of the admission schedule: every round (admitting or idle) writes it.
async fn last_round(probe: &Probe, sku: &str) -> i64 {
    qfield(probe, sku, "last_ms")
        .await
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_closes_at_nobody_is_admitted_the_line_reads_closed_and_joins_are_refused() {
    let app = spawn_app().await;
    let sku = "q-close";
    // One admission a second: most of the line is still waiting when the window closes.
    let closes = chrono::Utc::now() + chrono::Duration::seconds(4);
    let r = declare_queued(
        &app,
        sku,
        100,
        json!({"admit_per_second": 1, "admission_ttl_seconds": 600}),
        json!({"closes_at": closes.to_rfc3339()}),
    )
    .await;
    assert_eq!(r.status(), 201);
    let n = 12;
    let ids = join_all(&app, sku, "c", n).await;
    let mut r = app.probe.redis.clone();
    let closes_ms: i64 = r
        .hget(&qkeys(&app.probe, sku)[3], "closes_ms")
        .await
        .unwrap();
    assert!(closes_ms > 0);
    // A round ran at or after closes_ms (Redis's clock), then another: nothing between them.
    let after = until(LONG, || async {
        let last = last_round(&app.probe, sku).await;
        (last >= closes_ms).then_some(last)
    })
    .await;
    let (line, adm) = counts(&app.probe, sku).await;
    let total = qfield(&app.probe, sku, "admitted_total").await;
    assert!(line > 0, "the line was still waiting at the close");
    assert_eq!(line + adm, n as i64);
    wait_for(LONG, || async {
        last_round(&app.probe, sku).await > after + 1000
    })
    .await;
    assert_eq!(
        counts(&app.probe, sku).await,
        (line, adm),
        "admitted after closes_at"
    );
    assert_eq!(qfield(&app.probe, sku, "admitted_total").await, total);
    // Whoever is still in line reads closed, with no position and no token.
    let mut closed = 0;
    for (i, id) in ids.iter().enumerate() {
        let (s, b) = ticket(&app, id, &visitor(&format!("c-{i}"))).await;
        assert_eq!(s, 200, "{b}");
        if b["state"] != "admitted" {
            assert_eq!(b["state"], "closed", "{b}");
            assert!(
                b["position"].is_null() && b["admission_token"].is_null(),
                "{b}"
            );
            closed += 1;
        }
    }
    assert_eq!(closed, line);
    // A new visitor is refused, and joins nothing.
    let (s, b) = join(&app, sku, &visitor("late")).await;
    assert_eq!((s, b["code"].as_str()), (409, Some("closed")), "{b}");
    assert_eq!(counts(&app.probe, sku).await, (line, adm));
}
