//! The reference model of one SKU's Redis state, as the scripts must keep it: stock, the
//! state sequence, per-user counts, idempotency records, call records and fences, journal
//! entries (one per call that had winners) not yet acknowledged.

use std::collections::{BTreeMap, HashMap, HashSet};

use dropgate::scripts::{ClaimInput, Decision};
use uuid::Uuid;

#[derive(Debug, Clone)]
pub struct Won {
    pub user: String,
    pub quantity: i64,
    pub key: Option<String>,
    pub remaining: i64,
    pub seq: i64,
    pub compensated: bool,
}

#[derive(Debug, Default)]
pub struct World {
    pub total: i64,
    pub limit: i64,
    pub stock: i64,
    pub seq: i64,
    /// The highest sequence "PostgreSQL" holds (the writer's acknowledged winners, restocks).
    pub mark: i64,
    pub inflight: i64,
    pub stale: bool,
    pub lost: bool,
    pub users: BTreeMap<String, i64>,
    /// (user, key) -> the claim that won under it.
    pub idem: HashMap<(String, String), Uuid>,
    /// Calls a resolver fenced before they ran.
    pub fenced: HashSet<Uuid>,
    /// Calls that ran and had winners: their record answers read-backs and refuses resends.
    pub recorded: HashSet<Uuid>,
    pub won: HashMap<Uuid, Won>,
    /// Journal entries in order, each the winners of one call, not yet acknowledged.
    pub journal: Vec<Vec<Uuid>>,
}

impl World {
    pub fn new(total: i64, limit: i64) -> Self {
        World {
            total,
            limit,
            stock: total,
            ..World::default()
        }
    }

    /// What claim.lua must answer for the call `call` of `claims` with `floor`, applying it to
    /// the model.
    pub fn claim(
        &mut self,
        call: Uuid,
        claims: &[ClaimInput],
        floor: i64,
    ) -> Result<Vec<Decision>, &'static str> {
        if self.fenced.contains(&call) || self.recorded.contains(&call) {
            return Ok(vec![Decision::Fenced; claims.len()]);
        }
        if self.lost {
            return Err("lost");
        }
        if self.stale {
            return Err("stale");
        }
        if self.seq < floor {
            self.stale = true;
            return Err("stale");
        }
        let mut out = Vec::with_capacity(claims.len());
        let mut entry = Vec::new();
        for (i, c) in claims.iter().enumerate() {
            let id = dropgate::ids::claim_in(&call, i);
            let q = i64::from(c.quantity);
            let idem = c
                .idempotency_key
                .as_ref()
                .map(|k| (c.user.clone(), k.clone()));
            if let Some(prior) = idem.as_ref().and_then(|k| self.idem.get(k)) {
                let w = &self.won[prior];
                out.push(if w.quantity == q {
                    Decision::Replay {
                        claim_id: *prior,
                        quantity: c.quantity,
                        remaining: w.remaining,
                        created_ms: 0,
                        expires_ms: None,
                    }
                } else {
                    Decision::KeyReused
                });
                continue;
            }
            let held = self.users.get(&c.user).copied().unwrap_or(0);
            if held + q > self.limit {
                out.push(Decision::LimitReached { held });
            } else if q > self.stock {
                out.push(Decision::SoldOut {
                    remaining: self.stock,
                });
            } else {
                self.stock -= q;
                self.seq += 1;
                self.inflight += q;
                *self.users.entry(c.user.clone()).or_default() += q;
                if let Some(k) = idem {
                    self.idem.insert(k, id);
                }
                self.won.insert(
                    id,
                    Won {
                        user: c.user.clone(),
                        quantity: q,
                        key: c.idempotency_key.clone(),
                        remaining: self.stock,
                        seq: self.seq,
                        compensated: false,
                    },
                );
                entry.push(id);
                out.push(Decision::Won {
                    remaining: self.stock,
                    expires_ms: None,
                });
            }
        }
        if !entry.is_empty() {
            self.journal.push(entry);
            self.recorded.insert(call);
        }
        Ok(out)
    }

    /// resolve_claim.lua: the remaining stock after a win, or not won; a call that did not
    /// run is fenced.
    pub fn resolve(&mut self, id: Uuid) -> Option<i64> {
        let call = dropgate::ids::call_of(&id);
        match self.won.get(&id) {
            Some(w) => Some(w.remaining),
            None => {
                if !self.recorded.contains(&call) {
                    self.fenced.insert(call);
                }
                None
            }
        }
    }

    /// restock.lua "apply" of a new operation: Some(remaining) when applied.
    pub fn restock(&mut self, delta: i64) -> Result<Option<i64>, &'static str> {
        if self.lost {
            return Err("lost");
        }
        if self.stale {
            return Err("stale");
        }
        if self.seq < self.mark {
            self.stale = true;
            return Err("stale");
        }
        if self.stock + delta < 0 {
            return Ok(None);
        }
        self.stock += delta;
        self.total += delta;
        self.seq += 1;
        self.mark = self.mark.max(self.seq);
        Ok(Some(self.stock))
    }

    /// compensate.lua "give" by the latest fencer: whether units came back.
    pub fn compensate(&mut self, id: Uuid) -> Result<bool, &'static str> {
        let Some(w) = self.won.get(&id).cloned() else {
            return Ok(false);
        };
        if w.compensated {
            return Ok(false);
        }
        if self.lost || self.stale {
            return Err("closed");
        }
        self.stock += w.quantity;
        self.seq += 1;
        let left = self.users.get(&w.user).copied().unwrap_or(0) - w.quantity;
        if left <= 0 {
            self.users.remove(&w.user);
        } else {
            self.users.insert(w.user.clone(), left);
        }
        if let Some(k) = &w.key {
            if self.idem.get(&(w.user.clone(), k.clone())) == Some(&id) {
                self.idem.remove(&(w.user.clone(), k.clone()));
            }
        }
        self.won.get_mut(&id).expect("just read").compensated = true;
        Ok(true)
    }

    /// The writer acknowledged the oldest `n` journal entries.
    pub fn ack(&mut self, n: usize) -> Vec<Uuid> {
        let acked: Vec<Uuid> = self.journal.drain(..n).flatten().collect();
        for id in &acked {
            let w = &self.won[id];
            if !self.lost {
                self.inflight -= w.quantity;
            }
            self.mark = self.mark.max(w.seq);
        }
        acked
    }

    /// Units of claims that hold units (won and not compensated).
    pub fn live_units(&self) -> i64 {
        self.won
            .values()
            .filter(|w| !w.compensated)
            .map(|w| w.quantity)
            .sum()
    }

    /// Per-user units of live claims (what a restore rebuilds).
    pub fn live_users(&self) -> BTreeMap<String, i64> {
        let mut m = BTreeMap::new();
        for w in self.won.values().filter(|w| !w.compensated) {
            *m.entry(w.user.clone()).or_default() += w.quantity;
        }
        m
    }
}
