//! PostgreSQL: connecting, creating the database when missing, applying the migrations; and
//! for the read-only commands, connecting to a database that must already hold this
//! version's schema. Failures are [`Failure`]s: said once, with the URL without its password.

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgPool};

use crate::startup::{Exit, Failure};

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
    let failed = |e: sqlx::Error| Failure::postgres(url, &e);
    let options = PgConnectOptions::from_str(url).map_err(failed)?;
    create_database_if_missing(&options).await.map_err(failed)?;
    let pool = PgPoolOptions::new()
        .max_connections(LEDGER_POOL_CONNECTIONS)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .connect_with(options.application_name("dropgate-ledger"))
        .await
        .map_err(failed)?;
    sqlx::migrate!("./migrations")
        .run(&pool)
        .await
        .map_err(|e| Failure::migration(url, &e))?;
    Ok(pool)
}

/// A small pool on the existing database of `url` holding this binary's schema, for the
/// read-only commands: nothing is created or migrated. A database migrated by a newer
/// dropgate is read (a migration adds, it does not take away), with a warning.
///
/// # Errors
/// [`Exit::DatabaseMissing`] when the database does not exist, [`Exit::Schema`] when it holds
/// no dropgate schema or an older one, and the connection failures.
pub async fn connect_existing(url: &str) -> Result<PgPool, Failure> {
    let failed = |e: sqlx::Error| Failure::postgres(url, &e);
    let options = PgConnectOptions::from_str(url)
        .map_err(failed)?
        .application_name("dropgate-reconcile");
    // One connection first: a pool that cannot connect reports only its own timeout, not
    // why (refused, unknown host, no such database, wrong password).
    options
        .connect()
        .await
        .map_err(failed)?
        .close()
        .await
        .map_err(failed)?;
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .connect_with(options)
        .await
        .map_err(failed)?;
    check_schema(&pool, url).await?;
    Ok(pool)
}

/// Whether the database holds every migration of this binary, read from sqlx's own table.
async fn check_schema(pool: &PgPool, url: &str) -> Result<(), Failure> {
    let at = crate::startup::redact(url);
    let serve = "`dropgate serve` of this version applies the migrations";
    let table: Option<String> = sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations')::text")
        .fetch_one(pool)
        .await
        .map_err(|e| Failure::postgres(url, &e))?;
    if table.is_none() {
        return Err(Failure::new(
            Exit::Schema,
            format!(
                "the database of {at} holds no dropgate schema: is DATABASE_URL the gateway's database? ({serve})"
            ),
        ));
    }
    let applied: Vec<(i64, bool)> =
        sqlx::query_as("SELECT version, success FROM _sqlx_migrations ORDER BY version")
            .fetch_all(pool)
            .await
            .map_err(|e| Failure::postgres(url, &e))?;
    if let Some((v, _)) = applied.iter().find(|(_, ok)| !ok) {
        return Err(Failure::new(
            Exit::Schema,
            format!("migration {v} of the database of {at} failed half way: {serve} again"),
        ));
    }
    let known = sqlx::migrate!("./migrations");
    let missing: Vec<String> = known
        .iter()
        .filter(|m| m.migration_type.is_up_migration())
        .map(|m| m.version)
        .filter(|v| !applied.iter().any(|(a, _)| a == v))
        .map(|v| v.to_string())
        .collect();
    if !missing.is_empty() {
        return Err(Failure::new(
            Exit::Schema,
            format!(
                "the database of {at} has an older schema than this dropgate (migrations {}                  not applied): {serve}, or use the dropgate that wrote it",
                missing.join(", ")
            ),
        ));
    }
    let newer: Vec<String> = applied
        .iter()
        .map(|(v, _)| *v)
        .filter(|v| !known.iter().any(|m| m.version == *v))
        .map(|v| v.to_string())
        .collect();
    if !newer.is_empty() {
        tracing::warn!(
            "the database was migrated by a newer dropgate (migrations {} are unknown to this              one); reading it as this version's schema",
            newer.join(", ")
        );
    }
    Ok(())
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

async fn create_database_if_missing(options: &PgConnectOptions) -> Result<(), sqlx::Error> {
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
                return Err(e);
            }
        }
    }
    admin.close().await?;
    Ok(())
}
