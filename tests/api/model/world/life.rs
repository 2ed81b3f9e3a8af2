//! The lifecycle in the model: holds confirmed, cancelled, expired; the waitlist joined and
//! left; units given back (cancel, expiry, restock, compensation) offered to the line's head
//! first, as lua/lib/lifecycle.lua must do it. Every status change is checked against the
//! one lifecycle table (`ClaimStatus::allowed`, `EntryStatus::allowed`).

use dropgate::status::{ClaimStatus, EntryStatus};
use uuid::Uuid;

use super::{Entry, Hold, JEntry, Won, World};

/// decide_hold.lua's answer: code, status, expires_ms.
pub type Decided = (i64, String, i64);

/// A journal record of a hold's change (`change_record`).
fn change_record(id: Uuid, status: ClaimStatus, qty: i64, now: i64, seq: i64) -> String {
    format!("{id}|{status}|{qty}|{now}|{seq}")
}

/// A journal record of an entry's change (`entry_record`).
fn entry_record(id: Uuid, e: &Entry, status: EntryStatus, now: i64, seq: i64) -> String {
    format!(
        "{id}|{status}|{}|{now}|{seq}|{}|{}",
        e.order,
        e.user.len(),
        e.user
    )
}

fn field(name: &str, value: String) -> (String, String) {
    (name.to_string(), value)
}

impl World {
    fn set_claim(&mut self, id: Uuid, to: ClaimStatus) {
        if let Some(w) = self.won.get_mut(&id) {
            assert!(
                ClaimStatus::allowed(Some(w.status), to),
                "the model made {id} {} -> {to}, a step not in the table",
                w.status
            );
            w.status = to;
        }
    }

    /// Moves an entry (its Redis record and the ledger's) to `to`; returns the entry as it was.
    fn set_entry(&mut self, id: Uuid, to: EntryStatus) -> Entry {
        let e = self.entries.get_mut(&id).expect("an entry the script read");
        assert!(
            EntryStatus::allowed(Some(e.status), to),
            "the model made entry {id} {} -> {to}, a step not in the table",
            e.status
        );
        let was = e.clone();
        e.status = to;
        if let Some(l) = self.ledger_entries.get_mut(&id) {
            l.status = to;
        }
        was
    }

    fn forget_member(&mut self, user: &str, id: Uuid) {
        if self.wl_users.get(user) == Some(&id) {
            self.wl_users.remove(user);
        }
    }

    fn take_units(&mut self, user: &str, qty: i64) {
        let left = self.users.get(user).copied().unwrap_or(0) - qty;
        if left <= 0 {
            self.users.remove(user);
        } else {
            self.users.insert(user.to_string(), left);
        }
    }

    fn lifecycle_entry(
        &mut self,
        fields: Vec<(String, String)>,
        units: i64,
        changes: Vec<(Uuid, ClaimStatus)>,
        waits: Vec<(Uuid, EntryStatus)>,
    ) {
        self.push_entry(JEntry {
            id: None,
            fields,
            units,
            seq: self.seq,
            wins: Vec::new(),
            changes,
            waits,
        });
    }

    /// offer_line: up to `units` to the head of the line, one an entry; returns the units
    /// nobody took.
    fn offer_line(&mut self, mut units: i64, now: i64) -> i64 {
        let stock = self.stock;
        while units > 0 {
            let Some(&(order, eid)) = self.line.iter().next() else {
                break;
            };
            self.line.remove(&(order, eid));
            match self.entries.get(&eid) {
                Some(e) if e.status == EntryStatus::Waiting => {}
                _ => continue,
            }
            let user = self.entries[&eid].user.clone();
            let held = self.users.get(&user).copied().unwrap_or(0);
            self.seq += 1;
            if held + 1 > self.limit {
                let e = self.set_entry(eid, EntryStatus::Expired);
                let w = entry_record(eid, &e, EntryStatus::Expired, now, self.seq);
                self.lifecycle_entry(
                    vec![field("w", w)],
                    0,
                    Vec::new(),
                    vec![(eid, EntryStatus::Expired)],
                );
                continue;
            }
            let expires = now + self.offer_ms;
            self.users.insert(user.clone(), held + 1);
            self.holds.insert(
                eid,
                Hold {
                    status: ClaimStatus::Held,
                    qty: 1,
                    expires,
                    offer: true,
                    user: user.clone(),
                },
            );
            let e = self.set_entry(eid, EntryStatus::Offered);
            let c = format!(
                "h|{expires}|{eid}|1|{now}|{stock}|{}|{}|{user}",
                self.seq,
                user.len()
            );
            let w = entry_record(eid, &e, EntryStatus::Offered, now, self.seq);
            self.push_entry(JEntry {
                id: None,
                fields: vec![field("c", c), field("w", w)],
                units: 1,
                seq: self.seq,
                wins: vec![eid],
                changes: Vec::new(),
                waits: vec![(eid, EntryStatus::Offered)],
            });
            self.inflight += 1;
            self.add_won(
                eid,
                Won {
                    user,
                    quantity: 1,
                    key: None,
                    remaining: stock,
                    seq: self.seq,
                    status: ClaimStatus::Held,
                    expires: Some(expires),
                    offer: true,
                    parked: false,
                    compensated: false,
                },
            );
            units -= 1;
        }
        units
    }

