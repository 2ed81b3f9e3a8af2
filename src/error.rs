//! Infrastructure errors, one enum per boundary. Business outcomes (sold out, limit reached,
//! replay) are not here: they are values of [`crate::scripts::Decision`].

/// A failure talking to Redis, or Redis answering that it no longer holds a SKU.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No answer came (the call timed out, or the connection dropped after it may have been
    /// sent): its effect is unknown and must be read back, never assumed.
    #[error("redis call got no answer")]
    Timeout,
    #[error("redis: {0}")]
    Redis(redis::RedisError),
    /// The SKU's state hash is missing: Redis restarted empty or the key was deleted.
    #[error("redis holds no state for this SKU")]
    SkuLost,
    /// The SKU's state is older than what PostgreSQL recorded (Redis came back from an older
    /// snapshot, or a lagging replica took over): closed until restore.
    #[error("redis holds a stale state for this SKU; restore it")]
    Stale,
    /// A claim's call was sent and no answer came, and reading it back did not answer either:
    /// it may still win. A background settler keeps reading until it knows.
    #[error("the outcome of claim {0} is not known yet")]
    OutcomeUnknown(uuid::Uuid),
    /// Redis could not be reached (pool checkout failed, or a batch-mate's call failed).
    #[error("redis unavailable: {0}")]
    Unavailable(String),
    /// A script answered something its header does not allow: a bug, never retried.
    #[error("unexpected script reply: {0}")]
    Protocol(String),
}

impl From<redis::RedisError> for StoreError {
    /// Only two failures are definite: Redis answered with an error (the call ran, or was
    /// refused, and said so), or the connection could not be opened (nothing was sent). Any
    /// other client-side failure may come after the request left (a timeout, a dropped
    /// connection, a reply that could not be parsed), so its outcome is unknown and must be
    /// read back, never assumed.
    fn from(e: redis::RedisError) -> Self {
        if e.is_connection_refusal() {
            StoreError::Unavailable(e.to_string())
        } else if matches!(e.kind(), redis::ErrorKind::Server(_)) {
            StoreError::Redis(e)
        } else if e.kind() == redis::ErrorKind::UnexpectedReturnType {
            StoreError::Protocol(e.to_string())
        } else {
            StoreError::Timeout
        }
    }
}

impl StoreError {
    /// Whether the same call may succeed later (a client should retry after a pause).
    pub fn is_retryable(&self) -> bool {
        !matches!(self, StoreError::Protocol(_))
    }

    /// Whether the call may have taken effect: its outcome must be read back.
    pub fn is_uncertain(&self) -> bool {
        matches!(self, StoreError::Timeout | StoreError::OutcomeUnknown(_))
    }
}

/// A failure talking to PostgreSQL.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("postgres: {0}")]
    Sqlx(#[from] sqlx::Error),
}

impl DbError {
    /// Whether the failure is about reaching the database (retry later) rather than about the
    /// statement (the database refused this row).
    pub fn is_retryable(&self) -> bool {
        let DbError::Sqlx(e) = self;
        matches!(
            e,
            sqlx::Error::Io(_)
                | sqlx::Error::PoolTimedOut
                | sqlx::Error::PoolClosed
                | sqlx::Error::WorkerCrashed
                | sqlx::Error::Protocol(_)
                | sqlx::Error::Tls(_)
        )
    }
}
