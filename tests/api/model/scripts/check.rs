//! What the driver reads back after every step and holds to the model: Redis's clock, the
//! journal entries the step appended (field for field), the state hash, per-user counts,
//! holds, the expiry set, the line, entries and members.

use std::collections::BTreeMap;

use rand::Rng;
use redis::aio::ConnectionManager;
use redis::Value;

use super::{same, Driver};
use crate::model::world::World;

/// One PostgreSQL refusal in this many wins: the claim is parked (and may be compensated).
const PARK_ONE_IN: u32 = 8;
/// The ledger balances (a recount over every claim) every this many steps.
const BALANCE_EVERY: u64 = 64;

/// Redis's clock in ms, as the scripts read it (`redis_now` in lua/lib/lifecycle.lua).
pub async fn redis_ms(con: &mut ConnectionManager) -> Result<i64, String> {
    let t: (i64, i64) = redis::cmd("TIME")
        .query_async(con)
        .await
        .map_err(|e| e.to_string())?;
    Ok(ms_of(t))
}

fn ms_of((secs, micros): (i64, i64)) -> i64 {
    secs * 1000 + micros / 1000
}

/// stock, seq, inflight, stale, wl_order, as HMGET reads them.
type StateHead = (
    Option<i64>,
    Option<i64>,
    Option<i64>,
    Option<String>,
    Option<i64>,
);

/// Redis after a step.
pub struct Obs {
    /// Redis's clock when it was read.
    time: i64,
    /// Journal entries appended since the last step: id and fields.
    entries: Vec<(String, Vec<(String, String)>)>,
    head: StateHead,
    users: BTreeMap<String, i64>,
    holds: BTreeMap<String, String>,
    expiry: Vec<(String, i64)>,
    line: Vec<(String, i64)>,
    entry_recs: BTreeMap<String, String>,
    members: BTreeMap<String, String>,
}

type Read = (
    (i64, i64),
    Value,
    StateHead,
    BTreeMap<String, i64>,
    BTreeMap<String, String>,
    Vec<(String, i64)>,
    Vec<(String, i64)>,
    BTreeMap<String, String>,
    BTreeMap<String, String>,
);

impl Driver {
    async fn observe(&mut self) -> Result<Obs, String> {
        let k = &self.keys;
        let from = (self.last_entry.as_ref()).map_or("-".to_string(), |id| format!("({id}"));
        let (t, raw, head, users, holds, expiry, line, entry_recs, members): Read = redis::pipe()
            .cmd("TIME")
            .cmd("XRANGE")
            .arg(k.journal())
            .arg(from)
            .arg("+")
            .cmd("HMGET")
            .arg(k.state())
            .arg(&["stock", "seq", "inflight", "stale", "wl_order"][..])
            .cmd("HGETALL")
            .arg(k.users())
            .cmd("HGETALL")
            .arg(k.holds())
            .cmd("ZRANGE")
            .arg(k.expiry())
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .cmd("ZRANGE")
            .arg(k.waitlist())
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .cmd("HGETALL")
            .arg(k.waitlist_entries())
            .cmd("HGETALL")
            .arg(k.waitlist_users())
            .query_async(&mut self.con)
            .await
            .map_err(|e| e.to_string())?;
        Ok(Obs {
            time: ms_of(t),
            entries: stream_fields(raw),
            head,
            users,
            holds,
            expiry,
            line,
            entry_recs,
            members,
        })
    }

    /// Reads Redis after a script ran, then applies `model` at the script's `now`: the time
    /// a journal record of the step carries, else `hint` (a hold's expiry less its time), else
    /// the clock before the step (a script that wrote no time decided nothing on it).
    pub(super) async fn observed<R>(
        &mut self,
        hint: Option<i64>,
        model: impl FnOnce(&mut World, i64) -> R,
    ) -> Result<(R, Obs), String> {
        let obs = self.observe().await?;
        let written = (obs.entries.iter())
            .flat_map(|(_, f)| f.iter())
            .find(|(k, _)| k == "s" || k == "w")
            .map(|(_, v)| v.split('|').nth(3).and_then(|ms| ms.parse::<i64>().ok()));
        let now = match written {
            Some(Some(ms)) => ms,
            Some(None) => return Err(format!("a journal record without a time: {obs:?}")),
            None => hint.unwrap_or(self.clock),
        };
        if now < self.clock || now > obs.time {
            return Err(format!(
                "the script's clock {now} is outside Redis's [{}, {}]",
                self.clock, obs.time
            ));
        }
        self.log.push(format!("  at {now}"));
        Ok((model(&mut self.world, now), obs))
    }

