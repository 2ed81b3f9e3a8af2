//! The writer's side and the operator's: the journal acknowledged as the writer does it (its
//! reading of every entry held to the model's; hold records of claims written final and
//! records of entries that ended dropped), and a restore from the model's ledger as
//! src/restore.rs and src/lifecycle/restore.rs rebuild it.

use dropgate::scripts::SCRIPTS;
use dropgate::status::{ClaimStatus, EntryStatus};
use rand::Rng;
use redis::Value;
use uuid::Uuid;

use super::check::Obs;
use super::{same, Driver};

impl Driver {
    pub(super) async fn ack(&mut self) -> Result<Obs, String> {
        let n: usize = self.rng.random_range(1..=8);
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
        let raw = stream_values(reply);
        let k = raw.len();
        same("entries delivered", &k, &n.min(self.world.journal.len()))?;
        self.log.push(format!("ack {k} entries"));
        for (e, want) in raw.into_iter().zip(&self.world.journal) {
            // What the writer makes of the entry.
            let batch = dropgate::journal::entry_batch(&dropgate::keys::ShardName::parse("m"), e);
            if !batch.unreadable.is_empty() {
                return Err(format!("the writer cannot read {:?}", batch.unreadable));
            }
            let ids: Vec<&str> = (batch.winners.iter().map(|w| w.entry_id.as_str()))
                .chain(batch.others.iter().map(|o| o.entry_id.as_str()))
                .collect();
            same("entry read", &ids.first().copied(), &want.id.as_deref())?;
            let units: i64 = (batch.winners.iter().map(|w| i64::from(w.quantity)))
                .chain(batch.others.iter().map(|o| i64::from(o.units)))
                .sum();
            same("units of an entry", &units, &want.units)?;
            let wins: Vec<Uuid> = batch.winners.iter().map(|w| w.claim_id).collect();
            same("winners of an entry", &wins, &want.wins)?;
            for got in &batch.winners {
                let w = &self.world.won[&got.claim_id];
                let found = (
                    i64::from(got.quantity),
                    got.seq,
                    got.remaining_after,
                    &got.user,
                    &got.idempotency_key,
                    got.expires_ms,
                    got.offer,
                );
                let expected = (
                    w.quantity,
                    w.seq,
                    Some(w.remaining),
                    &w.user,
                    &w.key,
                    w.expires,
                    w.offer,
                );
                same("a winner as the writer reads it", &found, &expected)?;
            }
            let changes: Vec<(Uuid, ClaimStatus)> = batch
                .changes
                .iter()
                .map(|c| (c.claim_id, c.status))
                .collect();
            same("changes of an entry", &changes, &want.changes)?;
            let waits: Vec<(Uuid, EntryStatus)> =
                batch.waits.iter().map(|w| (w.entry_id, w.status)).collect();
            same("waits of an entry", &waits, &want.waits)?;
        }
        if k == 0 {
            return self.idle().await;
        }
        let acked = self.world.ack(k);
        let mut inv = SCRIPTS.ack_journal.prepare_invoke();
        inv.key(self.keys.state())
            .key(self.keys.journal())
            .key(self.keys.holds())
            .key(self.keys.waitlist_entries())
            .arg("writers")
            .arg(k);
        for e in &acked.entries {
            inv.arg(e.id.as_deref().expect("seen")).arg(e.units);
        }
        inv.arg(acked.holds.len());
        for id in acked.holds.iter().chain(&acked.ended) {
            inv.arg(id.to_string());
        }
        self.log.push(format!(
            "  forget holds {:?} entries {:?}",
            acked.holds, acked.ended
        ));
        let got: i64 = inv
            .invoke_async(&mut self.con)
            .await
            .map_err(|e| e.to_string())?;
        same("acknowledged", &got, &(k as i64))?;
        self.idle().await
    }

    /// restore_sku.lua from the model's ledger, after the writer emptied the journal, with
    /// the holds and the line rebuilt first (as src/lifecycle/restore.rs does).
    pub(super) async fn restore(&mut self) -> Result<Obs, String> {
        if !self.world.lost && !self.world.stale {
            return self.idle().await;
        }
        while !self.world.journal.is_empty() {
            let obs = self.ack().await?;
            self.check(obs)?;
        }
        let plan = self.world.restore_plan();
        let k = &self.keys;
        let staged = k.users_restore(&Uuid::new_v4());
        let mut pipe = redis::pipe();
        for key in [
            k.state(),
            k.holds(),
            k.expiry(),
            k.waitlist(),
            k.waitlist_entries(),
            k.waitlist_users(),
            staged.clone(),
        ] {
            pipe.del(key).ignore();
        }
        for (u, n) in &plan.users {
            pipe.hset(&staged, u, n).ignore();
        }
        for (id, h) in &plan.holds {
            pipe.hset(k.holds(), id.to_string(), h.pack()).ignore();
            if h.status == ClaimStatus::Held {
                pipe.zadd(k.expiry(), id.to_string(), h.expires).ignore();
            }
        }
        for (id, e) in &plan.entries {
            pipe.hset(k.waitlist_entries(), id.to_string(), e.pack())
                .ignore()
                .hset(k.waitlist_users(), &e.user, id.to_string())
                .ignore();
            if e.status == EntryStatus::Waiting {
                pipe.zadd(k.waitlist(), id.to_string(), e.order).ignore();
            }
        }
        let _: () = pipe
            .query_async(&mut self.con)
            .await
            .map_err(|e| e.to_string())?;
        let seq = self.world.mark.max(self.world.seq) + 1;
        self.log.push(format!("restore {plan:?} seq {seq}"));
        let w = &self.world;
        let r: i64 = SCRIPTS
            .restore_sku
            .key(k.state())
            .key(k.users())
            .key(k.journal())
            .key(staged)
            .key(k.op_fence())
            .arg(plan.stock)
            .arg(w.limit)
            .arg(seq)
            .arg(Uuid::nil().to_string())
            .arg(0)
            .arg(w.hold_ms)
            .arg(w.offer_ms)
            .arg("")
            .arg("")
            .arg(plan.wl_order)
            .invoke_async(&mut self.con)
            .await
            .map_err(|e| e.to_string())?;
        same("restore", &r, &1)?;
        self.observed(None, move |w, _| w.restored(plan, seq))
            .await
            .map(|r| r.1)
    }
}

/// The entries of an XREADGROUP reply, each `[id, [field, value, ...]]`.
fn stream_values(reply: Value) -> Vec<Value> {
    let Value::Array(streams) = reply else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for s in streams {
        let Value::Array(mut parts) = s else { continue };
        if let Some(Value::Array(entries)) = parts.pop() {
            out.extend(entries);
        }
    }
    out
}
