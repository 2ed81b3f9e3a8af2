//! Tickets as durable as claims (issue 37.1, API.md "Waiting room"): Redis back from an older
//! snapshot in the middle of a queued drop refuses every queue operation until a restore, and
//! the restore (like a forced one while the line moves) leaves every visitor their ticket, its
//! place and its admission with the same expiry: a token handed out before the fault still
//! buys, and no ticket is admitted a second time. Before the tickets were recorded, the six
//! visitors who joined after the snapshot read 404 and rejoined at the back, and tickets
//! admitted before the fault went back in line.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{json, Value};

use super::*;
use crate::helpers::*;
use crate::services::PrivateRedis;

const SKU: &str = "qdur";

/// Each visitor's ticket as it reads now: (status, body), by visitor.
async fn readings(api: &Api, visitors: &[String], ids: &[String]) -> Vec<(u16, Value)> {
    let mut out = Vec::with_capacity(ids.len());
    for (v, id) in visitors.iter().zip(ids) {
        out.push(ticket(api, id, &visitor(v)).await);
    }
    out
}

/// The line's sequence PostgreSQL holds, once it holds everything Redis logged.
async fn recorded(probe: &Probe) -> i64 {
    until(LONG, || async {
        let pg: i64 = sqlx::query_scalar("SELECT queue_seq FROM skus WHERE sku = $1")
            .bind(SKU)
            .fetch_one(&probe.db)
            .await
            .unwrap();
        let redis: Option<String> = qfield(probe, SKU, "qseq").await;
        let redis = redis.and_then(|s| s.parse::<i64>().ok()).unwrap_or(0);
        (pg > 0 && pg == redis).then_some(pg)
    })
    .await
}

/// What must survive: every ticket, each admitted one with its expiry, the waiting ones in
/// the same order.
fn assert_kept(before: &[(u16, Value)], after: &[(u16, Value)], when: &str) {
    let mut waiting_before = Vec::new();
    let mut position_after = HashMap::new();
    for (i, ((sb, b), (sa, a))) in before.iter().zip(after).enumerate() {
        assert_eq!((*sb, *sa), (200, 200), "{when}: visitor {i}: {b} then {a}");
        assert_eq!(b["ticket_id"], a["ticket_id"], "{when}: visitor {i}");
        if b["state"] == "admitted" {
            assert_eq!(
                a["state"], "admitted",
                "{when}: visitor {i} lost its admission: {a}"
            );
            assert_eq!(
                b["admission_expires_at"], a["admission_expires_at"],
                "{when}: visitor {i}'s admission changed"
            );
        } else {
            waiting_before.push((b["position"].as_i64().unwrap_or(0), i));
        }
        if a["state"] == "waiting" {
            position_after.insert(i, a["position"].as_i64().unwrap());
        }
    }
    // Admissions go on meanwhile: the ones still waiting keep their order.
    waiting_before.sort();
    let still: Vec<i64> = waiting_before
        .iter()
        .filter_map(|(_, i)| position_after.get(i).copied())
        .collect();
    assert!(
        still.windows(2).all(|w| w[0] < w[1]),
        "{when}: the line's order changed: {still:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_and_a_forced_restore_during_a_queued_drop_leave_every_visitor_their_ticket() {
    let _heavy = heavy().await;
    let mut redis = PrivateRedis::start().await;
    let iso = Isolation::new();
    let app = spawn_with_config(iso.raw_config(&redis.url())).await;
    let opens = chrono::Utc::now() + chrono::Duration::seconds(4);
    let r = declare_queued(
        &app,
        SKU,
        100,
        json!({"admit_per_second": 2, "admission_ttl_seconds": 600}),
        json!({"opens_at": opens.to_rfc3339()}),
    )
    .await;
    assert_eq!(r.status(), 201);
    let visitors: Vec<String> = (0..14).map(|i| format!("d-{i}")).collect();
    let mut ids = join_all(&app, SKU, "d", 8).await;
    recorded(&app.probe).await;
    let snapshot = redis.snapshot();
    // Six join after the snapshot; then the line opens and the first are admitted.
    for v in &visitors[8..] {
        let (s, b) = join_retrying(&app, SKU, &visitor(v)).await;
        assert_eq!(s, 201, "{b}");
        ids.push(b["ticket_id"].as_str().unwrap().to_string());
    }
    until(LONG, || async {
        (counts(&app.probe, SKU).await.1 >= 4).then_some(())
    })
    .await;
    let mark = recorded(&app.probe).await;
    let before = readings(&app, &visitors, &ids).await;
    let (_, b) = before
        .iter()
        .find(|(s, b)| *s == 200 && b["state"] == "admitted")
        .expect("an admitted visitor");
    let first_token = b["admission_token"].as_str().unwrap().to_string();

    redis.kill();
    redis.roll_back_to(&snapshot);
    redis.restart().await;
    // The probe's connection broke with the restart: its first call reconnects it.
    let _: Result<String, _> = redis::cmd("PING")
        .query_async(&mut app.probe.redis.clone())
        .await;
    // The older line is refused by every ticket read: no visitor is shown its past.
    for (i, id) in ids.iter().enumerate() {
        let (s, b) = ticket(&app, id, &visitor(&visitors[i])).await;
        assert_eq!(s, 503, "visitor {i} read an older line: {b}");
        assert_eq!(code(&b), "unavailable", "{b}");
    }
    let (s, b) = join(&app, SKU, &visitor("d-new")).await;
    assert_eq!(s, 503, "a join on an older line: {b}");
    let r = app.restore(SKU, false).await;
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    let after = readings(&app, &visitors, &ids).await;
    assert_kept(&before, &after, "after the rollback's restore");
    let line_seq: i64 = qfield(&app.probe, SKU, "qseq")
        .await
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        line_seq >= mark,
        "the line restarts at {line_seq}, below the mark {mark}"
    );
    // The token handed out before the fault buys; the ticket is not admitted twice.
    let (s, b) = claim_with(&app, SKU, &first_token).await;
    assert_eq!(s, 201, "{b}");
    let once: Vec<(String, i64)> = sqlx::query_as(
        "SELECT ticket::text, count(*) FROM queue_tickets WHERE sku = $1 GROUP BY 1 HAVING count(*) > 1",
    )
    .bind(SKU)
    .fetch_all(&app.db)
    .await
    .unwrap();
    assert!(once.is_empty(), "{once:?}");

    // A forced restore while the line moves.
    let before = readings(&app, &visitors, &ids).await;
    let r = app.restore(SKU, true).await;
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    let after = readings(&app, &visitors, &ids).await;
    assert_kept(&before, &after, "after a forced restore");
    // And the line goes on: the rest are admitted in time.
    until(Duration::from_secs(30), || async {
        (counts(&app.probe, SKU).await.1 >= 10).then_some(())
    })
    .await;
    let admitted_pg: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM queue_tickets WHERE sku = $1 AND admitted_ms IS NOT NULL",
    )
    .bind(SKU)
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert!(admitted_pg >= 4, "{admitted_pg}");
}

