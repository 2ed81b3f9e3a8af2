//! The relay: a background task of every gateway that moves outbox rows to JetStream, samples
//! the backlog, and trims sent rows after the retention period.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::postgres::PgListener;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::jetstream::{Publisher, ACK_TIMEOUT};
use super::{store, NatsState, OutboxStatus, RelayError, LEASE};
use crate::config::NatsConfig;
use crate::metrics as m;

/// Events taken per round: enough to keep JetStream's pipeline full, few enough that a batch
/// is sent and acknowledged well within [`LEASE`].
const BATCH: i64 = 512;
/// Idle poll: NOTIFY wakes the relay at once; this only covers a listener that is down.
const POLL: Duration = Duration::from_millis(500);
const SAMPLE_EVERY: Duration = Duration::from_secs(1);
const TRIM_EVERY: Duration = Duration::from_secs(60);
const TRIM_CHUNK: i64 = 5000;
/// While a relay works through a backlog it looks only above its last batch; at least this
/// often (and whenever it has caught up) it looks from the start again, for rows below that
/// committed late, or whose publish failed.
const FULL_SCAN_EVERY: Duration = Duration::from_secs(1);
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// The NOTIFY channel of `migrations/0005_outbox.sql`.
const CHANNEL: &str = "dropgate_outbox";

pub struct Relay {
    db: PgPool,
    /// Lead owner token of this process; a restarted gateway is a new owner and waits for
    /// its predecessor's lead to run out (or to be given up at its shutdown).
    owner: Uuid,
    /// Where events go; `None` without `DROPGATE_NATS_URL` (only the backlog is watched).
    nats: Option<NatsConfig>,
    /// Shared with `/readyz`.
    status: Arc<OutboxStatus>,
    retention: Duration,
    /// Rows JetStream acknowledged whose marking as sent failed (PostgreSQL unreachable):
    /// marked first on the next round, and never published again by this relay.
    acked: Vec<i64>,
    /// The state after the last round: a change is logged once, not every retry.
    state: NatsState,
    /// Where the next take looks from (see [`store::take`]), and when it last looked from
    /// the start.
    floor: i64,
    full_scan_at: Instant,
}

impl Relay {
    pub fn new(
        db: PgPool,
        nats: Option<NatsConfig>,
        status: Arc<OutboxStatus>,
        retention: Duration,
    ) -> Self {
        Relay {
            db,
            owner: Uuid::new_v4(),
            nats,
            status,
            retention,
            acked: Vec::new(),
            state: NatsState::Ok,
            floor: 0,
            full_scan_at: Instant::now(),
        }
    }

