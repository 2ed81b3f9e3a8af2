//! The relay's cursor over the writer's `issuances` rows (src/outbox/cursor.rs): a claim.won
//! whose transaction has the smaller id but commits last is still published; the cursor never
//! moves back; a claim's later event waits for the cursor to pass its creation.

use std::time::Duration;

use serde_json::Value;
use uuid::Uuid;

use crate::helpers::*;
use crate::outbox::{stream_events, stream_len};
use crate::services::PrivateNats;
use dropgate::outbox::cursor::{self, Position};
use dropgate::outbox::{record, store, EventKind, NewEvent};
use dropgate::writer::{write_batch, Winner};

fn winner(sku: &str, user: &str) -> Winner {
    Winner {
        entry_id: "1-0".into(),
        claim_id: Uuid::now_v7(),
        sku: sku.into(),
        user: user.into(),
        quantity: 1,
        idempotency_key: None,
        remaining_after: Some(1),
        created_ms: dropgate::clock::now_ms(),
        seq: 1,
        expires_ms: None,
        offer: false,
        seats: None,
    }
}

/// An `outbox` row (a reprocessor's creation event) of a claim of its own, committed now.
async fn outbox_event(db: &sqlx::PgPool, sku: &str) -> Uuid {
    let claim = Uuid::now_v7();
    let mut c = db.acquire().await.unwrap();
    let event = NewEvent {
        kind: EventKind::Won,
        seq: 1,
        claim_id: claim,
        sku,
        user: "marker",
        quantity: 1,
        status: "issued".parse().unwrap(),
        occurred_at: None,
    };
    record(&mut c, &event).await.unwrap();
    claim
}

fn claims_on(events: &[crate::outbox::StreamEvent]) -> Vec<Uuid> {
    events
        .iter()
        .map(|e| e.body["claim_id"].as_str().unwrap().parse().unwrap())
        .collect()
}

async fn published(nats: &PrivateNats, claim: Uuid) -> bool {
    stream_len(nats).await > 0 && claims_on(&stream_events(nats).await).contains(&claim)
}

/// Transaction A takes its id first and inserts its claim as the writer does, but commits only
/// after transaction B (the real writer) has committed its claim and the relay has run whole
/// rounds over it. A relay that moved its cursor over B would never publish A.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_won_whose_smaller_xid_commits_last_is_published_not_skipped() {
    let nats = PrivateNats::start().await;
    let app = spawn_app_with(|c| c.nats_url = Some(nats.url())).await;

    let mut a = app.db.begin().await.unwrap();
    let a_xid: i64 = sqlx::query_scalar("SELECT pg_current_xact_id()::text::int8")
        .fetch_one(&mut *a)
        .await
        .unwrap();
    let a_claim = Uuid::now_v7();
    sqlx::query(
        "INSERT INTO issuances (claim_id, sku, user_id, quantity, created_at, status, won_xid)
         VALUES ($1, 'xid', 'first', 1, now(), 'issued', pg_current_xact_id())",
    )
    .bind(a_claim)
    .execute(&mut *a)
    .await
    .unwrap();

    let b = winner("xid", "second");
    assert!(
        write_batch(&app.db, std::slice::from_ref(&b), Duration::from_secs(1))
            .await
            .unwrap()
            .is_empty()
    );
    let b_xid: i64 =
        sqlx::query_scalar("SELECT won_xid::text::int8 FROM issuances WHERE claim_id = $1")
            .bind(b.claim_id)
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert!(a_xid < b_xid, "A must hold the smaller transaction id");

    // Two marker events, each written once the one before is on the stream: the round that
    // publishes the second one began after B committed, so its cursor step has seen B.
    for _ in 0..2 {
        let marker = outbox_event(&app.db, "marker").await;
        wait_for(Duration::from_secs(30), || published(&nats, marker)).await;
    }
    assert!(
        !published(&nats, b.claim_id).await,
        "B was published while A, below it, could still commit"
    );
    let cursor: (i64, Uuid) =
        sqlx::query_as("SELECT won_xid::text::int8, claim_id FROM outbox_cursor")
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert!(cursor.0 < a_xid, "the cursor passed A: {cursor:?}");

    a.commit().await.unwrap();
    wait_for(Duration::from_secs(30), || published(&nats, b.claim_id)).await;
    let events = stream_events(&nats).await;
    let order = claims_on(&events);
    let at = |c: Uuid| order.iter().position(|x| *x == c);
    assert!(at(a_claim).is_some(), "A's claim.won was skipped");
    assert!(
        at(a_claim) < at(b.claim_id),
        "published in the cursor's order"
    );
    let a_event: &Value = &events[at(a_claim).unwrap()].body;
    assert_eq!(a_event["type"], "claim.won");
    assert_eq!(a_event["id"], format!("{a_claim}:1"));
    wait_for(Duration::from_secs(10), || async {
        crate::outbox::unsent(&app.db).await == 0
    })
    .await;
}

