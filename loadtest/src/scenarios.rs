//! The three scenarios: what each declares before the load, and what each goose user does.
//!
//! - `hot_sku_drop`: one SKU; each goose user is a stream of new buyers (a fresh token after
//!   every decided answer, limit 1 each) and the SKU holds [`HOT_UNITS_PER_USER`] units per
//!   goose user, so the drop sells thousands of units under load, sells out, then refuses.
//! - `many_skus`: buyers spread over many SKUs (each request picks one at random).
//! - `retry_storm`: every buyer sends the same Idempotency-Key again and again, from several
//!   goose users at once; after the first win every answer must be a replay of it.
//! - `checkout`: one SKU with holds and a waitlist; buyers confirm, cancel or walk away, the
//!   sold-out join the line and take or let lapse the offers (see [`crate::checkout`]).
//! - `queue_drop`: one SKU behind its waiting room; visitors join before the opening, are
//!   admitted in waves, and claim with their admission tokens (see [`crate::queue_drop`]).
//!
//! Each goose user is a distinct buyer with its own token (in `retry_storm`, `fanout` goose
//! users share one buyer). 409 `sold_out` and `limit_reached` are answers, not failures: the
//! claim is judged before goose records it ([`crate::decided`]), so they are not errors.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use goose::prelude::*;
use rand::Rng;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE};
use serde::Deserialize;

use crate::admin::{mint, Admin, Declare};
use crate::book::Book;
use crate::decided;
use crate::line::Line;
use crate::settings::{Secret, Settings};
use crate::tally::{Answer, Rules, Tally};

const CLAIM_BODY: &str = r#"{"quantity":1}"#;
/// Tokens outlive any bounded run by far.
const TOKEN_TTL: Duration = Duration::from_secs(6 * 3600);
const PER_USER_LIMIT: i64 = 1;
/// `hot_sku_drop`'s units per goose user (`DROPGATE_LOAD_STOCK` overrides): 200 users sell
/// 5,000 units, seconds of winning claims at a gateway's pace, then the sold-out path.
pub const HOT_UNITS_PER_USER: usize = 25;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    HotSkuDrop,
    ManySkus,
    RetryStorm,
    Checkout,
    QueueDrop,
}

impl Kind {
    pub const ALL: [Kind; 5] = [
        Kind::HotSkuDrop,
        Kind::ManySkus,
        Kind::RetryStorm,
        Kind::Checkout,
        Kind::QueueDrop,
    ];
    /// What no pattern selects: the claim-only scenarios (`checkout` needs `DATABASE_URL`, so
    /// it runs when named).
    pub const DEFAULT: [Kind; 3] = [Kind::HotSkuDrop, Kind::ManySkus, Kind::RetryStorm];

    pub fn name(self) -> &'static str {
        match self {
            Kind::HotSkuDrop => "hot_sku_drop",
            Kind::ManySkus => "many_skus",
            Kind::RetryStorm => "retry_storm",
            Kind::Checkout => "checkout",
            Kind::QueueDrop => "queue_drop",
        }
    }

    /// Goose's name for a scenario: letters and digits only, lower case.
    pub fn machine_name(self) -> String {
        self.name().replace('_', "")
    }

    /// The name of the claim request in goose's tables.
    fn request_name(self) -> &'static str {
        match self {
            Kind::HotSkuDrop => "hot_sku_drop claim",
            Kind::ManySkus => "many_skus claim",
            Kind::RetryStorm => "retry_storm claim",
            Kind::Checkout => "checkout claim",
            Kind::QueueDrop => "queue_drop claim",
        }
    }

    fn short(self) -> &'static str {
        match self {
            Kind::HotSkuDrop => "hot",
            Kind::ManySkus => "many",
            Kind::RetryStorm => "retry",
            Kind::Checkout => "checkout",
            Kind::QueueDrop => "queue",
        }
    }
}

/// The scenarios that `patterns` select: names as this tool spells them (`hot_sku_drop`) or
/// as goose does (`hotskudrop`), `*` as a wildcard; no pattern selects [`Kind::DEFAULT`].
///
/// # Errors
/// The patterns that select nothing.
pub fn select(patterns: &[String]) -> Result<Vec<Kind>, String> {
    if patterns.is_empty() {
        return Ok(Kind::DEFAULT.to_vec());
    }
    let mut unknown = Vec::new();
    let mut selected = Vec::new();
    for p in patterns {
        let p = p.trim().to_ascii_lowercase().replace('_', "");
        let hits: Vec<Kind> = Kind::ALL
            .into_iter()
            .filter(|k| wildcard(p.as_bytes(), k.machine_name().as_bytes()))
            .collect();
        if hits.is_empty() {
            unknown.push(p);
        }
        selected.extend(hits);
    }
    if !unknown.is_empty() {
        let names: Vec<&str> = Kind::ALL.iter().map(|k| k.name()).collect();
        return Err(format!(
            "no scenario matches {unknown:?}; the scenarios are {names:?}"
        ));
    }
    Ok(Kind::ALL
        .into_iter()
        .filter(|k| selected.contains(k))
        .collect())
}

