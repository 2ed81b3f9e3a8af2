//! Typed wrappers of the waiting room's scripts (registered in [`crate::scripts`]): callers
//! never see KEYS/ARGV order.

use redis::aio::ConnectionLike;
use redis::Value;
use uuid::Uuid;

use crate::error::StoreError;
use crate::keys::SkuKeys;
use crate::scripts::Floor;
use crate::scripts::SCRIPTS;
use crate::status::TicketState;

/// One ticket as `lua/lib/queue.lua`'s `q_report` reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// The ticket's state (the lifecycle table's), `None`: no such ticket (`'none'`).
    pub state: Option<TicketState>,
    /// From 1 while waiting (or sold out); 0 otherwise.
    pub position: i64,
    /// When the ticket was admitted (unix ms, Redis's clock); 0 if it was not.
    pub admitted_ms: i64,
    pub now_ms: i64,
    pub opens_ms: i64,
    /// The set rate, and the admissions of the last `window_ms` (the achieved rate).
    pub rate: i64,
    pub recent: i64,
    pub window_ms: i64,
    /// Tickets in line.
    pub waiting: i64,
    /// When the admission ends (unix ms, Redis's clock): fixed when it was made; 0 if none.
    pub expires_ms: i64,
    /// The line's sequence at this reading: everything the ticket's answer rests on is logged
    /// at or below it ([`super::tickets::recorded`]).
    pub line_seq: i64,
    /// The sequence of the oldest entry still in the line's log (0: none): entries are trimmed
    /// only once copied into PostgreSQL and found consistent with it, so the answer is
    /// recorded when this is 0 or above `line_seq`.
    pub unrecorded_from: i64,
}

impl Report {
    /// Whether the line's log still holds an entry this reading rests on.
    pub fn log_behind(&self) -> bool {
        self.unrecorded_from > 0 && self.unrecorded_from <= self.line_seq
    }
}

/// What a join answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Joined {
    /// `created`: a new ticket (201); else the visitor's ticket already (200).
    Ticket {
        created: bool,
        report: Report,
    },
    /// Past the visitor's join rate: retry after this many ms.
    Overloaded(i64),
    Closed,
    /// Before the pre-queue opens (unix ms).
    NotOpen(i64),
}

/// One round of admissions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Round {
    /// `ok`, `follower`, `released`, `not_open`, `sold_out`, `wait`.
    pub code: String,
    pub admitted: i64,
    pub fence: i64,
    pub waiting: i64,
    pub now_ms: i64,
}

fn text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Int(i) => i.to_string(),
        other => format!("{other:?}"),
    }
}

fn int(v: Option<&Value>) -> i64 {
    match v {
        Some(Value::Int(i)) => *i,
        Some(Value::BulkString(b)) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse::<f64>().ok())
            .map_or(0, |f| f as i64),
        _ => 0,
    }
}

fn report(items: &[Value]) -> Result<Report, StoreError> {
    if items.len() < 11 {
        return Err(StoreError::Protocol(format!("queue report: {items:?}")));
    }
    let i = |n: usize| int(items.get(n));
    let state = match text(&items[0]).as_str() {
        "none" => None,
        s => Some(
            s.parse()
                .map_err(|e| StoreError::Protocol(format!("queue report: {e}")))?,
        ),
    };
    Ok(Report {
        state,
        position: i(1),
        admitted_ms: i(2),
        now_ms: i(3),
        opens_ms: i(4),
        rate: i(5),
        recent: i(6),
        window_ms: i(7),
        waiting: i(8),
        expires_ms: i(9),
        line_seq: i(10),
        unrecorded_from: i(11),
    })
}

fn array(v: Value) -> Result<Vec<Value>, StoreError> {
    match v {
        Value::Array(items) if !items.is_empty() => Ok(items),
        other => Err(StoreError::Protocol(format!("queue script: {other:?}"))),
    }
}

fn queue_keys(inv: &mut redis::ScriptInvocation<'_>, keys: &SkuKeys) {
    for k in keys.queue() {
        inv.key(k);
    }
}

/// Writes the queue's settings (see queue_config.lua) unless Redis holds a later version of
/// them. `false`: Redis holds no state for the SKU.
///
/// # Errors
/// The Redis error of the call.
pub async fn configure<C: ConnectionLike>(
    con: &mut C,
    keys: &SkuKeys,
    q: &super::RedisSettings,
) -> Result<bool, StoreError> {
    let [queue, _, _, state, ..] = keys.queue();
    let r: i64 = SCRIPTS
        .queue_config
        .key(queue)
        .key(state)
        .arg(q.rate)
        .arg(i64::from(q.ttl_seconds) * 1000)
        .arg(q.prequeue_ms)
        .arg(q.overbook_milli)
        .arg(q.version)
        .invoke_async(con)
        .await?;
    Ok(r == 1)
}

