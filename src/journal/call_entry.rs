//! A claim.lua call's journal entry: every winner of one call, with what they share written
//! once (see `lua/claim.lua`):
//!
//! `k` the call id, `t` when it ran (unix ms), `q` the state's sequence before its first
//! winner, `r` the stock before it, `x` the holds' expiry (held SKUs only), then a field `c`
//! per winner, in claim order: "index|quantity|len(user)|user idem" (the user id
//! length-prefixed, the Idempotency-Key the rest). Winner j (1-based) has the claim id
//! [`crate::ids::claim_in`]`(k, index)`, the sequence `q + j` and the stock `r` less the
//! quantities of winners 1..=j: Redis spells none of that out per winner.

use uuid::Uuid;

use super::Winner;
use crate::ids::{claim_in, CALL_CLAIMS};
use crate::keys::ShardName;

/// The fields of a call entry other than the winners, as read (`None`: absent).
pub(super) struct Shared<'a> {
    pub call: &'a [u8],
    pub ms: Option<&'a [u8]>,
    pub seq: Option<&'a [u8]>,
    pub stock: Option<&'a [u8]>,
    pub expires: Option<&'a [u8]>,
    /// A seated SKU's claim (claim_seats.lua, one winner): its seat ids, comma-joined.
    pub seats: Option<&'a [u8]>,
}

fn number<T: std::str::FromStr>(b: &[u8]) -> Option<T> {
    std::str::from_utf8(b).ok()?.parse().ok()
}

/// A winner's piece: (index, quantity, user, Idempotency-Key).
fn piece(raw: &[u8]) -> Option<(usize, i32, &str, &str)> {
    let raw = std::str::from_utf8(raw).ok()?;
    let mut it = raw.splitn(4, '|');
    let index = it.next()?.parse().ok().filter(|i| *i < CALL_CLAIMS)?;
    let quantity = it.next()?.parse().ok().filter(|q: &i32| *q > 0)?;
    let len: usize = it.next()?.parse().ok()?;
    let rest = it.next()?;
    Some((index, quantity, rest.get(..len)?, rest.get(len..)?))
}

/// Every winner of the entry, or `None` when any part of it cannot be read (the entry is then
/// quarantined whole: writing some of a call's winners would hide the others).
pub(super) fn winners(
    name: &ShardName,
    entry_id: &str,
    shared: &Shared,
    pieces: &[&[u8]],
) -> Option<Vec<Winner>> {
    let call = Uuid::try_parse_ascii(shared.call).ok()?;
    let created_ms: i64 = number(shared.ms?)?;
    let seq: i64 = number(shared.seq?)?;
    let mut stock: i64 = number(shared.stock?)?;
    let expires_ms = match shared.expires {
        Some(x) => Some(number(x)?),
        None => None,
    };
    let seats = match shared.seats {
        Some(z) if pieces.len() == 1 => Some(std::str::from_utf8(z).ok()?.to_string()),
        Some(_) => return None,
        None => None,
    };
    let mut out = Vec::with_capacity(pieces.len());
    for (j, raw) in pieces.iter().enumerate() {
        let (index, quantity, user, idem) = piece(raw)?;
        stock -= i64::from(quantity);
        out.push(Winner {
            entry_id: entry_id.to_string(),
            claim_id: claim_in(&call, index),
            // The catalog's SKU, whichever of its shards journaled the call.
            sku: name.sku().to_string(),
            user: user.to_string(),
            quantity,
            idempotency_key: (!idem.is_empty()).then(|| idem.to_string()),
            remaining_after: Some(stock),
            created_ms,
            seq: seq + j as i64 + 1,
            expires_ms,
            offer: false,
            seats: seats.clone(),
        });
    }
    (!out.is_empty()).then_some(out)
}

/// What can be made out of an entry that cannot be read whole: its first claim's id, and the
/// units of all its winners (`None` unless every winner's quantity can be read).
pub(super) fn heads(shared: &Shared, pieces: &[&[u8]]) -> (Option<Uuid>, Option<i32>) {
    let call = Uuid::try_parse_ascii(shared.call).ok();
    let index = |raw: &[u8]| -> Option<usize> {
        number(raw.split(|b| *b == b'|').next()?).filter(|i| *i < CALL_CLAIMS)
    };
    let claim_id = call.zip(pieces.first().and_then(|p| index(p)));
    let units = pieces
        .iter()
        .map(|p| number::<i32>(p.split(|b| *b == b'|').nth(1)?).filter(|q| *q > 0))
        .sum::<Option<i32>>()
        .filter(|_| !pieces.is_empty());
    (claim_id.map(|(c, i)| claim_in(&c, i)), units)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_winner_gets_its_id_sequence_and_stock_from_what_the_call_shares() {
        let call = crate::ids::mint_call(4);
        let text = call.to_string();
        let shared = Shared {
            call: text.as_bytes(),
            ms: Some(b"1700"),
            seq: Some(b"9"),
            stock: Some(b"50"),
            expires: None,
            seats: None,
        };
        let w = winners(
            &ShardName::parse("s"),
            "5-0",
            &shared,
            &[b"0|2|3|a|bk|ey", b"7|1|1|u"],
        )
        .unwrap();
        let got: Vec<_> = w
            .iter()
            .map(|w| {
                let key = w.idempotency_key.as_deref();
                (
                    w.claim_id,
                    w.quantity,
                    w.seq,
                    w.remaining_after,
                    w.user.as_str(),
                    key,
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (claim_in(&call, 0), 2, 10, Some(48), "a|b", Some("k|ey")),
                (claim_in(&call, 7), 1, 11, Some(47), "u", None),
            ]
        );
        assert!(w
            .iter()
            .all(|w| w.created_ms == 1700 && w.entry_id == "5-0"));
        assert_eq!(
            heads(&shared, &[b"3|2|1|u", b"x|y"]),
            (Some(claim_in(&call, 3)), None)
        );
        assert!(winners(
            &ShardName::parse("s"),
            "5-0",
            &shared,
            &[b"0|2|3|a|bk", b"200|1|1|u"]
        )
        .is_none());
        assert!(winners(&ShardName::parse("s"), "5-0", &shared, &[b"0|2|9|u"]).is_none());
    }
}
