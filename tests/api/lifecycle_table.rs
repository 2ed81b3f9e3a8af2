//! The one lifecycle table (`src/status.rs`, its steps in `status/steps.rs`) holds
//! everything that writes a status: the Lua scripts' status literals, the SQL CHECKs of a
//! migrated database, the outbox's events, and the transitions the writer's statements perform
//! when run on every pair of statuses. A status or a step that is not in the table fails here.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use dropgate::outbox::EventKind;
use dropgate::status::{
    ClaimStatus, EntryStatus, Step, TicketState, CLAIM_STEPS, ENTRY_STEPS, TICKET_STEPS,
};
use dropgate::writer::{Change, WaitChange, Winner};
use sqlx::PgPool;
use uuid::Uuid;

use crate::helpers::Isolation;

mod tickets;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The lowercase literals of the scripts that are no status, with what they are. A literal
/// that is neither a status nor listed here fails the vocabulary test: a new status enters the
/// table, anything else enters this list.
const NOT_STATUSES: &[&str] = &[
    // Fields of the SKU's state hash.
    "seq",
    "stock",
    "stale",
    "wl_pool",
    "rows",
    "inflight",
    "limit",
    "wl_until",
    "opens_ms",
    "epoch",
    "closes_ms",
    "wl_order",
    "pool",
    "offer_ms",
    "hold_ms",
    "gen",
    "writers",
    "seed",
    "name",
    // Journal entry fields (w, s, c, k, x, t, r, q) and a resolver's fence of a call record.
    "w",
    "s",
    "c",
    "k",
    "x",
    "t",
    "r",
    "q",
    "void",
    // Script modes and replies.
    "transfer_out",
    "declare",
    "resolve",
    "fence",
    "confirm",
    "cancel",
    "fenced",
    "lost",
    "table",
    // XINFO CONSUMERS fields (reap_consumers.lua).
    "pending",
    "idle",
    // The state's incarnation (lua/lib/fresh.lua, rotate.lua).
    "inc",
    // The state's count of journal acknowledgements (ack_journal.lua; the view's fence).
    "acks",
    // A compensation marker's value for a hold that had ended before its compensation
    // (compensate.lua; its other value, 'compensated', is a claim status).
    "ended",
    // The waiting room (lua/lib/queue.lua and the queue scripts): its hash's fields, the
    // admission lease's and the supply's replies, and 'none' (no such ticket: 404). A ticket's
    // states are `TicketState`'s (lifecycle_table/tickets.rs).
    "admitted_total",
    // The line's log (lua/lib/queue.lua, src/queue/tickets.rs): its entries' kind (j: a join,
    // a: a round's admissions) and fields, the line's own sequence.
    "j",
    "a",
    "at",
    "ex",
    "o",
    "v",
    "n",
    "qseq",
    "credit",
    "first_ms",
    "last_ms",
    "follower",
    "lease_until",
    "owner",
    "rate",
    "release",
    "released",
    "prequeue_ms",
    "ttl_ms",
    "ok",
    "none",
    "wait",
    "open",
    "not_open",
    "closed",
    "overloaded",
    // Seats (lua/claim_seats.lua): its modes (exact 'x' is a journal field above), best
    // adjacent 'b' and best any 'f', and its replies.
    "b",
    "f",
    "no_adjacent",
    "replay",
    "reused",
    "taken",
    "won",
    // The journal entry's seats field.
    "z",
    // The queue's settings (lua/queue_config.lua): the overbook bound and their version.
    "overbook_milli",
    "version",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Claim,
    Entry,
}

/// A status a script writes: `(script, kind, status)`.
type Made = (String, Kind, String);

fn scripts() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for dir in ["lua", "lua/lib"] {
        let mut names: Vec<_> = std::fs::read_dir(format!("{ROOT}/{dir}"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.ends_with(".lua"))
            .collect();
        names.sort();
        for n in names {
            let path = format!("{dir}/{n}");
            let text = std::fs::read_to_string(format!("{ROOT}/{path}")).unwrap();
            out.push((path, text));
        }
    }
    assert!(out.len() > 10, "the scripts are where they were");
    out
}