/// Script level: a line whose own sequence is behind the line floor (joins and admissions the
/// ledger recorded and this copy lacks) is refused by a join, a read and a round of
/// admissions, each closing the state, though the state's own sequence and incarnation pass.
#[tokio::test]
async fn a_line_behind_the_recorded_line_sequence_is_refused_by_every_queue_script() {
    use dropgate::error::StoreError;
    use dropgate::queue::calls;
    let (mut con, keys) = seeded_sku(3, 1).await;
    let settings = dropgate::queue::RedisSettings {
        rate: 100,
        ttl_seconds: 60,
        prequeue_ms: 0,
        overbook_milli: 1500,
        version: 1,
    };
    assert!(calls::configure(&mut con, &keys, &settings).await.unwrap());
    let floor = dropgate::scripts::Floor::seq(0);
    let first = uuid::Uuid::now_v7();
    let joined = calls::join(&mut con, &keys, &first, 1, "v1", floor, 0)
        .await
        .unwrap();
    assert!(
        matches!(joined, calls::Joined::Ticket { created: true, .. }),
        "{joined:?}"
    );
    let hash = &keys.queue()[0];
    let qseq: i64 = redis::cmd("HGET")
        .arg(hash)
        .arg("qseq")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(qseq, 1, "a join moves the line's sequence");
    let newcomer = uuid::Uuid::now_v7();
    for name in ["join_queue", "read_ticket", "admit_queue"] {
        let _: () = redis::cmd("HDEL")
            .arg(keys.state())
            .arg("stale")
            .query_async(&mut con)
            .await
            .unwrap();
        let r = match name {
            "join_queue" => calls::join(&mut con, &keys, &newcomer, 5, "v2", floor, 2)
                .await
                .map(|j| format!("{j:?}")),
            "read_ticket" => calls::read(&mut con, &keys, &first, "", floor, 2)
                .await
                .map(|t| format!("{t:?}")),
            _ => calls::admit(&mut con, &keys, "me", 2000, 100, false, floor, 2)
                .await
                .map(|r| format!("{r:?}")),
        };
        assert!(matches!(r, Err(StoreError::Stale)), "{name}: {r:?}");
        let stale: Option<String> = redis::cmd("HGET")
            .arg(keys.state())
            .arg("stale")
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!(stale.as_deref(), Some("line-behind:1<2"), "{name}");
        let (line, admitted) = (&keys.queue()[1], &keys.queue()[2]);
        let n: (i64, i64) = redis::pipe()
            .cmd("ZCARD")
            .arg(line)
            .cmd("ZCARD")
            .arg(admitted)
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!(n, (1, 0), "{name} moved the older line");
    }
}

