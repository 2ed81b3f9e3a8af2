//! Configuration: every variable of API.md, its default, and the checks that run before start.
//!
//! Values arrive through clap (flag or environment variable) as raw strings and are validated
//! here all at once, so an operator sees every mistake in one run instead of one per restart.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

pub const ENV_LISTEN: &str = "DROPGATE_LISTEN";
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
pub const ENV_REDIS_URL: &str = "REDIS_URL";
pub const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379";
pub const ENV_REDIS_WAIT_REPLICAS: &str = "DROPGATE_REDIS_WAIT_REPLICAS";
/// `auto`: 1 on a cluster (every master is expected to have a replica), 0 on a single Redis.
pub const DEFAULT_REDIS_WAIT_REPLICAS: &str = "auto";
pub const ENV_REDIS_WAIT_MS: &str = "DROPGATE_REDIS_WAIT_MS";
pub const DEFAULT_REDIS_WAIT_MS: &str = "200";
pub const ENV_DATABASE_URL: &str = "DATABASE_URL";
pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/dropgate";
pub const ENV_KEY_PREFIX: &str = "DROPGATE_KEY_PREFIX";
pub const DEFAULT_KEY_PREFIX: &str = "dg";
pub const ENV_ADMISSION_SECRET: &str = "DROPGATE_ADMISSION_SECRET";
pub const ENV_ADMIN_TOKEN: &str = "DROPGATE_ADMIN_TOKEN";
/// A JWKS file of an identity provider's public keys (EdDSA, ES256, RS256); re-read when it
/// changes. No default: HS256 secrets only.
pub const ENV_ADMISSION_JWKS: &str = "DROPGATE_ADMISSION_JWKS";
/// When set, every token must carry this `aud`; unset, `aud` is not checked.
pub const ENV_TOKEN_AUDIENCE: &str = "DROPGATE_TOKEN_AUDIENCE";
/// When set, every token must carry this `iss`; unset, `iss` is not checked.
pub const ENV_TOKEN_ISSUER: &str = "DROPGATE_TOKEN_ISSUER";
pub const ENV_REPROCESS_MAX_ATTEMPTS: &str = "DROPGATE_REPROCESS_MAX_ATTEMPTS";
pub const DEFAULT_REPROCESS_MAX_ATTEMPTS: &str = "5";
pub const ENV_REPROCESS_BACKOFF_MS: &str = "DROPGATE_REPROCESS_BACKOFF_MS";
pub const DEFAULT_REPROCESS_BACKOFF_MS: &str = "1000";
/// How long a journal entry may sit unacknowledged with a consumer before another gateway takes
/// it over (the consumer is presumed dead).
pub const ENV_JOURNAL_CLAIM_IDLE_MS: &str = "DROPGATE_JOURNAL_CLAIM_IDLE_MS";
pub const DEFAULT_JOURNAL_CLAIM_IDLE_MS: &str = "5000";
/// Upper bound of one Redis decision; past it the outcome is resolved by reading.
pub const ENV_REDIS_TIMEOUT_MS: &str = "DROPGATE_REDIS_TIMEOUT_MS";
pub const DEFAULT_REDIS_TIMEOUT_MS: &str = "250";
/// How long `serve` waits for in-flight requests and the writer's flush after SIGTERM.
pub const ENV_SHUTDOWN_GRACE_MS: &str = "DROPGATE_SHUTDOWN_GRACE_MS";
pub const DEFAULT_SHUTDOWN_GRACE_MS: &str = "10000";

/// "0" decides every claim in its own script call (for side-by-side benchmarks); otherwise
/// claims that queue on one SKU while a call is in flight are decided together.
pub const ENV_COALESCE: &str = "DROPGATE_COALESCE";
pub const DEFAULT_COALESCE: &str = "1";
/// Claims allowed to wait on one SKU; past it the gateway sheds load (429 `overloaded`)
/// instead of letting latency grow without bound.
pub const ENV_MAX_QUEUE: &str = "DROPGATE_MAX_QUEUE";
pub const DEFAULT_MAX_QUEUE: &str = "4096";
/// Open connections served at once; a connection beyond it is answered 503 at once and
/// closed, so a connection flood costs a file descriptor and one write, not a task each.
pub const ENV_MAX_CONNECTIONS: &str = "DROPGATE_MAX_CONNECTIONS";
pub const DEFAULT_MAX_CONNECTIONS: &str = "10000";
/// How often the per-SKU gauges (`dropgate_sku_*`) and the backends' `_up` gauges are
/// refreshed; each round reads at most [`crate::observe::SKUS_PER_ROUND`] SKU views.
pub const ENV_SOLD_OUT_TRUST_MS: &str = "DROPGATE_SOLD_OUT_TRUST_MS";
pub const DEFAULT_SOLD_OUT_TRUST_MS: &str = "100";
pub const ENV_SKU_GAUGES_INTERVAL_MS: &str = "DROPGATE_SKU_GAUGES_INTERVAL_MS";
pub const DEFAULT_SKU_GAUGES_INTERVAL_MS: &str = "5000";
/// "1" writes log lines as JSON (one object per line) for a log shipper. Read by `main.rs`
/// before a subcommand parses its configuration: logging is set up first, for every
/// subcommand.
pub const ENV_LOG_JSON: &str = "DROPGATE_LOG_JSON";

