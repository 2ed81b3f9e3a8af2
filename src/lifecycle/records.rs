//! The Redis records of holds and waitlist entries, as `lua/lib/lifecycle.lua` packs them, and
//! the claim record claim.lua keeps for read-backs.

/// "status|quantity|expires_ms|offer(0/1)|len(user)|user".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    pub status: String,
    pub quantity: i32,
    pub expires_ms: i64,
    pub offer: bool,
    pub user: String,
}

impl Hold {
    pub fn parse(raw: &str) -> Option<Hold> {
        let mut it = raw.splitn(6, '|');
        let status = it.next()?.to_string();
        let quantity = it.next()?.parse().ok()?;
        let expires_ms = it.next()?.parse().ok()?;
        let offer = it.next()? == "1";
        let len: usize = it.next()?.parse().ok()?;
        let user = it.next()?;
        (user.len() == len).then(|| Hold {
            status,
            quantity,
            expires_ms,
            offer,
            user: user.to_string(),
        })
    }
}

/// "status|order|joined_ms|len(user)|user".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub status: String,
    pub order: i64,
    pub joined_ms: i64,
    pub user: String,
}

impl Entry {
    pub fn parse(raw: &str) -> Option<Entry> {
        let mut it = raw.splitn(5, '|');
        let status = it.next()?.to_string();
        let order = it.next()?.parse().ok()?;
        let joined_ms = it.next()?.parse().ok()?;
        let len: usize = it.next()?.parse().ok()?;
        let user = it.next()?;
        (user.len() == len).then(|| Entry {
            status,
            order,
            joined_ms,
            user: user.to_string(),
        })
    }
}

/// claim.lua's claim record, "remaining|quantity|len(user)|user" (`None` for a fence).
pub fn parse_claim_record(raw: &str) -> Option<(i32, String)> {
    let mut it = raw.splitn(4, '|');
    let _remaining: i64 = it.next()?.parse().ok()?;
    let quantity = it.next()?.parse().ok()?;
    let len: usize = it.next()?.parse().ok()?;
    let user = it.next()?;
    (user.len() == len).then(|| (quantity, user.to_string()))
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
        assert_eq!(parse_claim_record("40|2|3|a|b"), Some((2, "a|b".into())));
        assert_eq!(parse_claim_record("void"), None);
        assert!(Hold::parse("held|2|1700|0|9|u").is_none());
    }
}
