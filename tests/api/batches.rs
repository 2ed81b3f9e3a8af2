//! Coalesced batches: one script call deciding many claims must give each claim exactly the
//! answer it would get alone, in arrival order.

use dropgate::keys::SkuKeys;
use dropgate::scripts::{self, ClaimInput, Decision};
use redis::aio::ConnectionManager;
use uuid::Uuid;

use crate::helpers::{script_sku, script_stock, seeded_sku};

fn input(user: &str, quantity: u32, key: Option<&str>) -> ClaimInput {
    ClaimInput {
        claim_id: Uuid::now_v7(),
        user: user.into(),
        quantity,
        idempotency_key: key.map(str::to_string),
    }
}

async fn journal_len(con: &mut ConnectionManager, keys: &SkuKeys) -> i64 {
    redis::cmd("XLEN")
        .arg(keys.journal())
        .query_async(con)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_batch_applies_limits_duplicates_and_sell_out_in_order() {
    let (mut con, keys) = seeded_sku(5, 2).await;
    let batch = vec![
        input("a", 2, Some("k1")), // wins, 3 left
        input("a", 1, None),       // a holds 2 of 2: limit
        input("a", 2, Some("k1")), // same key, same request: replay of the first
        input("a", 1, Some("k1")), // same key, other request: reused
        input("b", 2, None),       // wins, 1 left
        input("c", 2, None),       // needs 2, 1 left: sold out, no partial fill
        input("d", 1, None),       // wins the last unit
        input("e", 1, None),       // sold out
    ];
    let d = scripts::claim(&mut con, &keys, &batch, 1_700_000_000_000, 0)
        .await
        .unwrap();
    assert_eq!(
        d[0],
        Decision::Won {
            remaining: 3,
            expires_ms: None
        }
    );
    assert_eq!(d[1], Decision::LimitReached { held: 2 });
    assert!(
        matches!(d[2], Decision::Replay { claim_id, quantity: 2, remaining: 3, .. } if claim_id == batch[0].claim_id),
        "{:?}",
        d[2]
    );
    assert_eq!(d[3], Decision::KeyReused);
    assert_eq!(
        d[4],
        Decision::Won {
            remaining: 1,
            expires_ms: None
        }
    );
    assert_eq!(d[5], Decision::SoldOut { remaining: 1 });
    assert_eq!(
        d[6],
        Decision::Won {
            remaining: 0,
            expires_ms: None
        }
    );
    assert_eq!(d[7], Decision::SoldOut { remaining: 0 });

    let (stock, inflight): (i64, i64) = redis::cmd("HMGET")
        .arg(keys.state())
        .arg("stock")
        .arg("inflight")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!((stock, inflight), (0, 5));
    assert_eq!(journal_len(&mut con, &keys).await, 3);
    let held: Vec<Option<i64>> = redis::cmd("HMGET")
        .arg(keys.users())
        .arg(&["a", "b", "c", "d", "e"])
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(held, vec![Some(2), Some(2), None, Some(1), None]);
}

#[tokio::test]
async fn a_batch_answers_like_the_same_claims_sent_one_by_one() {
    let claims: Vec<ClaimInput> = (0..40)
        .map(|i| {
            input(
                &format!("u{}", i % 7),
                1 + (i % 3),
                (i % 4 == 0).then_some("same"),
            )
        })
        .collect();
    let (mut together, keys_a) = seeded_sku(20, 3).await;
    let batched = scripts::claim(&mut together, &keys_a, &claims, 1, 0)
        .await
        .unwrap();
    let (mut alone, keys_b) = seeded_sku(20, 3).await;
    let mut single = Vec::new();
    for c in &claims {
        single.extend(
            scripts::claim(&mut alone, &keys_b, std::slice::from_ref(c), 1, 0)
                .await
                .unwrap(),
        );
    }
    assert_eq!(batched, single);
    assert_eq!(
        journal_len(&mut together, &keys_a).await,
        journal_len(&mut alone, &keys_b).await
    );
}

#[tokio::test]
async fn a_batch_on_a_lost_sku_changes_nothing() {
    let (mut con, keys) = script_sku("gone").await;
    let r = scripts::claim(
        &mut con,
        &keys,
        &[input("a", 1, Some("k")), input("b", 1, None)],
        1,
        0,
    )
    .await;
    assert!(
        matches!(r, Err(dropgate::error::StoreError::SkuLost)),
        "{r:?}"
    );
    let exists: i64 = redis::cmd("EXISTS")
        .arg(keys.state())
        .arg(keys.users())
        .arg(keys.journal())
        .arg(keys.idempotency("a", "k"))
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(exists, 0);
}

#[tokio::test]
async fn a_fenced_claim_id_can_no_longer_win_and_moves_nothing() {
    let (mut con, keys) = seeded_sku(3, 1).await;
    let late = input("late", 1, Some("k"));
    // The resolver of a timed-out call found nothing and fenced the id...
    assert_eq!(
        scripts::resolve_claims(&mut con, &keys, &[late.claim_id])
            .await
            .unwrap(),
        vec![None]
    );
    // ...so the original call, arriving afterwards, is refused without touching stock.
    let d = scripts::claim(&mut con, &keys, std::slice::from_ref(&late), 1, 0)
        .await
        .unwrap();
    assert_eq!(d, vec![Decision::Fenced]);
    let stock = script_stock(&mut con, &keys).await;
    assert_eq!(stock, 3);
    assert_eq!(journal_len(&mut con, &keys).await, 0);
    // A winner's record is what the resolver reads back.
    let won = input("w", 1, None);
    scripts::claim(&mut con, &keys, std::slice::from_ref(&won), 1, 0)
        .await
        .unwrap();
    let remaining = scripts::resolve_claims(&mut con, &keys, &[won.claim_id])
        .await
        .unwrap();
    assert_eq!(remaining, vec![Some(2)]);
}

#[tokio::test]
async fn huge_stock_and_limits_decide_like_small_ones() {
    let (mut con, keys) = seeded_sku(1_000_000_000_000, 1_000_000).await;
    let d = scripts::claim(
        &mut con,
        &keys,
        &[input("u", 1, None), input("u", 5, Some("k"))],
        1,
        0,
    )
    .await
    .unwrap();
    assert_eq!(
        d,
        vec![
            Decision::Won {
                remaining: 999_999_999_999,
                expires_ms: None
            },
            Decision::Won {
                remaining: 999_999_999_994,
                expires_ms: None
            }
        ]
    );
}
