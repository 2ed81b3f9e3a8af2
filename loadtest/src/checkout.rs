//! The `checkout` scenario: buyers on a SKU with holds, and a waitlist behind it.
//!
//! Every journey is a new buyer (a fresh admission token, limit 1):
//!
//! 1. claim; a win is a hold of `hold_seconds`;
//! 2. think (a short random wait), then confirm ([`CONFIRM_PCT`] %), cancel ([`CANCEL_PCT`] %) or
//!    walk away (the rest: the hold is left to expire);
//! 3. a buyer answered `sold_out` joins the waitlist instead and polls the entry; an offer
//!    that comes is confirmed after a short think ([`TAKE_OFFER_PCT`] %) or left to lapse; a
//!    buyer still waiting after [`PATIENCE`] leaves the line (DELETE). A join answered
//!    `in_stock` (a unit came back while nobody waited) goes back to claiming.
//!
//! Then the goose user starts the next journey as another buyer. Every [`RESTOCK_EVERY`] the
//! run adds [`restock_units`] (the admin restock route), which go to the head of the line as
//! offers, so holds and offers keep coming for the whole run, not only from the first wave. Each goose transaction is one step of that journey (at most one request,
//! waits cut in short sleeps), so goose can stop a user between any two steps.
//!
//! Every answer the contract promises is counted in [`crate::book::Book`] and, for a 4xx, marked a goose
//! success: `sold_out`, `hold_expired` (a confirm that lost to the expiry) and `in_stock` are
//! answers, not failures. An answer that contradicts what the buyer did (`claim_cancelled` on
//! a claim the buyer never cancelled) is a broken promise. What each buyer did to each claim
//! is kept ([`Expect`]) and compared with the ledger after the run.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use goose::goose::GooseResponse;
use goose::prelude::*;
use rand::Rng;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE};
use serde::Deserialize;

use crate::book::Expect;
use crate::scenarios::Drop;
use crate::tally::Answer;

/// Of the buyers who won a hold: confirm, cancel; the rest walk away.
pub const CONFIRM_PCT: u32 = 70;
pub const CANCEL_PCT: u32 = 15;
/// Of the waiters who see an offer: take it; the rest let it lapse.
pub const TAKE_OFFER_PCT: u32 = 75;
/// A waiter who saw no offer for this long leaves the line.
pub const PATIENCE: Duration = Duration::from_secs(20);
/// Pause between two polls of a waitlist entry (random in this range).
const POLL_MS: (u64, u64) = (250, 750);
/// Pause after an answer that asks to retry (429, 503).
const BACKOFF: Duration = Duration::from_millis(250);
/// The longest sleep in one step: goose stops a user only between steps.
const NAP: Duration = Duration::from_millis(500);
/// During the run, a restock of [`restock_units`] every this long.
pub const RESTOCK_EVERY: Duration = Duration::from_secs(5);

/// Units per periodic restock: a twentieth of the first stock, at least one.
pub fn restock_units(stock: i64) -> i64 {
    (stock / 20).max(1)
}

/// What a buyer who won a hold (or saw an offer) does with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    Confirm,
    Cancel,
    WalkAway,
}

/// The fate of a hold for a roll in `0..100`.
pub fn fate(roll: u32) -> Fate {
    if roll < CONFIRM_PCT {
        Fate::Confirm
    } else if roll < CONFIRM_PCT + CANCEL_PCT {
        Fate::Cancel
    } else {
        Fate::WalkAway
    }
}

/// How long a buyer thinks before acting on a hold of `hold_secs` (or an offer of
/// `offer_secs`): from 0.3 s to half the hold, so almost every decision arrives in time, and a
/// confirm that meets the expiry stays possible near the end of the range on a busy machine.
pub fn think_range(secs: u32) -> (u64, u64) {
    let max = (u64::from(secs) * 1000 / 2).max(400);
    (300, max)
}

/// Where a goose user is in its current journey.
#[derive(Debug, Clone)]
enum Step {
    /// Start a journey as a new buyer.
    New,
    Claim,
    /// Act on a hold (or an offer) once `at` has come.
    Decide {
        claim_id: String,
        fate: Fate,
        offer: bool,
        at: Instant,
    },
    Join,
    Poll {
        entry_id: String,
        at: Instant,
        give_up: Instant,
    },
    Leave {
        entry_id: String,
    },
}

/// A goose user's session: the buyer of its current journey and the step it is at.
#[derive(Clone)]
pub(crate) struct Shopper {
    buyer: usize,
    /// `Bearer <token>`.
    auth: String,
    step: Step,
}

impl Shopper {
    pub(crate) fn new() -> Shopper {
        Shopper {
            buyer: 0,
            auth: String::new(),
            step: Step::New,
        }
    }
}

