//! The leader's batch: the creation events past the cursor first, then the `outbox` rows, each
//! published in order and recorded as sent only once JetStream acknowledged it.

use std::time::Instant;

use super::{Relay, BATCH};
use crate::metrics as m;
use crate::outbox::cursor::{self, Position};
use crate::outbox::events::OutboxRow;
use crate::outbox::jetstream::{Publisher, ACK_TIMEOUT};
use crate::outbox::{store, RelayError, LEASE};

/// What a batch took.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Taken {
    /// A full batch of either kind: more is waiting, the relay goes on at once.
    pub full: bool,
    /// Creation events committed by a transaction that ended while an older one still runs:
    /// not publishable yet, and the older one's commit may wake no relay (it need not be a
    /// writer's), so the relay looks again soon.
    pub held_back: bool,
}

impl Relay {
    /// One batch: record what was acknowledged earlier, take or renew the lead, publish the
    /// creation events past the cursor and move the cursor over the acknowledged ones, then
    /// take the `outbox` rows (a claim's later events only once the cursor passed its
    /// creation), publish them and mark the acknowledged ones sent. What failed stays unsent.
    pub(super) async fn publish_batch(&mut self, p: &mut Publisher) -> Result<Taken, RelayError> {
        self.mark_acked().await?;
        p.ensure_stream().await?;
        if !p.connected() {
            return Err(RelayError::Unreachable);
        }
        let leased_at = Instant::now();
        // One relay publishes at a time; the others only sample and trim, ready to lead.
        if !store::lead(&self.db, self.owner, LEASE).await? {
            self.floor = 0;
            return Ok(Taken::default());
        }
        // Stop sending while the acknowledgements could still arrive inside the lead's lease.
        let deadline = leased_at + LEASE.saturating_sub(ACK_TIMEOUT * 2);

        let won = cursor::take(&self.db, BATCH).await?;
        let held_back = won.iter().any(|w| !w.settled);
        let (at, events): (Vec<Position>, Vec<OutboxRow>) = won
            .into_iter()
            .take_while(|w| w.settled)
            .map(|w| (w.at, w.event))
            .unzip();
        let mut taken = Taken {
            full: events.len() as i64 >= BATCH,
            held_back,
        };
        if !events.is_empty() {
            let results = p.publish(&events, deadline).await;
            // The cursor moves over the acknowledged prefix only: past a failed event it would
            // skip it for good.
            let acked = results.iter().take_while(|r| r.is_ok()).count();
            if let Some(last) = acked.checked_sub(1) {
                self.won_acked = Some(at[last]);
            }
            let outcome = tally(&events, results, |_| {});
            self.mark_acked().await?;
            outcome?;
        }

        if self.full_scan_at.elapsed() >= super::FULL_SCAN_EVERY {
            self.floor = 0;
        }
        if self.floor == 0 {
            self.full_scan_at = leased_at;
        }
        let rows = store::take(&self.db, BATCH, self.floor).await?;
        // A full batch: more is waiting above it. Otherwise caught up: look from the start.
        self.floor = match rows.first() {
            Some(first) if rows.len() as i64 >= BATCH => first.id - 1,
            _ => 0,
        };
        taken.full |= rows.len() as i64 >= BATCH;
        if rows.is_empty() {
            return Ok(taken);
        }
        let results = p.publish(&rows, deadline).await;
        let mut acked = Vec::with_capacity(rows.len());
        let outcome = tally(&rows, results, |row| acked.push(row.id));
        self.acked.extend(acked);
        self.mark_acked().await?;
        outcome.map(|()| taken)
    }

    /// Records what JetStream acknowledged: the cursor moved over the creation events, the
    /// `outbox` rows marked sent (a row a later leader sent again meanwhile is marked already:
    /// JetStream dropped one of the copies).
    pub(super) async fn mark_acked(&mut self) -> Result<(), RelayError> {
        if let Some(to) = self.won_acked {
            cursor::advance(&self.db, to).await?;
            self.won_acked = None;
        }
        if self.acked.is_empty() {
            return Ok(());
        }
        let marked = store::mark_sent(&self.db, &self.acked).await?;
        m::outbox_published(marked);
        self.acked.clear();
        Ok(())
    }
}

/// Counts a publish's outcome: each acknowledged event goes to `acked` (and its lag to the
/// metric), the failures to theirs; the first failure is returned. A creation event from the
/// cursor counts as published when JetStream took it as new (it has no row to mark).
fn tally(
    rows: &[OutboxRow],
    results: Vec<Result<bool, RelayError>>,
    mut acked: impl FnMut(&OutboxRow),
) -> Result<(), RelayError> {
    let now = chrono::Utc::now();
    let mut failed = 0u64;
    let mut first_error = None;
    let (mut duplicates, mut new_won) = (0, 0);
    for (row, result) in rows.iter().zip(results) {
        match result {
            Ok(duplicate) => {
                duplicates += u64::from(duplicate);
                new_won += u64::from(!duplicate && row.id == 0);
                acked(row);
                m::outbox_lag((now - row.created_at).to_std().unwrap_or_default());
            }
            Err(e) => {
                failed += 1;
                first_error.get_or_insert(e);
            }
        }
    }
    if failed > 0 {
        // Left unsent: the next round (this leader's or the next one's) takes them again.
        m::outbox_publish_failed(failed);
    }
    m::outbox_duplicates(duplicates);
    m::outbox_published(new_won);
    first_error.map_or(Ok(()), Err)
}