    /// give_back: offers first, the rest to open stock.
    pub fn give_back(&mut self, units: i64, now: i64) {
        let left = self.offer_line(units, now);
        self.stock += left;
    }

    /// end_hold: a held claim ends as `status`; an offer's entry ends with it.
    fn end_hold(&mut self, id: Uuid, status: ClaimStatus, now: i64, entry_end: EntryStatus) {
        let h = self.holds[&id].clone();
        self.holds.get_mut(&id).expect("read above").status = status;
        self.set_claim(id, status);
        self.take_units(&h.user, h.qty);
        self.seq += 1;
        let (mut fields, mut changes, mut waits, mut units) =
            (Vec::new(), Vec::new(), Vec::new(), 0);
        if status != ClaimStatus::Compensated {
            fields.push(field("s", change_record(id, status, h.qty, now, self.seq)));
            changes.push((id, status));
            self.inflight -= h.qty;
            units = -h.qty;
        }
        if h.offer && self.entries.get(&id).map(|e| e.status) == Some(EntryStatus::Offered) {
            let e = self.set_entry(id, entry_end);
            fields.push(field("w", entry_record(id, &e, entry_end, now, self.seq)));
            waits.push((id, entry_end));
            self.forget_member(&e.user, id);
        }
        if !fields.is_empty() {
            self.lifecycle_entry(fields, units, changes, waits);
        }
        self.give_back(h.qty, now);
    }

    /// decide_hold.lua: `confirm` (else cancel) of `id` by `caller` ("" for the admin).
    pub fn decide(
        &mut self,
        confirm: bool,
        id: Uuid,
        caller: &str,
        floor: i64,
        now: i64,
    ) -> Decided {
        let Some(h) = self.holds.get(&id).cloned() else {
            return (0, String::new(), 0);
        };
        if !caller.is_empty() && caller != h.user {
            return (0, String::new(), 0);
        }
        if let Some(why) = self.unfit(floor) {
            return (if why == "lost" { -1 } else { -3 }, String::new(), 0);
        }
        let want = if confirm {
            ClaimStatus::Confirmed
        } else {
            ClaimStatus::Cancelled
        };
        if h.status == want {
            return (1, want.to_string(), h.expires);
        }
        if h.status != ClaimStatus::Held {
            return (2, h.status.to_string(), h.expires);
        }
        if now >= h.expires {
            self.end_hold(id, ClaimStatus::Expired, now, EntryStatus::Expired);
            return (2, "expired".into(), h.expires);
        }
        if !confirm {
            self.end_hold(id, ClaimStatus::Cancelled, now, EntryStatus::Expired);
            return (1, "cancelled".into(), h.expires);
        }
        self.holds.get_mut(&id).expect("read above").status = ClaimStatus::Confirmed;
        self.set_claim(id, ClaimStatus::Confirmed);
        self.seq += 1;
        let mut fields = vec![field(
            "s",
            change_record(id, ClaimStatus::Confirmed, h.qty, now, self.seq),
        )];
        let mut waits = Vec::new();
        if h.offer && self.entries.contains_key(&id) {
            let e = self.set_entry(id, EntryStatus::Claimed);
            fields.push(field(
                "w",
                entry_record(id, &e, EntryStatus::Claimed, now, self.seq),
            ));
            waits.push((id, EntryStatus::Claimed));
            self.forget_member(&e.user, id);
        }
        self.lifecycle_entry(fields, 0, vec![(id, ClaimStatus::Confirmed)], waits);
        (1, "confirmed".into(), h.expires)
    }

    /// expire_holds.lua by the worker `owner`, at most `max` holds.
    pub fn expire(&mut self, owner: &str, max: usize, floor: i64, now: i64) -> Vec<i64> {
        if self.lease.as_deref().is_some_and(|l| l != owner) {
            return vec![-1];
        }
        self.lease = Some(owner.to_string());
        if self.unfit(floor).is_some() {
            return vec![-2];
        }
        let due: Vec<(Uuid, i64)> = (self.expiry().into_iter())
            .filter(|(_, x)| *x <= now)
            .take(max)
            .collect();
        let mut out = vec![0];
        for (id, x) in due {
            self.end_hold(id, ClaimStatus::Expired, now, EntryStatus::Expired);
            out[0] += 1;
            out.push(now - x);
        }
        out
    }

