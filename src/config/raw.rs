//! The command line and environment of `serve`: every flag with its variable, unit and
//! default, as `--help` shows them. Values stay strings here; [`RawConfig::validate`] checks
//! them all at once. No value of a secret (a token, a password in a URL) is ever shown:
//! `hide_env_values` on every variable that may carry one.

use super::*;

const NET: &str = "Network";
const REDIS: &str = "Redis";
const PG: &str = "PostgreSQL";
const AUTH: &str = "Identity";
const LEDGER: &str = "Ledger writer";
const LIMITS: &str = "Limits";
const EVENTS: &str = "Claim events (NATS JetStream)";

/// The raw values as clap read them from flags and the environment.
#[derive(Debug, Clone, clap::Args)]
pub struct RawConfig {
    /// HTTP listen address: an IP address and port (`localhost` means 127.0.0.1; `:0` picks a
    /// free port of 127.0.0.1, and the address chosen is logged)
    #[arg(long, env = ENV_LISTEN, default_value = DEFAULT_LISTEN, help_heading = NET)]
    pub listen: String,
    /// Redis URL; several comma-separated URLs are the seed nodes of a Redis Cluster
    #[arg(long, env = ENV_REDIS_URL, default_value = DEFAULT_REDIS_URL, hide_env_values = true, help_heading = REDIS)]
    pub redis_url: String,
    /// Replicas that must acknowledge each decision (WAIT) before it is answered: a number,
    /// or `auto` (1 on a cluster, 0 on a single Redis)
    #[arg(long, env = ENV_REDIS_WAIT_REPLICAS, default_value = DEFAULT_REDIS_WAIT_REPLICAS, help_heading = REDIS)]
    pub redis_wait_replicas: String,
    /// Milliseconds the replicas' acknowledgement may take; past it a win is answered 503
    /// outcome_unknown and settled by reading
    #[arg(long, env = ENV_REDIS_WAIT_MS, default_value = DEFAULT_REDIS_WAIT_MS, help_heading = REDIS)]
    pub redis_wait_ms: String,
    /// PostgreSQL URL (the database is created when missing, and migrated, at start)
    #[arg(long, env = ENV_DATABASE_URL, default_value = DEFAULT_DATABASE_URL, hide_env_values = true, help_heading = PG)]
    pub database_url: String,
    /// Prefix of every Redis key, so several gateways or test runs can share one Redis
    #[arg(long, env = ENV_KEY_PREFIX, default_value = DEFAULT_KEY_PREFIX, help_heading = REDIS)]
    pub key_prefix: String,
    /// HS256 secret(s) of admission tokens, at least 16 bytes each; several (a rotation) are
    /// comma-separated, each optionally kid=secret, and the first signs [required]
    #[arg(long, env = ENV_ADMISSION_SECRET, hide_env_values = true, help_heading = AUTH)]
    pub admission_secret: Option<String>,
    /// Bearer token of the admin routes, at least 16 bytes [default: none: admin routes
    /// answer 401]
    #[arg(long, env = ENV_ADMIN_TOKEN, hide_env_values = true, help_heading = AUTH)]
    pub admin_token: Option<String>,
    /// Attempts at writing a claim PostgreSQL refused before its units are given back
    #[arg(long, env = ENV_REPROCESS_MAX_ATTEMPTS, default_value = DEFAULT_REPROCESS_MAX_ATTEMPTS, help_heading = LEDGER)]
    pub reprocess_max_attempts: String,
    /// Milliseconds before the first retry of a refused claim; doubles per attempt, capped
    /// at 60 s
    #[arg(long, env = ENV_REPROCESS_BACKOFF_MS, default_value = DEFAULT_REPROCESS_BACKOFF_MS, help_heading = LEDGER)]
    pub reprocess_backoff_ms: String,
    /// Milliseconds a journal entry may stay unacknowledged before another gateway takes it
    /// over from a presumed dead one
    #[arg(long, env = ENV_JOURNAL_CLAIM_IDLE_MS, default_value = DEFAULT_JOURNAL_CLAIM_IDLE_MS, help_heading = LEDGER)]
    pub journal_claim_idle_ms: String,
    /// Milliseconds one Redis call may take; past it its outcome is read back, never
    /// assumed
    #[arg(long, env = ENV_REDIS_TIMEOUT_MS, default_value = DEFAULT_REDIS_TIMEOUT_MS, help_heading = REDIS)]
    pub redis_timeout_ms: String,
    /// Milliseconds after SIGTERM for in-flight requests and the writer's last flush
    #[arg(long, env = ENV_SHUTDOWN_GRACE_MS, default_value = DEFAULT_SHUTDOWN_GRACE_MS, help_heading = NET)]
    pub shutdown_grace_ms: String,
    /// 1: claims queued on one SKU are decided together in one Redis call; 0: one call per
    /// claim (for side-by-side benchmarks)
    #[arg(long, env = ENV_COALESCE, default_value = DEFAULT_COALESCE, help_heading = LIMITS)]
    pub coalesce: String,
    /// Claims allowed to wait on one SKU; beyond it claims are shed with 429 overloaded
    #[arg(long, env = ENV_MAX_QUEUE, default_value = DEFAULT_MAX_QUEUE, help_heading = LIMITS)]
    pub max_queue: String,
    /// Open connections served at once; beyond it a new connection is answered 503 and
    /// closed (keep the file-descriptor limit above it)
    #[arg(long, env = ENV_MAX_CONNECTIONS, default_value = DEFAULT_MAX_CONNECTIONS, help_heading = LIMITS)]
    pub max_connections: String,
    /// Milliseconds between refreshes of the per-SKU gauges and the backends' up gauges
    #[arg(long, env = ENV_SKU_GAUGES_INTERVAL_MS, default_value = DEFAULT_SKU_GAUGES_INTERVAL_MS, help_heading = LIMITS)]
    pub sku_gauges_interval_ms: String,
    /// Milliseconds a sold-out read of Redis may answer claims from memory (0: never)
    #[arg(long, env = ENV_SOLD_OUT_TRUST_MS, default_value = DEFAULT_SOLD_OUT_TRUST_MS, help_heading = LIMITS)]
    pub sold_out_trust_ms: String,
    /// NATS server(s) of the claim events, nats:// or tls://, comma-separated [default:
    /// none: events wait in the outbox table]
    #[arg(long, env = ENV_NATS_URL, hide_env_values = true, help_heading = EVENTS)]
    pub nats_url: Option<String>,
    /// JetStream stream of the claim events (created at start when missing)
    #[arg(long, env = ENV_NATS_STREAM, default_value = DEFAULT_NATS_STREAM, help_heading = EVENTS)]
    pub nats_stream: String,
    /// First token(s) of every event subject: <prefix>.<sku>.<event>
    #[arg(long, env = ENV_NATS_SUBJECT_PREFIX, default_value = DEFAULT_NATS_SUBJECT_PREFIX, help_heading = EVENTS)]
    pub nats_subject_prefix: String,
    /// Seconds of the duplicate window of a stream the gateway creates (an existing stream
    /// keeps its own)
    #[arg(long, env = ENV_NATS_DUPLICATE_WINDOW_SECS, default_value = DEFAULT_NATS_DUPLICATE_WINDOW_SECS, help_heading = EVENTS)]
    pub nats_duplicate_window_secs: String,
    /// Seconds sent events stay in the outbox table before the relay deletes them
    #[arg(long, env = ENV_OUTBOX_RETENTION_SECS, default_value = DEFAULT_OUTBOX_RETENTION_SECS, help_heading = EVENTS)]
    pub outbox_retention_secs: String,
    /// A JWKS file of an identity provider's public keys (EdDSA, ES256, RS256) that tokens
    /// may be signed with besides the secrets; re-read when it changes [default: none]
    #[arg(long, env = ENV_ADMISSION_JWKS, help_heading = AUTH)]
    pub admission_jwks: Option<String>,
    /// The `aud` every token must carry [default: none: aud is not checked]
    #[arg(long, env = ENV_TOKEN_AUDIENCE, help_heading = AUTH)]
    pub token_audience: Option<String>,
    /// The `iss` every token must carry [default: none: iss is not checked]
    #[arg(long, env = ENV_TOKEN_ISSUER, help_heading = AUTH)]
    pub token_issuer: Option<String>,
}

