//! What the buyers saw: answers counted by kind, and per buyer and SKU the facts needed to
//! catch a broken promise as it happens (a second win, a replay of another claim, a refusal
//! that contradicts an earlier win).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// The rules that differ between scenarios.
#[derive(Debug, Clone, Copy)]
pub struct Rules {
    /// Requests carry an Idempotency-Key, one per buyer and SKU.
    pub keyed: bool,
    /// Units one buyer may win on one SKU.
    pub per_user_limit: u32,
}

/// One answer, as classified from the status, headers and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Won { claim_id: String },
    Replayed { claim_id: String },
    SoldOut,
    LimitReached,
}

/// What one buyer saw on one SKU.
#[derive(Debug, Default)]
struct Record {
    /// The claim of every 201 must be this one (a buyer wins once with limit 1).
    claim_id: Option<String>,
    fresh_wins: u32,
    sold_out: bool,
    /// A request of this buyer got no answer: it may have won without knowing.
    lost_answer: bool,
}

/// Counters of one scenario, shared by all its goose users.
#[derive(Debug)]
pub struct Tally {
    rules: Rules,
    pub won: AtomicU64,
    pub replayed: AtomicU64,
    pub sold_out: AtomicU64,
    pub limit_reached: AtomicU64,
    /// No HTTP answer (connection error, timeout).
    pub transport: AtomicU64,
    /// Any other status, or a 409 with another code; by status.
    other: Mutex<BTreeMap<u16, u64>>,
    /// Keyed by (buyer, SKU index).
    records: Mutex<HashMap<(usize, usize), Record>>,
    violations: AtomicU64,
    /// The first few violations, word for word.
    examples: Mutex<Vec<String>>,
}

const KEPT_EXAMPLES: usize = 20;

impl Tally {
    pub fn new(rules: Rules) -> Tally {
        Tally {
            rules,
            won: AtomicU64::new(0),
            replayed: AtomicU64::new(0),
            sold_out: AtomicU64::new(0),
            limit_reached: AtomicU64::new(0),
            transport: AtomicU64::new(0),
            other: Mutex::new(BTreeMap::new()),
            records: Mutex::new(HashMap::new()),
            violations: AtomicU64::new(0),
            examples: Mutex::new(Vec::new()),
        }
    }

