//! The waiting-room ticket's part of the table (`TicketState`, `TICKET_STEPS`): the states
//! the queue's scripts read a ticket as, the scripts that move a ticket, the OpenAPI's and the
//! page's states, and the route's answers over a ticket's life (pre-queue, the opening of a
//! sold-out SKU, units coming back, admission, a purchase, an admission left to expire).

use std::collections::BTreeSet;
use std::time::Duration;

use dropgate::status::{TicketState, TICKET_STEPS};
use serde_json::{json, Value};

use super::{code_of, scripts, ROOT};
use crate::helpers::{spawn_app, ADMIN};
use crate::queue::{claim_with, declare_queued, join_retrying, ticket, visitor, LONG};

/// The queue's scripts: those that take the queue's keys (lib/queue.lua's header).
fn queue_scripts() -> Vec<(String, String)> {
    scripts()
        .into_iter()
        .filter(|(path, text)| {
            path == "lua/lib/queue.lua" || text.contains("the queue keys (see lib/queue.lua)")
        })
        .collect()
}

/// Every `state = '<word>'` of a line of code.
fn assigned_states(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("state = '") {
        let before = rest[..at].chars().next_back();
        let tail = &rest[at + "state = '".len()..];
        rest = tail;
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '.') {
            continue;
        }
        out.push(tail.split('\'').next().unwrap().to_string());
    }
    // `local state, position, adm = 'none', 0, 0`: the first value is the state's.
    if let Some((_, tail)) = code.split_once("local state, position, adm = '") {
        out.push(tail.split('\'').next().unwrap().to_string());
    }
    out
}

