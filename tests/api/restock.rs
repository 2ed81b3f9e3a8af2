//! restock.lua and compensate.lua: each moves stock at most once, and only for the caller that
//! may (one operation id; the latest fencer of a parked claim).

use dropgate::scripts::{self, RestockMode, Restocked};
use uuid::Uuid;

use crate::helpers::{script_stock, seeded_sku};

const APPLY: RestockMode = RestockMode::Apply;

#[tokio::test]
async fn a_restock_operation_sent_twice_moves_the_stock_once() {
    let (mut con, keys) = seeded_sku(10, 1).await;
    let op = Uuid::now_v7();
    assert_eq!(
        scripts::restock(&mut con, &keys, &op, 5, APPLY, 1, 0)
            .await
            .unwrap(),
        Restocked::Applied {
            remaining: 15,
            seq: 1
        }
    );
    assert_eq!(
        scripts::restock(&mut con, &keys, &op, 5, APPLY, 1, 0)
            .await
            .unwrap(),
        Restocked::Applied {
            remaining: 15,
            seq: 1
        }
    );
    let other = Uuid::now_v7();
    assert_eq!(
        scripts::restock(&mut con, &keys, &other, -16, APPLY, 1, 0)
            .await
            .unwrap(),
        Restocked::Refused
    );
    assert_eq!(
        scripts::restock(&mut con, &keys, &other, -15, APPLY, 1, 0)
            .await
            .unwrap(),
        Restocked::Applied {
            remaining: 0,
            seq: 2
        }
    );
}

#[tokio::test]
async fn a_restock_read_back_before_it_ran_is_fenced_and_never_applies() {
    let (mut con, keys) = seeded_sku(10, 1).await;
    let op = Uuid::now_v7();
    // The apply's answer was lost and the read-back came first: not applied, and fenced...
    let read = scripts::restock(&mut con, &keys, &op, 7, RestockMode::Resolve, 1, 0)
        .await
        .unwrap();
    assert_eq!(read, Restocked::NotApplied);
    // ...so the apply, arriving late, moves nothing.
    let late = scripts::restock(&mut con, &keys, &op, 7, APPLY, 1, 0)
        .await
        .unwrap();
    assert_eq!(late, Restocked::NotApplied);
    assert_eq!(script_stock(&mut con, &keys).await, 10);
    // An applied operation reads back as applied, with the sequence it produced.
    let done = Uuid::now_v7();
    scripts::restock(&mut con, &keys, &done, 3, APPLY, 1, 0)
        .await
        .unwrap();
    let read = scripts::restock(&mut con, &keys, &done, 3, RestockMode::Resolve, 1, 0)
        .await
        .unwrap();
    assert_eq!(
        read,
        Restocked::Applied {
            remaining: 13,
            seq: 1
        }
    );
}

#[tokio::test]
async fn an_operator_whose_lock_is_gone_cannot_move_a_state_a_newer_one_touched() {
    let (mut con, keys) = seeded_sku(10, 1).await;
    // Operator 5 restocks; operator 4 (its lock lost without knowing) comes late.
    let newer = scripts::restock(&mut con, &keys, &Uuid::now_v7(), 2, APPLY, 5, 0)
        .await
        .unwrap();
    assert_eq!(
        newer,
        Restocked::Applied {
            remaining: 12,
            seq: 1
        }
    );
    let older = scripts::restock(&mut con, &keys, &Uuid::now_v7(), -12, APPLY, 4, 0)
        .await
        .unwrap();
    assert_eq!(older, Restocked::Superseded);
    assert!(!scripts::close_sku(&mut con, &keys, 4).await.unwrap());
    // What already happened is reported to anyone: an older operator reading back its own
    // applied restock hears "applied", never "not applied" (it would take the total back).
    let mine = Uuid::now_v7();
    scripts::restock(&mut con, &keys, &mine, 1, APPLY, 7, 0)
        .await
        .unwrap();
    scripts::restock(&mut con, &keys, &Uuid::now_v7(), 1, APPLY, 8, 0)
        .await
        .unwrap();
    let read = scripts::restock(&mut con, &keys, &mine, 1, RestockMode::Resolve, 7, 0)
        .await
        .unwrap();
    assert!(matches!(read, Restocked::Applied { .. }), "{read:?}");
    assert_eq!(script_stock(&mut con, &keys).await, 14);
    // The newest operator (or a later one) may close it.
    assert!(scripts::close_sku(&mut con, &keys, 8).await.unwrap());
}

/// compensate.lua as two racing reprocessors would call it (mode, owner).
async fn compensate(
    con: &mut redis::aio::ConnectionManager,
    keys: &dropgate::keys::SkuKeys,
    claim: &Uuid,
    mode: &str,
    owner: &str,
) -> i64 {
    let mut inv = dropgate::scripts::SCRIPTS.compensate.prepare_invoke();
    for k in keys.lifecycle() {
        inv.key(k);
    }
    inv.key(keys.compensation(claim))
        .key(keys.idempotency())
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
        user: "buyer".into(),
        quantity: 2,
        idempotency_key: None,
    };
    let call = dropgate::ids::mint_call(0);
    scripts::claim(&mut con, &keys, &call, std::slice::from_ref(&won), 1, 0)
        .await
        .unwrap();
    let id = dropgate::ids::claim_in(&call, 0);
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