/// One answer: the goose metric to mark, the status (`None`: no answer) and the body.
struct Reply {
    request: goose::metrics::GooseRequestMetric,
    status: Option<u16>,
    body: Vec<u8>,
}

#[derive(Deserialize)]
struct ClaimBody {
    claim_id: String,
}

#[derive(Deserialize)]
struct ProblemBody {
    code: String,
}

#[derive(Deserialize)]
struct EntryBody {
    entry_id: String,
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    claim_id: Option<String>,
}

fn code(body: &[u8]) -> Option<String> {
    serde_json::from_slice::<ProblemBody>(body)
        .ok()
        .map(|p| p.code)
}

fn between(range: (u64, u64)) -> Duration {
    Duration::from_millis(rand::rng().random_range(range.0..=range.1.max(range.0)))
}

/// Sleeps toward `at`, at most [`NAP`]; returns whether `at` has come.
async fn nap_until(at: Instant) -> bool {
    let now = Instant::now();
    if now >= at {
        return true;
    }
    let left = at - now;
    tokio::time::sleep(left.min(NAP)).await;
    left <= NAP
}

impl Drop {
    /// Restocks the SKU every [`RESTOCK_EVERY`] until aborted (the run's end); counts the
    /// units in `restocked`.
    pub(crate) async fn restock_periodically(&self, admin: &crate::admin::Admin) {
        let units = restock_units(self.stock);
        loop {
            tokio::time::sleep(RESTOCK_EVERY).await;
            match admin.restock(&self.skus[0], units).await {
                Ok(()) => {
                    self.book
                        .restocked
                        .fetch_add(units as u64, Ordering::Relaxed);
                }
                Err(e) => {
                    self.book.count("restock", "failed");
                    eprintln!("checkout: restock failed: {e:#}");
                }
            }
        }
    }

    /// One step of a goose user's journey (see the module documentation).
    pub(crate) async fn checkout_step(&self, user: &mut GooseUser) -> TransactionResult {
        let mut shopper = user
            .get_session_data::<Shopper>()
            .cloned()
            .unwrap_or_else(Shopper::new);
        let result = self.advance(user, &mut shopper).await;
        user.set_session_data(shopper);
        result
    }

