//! A winner's record in full, `claim_id|quantity|created_ms|remaining|seq|len(user)|user idem`:
//! the idempotency record `claim.lua` writes for a keyed winner (a replay answers from it), and
//! the field `c` of a journal entry of one winner (a waitlist offer, or an entry of an earlier
//! `claim.lua`; a call's entry shares what its winners have in common instead, see
//! `journal/call_entry.rs`).
//!
//! The user id is length-prefixed and the Idempotency-Key is the rest, so either may hold `|`.
//! A held winner's record is prefixed `h|expires_ms|`.
//!
//! And [`IdemRecord`], the idempotency record `claim.lua` keeps for a keyed winner, which holds
//! only what a replay answers with (`claim_id|quantity|remaining`, a held winner's prefixed
//! `h|expires_ms|`): the user and the key are its field's name already
//! ([`crate::keys::idempotency_field`]), and the sequence is the journal's business.

use uuid::Uuid;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRecord {
    pub claim_id: Uuid,
    pub quantity: u32,
    pub created_ms: i64,
    /// Stock left right after this claim won.
    pub remaining: i64,
    /// The SKU state's sequence right after this claim won (see `lua/claim.lua`).
    pub seq: i64,
    pub user: String,
    pub idempotency_key: Option<String>,
    /// When the hold expires (Redis's clock, unix ms); `None` for a claim final at once.
    pub expires_ms: Option<i64>,
}

impl ClaimRecord {
    pub fn parse(raw: &str) -> Option<ClaimRecord> {
        let (expires_ms, raw) = split_held(raw)?;
        let mut it = raw.splitn(7, '|');
        let claim_id = Uuid::parse_str(it.next()?).ok()?;
        let quantity: u32 = it.next()?.parse().ok()?;
        let created_ms = it.next()?.parse().ok()?;
        let remaining = it.next()?.parse().ok()?;
        let seq = it.next()?.parse().ok()?;
        let user_len: usize = it.next()?.parse().ok()?;
        let rest = it.next()?;
        let user = rest.get(..user_len)?.to_string();
        let idem = rest.get(user_len..)?;
        (quantity > 0).then(|| ClaimRecord {
            claim_id,
            quantity,
            created_ms,
            remaining,
            seq,
            user,
            idempotency_key: (!idem.is_empty()).then(|| idem.to_string()),
            expires_ms,
        })
    }

    /// Renders the record claim.lua would have written (restore rebuilds idempotency records).
    pub fn render(&self) -> String {
        let held = held_prefix(self.expires_ms);
        format!(
            "{held}{}|{}|{}|{}|{}|{}|{}{}",
            self.claim_id,
            self.quantity,
            self.created_ms,
            self.remaining,
            self.seq,
            self.user.len(),
            self.user,
            self.idempotency_key.as_deref().unwrap_or("")
        )
    }
}

/// A held winner's record starts `h|expires_ms|`: the expiry, and the rest of the record.
fn split_held(raw: &str) -> Option<(Option<i64>, &str)> {
    match raw.strip_prefix("h|") {
        Some(rest) => {
            let (exp, rest) = rest.split_once('|')?;
            Some((Some(exp.parse().ok()?), rest))
        }
        None => Some((None, raw)),
    }
}

fn held_prefix(expires_ms: Option<i64>) -> String {
    expires_ms.map_or(String::new(), |ms| format!("h|{ms}|"))
}

/// A keyed winner's idempotency record: what a replay of its request answers with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdemRecord {
    pub claim_id: Uuid,
    pub quantity: u32,
    /// Stock left right after this claim won.
    pub remaining: i64,
    /// When the hold expires (Redis's clock, unix ms); `None` for a claim final at once.
    pub expires_ms: Option<i64>,
}

