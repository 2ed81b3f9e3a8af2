//! The reference model of one SKU's Redis state, as the scripts must keep it: stock, the
//! state sequence, per-user counts, idempotency records, call records and fences, holds and
//! their expiries, the waitlist (line, entries, members), and the journal entries not yet
//! acknowledged, each with the fields the script must have written. The lifecycle (holds,
//! the waitlist, where returned units go) is in `world/life.rs`, acknowledgements and
//! restores in `world/ledger.rs`.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};

use dropgate::scripts::{ClaimInput, Decision};
use dropgate::status::{ClaimStatus, EntryStatus};
use uuid::Uuid;

mod ledger;
mod life;

/// The `now` a driver passes to claim.lua (its journal entries' `t` and records' creation).
pub const CLAIM_NOW: i64 = 1;

#[derive(Debug, Clone)]
pub struct Won {
    pub user: String,
    pub quantity: i64,
    pub key: Option<String>,
    pub remaining: i64,
    pub seq: i64,
    /// The claim's status as the ledger has it once the journal is written.
    pub status: ClaimStatus,
    /// A hold's expiry (a held claim or an offer).
    pub expires: Option<i64>,
    /// A waitlist offer (its id is its entry's).
    pub offer: bool,
    /// PostgreSQL refuses its row: it is parked (and may be compensated), never in `issuances`.
    pub parked: bool,
    /// Its compensation marker says `compensated`.
    pub compensated: bool,
}

impl Won {
    /// Holds units: not given back by a cancel, expiry or compensation.
    pub fn live(&self) -> bool {
        !self.compensated && !self.status.gave_back()
    }
}

/// A hold record (`pack_hold` in lua/lib/lifecycle.lua).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    pub status: ClaimStatus,
    pub qty: i64,
    pub expires: i64,
    pub offer: bool,
    pub user: String,
}

impl Hold {
    pub fn pack(&self) -> String {
        format!(
            "{}|{}|{}|{}|{}|{}",
            self.status,
            self.qty,
            self.expires,
            u8::from(self.offer),
            self.user.len(),
            self.user
        )
    }
}

/// A waitlist entry record (`pack_entry`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub status: EntryStatus,
    pub order: i64,
    pub ms: i64,
    pub user: String,
}

impl Entry {
    pub fn pack(&self) -> String {
        format!(
            "{}|{}|{}|{}|{}",
            self.status,
            self.order,
            self.ms,
            self.user.len(),
            self.user
        )
    }
}

/// One journal entry: its fields as the script must have written them, and what the writer
/// makes of it.
#[derive(Debug, Clone)]
pub struct JEntry {
    /// The stream id, once the driver has seen the entry.
    pub id: Option<String>,
    pub fields: Vec<(String, String)>,
    /// What the writer acknowledges it with: its winners' units, less a cancel's or expiry's.
    pub units: i64,
    /// The highest sequence it carries (the writer's mark once written).
    pub seq: i64,
    pub wins: Vec<Uuid>,
    pub changes: Vec<(Uuid, ClaimStatus)>,
    pub waits: Vec<(Uuid, EntryStatus)>,
}

#[derive(Debug, Default)]
pub struct World {
    pub total: i64,
    pub limit: i64,
    pub hold_ms: i64,
    pub offer_ms: i64,
    pub stock: i64,
    pub seq: i64,
    /// The highest sequence "PostgreSQL" holds (the writer's acknowledged entries, restocks).
    pub mark: i64,
    pub inflight: i64,
    pub stale: bool,
    pub lost: bool,
    /// The state's `wl_order` (the last join order given).
    pub wl_order: i64,
    pub users: BTreeMap<String, i64>,
    /// (user, key) -> the claim that won under it.
    pub idem: HashMap<(String, String), Uuid>,
    /// Calls a resolver fenced before they ran.
    pub fenced: HashSet<Uuid>,
    /// Calls that ran and had winners: their record answers read-backs and refuses resends.
    pub recorded: HashSet<Uuid>,
    pub won: BTreeMap<Uuid, Won>,
    /// Claims (offers too) in the order they won, to pick from.
    pub won_ids: Vec<Uuid>,
    /// Holds (offers too) in the order they were made, to pick from.
    pub hold_ids: Vec<Uuid>,
    /// Wins since the driver last looked (it decides which PostgreSQL will refuse).
    pub fresh_wins: Vec<Uuid>,
    /// Journal entries in order, not yet acknowledged.
    pub journal: VecDeque<JEntry>,
    /// Redis's hold records.
    pub holds: BTreeMap<Uuid, Hold>,
    /// The line: (join order, entry id), as ZRANGE orders it.
    pub line: BTreeSet<(i64, Uuid)>,
    /// Redis's entry records.
    pub entries: BTreeMap<Uuid, Entry>,
    /// Every entry as the ledger has it once the journal is written.
    pub ledger_entries: BTreeMap<Uuid, Entry>,
    /// Entries in the order they joined, to pick from.
    pub entry_ids: Vec<Uuid>,
    /// wl:users: user -> that user's current entry.
    pub wl_users: BTreeMap<String, Uuid>,
    /// The expiry worker's lease owner.
    pub lease: Option<String>,
}

impl World {
    pub fn new(total: i64, limit: i64, hold_ms: i64, offer_ms: i64) -> Self {
        World {
            total,
            limit,
            hold_ms,
            offer_ms,
            stock: total,
            ..World::default()
        }
    }