    /// Runs until `shutdown`, then publishes what is unsent once more (the gateway bounds that
    /// by its grace period) and returns.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut publisher = match self.nats.clone() {
            Some(config) => match Publisher::connect(config).await {
                Ok(p) => Some(p),
                Err(e) => {
                    tracing::error!(error = %e, "outbox relay cannot use the NATS address; events stay in the outbox");
                    self.status.set_nats(NatsState::Failing);
                    None
                }
            },
            None => {
                tracing::warn!("DROPGATE_NATS_URL is not set: claim events stay in the outbox");
                None
            }
        };
        let mut listener: Option<PgListener> = None;
        let mut next_sample = Instant::now();
        let mut next_trim = Instant::now();
        let mut pauses = crate::pace::retries(BACKOFF_MIN, BACKOFF_MAX);
        loop {
            let now = Instant::now();
            if now >= next_sample {
                next_sample = now + SAMPLE_EVERY;
                self.sample().await;
                if listener.is_none() && publisher.is_some() {
                    listener = listen(&self.db).await;
                }
            }
            if publisher.is_some() && now >= next_trim {
                next_trim = now + TRIM_EVERY;
                self.trim().await;
            }
            let Some(p) = publisher.as_mut() else {
                tokio::select! {
                    _ = tokio::time::sleep(SAMPLE_EVERY) => {}
                    _ = shutdown.cancelled() => break,
                }
                continue;
            };
            let failed = match self.round(p).await {
                Ok(n) => {
                    pauses = crate::pace::retries(BACKOFF_MIN, BACKOFF_MAX);
                    if n as i64 >= BATCH && !shutdown.is_cancelled() {
                        continue;
                    }
                    false
                }
                Err(e) => {
                    tracing::debug!(error = %e, "outbox relay round failed; retrying");
                    true
                }
            };
            if shutdown.is_cancelled() {
                break;
            }
            let pause = if failed {
                pauses.next().unwrap_or(BACKOFF_MAX)
            } else {
                POLL
            };
            tokio::select! {
                woke = wait(&mut listener), if !failed => {
                    match listener.as_mut() {
                        // Commits that came while this relay was busy: one round takes them all.
                        Some(l) if woke => while l.next_buffered().is_some() {},
                        // The listener's connection failed; polling until it is back.
                        _ => listener = None,
                    }
                }
                _ = tokio::time::sleep(pause) => {}
                _ = shutdown.cancelled() => {}
            }
        }
        if let Some(p) = publisher.as_mut() {
            self.flush(p).await;
            // Another gateway's relay leads at once, not after the lease.
            if let Err(e) = store::resign(&self.db, self.owner).await {
                tracing::debug!(error = %e, "outbox relay could not give up its lead; it runs out");
            }
        }
        tracing::info!(owner = %self.owner, "outbox relay stopped");
    }

    /// After shutdown: rounds until nothing is left or a round fails.
    async fn flush(&mut self, p: &mut Publisher) {
        loop {
            match self.round(p).await {
                Ok(n) if n as i64 >= BATCH => continue,
                Ok(_) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "outbox relay could not flush at shutdown; the outbox keeps the events");
                    break;
                }
            }
        }
    }

    /// One batch: mark what was acknowledged earlier, take or renew the lead, take unsent rows,
    /// publish, mark the acknowledged ones sent (the rest stay unsent). Returns how many rows
    /// were taken (0 when another relay leads).
    async fn round(&mut self, p: &mut Publisher) -> Result<usize, RelayError> {
        let result = self.publish_batch(p).await;
        let state = match &result {
            Ok(_) => NatsState::Ok,
            Err(_) if !p.connected() => NatsState::Unreachable,
            Err(RelayError::Db(_)) => self.state,
            Err(_) => NatsState::Failing,
        };
        if state != self.state {
            match (&result, state) {
                (_, NatsState::Ok) => tracing::info!("outbox relay publishing again"),
                (Err(e), _) => tracing::warn!(error = %e, state = state.as_str(),
                    "outbox relay cannot publish; claim events wait in PostgreSQL"),
                _ => {}
            }
            self.state = state;
        }
        if let Err(RelayError::Db(e)) = &result {
            tracing::warn!(error = %e, "outbox relay cannot reach PostgreSQL; retrying");
        }
        self.status.set_nats(state);
        result
    }

    async fn publish_batch(&mut self, p: &mut Publisher) -> Result<usize, RelayError> {
        self.mark_acked().await?;
        p.ensure_stream().await?;
        if !p.connected() {
            return Err(RelayError::Unreachable);
        }
        let leased_at = Instant::now();
        // One relay publishes at a time; the others only sample and trim, ready to lead.
        if !store::lead(&self.db, self.owner, LEASE).await? {
            self.floor = 0;
            return Ok(0);
        }
        if self.full_scan_at.elapsed() >= FULL_SCAN_EVERY {
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
        if rows.is_empty() {
            return Ok(0);
        }
        // Stop sending while the acknowledgements could still arrive inside the lead's lease.
        let deadline = leased_at + LEASE.saturating_sub(ACK_TIMEOUT * 2);
        let results = p.publish(&rows, deadline).await;
        let now = chrono::Utc::now();
        let mut failed = 0usize;
        let mut first_error = None;
        let mut duplicates = 0;
        for (row, result) in rows.iter().zip(results) {
            match result {
                Ok(duplicate) => {
                    duplicates += u64::from(duplicate);
                    self.acked.push(row.id);
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
            m::outbox_publish_failed(failed as u64);
        }
        m::outbox_duplicates(duplicates);
        self.mark_acked().await?;
        match first_error {
            Some(e) => Err(e),
            None => Ok(rows.len()),
        }
    }

    /// Marks the acknowledged rows sent (a row a later leader sent again meanwhile is marked
    /// already: JetStream dropped one of the copies).
    async fn mark_acked(&mut self) -> Result<(), RelayError> {
        if self.acked.is_empty() {
            return Ok(());
        }
        let marked = store::mark_sent(&self.db, &self.acked).await?;
        m::outbox_published(marked);
        self.acked.clear();
        Ok(())
    }

    async fn sample(&self) {
        match store::backlog(&self.db).await {
            Ok((events, oldest)) => {
                m::outbox_backlog(events, oldest);
                self.status.set_backlog(events, oldest);
            }
            Err(e) => tracing::debug!(error = %e, "could not count the outbox backlog"),
        }
    }

    async fn trim(&self) {
        match store::trim(&self.db, self.retention, TRIM_CHUNK).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                events = n,
                "sent events past the retention period deleted from the outbox"
            ),
            Err(e) => tracing::warn!(error = %e, "could not trim the outbox; retrying later"),
        }
    }
}

/// A listener on the outbox channel, or `None` when PostgreSQL cannot give one now.
async fn listen(db: &PgPool) -> Option<PgListener> {
    let mut l = PgListener::connect_with(db).await.ok()?;
    l.listen(CHANNEL).await.ok()?;
    Some(l)
}

/// Waits for a notification; `false` when the listener failed (or there is none: then it
/// never returns, and the poll interval wakes the relay).
async fn wait(listener: &mut Option<PgListener>) -> bool {
    match listener {
        Some(l) => l.recv().await.is_ok(),
        None => std::future::pending().await,
    }
}
