//! The journal parser's unit tests: entries as Redis returns them, read or quarantined.

use super::entry::{parse_entries, parse_entry, parse_packed};
use super::*;
use crate::keys::ShardName;
use uuid::Uuid;

/// The SKU every entry here is read for.
fn s() -> ShardName {
    ShardName::parse("s")
}

#[test]
fn packed_entries_keep_separators_inside_user_and_key() {
    let id = Uuid::now_v7();
    let w = parse_packed(
        &s(),
        "1-0".into(),
        &format!("{id}|2|1700|40|9|3|a|bk|ey"),
        false,
    )
    .unwrap();
    assert_eq!(
        (w.claim_id, w.quantity, w.created_ms, w.seq),
        (id, 2, 1700, 9)
    );
    assert_eq!(w.remaining_after, Some(40));
    assert_eq!(w.user, "a|b");
    assert_eq!(w.idempotency_key.as_deref(), Some("k|ey"));
    let w = parse_packed(&s(), "1-0".into(), &format!("{id}|1|1|0|1|1|u"), false).unwrap();
    assert_eq!((w.user.as_str(), w.idempotency_key), ("u", None));
    assert!(parse_packed(&s(), "1-0".into(), &format!("{id}|1|1|0|1|9|u"), false).is_none());
}

fn entry(c: &[u8]) -> Value {
    Value::Array(vec![
        Value::BulkString(b"7-1".to_vec()),
        Value::Array(vec![
            Value::BulkString(b"c".to_vec()),
            Value::BulkString(c.to_vec()),
        ]),
    ])
}

#[test]
fn an_entry_that_cannot_be_read_is_kept_byte_for_byte_with_what_can_be_made_out() {
    let id = Uuid::now_v7();
    let mut c = format!("{id}|2|1700|40|5|2|").into_bytes();
    c.extend_from_slice(b"\xff\xfe");
    let Some(Err(u)) = parse_entry(&s(), entry(&c)) else {
        panic!("invalid UTF-8 is not a winner");
    };
    assert_eq!(
        (u.entry_id.as_str(), u.claim_id, u.units),
        ("7-1", Some(id), Some(2))
    );
    assert_eq!(u.raw, [b"c=".as_slice(), &c].concat());
    let Some(Err(u)) = parse_entry(&s(), entry(b"garbage")) else {
        panic!("garbage is not a winner");
    };
    assert_eq!((u.claim_id, u.units), (None, None));
}

fn entry_of(fields: &[(&[u8], &[u8])]) -> Value {
    Value::Array(vec![
        Value::BulkString(b"9-0".to_vec()),
        Value::Array(
            fields
                .iter()
                .flat_map(|(f, v)| [Value::BulkString(f.to_vec()), Value::BulkString(v.to_vec())])
                .collect(),
        ),
    ])
}

#[test]
fn an_entry_of_a_calls_winners_is_one_winner_each_sharing_the_entry() {
    let call = crate::ids::mint_call(1);
    let text = call.to_string();
    let fields: Vec<(&[u8], &[u8])> = vec![
        (b"k", text.as_bytes()),
        (b"t", b"1700"),
        (b"q", b"6"),
        (b"r", b"40"),
        (b"c", b"0|1|2|u0"),
        (b"c", b"2|2|2|u1"),
        (b"c", b"4|3|2|u2key"),
    ];
    let mut batch = Batch::default();
    parse_entries(&s(), Value::Array(vec![entry_of(&fields)]), &mut batch);
    let got: Vec<(&str, Uuid, i32, i64, Option<i64>)> = batch
        .winners
        .iter()
        .map(|w| {
            (
                w.entry_id.as_str(),
                w.claim_id,
                w.quantity,
                w.seq,
                w.remaining_after,
            )
        })
        .collect();
    let id = |i| crate::ids::claim_in(&call, i);
    assert_eq!(
        got,
        vec![
            ("9-0", id(0), 1, 7, Some(39)),
            ("9-0", id(2), 2, 8, Some(37)),
            ("9-0", id(4), 3, 9, Some(34)),
        ]
    );
    assert_eq!(batch.winners[2].idempotency_key.as_deref(), Some("key"));
    assert_eq!((batch.len(), batch.entries()), (3, 1));
    assert!(batch.others.is_empty() && batch.unreadable.is_empty());
}

#[test]
fn an_entry_with_one_garbled_winner_is_quarantined_whole_with_every_winners_units() {
    let call = crate::ids::mint_call(1);
    let text = call.to_string();
    let mut bad = b"5|3|2|".to_vec();
    bad.extend_from_slice(b"\xff\xfe");
    let shared: [(&[u8], &[u8]); 4] = [
        (b"k", text.as_bytes()),
        (b"t", b"1700"),
        (b"q", b"6"),
        (b"r", b"40"),
    ];
    let mut fields = shared.to_vec();
    fields.extend([(&b"c"[..], &b"1|2|1|u"[..]), (b"c", &bad)]);
    let Some(Err(u)) = parse_entry(&s(), entry_of(&fields)) else {
        panic!("an entry with a garbled winner is not written in part");
    };
    assert_eq!(
        (u.claim_id, u.units),
        (Some(crate::ids::claim_in(&call, 1)), Some(5))
    );
    // A call's winners beside a hold change is no entry any script writes.
    let mut mixed = shared.to_vec();
    mixed.extend([(&b"c"[..], &b"1|2|1|u"[..]), (b"s", b"x")]);
    assert!(matches!(parse_entry(&s(), entry_of(&mixed)), Some(Err(_))));
    // Two winners in full in one entry: no script writes that either.
    let a = format!("{}|2|1700|40|5|1|u", Uuid::now_v7());
    let two = [(&b"c"[..], a.as_bytes()), (b"c", a.as_bytes())];
    assert!(matches!(parse_entry(&s(), entry_of(&two)), Some(Err(_))));
}

#[test]
fn a_rendered_winner_reads_back_as_itself() {
    let id = Uuid::now_v7();
    let c = format!("{id}|1|1700|40|5|3|a|bkey");
    let w = parse_packed(&s(), "7-1".into(), &c, false).unwrap();
    assert_eq!(render(&w), format!("c={c}").into_bytes());
}
