//! What the buyers of the `checkout` scenario saw (src/checkout.rs), kept for the summary and
//! for the comparison with the ledger after the run (src/holds_check.rs).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

/// What the buyer did to a claim, and so which ledger statuses may end it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// Won (or offered) and nothing sent since: walked away, or stopped by the end of the run.
    Open,
    /// A confirm was sent and got no answer.
    ConfirmSent,
    /// A cancel was sent and got no answer.
    CancelSent,
    /// Answered 200 to a confirm.
    Confirmed,
    /// Answered 200 to a cancel.
    Cancelled,
    /// Answered 409 `hold_expired`.
    Expired,
    /// The buyer left the line while this offer (unseen) was held: declined or lapsed.
    Declined,
}

/// Whether a claim's final ledger status fits what its buyer did. `in_time`: the claim is not
/// past its `expires_at` by more than the expiry worker's and the writer's lag (a hold may
/// still be `held` then, never after).
pub fn status_fits(expect: Expect, status: &str, in_time: bool) -> bool {
    let held = status == "held" && in_time;
    match expect {
        Expect::Open => held || status == "expired",
        Expect::ConfirmSent => held || status == "expired" || status == "confirmed",
        Expect::CancelSent | Expect::Declined => {
            held || status == "expired" || status == "cancelled"
        }
        Expect::Confirmed => status == "confirmed",
        Expect::Cancelled => status == "cancelled",
        Expect::Expired => status == "expired",
    }
}

/// A claim a buyer saw, and whether it was an offer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    pub expect: Expect,
    pub offer: bool,
}

/// What the buyers of `checkout` saw: answers by request and outcome, and every claim.
#[derive(Debug, Default)]
pub struct Book {
    /// `"<request> <outcome>"` → count, e.g. `"confirm 200"`, `"confirm hold_expired"`.
    answers: Mutex<BTreeMap<String, u64>>,
    claims: Mutex<HashMap<String, Seen>>,
    pub journeys: AtomicU64,
    /// Units added by the periodic restock during the run.
    pub restocked: AtomicU64,
    /// Requests without an answer (a claim among them may have won unseen).
    pub transport: AtomicU64,
}

impl Book {
    pub fn count(&self, request: &str, outcome: &str) {
        let mut a = self.answers.lock().unwrap_or_else(|e| e.into_inner());
        *a.entry(format!("{request} {outcome}")).or_default() += 1;
    }

    pub fn answers(&self) -> BTreeMap<String, u64> {
        self.answers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// A claim won, or an offer seen. Returns false when the claim was already known (an offer
    /// is seen on every poll until acted on; that is not a second claim).
    pub fn saw(&self, claim_id: &str, offer: bool) -> bool {
        let mut c = self.claims.lock().unwrap_or_else(|e| e.into_inner());
        if c.contains_key(claim_id) {
            return false;
        }
        c.insert(
            claim_id.to_string(),
            Seen {
                expect: Expect::Open,
                offer,
            },
        );
        true
    }

    pub fn expect(&self, claim_id: &str, expect: Expect, offer: bool) {
        let mut c = self.claims.lock().unwrap_or_else(|e| e.into_inner());
        c.insert(claim_id.to_string(), Seen { expect, offer });
    }

    pub fn claims(&self) -> HashMap<String, Seen> {
        self.claims
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_final_status_must_fit_what_the_buyer_did() {
        use Expect::*;
        assert!(status_fits(Open, "expired", false));
        assert!(status_fits(Open, "held", true));
        assert!(!status_fits(Open, "held", false), "a ghost hold");
        assert!(!status_fits(Open, "confirmed", false));
        assert!(!status_fits(Open, "cancelled", false));
        assert!(status_fits(ConfirmSent, "confirmed", false));
        assert!(!status_fits(ConfirmSent, "cancelled", false));
        assert!(status_fits(CancelSent, "cancelled", false));
        assert!(!status_fits(CancelSent, "confirmed", false));
        assert!(status_fits(Declined, "cancelled", false));
        assert!(status_fits(Confirmed, "confirmed", false));
        assert!(!status_fits(Confirmed, "expired", false));
        assert!(!status_fits(Cancelled, "expired", false));
        assert!(status_fits(Expired, "expired", false));
        assert!(!status_fits(Expired, "held", true));
        assert!(!status_fits(Confirmed, "compensated", false));
    }

    #[test]
    fn an_offer_is_one_claim_however_often_it_is_seen() {
        let b = Book::default();
        assert!(b.saw("c1", true));
        assert!(!b.saw("c1", true));
        b.expect("c1", Expect::Confirmed, true);
        assert_eq!(
            b.claims()["c1"],
            Seen {
                expect: Expect::Confirmed,
                offer: true
            }
        );
        b.count("confirm", "200");
        b.count("confirm", "200");
        assert_eq!(b.answers()["confirm 200"], 2);
    }
}