    async fn advance(&self, user: &mut GooseUser, s: &mut Shopper) -> TransactionResult {
        let book = &self.book;
        match s.step.clone() {
            Step::New => {
                let index = self.next_buyer();
                s.buyer = index;
                s.auth = self.buyer_auth(index)?;
                book.journeys.fetch_add(1, Ordering::Relaxed);
                s.step = Step::Claim;
                Ok(())
            }
            Step::Claim => {
                let path = format!("/v1/skus/{}/claims", self.skus[0]);
                let mut r = send(user, GooseMethod::Post, &path, "checkout claim", s, true).await?;
                let Some(status) = r.status else {
                    self.tally.lost(s.buyer, 0);
                    book.transport.fetch_add(1, Ordering::Relaxed);
                    s.step = Step::New;
                    return user.set_failure("no answer", &mut r.request, None, None);
                };
                let answer = match (status, code(&r.body).as_deref()) {
                    (201, _) => match serde_json::from_slice::<ClaimBody>(&r.body) {
                        Ok(b) => Some(Answer::Won {
                            claim_id: b.claim_id,
                        }),
                        Err(_) => None,
                    },
                    (409, Some("sold_out")) => Some(Answer::SoldOut),
                    (409, Some("limit_reached")) => Some(Answer::LimitReached),
                    _ => None,
                };
                let Some(answer) = answer else {
                    return self.unexpected(user, s, "claim", status, r, true);
                };
                let violation = self.tally.answer(s.buyer, 0, &answer);
                s.step = match &answer {
                    Answer::Won { claim_id } => {
                        book.count("claim", "201");
                        book.saw(claim_id, false);
                        let fate = fate(rand::rng().random_range(0..100));
                        Step::Decide {
                            claim_id: claim_id.clone(),
                            fate,
                            offer: false,
                            at: Instant::now() + between(think_range(self.hold_secs)),
                        }
                    }
                    Answer::SoldOut => {
                        book.count("claim", "sold_out");
                        Step::Join
                    }
                    _ => {
                        book.count("claim", "limit_reached");
                        Step::New
                    }
                };
                self.settle(user, r, violation)
            }
            Step::Decide {
                claim_id,
                fate,
                offer,
                at,
            } => {
                if !nap_until(at).await {
                    return Ok(());
                }
                s.step = Step::New;
                let what = if offer { "offer" } else { "hold" };
                let (op, sent) = match fate {
                    Fate::WalkAway => {
                        book.count(what, "walked away");
                        return Ok(());
                    }
                    Fate::Confirm => ("confirm", Expect::ConfirmSent),
                    Fate::Cancel => ("cancel", Expect::CancelSent),
                };
                book.expect(&claim_id, sent, offer);
                let path = format!("/v1/claims/{claim_id}/{op}");
                let name = format!("checkout {op}");
                let mut r = send(user, GooseMethod::Post, &path, &name, s, false).await?;
                let Some(status) = r.status else {
                    book.transport.fetch_add(1, Ordering::Relaxed);
                    return user.set_failure("no answer", &mut r.request, None, None);
                };
                let outcome = match status {
                    200 => "200".to_string(),
                    409 => code(&r.body).unwrap_or_default(),
                    _ => return self.unexpected(user, s, op, status, r, false),
                };
                book.count(&format!("{what} {op}"), &outcome);
                let (expect, violation) = match (fate, outcome.as_str()) {
                    (Fate::Confirm, "200") => (Expect::Confirmed, None),
                    (Fate::Cancel, "200") => (Expect::Cancelled, None),
                    (_, "hold_expired") => (Expect::Expired, None),
                    (_, other) => (
                        sent,
                        Some(format!(
                            "{op} of {what} {claim_id} (buyer {}) answered 409 {other:?}, which \
                             contradicts what the buyer did",
                            s.buyer
                        )),
                    ),
                };
                book.expect(&claim_id, expect, offer);
                if let Some(v) = &violation {
                    self.tally.violation(v.clone());
                }
                self.settle(user, r, violation)
            }
            Step::Join => {
                let path = format!("/v1/skus/{}/waitlist", self.skus[0]);
                let mut r = send(user, GooseMethod::Post, &path, "checkout join", s, false).await?;
                let Some(status) = r.status else {
                    book.transport.fetch_add(1, Ordering::Relaxed);
                    s.step = Step::New;
                    return user.set_failure("no answer", &mut r.request, None, None);
                };
                match (status, code(&r.body).as_deref()) {
                    (201 | 200, _) => {
                        let Ok(entry) = serde_json::from_slice::<EntryBody>(&r.body) else {
                            return self.unexpected(user, s, "join", status, r, true);
                        };
                        book.count("join", &status.to_string());
                        let now = Instant::now();
                        s.step = Step::Poll {
                            entry_id: entry.entry_id,
                            // An entry that holds an offer already is read at once.
                            at: if entry.status.as_deref() == Some("offered") {
                                now
                            } else {
                                now + between(POLL_MS)
                            },
                            give_up: now + PATIENCE,
                        };
                        self.settle(user, r, None)
                    }
                    (409, Some("in_stock")) => {
                        // A unit came back while nobody waited: claim it like anyone else.
                        book.count("join", "in_stock");
                        s.step = Step::Claim;
                        self.settle(user, r, None)
                    }
                    (409, Some("limit_reached")) => {
                        book.count("join", "limit_reached");
                        s.step = Step::New;
                        let v = format!("join answered limit_reached to new buyer {}", s.buyer);
                        self.tally.violation(v.clone());
                        self.settle(user, r, Some(v))
                    }
                    _ => self.unexpected(user, s, "join", status, r, true),
                }
            }
            Step::Poll {
                entry_id,
                at,
                give_up,
            } => {
                if !nap_until(at).await {
                    return Ok(());
                }
                let path = format!("/v1/waitlist/{entry_id}");
                let mut r = send(user, GooseMethod::Get, &path, "checkout poll", s, false).await?;
                let Some(status) = r.status else {
                    book.transport.fetch_add(1, Ordering::Relaxed);
                    s.step = Step::Poll {
                        entry_id,
                        at: Instant::now() + between(POLL_MS),
                        give_up,
                    };
                    return user.set_failure("no answer", &mut r.request, None, None);
                };
                let entry = match (status, serde_json::from_slice::<EntryBody>(&r.body)) {
                    (200, Ok(e)) => e,
                    _ => {
                        s.step = Step::Poll {
                            entry_id,
                            at: Instant::now() + BACKOFF,
                            give_up,
                        };
                        return self.unexpected(user, s, "poll", status, r, false);
                    }
                };
                let state = entry.status.unwrap_or_default();
                book.count("poll", &state);
                let now = Instant::now();
                let mut violation = None;
                s.step = match state.as_str() {
                    "waiting" if now >= give_up => Step::Leave { entry_id },
                    "waiting" => Step::Poll {
                        entry_id,
                        at: now + between(POLL_MS),
                        give_up,
                    },
                    "offered" => {
                        let claim_id = entry.claim_id.unwrap_or(entry_id);
                        book.saw(&claim_id, true);
                        book.count("offer", "seen");
                        let roll = rand::rng().random_range(0..100);
                        let fate = if roll < TAKE_OFFER_PCT {
                            Fate::Confirm
                        } else {
                            Fate::WalkAway
                        };
                        Step::Decide {
                            claim_id,
                            fate,
                            offer: true,
                            at: now + between(think_range(self.offer_secs)),
                        }
                    }
                    // An offer that lapsed between two polls (a busy machine), or a waiter
                    // skipped: the journey ends.
                    "expired" => Step::New,
                    other => {
                        violation = Some(format!(
                            "entry {entry_id} of buyer {} is {other:?}, though the buyer neither \
                             confirmed an offer nor left",
                            s.buyer
                        ));
                        Step::New
                    }
                };
                if let Some(v) = &violation {
                    self.tally.violation(v.clone());
                }
                self.settle(user, r, violation)
            }
            Step::Leave { entry_id } => {
                s.step = Step::New;
                let path = format!("/v1/waitlist/{entry_id}");
                let mut r =
                    send(user, GooseMethod::Delete, &path, "checkout leave", s, false).await?;
                let Some(status) = r.status else {
                    book.transport.fetch_add(1, Ordering::Relaxed);
                    return user.set_failure("no answer", &mut r.request, None, None);
                };
                let Ok(entry) = serde_json::from_slice::<EntryBody>(&r.body) else {
                    return self.unexpected(user, s, "leave", status, r, false);
                };
                if status != 200 {
                    return self.unexpected(user, s, "leave", status, r, false);
                }
                book.count("leave", &entry.status.unwrap_or_default());
                // An offer made between the last poll and the leave is declined by it.
                if let Some(claim_id) = entry.claim_id {
                    if book.saw(&claim_id, true) {
                        book.expect(&claim_id, Expect::Declined, true);
                    }
                }
                self.settle(user, r, None)
            }
        }
    }

