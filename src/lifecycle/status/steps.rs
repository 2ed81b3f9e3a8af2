//! The tables of [`super`]: every step of a claim's and of a waitlist entry's life, with the
//! scripts that make it, the statements that record it and the events that tell it.

use super::{ClaimStatus, EntryStatus, Step};

const WRITE_WIN: &str = "src/writer/postgres.rs: INSERT_ISSUANCES";
const WRITE_PARKED: &str = "src/reprocess/rows.rs: write";
pub(super) const APPLY_CHANGES: &str = "src/writer/lifecycle.rs: APPLY_CHANGES";
const COMPENSATE: &[&str] = &[
    "src/reprocess/rows.rs: decide_compensation",
    "src/reprocess/rows.rs: mark_compensated",
];
const APPLY_WAITS: &[&str] = &["src/writer/lifecycle.rs: APPLY_WAITS"];
/// `give_back`'s offers and `end_hold`'s endings, run by every script that gives units back.
const LIB: &str = "lua/lib/lifecycle.lua";

/// A hold ends once: every step out of `held` is guarded by `status = 'held'` in Redis and in
/// PostgreSQL, so a confirm racing its expiry has exactly one winner (I2, I4).
pub const CLAIM_STEPS: &[Step<ClaimStatus>] = {
    use ClaimStatus::*;
    &[
        Step {
            from: None,
            to: Issued,
            decided_by: &["lua/claim.lua"],
            recorded_by: &[WRITE_WIN, WRITE_PARKED],
            events: &["claim.won"],
        },
        Step {
            from: None,
            to: Held,
            decided_by: &["lua/claim.lua", LIB],
            recorded_by: &[WRITE_WIN, WRITE_PARKED],
            events: &["claim.won", "waitlist.offered"],
        },
        Step {
            from: Some(Held),
            to: Confirmed,
            decided_by: &["lua/decide_hold.lua"],
            recorded_by: &[APPLY_CHANGES, WRITE_PARKED],
            events: &["claim.confirmed"],
        },
        Step {
            from: Some(Held),
            to: Cancelled,
            decided_by: &["lua/decide_hold.lua", "lua/leave_waitlist.lua"],
            recorded_by: &[APPLY_CHANGES, WRITE_PARKED],
            events: &["claim.cancelled"],
        },
        Step {
            from: Some(Held),
            to: Expired,
            decided_by: &["lua/decide_hold.lua", "lua/expire_holds.lua"],
            recorded_by: &[APPLY_CHANGES, WRITE_PARKED],
            events: &["claim.expired"],
        },
        // A claim PostgreSQL refused for good is compensated whatever it went through while
        // parked; the units come back once (I2): a hold that had ended gave them back then,
        // and compensate.lua only marks it.
        Step {
            from: Some(Issued),
            to: Compensated,
            decided_by: &["lua/compensate.lua"],
            recorded_by: COMPENSATE,
            events: &["claim.compensated"],
        },
        Step {
            from: Some(Held),
            to: Compensated,
            decided_by: &["lua/compensate.lua"],
            recorded_by: COMPENSATE,
            events: &["claim.compensated"],
        },
        Step {
            from: Some(Confirmed),
            to: Compensated,
            decided_by: &["lua/compensate.lua"],
            recorded_by: COMPENSATE,
            events: &["claim.compensated"],
        },
        Step {
            from: Some(Cancelled),
            to: Compensated,
            decided_by: &[],
            recorded_by: &["src/reprocess/rows.rs: mark_compensated"],
            events: &["claim.compensated"],
        },
        Step {
            from: Some(Expired),
            to: Compensated,
            decided_by: &[],
            recorded_by: &["src/reprocess/rows.rs: mark_compensated"],
            events: &["claim.compensated"],
        },
    ]
};

/// An entry only moves forward: waiting, then offered, then claimed, expired or left.
pub const ENTRY_STEPS: &[Step<EntryStatus>] = {
    use EntryStatus::*;
    &[
        Step {
            from: None,
            to: Waiting,
            decided_by: &["lua/join_waitlist.lua"],
            recorded_by: APPLY_WAITS,
            events: &[],
        },
        Step {
            from: Some(Waiting),
            to: Offered,
            decided_by: &[LIB],
            recorded_by: APPLY_WAITS,
            events: &["waitlist.offered"],
        },
        // The user reached its limit since joining: the unit goes to the next in line.
        Step {
            from: Some(Waiting),
            to: Expired,
            decided_by: &[LIB],
            recorded_by: APPLY_WAITS,
            events: &[],
        },
        Step {
            from: Some(Waiting),
            to: Left,
            decided_by: &["lua/leave_waitlist.lua"],
            recorded_by: APPLY_WAITS,
            events: &[],
        },
        Step {
            from: Some(Offered),
            to: Claimed,
            decided_by: &["lua/decide_hold.lua"],
            recorded_by: APPLY_WAITS,
            events: &["claim.confirmed"],
        },
        // The offer's hold ended otherwise (end_hold): expired, cancelled or compensated.
        Step {
            from: Some(Offered),
            to: Expired,
            decided_by: &[LIB],
            recorded_by: APPLY_WAITS,
            events: &["claim.expired", "claim.cancelled", "claim.compensated"],
        },
        Step {
            from: Some(Offered),
            to: Left,
            decided_by: &["lua/leave_waitlist.lua"],
            recorded_by: APPLY_WAITS,
            events: &["claim.cancelled"],
        },
    ]
};
