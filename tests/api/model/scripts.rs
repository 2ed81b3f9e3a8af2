//! The scripts driven directly on a real Redis against the reference model: a seeded random
//! sequence of claims (with and without keys, retries, quantities), read-backs and fences,
//! restocks, compensations, writer acknowledgements (dropping hold and entry records as the
//! writer does), rollbacks and losses of the state, restores, and on the SKUs with holds the
//! lifecycle: confirms and cancels, expiries, waitlist joins and leaves, and the offers every
//! returned unit makes to the line's head. Every answer must be the model's, every journal
//! entry the model's, field for field, and the whole state must match it after every step.
//!
//! Redis decides expiries on its own clock (TIME), which the model cannot set: holds are
//! given short `hold_ms`/`offer_ms`, and the model takes a script's `now` from what the
//! script wrote (a journal record's time, a hold's expiry), checked to lie between Redis's
//! clock read before the script and after it. A script that wrote no time made no decision
//! that depended on it past the earlier reading, which the model then uses.
//!
//! `MODEL_SEED` replays a failure (the sequence of operations; holds' timing follows the
//! clock); `MODEL_STEPS` sets the steps (spread over [`WORLDS`] SKUs run concurrently, one
//! connection each; the odd worlds hold their claims).

use std::collections::BTreeMap;

use dropgate::keys::SkuKeys;
use dropgate::scripts::{self, ClaimInput, Decision, RestockMode, Restocked};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redis::aio::ConnectionManager;
use uuid::Uuid;

use super::world::{World, CLAIM_NOW};
use patient::patient_sku;

mod check;
mod ledger;
mod life;
mod patient;

use check::Obs;

const WORLDS: u64 = 32;
/// Buyers of a step: six of a line of buyers that moves on by one every [`NEW_BUYER_EVERY`]
/// steps, so a SKU whose units were all bought keeps meeting buyers below the limit (some
/// ids hold `|`, the records' separator).
const BUYERS: u64 = 6;
const NEW_BUYER_EVERY: u64 = 25;
/// Hold and offer times of the worlds with holds: from one that outlives many steps to one
/// that lapses before the next.
const HOLD_MS: &[i64] = &[25, 120, 500, 2500];
/// The offer time of the worlds without holds (an offer always leaves time to take it).
const OFFER_MS: i64 = 300_000;

/// Steps in CI: every step reads the whole state back (holds, the line, the journal), about
/// 1.3 k steps/s over the worlds on this 2-core machine, so CI runs two minutes of it; the soak
/// (`tests/soak.sh`) runs millions.
const DEFAULT_STEPS: u64 = 150_000;