/// Where the data lives: the only settings of the commands that read a gateway's data
/// (`reconcile`) or run one of their own (`demo`).
#[derive(Debug, Clone, clap::Args)]
pub struct StoreArgs {
    /// Redis URL; several comma-separated URLs are the seed nodes of a Redis Cluster
    #[arg(long, env = ENV_REDIS_URL, default_value = DEFAULT_REDIS_URL, hide_env_values = true)]
    pub redis_url: String,
    /// PostgreSQL URL
    #[arg(long, env = ENV_DATABASE_URL, default_value = DEFAULT_DATABASE_URL, hide_env_values = true)]
    pub database_url: String,
    /// Prefix of every Redis key (the gateways' DROPGATE_KEY_PREFIX)
    #[arg(long, env = ENV_KEY_PREFIX, default_value = DEFAULT_KEY_PREFIX)]
    pub key_prefix: String,
}

impl StoreArgs {
    /// A gateway's configuration with these stores and every other value at its default.
    pub fn into_raw(self) -> RawConfig {
        RawConfig {
            redis_url: self.redis_url,
            database_url: self.database_url,
            key_prefix: self.key_prefix,
            ..RawConfig::default()
        }
    }
}

impl Default for RawConfig {
    fn default() -> Self {
        RawConfig {
            listen: DEFAULT_LISTEN.into(),
            redis_url: DEFAULT_REDIS_URL.into(),
            redis_wait_replicas: DEFAULT_REDIS_WAIT_REPLICAS.into(),
            redis_wait_ms: DEFAULT_REDIS_WAIT_MS.into(),
            database_url: DEFAULT_DATABASE_URL.into(),
            key_prefix: DEFAULT_KEY_PREFIX.into(),
            admission_secret: None,
            admin_token: None,
            reprocess_max_attempts: DEFAULT_REPROCESS_MAX_ATTEMPTS.into(),
            reprocess_backoff_ms: DEFAULT_REPROCESS_BACKOFF_MS.into(),
            journal_claim_idle_ms: DEFAULT_JOURNAL_CLAIM_IDLE_MS.into(),
            redis_timeout_ms: DEFAULT_REDIS_TIMEOUT_MS.into(),
            shutdown_grace_ms: DEFAULT_SHUTDOWN_GRACE_MS.into(),
            coalesce: DEFAULT_COALESCE.into(),
            max_queue: DEFAULT_MAX_QUEUE.into(),
            max_connections: DEFAULT_MAX_CONNECTIONS.into(),
            sku_gauges_interval_ms: DEFAULT_SKU_GAUGES_INTERVAL_MS.into(),
            sold_out_trust_ms: DEFAULT_SOLD_OUT_TRUST_MS.into(),
            nats_url: None,
            nats_stream: DEFAULT_NATS_STREAM.into(),
            nats_subject_prefix: DEFAULT_NATS_SUBJECT_PREFIX.into(),
            nats_duplicate_window_secs: DEFAULT_NATS_DUPLICATE_WINDOW_SECS.into(),
            outbox_retention_secs: DEFAULT_OUTBOX_RETENTION_SECS.into(),
            admission_jwks: None,
            token_audience: None,
            token_issuer: None,
        }
    }
}