/// A line without its comment (`--` outside a string).
fn code_of(line: &str) -> &str {
    let mut quote = None;
    let b = line.as_bytes();
    for (i, &c) in b.iter().enumerate() {
        match (quote, c) {
            (None, q @ (b'\'' | b'"')) => quote = Some(q),
            (Some(q), c) if c == q => quote = None,
            (None, b'-') if b.get(i + 1) == Some(&b'-') => return &line[..i],
            _ => {}
        }
    }
    line
}

/// The single-quoted literals of a line of code.
fn literals(code: &str) -> Vec<&str> {
    code.split('\'').skip(1).step_by(2).collect()
}

/// The arguments of every call of `name` on a line, as written (split at top-level commas).
fn calls<'a>(code: &'a str, name: &str) -> Vec<Vec<&'a str>> {
    let mut out = Vec::new();
    let pat = format!("{name}(");
    let mut from = 0;
    while let Some(at) = code[from..].find(&pat).map(|i| i + from) {
        from = at + pat.len();
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '.') {
            continue;
        }
        let (mut depth, mut quote, mut start, mut args) = (0, false, from, Vec::new());
        for (i, c) in code[from..].char_indices().map(|(i, c)| (i + from, c)) {
            match c {
                '\'' => quote = !quote,
                '(' | '{' if !quote => depth += 1,
                ')' | '}' if !quote && depth > 0 => depth -= 1,
                ',' | ')' if !quote && depth == 0 => {
                    args.push(code[start..i].trim());
                    start = i + 1;
                    if c == ')' {
                        break;
                    }
                }
                _ => {}
            }
        }
        out.push(args);
    }
    out
}

fn quoted(arg: Option<&&str>) -> Option<String> {
    let a = arg?;
    (a.len() >= 2 && a.starts_with('\'') && a.ends_with('\'')).then(|| a[1..a.len() - 1].into())
}

/// Every status the scripts write into a hold or entry record, a journal record, or an ending
/// (`end_hold`'s status and its offer's entry's), by script; and every status they compare a
/// record's status with (`h.status` a hold's, `e.status` an entry's).
fn lua_statuses() -> (Vec<Made>, Vec<Made>) {
    let (mut made, mut compared) = (Vec::new(), Vec::new());
    for (path, text) in scripts() {
        for line in text.lines() {
            let code = code_of(line);
            let mut add = |kind, s: Option<String>| {
                if let Some(s) = s {
                    made.push((path.clone(), kind, s));
                }
            };
            for a in calls(code, "pack_hold") {
                add(Kind::Claim, quoted(a.first()));
            }
            for a in calls(code, "change_record") {
                add(Kind::Claim, quoted(a.get(1)));
            }
            for a in calls(code, "end_hold") {
                add(Kind::Claim, quoted(a.get(2)));
                add(Kind::Entry, quoted(a.get(5)));
            }
            for a in calls(code, "pack_entry") {
                add(Kind::Entry, quoted(a.first()));
            }
            for a in calls(code, "entry_record") {
                add(Kind::Entry, quoted(a.get(2)));
            }
            if let Some((_, rest)) = code.split_once("entry_end or '") {
                add(Kind::Entry, rest.split('\'').next().map(String::from));
            }
            // claim.lua writes its holds' records whole (as a literal or through string.format).
            if let Some((_, rest)) = code.split_once("hold_recs[#hold_recs + 1] = ") {
                let rest = rest.strip_prefix("string.format(").unwrap_or(rest);
                if let Some(rest) = rest.strip_prefix('\'') {
                    add(Kind::Claim, rest.split('|').next().map(String::from));
                }
            }
            let mut rest = code;
            while let Some(at) = rest.find(".status ") {
                let var = rest[..at]
                    .rsplit(|c: char| !c.is_alphanumeric())
                    .next()
                    .unwrap();
                let tail = &rest[at + ".status ".len()..];
                rest = tail;
                if !(tail.starts_with("== '") || tail.starts_with("~= '")) {
                    continue;
                }
                let kind = match var {
                    "h" => Kind::Claim,
                    "e" => Kind::Entry,
                    other => panic!("{path}: `{other}.status`: a record this test does not know"),
                };
                let s = tail[4..].split('\'').next().unwrap().to_string();
                compared.push((path.clone(), kind, s));
            }
        }
    }
    (made, compared)
}

