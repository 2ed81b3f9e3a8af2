use super::*;

#[test]
fn a_lost_sku_is_an_error_not_a_sell_out() {
    let reply = Value::Array(vec![Value::BulkString(b"lost".to_vec())]);
    assert!(matches!(
        parse_claim_reply(reply, 1),
        Err(StoreError::SkuLost)
    ));
}

#[test]
fn a_fenced_call_decides_none_of_its_claims() {
    let reply = Value::Array(vec![Value::BulkString(b"fenced".to_vec())]);
    assert_eq!(
        parse_claim_reply(reply, 3).unwrap(),
        vec![Decision::Fenced; 3]
    );
}

#[test]
fn a_stale_sku_is_an_error_not_a_sell_out() {
    let reply = Value::Array(vec![Value::BulkString(b"stale".to_vec())]);
    assert!(matches!(
        parse_claim_reply(reply, 1),
        Err(StoreError::Stale)
    ));
}