/// The cursor moves forward only (a relay that lost the lead and acknowledges late cannot send
/// it back), and a claim's later `outbox` event is taken only once the cursor passed its
/// creation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claims_later_event_waits_for_the_cursor_and_the_cursor_never_moves_back() {
    // No NATS: the gateway's relay only counts, so the test drives the relay's steps.
    let app = spawn_app().await;
    let w = winner("gate", "u");
    write_batch(&app.db, std::slice::from_ref(&w), Duration::from_secs(1))
        .await
        .unwrap();
    let mut c = app.db.acquire().await.unwrap();
    let end = NewEvent {
        kind: EventKind::Cancelled,
        seq: 2,
        claim_id: w.claim_id,
        sku: "gate",
        user: "u",
        quantity: 1,
        status: "cancelled".parse().unwrap(),
        occurred_at: None,
    };
    record(&mut c, &end).await.unwrap();
    drop(c);

    // Settled once every older transaction of the cluster has ended (other tests' included).
    wait_for(Duration::from_secs(30), || async {
        cursor::take(&app.db, 10).await.unwrap()[0].settled
    })
    .await;
    let won = cursor::take(&app.db, 10).await.unwrap();
    assert_eq!(won.len(), 1);
    assert_eq!(won[0].event.event_id(), format!("{}:1", w.claim_id));
    assert_eq!(won[0].event.event, "claim.won");
    assert_eq!(won[0].event.status.as_str(), "issued");
    // Its creation is not published yet: the cancellation waits.
    assert!(store::take(&app.db, 10, 0).await.unwrap().is_empty());

    let at = won[0].at;
    cursor::advance(&app.db, at).await.unwrap();
    let taken = store::take(&app.db, 10, 0).await.unwrap();
    assert_eq!(taken.iter().map(|r| r.seq).collect::<Vec<_>>(), [2]);
    assert!(cursor::take(&app.db, 10).await.unwrap().is_empty());

    // A late relay's older position leaves the cursor where it is.
    let behind = Position {
        xid: at.xid - 1,
        claim_id: Uuid::max(),
    };
    cursor::advance(&app.db, behind).await.unwrap();
    let now: (i64, Uuid) =
        sqlx::query_as("SELECT won_xid::text::int8, claim_id FROM outbox_cursor")
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(now, (at.xid, at.claim_id));
    assert!(cursor::take(&app.db, 10).await.unwrap().is_empty());
    assert_eq!(cursor::backlog(&app.db, 100).await.unwrap().0, 0);
}

/// The backlog gauge counts each kind of waiting event up to its cap (every gateway counts each
/// second, and an outage makes the backlog every claim since), and still ages the oldest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backlog_is_counted_up_to_its_cap_and_still_ages_the_oldest_event() {
    // No NATS: nothing is published, so everything written stays past the cursor.
    let app = spawn_app().await;
    let mut winners: Vec<Winner> = (0..5).map(|i| winner("cap", &format!("u{i}"))).collect();
    winners[0].created_ms -= 60_000;
    write_batch(&app.db, &winners, Duration::from_secs(1))
        .await
        .unwrap();
    for _ in 0..4 {
        outbox_event(&app.db, "cap").await;
    }
    sqlx::query("UPDATE outbox SET created_at = created_at - interval '90 seconds'")
        .execute(&app.db)
        .await
        .unwrap();

    let (all, age) = cursor::backlog(&app.db, 100).await.unwrap();
    assert_eq!(all, 5);
    assert!(age.unwrap() >= 59.0, "oldest creation event aged {age:?}");
    let (capped, capped_age) = cursor::backlog(&app.db, 3).await.unwrap();
    assert_eq!(capped, 3);
    assert!(
        capped_age.unwrap() >= 59.0,
        "oldest of the capped count aged {capped_age:?}"
    );

    let (rows, row_age) = store::backlog(&app.db, 100).await.unwrap();
    assert_eq!(rows, 4);
    assert!(
        row_age.unwrap() >= 89.0,
        "oldest outbox row aged {row_age:?}"
    );
    assert_eq!(store::backlog(&app.db, 2).await.unwrap().0, 2);
    // Nothing was sent or moved by counting.
    assert_eq!(cursor::backlog(&app.db, 100).await.unwrap().0, 5);
    assert_eq!(store::backlog(&app.db, 100).await.unwrap().0, 4);
}