    /// lib/fresh.lua's `state_unfit` against `floor` (marks the state stale when behind it).
    pub fn unfit(&mut self, floor: i64) -> Option<&'static str> {
        if self.lost {
            Some("lost")
        } else if self.stale {
            Some("stale")
        } else if self.seq < floor {
            self.stale = true;
            Some("stale")
        } else {
            None
        }
    }

    /// What claim.lua must answer for the call `call` of `claims` with `floor`, applying it to
    /// the model; `now` is Redis's clock when it ran.
    pub fn claim(
        &mut self,
        call: Uuid,
        claims: &[ClaimInput],
        floor: i64,
        now: i64,
    ) -> Result<Vec<Decision>, &'static str> {
        if self.fenced.contains(&call) || self.recorded.contains(&call) {
            return Ok(vec![Decision::Fenced; claims.len()]);
        }
        if let Some(why) = self.unfit(floor) {
            return Err(why);
        }
        let expires = (self.hold_ms > 0).then_some(now + self.hold_ms);
        let mut out = Vec::with_capacity(claims.len());
        let mut fields = vec![
            ("k".to_string(), call.to_string()),
            ("t".to_string(), CLAIM_NOW.to_string()),
            ("q".to_string(), self.seq.to_string()),
            ("r".to_string(), self.stock.to_string()),
        ];
        if let Some(x) = expires {
            fields.push(("x".into(), x.to_string()));
        }
        let mut wins = Vec::new();
        let mut units = 0;
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
                        expires_ms: w.expires,
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
                if let Some(x) = expires {
                    self.holds.insert(
                        id,
                        Hold {
                            status: ClaimStatus::Held,
                            qty: q,
                            expires: x,
                            offer: false,
                            user: c.user.clone(),
                        },
                    );
                }
                self.add_won(
                    id,
                    Won {
                        user: c.user.clone(),
                        quantity: q,
                        key: c.idempotency_key.clone(),
                        remaining: self.stock,
                        seq: self.seq,
                        status: match expires {
                            Some(_) => ClaimStatus::Held,
                            None => ClaimStatus::Issued,
                        },
                        expires,
                        offer: false,
                        parked: false,
                        compensated: false,
                    },
                );
                let piece = format!("{i}|{q}|{}|{}", c.user.len(), c.user);
                let key = c.idempotency_key.as_deref().unwrap_or("");
                fields.push(("c".into(), format!("{piece}{key}")));
                wins.push(id);
                units += q;
                out.push(Decision::Won {
                    remaining: self.stock,
                    expires_ms: expires,
                });
            }
        }
        if !wins.is_empty() {
            self.push_entry(JEntry {
                id: None,
                fields,
                units,
                seq: self.seq,
                wins,
                changes: Vec::new(),
                waits: Vec::new(),
            });
            self.recorded.insert(call);
        }
        Ok(out)
    }

    pub fn add_won(&mut self, id: Uuid, w: Won) {
        let w_expires = w.expires.is_some();
        self.won.insert(id, w);
        self.won_ids.push(id);
        if w_expires {
            self.hold_ids.push(id);
        }
        self.fresh_wins.push(id);
    }

    pub fn push_entry(&mut self, e: JEntry) {
        self.journal.push_back(e);
    }

    /// resolve_claim.lua: the remaining stock after a win, or not won; a call that did not
    /// run is fenced. An offer is no call's claim: its "call" has no record.
    pub fn resolve(&mut self, id: Uuid) -> Option<i64> {
        let call = dropgate::ids::call_of(&id);
        match self.won.get(&id).filter(|w| !w.offer) {
            Some(w) => Some(w.remaining),
            None => {
                if !self.recorded.contains(&call) {
                    self.fenced.insert(call);
                }
                None
            }
        }
    }

    /// restock.lua "apply" of a new operation at Redis's `now`: Some(remaining) when applied.
    pub fn restock(&mut self, delta: i64, now: i64) -> Result<Option<i64>, &'static str> {
        if let Some(why) = self.unfit(self.mark) {
            return Err(why);
        }
        if self.stock + delta < 0 {
            return Ok(None);
        }
        self.seq += 1;
        if delta > 0 {
            self.give_back(delta, now);
        } else {
            self.stock += delta;
        }
        self.total += delta;
        self.mark = self.mark.max(self.seq);
        Ok(Some(self.stock))
    }

    /// Units of claims that hold units.
    pub fn live_units(&self) -> i64 {
        self.won
            .values()
            .filter(|w| w.live())
            .map(|w| w.quantity)
            .sum()
    }

    /// Per-user units of live claims (what a restore rebuilds).
    pub fn live_users(&self) -> BTreeMap<String, i64> {
        let mut m = BTreeMap::new();
        for w in self.won.values().filter(|w| w.live()) {
            *m.entry(w.user.clone()).or_default() += w.quantity;
        }
        m
    }

    /// Held holds in the order of the expiry set (expires_ms, then id).
    pub fn expiry(&self) -> Vec<(Uuid, i64)> {
        let mut v: Vec<(Uuid, i64)> = (self.holds.iter())
            .filter(|(_, h)| h.status == ClaimStatus::Held)
            .map(|(id, h)| (*id, h.expires))
            .collect();
        v.sort_by_key(|(id, x)| (*x, *id));
        v
    }
}