/// Redis loses everything right after visitors were answered (no time for a periodic copy):
/// every ticket answered, and every admission whose token was handed out, comes back with the
/// restore. A join is answered only once its ticket is in PostgreSQL, and a token only once
/// its admission is (before that, a loss right after a burst forgot the last tickets
/// answered 201, and a token's admission, which its visitor then got a second time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_loss_right_after_answers_forgets_no_ticket_nor_admission() {
    let _heavy = heavy().await;
    let mut redis = PrivateRedis::start().await;
    let iso = Isolation::new();
    let app = spawn_with_config(iso.raw_config(&redis.url())).await;
    let r = declare_queued(
        &app,
        SKU,
        100,
        json!({"admit_per_second": 1, "admission_ttl_seconds": 600}),
        json!({}),
    )
    .await;
    assert_eq!(r.status(), 201);
    let visitors: Vec<String> = (0..12).map(|i| format!("l-{i}")).collect();
    // The first is admitted and reads its token; the rest join all at once.
    let (s, b) = join_retrying(&app, SKU, &visitor(&visitors[0])).await;
    assert_eq!(s, 201, "{b}");
    let first = b["ticket_id"].as_str().unwrap().to_string();
    let admitted = until(LONG, || async {
        let (s, b) = ticket(&app, &first, &visitor(&visitors[0])).await;
        (s == 200 && b["state"] == "admitted").then_some(b)
    })
    .await;
    let answers = all_at_once(visitors.len() - 1, |i| {
        let (api, v) = (app.api.clone(), visitor(&visitors[i + 1]));
        async move { join(&api, SKU, &v).await }
    })
    .await;
    let mut ids = vec![first];
    for (s, b) in &answers {
        assert_eq!(*s, 201, "{b}");
        ids.push(b["ticket_id"].as_str().unwrap().to_string());
    }
    redis.kill();
    redis.wipe();
    redis.restart().await;
    let _: Result<String, _> = redis::cmd("PING")
        .query_async(&mut app.probe.redis.clone())
        .await;
    let r = app.restore(SKU, false).await;
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    for (i, id) in ids.iter().enumerate() {
        let (s, b) = ticket(&app, id, &visitor(&visitors[i])).await;
        assert_eq!(
            s, 200,
            "visitor {i}'s ticket answered 201 was forgotten: {b}"
        );
        // Joining again finds it: no second place.
        let (s, b) = join(&app, SKU, &visitor(&visitors[i])).await;
        assert_eq!((s, &b["ticket_id"]), (200, &json!(id)), "{b}");
    }
    let (_, b) = ticket(&app, &ids[0], &visitor(&visitors[0])).await;
    assert_eq!(b["state"], "admitted", "{b}");
    assert_eq!(b["admission_expires_at"], admitted["admission_expires_at"]);
    let (s, b) = claim_with(&app, SKU, admitted["admission_token"].as_str().unwrap()).await;
    assert_eq!(s, 201, "{b}");
}