    /// Marks a decided answer a goose success (a 409 arrived as an error), or a broken
    /// promise a failure.
    fn settle(
        &self,
        user: &mut GooseUser,
        mut r: Reply,
        violation: Option<String>,
    ) -> TransactionResult {
        if let Some(v) = violation {
            return user.set_failure(&v, &mut r.request, None, None);
        }
        if r.status.is_some_and(|s| s >= 400) {
            r.request.error.clear();
            return user.set_success(&mut r.request);
        }
        Ok(())
    }

    /// An answer the contract does not promise here: counted, a goose failure. 429 and 503
    /// are retried after a pause (`retry`: the step stays; else as already set).
    fn unexpected(
        &self,
        user: &mut GooseUser,
        s: &mut Shopper,
        request: &str,
        status: u16,
        mut r: Reply,
        restart: bool,
    ) -> TransactionResult {
        let outcome = code(&r.body).unwrap_or_else(|| status.to_string());
        self.book
            .count(request, &format!("unexpected {status} {outcome}"));
        self.tally.other(status);
        if restart && !matches!(status, 429 | 503) {
            s.step = Step::New;
        }
        let text = String::from_utf8_lossy(&r.body).into_owned();
        user.set_failure("unexpected answer", &mut r.request, None, Some(&text))
    }
}

/// Sends one request as the shopper; `None` status when no answer came (or its body was lost).
async fn send(
    user: &mut GooseUser,
    method: GooseMethod,
    path: &str,
    name: &str,
    s: &Shopper,
    claim_body: bool,
) -> Result<Reply, Box<TransactionError>> {
    let mut builder = user
        .get_request_builder(&method, path)?
        .header(AUTHORIZATION, &s.auth);
    if claim_body {
        builder = builder
            .header(CONTENT_TYPE, "application/json")
            .body(r#"{"quantity":1}"#);
    }
    let request = GooseRequest::builder()
        .method(method)
        .path(path)
        .name(name)
        .set_request_builder(builder)
        .build();
    let GooseResponse { request, response } = user.request(request).await?;
    let Ok(response) = response else {
        return Ok(Reply {
            request,
            status: None,
            body: Vec::new(),
        });
    };
    let status = response.status().as_u16();
    match response.bytes().await {
        Ok(b) => Ok(Reply {
            request,
            status: Some(status),
            body: b.to_vec(),
        }),
        Err(_) => Ok(Reply {
            request,
            status: None,
            body: Vec::new(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fates_split_the_rolls_seventy_fifteen_fifteen() {
        let mut n = [0u32; 3];
        for roll in 0..100 {
            n[match fate(roll) {
                Fate::Confirm => 0,
                Fate::Cancel => 1,
                Fate::WalkAway => 2,
            }] += 1;
        }
        assert_eq!(n, [70, 15, 15]);
    }

    #[test]
    fn restocks_are_a_twentieth_of_the_stock_and_never_empty() {
        assert_eq!(restock_units(100), 5);
        assert_eq!(restock_units(3), 1);
    }

    #[test]
    fn buyers_think_less_than_half_a_hold() {
        assert_eq!(think_range(8), (300, 4000));
        assert_eq!(think_range(1), (300, 500));
    }
}