/// `*` matches any run of characters; everything else matches itself.
fn wildcard(p: &[u8], t: &[u8]) -> bool {
    match (p.first(), t.first()) {
        (None, None) => true,
        (Some(b'*'), _) => wildcard(&p[1..], t) || (!t.is_empty() && wildcard(p, &t[1..])),
        (Some(a), Some(b)) if a == b => wildcard(&p[1..], &t[1..]),
        _ => false,
    }
}

/// One scenario's run: its SKUs, its stock, its buyers' counter and what they saw.
pub struct Drop {
    pub kind: Kind,
    pub skus: Vec<String>,
    /// Units declared per SKU.
    pub stock: i64,
    /// Buyers this scenario expects (goose users / fanout), for the summary.
    pub buyers: usize,
    pub tally: Tally,
    /// `checkout`: what its buyers saw beyond the claim answers in `tally`.
    pub book: Book,
    /// `checkout`: how long holds and waitlist offers are held.
    pub hold_secs: u32,
    pub offer_secs: u32,
    /// `queue_drop`: what its visitors saw, its admission rate and opening (seconds after the
    /// declare).
    pub line: Line,
    pub admit_per_second: u32,
    pub open_secs: u32,
    /// Goose users (`checkout`: journeys) of this scenario started so far; numbers each one.
    next_user: AtomicUsize,
    fanout: usize,
    pub(crate) run_id: String,
    pub(crate) secret: Secret,
}

/// A goose user's identity, kept in its session data.
#[derive(Clone)]
struct Buyer {
    index: usize,
    /// `Bearer <token>`.
    auth: String,
    /// The buyer's key in `retry_storm`.
    idempotency_key: Option<String>,
}

impl Drop {
    /// Sizes the scenario for `users` goose users so that every SKU sells out within a
    /// bounded run and the sold-out invariant gets checked: `hot_sku_drop` sells real units
    /// to a stream of new buyers, the others hold stock far below their buyers.
    pub fn plan(kind: Kind, settings: &Settings, users: usize) -> Drop {
        let users = users.max(1);
        let fanout = if kind == Kind::RetryStorm {
            settings.retry_fanout
        } else {
            1
        };
        let buyers = users.div_ceil(fanout);
        let (sku_count, stock) = match kind {
            Kind::HotSkuDrop => (1, users * HOT_UNITS_PER_USER),
            Kind::ManySkus => (settings.sku_count, buyers / 20),
            Kind::RetryStorm => (1, buyers / 2),
            // A third of the first wave wins a hold; the rest start the line.
            Kind::Checkout => (1, buyers / 3),
            // A quarter of the line buys; the rest are told sold out.
            Kind::QueueDrop => (1, buyers / 4),
        };
        let stock = settings.stock.unwrap_or((stock as i64).max(1));
        let skus = (0..sku_count)
            .map(|i| match kind {
                Kind::ManySkus => format!("lt-{}-{}-{i:03}", settings.run_id, kind.short()),
                _ => format!("lt-{}-{}", settings.run_id, kind.short()),
            })
            .collect();
        Drop {
            kind,
            skus,
            stock,
            buyers,
            tally: Tally::new(Rules {
                keyed: kind == Kind::RetryStorm,
                per_user_limit: PER_USER_LIMIT as u32,
            }),
            book: Book::default(),
            hold_secs: settings.hold_secs,
            offer_secs: settings.offer_secs,
            line: Line::default(),
            admit_per_second: match settings.admit_per_second {
                0 => (buyers as u32 / 10).max(5),
                n => n,
            },
            open_secs: settings.open_secs,
            next_user: AtomicUsize::new(0),
            fanout,
            run_id: settings.run_id.clone(),
            secret: settings.admission_secret.clone(),
        }
    }

