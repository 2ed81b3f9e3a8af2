//! `claim.lua`'s arguments for one call, spelled out here so that the script does no string
//! building or number formatting for a claim that wins: one argument per claim (its piece of
//! the journal entry and of the call record), each buyer once, and a plan of one byte per
//! claim that tells the script whose claim it is and whether it has a key.

use std::collections::HashMap;
use std::fmt::Write as _;

use redis::ScriptInvocation;

use super::ClaimInput;
use crate::keys::idempotency_field;

/// The per-call arguments of claim.lua from ARGV[7] on (see its header), in order.
pub(super) struct CallArgs<'a> {
    /// One byte per claim: its buyer's place among `buyers`, plus 128 when it has a key.
    plan: Vec<u8>,
    /// "" when every claim is of one unit, else every quantity joined by ",".
    quantities: String,
    /// Every claim's piece, in order: the call record's winners when every claim wins; each
    /// claim's own argument is a slice of it.
    pieces: String,
    /// Where each claim's piece ends in `pieces`.
    ends: Vec<usize>,
    /// The distinct buyers, in the order of their first claim.
    buyers: Vec<&'a str>,
    /// The Idempotency-Key of each claim that has one, in claim order.
    keys: Vec<&'a str>,
    /// Their idempotency records' fields, 16 bytes each (ARGV[2]).
    pub fields: Vec<u8>,
}

/// A claim's key, if it has one: an empty key is none (the HTTP layer never sends one).
fn key_of(c: &ClaimInput) -> Option<&str> {
    c.idempotency_key.as_deref().filter(|k| !k.is_empty())
}

impl<'a> CallArgs<'a> {
    /// `claims` holds 1 to 128 claims (the caller checks).
    pub fn new(claims: &'a [ClaimInput]) -> CallArgs<'a> {
        let n = claims.len();
        let mut args = CallArgs {
            plan: Vec::with_capacity(n),
            quantities: String::new(),
            pieces: String::with_capacity(n * 24),
            ends: Vec::with_capacity(n),
            buyers: Vec::with_capacity(n),
            keys: Vec::new(),
            fields: Vec::new(),
        };
        let mut places: HashMap<&str, u8> = HashMap::with_capacity(n);
        for (i, c) in claims.iter().enumerate() {
            let user = c.user.as_str();
            let place = *places.entry(user).or_insert_with(|| {
                args.buyers.push(user);
                // At most 128 claims, so at most 128 buyers: 0..=127.
                (args.buyers.len() - 1) as u8
            });
            let key = key_of(c);
            args.plan.push(place | (u8::from(key.is_some()) << 7));
            if let Some(k) = key {
                args.keys.push(k);
                args.fields.extend(idempotency_field(user, k));
            }
            // Writing to a String cannot fail.
            let _ = write!(args.pieces, "{i}|{}|{}|{user}", c.quantity, user.len());
            args.ends.push(args.pieces.len());
        }
        if claims.iter().any(|c| c.quantity != 1) {
            let qs: Vec<String> = claims.iter().map(|c| c.quantity.to_string()).collect();
            args.quantities = qs.join(",");
        }
        args
    }

    /// Appends ARGV[7] onwards to `inv` (ARGV[6], n, is the caller's).
    pub fn push(&self, inv: &mut ScriptInvocation<'_>) {
        inv.arg(self.plan.as_slice())
            .arg(self.quantities.as_str())
            .arg(self.pieces.as_str())
            .arg(self.buyers.len());
        for b in &self.buyers {
            inv.arg(*b);
        }
        let mut start = 0;
        for &end in &self.ends {
            inv.arg(&self.pieces[start..end]);
            start = end;
        }
        for k in &self.keys {
            inv.arg(*k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(user: &str, quantity: u32, key: Option<&str>) -> ClaimInput {
        ClaimInput {
            user: user.into(),
            quantity,
            idempotency_key: key.map(str::to_string),
        }
    }

    #[test]
    fn each_buyer_is_named_once_and_each_claim_points_at_its_buyer() {
        let claims = [
            claim("a", 1, None),
            claim("b|c", 1, Some("k1")),
            claim("a", 1, Some("k2")),
            claim("d", 1, Some("")),
        ];
        let args = CallArgs::new(&claims);
        assert_eq!(args.buyers, vec!["a", "b|c", "d"]);
        assert_eq!(args.plan, vec![0, 0x81, 0x80, 2]);
        assert_eq!(args.keys, vec!["k1", "k2"]);
        assert_eq!(args.fields.len(), 32);
        assert_eq!(args.quantities, "");
        assert_eq!(args.pieces, "0|1|1|a1|1|3|b|c2|1|1|a3|1|1|d");
        assert_eq!(args.ends, vec![7, 16, 23, 30]);
    }

    #[test]
    fn quantities_are_spelled_out_only_when_one_is_not_a_single_unit() {
        let claims = [claim("a", 1, None), claim("b", 12, None)];
        let args = CallArgs::new(&claims);
        assert_eq!(args.quantities, "1,12");
        assert_eq!(args.pieces, "0|1|1|a1|12|1|b");
    }
}
