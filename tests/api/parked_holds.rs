//! Holds and offers PostgreSQL refused (parked in `persistence_pending`) meet the lifecycle and
//! restore: whatever ended them (a cancel, a lapse, the compensation) and whatever a restore
//! rebuilt in between, their units come back exactly once (I1, I4), an offer's entry ends with
//! its hold, and a retry under a key that won replays its first answer after a restore too.
//!
//! Found by the gateway model with restores and rollbacks on (docs/testing.md): h0's Redis
//! stock 2 above the ledger's once quiet, and an entry left `offered` for good.

use std::time::Duration;

use serde_json::{json, Value};
use uuid::Uuid;

use crate::durability::install_trigger;
use crate::helpers::*;
use crate::lifecycle::{claim_id, claim_one, declare_with, get_as, post_as, settled};

/// A gateway on `iso`'s database and prefix that compensates a parked claim after `attempts`.
pub(crate) async fn gateway(iso: &Isolation, attempts: &str) -> TestApp {
    let mut raw = iso.raw_config(REDIS_URL);
    raw.reprocess_max_attempts = attempts.into();
    spawn_with_config(raw).await
}

pub(crate) async fn join(api: &Api, sku: &str, user: &str) -> (u16, Value) {
    post_as(api, &format!("/v1/skus/{sku}/waitlist"), &token(user)).await
}

/// (status, claim_status) of a parked claim, once it is parked.
async fn parked(db: &sqlx::PgPool, claim: Uuid) -> Option<(String, String)> {
    sqlx::query_as("SELECT status, claim_status FROM persistence_pending WHERE claim_id = $1")
        .bind(claim)
        .fetch_optional(db)
        .await
        .unwrap()
}

async fn wait_parked(db: &sqlx::PgPool, claim: Uuid, claim_status: &str) {
    wait_for(Duration::from_secs(30), || async {
        parked(db, claim)
            .await
            .is_some_and(|(_, cs)| cs == claim_status)
    })
    .await;
}

pub(crate) async fn wait_compensated(db: &sqlx::PgPool, claim: Uuid) {
    // A reprocessor whose attempt failed takes the row again only once its lease (30 s) ran
    // out: the row may close up to 30 s after the fault is gone, plus a pass.
    wait_for(Duration::from_secs(90), || async {
        parked(db, claim)
            .await
            .is_some_and(|(s, _)| s == "compensated")
    })
    .await;
}

/// Stock + the ledger's live units is the total, and the view balances.
pub(crate) async fn balanced(app: &TestApp, sku: &str, total: i64) {
    let v = settled(app, &app.probe, sku).await;
    let live: i64 = sqlx::query_scalar(
        "SELECT COALESCE(SUM(quantity), 0)::bigint FROM issuances
          WHERE sku = $1 AND status IN ('issued', 'held', 'confirmed')",
    )
    .bind(sku)
    .fetch_one(&app.db)
    .await
    .unwrap();
    let stock = app.stock(sku).await.expect("the SKU's state");
    assert_eq!(
        stock + live,
        total,
        "stock {stock} + live {live} is the total: {v}"
    );
    assert_eq!(v["consistent"], true, "{v}");
}

/// PostgreSQL refuses to close a parked row as compensated: the compensation stays between its
/// give-back and its end until the trigger is dropped ([`let_parked_rows_close`]).
pub(crate) async fn keep_parked_rows_open(db: &sqlx::PgPool) {
    sqlx::raw_sql(
        "CREATE FUNCTION test_keep_open() RETURNS trigger AS $$
         BEGIN RAISE EXCEPTION 'test trigger keeps % open', NEW.claim_id; END $$
         LANGUAGE plpgsql;
         CREATE TRIGGER test_keep_open BEFORE UPDATE ON persistence_pending
           FOR EACH ROW WHEN (NEW.status = 'compensated') EXECUTE FUNCTION test_keep_open();",
    )
    .execute(db)
    .await
    .unwrap();
}

pub(crate) async fn let_parked_rows_close(db: &sqlx::PgPool) {
    sqlx::raw_sql("DROP TRIGGER test_keep_open ON persistence_pending")
        .execute(db)
        .await
        .unwrap();
}

/// Waits until Redis's compensation marker of `claim` on `sku` reads `value`.
pub async fn wait_marker(probe: &Probe, sku: &str, claim: Uuid, value: &str) {
    let marker = format!("{}:{{{sku}}}:comp:{}", probe.prefix, claim.simple());
    wait_for(Duration::from_secs(30), || async {
        let m: Option<String> = redis::cmd("GET")
            .arg(&marker)
            .query_async(&mut probe.redis.clone())
            .await
            .unwrap();
        m.as_deref() == Some(value)
    })
    .await;
}