/// NATS server(s) the outbox relay publishes claim events to (comma-separated URLs). No
/// default: without it no event is published, the outbox still fills and its backlog shows in
/// `/readyz` and `/metrics`, so setting it later loses nothing.
pub const ENV_NATS_URL: &str = "DROPGATE_NATS_URL";
/// The JetStream stream of the claim events; created at start when missing.
pub const ENV_NATS_STREAM: &str = "DROPGATE_NATS_STREAM";
pub const DEFAULT_NATS_STREAM: &str = "DROPGATE";
/// First token(s) of every event subject: `<prefix>.<sku>.<event>`.
pub const ENV_NATS_SUBJECT_PREFIX: &str = "DROPGATE_NATS_SUBJECT_PREFIX";
pub const DEFAULT_NATS_SUBJECT_PREFIX: &str = "dropgate";
/// JetStream's duplicate window of a stream the gateway creates: a publish repeated within it
/// (a relay taking over an event another relay published and could not mark sent) is dropped
/// by its `Nats-Msg-Id`. Far longer than a relay lease; an existing stream keeps its own.
pub const ENV_NATS_DUPLICATE_WINDOW_SECS: &str = "DROPGATE_NATS_DUPLICATE_WINDOW_SECS";
pub const DEFAULT_NATS_DUPLICATE_WINDOW_SECS: &str = "600";
/// How long sent events stay in the `outbox` table (for an operator's inspection or replay)
/// before the relay deletes them.
pub const ENV_OUTBOX_RETENTION_SECS: &str = "DROPGATE_OUTBOX_RETENTION_SECS";
pub const DEFAULT_OUTBOX_RETENTION_SECS: &str = "86400";
/// `dropgate events tail` is a developer's example consumer: it defaults to the local server.
pub const DEFAULT_TAIL_NATS_URL: &str = "nats://127.0.0.1:4222";

/// Backoff never grows past this, whatever the attempt count.
pub const REPROCESS_BACKOFF_CAP: Duration = Duration::from_secs(60);
/// Idempotency records live at least this long (API.md: at least 24 h).
pub const RECORD_TTL_SECS: u64 = 26 * 3600;
/// Call records (and fences) only settle outcomes a Redis call left unknown, seconds after
/// the call; an hour outlives any call still queued on a connection by far.
pub const CLAIM_RECORD_TTL_SECS: u64 = 3600;
/// Request bodies larger than this are refused with 413.
pub const MAX_BODY_BYTES: usize = 16 * 1024;
/// The operators' routes take up to this (API.md: a seated venue's plan in one declare).
pub const MAX_ADMIN_BODY_BYTES: usize = 1024 * 1024;
/// The listening socket's queue of connections not yet accepted (the kernel caps it at
/// `net.core.somaxconn`, 4096 by default). tokio's `TcpListener::bind` asks for 128, as std
/// does: when a drop opens, a burst of new connections overflows that queue within
/// milliseconds, and each dropped SYN costs its buyer a retransmission one second later
/// (loadtest/conns.py: 9,000 connections took 13.8 s to open instead of 0.7 s).
pub const LISTEN_BACKLOG: u32 = 4096;
/// A client that has not sent its headers within this time is disconnected (slowloris). hyper
/// restarts this timer when a kept-alive connection goes idle: it is the idle timeout too.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// A request's whole body must arrive within this time after its headers: 408, then closed.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// The request line and headers together; beyond it hyper answers 431.
pub const MAX_HEADER_BYTES: usize = 16 * 1024;
/// hyper's read buffer per connection (its default is ~400 KiB): room for one whole request,
/// so 10 000 connections cannot pin gigabytes of buffers.
pub const MAX_CONNECTION_BUFFER_BYTES: usize = MAX_HEADER_BYTES + MAX_BODY_BYTES;
/// How long a connection past the bound may take to read its 503 before it is dropped.
pub const REFUSAL_LINGER: Duration = Duration::from_secs(1);
/// Shortest admission secret and admin token accepted.
pub const MIN_SECRET_BYTES: usize = 16;

/// A value that must never reach a log line.
#[derive(Clone)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