/// decide_hold.lua as the confirm and cancel routes call it.
async fn decide_hold(
    con: &mut redis::aio::ConnectionManager,
    keys: &dropgate::keys::SkuKeys,
    claim: &Uuid,
    op: &str,
) -> (i64, String, i64) {
    let mut inv = dropgate::scripts::SCRIPTS.decide_hold.prepare_invoke();
    for k in keys.lifecycle() {
        inv.key(k);
    }
    inv.arg(op)
        .arg(claim.to_string())
        .arg("")
        .invoke_async(con)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_hold_gives_its_units_back_once_whether_cancelled_or_compensated_first() {
    let (mut con, keys) = crate::helpers::script_sku("held").await;
    let terms = scripts::Terms {
        hold_ms: 600_000,
        ..scripts::Terms::limit(5)
    };
    scripts::declare_sku(&mut con, &keys, true, 10, &terms, &Uuid::nil())
        .await
        .unwrap();
    let mut ids = Vec::new();
    for _ in 0..2 {
        let won = dropgate::scripts::ClaimInput {
            user: "buyer".into(),
            quantity: 2,
            idempotency_key: None,
        };
        let call = dropgate::ids::mint_call(0);
        scripts::claim(&mut con, &keys, &call, std::slice::from_ref(&won), 1, 0)
            .await
            .unwrap();
        ids.push(dropgate::ids::claim_in(&call, 0));
    }
    assert_eq!(script_stock(&mut con, &keys).await, 6);

    // Cancelled first: the cancel gives the units back; the compensation must not again.
    assert_eq!(decide_hold(&mut con, &keys, &ids[0], "cancel").await.0, 1);
    assert_eq!(script_stock(&mut con, &keys).await, 8);
    assert_eq!(compensate(&mut con, &keys, &ids[0], "fence", "r").await, 1);
    assert_eq!(compensate(&mut con, &keys, &ids[0], "give", "r").await, 3);
    assert_eq!(script_stock(&mut con, &keys).await, 8);

    // Compensated first: its units come back once, and the hold can no longer end again.
    assert_eq!(compensate(&mut con, &keys, &ids[1], "fence", "r").await, 1);
    assert_eq!(compensate(&mut con, &keys, &ids[1], "give", "r").await, 1);
    assert_eq!(script_stock(&mut con, &keys).await, 10);
    for op in ["cancel", "confirm"] {
        let (code, status, _) = decide_hold(&mut con, &keys, &ids[1], op).await;
        assert_eq!((code, status.as_str()), (2, "compensated"), "{op}");
    }
    let expiring: i64 = redis::cmd("ZCARD")
        .arg(keys.expiry())
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(
        expiring, 0,
        "no hold left for the expiry worker to give back"
    );
    assert_eq!(script_stock(&mut con, &keys).await, 10);
    let held: Option<i64> = redis::cmd("HGET")
        .arg(keys.users())
        .arg("buyer")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(held, None);
}

/// A restore closes the SKU, reads the total, then rebuilds the stock from it; if its last call
/// lands late (its answer or its lock lost), a restock under a newer epoch may have met the
/// absent state in between and gone into the total only. That restore must rebuild nothing
/// (the next one reads the new total), or the stock stays short of the restock for good (gateway
/// model `MODEL_SEED=8628172385699032972`: Redis 3 units short of the ledger once quiet).
#[tokio::test]
async fn a_restore_that_read_the_total_before_a_restock_on_the_absent_state_rebuilds_nothing() {
    let (mut con, keys) = seeded_sku(5, 1).await;
    assert!(scripts::close_sku(&mut con, &keys, 1).await.unwrap());
    // The restock (epoch 2) meets the absent state: its delta is the ledger's total's only.
    let lost = scripts::restock(&mut con, &keys, &Uuid::now_v7(), 3, APPLY, 2, 0).await;
    assert!(lost.is_err(), "a restock on an absent state: {lost:?}");
    let rebuild = |stock, epoch| scripts::operator::Rebuild {
        staged: "",
        stock,
        per_user_limit: 1,
        seq: 10,
        declare_id: Uuid::nil(),
        epoch,
        terms: scripts::Terms::limit(1),
        wl_order: 0,
        generation: None,
        rows: None,
    };
    let staged = keys.users_restore(&Uuid::now_v7());
    // The late rebuild of the restore of epoch 1, from the total before the restock.
    let late = scripts::operator::Rebuild {
        staged: &staged,
        ..rebuild(5, 1)
    };
    let r = scripts::operator::restore_sku(&mut con, &keys, &late).await;
    assert!(
        r.is_err(),
        "a restore older than the restock rebuilt the state: {r:?}"
    );
    let stock: Option<i64> = redis::cmd("HGET")
        .arg(keys.state())
        .arg("stock")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(stock, None, "the SKU stays closed");
    // The next restore (epoch 3) reads the total with the restock and rebuilds.
    let next = scripts::operator::Rebuild {
        staged: &staged,
        ..rebuild(8, 3)
    };
    assert!(scripts::operator::restore_sku(&mut con, &keys, &next)
        .await
        .unwrap());
    assert_eq!(script_stock(&mut con, &keys).await, 8);
}
