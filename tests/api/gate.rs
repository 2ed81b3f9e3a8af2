//! A gate on a table's writes, for tests that must hold one writer's statement while another
//! runs: a row trigger waits on an advisory lock the test holds (taken shared by the trigger,
//! so it waits only while the gate is closed). The order is the test's, with no sleep.

use sqlx::pool::PoolConnection;
use sqlx::{PgPool, Postgres};

pub struct RowGate {
    key: i64,
    holder: PoolConnection<Postgres>,
}

impl RowGate {
    /// Installs trigger `name` (`timing`, e.g. "BEFORE INSERT ON waitlist", for rows where
    /// `when`) and closes the gate: such writes wait until [`RowGate::open`].
    pub async fn close(db: &PgPool, name: &str, timing: &str, when: &str, key: i64) -> Self {
        // The names and the condition are the test's own constants.
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "CREATE FUNCTION {name}() RETURNS trigger AS $$
             BEGIN PERFORM pg_advisory_xact_lock_shared({key}); RETURN NEW; END $$
             LANGUAGE plpgsql;
             CREATE TRIGGER {name} {timing}
               FOR EACH ROW WHEN ({when}) EXECUTE FUNCTION {name}();"
        )))
        .execute(db)
        .await
        .unwrap();
        let mut holder = db.acquire().await.unwrap();
        sqlx::query("SELECT pg_advisory_lock($1)")
            .bind(key)
            .execute(&mut *holder)
            .await
            .unwrap();
        RowGate { key, holder }
    }

    /// Whether a write waits at the gate now.
    pub async fn holds_one(&self, db: &PgPool) -> bool {
        sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
                              AND objid = $1)",
        )
        .bind(self.key as i32)
        .fetch_one(db)
        .await
        .unwrap()
    }

    /// Lets every write through, now and later.
    pub async fn open(mut self) {
        sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(self.key)
            .execute(&mut *self.holder)
            .await
            .unwrap();
    }
}
