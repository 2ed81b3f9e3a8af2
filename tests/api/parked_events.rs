//! Events of claims PostgreSQL refused for a while (parked in `persistence_pending`): the
//! stream folded per claim equals `issuances`. A parked hold is announced as it won (`held`),
//! then each change it went through while parked (confirmed, cancelled, expired), then its
//! compensation if it comes to that: in order, each once.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::json;
use uuid::Uuid;

use crate::durability::install_trigger;
use crate::helpers::*;
use crate::lifecycle::{claim_id, claim_one, declare_with, get_as, post_as, settled};
use crate::outbox::{check_once_in_order, stream_events, stream_len, unsent};
use crate::services::PrivateNats;

/// (claim, status) of every `issuances` row.
async fn ledger(db: &sqlx::PgPool) -> HashMap<Uuid, String> {
    sqlx::query_as::<_, (Uuid, String)>("SELECT claim_id, status FROM issuances")
        .fetch_all(db)
        .await
        .unwrap()
        .into_iter()
        .collect()
}

async fn parked(db: &sqlx::PgPool) -> HashMap<Uuid, (String, String)> {
    sqlx::query_as::<_, (Uuid, String, String)>(
        "SELECT claim_id, status, claim_status FROM persistence_pending",
    )
    .fetch_all(db)
    .await
    .unwrap()
    .into_iter()
    .map(|(c, s, cs)| (c, (s, cs)))
    .collect()
}

