//! The `queue_drop` scenario: a drop behind its waiting room (API.md, "Waiting room").
//!
//! The SKU is declared with a `queue` and an `opens_at` a few seconds after the declare
//! ([`Settings::open_secs`](crate::settings::Settings)), so the goose users, started within
//! about a second, join the pre-queue before the opening. Each goose user is one visitor:
//!
//! 1. joins (`POST /v1/skus/{sku}/queue`, a visitor token): a ticket, `prequeue` before the
//!    opening;
//! 2. polls its ticket (`GET /v1/queue/{ticket}`) as the answer's `poll_after_ms` says; the
//!    queue admits the line in waves of `admit_per_second`;
//! 3. once `admitted`, claims one unit with the admission token: won, or `sold_out`;
//! 4. once the ticket reads `sold_out` (the last unit went), stops: so does the rest of the
//!    line, told by the queue.
//!
//! One visitor in [`CHEAT_EVERY`] first tries to claim with a token the queue did not mint (a
//! plain admission token for the SKU): it must be 403 `not_admitted`.
//!
//! After the load ([`check`]): the SKU sold out with units won equal to units stocked (no
//! oversell, no unit lost); every unit in the ledger went to a visitor the queue admitted and
//! every claim without admission was refused (nobody claims without admission); every ticket
//! not admitted reads `sold_out` (sold out reached the whole line); each ticket was admitted
//! once (one expiry on every admitted reading); and the admissions' pace.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use goose::goose::GooseResponse;
use goose::prelude::*;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE};
use serde::Deserialize;

use crate::admin::{mint, mint_visitor};
use crate::scenarios::Drop;
use crate::settings::Secret;
use crate::tally::Answer;

/// One visitor in this many tries a claim without admission first.
pub const CHEAT_EVERY: usize = 20;
/// Tokens outlive any bounded run.
const TOKEN_TTL: Duration = Duration::from_secs(6 * 3600);
/// Pause after an answer that asks to retry (429, 503), and the longest sleep of one step.
const BACKOFF: Duration = Duration::from_millis(250);
const NAP: Duration = Duration::from_millis(500);

/// The answers of the ticket route this scenario reads.
#[derive(Debug, Deserialize)]
struct TicketBody {
    ticket_id: String,
    state: String,
    #[serde(default)]
    admission_token: Option<String>,
    #[serde(default)]
    admission_expires_at: Option<String>,
    #[serde(default)]
    poll_after_ms: Option<u64>,
}

#[derive(Deserialize)]
struct ClaimBody {
    claim_id: String,
}

#[derive(Deserialize)]
struct ProblemBody {
    code: String,
}

/// Where a visitor is.
#[derive(Debug, Clone)]
enum Step {
    New,
    Cheat,
    Join,
    Poll { ticket: String, at: Instant },
    Claim { token: String },
    Done,
}

/// A goose user's session.
#[derive(Clone)]
pub(crate) struct Visitor {
    index: usize,
    name: String,
    /// `Bearer <visitor token>`.
    auth: String,
    step: Step,
}

fn code(body: &[u8]) -> String {
    serde_json::from_slice::<ProblemBody>(body).map_or_else(|_| String::new(), |p| p.code)
}

/// The visitor name of index `i` in run `run_id`.
pub fn visitor_name(run_id: &str, i: usize) -> String {
    format!("lt-{run_id}-queue-{i}")
}

async fn nap(d: Duration) {
    tokio::time::sleep(d.min(NAP)).await;
}

impl Drop {
    /// One step of a visitor (see the module documentation).
    pub(crate) async fn queue_step(&self, user: &mut GooseUser) -> TransactionResult {
        let mut v = match user.get_session_data::<Visitor>().cloned() {
            Some(v) => v,
            None => {
                let index = self.next_buyer();
                let name = visitor_name(&self.run_id, index);
                let token = mint_visitor(&self.secret, &name, TOKEN_TTL).map_err(|e| {
                    Box::new(TransactionError::Custom(format!("minting a token: {e}")))
                })?;
                Visitor {
                    index,
                    name,
                    auth: format!("Bearer {token}"),
                    step: Step::New,
                }
            }
        };
        let result = self.visit(user, &mut v).await;
        user.set_session_data(v);
        result
    }