/// Redis loses the compensation marker of `claim` on `sku` (a rollback, as far as the marker
/// goes).
pub(crate) async fn lose_marker(probe: &Probe, sku: &str, claim: Uuid) {
    let _: () = redis::cmd("DEL")
        .arg(format!(
            "{}:{{{sku}}}:comp:{}",
            probe.prefix,
            claim.simple()
        ))
        .query_async(&mut probe.redis.clone())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_hold_cancelled_before_a_restore_is_compensated_without_giving_its_units_twice() {
    let iso = Isolation::new();
    let first = gateway(&iso, "100").await;
    install_trigger(&first.db).await;
    let r = declare_with(&first, "ph", json!({"total": 3, "hold_seconds": 600})).await;
    assert_eq!(r.status(), 201);
    let (s, body) = claim_one(&first, "ph", "bad-a").await;
    assert_eq!((s, body["status"].as_str()), (201, Some("held")), "{body}");
    let claim: Uuid = claim_id(&body).parse().unwrap();
    wait_parked(&first.db, claim, "held").await;
    let (s, body) = post_as(
        &first,
        &format!("/v1/claims/{claim}/cancel"),
        &token("bad-a"),
    )
    .await;
    assert_eq!(
        (s, body["status"].as_str()),
        (200, Some("cancelled")),
        "{body}"
    );
    wait_parked(&first.db, claim, "cancelled").await;
    // The restore rebuilds from a ledger where the cancelled hold holds nothing.
    let r = first.restore("ph", true).await;
    assert_eq!(r.status(), 200);
    assert_eq!(first.stock("ph").await, Some(3));
    first.stop().await;

    // A gateway that gives up on the parked claim at once compensates it.
    let second = gateway(&iso, "1").await;
    wait_compensated(&second.db, claim).await;
    balanced(&second, "ph", 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_offer_that_lapsed_is_compensated_without_giving_its_unit_twice() {
    let iso = Isolation::new();
    let first = gateway(&iso, "100").await;
    install_trigger(&first.db).await;
    let r = declare_with(
        &first,
        "po",
        json!({"total": 1, "hold_seconds": 600, "offer_seconds": 1}),
    )
    .await;
    assert_eq!(r.status(), 201);
    let (_, body) = claim_one(&first, "po", "good-a").await;
    let held = claim_id(&body);
    let (s, entry) = join(&first, "po", "bad-w").await;
    assert_eq!(s, 201, "{entry}");
    let offer: Uuid = entry["entry_id"].as_str().unwrap().parse().unwrap();
    let (s, _) = post_as(
        &first,
        &format!("/v1/claims/{held}/cancel"),
        &token("good-a"),
    )
    .await;
    assert_eq!(s, 200);
    // The offer (a held claim whose id is the entry's) is parked, then lapses: its unit comes
    // back to open stock (nobody else waits) and the entry's end is written.
    wait_parked(&first.db, offer, "expired").await;
    wait_for(Duration::from_secs(30), || async {
        let s: Option<String> =
            sqlx::query_scalar("SELECT status FROM waitlist WHERE entry_id = $1")
                .bind(offer)
                .fetch_optional(&first.db)
                .await
                .unwrap();
        s.as_deref() == Some("expired")
    })
    .await;
    settled(&first, &first.probe, "po").await;
    assert_eq!(first.stock("po").await, Some(1));
    first.stop().await;

    let second = gateway(&iso, "1").await;
    wait_compensated(&second.db, offer).await;
    balanced(&second, "po", 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_offer_rebuilt_by_a_restore_ends_its_entry_when_it_lapses() {
    let iso = Isolation::new();
    let app = gateway(&iso, "100").await;
    install_trigger(&app.db).await;
    let r = declare_with(
        &app,
        "pr",
        json!({"total": 1, "hold_seconds": 600, "offer_seconds": 4}),
    )
    .await;
    assert_eq!(r.status(), 201);
    let (_, body) = claim_one(&app, "pr", "good-a").await;
    let held = claim_id(&body);
    let (s, entry) = join(&app, "pr", "bad-w").await;
    assert_eq!(s, 201, "{entry}");
    let offer: Uuid = entry["entry_id"].as_str().unwrap().parse().unwrap();
    let (s, _) = post_as(&app, &format!("/v1/claims/{held}/cancel"), &token("good-a")).await;
    assert_eq!(s, 200);
    wait_parked(&app.db, offer, "held").await;
    let r = app.restore("pr", true).await;
    assert_eq!(r.status(), 200);

    // The rebuilt offer lapses as an offer: the entry ends, its buyer may join again.
    let path = format!("/v1/waitlist/{offer}");
    wait_for(Duration::from_secs(30), || async {
        let (s, e) = get_as(&app, &path, &token("bad-w")).await;
        s == 200 && e["status"] == "expired"
    })
    .await;
    wait_parked(&app.db, offer, "expired").await;
    wait_for(Duration::from_secs(30), || async {
        let s: Option<String> =
            sqlx::query_scalar("SELECT status FROM waitlist WHERE entry_id = $1")
                .bind(offer)
                .fetch_optional(&app.db)
                .await
                .unwrap();
        s.as_deref() == Some("expired")
    })
    .await;
    assert_eq!(app.stock("pr").await, Some(1));
    claim_one(&app, "pr", "good-b").await;
    let (s, again) = join(&app, "pr", "bad-w").await;
    assert_eq!(
        s, 201,
        "a new entry for the buyer whose offer lapsed: {again}"
    );
    assert_ne!(again["entry_id"], entry["entry_id"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_a_restore_replays_the_first_answer_of_its_key_whatever_became_of_the_claim()
{
    let app = spawn_app().await;
    let r = declare_with(
        &app,
        "rk",
        json!({"total": 5, "per_user_limit": 2, "hold_seconds": 600}),
    )
    .await;
    assert_eq!(r.status(), 201);
    let first = |user: &'static str, key: &'static str| {
        let api = app.api.clone();
        async move {
            let r = api.claim("rk", user, 1, Some(key)).await;
            assert_eq!(r.status(), 201);
            r.json::<Value>().await.unwrap()
        }
    };
    let cancelled = first("ann", "k-ann").await;
    let held = first("bob", "k-bob").await;
    let id = claim_id(&cancelled);
    let (s, _) = post_as(&app, &format!("/v1/claims/{id}/cancel"), &token("ann")).await;
    assert_eq!(s, 200);
    settled(&app, &app.probe, "rk").await;
    // Redis loses everything it held of the SKU (a restart without persistence).
    app.probe.lose_sku("rk").await;
    let r = app.restore("rk", false).await;
    assert_eq!(r.status(), 200);

    for (user, key, body) in [("ann", "k-ann", &cancelled), ("bob", "k-bob", &held)] {
        let r = app.claim("rk", user, 1, Some(key)).await;
        assert_eq!(r.status(), 201);
        assert!(
            r.headers().contains_key("idempotency-replayed"),
            "{user}'s retry replays"
        );
        let replay: Value = r.json().await.unwrap();
        for field in ["claim_id", "quantity", "status", "expires_at"] {
            assert_eq!(replay[field], body[field], "{user}: {field} of {replay}");
        }
    }
    let claims: i64 = sqlx::query_scalar("SELECT count(*) FROM issuances WHERE sku = 'rk'")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(claims, 2, "no retry won a second claim");
    assert_eq!(app.stock("rk").await, Some(4));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_hold_given_back_before_its_row_closed_is_not_held_again_by_a_restore() {
    let iso = Isolation::new();
    let app = gateway(&iso, "1").await;
    install_trigger(&app.db).await;
    // PostgreSQL down for the compensation's last step: the parked row cannot close.
    keep_parked_rows_open(&app.db).await;
    let r = declare_with(&app, "pg", json!({"total": 3, "hold_seconds": 600})).await;
    assert_eq!(r.status(), 201);
    let (s, body) = claim_one(&app, "pg", "bad-a").await;
    assert_eq!((s, body["status"].as_str()), (201, Some("held")), "{body}");
    let claim: Uuid = claim_id(&body).parse().unwrap();
    // The compensation gave the units back in Redis; its row still says held.
    wait_marker(&app.probe, "pg", claim, "compensated").await;
    assert_eq!(app.stock("pg").await, Some(3));
    assert_eq!(parked(&app.db, claim).await.unwrap().1, "held");
    // A restore (after a rollback, say) while the row is open counts none of its units...
    let r = app.restore("pg", true).await;
    assert_eq!(r.status(), 200);
    assert_eq!(app.stock("pg").await, Some(3));
    // ...and rebuilds no hold that could give them back a second time.
    let (s, body) = post_as(&app, &format!("/v1/claims/{claim}/cancel"), &token("bad-a")).await;
    assert_ne!(s, 200, "a compensated hold cancelled again: {body}");
    assert_eq!(app.stock("pg").await, Some(3));

    let_parked_rows_close(&app.db).await;
    wait_compensated(&app.db, claim).await;
    balanced(&app, "pg", 3).await;
}

/// The compensation of a parked hold is decided in the ledger (its `issuances` row
/// `compensated`) before Redis gives the units back. When Redis then loses the give-back and its
/// marker (a rollback), a restore must not stage the hold as a live one: staged due to expire,
/// Redis expired it after the buyer had read it compensated, a second life
/// (MODEL_SEED=4698885249057117653: GET `compensated`, then confirm `expired`). It comes back
/// compensated, its units counted back by the restore (tests/api/parked_restore.rs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_whose_compensation_the_ledger_decided_is_never_due_to_expire_after_a_restore() {
    let iso = Isolation::new();
    let app = gateway(&iso, "1").await;
    // `issuances` refuses the hold, not its compensated row: the ledger records the decision.
    crate::parked_restore::refuse_all_but_compensations(&app.db).await;
    keep_parked_rows_open(&app.db).await;
    let r = declare_with(&app, "lost", json!({"total": 3, "hold_seconds": 600})).await;
    assert_eq!(r.status(), 201);
    let (s, body) = claim_one(&app, "lost", "bad-a").await;
    assert_eq!((s, body["status"].as_str()), (201, Some("held")), "{body}");
    let claim: Uuid = claim_id(&body).parse().unwrap();
    wait_marker(&app.probe, "lost", claim, "compensated").await;
    let (s, body) = get_as(&app, &format!("/v1/claims/{claim}"), &token("bad-a")).await;
    assert_eq!(
        (s, body["status"].as_str()),
        (200, Some("compensated")),
        "{body}"
    );
    // Redis loses the give-back and its marker; the ledger keeps the decision.
    lose_marker(&app.probe, "lost", claim).await;
    let r = app.restore("lost", true).await;
    assert_eq!(r.status(), 200);
    // The hold waits for its compensation, which gives its units back: it is not due to expire,
    // and it is no buyer's to end.
    let due: Option<f64> = redis::cmd("ZSCORE")
        .arg(format!("{}:{{lost}}:expiry", app.probe.prefix))
        .arg(claim.to_string())
        .query_async(&mut app.probe.redis.clone())
        .await
        .unwrap();
    assert_eq!(
        due, None,
        "a hold whose compensation is decided is due to expire"
    );
    let (s, body) = post_as(
        &app,
        &format!("/v1/claims/{claim}/confirm"),
        &token("bad-a"),
    )
    .await;
    assert_eq!(
        (s, body["code"].as_str()),
        (409, Some("claim_compensated")),
        "a hold read compensated was confirmed: {body}"
    );
    let (s, body) = get_as(&app, &format!("/v1/claims/{claim}"), &token("bad-a")).await;
    assert_eq!(
        (s, body["status"].as_str()),
        (200, Some("compensated")),
        "{body}"
    );

    let_parked_rows_close(&app.db).await;
    wait_compensated(&app.db, claim).await;
    balanced(&app, "lost", 3).await;
}

/// The ledger decides a parked hold's compensation before Redis gives its units back, and GET
/// reads it `compensated` from then on. Until the give-back reaches Redis, a confirm or cancel
/// that Redis still takes must be told `compensated` too, or the buyer reads two lives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_the_ledger_decided_to_compensate_is_refused_as_compensated_before_redis_gave_it_back(
) {
    let iso = Isolation::new();
    // The reprocessor keeps trying (and failing) to write the claim: it never compensates.
    let app = gateway(&iso, "100").await;
    install_trigger(&app.db).await;
    let r = declare_with(&app, "late", json!({"total": 3, "hold_seconds": 600})).await;
    assert_eq!(r.status(), 201);
    let (s, body) = claim_one(&app, "late", "bad-a").await;
    assert_eq!((s, body["status"].as_str()), (201, Some("held")), "{body}");
    let claim: Uuid = claim_id(&body).parse().unwrap();
    wait_parked(&app.db, claim, "held").await;
    // The compensation's decision, as `decide_compensation` commits it (the refusing trigger
    // is the test's, so it is set aside for this one row).
    let mut tx = app.db.begin().await.unwrap();
    sqlx::query("SET LOCAL session_replication_role = replica")
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO issuances (claim_id, sku, user_id, quantity, status, created_at)
         SELECT claim_id, sku, user_id, quantity, 'compensated', created_at
           FROM persistence_pending WHERE claim_id = $1",
    )
    .bind(claim)
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let (s, body) = get_as(&app, &format!("/v1/claims/{claim}"), &token("bad-a")).await;
    assert_eq!(
        (s, body["status"].as_str()),
        (200, Some("compensated")),
        "{body}"
    );
    for op in ["confirm", "cancel"] {
        let (s, body) = post_as(&app, &format!("/v1/claims/{claim}/{op}"), &token("bad-a")).await;
        assert_eq!(
            (s, body["code"].as_str()),
            (409, Some("claim_compensated")),
            "a {op} of a hold read compensated: {body}"
        );
    }
}