/// Waits until JetStream holds every event of the outbox, then checks that each event came
/// once and in its claim's order, and that the stream folded per claim (the status of its
/// last event) is `issuances`. Returns (type, status) of each claim's events.
async fn folded_stream_is_the_ledger(
    nats: &PrivateNats,
    db: &sqlx::PgPool,
) -> HashMap<Uuid, Vec<(String, String)>> {
    let total: i64 = sqlx::query_scalar("SELECT count(*) FROM claim_events")
        .fetch_one(db)
        .await
        .unwrap();
    wait_for(Duration::from_secs(30), || async {
        unsent(db).await == 0 && stream_len(nats).await >= total as u64
    })
    .await;
    let events = stream_events(nats).await;
    assert_eq!(events.len() as i64, total);
    let per_claim: HashMap<Uuid, Vec<(String, String)>> = check_once_in_order(&events)
        .into_iter()
        .map(|(c, list)| {
            let pairs = list
                .iter()
                .map(|b| {
                    let s = |k: &str| b[k].as_str().unwrap().to_string();
                    (s("type"), s("status"))
                })
                .collect();
            (c, pairs)
        })
        .collect();
    let rows = ledger(db).await;
    for (claim, status) in &rows {
        let last = per_claim.get(claim).and_then(|l| l.last());
        assert_eq!(
            last.map(|l| l.1.as_str()),
            Some(status.as_str()),
            "claim {claim}: stream {:?}, ledger {status}",
            per_claim.get(claim)
        );
    }
    assert_eq!(
        per_claim.len(),
        rows.len(),
        "every event's claim is in issuances"
    );
    per_claim
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_that_changed_while_parked_publish_their_win_as_held_then_each_change() {
    let nats = PrivateNats::start().await;
    let app = spawn_app_with(|c| {
        c.nats_url = Some(nats.url());
        c.reprocess_max_attempts = "100".into();
    })
    .await;
    // Refuses `bad-*` buyers until the fault is cleared.
    install_trigger(&app.db).await;
    let r = declare_with(&app, "long", json!({"total": 5, "hold_seconds": 600})).await;
    assert_eq!(r.status(), 201);
    let r = declare_with(&app, "short", json!({"total": 1, "hold_seconds": 2})).await;
    assert_eq!(r.status(), 201);

    let mut id = HashMap::new();
    for (sku, user) in [
        ("long", "bad-c"),
        ("long", "bad-f"),
        ("long", "bad-h"),
        ("long", "good-g"),
        ("short", "bad-x"),
    ] {
        let (s, body) = claim_one(&app, sku, user).await;
        assert_eq!((s, body["status"].as_str()), (201, Some("held")), "{body}");
        id.insert(user, claim_id(&body).parse::<Uuid>().unwrap());
    }
    // A waiter on the sold-out SKU: the unit bad-x's expiry gives back is offered to it, and
    // the offer (a held claim of its own, parked too) lapses in turn.
    let (s, body) = post_as(&app, "/v1/skus/short/waitlist", &token("bad-w")).await;
    assert_eq!(s, 201, "{body}");
    id.insert("bad-w", body["entry_id"].as_str().unwrap().parse().unwrap());
    wait_for(Duration::from_secs(20), || async {
        parked(&app.db).await.len() >= 4
    })
    .await;

    let (s, body) = post_as(
        &app,
        &format!("/v1/claims/{}/cancel", id["bad-c"]),
        &token("bad-c"),
    )
    .await;
    assert_eq!(
        (s, body["status"].as_str()),
        (200, Some("cancelled")),
        "{body}"
    );
    let (s, body) = post_as(
        &app,
        &format!("/v1/claims/{}/confirm", id["bad-f"]),
        &token("bad-f"),
    )
    .await;
    assert_eq!(
        (s, body["status"].as_str()),
        (200, Some("confirmed")),
        "{body}"
    );
    // Every change is recorded with its parked claim before PostgreSQL takes them.
    let want: HashMap<Uuid, (String, String)> = [
        ("bad-c", "cancelled"),
        ("bad-f", "confirmed"),
        ("bad-h", "held"),
        ("bad-x", "expired"),
        ("bad-w", "expired"),
    ]
    .into_iter()
    .map(|(u, cs)| (id[u], ("pending".to_string(), cs.to_string())))
    .collect();
    wait_for(Duration::from_secs(20), || async {
        let now = parked(&app.db).await;
        now.iter().all(|(c, (_, cs))| want[c].1 == *cs) && now.len() == 5
    })
    .await;

    sqlx::query("UPDATE test_fault SET refuse = false")
        .execute(&app.db)
        .await
        .unwrap();
    // The view's `pending` leaves out parked holds that ended: wait for the rows themselves.
    wait_for(Duration::from_secs(30), || async {
        parked(&app.db).await.values().all(|p| p.0 == "resolved")
    })
    .await;
    for sku in ["long", "short"] {
        let v = settled(&app, &app.probe, sku).await;
        assert_eq!(v["consistent"], true, "{v}");
    }
    let rows = ledger(&app.db).await;
    let expect = [
        ("bad-c", "cancelled"),
        ("bad-f", "confirmed"),
        ("bad-h", "held"),
        ("good-g", "held"),
        ("bad-x", "expired"),
        ("bad-w", "expired"),
    ];
    for (u, status) in expect {
        assert_eq!(rows[&id[u]], status, "{u}: {rows:?}");
        let (s, body) = get_as(&app, &format!("/v1/claims/{}", id[u]), ADMIN).await;
        assert_eq!(
            (s, body["status"].as_str()),
            (200, Some(status)),
            "{u}: {body}"
        );
    }

    let per_claim = folded_stream_is_the_ledger(&nats, &app.db).await;
    let won = ("claim.won", "held");
    assert_eq!(
        per_claim[&id["bad-c"]],
        pairs(&[won, ("claim.cancelled", "cancelled")])
    );
    assert_eq!(
        per_claim[&id["bad-f"]],
        pairs(&[won, ("claim.confirmed", "confirmed")])
    );
    assert_eq!(per_claim[&id["bad-h"]], pairs(&[won]));
    assert_eq!(per_claim[&id["good-g"]], pairs(&[won]));
    assert_eq!(
        per_claim[&id["bad-x"]],
        pairs(&[won, ("claim.expired", "expired")])
    );
    assert_eq!(
        per_claim[&id["bad-w"]],
        pairs(&[("waitlist.offered", "held"), ("claim.expired", "expired")])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_compensated_after_a_change_while_parked_publish_the_change_before_the_compensation()
{
    let nats = PrivateNats::start().await;
    // Three attempts, 1 s apart and more: time to confirm and cancel while parked.
    let app = spawn_app_with(|c| {
        c.nats_url = Some(nats.url());
        c.reprocess_max_attempts = "3".into();
        c.reprocess_backoff_ms = "1000".into();
    })
    .await;
    // `never-*` buyers are refused for good; their compensated rows are taken.
    sqlx::raw_sql(
        r#"CREATE FUNCTION test_refuse_never() RETURNS trigger AS $$
           BEGIN
             IF NEW.user_id LIKE 'never-%' AND NEW.status <> 'compensated' THEN
               RAISE EXCEPTION 'test trigger refuses %', NEW.user_id;
             END IF;
             RETURN NEW;
           END $$ LANGUAGE plpgsql;
           CREATE TRIGGER test_refuse_never BEFORE INSERT ON issuances
             FOR EACH ROW EXECUTE FUNCTION test_refuse_never();"#,
    )
    .execute(&app.db)
    .await
    .unwrap();
    let r = declare_with(&app, "gone", json!({"total": 5, "hold_seconds": 600})).await;
    assert_eq!(r.status(), 201);
    let mut id = HashMap::new();
    for user in ["never-c", "never-f", "never-h"] {
        let (s, body) = claim_one(&app, "gone", user).await;
        assert_eq!(s, 201, "{body}");
        id.insert(user, claim_id(&body).parse::<Uuid>().unwrap());
    }
    wait_for(Duration::from_secs(20), || async {
        parked(&app.db).await.len() == 3
    })
    .await;
    let (s, _) = post_as(
        &app,
        &format!("/v1/claims/{}/cancel", id["never-c"]),
        &token("never-c"),
    )
    .await;
    assert_eq!(s, 200);
    let (s, _) = post_as(
        &app,
        &format!("/v1/claims/{}/confirm", id["never-f"]),
        &token("never-f"),
    )
    .await;
    assert_eq!(s, 200);

    wait_for(Duration::from_secs(30), || async {
        parked(&app.db).await.values().all(|p| p.0 == "compensated")
    })
    .await;
    let v = settled(&app, &app.probe, "gone").await;
    assert_eq!(v["consistent"], true, "{v}");
    assert_eq!(v["remaining"], 5, "{v}");
    let rows = ledger(&app.db).await;
    for u in ["never-c", "never-f", "never-h"] {
        assert_eq!(rows[&id[u]], "compensated", "{u}");
        let (s, body) = get_as(&app, &format!("/v1/claims/{}", id[u]), ADMIN).await;
        assert_eq!(
            (s, body["status"].as_str()),
            (200, Some("compensated")),
            "{body}"
        );
    }

    let per_claim = folded_stream_is_the_ledger(&nats, &app.db).await;
    let (won, comp) = (("claim.won", "held"), ("claim.compensated", "compensated"));
    assert_eq!(
        per_claim[&id["never-c"]],
        pairs(&[won, ("claim.cancelled", "cancelled"), comp])
    );
    assert_eq!(
        per_claim[&id["never-f"]],
        pairs(&[won, ("claim.confirmed", "confirmed"), comp])
    );
    assert_eq!(per_claim[&id["never-h"]], pairs(&[won, comp]));
}