mod checks;
mod raw;
#[cfg(test)]
mod tests;
mod tokens;

pub use tokens::{
    admission_keys, check_jwks_file, parse_jwks, HmacKey, PublicKey, TokenConfig, PUBLIC_ALGORITHMS,
};

pub use checks::{admission_secret, check_stream_name, check_subject_prefix};
use checks::{check_nats_url, parse_listen};
pub use raw::{RawConfig, StoreArgs};

/// Validated configuration of a gateway.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    /// One URL, or several comma-separated: a Redis Cluster.
    pub redis_url: String,
    /// Replicas that must acknowledge a decision before a win is answered (`WAIT`); 0: none.
    pub redis_wait_replicas: usize,
    /// How long a decision waits for those acknowledgements before its outcome counts as
    /// unknown (answered 503 `outcome_unknown`, then settled by reading).
    pub redis_wait: Duration,
    pub database_url: String,
    pub key_prefix: String,
    /// The secret of what the gateway signs (the first of [`TokenConfig::keys`]).
    pub admission_secret: Secret,
    pub admin_token: Option<Secret>,
    pub reprocess_max_attempts: u32,
    pub reprocess_backoff: Duration,
    pub journal_claim_idle: Duration,
    pub redis_timeout: Duration,
    pub shutdown_grace: Duration,
    pub coalesce: bool,
    pub max_queue: usize,
    pub max_connections: usize,
    pub sku_gauges_interval: Duration,
    /// How long a sold-out read from Redis answers claims from memory (0: never; see
    /// `soldout.rs`).
    pub sold_out_trust: Duration,
    /// Where claim events go; `None`: nowhere yet (the outbox fills).
    pub nats: Option<NatsConfig>,
    /// Sent events are deleted from `outbox` after this long.
    pub outbox_retention: Duration,
    /// Every key and check of tokens (rotation, JWKS, audience, issuer).
    pub tokens: TokenConfig,
}

/// The JetStream target of the outbox relay.
#[derive(Debug, Clone)]
pub struct NatsConfig {
    /// May carry credentials (`nats://user:pass@host`), so it never prints.
    pub url: Secret,
    pub stream: String,
    pub subject_prefix: String,
    pub duplicate_window: Duration,
}

/// Every problem found in one pass over the configuration.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration:\n  - {}", .0.join("\n  - "))]
pub struct ConfigErrors(pub Vec<String>);

