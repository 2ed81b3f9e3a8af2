//! What the script-level model (`model::scripts`) found, one test per finding, on a real
//! Redis: each failed before its fix (docs/testing.md lists the seeds).

use dropgate::keys::{idempotency_field, SkuKeys};
use dropgate::scripts::{self, ClaimInput, Decision, Terms, SCRIPTS};
use redis::aio::ConnectionManager;
use uuid::Uuid;

use crate::helpers::script_sku;

/// A SKU whose claims are held for a minute.
async fn held_sku(total: i64, limit: i32) -> (ConnectionManager, SkuKeys) {
    let (mut con, keys) = script_sku("f").await;
    let terms = Terms {
        hold_ms: 60_000,
        offer_ms: 60_000,
        ..Terms::limit(limit)
    };
    scripts::declare_sku(&mut con, &keys, true, total, &terms, &Uuid::nil())
        .await
        .unwrap();
    (con, keys)
}

async fn claim(
    con: &mut ConnectionManager,
    keys: &SkuKeys,
    user: &str,
    key: Option<&str>,
) -> (Uuid, Decision) {
    let call = dropgate::ids::mint_call(0);
    let input = ClaimInput {
        user: user.into(),
        quantity: 1,
        idempotency_key: key.map(str::to_string),
    };
    let mut d = scripts::claim(con, keys, &call, &[input], 1, 0)
        .await
        .unwrap();
    (dropgate::ids::claim_in(&call, 0), d.remove(0))
}

/// compensate.lua as the reprocessor calls it: fence, then give.
async fn compensate(
    con: &mut ConnectionManager,
    keys: &SkuKeys,
    claim: &Uuid,
    user: &str,
    key: Option<&str>,
) -> i64 {
    let marker = keys.compensation(claim);
    let field = key.map_or(Vec::new(), |k| idempotency_field(user, k).to_vec());
    let mut code = 0;
    for mode in ["fence", "give"] {
        let mut inv = SCRIPTS.compensate.prepare_invoke();
        for k in keys.lifecycle() {
            inv.key(k);
        }
        inv.key(&marker)
            .key(keys.idempotency())
            .arg(mode)
            .arg("reprocessor")
            .arg(user)
            .arg(1)
            .arg(claim.to_string())
            .arg(60)
            .arg("0:0")
            .arg(&field);
        code = inv.invoke_async(con).await.unwrap();
    }
    code
}

/// A compensated claim was undone: a retry under its key must be decided afresh, as for a
/// claim final at once. A held winner's record starts `h|expires_ms|`, so compensate.lua did
/// not recognise it as the claim's and the retry replayed the undone hold.
#[tokio::test]
async fn a_retry_under_the_key_of_a_compensated_hold_is_decided_afresh() {
    let (mut con, keys) = held_sku(3, 2).await;
    let (first, won) = claim(&mut con, &keys, "buyer", Some("k")).await;
    assert!(matches!(won, Decision::Won { .. }), "{won:?}");
    assert_eq!(
        compensate(&mut con, &keys, &first, "buyer", Some("k")).await,
        1
    );
    let record: Option<String> = redis::cmd("HGET")
        .arg(keys.idempotency())
        .arg(&idempotency_field("buyer", "k")[..])
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(record, None, "the undone claim's record is gone");
    let (again, retry) = claim(&mut con, &keys, "buyer", Some("k")).await;
    assert!(
        matches!(retry, Decision::Won { remaining: 2, .. }),
        "the retry wins afresh, not a replay of {first}: {retry:?}"
    );
    assert_ne!(again, first);
}
