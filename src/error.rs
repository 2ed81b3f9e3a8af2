//! Infrastructure errors, one enum per boundary: Redis ([`StoreError`]), PostgreSQL
//! ([`DbError`]), a background task's pass ([`TaskError`]), an operator action
//! ([`InventoryError`]). Business outcomes (sold out, limit reached,
//! replay) are not here: they are values of [`crate::scripts::Decision`]. An operator's request
//! (declare, restock, restore, the SKU view) may also be refused for a business reason: a
//! [`Refusal`], carried by [`InventoryError`] with the infrastructure errors of that boundary.

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
        } else if matches!(
            e.kind(),
            redis::ErrorKind::Server(_) | redis::ErrorKind::Extension
        ) {
            // An error reply is an answer, whether or not the client knows its code
            // (`Extension`: NOGROUP of a stream Redis lost, a script's own error codes).
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

    /// Whether the failure is about the SKU's state (lost, stale), not about Redis itself:
    /// other SKUs on the same Redis are fine, and a restore of this one is what it needs.
    pub fn is_about_sku(&self) -> bool {
        matches!(self, StoreError::SkuLost | StoreError::Stale)
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

/// What a PostgreSQL failure says about the statement that met it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DbFailure {
    /// The database could not be reached or could not run the statement now (connection lost,
    /// serialization failure or deadlock, out of resources, a lock or statement timeout, an
    /// operator cancelling or shutting down): the same statement may succeed later, and the
    /// rows in it say nothing about why it failed.
    Transient,
    /// The database refused these rows (a data exception, an integrity constraint, a trigger
    /// raising): only then does a claim spend one of its attempts.
    RowRefused,
    /// Anything else (a missing table, a permission, a bug): not the rows' fault, and not
    /// known to pass by itself.
    Other,
}

/// Classifies a SQLSTATE (PostgreSQL's error code, appendix A of its manual) by class (the
/// first two characters), with the one code of class 55 that is about waiting.
pub fn classify_sqlstate(code: &str) -> DbFailure {
    match code.get(..2).unwrap_or("") {
        // 08 connection exception, 40 transaction rollback (40001 serialization failure,
        // 40P01 deadlock), 53 insufficient resources, 57 operator intervention (57014 query
        // cancelled by statement_timeout, 57P01 admin shutdown, 57P03 cannot connect now).
        "08" | "40" | "53" | "57" => DbFailure::Transient,
        // 55P03 lock not available (lock_timeout, NOWAIT).
        "55" if code == "55P03" => DbFailure::Transient,
        // 22 data exception (a NUL byte in text, a value out of range), 23 integrity
        // constraint violation.
        "22" | "23" => DbFailure::RowRefused,
        // P0001 raise_exception: a trigger refusing the row.
        _ if code == "P0001" => DbFailure::RowRefused,
        _ => DbFailure::Other,
    }
}

impl DbError {
    /// The class of this failure: by SQLSTATE when the database answered, else by how the
    /// client failed.
    pub fn failure(&self) -> DbFailure {
        let DbError::Sqlx(e) = self;
        match e {
            sqlx::Error::Database(d) => d
                .code()
                .map_or(DbFailure::Other, |code| classify_sqlstate(&code)),
            sqlx::Error::Io(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed
            | sqlx::Error::Protocol(_)
            | sqlx::Error::Tls(_) => DbFailure::Transient,
            _ => DbFailure::Other,
        }
    }

    /// Whether the same statement may succeed later without anything changing in its rows
    /// (retry it; never count it against a claim).
    pub fn is_retryable(&self) -> bool {
        self.failure() == DbFailure::Transient
    }

    /// Whether the database refused the rows themselves (a claim spends an attempt).
    pub fn refuses_row(&self) -> bool {
        self.failure() == DbFailure::RowRefused
    }

    /// The SQLSTATE, when the database answered with one.
    pub fn sqlstate(&self) -> Option<String> {
        let DbError::Sqlx(e) = self;
        e.as_database_error()
            .and_then(|d| d.code())
            .map(|c| c.into_owned())
    }
}

/// An operator request refused for a business reason (409/404), not a fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    UnknownSku,
    /// Declared again with another total.
    SkuExists,
    /// The delta would take the remaining stock below 0.
    InsufficientStock,
    /// Restore asked while Redis still holds the SKU's state, or a new catalog row whose id
    /// Redis already holds a state for (never adopt stock nobody declared here).
    StatePresent,
    /// The SKU view while an operator action (a restore) holds the SKU's state away from
    /// Redis for longer than the view waits: said so, never shown as a lost state.
    OperatorBusy,
}

#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    #[error("refused: {0:?}")]
    Refused(Refusal),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Db(#[from] DbError),
}

impl From<sqlx::Error> for InventoryError {
    fn from(e: sqlx::Error) -> Self {
        InventoryError::Db(DbError::from(e))
    }
}

/// A background task's pass failed on Redis or PostgreSQL (the writer, the reprocessor, the
/// upkeep, the freshness refresh, the shards' recovery): the one error of that boundary. Every
/// task logs it and tries the pass again on its next round; nothing it had decided is lost.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Db(#[from] DbError),
}

impl TaskError {
    /// Whether the failure is about one SKU's Redis state only (lost, stale), not about a
    /// backend every SKU shares.
    pub fn is_about_sku(&self) -> bool {
        matches!(self, TaskError::Store(e) if e.is_about_sku())
    }
}

impl From<sqlx::Error> for TaskError {
    fn from(e: sqlx::Error) -> Self {
        TaskError::Db(DbError::from(e))
    }
}

#[cfg(test)]
mod tests {
    use super::{classify_sqlstate, DbFailure, StoreError};

    #[test]
    fn an_error_reply_with_a_code_the_client_does_not_know_is_an_answer() {
        // What XREADGROUP answers for a stream Redis lost: it ran, and said so.
        let nogroup = redis::make_extension_error(
            "NOGROUP".into(),
            Some("No such key 'dg:{s}:journal' or consumer group 'writers'".into()),
        );
        let e = StoreError::from(nogroup);
        assert!(!e.is_uncertain(), "{e:?}");
        assert!(matches!(&e, StoreError::Redis(r) if r.code() == Some("NOGROUP")));
    }

    #[test]
    fn waiting_and_unreachable_are_transient_and_only_row_faults_refuse_rows() {
        for code in [
            "08006", "40001", "40P01", "53300", "55P03", "57014", "57P01",
        ] {
            assert_eq!(classify_sqlstate(code), DbFailure::Transient, "{code}");
        }
        for code in ["22021", "22001", "23505", "23514", "P0001"] {
            assert_eq!(classify_sqlstate(code), DbFailure::RowRefused, "{code}");
        }
        for code in ["42P01", "42501", "55000", "XX000", ""] {
            assert_eq!(classify_sqlstate(code), DbFailure::Other, "{code}");
        }
    }
}
