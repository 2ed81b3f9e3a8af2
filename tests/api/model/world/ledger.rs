//! The ledger's side in the model: the writer's acknowledgements (units out of `inflight`,
//! the mark, the hold and entry records it drops) and a restore from what it wrote.

use std::collections::BTreeMap;

use dropgate::status::{ClaimStatus, EntryStatus};
use uuid::Uuid;

use super::{Entry, Hold, JEntry, World};

/// What a restore writes back (src/lifecycle/restore.rs, src/restore.rs).
#[derive(Debug)]
pub struct Restore {
    pub stock: i64,
    pub users: BTreeMap<String, i64>,
    /// Written holds still `held`, and parked holds not compensated whatever their status.
    pub holds: Vec<(Uuid, Hold)>,
    /// Entries waiting or offered.
    pub entries: Vec<(Uuid, Entry)>,
    /// The highest join order the ledger holds.
    pub wl_order: i64,
}

/// What the writer does with an acknowledged batch.
pub struct Acked {
    pub entries: Vec<JEntry>,
    /// Hold records dropped: claims whose final status `issuances` now holds.
    pub holds: Vec<Uuid>,
    /// Entry records dropped: entries that ended.
    pub ended: Vec<Uuid>,
}

impl World {
    /// The writer wrote and acknowledged the oldest `n` journal entries.
    pub fn ack(&mut self, n: usize) -> Acked {
        let entries: Vec<JEntry> = self.journal.drain(..n).collect();
        let (mut holds, mut ended) = (Vec::new(), Vec::new());
        for e in &entries {
            if !self.lost {
                self.inflight -= e.units;
            }
            self.mark = self.mark.max(e.seq);
            for (claim, _) in &e.changes {
                // A parked claim is not in `issuances`: its hold record stays (a compensation
                // reads it to know whether its units already came back).
                if self.won.get(claim).is_some_and(|w| !w.parked) {
                    holds.push(*claim);
                }
            }
            ended.extend(e.waits.iter().filter(|(_, s)| !s.is_live()).map(|w| w.0));
        }
        for id in &holds {
            self.holds.remove(id);
        }
        for id in &ended {
            self.entries.remove(id);
        }
        Acked {
            entries,
            holds,
            ended,
        }
    }

    /// What a restore rebuilds from the ledger, once the journal is written.
    pub fn restore_plan(&self) -> Restore {
        let holds = (self.won.iter())
            .filter(|(_, w)| w.expires.is_some() && !w.compensated)
            .filter(|(_, w)| w.parked || w.status == ClaimStatus::Held)
            .map(|(id, w)| {
                let hold = Hold {
                    status: w.status,
                    qty: w.quantity,
                    expires: w.expires.expect("filtered"),
                    offer: w.offer,
                    user: w.user.clone(),
                };
                (*id, hold)
            })
            .collect();
        let entries = (self.ledger_entries.iter())
            .filter(|(_, e)| e.status.is_live())
            .map(|(id, e)| (*id, e.clone()))
            .collect();
        Restore {
            stock: self.total - self.live_units(),
            users: self.live_users(),
            holds,
            entries,
            wl_order: self
                .ledger_entries
                .values()
                .map(|e| e.order)
                .max()
                .unwrap_or(0),
        }
    }

    /// The state as the restore `plan` rebuilt it, starting at `seq`.
    pub fn restored(&mut self, plan: Restore, seq: i64) {
        self.stock = plan.stock;
        self.users = plan.users;
        self.holds = plan.holds.into_iter().collect();
        self.line = (plan.entries.iter())
            .filter(|(_, e)| e.status == EntryStatus::Waiting)
            .map(|(id, e)| (e.order, *id))
            .collect();
        self.wl_users = (plan.entries.iter())
            .map(|(id, e)| (e.user.clone(), *id))
            .collect();
        self.entries = plan.entries.into_iter().collect();
        self.wl_order = plan.wl_order;
        self.seq = seq;
        self.mark = seq;
        self.inflight = 0;
        self.lost = false;
        self.stale = false;
    }
}
