//! The lifecycle's operations, each a script call as its caller in src/ makes it: confirm and
//! cancel (src/lifecycle/holds.rs), the expiry worker's call (src/lifecycle/expiry.rs), a
//! waitlist join and leave (src/lifecycle/waitlist.rs), a compensation
//! (src/reprocess/mod.rs).

use dropgate::keys::idempotency_field;
use dropgate::scripts::Floor;
use dropgate::scripts::SCRIPTS;
use rand::Rng;
use uuid::Uuid;

use super::check::Obs;
use super::{same, Driver};

/// The expiry worker's lease: longer than any run, so only a rival is ever refused.
const LEASE_MS: i64 = 3_600_000;
const OWNER: &str = "model";

impl Driver {
    /// The caller of a hold or waitlist operation on something `owner` has: mostly its owner,
    /// else the admin ("") or a stranger.
    fn caller(&mut self, owner: &str) -> String {
        match self.rng.random_range(0..10) {
            0 => String::new(),
            1 => "zed|".into(),
            _ => owner.to_string(),
        }
    }

    /// The index of one of the last `recent` of `len` mostly, else of any of them.
    fn pick_index(&mut self, len: usize, recent: usize) -> Option<usize> {
        if len == 0 {
            return None;
        }
        let from = if self.rng.random_bool(0.7) {
            len.saturating_sub(recent)
        } else {
            0
        };
        Some(self.rng.random_range(from..len))
    }

    /// One of the driver's lists `ids`, as [`Driver::pick_index`] chooses.
    fn pick(&mut self, ids: fn(&Driver) -> &Vec<Uuid>, recent: usize) -> Option<Uuid> {
        let i = self.pick_index(ids(self).len(), recent)?;
        Some(ids(self)[i])
    }

    /// Any of `ids`.
    fn pick_any(&mut self, ids: &[Uuid]) -> Option<Uuid> {
        let i = self.pick_index(ids.len(), ids.len())?;
        Some(ids[i])
    }

    fn owner_of(&mut self, id: Uuid) -> String {
        match (self.world.won.get(&id), self.world.ledger_entries.get(&id)) {
            (Some(w), _) => w.user.clone(),
            (None, Some(e)) => e.user.clone(),
            _ => self.user(),
        }
    }

    /// Confirm (else cancel) a recent claim or offer, any claim, a waitlist entry, or an id
    /// nobody has.
    pub(super) async fn decide(&mut self, confirm: bool) -> Result<Obs, String> {
        let held: Vec<Uuid> = self.world.expiry().into_iter().map(|(id, _)| id).collect();
        let records: Vec<Uuid> = self.world.holds.keys().copied().collect();
        let id = match self.rng.random_range(0..10) {
            0..=2 => self.pick_any(&held),
            3..=4 => self.pick_any(&records),
            5..=6 => None,
            7 => self.pick(|d| &d.world.won_ids, 12),
            8 => self.pick(|d| &d.world.entry_ids, 6),
            _ => Some(Uuid::now_v7()),
        };
        let id = (id.or_else(|| self.pick(|d| &d.world.hold_ids, 12))).unwrap_or_else(Uuid::now_v7);
        let owner = self.owner_of(id);
        let caller = self.caller(&owner);
        let floor = self.world.mark;
        let op = if confirm { "confirm" } else { "cancel" };
        self.log
            .push(format!("{op} {id} by {caller:?} floor {floor}"));
        let mut inv = SCRIPTS.decide_hold.prepare_invoke();
        for k in self.keys.lifecycle() {
            inv.key(k);
        }
        inv.arg(op)
            .arg(id.to_string())
            .arg(&caller)
            .arg(Floor::seq(floor));
        let got: (i64, String, i64) = inv
            .invoke_async(&mut self.con)
            .await
            .map_err(|e| e.to_string())?;
        let (want, obs) = self
            .observed(None, |w, now| w.decide(confirm, id, &caller, floor, now))
            .await?;
        self.count(format!("{op} {} {}", got.0, got.1));
        same(op, &got, &want)?;
        Ok(obs)
    }

    /// The expiry worker's call (now and then a rival worker's, refused by the lease).
    pub(super) async fn expire(&mut self) -> Result<Obs, String> {
        let owner = if self.rng.random_ratio(1, 12) {
            "rival"
        } else {
            OWNER
        };
        let max = self.rng.random_range(1..=4);
        let floor = self.world.mark;
        self.log
            .push(format!("expire by {owner} max {max} floor {floor}"));
        let mut inv = SCRIPTS.expire_holds.prepare_invoke();
        for k in self.keys.lifecycle() {
            inv.key(k);
        }
        inv.key(self.keys.expiry_lease())
            .arg(owner)
            .arg(LEASE_MS)
            .arg(max)
            .arg(Floor::seq(floor));
        let got: Vec<i64> = inv
            .invoke_async(&mut self.con)
            .await
            .map_err(|e| e.to_string())?;
        let (want, obs) = self
            .observed(None, |w, now| w.expire(owner, max, floor, now))
            .await?;
        self.count(format!("expire {}", got[0].min(1)));
        same("expire", &got, &want)?;
        Ok(obs)
    }