    /// Records an answer; returns the violation it reveals, if any.
    pub fn answer(&self, buyer: usize, sku: usize, answer: &Answer) -> Option<String> {
        let counter = match answer {
            Answer::Won { .. } => &self.won,
            Answer::Replayed { .. } => &self.replayed,
            Answer::SoldOut => &self.sold_out,
            Answer::LimitReached => &self.limit_reached,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let violation = {
            let mut records = self.records.lock().unwrap_or_else(|e| e.into_inner());
            let rec = records.entry((buyer, sku)).or_default();
            check(self.rules, rec, answer)
        };
        if let Some(v) = &violation {
            self.violation(format!("buyer {buyer}, SKU #{sku}: {v}"));
        }
        violation
    }

    /// A request that got no HTTP answer.
    pub fn lost(&self, buyer: usize, sku: usize) {
        self.transport.fetch_add(1, Ordering::Relaxed);
        let mut records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        records.entry((buyer, sku)).or_default().lost_answer = true;
    }

    /// Any other answer (503, 429, 401, a 409 with another code, ...).
    pub fn other(&self, status: u16) {
        let mut other = self.other.lock().unwrap_or_else(|e| e.into_inner());
        *other.entry(status).or_default() += 1;
    }

    pub fn violation(&self, text: String) {
        self.violations.fetch_add(1, Ordering::Relaxed);
        let mut examples = self.examples.lock().unwrap_or_else(|e| e.into_inner());
        if examples.len() < KEPT_EXAMPLES {
            examples.push(text);
        }
    }

    pub fn violations(&self) -> (u64, Vec<String>) {
        let examples = self.examples.lock().unwrap_or_else(|e| e.into_inner());
        (self.violations.load(Ordering::Relaxed), examples.clone())
    }

    pub fn others(&self) -> BTreeMap<u16, u64> {
        self.other.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Distinct (buyer, SKU) pairs that won at least once, fresh or replayed.
    pub fn winners(&self) -> usize {
        let records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        records.values().filter(|r| r.claim_id.is_some()).count()
    }

    pub fn count(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
}

/// The promises of the contract, checked per buyer and SKU whatever the order in which
/// concurrent answers arrive: stock never comes back during a run, so a buyer who won cannot
/// also have been sold out under the same key, and a key's replays all name the first claim.
fn check(rules: Rules, rec: &mut Record, answer: &Answer) -> Option<String> {
    match answer {
        Answer::Won { claim_id } | Answer::Replayed { claim_id } => {
            let fresh = matches!(answer, Answer::Won { .. });
            if fresh {
                rec.fresh_wins += 1;
            }
            if !fresh && !rules.keyed {
                return Some("a replay of a request that carried no Idempotency-Key".into());
            }
            if rec.fresh_wins > rules.per_user_limit {
                return Some(format!(
                    "{} fresh wins, more than the per-user limit {}",
                    rec.fresh_wins, rules.per_user_limit
                ));
            }
            if rules.keyed {
                if rec.sold_out {
                    return Some("won (or replayed) under a key that was answered sold_out".into());
                }
                match &rec.claim_id {
                    Some(first) if first != claim_id => {
                        return Some(format!(
                            "the same key answered two claims: {first} and {claim_id}"
                        ))
                    }
                    Some(_) => {}
                    None => rec.claim_id = Some(claim_id.clone()),
                }
            } else if rec.claim_id.is_none() {
                rec.claim_id = Some(claim_id.clone());
            }
            None
        }
        Answer::SoldOut => {
            rec.sold_out = true;
            (rules.keyed && rec.claim_id.is_some())
                .then(|| "sold_out after a win under the same key (expected a replay)".into())
        }
        Answer::LimitReached => {
            if rules.keyed {
                // With a key, a buyer who won gets replays and one who did not holds nothing.
                Some("limit_reached under an Idempotency-Key (expected a replay)".into())
            } else if rec.claim_id.is_none() && !rec.lost_answer {
                Some("limit_reached for a buyer who never won".into())
            } else {
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEYED: Rules = Rules {
        keyed: true,
        per_user_limit: 1,
    };
    const PLAIN: Rules = Rules {
        keyed: false,
        per_user_limit: 1,
    };

    fn won(id: &str) -> Answer {
        Answer::Won {
            claim_id: id.into(),
        }
    }

    fn replayed(id: &str) -> Answer {
        Answer::Replayed {
            claim_id: id.into(),
        }
    }

    #[test]
    fn a_keyed_buyer_that_won_only_gets_replays_of_that_claim() {
        let t = Tally::new(KEYED);
        assert_eq!(t.answer(1, 0, &won("a")), None);
        assert_eq!(t.answer(1, 0, &replayed("a")), None);
        assert!(t.answer(1, 0, &replayed("b")).is_some());
        assert!(t.answer(1, 0, &Answer::SoldOut).is_some());
        assert!(t.answer(1, 0, &Answer::LimitReached).is_some());
        assert!(t.answer(1, 0, &won("c")).is_some());
        assert_eq!(t.violations().0, 4);
    }

    #[test]
    fn a_replay_may_arrive_before_the_fresh_win_it_replays() {
        let t = Tally::new(KEYED);
        assert_eq!(t.answer(2, 0, &replayed("a")), None);
        assert_eq!(t.answer(2, 0, &won("a")), None);
        assert_eq!(t.violations().0, 0);
    }

    #[test]
    fn a_keyed_buyer_sold_out_cannot_win_later() {
        let t = Tally::new(KEYED);
        assert_eq!(t.answer(3, 0, &Answer::SoldOut), None);
        assert!(t.answer(3, 0, &won("a")).is_some());
    }

    #[test]
    fn without_keys_limit_reached_needs_an_earlier_win_or_a_lost_answer() {
        let t = Tally::new(PLAIN);
        assert!(t.answer(1, 0, &Answer::LimitReached).is_some());
        assert_eq!(t.answer(2, 0, &won("a")), None);
        assert_eq!(t.answer(2, 0, &Answer::LimitReached), None);
        assert!(
            t.answer(2, 0, &won("b")).is_some(),
            "a second win passes the limit"
        );
        t.lost(3, 0);
        assert_eq!(t.answer(3, 0, &Answer::LimitReached), None);
        assert!(t.answer(4, 0, &replayed("x")).is_some());
    }

    #[test]
    fn buyers_are_tracked_per_sku() {
        let t = Tally::new(PLAIN);
        assert_eq!(t.answer(1, 0, &won("a")), None);
        assert_eq!(t.answer(1, 1, &won("b")), None);
        assert_eq!(t.winners(), 2);
    }
}
