//! What anyone can recompute: ticket ids, the pre-queue's shuffle key, the seed's commitment.
//! The algorithm is written out in docs/waiting-room.md ("Checking the order"); change one,
//! change the other.

use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::config::Secret;
use crate::sku::SkuId;

/// Shuffle keys are below 2^52; tickets joined after the opening are ordered from 2^52 on, so
/// every one of them follows the whole pre-queue (and a sorted-set score holds both exactly).
pub const ARRIVAL_BASE: u64 = 1 << 52;

/// The ticket of `visitor` on `sku`: the first 12 bytes of HMAC-SHA256(secret, "dropgate queue
/// ticket\0" sku "\0" visitor), with the UUID version 8 and variant bits set, then the SKU's
/// tag in the last four bytes ([`crate::ids`]). The same visitor always has the same ticket
/// (one per visitor and SKU), nobody without the secret can name another visitor's, and the
/// gateway checks an admission token's `tid` against its `sub` without reading anything.
pub fn ticket_id(secret: &Secret, sku: &SkuId, tag: i32, visitor: &str) -> Uuid {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(secret.expose().as_bytes())
        .expect("HMAC takes a key of any length");
    mac.update(b"dropgate queue ticket\0");
    mac.update(sku.as_str().as_bytes());
    mac.update(b"\0");
    mac.update(visitor.as_bytes());
    let h = mac.finalize().into_bytes();
    let mut b = [0u8; 16];
    b[..12].copy_from_slice(&h[..12]);
    b[6] = 0x80 | (b[6] & 0x0F);
    b[8] = 0x80 | (b[8] & 0x3F);
    b[12..].copy_from_slice(&tag.to_be_bytes());
    Uuid::from_bytes(b)
}

/// The 32 seed bytes of a seed's hex (an unreadable seed reads as empty: nothing is shuffled
/// by a seed nobody committed to).
pub fn seed_bytes(seed_hex: &str) -> Vec<u8> {
    hex::decode(seed_hex).unwrap_or_default()
}

/// A fresh seed: 32 bytes from the OS's generator, as hex.
pub fn new_seed() -> String {
    hex::encode(rand::random::<[u8; 32]>())
}

/// SHA-256 of the seed's bytes, as hex: what the SKU view shows from the declare on.
pub fn commitment(seed_hex: &str) -> String {
    hex::encode(Sha256::digest(seed_bytes(seed_hex)))
}

/// The shuffle key of a pre-queue ticket: the first 8 bytes of SHA-256(seed bytes || the
/// ticket's 16 bytes), big-endian, shifted right by 12 (the top 52 bits). The pre-queue is
/// ordered by (key, ticket bytes) ascending.
pub fn shuffle_key(seed: &[u8], ticket: &Uuid) -> u64 {
    let mut h = Sha256::new();
    h.update(seed);
    h.update(ticket.as_bytes());
    let d = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&d[..8]);
    u64::from_be_bytes(first) >> 12
}

/// The pre-queue's order: `tickets` sorted as the line holds them.
pub fn prequeue_order(seed_hex: &str, tickets: &[Uuid]) -> Vec<Uuid> {
    let seed = seed_bytes(seed_hex);
    let mut keyed: Vec<(u64, Uuid)> = tickets
        .iter()
        .map(|t| (shuffle_key(&seed, t), *t))
        .collect();
    keyed.sort_by(|a, b| {
        a.0.cmp(&b.0)
            .then_with(|| a.1.as_bytes().cmp(b.1.as_bytes()))
    });
    keyed.into_iter().map(|(_, t)| t).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sku(s: &str) -> &SkuId {
        SkuId::parse(s).expect("a valid SKU id")
    }

    #[test]
    fn a_visitor_has_one_ticket_per_sku_carrying_its_tag() {
        let s = Secret::new("0123456789abcdef0123");
        let a = ticket_id(&s, sku("drop-1"), 7, "v-1");
        assert_eq!(a, ticket_id(&s, sku("drop-1"), 7, "v-1"));
        assert_ne!(a, ticket_id(&s, sku("drop-1"), 7, "v-2"));
        assert_ne!(a, ticket_id(&s, sku("drop-2"), 7, "v-1"));
        assert_eq!(crate::ids::tag_of(&a), 7);
        assert_eq!(a.get_version_num(), 8);
    }

    #[test]
    fn shuffle_keys_sit_below_the_arrivals() {
        let seed = seed_bytes(&new_seed());
        for i in 0..1000 {
            let t = ticket_id(&Secret::new("x"), sku("s"), 1, &i.to_string());
            assert!(shuffle_key(&seed, &t) < ARRIVAL_BASE);
        }
    }

    #[test]
    fn the_commitment_is_the_sha256_of_the_seed_bytes() {
        // SHA-256 of 32 zero bytes.
        assert_eq!(
            commitment(&"00".repeat(32)),
            "66687aadf862bd776c8fc18b8e9f8e20089714856ee233b3902a591d0d5f2925"
        );
    }
}