fn parses(kind: Kind, s: &str) -> bool {
    match kind {
        Kind::Claim => s.parse::<ClaimStatus>().is_ok(),
        Kind::Entry => s.parse::<EntryStatus>().is_ok(),
    }
}

/// The scripts that make `(kind, status)` in the table.
fn decided_by(kind: Kind, s: &str) -> Vec<&'static str> {
    fn of<S: Copy + PartialEq + std::fmt::Display>(
        steps: &[Step<S>],
        s: &str,
    ) -> Vec<&'static str> {
        (steps.iter())
            .filter(|st| st.to.to_string() == s)
            .flat_map(|st| st.decided_by.iter().copied())
            .collect()
    }
    match kind {
        Kind::Claim => of(CLAIM_STEPS, s),
        Kind::Entry => of(ENTRY_STEPS, s),
    }
}

#[test]
fn every_status_a_script_writes_or_compares_is_in_the_table() {
    let (made, compared) = lua_statuses();
    assert!(
        made.len() > 20,
        "the scripts' statuses were found: {made:?}"
    );
    let mut wrong = Vec::new();
    for (path, kind, s) in made.iter().chain(&compared) {
        if !parses(*kind, s) {
            wrong.push(format!("{path}: {kind:?} status {s:?} is not in the table"));
        }
    }
    // Each script makes only the statuses the table says it makes...
    let set: BTreeSet<&Made> = made.iter().collect();
    for (path, kind, s) in &set {
        if parses(*kind, s) && !decided_by(*kind, s).contains(&path.as_str()) {
            wrong.push(format!(
                "{path} makes a {kind:?} {s:?}: no step of the table to {s:?} names it"
            ));
        }
    }
    // ... and each step's scripts make it (a claim final at once has no hold record in Redis:
    // claim.lua's call record is all it leaves).
    let mut check = |kind: Kind, to: String, scripts: &[&str]| {
        for path in scripts {
            let key = (path.to_string(), kind, to.clone());
            let no_record = kind == Kind::Claim && to == "issued";
            if set.contains(&key) || no_record {
                continue;
            }
            wrong.push(format!(
                "the table says {path} makes {kind:?} {to:?}; it does not"
            ));
        }
    };
    for st in CLAIM_STEPS {
        check(Kind::Claim, st.to.to_string(), st.decided_by);
    }
    for st in ENTRY_STEPS {
        check(Kind::Entry, st.to.to_string(), st.decided_by);
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn every_word_a_script_quotes_is_a_status_or_named_otherwise() {
    let mut unknown = BTreeSet::new();
    for (path, text) in scripts() {
        for line in text.lines() {
            for lit in literals(code_of(line)) {
                let word =
                    !lit.is_empty() && lit.chars().all(|c| c.is_ascii_lowercase() || c == '_');
                let known = lit.parse::<ClaimStatus>().is_ok()
                    || lit.parse::<EntryStatus>().is_ok()
                    || lit.parse::<TicketState>().is_ok()
                    || NOT_STATUSES.contains(&lit);
                if word && !known {
                    unknown.insert(format!("{path}: '{lit}'"));
                }
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "literals that are neither a status of the table nor in NOT_STATUSES:\n{}",
        unknown.into_iter().collect::<Vec<_>>().join("\n")
    );
}

#[test]
fn every_statement_the_table_names_exists() {
    let steps = (CLAIM_STEPS.iter().flat_map(|s| s.recorded_by.iter()))
        .chain(ENTRY_STEPS.iter().flat_map(|s| s.recorded_by.iter()));
    for named in steps {
        let (path, item) = named.split_once(": ").expect("\"path: item\"");
        let text = std::fs::read_to_string(format!("{ROOT}/{path}")).unwrap();
        assert!(
            text.contains(&format!("const {item}: &str")) || text.contains(&format!("fn {item}(")),
            "{path} has no statement {item}"
        );
    }
    for st in CLAIM_STEPS
        .iter()
        .flat_map(|s| s.decided_by)
        .chain(ENTRY_STEPS.iter().flat_map(|s| s.decided_by))
        .chain(TICKET_STEPS.iter().flat_map(|s| s.decided_by))
    {
        assert!(
            std::path::Path::new(&format!("{ROOT}/{st}")).exists(),
            "{st}"
        );
    }
}

#[test]
fn every_event_tells_a_step_of_the_table() {
    let told: BTreeSet<&str> = (CLAIM_STEPS.iter().flat_map(|s| s.events.iter()))
        .chain(ENTRY_STEPS.iter().flat_map(|s| s.events.iter()))
        .copied()
        .collect();
    for e in &told {
        assert!(
            EventKind::parse(e).is_some(),
            "the table names event {e}, the outbox has none"
        );
    }
    for k in EventKind::ALL {
        assert!(
            told.contains(k.as_str()),
            "event {} tells no step of the table",
            k.as_str()
        );
    }
    // A creation's events create, a change's do not.
    for st in CLAIM_STEPS {
        for e in st.events {
            assert_eq!(
                EventKind::parse(e).unwrap().creates(),
                st.from.is_none(),
                "{e}"
            );
        }
    }
    // The reprocessor tells a parked hold's change by the table's event.
    for s in ClaimStatus::ALL {
        let step = CLAIM_STEPS
            .iter()
            .find(|st| st.from == Some(ClaimStatus::Held) && st.to == *s);
        let want = step.filter(|_| s.is_hold_change()).map(|st| st.events);
        let got = EventKind::of_change(*s).map(|k| k.as_str());
        assert_eq!(want.map(|e| e.to_vec()), got.map(|g| vec![g]), "{s}");
    }
}

async fn migrated() -> PgPool {
    let iso = Isolation::new();
    dropgate::db::connect_and_migrate(&iso.database_url)
        .await
        .expect("PostgreSQL at 127.0.0.1:5432")
}

#[tokio::test]
async fn every_check_on_a_status_column_is_the_tables() {
    let db = migrated().await;
    let rows: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT c.conrelid::regclass::text, a.attname::text, pg_get_constraintdef(c.oid)
           FROM pg_constraint c
           JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = ANY (c.conkey)
          WHERE c.contype = 'c' AND a.attname LIKE '%status%'
          ORDER BY 1, 2",
    )
    .fetch_all(&db)
    .await
    .unwrap();
    let claims: BTreeSet<String> = ClaimStatus::ALL.iter().map(|s| s.to_string()).collect();
    let entries: BTreeSet<String> = EntryStatus::ALL.iter().map(|s| s.to_string()).collect();
    let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    let mut want: HashMap<(&str, &str), BTreeSet<String>> = HashMap::new();
    want.insert(("issuances", "status"), claims.clone());
    // A parked claim's compensation is the parked row's own status.
    let mut parked = claims.clone();
    parked.remove("compensated");
    want.insert(("persistence_pending", "claim_status"), parked);
    want.insert(("waitlist", "status"), entries);
    // Lifecycles of other things than claims and entries: a parked row's, a restock's.
    want.insert(
        ("persistence_pending", "status"),
        set(&["pending", "reprocessing", "resolved", "compensated"]),
    );
    want.insert(
        ("restock_ops", "status"),
        set(&["pending", "applied", "not_applied"]),
    );
    let mut seen = BTreeSet::new();
    for (table, column, def) in &rows {
        let got: BTreeSet<String> = literals(def).into_iter().map(String::from).collect();
        let Some(expected) = want.get(&(table.as_str(), column.as_str())) else {
            panic!("{table}.{column} has a CHECK on a status the table does not know: {def}");
        };
        assert_eq!(&got, expected, "{table}.{column}: {def}");
        seen.insert((table.as_str(), column.as_str()));
    }
    assert_eq!(seen.len(), want.len(), "CHECKs found: {rows:?}");
}

fn step_of<S: Copy + PartialEq>(
    steps: &'static [Step<S>],
    from: Option<S>,
    to: S,
) -> Option<&'static Step<S>> {
    steps.iter().find(|s| s.from == from && s.to == to)
}

const APPLY_CHANGES: &str = "src/writer/lifecycle.rs: APPLY_CHANGES";
const APPLY_WAITS: &str = "src/writer/lifecycle.rs: APPLY_WAITS";
const WRITE_WIN: &str = "src/writer/postgres.rs: INSERT_ISSUANCES";

#[tokio::test]
async fn the_writers_hold_changes_make_only_the_tables_steps() {
    let db = migrated().await;
    let now = chrono::Utc::now().timestamp_millis();
    let mut cases = Vec::new();
    for from in ClaimStatus::ALL {
        for to in ClaimStatus::ALL.iter().filter(|s| s.is_hold_change()) {
            let (row, parked) = (Uuid::new_v4(), Uuid::new_v4());
            sqlx::query(
                "INSERT INTO issuances (claim_id, sku, user_id, quantity, status, created_at)
                 VALUES ($1, 'lc', 'u', 1, $2, now())",
            )
            .bind(row)
            .bind(from)
            .execute(&db)
            .await
            .unwrap();
            if *from != ClaimStatus::Compensated {
                sqlx::query(
                    "INSERT INTO persistence_pending
                       (claim_id, sku, user_id, quantity, created_at, failure_reason, claim_status)
                     VALUES ($1, 'lc', 'u', 1, now(), 'test', $2)",
                )
                .bind(parked)
                .bind(from)
                .execute(&db)
                .await
                .unwrap();
            }
            cases.push((*from, *to, row, parked));
        }
    }
    let change = |claim_id, status| Change {
        entry_id: "1-0".into(),
        claim_id,
        status,
        quantity: 1,
        ms: now,
        seq: 1,
    };
    let changes: Vec<Change> = (cases.iter())
        .flat_map(|(_, to, row, parked)| [change(*row, *to), change(*parked, *to)])
        .collect();
    dropgate::writer::apply_changes(&db, &changes)
        .await
        .unwrap();
    let mut wrong = Vec::new();
    for (from, to, row, parked) in cases {
        let recorded =
            step_of(CLAIM_STEPS, Some(from), to).filter(|s| s.recorded_by.contains(&APPLY_CHANGES));
        let after: ClaimStatus =
            sqlx::query_scalar("SELECT status FROM issuances WHERE claim_id = $1")
                .bind(row)
                .fetch_one(&db)
                .await
                .unwrap();
        let events: Vec<(i32, String, ClaimStatus)> =
            sqlx::query_as("SELECT seq, event, status FROM outbox WHERE claim_id = $1")
                .bind(row)
                .fetch_all(&db)
                .await
                .unwrap();
        match (after != from, recorded) {
            (true, Some(step)) => {
                let told = events.len() == 1
                    && events[0].0 == 2
                    && step.events.contains(&events[0].1.as_str())
                    && events[0].2 == to;
                if after != to || !told {
                    wrong.push(format!("{from} -> {to}: row {after}, events {events:?}"));
                }
            }
            (true, None) => wrong.push(format!("the writer made {from} -> {after}: no such step")),
            (false, Some(_)) => wrong.push(format!("the table's {from} -> {to} is not made")),
            (false, None) if !events.is_empty() => wrong.push(format!("{from}: events {events:?}")),
            (false, None) => {}
        }
        let kept: Option<ClaimStatus> =
            sqlx::query_scalar("SELECT claim_status FROM persistence_pending WHERE claim_id = $1")
                .bind(parked)
                .fetch_optional(&db)
                .await
                .unwrap();
        match (kept, recorded) {
            (None, _) => assert_eq!(from, ClaimStatus::Compensated),
            (Some(k), Some(_)) if k != to => wrong.push(format!("parked {from} -> {to}: {k}")),
            (Some(k), None) if k != from => {
                wrong.push(format!("parked {from} -> {k}: no such step"))
            }
            _ => {}
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[tokio::test]
async fn the_writers_waitlist_statement_moves_entries_only_forward_along_the_table() {
    let db = migrated().await;
    let now = chrono::Utc::now().timestamp_millis();
    let froms = std::iter::once(None).chain(EntryStatus::ALL.iter().copied().map(Some));
    let mut cases = Vec::new();
    for from in froms {
        for to in EntryStatus::ALL {
            let id = Uuid::new_v4();
            if let Some(f) = from {
                sqlx::query(
                    "INSERT INTO waitlist (entry_id, sku, user_id, position, status, created_at)
                     VALUES ($1, 'lc', 'u', 1, $2, now())",
                )
                .bind(id)
                .bind(f)
                .execute(&db)
                .await
                .unwrap();
            }
            cases.push((from, *to, id));
        }
    }
    let waits: Vec<WaitChange> = (cases.iter())
        .map(|(_, to, id)| WaitChange {
            journal_entry: "1-0".into(),
            entry_id: *id,
            user: "u".into(),
            status: *to,
            order: 1,
            ms: now,
            seq: 1,
            quantity: 1,
        })
        .collect();
    dropgate::writer::apply_waits(&db, crate::helpers::sku_id("lc"), &waits)
        .await
        .unwrap();
    let mut wrong = Vec::new();
    for (from, to, id) in cases {
        let (after, claim): (Option<EntryStatus>, Option<Uuid>) =
            sqlx::query_as("SELECT status, claim_id FROM waitlist WHERE entry_id = $1")
                .bind(id)
                .fetch_optional(&db)
                .await
                .unwrap()
                .map_or((None, None), |(s, c)| (Some(s), c));
        let show = |s: Option<EntryStatus>| s.map_or("(none)".to_string(), |s| s.to_string());
        // Only an offer's record names its claim, in whatever order the records come (two
        // writers may write an end before the join or the offer it follows).
        let offer = matches!(to, EntryStatus::Offered | EntryStatus::Claimed);
        if claim != offer.then_some(id) {
            wrong.push(format!(
                "{} then {to}: claim {claim:?}, named only by an offer",
                show(from)
            ));
        }
        let recorded =
            step_of(ENTRY_STEPS, from, to).filter(|s| s.recorded_by.contains(&APPLY_WAITS));
        if after != from {
            // The ledger may take several steps at once (an offer's record quarantined), but
            // only forward along the table.
            if after != Some(to) || !EntryStatus::reaches(from, to) {
                wrong.push(format!(
                    "the writer made {} -> {}: not along the table",
                    show(from),
                    show(after)
                ));
            }
        } else if recorded.is_some() {
            wrong.push(format!("the table's {} -> {to} is not made", show(from)));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[tokio::test]
async fn the_writers_insert_creates_claims_as_the_table_says() {
    let db = migrated().await;
    let now = chrono::Utc::now().timestamp_millis();
    let winner = |expires_ms, offer| Winner {
        entry_id: "1-0".into(),
        claim_id: Uuid::new_v4(),
        sku: "lc".into(),
        user: "u".into(),
        quantity: 1,
        idempotency_key: None,
        remaining_after: Some(0),
        created_ms: now,
        seq: 1,
        expires_ms,
        offer,
        seats: None,
    };
    let winners = [
        winner(None, false),
        winner(Some(now + 60_000), false),
        winner(Some(now + 60_000), true),
    ];
    let unwritable = dropgate::writer::write_batch(&db, &winners, Duration::from_secs(1))
        .await
        .unwrap();
    assert!(unwritable.is_empty());
    for w in &winners {
        let status: ClaimStatus =
            sqlx::query_scalar("SELECT status FROM issuances WHERE claim_id = $1")
                .bind(w.claim_id)
                .fetch_one(&db)
                .await
                .unwrap();
        let (event, told): (String, ClaimStatus) = sqlx::query_as(
            "SELECT event, status FROM claim_events WHERE claim_id = $1 AND seq = 1",
        )
        .bind(w.claim_id)
        .fetch_one(&db)
        .await
        .unwrap();
        let step = step_of(CLAIM_STEPS, None, status).expect("a creation of the table");
        assert!(step.recorded_by.contains(&WRITE_WIN), "{status}");
        assert!(step.events.contains(&event.as_str()), "{status}: {event}");
        assert_eq!(told, status);
    }
}