    /// Declares every SKU of the scenario, each new and with all its stock.
    ///
    /// # Errors
    /// The first SKU that could not be declared fresh.
    pub async fn declare(&self, admin: &Admin) -> anyhow::Result<()> {
        for sku in &self.skus {
            if self.kind == Kind::Checkout {
                let body = Declare {
                    total: self.stock,
                    per_user_limit: PER_USER_LIMIT,
                    hold_seconds: Some(self.hold_secs),
                    offer_seconds: Some(self.offer_secs),
                    ..Declare::default()
                };
                admin.declare(sku, body).await?;
            } else if self.kind == Kind::QueueDrop {
                let opens =
                    chrono::Utc::now() + chrono::Duration::seconds(i64::from(self.open_secs));
                let body = Declare {
                    total: self.stock,
                    per_user_limit: PER_USER_LIMIT,
                    opens_at: Some(opens.to_rfc3339()),
                    queue: Some(serde_json::json!({
                        "admit_per_second": self.admit_per_second,
                        "admission_ttl_seconds": crate::line::ADMISSION_TTL_SECS,
                    })),
                    ..Declare::default()
                };
                admin.declare(sku, body).await?;
            } else {
                admin.declare_fresh(sku, self.stock, PER_USER_LIMIT).await?;
            }
        }
        Ok(())
    }

    /// The goose scenario: an on-start transaction that makes the user a buyer, then claims.
    pub fn scenario(self: &Arc<Self>) -> Scenario {
        let admit: TransactionFunction = {
            let drop = self.clone();
            Arc::new(move |user| {
                let drop = drop.clone();
                Box::pin(async move { drop.admit(user) })
            })
        };
        let claim: TransactionFunction = {
            let drop = self.clone();
            Arc::new(move |user| {
                let drop = drop.clone();
                Box::pin(async move { drop.claim(user).await })
            })
        };
        if self.kind == Kind::Checkout {
            let step: TransactionFunction = {
                let drop = self.clone();
                Arc::new(move |user| {
                    let drop = drop.clone();
                    Box::pin(async move { drop.checkout_step(user).await })
                })
            };
            return Scenario::new(self.kind.name())
                .register_transaction(Transaction::new(step).set_name("step"));
        }
        if self.kind == Kind::QueueDrop {
            let step: TransactionFunction = {
                let drop = self.clone();
                Arc::new(move |user| {
                    let drop = drop.clone();
                    Box::pin(async move { drop.queue_step(user).await })
                })
            };
            return Scenario::new(self.kind.name())
                .register_transaction(Transaction::new(step).set_name("visit"));
        }
        Scenario::new(self.kind.name())
            .register_transaction(Transaction::new(admit).set_name("admit").set_on_start())
            .register_transaction(Transaction::new(claim).set_name("claim"))
    }

    /// The next buyer's number (`checkout`: one per journey).
    pub(crate) fn next_buyer(&self) -> usize {
        self.next_user.fetch_add(1, Ordering::Relaxed)
    }

    /// `Bearer <token>` of buyer `index`, scoped to the scenario's SKU when it has one.
    pub(crate) fn buyer_auth(&self, index: usize) -> Result<String, Box<TransactionError>> {
        let name = format!("lt-{}-{}-{index}", self.run_id, self.kind.short());
        let scope = (self.skus.len() == 1).then(|| self.skus[0].as_str());
        let token = mint(&self.secret, &name, scope, TOKEN_TTL)
            .map_err(|e| Box::new(TransactionError::Custom(format!("minting a token: {e}"))))?;
        Ok(format!("Bearer {token}"))
    }

    fn admit(&self, user: &mut GooseUser) -> TransactionResult {
        let n = self.next_user.fetch_add(1, Ordering::Relaxed);
        let index = n / self.fanout;
        let name = format!("lt-{}-{}-{index}", self.run_id, self.kind.short());
        // Single-SKU scenarios get tokens scoped to their SKU, as a waiting room would mint.
        let scope = (self.skus.len() == 1).then(|| self.skus[0].as_str());
        let token = mint(&self.secret, &name, scope, TOKEN_TTL)
            .map_err(|e| Box::new(TransactionError::Custom(format!("minting a token: {e}"))))?;
        user.set_session_data(Buyer {
            index,
            auth: format!("Bearer {token}"),
            idempotency_key: (self.kind == Kind::RetryStorm).then(|| format!("{name}-key")),
        });
        Ok(())
    }