    /// The step's journal entries and the whole state are the model's; the ledger balances.
    pub(super) fn check(&mut self, obs: Obs) -> Result<(), String> {
        let fresh = self.world.journal.iter().filter(|e| e.id.is_none()).count();
        let start = self.world.journal.len() - fresh;
        if obs.entries.len() != fresh {
            let want: Vec<_> = self
                .world
                .journal
                .range(start..)
                .map(|e| &e.fields)
                .collect();
            return Err(format!(
                "journal: redis appended {:?}, model {want:?}",
                obs.entries
            ));
        }
        for (i, (id, fields)) in obs.entries.iter().enumerate() {
            let want = &mut self.world.journal[start + i];
            same("journal entry", fields, &want.fields)?;
            want.id = Some(id.clone());
            for (k, v) in fields {
                let what = match k.as_str() {
                    "k" => "a call's winners".to_string(),
                    "c" if !fields.iter().any(|f| f.0 == "k") => "an offer".to_string(),
                    "s" | "w" if fields.len() == 1 => {
                        format!("{k} {} alone", v.split('|').nth(1).unwrap_or("?"))
                    }
                    "s" | "w" => format!("{k} {}", v.split('|').nth(1).unwrap_or("?")),
                    _ => continue,
                };
                self.count(format!("journal {what}"));
            }
        }
        if let Some((id, _)) = obs.entries.last() {
            self.last_entry = Some(id.clone());
        }
        self.steps += 1;
        self.check_state(&obs)?;
        self.clock = obs.time;
        let fresh: Vec<_> = self.world.fresh_wins.drain(..).collect();
        for id in fresh {
            if self.rng.random_ratio(1, PARK_ONE_IN) {
                self.world.won.get_mut(&id).expect("a win").parked = true;
                self.parked.push(id);
            }
        }
        Ok(())
    }

    fn check_state(&mut self, obs: &Obs) -> Result<(), String> {
        let w = &self.world;
        let head = &obs.head;
        if w.lost {
            same("lost state", &head.0, &None)?;
        } else {
            same("stock", &head.0, &Some(w.stock))?;
            same("seq", &head.1, &Some(w.seq))?;
            same("inflight", &head.2, &Some(w.inflight))?;
            same("stale", &head.3.is_some(), &w.stale)?;
            same("wl_order", &head.4.unwrap_or(0), &w.wl_order)?;
        }
        same("users", &obs.users, &w.users)?;
        let holds: BTreeMap<String, String> = (w.holds.iter())
            .map(|(id, h)| (id.to_string(), h.pack()))
            .collect();
        same("holds", &obs.holds, &holds)?;
        let expiry: Vec<(String, i64)> = (w.expiry().into_iter())
            .map(|(id, x)| (id.to_string(), x))
            .collect();
        same("expiry", &obs.expiry, &expiry)?;
        let line: Vec<(String, i64)> = (w.line.iter())
            .map(|(order, id)| (id.to_string(), *order))
            .collect();
        same("line", &obs.line, &line)?;
        let entries: BTreeMap<String, String> = (w.entries.iter())
            .map(|(id, e)| (id.to_string(), e.pack()))
            .collect();
        same("entries", &obs.entry_recs, &entries)?;
        let members: BTreeMap<String, String> = (w.wl_users.iter())
            .map(|(u, id)| (u.clone(), id.to_string()))
            .collect();
        same("wl:users", &obs.members, &members)?;
        if obs.users.values().any(|n| *n > w.limit) {
            return Err(format!(
                "a user holds more than {}: {:?}",
                w.limit, obs.users
            ));
        }
        if w.stock < 0 {
            return Err(format!("stock below 0: {}", w.stock));
        }
        if self.steps % BALANCE_EVERY == 0 && w.stock + w.live_units() != w.total {
            return Err(format!(
                "ledger out of balance: {} + {} != {}",
                w.stock,
                w.live_units(),
                w.total
            ));
        }
        Ok(())
    }
}

impl std::fmt::Debug for Obs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "at {}: {:?}", self.time, self.entries)
    }
}

/// Each entry's id and fields, as XRANGE returns them.
pub fn stream_fields(reply: Value) -> Vec<(String, Vec<(String, String)>)> {
    let text = |v: &Value| match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        other => format!("{other:?}"),
    };
    let Value::Array(entries) = reply else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in entries {
        let Value::Array(parts) = e else { continue };
        let [id, Value::Array(fields)] = parts.as_slice() else {
            continue;
        };
        let pairs = fields
            .chunks(2)
            .map(|kv| (text(&kv[0]), kv.get(1).map(text).unwrap_or_default()))
            .collect();
        out.push((text(id), pairs));
    }
    out
}
