//! Redis key names. Every key of a SKU carries the SKU's hash tag, `{<sku>}`, so all of a
//! SKU's keys live in one Cluster slot and one script may touch them together.

/// The key names of one SKU under one gateway prefix.
#[derive(Debug, Clone)]
pub struct SkuKeys {
    /// `<prefix>:{<sku>}:`, the common head of every key of this SKU.
    head: String,
}

impl SkuKeys {
    pub fn new(prefix: &str, sku: &str) -> Self {
        SkuKeys {
            head: format!("{prefix}:{{{sku}}}:"),
        }
    }

    /// Hash of `stock`, `limit` and `inflight`; its absence means Redis lost the SKU.
    pub fn state(&self) -> String {
        format!("{}state", self.head)
    }

    /// Hash of user id to units held.
    pub fn users(&self) -> String {
        format!("{}users", self.head)
    }

    /// Stream of winners not yet acknowledged by a writer.
    pub fn journal(&self) -> String {
        format!("{}journal", self.head)
    }

    /// The outcome record of one claim id, read back when a call's outcome is uncertain.
    pub fn claim(&self, claim_id: &uuid::Uuid) -> String {
        format!("{}claim:{}", self.head, claim_id.simple())
    }

    /// The idempotency record of one key of one user. The user id is length-prefixed so that
    /// `("a:b", "c")` and `("a", "b:c")` never share a key.
    pub fn idempotency(&self, user: &str, key: &str) -> String {
        format!("{}idem:{}:{}:{}", self.head, user.len(), user, key)
    }

    /// Marker that a claim's units were given back, so compensation happens once.
    pub fn compensation(&self, claim_id: &uuid::Uuid) -> String {
        format!("{}comp:{}", self.head, claim_id.simple())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_shares_the_sku_hash_tag() {
        let k = SkuKeys::new("dg", "drop-1");
        let id = uuid::Uuid::nil();
        for key in [
            k.state(),
            k.users(),
            k.journal(),
            k.claim(&id),
            k.idempotency("u:1", "k{x}"),
            k.compensation(&id),
        ] {
            assert!(key.starts_with("dg:{drop-1}:"), "{key}");
        }
    }

    #[test]
    fn idempotency_keys_do_not_collide_across_user_boundaries() {
        let k = SkuKeys::new("dg", "s");
        assert_ne!(k.idempotency("a:b", "c"), k.idempotency("a", "b:c"));
    }
}