/// A visitor's join (see join_queue.lua). `floor`: the SKU's (`Store::floor`), `line_floor`:
/// its line's (`Store::line_floor`); a state or line older than them is closed and nothing
/// joins.
///
/// # Errors
/// [`StoreError::SkuLost`] when Redis lost the SKU or its queue, [`StoreError::Stale`] when
/// its state is older than the ledger (fail closed either way), or the Redis error of the call.
pub async fn join<C: ConnectionLike>(
    con: &mut C,
    keys: &SkuKeys,
    ticket: &Uuid,
    shuffle_key: u64,
    visitor: &str,
    floor: Floor,
    line_floor: i64,
) -> Result<Joined, StoreError> {
    let mut inv = SCRIPTS.join_queue.prepare_invoke();
    queue_keys(&mut inv, keys);
    inv.key(keys.queue_joins(ticket))
        .arg(ticket.as_bytes().as_slice())
        .arg(shuffle_key)
        .arg(super::JOINS_PER_WINDOW)
        .arg(super::JOIN_WINDOW.as_millis() as u64)
        .arg(visitor)
        .arg(floor)
        .arg(line_floor);
    let items = array(inv.invoke_async(con).await?)?;
    match text(&items[0]).as_str() {
        "ok" => Ok(Joined::Ticket {
            created: int(items.get(1)) == 1,
            report: report(&items[2..])?,
        }),
        "overloaded" => Ok(Joined::Overloaded(int(items.get(1)))),
        "closed" => Ok(Joined::Closed),
        "not_open" => Ok(Joined::NotOpen(int(items.get(1)))),
        "lost" => Err(StoreError::SkuLost),
        "stale" => Err(StoreError::Stale),
        other => Err(StoreError::Protocol(format!("join_queue: {other}"))),
    }
}

/// A ticket's reading (see read_ticket.lua); `visitor` is "" for the admin.
///
/// # Errors
/// As [`join`].
pub async fn read<C: ConnectionLike>(
    con: &mut C,
    keys: &SkuKeys,
    ticket: &Uuid,
    visitor: &str,
    floor: Floor,
    line_floor: i64,
) -> Result<Report, StoreError> {
    let mut inv = SCRIPTS.read_ticket.prepare_invoke();
    queue_keys(&mut inv, keys);
    inv.arg(ticket.as_bytes().as_slice())
        .arg(visitor)
        .arg(floor)
        .arg(line_floor);
    let items = array(inv.invoke_async(con).await?)?;
    match text(&items[0]).as_str() {
        "ok" => report(&items[1..]),
        "lost" => Err(StoreError::SkuLost),
        "stale" => Err(StoreError::Stale),
        other => Err(StoreError::Protocol(format!("read_ticket: {other}"))),
    }
}

/// One round of admissions by `owner`, or the release of its lease (see admit_queue.lua).
///
/// # Errors
/// As [`join`].
#[allow(clippy::too_many_arguments)]
pub async fn admit<C: ConnectionLike>(
    con: &mut C,
    keys: &SkuKeys,
    owner: &str,
    lease_ms: u64,
    most: u32,
    release: bool,
    floor: Floor,
    line_floor: i64,
) -> Result<Round, StoreError> {
    let mut inv = SCRIPTS.admit_queue.prepare_invoke();
    queue_keys(&mut inv, keys);
    inv.arg(owner)
        .arg(lease_ms)
        .arg(most)
        .arg(if release { "release" } else { "" })
        .arg(floor)
        .arg(line_floor);
    let items = array(inv.invoke_async(con).await?)?;
    let code = text(&items[0]);
    match code.as_str() {
        "lost" => return Err(StoreError::SkuLost),
        "stale" => return Err(StoreError::Stale),
        _ => {}
    }
    Ok(Round {
        code,
        admitted: int(items.get(1)),
        fence: int(items.get(2)),
        waiting: int(items.get(3)),
        now_ms: int(items.get(4)),
    })
}

/// Tickets in line and admitted, and Redis's clock (unix ms), for the SKU view (plain reads
/// in one slot).
///
/// # Errors
/// The Redis error of the call.
pub async fn counts<C: ConnectionLike>(
    con: &mut C,
    keys: &SkuKeys,
) -> Result<(i64, i64, i64), StoreError> {
    let [_, line, admitted, ..] = keys.queue();
    let (waiting, admitted, (secs, micros)): (i64, i64, (i64, i64)) = redis::pipe()
        .cmd("ZCARD")
        .arg(line)
        .cmd("ZCARD")
        .arg(admitted)
        .cmd("TIME")
        .query_async(con)
        .await?;
    Ok((waiting, admitted, secs * 1000 + micros / 1000))
}
