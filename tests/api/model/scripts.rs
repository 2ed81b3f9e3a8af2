//! The scripts driven directly on a real Redis against the reference model: a seeded random
//! sequence of claims (with and without keys, retries, quantities), read-backs and fences,
//! restocks, compensations, writer acknowledgements, rollbacks and losses of the state, and
//! restores. Every answer must be the model's, and the state must match it after every step.
//!
//! `MODEL_SEED` replays a failure; `MODEL_STEPS` sets the steps (1,000,000 by default, spread
//! over [`WORLDS`] SKUs run concurrently on one multiplexed connection).

use dropgate::keys::SkuKeys;
use dropgate::scripts::{self, ClaimInput, Decision, RestockMode, Restocked, SCRIPTS};
use dropgate::writer::Winner;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redis::aio::ConnectionManager;
use redis::Value;
use uuid::Uuid;

use super::world::World;
use crate::helpers::script_sku;

const WORLDS: u64 = 32;
const USERS: &[&str] = &["ann", "bob", "cy|d", "dee", "eve", "fay"];

pub fn seed_and_steps() -> (u64, u64) {
    let seed = std::env::var("MODEL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    let steps = std::env::var("MODEL_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    (seed, steps)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scripts_agree_with_the_model_over_a_million_seeded_steps() {
    let _heavy = crate::helpers::heavy().await;
    let (seed, steps) = seed_and_steps();
    eprintln!("script model: MODEL_SEED={seed} MODEL_STEPS={steps}");
    let started = std::time::Instant::now();
    let mut tasks = Vec::new();
    for w in 0..WORLDS {
        let n = steps / WORLDS + u64::from(w < steps % WORLDS);
        tasks.push(tokio::spawn(run_world(seed, w, n)));
    }
    for t in tasks {
        if let Err(e) = t.await.unwrap() {
            panic!("model mismatch (replay with MODEL_SEED={seed}): {e}");
        }
    }
    eprintln!("script model: {steps} steps in {:?}", started.elapsed());
}

struct Driver {
    rng: StdRng,
    con: ConnectionManager,
    keys: SkuKeys,
    world: World,
    /// Calls fenced by a read-back before they were sent (a late call may still come).
    fenced_fresh: Vec<Uuid>,
    /// Calls sent, with their sizes (a resend, or a read-back of one of their claims).
    sent: Vec<(Uuid, usize)>,
    log: Vec<String>,
}

async fn run_world(seed: u64, w: u64, steps: u64) -> Result<(), String> {
    let mut rng = StdRng::seed_from_u64(seed ^ (w.wrapping_mul(0x9E37_79B9_7F4A_7C15)));
    let (mut con, keys) = script_sku("m").await;
    let total = rng.random_range(0..40);
    let limit = rng.random_range(1..4);
    scripts::declare_sku(
        &mut con,
        &keys,
        true,
        total,
        &scripts::Terms::limit(limit as i32),
        &Uuid::nil(),
    )
    .await
    .map_err(|e| e.to_string())?;
    let mut d = Driver {
        rng,
        con,
        keys,
        world: World::new(total, limit),
        fenced_fresh: Vec::new(),
        sent: Vec::new(),
        log: Vec::new(),
    };
    for step in 0..steps {
        if let Err(e) = d.step().await {
            let tail = d.log[d.log.len().saturating_sub(12)..].join("\n  ");
            return Err(format!("world {w} step {step}: {e}\n  {tail}"));
        }
        if d.log.len() > 64 {
            d.log.drain(..32);
        }
    }
    Ok(())
}

impl Driver {
    async fn step(&mut self) -> Result<(), String> {
        match self.rng.random_range(0..100) {
            0..=54 => self.claim().await?,
            55..=62 => self.resolve().await?,
            63..=70 => self.restock().await?,
            71..=84 => self.ack().await?,
            85..=91 => self.compensate().await?,
            92..=94 => self.rewind().await?,
            95..=96 => self.lose().await?,
            _ => self.restore().await?,
        }
        self.check().await
    }

    async fn claim(&mut self) -> Result<(), String> {
        let n = self.rng.random_range(1..=6);
        let inputs: Vec<ClaimInput> = (0..n)
            .map(|_| {
                let user = USERS[self.rng.random_range(0..USERS.len())].to_string();
                let key = (self.rng.random_bool(0.5))
                    .then(|| format!("k{}", self.rng.random_range(0..4)));
                ClaimInput {
                    user,
                    quantity: self.rng.random_range(1..=self.world.limit) as u32,
                    idempotency_key: key,
                }
            })
            .collect();
        // A late call a resolver fenced, a resend of a call that ran, or a fresh call.
        let call = if !self.fenced_fresh.is_empty() && self.rng.random_bool(0.1) {
            self.fenced_fresh.swap_remove(0)
        } else if !self.sent.is_empty() && self.rng.random_bool(0.05) {
            self.sent[self.rng.random_range(0..self.sent.len())].0
        } else {
            dropgate::ids::mint_call(0)
        };
        self.sent.push((call, inputs.len()));
        if self.sent.len() > 64 {
            self.sent.drain(..32);
        }
        self.log
            .push(format!("claim {call} {inputs:?} floor {}", self.world.mark));
        let got = scripts::claim(
            &mut self.con,
            &self.keys,
            &call,
            &inputs,
            1,
            self.world.mark,
        )
        .await;
        let want = self.world.claim(call, &inputs, self.world.mark);
        let got = match got {
            Ok(ds) => Ok(ds.into_iter().map(normal).collect::<Vec<_>>()),
            Err(dropgate::error::StoreError::SkuLost) => Err("lost"),
            Err(dropgate::error::StoreError::Stale) => Err("stale"),
            Err(e) => return Err(format!("claim failed: {e}")),
        };
        let want = want.map(|ds| ds.into_iter().map(normal).collect::<Vec<_>>());
        same("claim", &got, &want)
    }

    async fn resolve(&mut self) -> Result<(), String> {
        let won: Vec<Uuid> = self.world.won.keys().copied().collect();
        let id = if !won.is_empty() && self.rng.random_bool(0.4) {
            won[self.rng.random_range(0..won.len())]
        } else if !self.sent.is_empty() && self.rng.random_bool(0.5) {
            // Any claim of a call that was sent: won, lost, or a call that never ran.
            let (call, n) = self.sent[self.rng.random_range(0..self.sent.len())];
            dropgate::ids::claim_in(&call, self.rng.random_range(0..n))
        } else {
            let call = dropgate::ids::mint_call(0);
            self.fenced_fresh.push(call);
            dropgate::ids::claim_in(&call, self.rng.random_range(0..6))
        };
        self.log.push(format!("resolve {id}"));
        let got = scripts::resolve_claims(&mut self.con, &self.keys, &[id])
            .await
            .map_err(|e| e.to_string())?;
        same("resolve", &got, &vec![self.world.resolve(id)])
    }

    async fn restock(&mut self) -> Result<(), String> {
        let delta = self.rng.random_range(-(self.world.stock + 2)..=5);
        let op = Uuid::now_v7();
        let fence_first = self.rng.random_bool(0.2);
        self.log
            .push(format!("restock {delta} fence_first {fence_first}"));
        if fence_first {
            let r = scripts::restock(
                &mut self.con,
                &self.keys,
                &op,
                delta,
                RestockMode::Resolve,
                0,
                0,
            )
            .await
            .map_err(|e| e.to_string())?;
            same("restock resolve", &r, &Restocked::NotApplied)?;
        }
        let got = scripts::restock(
            &mut self.con,
            &self.keys,
            &op,
            delta,
            RestockMode::Apply,
            0,
            self.world.mark,
        )
        .await;
        let got = match got {
            Ok(Restocked::Applied { remaining, .. }) => Ok(Some(remaining)),
            Ok(Restocked::Refused) => Ok(None),
            Ok(Restocked::NotApplied) if fence_first => return Ok(()),
            Ok(other) => return Err(format!("restock answered {other:?}")),
            Err(dropgate::error::StoreError::SkuLost) => Err("lost"),
            Err(dropgate::error::StoreError::Stale) => Err("stale"),
            Err(e) => return Err(format!("restock failed: {e}")),
        };
        if fence_first {
            return Err(format!("a fenced restock applied: {got:?}"));
        }
        let want = self.world.restock(delta);
        same("restock", &got, &want)
    }

    async fn ack(&mut self) -> Result<(), String> {
        let n = self.rng.random_range(1..=8);
        let reply: Value = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg("writers")
            .arg("model")
            .arg("COUNT")
            .arg(n)
            .arg("STREAMS")
            .arg(self.keys.journal())
            .arg(">")
            .query_async(&mut self.con)
            .await
            .map_err(|e| e.to_string())?;
        let entries = stream_entries(reply);
        let want: Vec<Vec<Uuid>> = self
            .world
            .journal
            .iter()
            .take(entries.len())
            .cloned()
            .collect();
        self.log.push(format!("ack {} entries", entries.len()));
        let mut inv = SCRIPTS.ack_journal.prepare_invoke();
        inv.key(self.keys.state())
            .key(self.keys.journal())
            .key(self.keys.holds())
            .key(self.keys.waitlist_entries())
            .arg("writers")
            .arg(entries.len());
        for ((entry_id, recs), ids) in entries.iter().zip(&want) {
            same("winners of an entry", &recs.len(), &ids.len())?;
            let mut units = 0;
            for (w_got, id) in recs.iter().zip(ids) {
                let w = &self.world.won[id];
                let expected = (
                    *id,
                    w.quantity,
                    w.seq,
                    w.remaining,
                    w.user.clone(),
                    w.key.clone(),
                );
                let found = (
                    w_got.claim_id,
                    i64::from(w_got.quantity),
                    w_got.seq,
                    w_got.remaining_after.unwrap_or(-1),
                    w_got.user.clone(),
                    w_got.idempotency_key.clone(),
                );
                same("journal entry", &found, &expected)?;
                units += w_got.quantity;
            }
            inv.arg(entry_id).arg(units);
        }
        if entries.len() != want.len()
            || (entries.is_empty() && !self.world.journal.is_empty() && !self.world.lost)
        {
            return Err(format!(
                "journal held {} entries, model {}",
                entries.len(),
                self.world.journal.len()
            ));
        }
        if !entries.is_empty() {
            let _: i64 = inv
                .invoke_async(&mut self.con)
                .await
                .map_err(|e| e.to_string())?;
            self.world.ack(entries.len());
        }
        Ok(())
    }

    async fn compensate(&mut self) -> Result<(), String> {
        let won: Vec<Uuid> = self.world.won.keys().copied().collect();
        if won.is_empty() {
            return Ok(());
        }
        let id = won[self.rng.random_range(0..won.len())];
        let w = self.world.won[&id].clone();
        self.log.push(format!("compensate {id}"));
        let marker = self.keys.compensation(&id);
        let idem = w
            .key
            .as_ref()
            .map_or(marker.clone(), |k| self.keys.idempotency(&w.user, k));
        let call = |mode: &'static str| {
            let mut inv = SCRIPTS.compensate.prepare_invoke();
            for k in self.keys.lifecycle() {
                inv.key(k);
            }
            inv.key(&marker)
                .key(&idem)
                .arg(mode)
                .arg("owner")
                .arg(&w.user)
                .arg(w.quantity)
                .arg(id.to_string())
                .arg(30 * 24 * 3600);
            inv
        };
        let fenced: i64 = call("fence")
            .invoke_async(&mut self.con)
            .await
            .map_err(|e| e.to_string())?;
        let gave: i64 = call("give")
            .invoke_async(&mut self.con)
            .await
            .map_err(|e| e.to_string())?;
        let got = match gave {
            1 => Ok(true),
            0 => Ok(false),
            -1 => Err("closed"),
            other => return Err(format!("compensate answered {other}")),
        };
        same("compensate fence", &(fenced == 1), &!w.compensated)?;
        same("compensate", &got, &self.world.compensate(id))
    }

    /// Redis comes back with an older state: the sequence behind the ledger's mark.
    async fn rewind(&mut self) -> Result<(), String> {
        if self.world.lost || self.world.mark == 0 {
            return Ok(());
        }
        let to = self.world.mark - 1;
        self.log.push(format!("rewind seq to {to}"));
        let _: () = redis::cmd("HSET")
            .arg(self.keys.state())
            .arg("seq")
            .arg(to)
            .query_async(&mut self.con)
            .await
            .map_err(|e| e.to_string())?;
        self.world.seq = to;
        Ok(())
    }

    async fn lose(&mut self) -> Result<(), String> {
        self.log.push("lose the state".into());
        let _: () = redis::cmd("DEL")
            .arg(self.keys.state())
            .query_async(&mut self.con)
            .await
            .map_err(|e| e.to_string())?;
        self.world.lost = true;
        Ok(())
    }

    /// restore_sku.lua from the model's ledger, after the writer emptied the journal.
    async fn restore(&mut self) -> Result<(), String> {
        if !self.world.lost && !self.world.stale {
            return Ok(());
        }
        while !self.world.journal.is_empty() {
            self.ack().await?;
        }
        let _: () = redis::cmd("DEL")
            .arg(self.keys.state())
            .query_async(&mut self.con)
            .await
            .map_err(|e| e.to_string())?;
        let staged = self.keys.users_restore(&Uuid::new_v4());
        let mut pipe = redis::pipe();
        pipe.del(&staged).ignore();
        for (u, n) in self.world.live_users() {
            pipe.hset(&staged, u, n).ignore();
        }
        let _: () = pipe
            .query_async(&mut self.con)
            .await
            .map_err(|e| e.to_string())?;
        let stock = self.world.total - self.world.live_units();
        let seq = self.world.mark.max(self.world.seq) + 1;
        self.log.push(format!("restore stock {stock} seq {seq}"));
        let r: i64 = SCRIPTS
            .restore_sku
            .key(self.keys.state())
            .key(self.keys.users())
            .key(self.keys.journal())
            .key(staged)
            .arg(stock)
            .arg(self.world.limit)
            .arg(seq)
            .arg(Uuid::nil().to_string())
            .arg(0)
            // No holds, the default offer time, no window, an empty waitlist.
            .arg(0)
            .arg(300_000)
            .arg("")
            .arg("")
            .arg(0)
            .invoke_async(&mut self.con)
            .await
            .map_err(|e| e.to_string())?;
        same("restore", &r, &1)?;
        let w = &mut self.world;
        w.stock = stock;
        w.seq = seq;
        w.mark = seq;
        w.inflight = 0;
        w.users = w.live_users();
        w.lost = false;
        w.stale = false;
        Ok(())
    }

    /// The state matches the model, and the ledger balances: nothing oversold, no count over
    /// the limit.
    async fn check(&mut self) -> Result<(), String> {
        let (head, users): (StateHead, Vec<(String, i64)>) = redis::pipe()
            .cmd("HMGET")
            .arg(self.keys.state())
            .arg("stock")
            .arg("seq")
            .arg("inflight")
            .arg("stale")
            .cmd("HGETALL")
            .arg(self.keys.users())
            .query_async(&mut self.con)
            .await
            .map_err(|e| e.to_string())?;
        let w = &self.world;
        if w.lost {
            return same("lost state", &head.0, &None);
        }
        same("stock", &head.0, &Some(w.stock))?;
        same("seq", &head.1, &Some(w.seq))?;
        same("inflight", &head.2, &Some(w.inflight))?;
        same("stale", &head.3.is_some(), &w.stale)?;
        let users: std::collections::BTreeMap<String, i64> = users.into_iter().collect();
        same("users", &users, &w.users)?;
        if w.stock < 0 || w.stock + w.live_units() != w.total {
            return Err(format!(
                "ledger out of balance: {} + {} != {}",
                w.stock,
                w.live_units(),
                w.total
            ));
        }
        if users.values().any(|n| *n > w.limit) {
            return Err(format!("a user holds more than {}: {users:?}", w.limit));
        }
        Ok(())
    }
}

/// stock, seq, inflight, stale, as HMGET reads them.
type StateHead = (Option<i64>, Option<i64>, Option<i64>, Option<String>);

/// Replays carry the record's creation time, which the model does not track.
fn normal(d: Decision) -> Decision {
    match d {
        Decision::Replay {
            claim_id,
            quantity,
            remaining,
            ..
        } => Decision::Replay {
            claim_id,
            quantity,
            remaining,
            created_ms: 0,
            expires_ms: None,
        },
        other => other,
    }
}

fn same<T: PartialEq + std::fmt::Debug>(what: &str, got: &T, want: &T) -> Result<(), String> {
    if got == want {
        Ok(())
    } else {
        Err(format!("{what}: redis {got:?}, model {want:?}"))
    }
}

/// Each entry's id and its winners, as the writer reads them.
fn stream_entries(reply: Value) -> Vec<(String, Vec<Winner>)> {
    let mut out = Vec::new();
    let Value::Array(streams) = reply else {
        return out;
    };
    for s in streams {
        let Value::Array(mut parts) = s else { continue };
        let Some(Value::Array(entries)) = parts.pop() else {
            continue;
        };
        for e in entries {
            let id = match &e {
                Value::Array(parts) => match parts.first() {
                    Some(Value::BulkString(id)) => String::from_utf8_lossy(id).into_owned(),
                    _ => continue,
                },
                _ => continue,
            };
            let winners = dropgate::writer::winners_of("m", e).unwrap_or_default();
            out.push((id, winners));
        }
    }
    out
}