#[test]
fn every_state_the_queue_scripts_read_a_ticket_as_is_in_the_table() {
    let mut wrong = Vec::new();
    let mut made: BTreeSet<(String, String)> = BTreeSet::new();
    let found = queue_scripts();
    assert_eq!(found.len(), 4, "lib/queue.lua and three queue scripts");
    for (path, text) in &found {
        for line in text.lines() {
            for s in assigned_states(code_of(line)) {
                // 'none' is no state: no such ticket (404).
                if s != "none" && s.parse::<TicketState>().is_err() {
                    wrong.push(format!("{path}: ticket state {s:?} is not in the table"));
                }
                made.insert((path.clone(), s));
            }
        }
    }
    // q_report names every state of the table, and only it names states.
    for s in TicketState::ALL {
        if !made.contains(&("lua/lib/queue.lua".into(), s.to_string())) {
            wrong.push(format!("lua/lib/queue.lua never reads a ticket as {s}"));
        }
    }
    for (path, s) in &made {
        if path != "lua/lib/queue.lua" {
            wrong.push(format!(
                "{path} names the state {s}: only q_report reads one"
            ));
        }
    }
    // The scripts that move a ticket are the table's: into the line (creations) and into the
    // admitted set (admission), and nothing takes a ticket out of the admitted set.
    let moves = |pattern: &str| -> BTreeSet<String> {
        found
            .iter()
            .filter(|(_, t)| t.lines().any(|l| code_of(l).contains(pattern)))
            .map(|(p, _)| p.clone())
            .collect()
    };
    let named = |pick: &dyn Fn(&dropgate::status::Step<TicketState>) -> bool| {
        TICKET_STEPS
            .iter()
            .filter(|st| pick(st))
            .flat_map(|st| st.decided_by.iter().map(|s| s.to_string()))
            .filter(|s| s != "lua/lib/queue.lua")
            .collect::<BTreeSet<String>>()
    };
    let into_line = named(&|st| st.from.is_none());
    let into_admitted = named(&|st| st.to == TicketState::Admitted && st.from.is_some());
    if moves("redis.call('ZADD', KEYS[2]") != into_line {
        wrong.push(format!(
            "scripts adding to the line {:?}, the table's creations {into_line:?}",
            moves("redis.call('ZADD', KEYS[2]")
        ));
    }
    if moves("redis.call('ZADD', KEYS[3]") != into_admitted {
        wrong.push(format!(
            "scripts adding to the admitted set {:?}, the table's admissions {into_admitted:?}",
            moves("redis.call('ZADD', KEYS[3]")
        ));
    }
    for pattern in ["'ZREM', KEYS[3]", "'ZPOPMIN', KEYS[3]", "'DEL', KEYS[3]"] {
        if !moves(pattern).is_empty() {
            wrong.push(format!(
                "{:?} take tickets out of the admitted set",
                moves(pattern)
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_openapi_and_the_page_know_exactly_the_tables_ticket_states() {
    let api: Value = serde_json::from_str(
        &std::fs::read_to_string(format!("{ROOT}/docs/openapi.json")).unwrap(),
    )
    .unwrap();
    let documented: BTreeSet<String> = api["components"]["schemas"]["QueueTicket"]["properties"]
        ["state"]["enum"]
        .as_array()
        .expect("QueueTicket.state is an enum")
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    let table: BTreeSet<String> = TicketState::ALL.iter().map(|s| s.to_string()).collect();
    assert_eq!(documented, table);
    // The page's words, one table per language (src/queue/page.rs): a label for every state
    // in each.
    let words = std::fs::read_to_string(format!("{ROOT}/src/queue/page.rs")).unwrap();
    let languages = words.matches("\"title\": ").count();
    assert!(languages >= 2, "{languages}");
    for s in TicketState::ALL {
        assert_eq!(
            words.matches(&format!("\"{s}\": \"")).count(),
            languages,
            "the waiting page has no label for {s} in every language"
        );
    }
}

/// A visitor's answers so far; each new one must be the table's state and follow the last by
/// the table's steps.
struct Seen {
    states: Vec<TicketState>,
}

impl Seen {
    fn saw(&mut self, who: &str, body: &Value) -> TicketState {
        let text = body["state"].as_str().unwrap_or("(none)");
        let s: TicketState = text
            .parse()
            .unwrap_or_else(|_| panic!("{who}: state {text:?} is not in the table: {body}"));
        let last = self.states.last().copied();
        assert!(
            last == Some(s) || TicketState::reaches(last, s),
            "{who}: {last:?} -> {s}: no steps of the table lead there ({:?})",
            self.states
        );
        // What the route shows with each state.
        let positioned = matches!(s, TicketState::Waiting | TicketState::SoldOut);
        assert_eq!(body["position"].is_i64(), positioned, "{who}: {body}");
        assert_eq!(
            body["admission_token"].is_string(),
            s == TicketState::Admitted,
            "{who}: {body}"
        );
        if last != Some(s) {
            self.states.push(s);
        }
        s
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_ticket_state_the_route_answers_is_the_tables_and_follows_its_steps() {
    let app = spawn_app().await;
    let sku = "lt-q";
    // No units at the opening: the pre-queue opens onto a sold-out SKU.
    let opens = chrono::Utc::now() + chrono::Duration::seconds(2);
    let r = declare_queued(
        &app,
        sku,
        0,
        json!({"admit_per_second": 1, "admission_ttl_seconds": 10}),
        json!({"opens_at": opens.to_rfc3339()}),
    )
    .await;
    assert_eq!(r.status(), 201);
    let n = 5;
    let mut seen: Vec<Seen> = (0..n).map(|_| Seen { states: Vec::new() }).collect();
    let mut ids = Vec::new();
    for (i, s) in seen.iter_mut().enumerate() {
        let (st, b) = join_retrying(&app, sku, &visitor(&format!("lt-{i}"))).await;
        assert_eq!(st, 201, "{b}");
        s.saw(&format!("lt-{i}"), &b);
        ids.push(b["ticket_id"].as_str().unwrap().to_string());
    }
    // Reads every ticket (the visitor's and the admin's reading) until `done` holds.
    let deadline = std::time::Instant::now() + LONG;
    let read_all = async |seen: &mut Vec<Seen>, done: &dyn Fn(&[TicketState]) -> bool| loop {
        let mut now = Vec::new();
        for (i, s) in seen.iter_mut().enumerate() {
            let who = format!("lt-{i}");
            let (st, b) = ticket(&app, &ids[i], &visitor(&who)).await;
            if st == 503 {
                now.push(*s.states.last().unwrap());
                continue;
            }
            assert_eq!(st, 200, "{b}");
            now.push(s.saw(&who, &b));
            let (st, b) = ticket(&app, &ids[i], ADMIN).await;
            assert!(st == 200 || st == 503, "{b}");
            if st == 200 {
                let text = b["state"].as_str().unwrap_or("");
                assert!(text.parse::<TicketState>().is_ok(), "admin: {b}");
            }
        }
        if done(&now) {
            return now;
        }
        assert!(std::time::Instant::now() < deadline, "stuck at {now:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let all = |want: TicketState| move |now: &[TicketState]| now.iter().all(|s| *s == want);
    read_all(&mut seen, &all(TicketState::SoldOut)).await;
    // A unit comes back: the line waits again, its head is admitted and buys it.
    assert_eq!(app.restock(sku, 1).await.status(), 200);
    let now = read_all(&mut seen, &|now| now.contains(&TicketState::Admitted)).await;
    let buyer = now
        .iter()
        .position(|s| *s == TicketState::Admitted)
        .unwrap();
    let (_, b) = ticket(&app, &ids[buyer], &visitor(&format!("lt-{buyer}"))).await;
    let (st, won) = claim_with(&app, sku, b["admission_token"].as_str().unwrap()).await;
    assert_eq!(st, 201, "{won}");
    // Sold out again: whoever is still in line reads it; the buyer stays admitted (used).
    read_all(&mut seen, &|now| {
        now.contains(&TicketState::SoldOut) && now.iter().all(|s| *s != TicketState::Waiting)
    })
    .await;
    // Another unit: the next head is admitted, does not buy, and its admission expires.
    assert_eq!(app.restock(sku, 1).await.status(), 200);
    read_all(&mut seen, &|now| now.contains(&TicketState::Expired)).await;
    let after = read_all(&mut seen, &|_| true).await;
    assert_eq!(
        after[buyer],
        TicketState::Admitted,
        "a used admission stays admitted"
    );
    let observed: BTreeSet<&str> = (seen.iter())
        .flat_map(|s| s.states.iter().map(|t| t.as_str()))
        .collect();
    // `closed` (the line at closes_at) is seen by
    // queue::closing::after_closes_at_nobody_is_admitted_the_line_reads_closed_and_joins_are_refused.
    assert_eq!(
        observed.len(),
        TicketState::ALL.len() - 1,
        "every state but closed seen: {observed:?}"
    );
    assert!(!observed.contains("closed"));
}