    async fn claim(&self, user: &mut GooseUser) -> TransactionResult {
        let buyer = user.get_session_data::<Buyer>().cloned().ok_or_else(|| {
            Box::new(TransactionError::Custom(
                "no buyer: admit did not run".into(),
            ))
        })?;
        let sku_index = match self.skus.len() {
            1 => 0,
            n => rand::rng().random_range(0..n),
        };
        let path = format!("/v1/skus/{}/claims", self.skus[sku_index]);
        let mut builder = user
            .get_request_builder(&GooseMethod::Post, &path)?
            .header(AUTHORIZATION, &buyer.auth)
            .header(CONTENT_TYPE, "application/json")
            .body(CLAIM_BODY);
        if let Some(key) = &buyer.idempotency_key {
            builder = builder.header("Idempotency-Key", key);
        }
        // Sent outside goose's `request`, so a decided 409 never enters its ERRORS table.
        let name = self.kind.request_name();
        let (elapsed, answered) = decided::send(builder).await;
        let answered = match answered {
            Ok(a) => a,
            Err(why) => {
                self.tally.lost(buyer.index, sku_index);
                return decided::record(user, name, elapsed, None, Some(why)).await;
            }
        };
        let status = answered.status;
        let replayed = answered
            .headers
            .get("idempotency-replayed")
            .is_some_and(|v| v.as_bytes() == b"true");
        let Some(answer) = classify(status, replayed, &answered.body) else {
            self.tally.other(status);
            let why = format!(
                "unexpected answer: {}",
                String::from_utf8_lossy(&answered.body)
            );
            return decided::record(user, name, elapsed, Some(status), Some(&why)).await;
        };
        if let Some(violation) = self.tally.answer(buyer.index, sku_index, &answer) {
            return decided::record(user, name, elapsed, Some(status), Some(&violation)).await;
        }
        if self.kind == Kind::HotSkuDrop {
            // A decided answer ends this buyer's visit: the goose user's next claim is the
            // next buyer's (a drop's crowd is many buyers once, not a few buyers forever).
            self.admit(user)?;
        }
        decided::record(user, name, elapsed, Some(status), None).await
    }
}

#[derive(Deserialize)]
struct Won {
    claim_id: String,
}

#[derive(Deserialize)]
struct Problem {
    code: String,
}

/// The answers the contract promises for a claim; `None` for anything else.
pub fn classify(status: u16, replayed: bool, body: &[u8]) -> Option<Answer> {
    match status {
        201 => {
            let won: Won = serde_json::from_slice(body).ok()?;
            Some(if replayed {
                Answer::Replayed {
                    claim_id: won.claim_id,
                }
            } else {
                Answer::Won {
                    claim_id: won.claim_id,
                }
            })
        }
        409 => match serde_json::from_slice::<Problem>(body).ok()?.code.as_str() {
            "sold_out" => Some(Answer::SoldOut),
            "limit_reached" => Some(Answer::LimitReached),
            _ => None,
        },
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decided_answers_are_classified_and_others_are_not() {
        let won = br#"{"claim_id":"c1","sku":"s","remaining":3}"#;
        assert_eq!(
            classify(201, false, won),
            Some(Answer::Won {
                claim_id: "c1".into()
            })
        );
        assert_eq!(
            classify(201, true, won),
            Some(Answer::Replayed {
                claim_id: "c1".into()
            })
        );
        let sold_out = br#"{"type":"/problems/sold-out","status":409,"code":"sold_out"}"#;
        assert_eq!(classify(409, false, sold_out), Some(Answer::SoldOut));
        let limit = br#"{"code":"limit_reached"}"#;
        assert_eq!(classify(409, false, limit), Some(Answer::LimitReached));
        assert_eq!(classify(409, false, br#"{"code":"sku_exists"}"#), None);
        assert_eq!(classify(503, false, br#"{"code":"unavailable"}"#), None);
    }

    #[test]
    fn scenarios_are_selected_by_either_spelling_or_wildcard() {
        let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(select(&[]).unwrap(), Kind::DEFAULT.to_vec());
        assert_eq!(select(&v(&["checkout"])).unwrap(), vec![Kind::Checkout]);
        assert_eq!(
            select(&v(&["hot_sku_drop"])).unwrap(),
            vec![Kind::HotSkuDrop]
        );
        assert_eq!(select(&v(&["retrystorm"])).unwrap(), vec![Kind::RetryStorm]);
        assert_eq!(
            select(&v(&["*sku*"])).unwrap(),
            vec![Kind::HotSkuDrop, Kind::ManySkus]
        );
        assert!(select(&v(&["nope"])).is_err());
    }

    #[test]
    fn machine_names_are_what_goose_matches() {
        assert_eq!(Kind::HotSkuDrop.machine_name(), "hotskudrop");
        assert_eq!(Kind::RetryStorm.machine_name(), "retrystorm");
    }
}