impl RawConfig {
    /// Validates every value and reports all problems at once.
    ///
    /// # Errors
    /// [`ConfigErrors`] listing each invalid or missing value.
    pub fn validate(&self) -> Result<Config, ConfigErrors> {
        let mut errors = Vec::new();
        // Named as the operator gave it: clap prefers the flag, so a value other than the
        // environment's came from `--listen`.
        let listen_source = if std::env::var(ENV_LISTEN).ok().as_deref() == Some(&self.listen) {
            format!("{ENV_LISTEN}={:?}", self.listen)
        } else {
            format!("--listen {:?}", self.listen)
        };
        let listen = parse_listen(&self.listen)
            .map_err(|e| errors.push(format!("{listen_source}: {e}")))
            .ok();
        let redis_urls: Vec<&str> = self.redis_url.split(',').map(str::trim).collect();
        if redis_urls
            .iter()
            .any(|u| !(u.starts_with("redis://") || u.starts_with("rediss://")))
        {
            errors.push(format!(
                "{ENV_REDIS_URL}: expected a redis:// URL, or several comma-separated (a cluster)"
            ));
        }
        let cluster = redis_urls.len() > 1;
        let wait_replicas = match self.redis_wait_replicas.trim() {
            "auto" => usize::from(cluster),
            raw => raw
                .parse::<usize>()
                .ok()
                .filter(|n| *n <= 16)
                .unwrap_or_else(|| {
                    errors.push(format!(
                    "{ENV_REDIS_WAIT_REPLICAS}={raw:?}: expected \"auto\" or an integer in 0..=16"
                ));
                    0
                }),
        };
        if !self.database_url.starts_with("postgres://")
            && !self.database_url.starts_with("postgresql://")
        {
            errors.push(format!("{ENV_DATABASE_URL}: expected a postgres:// URL"));
        }
        let prefix_ok = !self.key_prefix.is_empty()
            && self.key_prefix.len() <= 64
            && !self.key_prefix.contains(['{', '}'])
            && self.key_prefix.chars().all(|c| c.is_ascii_graphic());
        if !prefix_ok {
            errors.push(format!(
                "{ENV_KEY_PREFIX}: 1-64 visible ASCII characters without braces"
            ));
        }
        let keys = tokens::admission_keys(self.admission_secret.as_deref())
            .map_err(|e| errors.push(e))
            .ok();
        let tokens = self.token_config(keys, &mut errors);
        let admin_token = match self.admin_token.as_deref() {
            Some(t) if t.len() < MIN_SECRET_BYTES => {
                errors.push(format!(
                    "{ENV_ADMIN_TOKEN}: at least {MIN_SECRET_BYTES} bytes are required"
                ));
                None
            }
            Some(t) => Some(Secret::new(t)),
            None => None,
        };
        let mut num = |name: &str, raw: &str, min: u64, max: u64| -> u64 {
            match raw.parse::<u64>() {
                Ok(v) if (min..=max).contains(&v) => v,
                _ => {
                    errors.push(format!(
                        "{name}={raw:?}: expected an integer in {min}..={max}"
                    ));
                    min
                }
            }
        };
        let max_attempts = num(
            ENV_REPROCESS_MAX_ATTEMPTS,
            &self.reprocess_max_attempts,
            1,
            100,
        );
        let backoff = num(
            ENV_REPROCESS_BACKOFF_MS,
            &self.reprocess_backoff_ms,
            1,
            3_600_000,
        );
        let idle = num(
            ENV_JOURNAL_CLAIM_IDLE_MS,
            &self.journal_claim_idle_ms,
            100,
            3_600_000,
        );
        let redis_timeout = num(ENV_REDIS_TIMEOUT_MS, &self.redis_timeout_ms, 10, 10_000);
        let redis_wait = num(ENV_REDIS_WAIT_MS, &self.redis_wait_ms, 1, 10_000);
        let grace = num(ENV_SHUTDOWN_GRACE_MS, &self.shutdown_grace_ms, 0, 600_000);
        let coalesce = num(ENV_COALESCE, &self.coalesce, 0, 1) == 1;
        let max_queue = num(ENV_MAX_QUEUE, &self.max_queue, 1, 1_000_000);
        let max_connections = num(ENV_MAX_CONNECTIONS, &self.max_connections, 1, 1_000_000);
        let sku_gauges = num(
            ENV_SKU_GAUGES_INTERVAL_MS,
            &self.sku_gauges_interval_ms,
            100,
            3_600_000,
        );
        let sold_out_trust = num(ENV_SOLD_OUT_TRUST_MS, &self.sold_out_trust_ms, 0, 60_000);
        let duplicate_window = num(
            ENV_NATS_DUPLICATE_WINDOW_SECS,
            &self.nats_duplicate_window_secs,
            60,
            86_400,
        );
        let retention = num(
            ENV_OUTBOX_RETENTION_SECS,
            &self.outbox_retention_secs,
            0,
            90 * 86_400,
        );
        if let Some(url) = &self.nats_url {
            if let Err(e) = check_nats_url(url) {
                errors.push(format!("{ENV_NATS_URL}: {e}"));
            }
        }
        if let Err(e) = check_stream_name(&self.nats_stream) {
            errors.push(format!("{ENV_NATS_STREAM}={:?}: {e}", self.nats_stream));
        }
        if let Err(e) = check_subject_prefix(&self.nats_subject_prefix) {
            errors.push(format!(
                "{ENV_NATS_SUBJECT_PREFIX}={:?}: {e}",
                self.nats_subject_prefix
            ));
        }
        match (errors.is_empty(), listen, tokens) {
            (true, Some(listen), Some(tokens)) => Ok(Config {
                listen,
                redis_url: self.redis_url.clone(),
                redis_wait_replicas: wait_replicas,
                redis_wait: Duration::from_millis(redis_wait),
                database_url: self.database_url.clone(),
                key_prefix: self.key_prefix.clone(),
                admission_secret: tokens.signing().secret.clone(),
                admin_token,
                reprocess_max_attempts: max_attempts as u32,
                reprocess_backoff: Duration::from_millis(backoff),
                journal_claim_idle: Duration::from_millis(idle),
                redis_timeout: Duration::from_millis(redis_timeout),
                shutdown_grace: Duration::from_millis(grace),
                coalesce,
                max_queue: max_queue as usize,
                max_connections: max_connections as usize,
                sku_gauges_interval: Duration::from_millis(sku_gauges),
                sold_out_trust: Duration::from_millis(sold_out_trust),
                nats: self.nats_url.as_ref().map(|url| NatsConfig {
                    url: Secret::new(url.as_str()),
                    stream: self.nats_stream.clone(),
                    subject_prefix: self.nats_subject_prefix.clone(),
                    duplicate_window: Duration::from_secs(duplicate_window),
                }),
                outbox_retention: Duration::from_secs(retention),
                tokens,
            }),
            _ => Err(ConfigErrors(errors)),
        }
    }
}
