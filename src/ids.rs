//! Claim, call and waitlist entry ids: UUIDv7 carrying the SKU's catalog tag.
//!
//! `GET /v1/claims/{id}`, confirm and cancel name a claim by id alone, but a claim lives in
//! its SKU's Redis keys (one hash tag, one slot) until the writer has it in PostgreSQL. The
//! last four bytes of the id (random in a plain UUIDv7; the uuid crate's monotonic counter
//! sits before them) hold the SKU's `skus.tag`, so the SKU is found without a scan: a claim is
//! its owner's the moment it is answered 201.
//!
//! A claim is decided by one `claim.lua` call together with up to [`CALL_CLAIMS`] others, and
//! Redis keeps one record per call, not per claim (the read-back's fence, the journal entry).
//! So a claim's id is its call's id with the claim's position in the call written into the
//! low 7 bits of byte 11: [`call_of`] and [`index_of`] take it apart, and `claim.lua` derives
//! the same ids from the call id's text (hex digits 27–28). A call id is a claim id of index 0.
//! The bits above the index (the rest of rand_a and rand_b) are a per-process counter that
//! starts at a random value each millisecond and counts up within it, as the uuid crate's
//! counter does: ids sort by the time they were minted, and two calls of one process never
//! share an id.

use parking_lot::Mutex;
use uuid::Uuid;

/// Most claims one call decides: the index has 7 bits.
pub const CALL_CLAIMS: usize = 128;
/// Byte of the id that holds the index (its low 7 bits; the high bit is the counter's).
const INDEX_BYTE: usize = 11;
const INDEX_MASK: u8 = 0x7F;
/// Counter bits of a call id: 12 of rand_a, 6 + 8 + 8 + 1 of rand_b.
const COUNTER_BITS: u32 = 35;

/// (unix ms, counter) of the last call id minted by this process.
static LAST_CALL: Mutex<(u64, u64)> = Mutex::new((0, 0));

/// A fresh UUIDv7 for a waitlist entry (or any id that is not a claim of a call) of the SKU
/// with `tag`.
pub fn mint(tag: i32) -> Uuid {
    let mut bytes = *Uuid::now_v7().as_bytes();
    bytes[12..16].copy_from_slice(&tag.to_be_bytes());
    Uuid::from_bytes(bytes)
}

/// A fresh call id of the SKU with `tag`: a UUIDv7 whose index bits are 0. Its claims' ids are
/// [`claim_in`]`(call, i)`.
pub fn mint_call(tag: i32) -> Uuid {
    let now = u64::try_from(chrono::Utc::now().timestamp_millis()).unwrap_or(0);
    let (ms, counter) = {
        let mut last = LAST_CALL.lock();
        // A fresh millisecond starts the counter at a random value with its top bit clear
        // (room to count up); within a millisecond, or when the clock stepped back, it counts
        // on, and a counter that runs out borrows the next millisecond.
        let fresh = || rand::random::<u64>() & ((1 << (COUNTER_BITS - 1)) - 1);
        if now > last.0 {
            *last = (now, fresh());
        } else if last.1 + 1 < 1 << COUNTER_BITS {
            last.1 += 1;
        } else {
            *last = (last.0 + 1, fresh());
        }
        *last
    };
    let mut b = [0u8; 16];
    b[..6].copy_from_slice(&ms.to_be_bytes()[2..]);
    let rand_a = (counter >> 23) & 0xFFF;
    b[6] = 0x70 | (rand_a >> 8) as u8;
    b[7] = rand_a as u8;
    b[8] = 0x80 | ((counter >> 17) & 0x3F) as u8;
    b[9] = (counter >> 9) as u8;
    b[10] = (counter >> 1) as u8;
    b[INDEX_BYTE] = ((counter & 1) as u8) << 7;
    b[12..16].copy_from_slice(&tag.to_be_bytes());
    Uuid::from_bytes(b)
}

/// The id of claim `index` (below [`CALL_CLAIMS`]) of the call `call`.
pub fn claim_in(call: &Uuid, index: usize) -> Uuid {
    debug_assert!(
        index < CALL_CLAIMS,
        "a call holds at most {CALL_CLAIMS} claims"
    );
    let mut b = *call.as_bytes();
    b[INDEX_BYTE] = (b[INDEX_BYTE] & !INDEX_MASK) | (index as u8 & INDEX_MASK);
    Uuid::from_bytes(b)
}

/// The call that decided the claim `id` (for an id that no call minted, some id no call has).
pub fn call_of(id: &Uuid) -> Uuid {
    claim_in(id, 0)
}

/// The claim's position in its call.
pub fn index_of(id: &Uuid) -> usize {
    usize::from(id.as_bytes()[INDEX_BYTE] & INDEX_MASK)
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

    #[test]
    fn claims_of_a_call_are_v7_ids_of_its_time_and_tag_that_name_their_call_and_index() {
        let call = mint_call(-3);
        assert_eq!(index_of(&call), 0);
        let mut seen = std::collections::HashSet::new();
        for i in 0..CALL_CLAIMS {
            let id = claim_in(&call, i);
            assert_eq!(id.get_version_num(), 7);
            assert_eq!(id.get_variant(), uuid::Variant::RFC4122);
            assert_eq!((call_of(&id), index_of(&id), tag_of(&id)), (call, i, -3));
            assert_eq!(created_at(&id), created_at(&call));
            assert!(seen.insert(id));
        }
        let now = chrono::Utc::now().timestamp_millis();
        assert!((now - created_at(&call).timestamp_millis()).abs() < 5_000);
    }

    #[test]
    fn calls_minted_one_after_another_are_distinct_and_sort_by_time() {
        let calls: Vec<Uuid> = (0..10_000).map(|_| mint_call(1)).collect();
        assert!(calls.windows(2).all(|w| w[0] < w[1]), "strictly increasing");
        // The last claim of a call sorts before the next call.
        assert!(claim_in(&calls[0], CALL_CLAIMS - 1) < calls[1]);
    }
}
