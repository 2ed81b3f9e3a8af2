use super::*;

fn claims(n: usize) -> Vec<ClaimInput> {
    (0..n)
        .map(|i| ClaimInput {
            user: format!("u{i}"),
            quantity: 1 + i as u32,
            idempotency_key: None,
        })
        .collect()
}

#[test]
fn a_lost_sku_is_an_error_not_a_sell_out() {
    let reply = Value::Array(vec![Value::BulkString(b"lost".to_vec())]);
    assert!(matches!(
        parse_claim_reply(reply, &claims(1)),
        Err(StoreError::SkuLost)
    ));
}

#[test]
fn a_fenced_call_decides_none_of_its_claims() {
    let reply = Value::Array(vec![Value::BulkString(b"fenced".to_vec())]);
    assert_eq!(
        parse_claim_reply(reply, &claims(3)).unwrap(),
        vec![Decision::Fenced; 3]
    );
}

#[test]
fn a_stale_sku_is_an_error_not_a_sell_out() {
    let reply = Value::Array(vec![Value::BulkString(b"stale".to_vec())]);
    assert!(matches!(
        parse_claim_reply(reply, &claims(1)),
        Err(StoreError::Stale)
    ));
}

#[test]
fn a_call_where_every_claim_won_gives_each_its_stock_from_the_stock_before() {
    let reply = Value::Array(vec![Value::Int(0), Value::Int(10)]);
    let won = |remaining| Decision::Won {
        remaining,
        expires_ms: None,
    };
    assert_eq!(
        parse_claim_reply(reply, &claims(3)).unwrap(),
        vec![won(9), won(7), won(4)]
    );
    let held = Value::Array(vec![Value::Int(1_700), Value::Int(1)]);
    assert_eq!(
        parse_claim_reply(held, &claims(1)).unwrap(),
        vec![Decision::Won {
            remaining: 0,
            expires_ms: Some(1_700)
        }]
    );
}
