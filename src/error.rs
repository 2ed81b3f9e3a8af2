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
    /// Redis could not be reached (pool checkout failed, or a batch-mate's call failed).
    #[error("redis unavailable: {0}")]
    Unavailable(String),
    /// A script answered something its header does not allow: a bug, never retried.
    #[error("unexpected script reply: {0}")]
    Protocol(String),
}

impl From<redis::RedisError> for StoreError {
    /// A response timeout inside the client, or a connection that dropped with the call on
    /// it, leaves the outcome unknown like our own timeout does.
    fn from(e: redis::RedisError) -> Self {
        if e.is_timeout() || e.is_connection_dropped() {
            StoreError::Timeout
        } else {
            StoreError::Redis(e)
        }
    }
}

impl StoreError {
    /// Whether the same call may succeed later (a client should retry after a pause).
    pub fn is_retryable(&self) -> bool {
        !matches!(self, StoreError::Protocol(_))
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
