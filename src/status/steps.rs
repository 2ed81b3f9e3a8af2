//! The tables of [`super`]: every step of a claim's, a waitlist entry's and a waiting-room
//! ticket's life, with the scripts that make it, the statements that record it and the events
//! that tell it.

use super::{ClaimStatus, EntryStatus, Step, TicketState};

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

/// `q_report`, which reads a ticket's state from where it is, the stock and Redis's clock.
const READ: &str = "lua/lib/queue.lua";

/// A ticket moves from the line to the admitted set once (I4: `admit_queue.lua` pops it from
/// the line's head and adds it to the admitted set in one atomic step) and never back; while
/// in line it follows the stock (sold_out and back), once admitted the admission's ttl. The
/// queue lives in Redis alone: no statement records a step, no event tells one.
pub const TICKET_STEPS: &[Step<TicketState>] = {
    use TicketState::*;
    const JOIN: &[&str] = &["lua/join_queue.lua", READ];
    &[
        Step {
            from: None,
            to: Prequeue,
            decided_by: JOIN,
            recorded_by: &[],
            events: &[],
        },
        Step {
            from: None,
            to: Waiting,
            decided_by: JOIN,
            recorded_by: &[],
            events: &[],
        },
        // Joined after the last unit went: the ticket keeps its place.
        Step {
            from: None,
            to: SoldOut,
            decided_by: JOIN,
            recorded_by: &[],
            events: &[],
        },
        // The opening (`opens_at`, Redis's clock): the shuffle key becomes a place.
        Step {
            from: Some(Prequeue),
            to: Waiting,
            decided_by: &[READ],
            recorded_by: &[],
            events: &[],
        },
        Step {
            from: Some(Prequeue),
            to: SoldOut,
            decided_by: &[READ],
            recorded_by: &[],
            events: &[],
        },
        Step {
            from: Some(Waiting),
            to: Admitted,
            decided_by: &["lua/admit_queue.lua", READ],
            recorded_by: &[],
            events: &[],
        },
        // The last unit went with nothing that could come back (`q_supply`), and back when
        // units return (restock, cancel, expiry).
        Step {
            from: Some(Waiting),
            to: SoldOut,
            decided_by: &[READ],
            recorded_by: &[],
            events: &[],
        },
        Step {
            from: Some(SoldOut),
            to: Waiting,
            decided_by: &[READ],
            recorded_by: &[],
            events: &[],
        },
        // `closes_at` passed (Redis's clock, as claim.lua's sale window): whoever is still in
        // line stays there, and admit_queue.lua admits nobody.
        Step {
            from: Some(Prequeue),
            to: Closed,
            decided_by: &[READ],
            recorded_by: &[],
            events: &[],
        },
        Step {
            from: Some(Waiting),
            to: Closed,
            decided_by: &[READ],
            recorded_by: &[],
            events: &[],
        },
        Step {
            from: Some(SoldOut),
            to: Closed,
            decided_by: &[READ],
            recorded_by: &[],
            events: &[],
        },
        // The ttl passed and the visitor holds no unit of the SKU.
        Step {
            from: Some(Admitted),
            to: Expired,
            decided_by: &[READ],
            recorded_by: &[],
            events: &[],
        },
        // The visitor came to hold a unit after the ttl (an offer of the waitlist it joined
        // while admitted): the admission was used after all. An expired admission took
        // nothing, so this gives nothing either.
        Step {
            from: Some(Expired),
            to: Admitted,
            decided_by: &[READ],
            recorded_by: &[],
            events: &[],
        },
    ]
};
