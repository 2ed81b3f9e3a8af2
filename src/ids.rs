//! Claim and waitlist entry ids: UUIDv7 carrying the SKU's catalog tag.
//!
//! `GET /v1/claims/{id}`, confirm and cancel name a claim by id alone, but a claim lives in
//! its SKU's Redis keys (one hash tag, one slot) until the writer has it in PostgreSQL. The
//! last four bytes of the id (random in a plain UUIDv7; the uuid crate's monotonic counter
//! sits before them) hold the SKU's `skus.tag`, so the SKU is found without a scan: a claim is
//! its owner's the moment it is answered 201.

use uuid::Uuid;

/// A fresh UUIDv7 for a claim or entry of the SKU with `tag`.
pub fn mint(tag: i32) -> Uuid {
    let mut bytes = *Uuid::now_v7().as_bytes();
    bytes[12..16].copy_from_slice(&tag.to_be_bytes());
    Uuid::from_bytes(bytes)
}

/// The SKU tag an id minted by [`mint`] carries (an id minted elsewhere yields some number
/// that names no SKU, or the wrong one: callers check ownership against Redis's record).
pub fn tag_of(id: &Uuid) -> i32 {
    let b = id.as_bytes();
    i32::from_be_bytes([b[12], b[13], b[14], b[15]])
}

/// When the id was minted (its UUIDv7 timestamp).
pub fn created_at(id: &Uuid) -> chrono::DateTime<chrono::Utc> {
    let ms = id.get_timestamp().map_or(0, |t| {
        let (secs, nanos) = t.to_unix();
        secs as i64 * 1000 + i64::from(nanos / 1_000_000)
    });
    chrono::DateTime::from_timestamp_millis(ms).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minted_id_is_a_v7_uuid_that_carries_its_tag_and_sorts_by_time() {
        let a = mint(7);
        let b = mint(7);
        assert_eq!(a.get_version_num(), 7);
        assert_eq!((tag_of(&a), tag_of(&b)), (7, 7));
        assert!(a < b, "ids minted later sort later");
        assert_ne!(a, b);
    }
}
