//! Tokens already verified, so a buyer's retries skip the HMAC and the two JSON parses.
//!
//! Verification is a pure function of the token's bytes except for its expiry, so its result
//! is kept, keyed by the exact token, and the expiry checked again on every use (as
//! `jsonwebtoken` checks it: expired once `exp` is before now, no leeway). Only tokens that
//! verified are kept: a forged or malformed token costs the full check every time and takes
//! no room. The set is bounded: [`SHARDS`] maps of at most [`PER_SHARD`] tokens each, 262,144
//! in all (≈ 250 bytes a token, so ≈ 64 MiB when full): room for the buyers of a large drop
//! (200,000 in `loadtest/drop.sh`, each retrying), which a smaller set cycled through would
//! miss every time. A full shard drops an arbitrary entry, which keeps about the hit rate of
//! random eviction when buyers outnumber the room.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;

use parking_lot::Mutex;

const SHARDS: usize = 16;
const PER_SHARD: usize = 16_384;

/// What a verified token says.
#[derive(Debug, Clone)]
pub(super) struct Verified {
    pub sub: String,
    pub exp: u64,
    pub sku: Option<String>,
    pub scope: Option<String>,
    pub tid: Option<String>,
    /// The JWKS generation the token verified under; 0: an admission secret.
    pub generation: u64,
}

pub(super) struct VerifiedTokens {
    hasher: RandomState,
    shards: Vec<Mutex<HashMap<Box<str>, Verified>>>,
}

impl VerifiedTokens {
    pub fn new() -> Self {
        VerifiedTokens {
            hasher: RandomState::new(),
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
        }
    }

    fn shard(&self, token: &str) -> &Mutex<HashMap<Box<str>, Verified>> {
        &self.shards[(self.hasher.hash_one(token) as usize) % SHARDS]
    }

    /// The verified claims of `token`, if it verified before and has not expired at `now`.
    pub fn get(&self, token: &str, now: u64) -> Option<Verified> {
        let shard = self.shard(token);
        let mut map = shard.lock();
        let v = map.get(token)?;
        if v.exp < now {
            map.remove(token);
            return None;
        }
        Some(v.clone())
    }

    pub fn insert(&self, token: &str, verified: Verified) {
        let mut map = self.shard(token).lock();
        if map.len() >= PER_SHARD {
            if let Some(victim) = map.keys().next().cloned() {
                map.remove(&victim);
            }
        }
        map.insert(token.into(), verified);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(exp: u64) -> Verified {
        Verified {
            sub: "u".into(),
            exp,
            sku: None,
            scope: None,
            tid: None,
            generation: 0,
        }
    }

    #[test]
    fn a_kept_token_expires_like_a_checked_one() {
        let t = VerifiedTokens::new();
        t.insert("tok", v(100));
        assert!(t.get("tok", 100).is_some());
        assert!(t.get("tok", 101).is_none());
        assert!(t.get("tok", 99).is_none(), "an expired token was dropped");
        assert!(t.get("other", 0).is_none());
    }

    #[test]
    fn the_set_stays_bounded() {
        let t = VerifiedTokens::new();
        for i in 0..(SHARDS * PER_SHARD + 1000) {
            t.insert(&format!("tok-{i}"), v(u64::MAX));
        }
        let kept: usize = t.shards.iter().map(|s| s.lock().len()).sum();
        assert!(kept <= SHARDS * PER_SHARD);
    }
}
