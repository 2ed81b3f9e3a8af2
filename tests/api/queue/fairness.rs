//! Fair opening: the pre-queue's order is recomputed from the seed the SKU view publishes at
//! the opening (committed by its SHA-256 from the declare on), as an auditor would, with
//! nothing but SHA-256 and the ticket ids (docs/waiting-room.md, "Checking the order").

use serde_json::json;
use sha2::{Digest, Sha256};

use super::*;
use crate::helpers::spawn_app;

/// The auditor's recomputation, written from the docs, not from the gateway's code: the key
/// of a ticket is the first 8 bytes of SHA-256(seed bytes || ticket's 16 bytes), big-endian,
/// shifted right by 12; the pre-queue sorts by (key, ticket bytes).
fn audit_order(seed_hex: &str, tickets: &[uuid::Uuid]) -> Vec<uuid::Uuid> {
    let seed = hex::decode(seed_hex).unwrap();
    let mut keyed: Vec<(u64, [u8; 16])> = tickets
        .iter()
        .map(|t| {
            let mut h = Sha256::new();
            h.update(&seed);
            h.update(t.as_bytes());
            let d = h.finalize();
            (
                u64::from_be_bytes(d[..8].try_into().unwrap()) >> 12,
                *t.as_bytes(),
            )
        })
        .collect();
    keyed.sort();
    keyed
        .into_iter()
        .map(|(_, b)| uuid::Uuid::from_bytes(b))
        .collect()
}

#[tokio::test]
async fn the_prequeue_is_ordered_by_the_published_seed_and_later_tickets_by_arrival() {
    let app = spawn_app().await;
    let opens = chrono::Utc::now() + chrono::Duration::seconds(6);
    let r = declare_queued(
        &app,
        "q-fair",
        100,
        json!({"admit_per_second": 2}),
        json!({"opens_at": opens.to_rfc3339()}),
    )
    .await;
    assert_eq!(r.status(), 201);
    let before = app.view("q-fair").await;
    let commitment = before["queue"]["seed_commitment"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(commitment.len(), 64, "{before}");
    assert!(
        before["queue"]["seed"].is_null(),
        "the seed stays secret before the opening: {before}"
    );
    let n = 80;
    let early = crate::helpers::all_at_once(n, |i| {
        let api = app.api.clone();
        async move { join_retrying(&api, "q-fair", &visitor(&format!("early-{i}"))).await }
    })
    .await;
    let early: Vec<uuid::Uuid> = early
        .iter()
        .map(|(s, b)| {
            assert!(*s == 201 || *s == 200, "{s} {b}");
            assert_eq!(b["state"], "prequeue", "joined before the opening: {b}");
            uuid::Uuid::parse_str(b["ticket_id"].as_str().unwrap()).unwrap()
        })
        .collect();
    assert!(
        chrono::Utc::now() < opens,
        "the pre-queue was joined before opens_at (machine too slow?)"
    );
    let seed: String = until(LONG, || {
        let api = app.api.clone();
        async move {
            let v = api.view("q-fair").await;
            v["queue"]["seed"].as_str().map(str::to_string)
        }
    })
    .await;
    assert_eq!(
        hex::encode(Sha256::digest(hex::decode(&seed).unwrap())),
        commitment,
        "the seed is the one committed to"
    );
    // After the opening, visitors follow in arrival order.
    let mut late = Vec::new();
    for i in 0..10 {
        let (s, b) = join_retrying(&app, "q-fair", &visitor(&format!("late-{i}"))).await;
        assert!(s == 201 || s == 200, "{s} {b}");
        assert_ne!(b["state"], "prequeue", "{b}");
        late.push(uuid::Uuid::parse_str(b["ticket_id"].as_str().unwrap()).unwrap());
    }
    let mut expected = audit_order(&seed, &early);
    assert_ne!(
        expected, early,
        "the order is shuffled, not the order of arrival"
    );
    expected.extend(late.iter().copied());
    // One atomic reading of who was admitted and who waits in which order.
    let k = qkeys(&app.probe, "q-fair");
    let mut con = app.probe.redis.clone();
    let (admitted, line): (Vec<Vec<u8>>, Vec<Vec<u8>>) = redis::pipe()
        .atomic()
        .cmd("ZRANGE")
        .arg(&k[2])
        .arg(0)
        .arg(-1)
        .cmd("ZRANGE")
        .arg(&k[1])
        .arg(0)
        .arg(-1)
        .query_async(&mut con)
        .await
        .unwrap();
    let admitted: std::collections::HashSet<uuid::Uuid> = admitted
        .iter()
        .map(|m| uuid::Uuid::from_slice(m).unwrap())
        .collect();
    let line: Vec<uuid::Uuid> = line
        .iter()
        .map(|m| uuid::Uuid::from_slice(m).unwrap())
        .collect();
    let a = admitted.len();
    assert_eq!(a + line.len(), expected.len());
    assert_eq!(
        admitted,
        expected[..a].iter().copied().collect(),
        "the admitted are the head of the recomputed order"
    );
    assert_eq!(
        line,
        expected[a..].to_vec(),
        "the line is the rest, in the recomputed order"
    );
    // A visitor's position is its place in that order.
    let last = late.last().unwrap().to_string();
    let (_, t) = ticket(&app, &last, &visitor("late-9")).await;
    let pos = t["position"].as_i64().unwrap();
    assert!(
        pos <= line.len() as i64 && pos >= line.len() as i64 - 3,
        "{t} of {}",
        line.len()
    );
}
