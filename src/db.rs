//! PostgreSQL: connecting, creating the database when missing, applying the migrations.

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgPool};

/// Connections of the writer and reprocessor pool.
const LEDGER_POOL_CONNECTIONS: u32 = 16;
/// Connections of the request path's pool (catalog lookups, claim lookups, admin routes,
/// readiness): kept apart so that no request flood can take a connection the writer needs.
const REQUEST_POOL_CONNECTIONS: u32 = 8;
/// A claim never waits on PostgreSQL; admin and background callers get a bounded wait.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);

/// Opens a pool on `url`, creating the database first when it does not exist, and applies the
/// migrations in `migrations/`. This is the writer's (and reprocessor's) pool.
///
/// # Errors
/// Connection or migration failures, with context.
pub async fn connect_and_migrate(url: &str) -> anyhow::Result<PgPool> {
    let options = PgConnectOptions::from_str(url)?;
    create_database_if_missing(&options).await?;
    let pool = PgPoolOptions::new()
        .max_connections(LEDGER_POOL_CONNECTIONS)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .connect_with(options.application_name("dropgate-ledger"))
        .await?;
    migrate(&pool).await?;
    Ok(pool)
}

/// The request path's pool on `url` (after [`connect_and_migrate`] made the database).
/// Connections open on first use.
///
/// # Errors
/// An unparsable URL.
pub fn request_pool(url: &str) -> anyhow::Result<PgPool> {
    let options = PgConnectOptions::from_str(url)?.application_name("dropgate-requests");
    Ok(PgPoolOptions::new()
        .max_connections(REQUEST_POOL_CONNECTIONS)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .connect_lazy_with(options))
}

/// Applies the embedded migrations.
///
/// # Errors
/// The migration failure.
pub async fn migrate(pool: &PgPool) -> anyhow::Result<()> {
    sqlx::migrate!("./migrations").run(pool).await?;
    Ok(())
}

async fn create_database_if_missing(options: &PgConnectOptions) -> anyhow::Result<()> {
    let name = options
        .get_database()
        .unwrap_or_else(|| options.get_username())
        .to_string();
    let mut admin = options.clone().database("postgres").connect().await?;
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(&name)
            .fetch_one(&mut admin)
            .await?;
    if !exists {
        let sql = format!("CREATE DATABASE \"{}\"", name.replace('"', "\"\""));
        // Two gateways starting together may race here; the loser's duplicate error is fine.
        if let Err(e) = sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&mut admin)
            .await
        {
            let dup = e
                .as_database_error()
                .and_then(|d| d.code())
                .is_some_and(|c| c == "42P04" || c == "23505");
            if !dup {
                return Err(e.into());
            }
        }
    }
    admin.close().await?;
    Ok(())
}
