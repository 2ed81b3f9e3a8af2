//! restock.lua: one operation moves the stock at most once, and an uncertain one is read back.

use std::time::Duration;

use dropgate::scripts::{self, Restocked};
use uuid::Uuid;

use crate::helpers::seeded_sku;

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
    let stock: i64 = redis::cmd("HGET")
        .arg(keys.state())
        .arg("stock")
        .query_async(&mut con)
        .await
        .unwrap();
    match outcome {
        Restocked::Applied(n) => assert_eq!((n, stock), (17, 17)),
        Restocked::NotApplied => assert_eq!(stock, 10),
        Restocked::Refused => panic!("a positive delta is never refused"),
    }
    let again = scripts::restock(&mut con, &keys, &op, 7, T).await.unwrap();
    let after: i64 = redis::cmd("HGET")
        .arg(keys.state())
        .arg("stock")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(after, stock, "{again:?}");
}