pub fn seed_and_steps() -> (u64, u64) {
    let seed = std::env::var("MODEL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    let steps = std::env::var("MODEL_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_STEPS);
    (seed, steps)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scripts_agree_with_the_model_over_seeded_steps() {
    let _heavy = crate::helpers::heavy().await;
    let (seed, steps) = seed_and_steps();
    eprintln!("script model: MODEL_SEED={seed} MODEL_STEPS={steps}");
    let started = std::time::Instant::now();
    let mut tasks = Vec::new();
    for w in 0..WORLDS {
        let n = steps / WORLDS + u64::from(w < steps % WORLDS);
        tasks.push(tokio::spawn(run_world(seed, w, n)));
    }
    let mut seen: BTreeMap<String, u64> = BTreeMap::new();
    for t in tasks {
        match t.await.unwrap() {
            Ok(counts) => {
                for (k, n) in counts {
                    *seen.entry(k).or_default() += n;
                }
            }
            Err(e) => panic!("model mismatch (replay with MODEL_SEED={seed}): {e}"),
        }
    }
    let seen: Vec<String> = seen.iter().map(|(k, n)| format!("{k}: {n}")).collect();
    eprintln!("script model: {}", seen.join(", "));
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
    /// Claims PostgreSQL refuses (parked), not yet compensated.
    parked: Vec<Uuid>,
    /// The last claims compensated (a second compensation changes nothing).
    compensated: Vec<Uuid>,
    /// Redis's clock (ms) at the end of the last step: no script of this step ran before it.
    clock: i64,
    /// The last journal entry seen.
    last_entry: Option<String>,
    /// Steps checked.
    steps: u64,
    /// Answers and journal records seen, by kind (the run's summary).
    counts: BTreeMap<String, u64>,
    log: Vec<String>,
}

async fn run_world(seed: u64, w: u64, steps: u64) -> Result<BTreeMap<String, u64>, String> {
    let mut rng = StdRng::seed_from_u64(seed ^ (w.wrapping_mul(0x9E37_79B9_7F4A_7C15)));
    let (mut con, keys) = patient_sku("m").await;
    let limit = rng.random_range(1..4);
    // A SKU with holds has fewer units than its buyers may hold at once, so it sells out and
    // its line forms; units keep coming back (cancels, expiries) to be offered.
    let (total, hold_ms, offer_ms) = if w % 2 == 1 {
        (
            rng.random_range(0..=limit * 4),
            HOLD_MS[rng.random_range(0..HOLD_MS.len())],
            HOLD_MS[rng.random_range(0..HOLD_MS.len())],
        )
    } else {
        (rng.random_range(0..40), 0, OFFER_MS)
    };
    let terms = scripts::Terms {
        per_user_limit: limit as i32,
        hold_ms,
        offer_ms,
        opens_ms: None,
        closes_ms: None,
    };
    scripts::declare_sku(&mut con, &keys, true, total, &terms, &Uuid::nil())
        .await
        .map_err(|e| e.to_string())?;
    let clock = check::redis_ms(&mut con).await?;
    let mut d = Driver {
        rng,
        con,
        keys,
        world: World::new(total, limit, hold_ms, offer_ms),
        fenced_fresh: Vec::new(),
        sent: Vec::new(),
        parked: Vec::new(),
        compensated: Vec::new(),
        clock,
        last_entry: None,
        steps: 0,
        counts: BTreeMap::new(),
        log: vec![format!(
            "world {w}: total {total} limit {limit} hold_ms {hold_ms} offer_ms {offer_ms}"
        )],
    };
    for step in 0..steps {
        if let Err(e) = d.step().await {
            let tail = d.log[d.log.len().saturating_sub(60)..].join("\n  ");
            return Err(format!("world {w} step {step}: {e}\n  {tail}"));
        }
        if d.log.len() > 64 {
            d.log.drain(1..33);
        }
    }
    Ok(d.counts)
}

impl Driver {
    async fn step(&mut self) -> Result<(), String> {
        // A state lost or found stale is restored soon: a few steps see it fail closed.
        if (self.world.lost || self.world.stale) && self.rng.random_ratio(1, 4) {
            let obs = self.restore().await?;
            return self.check(obs);
        }
        let r = self.rng.random_range(0..100);
        let obs = if self.world.hold_ms > 0 {
            match r {
                0..=27 => self.claim().await?,
                28..=30 => self.resolve().await?,
                31..=36 => self.restock().await?,
                37..=48 => self.ack().await?,
                49..=52 => self.compensate().await?,
                53 => self.rewind().await?,
                54 => self.lose().await?,
                55..=66 => self.decide(true).await?,
                67..=74 => self.decide(false).await?,
                75..=84 => self.expire().await?,
                85..=94 => self.join().await?,
                _ => self.leave().await?,
            }
        } else {
            match r {
                0..=49 => self.claim().await?,
                50..=57 => self.resolve().await?,
                58..=65 => self.restock().await?,
                66..=79 => self.ack().await?,
                80..=85 => self.compensate().await?,
                86..=88 => self.rewind().await?,
                89..=90 => self.lose().await?,
                91..=96 => self.join().await?,
                97 => self.leave().await?,
                98 => self.decide(true).await?,
                _ => self.decide(false).await?,
            }
        };
        self.check(obs)
    }

    fn count(&mut self, what: String) {
        *self.counts.entry(what).or_default() += 1;
    }

    fn user(&mut self) -> String {
        let i = self.steps / NEW_BUYER_EVERY + self.rng.random_range(0..BUYERS);
        if i % 3 == 0 {
            format!("c|{i}")
        } else {
            format!("u{i}")
        }
    }

    async fn claim(&mut self) -> Result<Obs, String> {
        let n = self.rng.random_range(1..=6);
        let inputs: Vec<ClaimInput> = (0..n)
            .map(|_| {
                let user = self.user();
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
        let floor = self.world.mark;
        self.log
            .push(format!("claim {call} {inputs:?} floor {floor}"));
        let got = scripts::claim(&mut self.con, &self.keys, &call, &inputs, CLAIM_NOW, floor).await;
        let got = match got {
            Ok(ds) => Ok(ds),
            Err(dropgate::error::StoreError::SkuLost) => Err("lost"),
            Err(dropgate::error::StoreError::Stale) => Err("stale"),
            Err(e) => return Err(format!("claim failed: {e}")),
        };
        // A held winner's expiry tells the script's clock.
        let hold_ms = self.world.hold_ms;
        let hint = got.as_ref().ok().and_then(|ds| {
            ds.iter().find_map(|d| match d {
                Decision::Won {
                    expires_ms: Some(x),
                    ..
                } => Some(x - hold_ms),
                _ => None,
            })
        });
        let (want, obs) = self
            .observed(hint, |w, now| w.claim(call, &inputs, floor, now))
            .await?;
        for d in got.iter().flatten() {
            self.count(format!("claim {}", decision_kind(d)));
        }
        same("claim", &got, &want)?;
        Ok(obs)
    }

    async fn resolve(&mut self) -> Result<Obs, String> {
        let id = if !self.world.won_ids.is_empty() && self.rng.random_bool(0.4) {
            self.world.won_ids[self.rng.random_range(0..self.world.won_ids.len())]
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
        let (want, obs) = self.observed(None, |w, _| vec![w.resolve(id)]).await?;
        same("resolve", &got, &want)?;
        Ok(obs)
    }

    async fn restock(&mut self) -> Result<Obs, String> {
        // A SKU with holds mostly brings its stock to a few units (confirmed units are sold
        // for good); now and then a delta that would take it below 0.
        let stock = self.world.stock;
        let delta = match self.world.hold_ms {
            0 => self.rng.random_range(-(stock + 2)..=5),
            _ if self.rng.random_ratio(1, 5) => self.rng.random_range(-(stock + 2)..=2),
            _ => self.rng.random_range(0..=2 * self.world.limit) - stock,
        };
        let op = Uuid::now_v7();
        let fence_first = self.rng.random_bool(0.2);
        self.log
            .push(format!("restock {delta} fence_first {fence_first}"));
        let (k, floor) = (&self.keys, self.world.mark);
        if fence_first {
            let r = scripts::restock(&mut self.con, k, &op, delta, RestockMode::Resolve, 0, 0)
                .await
                .map_err(|e| e.to_string())?;
            same("restock resolve", &r, &Restocked::NotApplied)?;
        }
        let got =
            scripts::restock(&mut self.con, k, &op, delta, RestockMode::Apply, 0, floor).await;
        let got = match got {
            Ok(Restocked::Applied { remaining, .. }) => Ok(Some(remaining)),
            Ok(Restocked::Refused) => Ok(None),
            Ok(Restocked::NotApplied) if fence_first => return self.idle().await,
            Ok(other) => return Err(format!("restock answered {other:?}")),
            Err(dropgate::error::StoreError::SkuLost) => Err("lost"),
            Err(dropgate::error::StoreError::Stale) => Err("stale"),
            Err(e) => return Err(format!("restock failed: {e}")),
        };
        if fence_first {
            return Err(format!("a fenced restock applied: {got:?}"));
        }
        let (want, obs) = self.observed(None, |w, now| w.restock(delta, now)).await?;
        same("restock", &got, &want)?;
        Ok(obs)
    }

    /// Redis comes back with an older state: the sequence behind the ledger's mark.
    async fn rewind(&mut self) -> Result<Obs, String> {
        if self.world.lost || self.world.mark == 0 {
            return self.idle().await;
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
        self.observed(None, |w, _| w.seq = to).await.map(|r| r.1)
    }

    async fn lose(&mut self) -> Result<Obs, String> {
        self.log.push("lose the state".into());
        let _: () = redis::cmd("DEL")
            .arg(self.keys.state())
            .query_async(&mut self.con)
            .await
            .map_err(|e| e.to_string())?;
        self.observed(None, |w, _| w.lost = true).await.map(|r| r.1)
    }

    /// Observes a step that moved nothing the model does not know.
    async fn idle(&mut self) -> Result<Obs, String> {
        self.observed(None, |_, _| ()).await.map(|r| r.1)
    }
}

fn decision_kind(d: &Decision) -> &'static str {
    match d {
        Decision::Won { .. } => "won",
        Decision::Replay { .. } => "replay",
        Decision::SoldOut { .. } => "sold_out",
        Decision::LimitReached { .. } => "limit_reached",
        Decision::KeyReused => "key_reused",
        Decision::Fenced => "fenced",
        _ => "other",
    }
}

fn same<T: PartialEq + std::fmt::Debug>(what: &str, got: &T, want: &T) -> Result<(), String> {
    if got == want {
        Ok(())
    } else {
        Err(format!("{what}: redis {got:?}, model {want:?}"))
    }
}