    async fn visit(&self, user: &mut GooseUser, v: &mut Visitor) -> TransactionResult {
        let line = &self.line;
        let sku = self.skus[0].clone();
        match v.step.clone() {
            Step::New => {
                v.step = if v.index.is_multiple_of(CHEAT_EVERY) {
                    Step::Cheat
                } else {
                    Step::Join
                };
                Ok(())
            }
            Step::Cheat => {
                let token = mint(&self.secret, &v.name, Some(&sku), TOKEN_TTL).map_err(|e| {
                    Box::new(TransactionError::Custom(format!("minting a token: {e}")))
                })?;
                let path = format!("/v1/skus/{sku}/claims");
                let auth = format!("Bearer {token}");
                let mut r = send(user, GooseMethod::Post, &path, "queue_drop cheat", &auth).await?;
                line.cheats.fetch_add(1, Ordering::Relaxed);
                v.step = Step::Join;
                match (r.status, code(&r.body).as_str()) {
                    (Some(403), "not_admitted") => {
                        line.count("cheat", "not_admitted");
                        r.request.error.clear();
                        user.set_success(&mut r.request)
                    }
                    (s, c) => {
                        line.cheats_let_in.fetch_add(1, Ordering::Relaxed);
                        line.count("cheat", &format!("{s:?} {c}"));
                        let why = format!("a claim without admission answered {s:?} {c}");
                        self.tally.violation(format!("{}: {why}", v.name));
                        user.set_failure(&why, &mut r.request, None, None)
                    }
                }
            }
            Step::Join => {
                let path = format!("/v1/skus/{sku}/queue");
                let mut r =
                    send(user, GooseMethod::Post, &path, "queue_drop join", &v.auth).await?;
                match r.status {
                    Some(200 | 201) => {
                        let t: TicketBody = parse(&r.body)?;
                        line.count("join", &r.status.unwrap_or(0).to_string());
                        if t.state == "prequeue" {
                            line.prequeue.fetch_add(1, Ordering::Relaxed);
                        }
                        let mut tickets = line.tickets.lock().unwrap_or_else(|e| e.into_inner());
                        tickets.insert(v.index, t.ticket_id.clone());
                        drop(tickets);
                        self.saw(v, &t);
                        Ok(())
                    }
                    Some(429 | 503) | None => {
                        line.count("join", &format!("{:?}", r.status));
                        nap(BACKOFF).await;
                        user.set_failure("join: retry", &mut r.request, None, None)
                    }
                    Some(s) => {
                        line.count("join", &s.to_string());
                        user.set_failure("join: unexpected answer", &mut r.request, None, None)
                    }
                }
            }
            Step::Poll { ticket, at } => {
                let now = Instant::now();
                if now < at {
                    nap(at - now).await;
                    return Ok(());
                }
                let path = format!("/v1/queue/{ticket}");
                let mut r = send(user, GooseMethod::Get, &path, "queue_drop poll", &v.auth).await?;
                match r.status {
                    Some(200) => {
                        let t: TicketBody = parse(&r.body)?;
                        line.count("poll", &t.state);
                        self.saw(v, &t);
                        Ok(())
                    }
                    _ => {
                        line.count("poll", &format!("{:?}", r.status));
                        v.step = Step::Poll {
                            ticket,
                            at: Instant::now() + BACKOFF,
                        };
                        user.set_failure("poll: no ticket", &mut r.request, None, None)
                    }
                }
            }
            Step::Claim { token } => {
                let path = format!("/v1/skus/{sku}/claims");
                let auth = format!("Bearer {token}");
                let mut r = send(user, GooseMethod::Post, &path, "queue_drop claim", &auth).await?;
                let answer = match (r.status, code(&r.body).as_str()) {
                    (Some(201), _) => {
                        serde_json::from_slice::<ClaimBody>(&r.body)
                            .ok()
                            .map(|b| Answer::Won {
                                claim_id: b.claim_id,
                            })
                    }
                    (Some(409), "sold_out") => Some(Answer::SoldOut),
                    (Some(409), "limit_reached") => Some(Answer::LimitReached),
                    (None, _) => {
                        self.tally.lost(v.index, 0);
                        v.step = Step::Done;
                        return user.set_failure("claim: no answer", &mut r.request, None, None);
                    }
                    (Some(429 | 503), _) => {
                        nap(BACKOFF).await;
                        return user.set_failure("claim: retry", &mut r.request, None, None);
                    }
                    _ => None,
                };
                v.step = Step::Done;
                let Some(answer) = answer else {
                    let why = format!(
                        "an admission token's claim answered {:?} {}",
                        r.status,
                        code(&r.body)
                    );
                    self.tally.violation(format!("{}: {why}", v.name));
                    return user.set_failure(&why, &mut r.request, None, None);
                };
                line.count("claim", &format!("{answer:?}"));
                if let Some(bad) = self.tally.answer(v.index, 0, &answer) {
                    return user.set_failure(&bad, &mut r.request, None, None);
                }
                r.request.error.clear();
                user.set_success(&mut r.request)
            }
            Step::Done => {
                nap(NAP).await;
                Ok(())
            }
        }
    }