    /// A join by any buyer: a second join, a join while in stock or at the limit, included.
    pub(super) async fn join(&mut self) -> Result<Obs, String> {
        let user = self.user();
        let eid = Uuid::now_v7();
        let elsewhere = self.rng.random_ratio(1, 20);
        let floor = self.world.mark;
        self.log.push(format!(
            "join {eid} by {user} elsewhere {elsewhere} floor {floor}"
        ));
        let mut inv = SCRIPTS.join_waitlist.prepare_invoke();
        for k in self.keys.lifecycle() {
            inv.key(k);
        }
        inv.arg(eid.to_string())
            .arg(&user)
            .arg(if elsewhere { "1" } else { "0" })
            .arg("")
            .arg(Floor::seq(floor));
        let got: (i64, String, i64) = inv
            .invoke_async(&mut self.con)
            .await
            .map_err(|e| e.to_string())?;
        let (want, obs) = self
            .observed(None, |w, now| w.join(eid, &user, elsewhere, floor, now))
            .await?;
        self.count(format!("join {}", got.0));
        same("join", &got, &want)?;
        Ok(obs)
    }

    /// A waitlist entry (or an id nobody has) leaves.
    pub(super) async fn leave(&mut self) -> Result<Obs, String> {
        let live: Vec<Uuid> = self.world.entries.keys().copied().collect();
        let id = match self.rng.random_range(0..6) {
            0 => Some(Uuid::now_v7()),
            1..=3 => self.pick_any(&live),
            _ => None,
        };
        let id = (id.or_else(|| self.pick(|d| &d.world.entry_ids, 6))).unwrap_or_else(Uuid::now_v7);
        let owner = self.owner_of(id);
        let caller = self.caller(&owner);
        let floor = self.world.mark;
        self.log
            .push(format!("leave {id} by {caller:?} floor {floor}"));
        let mut inv = SCRIPTS.leave_waitlist.prepare_invoke();
        for k in self.keys.lifecycle() {
            inv.key(k);
        }
        inv.arg(id.to_string()).arg(&caller).arg(Floor::seq(floor));
        let got: (i64, String) = inv
            .invoke_async(&mut self.con)
            .await
            .map_err(|e| e.to_string())?;
        let (want, obs) = self
            .observed(None, |w, now| w.leave(id, &caller, floor, now))
            .await?;
        self.count(format!("leave {} {}", got.0, got.1));
        same("leave", &got, &want)?;
        Ok(obs)
    }

    /// The reprocessor gives a parked claim back: fence, then give.
    pub(super) async fn compensate(&mut self) -> Result<Obs, String> {
        // Mostly a claim not yet compensated; now and then one that was (nothing happens).
        let id = match self.rng.random_ratio(1, 8) {
            true => self.pick(|d| &d.compensated, 8),
            false => self.pick(|d| &d.parked, 8),
        };
        let Some(id) = id else {
            return self.idle().await;
        };
        let w = self.world.won[&id].clone();
        let floor = self.world.mark;
        self.log.push(format!("compensate {id} floor {floor}"));
        let marker = self.keys.compensation(&id);
        let field = (w.key.as_ref()).map_or(Vec::new(), |k| idempotency_field(&w.user, k).to_vec());
        let call = |mode: &'static str| {
            let mut inv = SCRIPTS.compensate.prepare_invoke();
            for k in self.keys.lifecycle() {
                inv.key(k);
            }
            inv.key(&marker)
                .key(self.keys.idempotency())
                .arg(mode)
                .arg("owner")
                .arg(&w.user)
                .arg(w.quantity)
                .arg(id.to_string())
                .arg(30 * 24 * 3600)
                .arg(Floor::seq(floor))
                .arg(&field);
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
        let (want, obs) = self
            .observed(None, |wd, now| {
                (wd.compensate_fence(id), wd.compensate(id, floor, now))
            })
            .await?;
        self.count(format!("compensate {gave}"));
        if self.world.won[&id].compensated && !w.compensated {
            self.parked.retain(|p| *p != id);
            self.compensated.push(id);
            if self.compensated.len() > 16 {
                self.compensated.remove(0);
            }
        }
        same("compensate (fence, give)", &(fenced, gave), &want)?;
        Ok(obs)
    }
}
