//! A reading the view answers unfenced (Redis moved under each of its tries) still counts
//! each unit once when a journal entry moves between its steps: one written after the first
//! Redis reading and before PostgreSQL's snapshot, one written after the snapshot and
//! acknowledged before the second Redis reading. Each move is placed exactly there
//! (`dropgate::books::read_between`).

use std::future::ready;
use std::time::Duration;

use dropgate::books::{read_between, Between, Reading};
use dropgate::store::Store;

use crate::helpers::*;
use crate::view_consistency::{one_call, unacknowledged};

const UNITS: i64 = 500;
/// Units one call decides (crate::view_consistency::one_call).
const CALL: i64 = 128;

fn assert_balanced(r: &Reading) {
    let s = r.sums;
    assert_eq!(
        Some(r.total),
        r.remaining.zip(r.in_flight).map(|(rem, f)| rem
            + f
            + s.recorded
            + s.pending
            + s.quarantined),
        "each unit counted once: {r:?}"
    );
}

async fn reading_store(app: &TestApp) -> Store {
    Store::connect(REDIS_URL, &app.probe.prefix, Duration::from_secs(2))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_written_between_the_first_redis_reading_and_the_snapshot_counts_once() {
    let app = spawn_app().await;
    assert_eq!(app.declare("late", UNITS, 1).await.status(), 201);
    let layout = dropgate::catalog::fetch(&app.db, sku_id("late"))
        .await
        .unwrap()
        .unwrap()
        .layout;
    // The writer commits its rows, then raises the SKU's mark in `skus` before it
    // acknowledges: holding the SKU's row stops it right between the two.
    let mut hold = app.db.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM skus WHERE sku = 'late' FOR NO KEY UPDATE")
        .execute(&mut *hold)
        .await
        .unwrap();
    let store = reading_store(&app).await;
    let probe = &app.probe;
    let decided_and_written = async {
        one_call(probe, "late").await;
        wait_for(Duration::from_secs(30), || async {
            probe.issued_ids("late").await.len() == CALL as usize
        })
        .await;
    };
    let r = read_between(
        &store,
        &app.db,
        sku_id("late"),
        layout,
        Between {
            before_snapshot: decided_and_written,
            before_second: ready(()),
        },
    )
    .await
    .unwrap();
    assert_eq!(
        unacknowledged(probe, "late").await,
        1,
        "written, not acknowledged"
    );
    // A new entry moved Redis, but no acknowledgement did: the reading is exact (fenced by
    // the acknowledgements, src/books.rs).
    assert!(r.fenced, "no acknowledgement moved Redis: {r:?}");
    assert_eq!(r.sums.recorded, CALL, "{r:?}");
    assert_eq!(r.in_flight, Some(0), "in the ledger already: {r:?}");
    assert_balanced(&r);
    hold.rollback().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_written_after_the_snapshot_and_acknowledged_before_the_second_redis_reading_counts_once(
) {
    let app = spawn_app().await;
    assert_eq!(app.declare("early", UNITS, 1).await.status(), 201);
    let layout = dropgate::catalog::fetch(&app.db, sku_id("early"))
        .await
        .unwrap()
        .unwrap()
        .layout;
    // The writer's insert waits while `issuances` is locked in SHARE mode; reads go on.
    let mut lock = app.db.begin().await.unwrap();
    sqlx::query("LOCK TABLE issuances IN SHARE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();
    one_call(&app.probe, "early").await;
    let store = reading_store(&app).await;
    let probe = &app.probe;
    let written_and_acknowledged = async move {
        lock.rollback().await.unwrap();
        wait_for(Duration::from_secs(30), || async {
            probe.issued_ids("early").await.len() == CALL as usize
                && unacknowledged(probe, "early").await == 0
        })
        .await;
    };
    let r = read_between(
        &store,
        &app.db,
        sku_id("early"),
        layout,
        Between {
            before_snapshot: ready(()),
            before_second: written_and_acknowledged,
        },
    )
    .await
    .unwrap();
    assert!(!r.fenced, "an acknowledgement moved Redis: {r:?}");
    assert_eq!(
        r.sums.recorded, 0,
        "the snapshot came before the write: {r:?}"
    );
    assert_eq!(
        r.in_flight,
        Some(CALL),
        "decided, not in the snapshot: {r:?}"
    );
    assert_eq!(r.unwritten_entries, Some(1), "{r:?}");
    assert_balanced(&r);
}
