//! The Redis records of holds and waitlist entries, as `lua/lib/lifecycle.lua` packs them, and
//! the call record claim.lua keeps for read-backs.

use crate::status::{ClaimStatus, EntryStatus};

/// "status|quantity|expires_ms|offer(0/1)|len(user)|user", on a seated SKU then
/// "|bit:id,bit:id,...".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    pub status: ClaimStatus,
    pub quantity: i32,
    pub expires_ms: i64,
    pub offer: bool,
    pub user: String,
    /// A seated hold's seat ids.
    pub seats: Option<Vec<String>>,
}

impl Hold {
    pub fn parse(raw: &str) -> Option<Hold> {
        let mut it = raw.splitn(6, '|');
        let status = it.next()?.parse().ok()?;
        let quantity = it.next()?.parse().ok()?;
        let expires_ms = it.next()?.parse().ok()?;
        let offer = it.next()? == "1";
        let len: usize = it.next()?.parse().ok()?;
        // A seated hold's record goes on after its user: "|bit,bit,..." (its seats' bits).
        let rest = it.next()?;
        let user = rest.get(..len)?;
        let tail = &rest[len..];
        let seats = match tail.strip_prefix('|') {
            Some(pairs) => Some(
                pairs
                    .split(',')
                    .map(|p| p.split_once(':').map(|(_, id)| id.to_string()))
                    .collect::<Option<Vec<_>>>()?,
            ),
            None if tail.is_empty() => None,
            None => return None,
        };
        Some(Hold {
            status,
            quantity,
            expires_ms,
            offer,
            user: user.to_string(),
            seats,
        })
    }
}

/// "status|order|joined_ms|len(user)|user", and "|quantity" when it waits for more than one
/// unit (a seated SKU's entry).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub status: EntryStatus,
    pub order: i64,
    pub joined_ms: i64,
    pub user: String,
    pub quantity: u32,
}

impl Entry {
    pub fn parse(raw: &str) -> Option<Entry> {
        let mut it = raw.splitn(5, '|');
        let status = it.next()?.parse().ok()?;
        let order = it.next()?.parse().ok()?;
        let joined_ms = it.next()?.parse().ok()?;
        let len: usize = it.next()?.parse().ok()?;
        let (user, quantity) = crate::record::user_and_quantity(it.next()?, len)?;
        Some(Entry {
            status,
            order,
            joined_ms,
            user: user.to_string(),
            quantity,
        })
    }
}

/// Claim `index` of a call, as claim.lua's call record has it: (quantity, user), or `None`
/// when the call's record does not hold it (the claim did not win, or the record is a
/// resolver's "void" fence). The record is "<stock before>|" then the call's winners, each
/// "index|quantity|len(user)|user", concatenated ("<stock before>:<expires_ms>|" on a SKU that
/// holds its claims).
pub fn claim_in_call_record(raw: &str, index: usize) -> Option<(i32, String)> {
    let (head, mut rest) = raw.split_once('|')?;
    let stock = head.split_once(':').map_or(head, |(s, _)| s);
    let _stock: i64 = stock.parse().ok()?;
    while !rest.is_empty() {
        let mut it = rest.splitn(4, '|');
        let i: usize = it.next()?.parse().ok()?;
        let quantity = it.next()?.parse().ok()?;
        let len: usize = it.next()?.parse().ok()?;
        let tail = it.next()?;
        let user = tail.get(..len)?;
        if i == index {
            return Some((quantity, user.to_string()));
        }
        rest = tail.get(len..)?;
    }
    None
}

/// The hold expiry a call record carries (a call decided on a SKU that holds its claims).
pub fn call_record_expiry(raw: &str) -> Option<i64> {
    let (head, _) = raw.split_once('|')?;
    head.split_once(':')?.1.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_keep_separators_inside_user_ids() {
        let h = Hold::parse("held|2|1700|1|3|a|b").unwrap();
        assert_eq!((h.quantity, h.expires_ms, h.offer), (2, 1700, true));
        assert_eq!(h.user, "a|b");
        let e = Entry::parse("waiting|4|1700|3|a|b").unwrap();
        assert_eq!((e.order, e.user.as_str()), (4, "a|b"));
        let call = "42|0|1|2|u|3|2|3|a|b";
        assert_eq!(claim_in_call_record(call, 0), Some((1, "u|".into())));
        assert_eq!(claim_in_call_record(call, 3), Some((2, "a|b".into())));
        assert_eq!(claim_in_call_record(call, 1), None);
        assert_eq!(claim_in_call_record("void", 0), None);
        let held = "42:1700|0|1|2|u|";
        assert_eq!(claim_in_call_record(held, 0), Some((1, "u|".into())));
        assert_eq!(call_record_expiry(held), Some(1700));
        assert_eq!(call_record_expiry(call), None);
        assert!(Hold::parse("held|2|1700|0|9|u").is_none());
    }
}