    /// join_waitlist.lua: `user` joins with the new entry id `eid`; `elsewhere`: another
    /// shard holds units.
    pub fn join(
        &mut self,
        eid: Uuid,
        user: &str,
        elsewhere: bool,
        floor: i64,
        now: i64,
    ) -> (i64, String, i64) {
        if let Some(why) = self.unfit(floor) {
            return (if why == "lost" { -1 } else { -3 }, String::new(), 0);
        }
        if let Some(mine) = self.wl_users.get(user).copied() {
            match self.entries.get(&mine).map(|e| e.status) {
                Some(EntryStatus::Waiting) => {
                    return (2, mine.to_string(), self.rank(mine) + 1);
                }
                Some(EntryStatus::Offered) => return (2, mine.to_string(), 0),
                _ => {}
            }
        }
        if self.stock > 0 || elsewhere {
            return (3, String::new(), 0);
        }
        if self.users.get(user).copied().unwrap_or(0) >= self.limit {
            return (4, String::new(), 0);
        }
        self.wl_order += 1;
        let e = Entry {
            status: EntryStatus::Waiting,
            order: self.wl_order,
            ms: now,
            user: user.to_string(),
        };
        self.line.insert((e.order, eid));
        self.entries.insert(eid, e.clone());
        self.ledger_entries.insert(eid, e.clone());
        self.entry_ids.push(eid);
        self.wl_users.insert(user.to_string(), eid);
        self.seq += 1;
        let w = entry_record(eid, &e, EntryStatus::Waiting, now, self.seq);
        self.lifecycle_entry(
            vec![field("w", w)],
            0,
            Vec::new(),
            vec![(eid, EntryStatus::Waiting)],
        );
        (1, eid.to_string(), self.rank(eid) + 1)
    }

    /// ZRANK in the line (0 when not in it, as the script's `or 0`).
    fn rank(&self, eid: Uuid) -> i64 {
        match self.line.iter().position(|(_, id)| *id == eid) {
            Some(p) => p as i64,
            None => 0,
        }
    }

    /// leave_waitlist.lua: `eid` leaves, asked by `caller` ("" for the admin).
    pub fn leave(&mut self, eid: Uuid, caller: &str, floor: i64, now: i64) -> (i64, String) {
        if let Some(why) = self.unfit(floor) {
            return (if why == "lost" { -1 } else { -3 }, String::new());
        }
        let Some(e) = self.entries.get(&eid).cloned() else {
            return (0, String::new());
        };
        if !caller.is_empty() && caller != e.user {
            return (0, String::new());
        }
        match e.status {
            EntryStatus::Left => return (1, "left".into()),
            EntryStatus::Waiting | EntryStatus::Offered => {}
            other => return (2, other.to_string()),
        }
        if e.status == EntryStatus::Offered
            && self.holds.get(&eid).map(|h| h.status) == Some(ClaimStatus::Held)
        {
            self.end_hold(eid, ClaimStatus::Cancelled, now, EntryStatus::Left);
            return (1, "left".into());
        }
        self.line.remove(&(e.order, eid));
        self.set_entry(eid, EntryStatus::Left);
        self.forget_member(&e.user, eid);
        self.seq += 1;
        let w = entry_record(eid, &e, EntryStatus::Left, now, self.seq);
        self.lifecycle_entry(
            vec![field("w", w)],
            0,
            Vec::new(),
            vec![(eid, EntryStatus::Left)],
        );
        (1, "left".into())
    }

    /// compensate.lua "fence": 1, or 0 when already compensated.
    pub fn compensate_fence(&self, id: Uuid) -> i64 {
        i64::from(!self.won[&id].compensated)
    }

    /// compensate.lua "give" by the latest fencer: its code.
    pub fn compensate(&mut self, id: Uuid, floor: i64, now: i64) -> i64 {
        let w = self.won[&id].clone();
        if w.compensated {
            return 0;
        }
        if self.unfit(floor).is_some() {
            return -1;
        }
        let mut code = 1;
        match self.holds.get(&id).map(|h| h.status) {
            Some(ClaimStatus::Cancelled) => code = 3,
            Some(ClaimStatus::Expired) => code = 5,
            Some(s) if s != ClaimStatus::Compensated => {
                if s == ClaimStatus::Confirmed {
                    code = 4;
                }
                self.end_hold(id, ClaimStatus::Compensated, now, EntryStatus::Expired);
            }
            _ => {
                self.take_units(&w.user, w.quantity);
                self.seq += 1;
                self.give_back(w.quantity, now);
                self.set_claim(id, ClaimStatus::Compensated);
            }
        }
        // A retry under the claim's key is decided afresh.
        if let Some(k) = &w.key {
            let k = (w.user.clone(), k.clone());
            if self.idem.get(&k) == Some(&id) {
                self.idem.remove(&k);
            }
        }
        self.won.get_mut(&id).expect("read above").compensated = true;
        code
    }
}
