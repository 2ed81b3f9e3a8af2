//! Coalesced batches: one script call deciding many claims must give each claim exactly the
//! answer it would get alone, in arrival order; and Redis keeps its bookkeeping per call (one
//! fence and record, one journal entry), never per claim.

use dropgate::ids::{claim_in, mint_call};
use dropgate::keys::{idempotency_field, SkuKeys};
use dropgate::record::IdemRecord;
use dropgate::scripts::{self, ClaimInput, Decision};
use dropgate::writer::Winner;
use redis::aio::ConnectionManager;
use uuid::Uuid;

use crate::helpers::{script_sku, script_stock, seeded_sku};

fn input(user: &str, quantity: u32, key: Option<&str>) -> ClaimInput {
    ClaimInput {
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

/// The winners of each journal entry, in order, as the writer reads them.
async fn journal_winners(con: &mut ConnectionManager, keys: &SkuKeys) -> Vec<Vec<Winner>> {
    let entries: Vec<redis::Value> = redis::cmd("XRANGE")
        .arg(keys.journal())
        .arg("-")
        .arg("+")
        .query_async(con)
        .await
        .unwrap();
    entries
        .into_iter()
        .map(|e| dropgate::writer::winners_of("s", e).expect("an entry the writer reads"))
        .collect()
}

/// Every field of the SKU's call records hash of `call`'s bucket.
async fn call_records(
    con: &mut ConnectionManager,
    keys: &SkuKeys,
    call: &Uuid,
) -> Vec<(String, String)> {
    redis::cmd("HGETALL")
        .arg(keys.claim(call))
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
    let call = mint_call(0);
    let d = scripts::claim(&mut con, &keys, &call, &batch, 1_700_000_000_000, 0)
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
        matches!(d[2], Decision::Replay { claim_id, quantity: 2, remaining: 3, .. } if claim_id == claim_in(&call, 0)),
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
    // One entry for the call, its three winners in claim order, each under its own id.
    let entries = journal_winners(&mut con, &keys).await;
    assert_eq!(entries.len(), 1);
    let winners: Vec<(Uuid, i32, Option<i64>, &str)> = entries[0]
        .iter()
        .map(|w| (w.claim_id, w.quantity, w.remaining_after, w.user.as_str()))
        .collect();
    assert_eq!(
        winners,
        vec![
            (claim_in(&call, 0), 2, Some(3), "a"),
            (claim_in(&call, 4), 2, Some(1), "b"),
            (claim_in(&call, 6), 1, Some(0), "d"),
        ]
    );
    // One record for the call, holding its winners; no field for any claim.
    assert_eq!(
        call_records(&mut con, &keys, &call).await,
        vec![(call.to_string(), "5|0|2|1|a4|2|1|b6|1|1|d".to_string())]
    );
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
    let batched = scripts::claim(&mut together, &keys_a, &mint_call(0), &claims, 1, 0)
        .await
        .unwrap();
    let (mut alone, keys_b) = seeded_sku(20, 3).await;
    let mut single = Vec::new();
    for c in &claims {
        single.extend(
            scripts::claim(
                &mut alone,
                &keys_b,
                &mint_call(0),
                std::slice::from_ref(c),
                1,
                0,
            )
            .await
            .unwrap(),
        );
    }
    // Replays name the first win's id, which differs between the two runs.
    let shape = |ds: Vec<Decision>| -> Vec<Decision> {
        ds.into_iter()
            .map(|d| match d {
                Decision::Replay {
                    quantity,
                    remaining,
                    ..
                } => Decision::Replay {
                    claim_id: Uuid::nil(),
                    quantity,
                    remaining,
                    expires_ms: None,
                },
                other => other,
            })
            .collect()
    };
    assert_eq!(shape(batched), shape(single));
    // The same winners, journaled in one entry instead of one entry each.
    let one = journal_winners(&mut together, &keys_a).await;
    let each = journal_winners(&mut alone, &keys_b).await;
    assert_eq!(one.len(), 1);
    assert!(each.iter().all(|e| e.len() == 1));
    let fields = |ws: Vec<Winner>| -> Vec<(i32, Option<i64>, i64, String)> {
        ws.into_iter()
            .map(|w| (w.quantity, w.remaining_after, w.seq, w.user))
            .collect()
    };
    assert_eq!(
        fields(one.into_iter().flatten().collect()),
        fields(each.into_iter().flatten().collect())
    );
}

#[tokio::test]
async fn a_batch_on_a_lost_sku_changes_nothing() {
    let (mut con, keys) = script_sku("gone").await;
    let r = scripts::claim(
        &mut con,
        &keys,
        &mint_call(0),
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
        .arg(keys.idempotency())
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(exists, 0);
}

/// Stock, inflight and seq of the state, and the SKU's per-user counts.
async fn state_and_users(
    con: &mut ConnectionManager,
    keys: &SkuKeys,
) -> ((i64, Option<i64>, Option<i64>), Vec<(String, i64)>) {
    redis::pipe()
        .cmd("HMGET")
        .arg(keys.state())
        .arg("stock")
        .arg("inflight")
        .arg("seq")
        .cmd("HGETALL")
        .arg(keys.users())
        .query_async(con)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_call_fenced_by_a_resolver_before_it_runs_decides_nothing_when_it_arrives() {
    let (mut con, keys) = seeded_sku(3, 1).await;
    let late = mint_call(0);
    let claims = [
        input("late-a", 1, Some("k")),
        input("late-b", 1, None),
        input("late-c", 1, None),
    ];
    let before = state_and_users(&mut con, &keys).await;
    // The resolver of a timed-out call found no record and fenced the call: every claim of it
    // is answered "did not win", and one read fences the whole call.
    let ids: Vec<Uuid> = (0..claims.len()).map(|i| claim_in(&late, i)).collect();
    assert_eq!(
        scripts::resolve_claims(&mut con, &keys, &ids)
            .await
            .unwrap(),
        vec![None, None, None]
    );
    assert_eq!(
        call_records(&mut con, &keys, &late).await,
        vec![(late.to_string(), "void".to_string())]
    );
    // The original call, arriving afterwards, decides none of its claims and writes nothing.
    let d = scripts::claim(&mut con, &keys, &late, &claims, 1, 0)
        .await
        .unwrap();
    assert_eq!(d, vec![Decision::Fenced; 3]);
    assert_eq!(state_and_users(&mut con, &keys).await, before);
    assert_eq!(script_stock(&mut con, &keys).await, 3);
    assert_eq!(journal_len(&mut con, &keys).await, 0);
    let idem: i64 = redis::cmd("HEXISTS")
        .arg(keys.idempotency())
        .arg(&idempotency_field("late-a", "k")[..])
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(idem, 0);
    // A call's record is what the resolver reads back, per claim.
    let won = mint_call(0);
    scripts::claim(&mut con, &keys, &won, &[input("w", 1, None)], 1, 0)
        .await
        .unwrap();
    let remaining = scripts::resolve_claims(&mut con, &keys, &[claim_in(&won, 0)])
        .await
        .unwrap();
    assert_eq!(remaining, vec![Some(2)]);
}

#[tokio::test]
async fn a_call_resent_after_it_ran_decides_nothing_twice_and_its_record_answers_each_claim() {
    let (mut con, keys) = seeded_sku(10, 1).await;
    let call = mint_call(0);
    let claims = [
        input("a", 1, Some("ka")),
        input("a", 1, None), // limit reached: not in the record
        input("b", 1, None),
    ];
    let first = scripts::claim(&mut con, &keys, &call, &claims, 1, 0)
        .await
        .unwrap();
    assert!(matches!(first[0], Decision::Won { remaining: 9, .. }));
    assert_eq!(first[1], Decision::LimitReached { held: 1 });
    assert!(matches!(first[2], Decision::Won { remaining: 8, .. }));
    let after_first = state_and_users(&mut con, &keys).await;
    // A cluster connection resends the very same call after a connection error.
    let again = scripts::claim(&mut con, &keys, &call, &claims, 1, 0)
        .await
        .unwrap();
    assert_eq!(again, vec![Decision::Fenced; 3]);
    assert_eq!(state_and_users(&mut con, &keys).await, after_first);
    assert_eq!(journal_winners(&mut con, &keys).await.len(), 1);
    // What the first run decided is read back per claim, and reading fences nothing.
    let ids: Vec<Uuid> = (0..3).map(|i| claim_in(&call, i)).collect();
    assert_eq!(
        scripts::resolve_claims(&mut con, &keys, &ids)
            .await
            .unwrap(),
        vec![Some(9), None, Some(8)]
    );
    assert_eq!(
        call_records(&mut con, &keys, &call).await,
        vec![(call.to_string(), "10|0|1|1|a2|1|1|b".to_string())]
    );
}

#[tokio::test]
async fn a_call_of_128_winners_journals_one_entry_and_one_record_for_all_of_them() {
    let (mut con, keys) = seeded_sku(1000, 1).await;
    let call = mint_call(0);
    let claims: Vec<ClaimInput> = (0..128)
        .map(|i| input(&format!("u|{i}"), 1, (i % 2 == 0).then_some("key|x")))
        .collect();
    let d = scripts::claim(&mut con, &keys, &call, &claims, 1, 0)
        .await
        .unwrap();
    assert!(d.iter().all(|d| matches!(d, Decision::Won { .. })));
    let entries = journal_winners(&mut con, &keys).await;
    assert_eq!(entries.len(), 1);
    let ids: Vec<Uuid> = entries[0].iter().map(|r| r.claim_id).collect();
    let want: Vec<Uuid> = (0..128).map(|i| claim_in(&call, i)).collect();
    assert_eq!(ids, want);
    assert_eq!(entries[0][127].user, "u|127");
    assert_eq!(entries[0][126].idempotency_key.as_deref(), Some("key|x"));
    // One field for the call in its records hash, answering for each claim.
    assert_eq!(call_records(&mut con, &keys, &call).await.len(), 1);
    let remaining = scripts::resolve_claims(&mut con, &keys, &want)
        .await
        .unwrap();
    let expected: Vec<Option<i64>> = (0..128).map(|i| Some(999 - i)).collect();
    assert_eq!(remaining, expected);
    // Each keyed winner has its idempotency record, under the field of its user and key.
    let idem: Option<String> = redis::cmd("HGET")
        .arg(keys.idempotency())
        .arg(&idempotency_field("u|126", "key|x")[..])
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(
        IdemRecord::parse(&idem.unwrap()).map(|r| r.claim_id),
        Some(claim_in(&call, 126))
    );
}

#[tokio::test]
async fn huge_stock_and_limits_decide_like_small_ones() {
    // 10^15: past what Lua writes as an integer by default ("%.14g" would give 1e+15).
    let (mut con, keys) = seeded_sku(1_000_000_000_000_000, 1_000_000).await;
    let call = mint_call(0);
    let claims = [input("u", 1, None), input("u", 5, Some("k"))];
    let d = scripts::claim(&mut con, &keys, &call, &claims, 1, 0)
        .await
        .unwrap();
    assert_eq!(
        d,
        vec![
            Decision::Won {
                remaining: 999_999_999_999_999,
                expires_ms: None
            },
            Decision::Won {
                remaining: 999_999_999_999_994,
                expires_ms: None
            }
        ]
    );
    // The record, the journal and a replay read the same figures back.
    let ids = [claim_in(&call, 0), claim_in(&call, 1)];
    assert_eq!(
        scripts::resolve_claims(&mut con, &keys, &ids)
            .await
            .unwrap(),
        vec![Some(999_999_999_999_999), Some(999_999_999_999_994)]
    );
    let stock: Vec<Option<i64>> = journal_winners(&mut con, &keys).await[0]
        .iter()
        .map(|w| w.remaining_after)
        .collect();
    assert_eq!(
        stock,
        vec![Some(999_999_999_999_999), Some(999_999_999_999_994)]
    );
    let again = scripts::claim(&mut con, &keys, &mint_call(0), &claims[1..], 1, 0)
        .await
        .unwrap();
    assert!(
        matches!(
            again[0],
            Decision::Replay {
                remaining: 999_999_999_999_994,
                ..
            }
        ),
        "{again:?}"
    );
}

#[tokio::test]
async fn a_win_read_back_on_a_sku_with_holds_is_the_hold_its_call_answered() {
    let (mut con, keys) = script_sku("rbh").await;
    let terms = scripts::Terms {
        hold_ms: 60_000,
        ..scripts::Terms::limit(2)
    };
    scripts::declare_sku(&mut con, &keys, true, 5, &terms, &Uuid::nil())
        .await
        .unwrap();
    let call = mint_call(0);
    let claims = [
        input("a", 1, None),
        input("b", 2, Some("k")),
        input("c", 3, None),
    ];
    let d = scripts::claim(&mut con, &keys, &call, &claims, 1, 0)
        .await
        .unwrap();
    let Decision::Won { expires_ms, .. } = d[0] else {
        panic!("a won: {d:?}")
    };
    let expires_ms = expires_ms.expect("a hold");
    // A read-back of the call answers each win as the call did: the stock after it, the hold.
    let ids: Vec<Uuid> = (0..3).map(|i| claim_in(&call, i)).collect();
    let back = scripts::read_back(&mut con, &keys, &ids).await.unwrap();
    let hold = |remaining| {
        Some(scripts::ReadBack {
            remaining,
            expires_ms: Some(expires_ms),
        })
    };
    assert_eq!(back, vec![hold(4), hold(2), None]);
    // On a SKU whose claims are final at once, a win read back is no hold.
    let (mut con, keys) = seeded_sku(3, 1).await;
    let call = mint_call(0);
    scripts::claim(&mut con, &keys, &call, &[input("a", 1, None)], 1, 0)
        .await
        .unwrap();
    let back = scripts::read_back(&mut con, &keys, &[claim_in(&call, 0)])
        .await
        .unwrap();
    assert_eq!(
        back,
        vec![Some(scripts::ReadBack {
            remaining: 2,
            expires_ms: None
        })]
    );
}