/// A copy of the line taken before its last recorded joins, put back, and then moved past the
/// line's mark by a gateway that has not learnt the mark yet (it reads it every 100 ms): the
/// state's incarnation, rotated once the line moved (as after a claim), refuses it whatever
/// its sequence has become. Before, a pre-queue (joins, no claim) never rotated the
/// incarnation, and such a join went through on the older line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_line_moved_past_its_mark_is_refused_by_the_incarnation_its_moves_rotated() {
    use dropgate::error::StoreError;
    use dropgate::queue::calls;
    let _heavy = heavy().await;
    let mut redis = PrivateRedis::start().await;
    let iso = Isolation::new();
    let app = spawn_with_config(iso.raw_config(&redis.url())).await;
    let opens = chrono::Utc::now() + chrono::Duration::seconds(3600);
    let r = declare_queued(
        &app,
        SKU,
        10,
        json!({"admit_per_second": 2, "admission_ttl_seconds": 600}),
        json!({"opens_at": opens.to_rfc3339()}),
    )
    .await;
    assert_eq!(r.status(), 201);
    join_all(&app, SKU, "o", 3).await;
    recorded(&app.probe).await;
    let inc_at = |db: sqlx::PgPool| async move {
        sqlx::query_as::<_, (i64, i64)>("SELECT redis_seq, redis_inc FROM skus WHERE sku = $1")
            .bind(SKU)
            .fetch_one(&db)
            .await
            .unwrap()
    };
    // The incarnation the copy will carry: recorded once the declare's state moved.
    let copied = until(LONG, || async {
        let (_, pg) = inc_at(app.probe.db.clone()).await;
        let redis: Option<i64> = {
            let mut r = app.probe.redis.clone();
            r.hget(
                dropgate::keys::SkuKeys::new(&app.probe.prefix, SKU).state(),
                "inc",
            )
            .await
            .unwrap()
        };
        (pg > 0 && Some(pg) == redis).then_some(pg)
    })
    .await;
    let snapshot = redis.snapshot();
    for i in 3..6 {
        let (s, b) = join_retrying(&app, SKU, &visitor(&format!("o-{i}"))).await;
        assert_eq!(s, 201, "{b}");
    }
    let mark = recorded(&app.probe).await;
    // No claim moved a unit: the line's moves alone rotate the incarnation.
    let (seq, inc) = until(LONG, || async {
        let (seq, inc) = inc_at(app.probe.db.clone()).await;
        (inc > copied).then_some((seq, inc))
    })
    .await;

    redis.kill();
    redis.roll_back_to(&snapshot);
    redis.restart().await;
    let mut con = app.probe.redis.clone();
    let _: Result<String, _> = redis::cmd("PING").query_async(&mut con).await;
    let keys = dropgate::keys::SkuKeys::new(&app.probe.prefix, SKU);
    let floor = dropgate::scripts::Floor { seq, inc };
    // A gateway that knows the SKU's mark but not yet the line's (0): its joins would take
    // the older line past `mark` by three.
    let newcomer = uuid::Uuid::now_v7();
    let r = calls::join(&mut con, &keys, &newcomer, 1, "o-new", floor, 0).await;
    assert!(
        matches!(r, Err(StoreError::Stale)),
        "joined an older line: {r:?}"
    );
    let qseq: Option<i64> = con.hget(&keys.queue()[0], "qseq").await.unwrap();
    assert!(
        qseq.unwrap_or(0) < mark,
        "the older line moved: {qseq:?} (mark {mark})"
    );
}

/// A line that admits again a ticket the ledger holds admitted at another time (what an older
/// copy of the line does once it moves on, if a gateway has not learnt the mark yet; made here
/// by putting the ticket back in line by hand) contradicts the ledger: its recorder writes
/// nothing of it, closes the line, and the visitor is never handed a second token; the restore
/// gives back the one admission the ledger holds. Before, the recorder kept the ledger's
/// admission, trimmed the entry, and the visitor read a second token with another expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_line_that_admits_a_ticket_again_is_closed_and_never_hands_out_a_second_token() {
    let app = spawn_app().await;
    let sku = "qclash";
    let r = declare_queued(
        &app,
        sku,
        10,
        json!({"admit_per_second": 1000, "admission_ttl_seconds": 600}),
        json!({}),
    )
    .await;
    assert_eq!(r.status(), 201);
    let v = visitor("c-1");
    let (s, b) = join_retrying(&app, sku, &v).await;
    assert_eq!(s, 201, "{b}");
    let id = b["ticket_id"].as_str().unwrap().to_string();
    let first = until(LONG, || async {
        let (s, b) = ticket(&app, &id, &v).await;
        (s == 200 && b["state"] == "admitted").then_some(b)
    })
    .await;
    // The older line: the ticket back in line, as before its admission.
    let k = qkeys(&app.probe, sku);
    let t = uuid::Uuid::parse_str(&id).unwrap();
    let mut con = app.probe.redis.clone();
    let _: () = redis::pipe()
        .cmd("ZREM")
        .arg(&k[2])
        .arg(t.as_bytes().as_slice())
        .cmd("HDEL")
        .arg(&k[7])
        .arg(t.as_bytes().as_slice())
        .cmd("ZADD")
        .arg(&k[1])
        .arg(1)
        .arg(t.as_bytes().as_slice())
        .query_async(&mut con)
        .await
        .unwrap();
    // Admitted again in Redis, then the recorder finds the clash and closes the line.
    until(LONG, || async {
        let stale: Option<String> = app
            .probe
            .redis
            .clone()
            .hget(
                dropgate::keys::SkuKeys::new(&app.probe.prefix, sku).state(),
                "stale",
            )
            .await
            .unwrap();
        stale.filter(|s| s.contains("line-clash")).map(|_| ())
    })
    .await;
    let (s, b) = ticket(&app, &id, &v).await;
    assert_eq!(s, 503, "a second admission was answered: {b}");
    let r = app.restore(sku, false).await;
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    let (s, b) = ticket(&app, &id, &v).await;
    assert_eq!((s, &b["state"]), (200, &json!("admitted")), "{b}");
    assert_eq!(
        b["admission_expires_at"], first["admission_expires_at"],
        "{b}"
    );
    assert_eq!(b["admission_token"], first["admission_token"], "{b}");
}
