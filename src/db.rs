//! PostgreSQL: connecting, creating the database when missing, applying the migrations.

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgPool};

/// Opens a pool on `url`, creating the database first when it does not exist, and applies the
/// migrations in `migrations/`.
///
/// # Errors
/// Connection or migration failures, with context.
pub async fn connect_and_migrate(url: &str) -> anyhow::Result<PgPool> {
    let options = PgConnectOptions::from_str(url)?;
    create_database_if_missing(&options).await?;
    let pool = PgPoolOptions::new()
        .max_connections(16)
        // A claim never waits on PostgreSQL; admin and background callers get a bounded wait.
        .acquire_timeout(Duration::from_secs(3))
        .connect_with(options)
        .await?;
    migrate(&pool).await?;
    Ok(pool)
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