impl IdemRecord {
    pub fn parse(raw: &str) -> Option<IdemRecord> {
        let (expires_ms, raw) = split_held(raw)?;
        let mut it = raw.split('|');
        let claim_id = Uuid::parse_str(it.next()?).ok()?;
        let quantity: u32 = it.next()?.parse().ok()?;
        let remaining = it.next()?.parse().ok()?;
        (quantity > 0 && it.next().is_none()).then_some(IdemRecord {
            claim_id,
            quantity,
            remaining,
            expires_ms,
        })
    }

    /// Renders the record claim.lua would have written (restore rebuilds idempotency records).
    pub fn render(&self) -> String {
        let held = held_prefix(self.expires_ms);
        format!(
            "{held}{}|{}|{}",
            self.claim_id, self.quantity, self.remaining
        )
    }
}

/// A waitlist record's tail, `user` of `len` bytes then `|quantity` when the entry waits for
/// more than one unit (`lua/lib/lifecycle.lua` pack_entry): the user and the quantity (1 when
/// absent).
pub fn user_and_quantity(tail: &str, len: usize) -> Option<(&str, u32)> {
    let user = tail.get(..len)?;
    let quantity = match tail.get(len..)? {
        "" => 1,
        rest => rest
            .strip_prefix('|')?
            .parse()
            .ok()
            .filter(|q: &u32| *q > 1)?,
    };
    Some((user, quantity))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_with_separators_inside_user_and_key() {
        let rec = ClaimRecord {
            claim_id: Uuid::now_v7(),
            quantity: 2,
            created_ms: 1_700_000_000_000,
            remaining: 40,
            seq: 7,
            user: "a|b".into(),
            idempotency_key: Some("k|ey".into()),
            expires_ms: None,
        };
        assert_eq!(ClaimRecord::parse(&rec.render()), Some(rec.clone()));
        let held = ClaimRecord {
            expires_ms: Some(1_700_000_060_000),
            ..rec.clone()
        };
        assert!(held.render().starts_with("h|1700000060000|"));
        assert_eq!(ClaimRecord::parse(&held.render()), Some(held));
        let bare = ClaimRecord {
            idempotency_key: None,
            ..rec
        };
        assert_eq!(ClaimRecord::parse(&bare.render()), Some(bare));
    }

    #[test]
    fn idempotency_records_round_trip_held_or_not() {
        let rec = IdemRecord {
            claim_id: Uuid::now_v7(),
            quantity: 2,
            remaining: 40,
            expires_ms: None,
        };
        assert_eq!(IdemRecord::parse(&rec.render()), Some(rec.clone()));
        let held = IdemRecord {
            expires_ms: Some(1_700_000_060_000),
            ..rec
        };
        assert!(held.render().starts_with("h|1700000060000|"));
        assert_eq!(IdemRecord::parse(&held.render()), Some(held));
        assert!(IdemRecord::parse("void").is_none());
        assert!(IdemRecord::parse(&format!("{}|0|1", Uuid::nil())).is_none());
        assert!(IdemRecord::parse(&format!("{}|1|1|0", Uuid::nil())).is_none());
    }

    #[test]
    fn garbage_is_not_a_record() {
        let id = Uuid::now_v7();
        assert!(ClaimRecord::parse("void").is_none());
        assert!(ClaimRecord::parse(&format!("{id}|1|1|0|1|9|u")).is_none());
        assert!(ClaimRecord::parse(&format!("{id}|0|1|0|1|1|u")).is_none());
    }

    #[test]
    fn a_waitlist_tail_carries_its_quantity_only_above_one() {
        assert_eq!(super::user_and_quantity("a|b", 3), Some(("a|b", 1)));
        assert_eq!(super::user_and_quantity("a|b|4", 3), Some(("a|b", 4)));
        assert_eq!(super::user_and_quantity("a|b|1", 3), None);
        assert_eq!(super::user_and_quantity("a|bx4", 3), None);
        assert_eq!(super::user_and_quantity("a|", 3), None);
    }
}