    /// The visitor's next step after reading its ticket.
    fn saw(&self, v: &mut Visitor, t: &TicketBody) {
        if let (Some(token), "admitted") = (&t.admission_token, t.state.as_str()) {
            let mut a = self
                .line
                .admissions
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            a.entry(t.ticket_id.clone())
                .or_default()
                .insert(t.admission_expires_at.clone().unwrap_or_default());
            v.step = Step::Claim {
                token: token.clone(),
            };
            return;
        }
        v.step = match t.state.as_str() {
            "sold_out" | "expired" | "admitted" => Step::Done,
            _ => Step::Poll {
                ticket: t.ticket_id.clone(),
                at: Instant::now() + Duration::from_millis(t.poll_after_ms.unwrap_or(1000)),
            },
        };
    }
}

fn parse(body: &[u8]) -> Result<TicketBody, Box<TransactionError>> {
    serde_json::from_slice(body).map_err(|e| {
        Box::new(TransactionError::Custom(format!(
            "a ticket answer that is not a ticket: {e}"
        )))
    })
}

struct Reply {
    request: goose::metrics::GooseRequestMetric,
    status: Option<u16>,
    body: Vec<u8>,
}

async fn send(
    user: &mut GooseUser,
    method: GooseMethod,
    path: &str,
    name: &str,
    auth: &str,
) -> Result<Reply, Box<TransactionError>> {
    let mut builder = user
        .get_request_builder(&method, path)?
        .header(AUTHORIZATION, auth);
    if method == GooseMethod::Post && path.ends_with("/claims") {
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
    let body = response.bytes().await.map(|b| b.to_vec()).ok();
    Ok(Reply {
        request,
        status: body.as_ref().map(|_| status),
        body: body.unwrap_or_default(),
    })
}

/// Reads one ticket with its visitor's token (after the load, outside goose).
pub async fn read_ticket(
    http: &reqwest::Client,
    base: &str,
    secret: &Secret,
    name: &str,
    ticket: &str,
) -> anyhow::Result<(String, Option<String>)> {
    let token = mint_visitor(secret, name, TOKEN_TTL)?;
    let r = http
        .get(format!("{base}/v1/queue/{ticket}"))
        .header(AUTHORIZATION, format!("Bearer {token}"))
        .send()
        .await?;
    let status = r.status();
    let text = r.text().await?;
    if !status.is_success() {
        anyhow::bail!("GET /v1/queue/{ticket}: {status}: {text}");
    }
    let t: TicketBody = serde_json::from_str(&text)?;
    Ok((t.state, t.admission_expires_at))
}
