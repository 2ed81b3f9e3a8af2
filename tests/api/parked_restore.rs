//! A restore that meets a compensation half done: the ledger decided it (the claim's
//! `issuances` row `compensated`), Redis gave the units back, and then lost that give-back and
//! its marker (a rollback) while the reprocessor was still closing the parked row. The units
//! come back exactly once whichever way the two meet (I1, I2).

use std::time::Duration;

use serde_json::json;
use uuid::Uuid;

use crate::durability::install_trigger;
use crate::gate::RowGate;
use crate::helpers::*;
use crate::lifecycle::{claim_id, claim_one, declare_with, get_as, post_as};
use crate::parked_holds::{
    balanced, gateway, join, keep_parked_rows_open, let_parked_rows_close, lose_marker,
    wait_compensated, wait_marker,
};

/// The advisory lock the test holds to keep the reprocessor's closing transaction waiting.
const CLOSE_GATE: i64 = 220_305_889;

/// `issuances` refuses the `bad-` buyers' live rows, not their compensated ones: the ledger
/// records each compensation's decision.
pub(crate) async fn refuse_all_but_compensations(db: &sqlx::PgPool) {
    install_trigger(db).await;
    sqlx::raw_sql(
        "CREATE OR REPLACE FUNCTION test_refuse() RETURNS trigger AS $$
         BEGIN
           IF NEW.user_id LIKE 'bad-%' AND NEW.status <> 'compensated' THEN
             RAISE EXCEPTION 'test trigger refuses %', NEW.user_id;
           END IF;
           RETURN NEW;
         END $$ LANGUAGE plpgsql;",
    )
    .execute(db)
    .await
    .unwrap();
}

/// Found by reading the restore against the reprocessor's order (give back, then close the
/// row) after the soak's fenced reading `m1` -6: a restore that counted such a claim live left
/// its units to a give-back that had already happened, and the SKU short of them for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_between_a_give_back_redis_lost_and_its_row_closing_counts_the_units_back_once() {
    let iso = Isolation::new();
    let app = gateway(&iso, "1").await;
    refuse_all_but_compensations(&app.db).await;
    // The transaction that closes a parked row as compensated waits at the gate.
    let gate = RowGate::close(
        &app.db,
        "test_close_gate",
        "BEFORE UPDATE ON persistence_pending",
        "NEW.status = 'compensated'",
        CLOSE_GATE,
    )
    .await;
    let r = declare_with(&app, "gap", json!({"total": 3})).await;
    assert_eq!(r.status(), 201);
    let (s, body) = claim_one(&app, "gap", "bad-a").await;
    assert_eq!(s, 201, "{body}");
    let claim: Uuid = claim_id(&body).parse().unwrap();
    // Decided in the ledger and given back in Redis; the row's closing waits at the gate.
    wait_marker(&app.probe, "gap", claim, "compensated").await;
    // Redis loses the give-back and its marker, and the SKU is restored from the ledger while
    // the parked row is still open.
    lose_marker(&app.probe, "gap", claim).await;
    let r = app.restore("gap", true).await;
    assert_eq!(r.status(), 200);
    // The reprocessor, whose give-back came back done, closes the row and gives nothing more.
    gate.open().await;
    wait_compensated(&app.db, claim).await;
    balanced(&app, "gap", 3).await;
    let (s, body) = claim_one(&app, "gap", "good-b").await;
    assert_eq!(s, 201, "the unit is on sale again: {body}");
}

/// A parked offer whose compensation the ledger decided, and whose give-back Redis lost: the
/// restore counts its unit back itself, so no give-back is left to end its entry. The entry
/// ends all the same, in Redis at the restore and in the ledger when the row closes (the first
/// version of this restore left it `offered` for good: soak MODEL_SEED=16320782953182393574).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offer_whose_give_back_redis_lost_ends_its_entry_when_a_restore_counts_its_unit_back() {
    let iso = Isolation::new();
    let app = gateway(&iso, "1").await;
    refuse_all_but_compensations(&app.db).await;
    keep_parked_rows_open(&app.db).await;
    let terms = json!({"total": 1, "hold_seconds": 600, "offer_seconds": 600});
    assert_eq!(declare_with(&app, "off", terms).await.status(), 201);
    let (_, body) = claim_one(&app, "off", "good-a").await;
    let held = claim_id(&body);
    let (s, entry) = join(&app, "off", "bad-w").await;
    assert_eq!(s, 201, "{entry}");
    let offer: Uuid = entry["entry_id"].as_str().unwrap().parse().unwrap();
    let (s, _) = post_as(&app, &format!("/v1/claims/{held}/cancel"), &token("good-a")).await;
    assert_eq!(s, 200);
    // The offer is parked, its compensation decided and given back; its row stays open.
    wait_marker(&app.probe, "off", offer, "compensated").await;
    // Redis loses the give-back, its marker and the entry's end it journaled: the ledger's
    // entry reads `offered` as it did before the writer wrote that end.
    let entry_status = || async {
        sqlx::query_scalar::<_, String>("SELECT status FROM waitlist WHERE entry_id = $1")
            .bind(offer)
            .fetch_one(&app.db)
            .await
            .unwrap()
    };
    wait_for(Duration::from_secs(10), || async {
        entry_status().await == "expired"
    })
    .await;
    sqlx::query("UPDATE waitlist SET status = 'offered' WHERE entry_id = $1")
        .bind(offer)
        .execute(&app.db)
        .await
        .unwrap();
    lose_marker(&app.probe, "off", offer).await;
    assert_eq!(app.restore("off", true).await.status(), 200);
    assert_eq!(
        app.stock("off").await,
        Some(1),
        "the offer's unit is back once"
    );
    let (s, body) = get_as(&app, &format!("/v1/claims/{offer}"), &token("bad-w")).await;
    assert_eq!(
        (s, body["status"].as_str()),
        (200, Some("compensated")),
        "{body}"
    );

    let_parked_rows_close(&app.db).await;
    wait_compensated(&app.db, offer).await;
    assert_eq!(
        entry_status().await,
        "expired",
        "the offer's entry ended with its hold"
    );
    let (s, e) = get_as(&app, &format!("/v1/waitlist/{offer}"), &token("bad-w")).await;
    assert_eq!((s, e["status"].as_str()), (200, Some("expired")), "{e}");
    balanced(&app, "off", 1).await;
    let (s, again) = claim_one(&app, "off", "good-b").await;
    assert_eq!(s, 201, "the unit is on sale again: {again}");
}
