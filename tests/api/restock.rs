//! restock.lua and compensate.lua: each moves stock at most once, and only for the caller that
//! may (one operation id; the latest fencer of a parked claim).

use std::time::Duration;

use dropgate::scripts::{self, Restocked};
use uuid::Uuid;

use crate::helpers::{script_stock, seeded_sku};

const T: Duration = Duration::from_secs(2);

#[tokio::test]
async fn a_restock_operation_sent_twice_moves_the_stock_once() {
    let (mut con, keys) = seeded_sku(10, 1).await;
    let op = Uuid::now_v7();
    assert_eq!(
        scripts::restock(&mut con, &keys, &op, 5, T).await.unwrap(),
        Restocked::Applied(15)
    );
    assert_eq!(
        scripts::restock(&mut con, &keys, &op, 5, T).await.unwrap(),
        Restocked::Applied(15)
    );
    let other = Uuid::now_v7();
    assert_eq!(
        scripts::restock(&mut con, &keys, &other, -16, T)
            .await
            .unwrap(),
        Restocked::Refused
    );
    assert_eq!(
        scripts::restock(&mut con, &keys, &other, -15, T)
            .await
            .unwrap(),
        Restocked::Applied(0)
    );
}

#[tokio::test]
async fn a_restock_that_timed_out_is_read_back_and_fenced() {
    let (mut con, keys) = seeded_sku(10, 1).await;
    // A zero timeout gives up at once: the outcome is resolved by reading. Whichever way the
    // race went, the answer and the stock agree, and a late send cannot apply it afterwards.
    let op = Uuid::now_v7();
    let outcome = scripts::restock(&mut con, &keys, &op, 7, Duration::ZERO)
        .await
        .unwrap();
    let stock = script_stock(&mut con, &keys).await;
    match outcome {
        Restocked::Applied(n) => assert_eq!((n, stock), (17, 17)),
        Restocked::NotApplied => assert_eq!(stock, 10),
        Restocked::Refused => panic!("a positive delta is never refused"),
    }
    let again = scripts::restock(&mut con, &keys, &op, 7, T).await.unwrap();
    let after = script_stock(&mut con, &keys).await;
    assert_eq!(after, stock, "{again:?}");
}

/// compensate.lua as two racing reprocessors would call it (mode, owner).
async fn compensate(
    con: &mut redis::aio::ConnectionManager,
    keys: &dropgate::keys::SkuKeys,
    claim: &Uuid,
    mode: &str,
    owner: &str,
) -> i64 {
    dropgate::scripts::SCRIPTS
        .compensate
        .key(keys.state())
        .key(keys.users())
        .key(keys.compensation(claim))
        .key(keys.compensation(claim))
        .arg(mode)
        .arg(owner)
        .arg("buyer")
        .arg(2)
        .arg(claim.to_string())
        .arg(60)
        .invoke_async(con)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_claim_is_compensated_once_and_only_by_its_latest_fencer() {
    let (mut con, keys) = seeded_sku(10, 5).await;
    let won = dropgate::scripts::ClaimInput {
        claim_id: Uuid::now_v7(),
        user: "buyer".into(),
        quantity: 2,
        idempotency_key: None,
    };
    scripts::claim(&mut con, &keys, std::slice::from_ref(&won), 1)
        .await
        .unwrap();
    let id = won.claim_id;
    assert_eq!(compensate(&mut con, &keys, &id, "fence", "a").await, 1);
    // b takes the row over after a's lease ran out: a is now stale.
    assert_eq!(compensate(&mut con, &keys, &id, "fence", "b").await, 1);
    assert_eq!(compensate(&mut con, &keys, &id, "give", "a").await, -2);
    assert_eq!(script_stock(&mut con, &keys).await, 8);
    assert_eq!(compensate(&mut con, &keys, &id, "give", "b").await, 1);
    assert_eq!(script_stock(&mut con, &keys).await, 10);
    // Any later call, fence or give, by anyone, changes nothing.
    for (mode, owner) in [("give", "b"), ("fence", "c"), ("give", "c")] {
        assert_eq!(compensate(&mut con, &keys, &id, mode, owner).await, 0);
    }
    assert_eq!(script_stock(&mut con, &keys).await, 10);
    let held: Option<i64> = redis::cmd("HGET")
        .arg(keys.users())
        .arg("buyer")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(held, None);
}
