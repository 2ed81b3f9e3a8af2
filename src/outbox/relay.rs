//! The relay: a background task of every gateway that moves claim events to JetStream (the
//! leader's batch is in [`batch`]), samples the backlog, and trims sent rows after the
//! retention period.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::postgres::PgListener;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::cursor::{self, Position};
use super::jetstream::Publisher;
use super::{held_back, store, NatsState, OutboxStatus, RelayError, HELD_BACK_SHOWN_AFTER_SECS};
use crate::config::NatsConfig;
use crate::metrics as m;
use crate::repeats;

mod batch;
use batch::Taken;

/// Events taken per round: enough to keep JetStream's pipeline full, few enough that a batch
/// is sent and acknowledged well within [`super::LEASE`].
const BATCH: i64 = 512;
/// Idle poll: NOTIFY wakes the relay at once; this only covers a listener that is down.
const POLL: Duration = Duration::from_millis(500);
const SAMPLE_EVERY: Duration = Duration::from_secs(1);
/// The backlog is counted up to this many events of each kind (`outbox` rows, creation events
/// past the cursor): a count costs PostgreSQL a row each, every gateway counts each second,
/// and an outage of NATS makes the backlog every claim since. Beyond it the gauge reads the
/// cap, and the oldest age is that of the events counted ([`cursor::backlog`]).
pub const BACKLOG_COUNTED_UP_TO: i64 = 10_000;
const TRIM_EVERY: Duration = Duration::from_secs(60);
const TRIM_CHUNK: i64 = 5000;
/// While a relay works through a backlog it looks only above its last batch; at least this
/// often (and whenever it has caught up) it looks from the start again, for rows below that
/// committed late, or whose publish failed.
const FULL_SCAN_EVERY: Duration = Duration::from_secs(1);
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// First look again at creation events held back by an older transaction still running
/// (doubling up to [`POLL`] while it runs): its end may notify no relay.
const HELD_BACK_MIN: Duration = Duration::from_millis(10);
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
    /// The same for the cursor: where JetStream's acknowledgements let it move.
    won_acked: Option<Position>,
    /// The state after the last round: a change is logged once, not every retry.
    state: NatsState,
    /// Where the next take looks from (see [`store::take`]), and when it last looked from
    /// the start.
    floor: i64,
    full_scan_at: Instant,
    /// The warning about a transaction holding the events back, rate-limited.
    held_back_log: repeats::Repeats,
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
            won_acked: None,
            state: NatsState::Ok,
            floor: 0,
            full_scan_at: Instant::now(),
            held_back_log: repeats::Repeats::default(),
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
        let mut held_pauses = crate::pace::retries(HELD_BACK_MIN, POLL);
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
            let (failed, held_back) = match self.round(p).await {
                Ok(taken) => {
                    pauses = crate::pace::retries(BACKOFF_MIN, BACKOFF_MAX);
                    if taken.full && !shutdown.is_cancelled() {
                        continue;
                    }
                    if !taken.held_back {
                        held_pauses = crate::pace::retries(HELD_BACK_MIN, POLL);
                    }
                    (false, taken.held_back)
                }
                Err(e) => {
                    tracing::debug!(error = %e, "outbox relay round failed; retrying");
                    (true, false)
                }
            };
            if shutdown.is_cancelled() {
                break;
            }
            let pause = if failed {
                pauses.next().unwrap_or(BACKOFF_MAX)
            } else if held_back {
                held_pauses.next().unwrap_or(POLL)
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
                Ok(taken) if taken.full => continue,
                Ok(_) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "outbox relay could not flush at shutdown; the outbox keeps the events");
                    break;
                }
            }
        }
    }

    /// One batch ([`Relay::publish_batch`]), and the NATS state it showed.
    async fn round(&mut self, p: &mut Publisher) -> Result<Taken, RelayError> {
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

    /// Unsent `outbox` rows and creation events past the cursor, and the oldest's age.
    async fn sample(&self) {
        let both = async {
            let (rows, row_age) = store::backlog(&self.db, BACKLOG_COUNTED_UP_TO).await?;
            let (won, won_age) = cursor::backlog(&self.db, BACKLOG_COUNTED_UP_TO).await?;
            let oldest = match (row_age, won_age) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            };
            Ok::<_, crate::error::DbError>((rows + won, oldest))
        };
        match both.await {
            Ok((events, oldest)) => {
                m::outbox_backlog(events, oldest);
                self.status.set_backlog(events, oldest);
            }
            Err(e) => tracing::debug!(error = %e, "could not count the outbox backlog"),
        }
        self.sample_held_back().await;
    }

    /// Names the transaction the next event waits for, in `/readyz`, the metric and the log
    /// (the first time, when it changes, then every 10 s, and when it ends).
    async fn sample_held_back(&self) {
        let found = match held_back::find(&self.db).await {
            Ok(found) => found.filter(|h| h.age_seconds >= HELD_BACK_SHOWN_AFTER_SECS),
            Err(e) => {
                tracing::debug!(error = %e, "could not look for a transaction holding the relay back");
                return;
            }
        };
        m::outbox_held_back(found.as_ref().map_or(0.0, |h| h.age_seconds));
        match &found {
            Some(h) => {
                let what = format!("{:?}:{}", h.database, h.pid);
                if let Some(o) = self.held_back_log.occurred(repeats::BACKEND, &what) {
                    tracing::warn!(
                        database = h.database.as_deref().unwrap_or("?"),
                        pid = h.pid,
                        state = h.state.as_deref().unwrap_or("?"),
                        age_seconds = h.age_seconds.round(),
                        repeated = o.repeated,
                        "claim events wait for an open transaction of the PostgreSQL server \
                         (it holds pg_snapshot_xmin back); end it, e.g. \
                         SELECT pg_terminate_backend(pid)"
                    );
                }
            }
            None => {
                if let Some(end) = self.held_back_log.clear(repeats::BACKEND) {
                    repeats::ended(
                        repeats::BACKEND,
                        end,
                        "claim events flow again: the transaction holding them back ended",
                    );
                }
            }
        }
        self.status.set_held_back(found);
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
