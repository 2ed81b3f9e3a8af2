//! Why a command could not start (or finish): said once, naming what failed and where (the
//! URL without its password), with what to do, and an exit status of its own per cause, so a
//! supervisor or script can tell a typo from an outage (docs/cli.md lists them).

use std::fmt;

/// The exit statuses of `dropgate` (docs/cli.md). 0 is success; clap's own usage errors exit 2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// `reconcile`: a SKU does not balance; `demo`: the drop did not balance.
    Mismatch = 1,
    /// Invalid configuration (every problem listed at once) or a refused value of `token`.
    Config = 64,
    /// `reconcile --sku` names a SKU the catalog does not hold.
    UnknownSku = 65,
    /// The database named in `DATABASE_URL` does not exist (`reconcile` never creates one).
    DatabaseMissing = 66,
    /// PostgreSQL refused the login or the permission (role, password, CREATEDB).
    PostgresRefused = 67,
    /// The database's schema is not this binary's (not migrated, older, or newer), or a
    /// migration failed.
    Schema = 68,
    /// PostgreSQL cannot be reached (refused, timed out, unknown host).
    PostgresUnreachable = 69,
    /// Redis cannot be reached, or refused the connection (password, ACL).
    RedisUnreachable = 70,
    /// Redis runs with a setting that loses data (`maxmemory-policy` other than noeviction).
    RedisUnsafe = 71,
    /// `serve` cannot listen on `DROPGATE_LISTEN` (in use, not permitted).
    Listen = 72,
    /// Any other failure; the message says what.
    Other = 74,
}

impl Exit {
    pub fn code(self) -> u8 {
        self as u8
    }
}

/// A failure as the operator reads it: one message, one exit status.
#[derive(Debug, thiserror::Error)]
pub struct Failure {
    pub exit: Exit,
    message: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl Failure {
    pub fn new(exit: Exit, message: impl Into<String>) -> Self {
        Failure {
            exit,
            message: message.into(),
        }
    }

    /// A PostgreSQL error met while connecting to (or reading) the database of `url`.
    pub fn postgres(url: &str, e: &sqlx::Error) -> Self {
        let at = redact(url);
        let database = database_name(url);
        match e {
            sqlx::Error::Database(d) => {
                let msg = d.message();
                match d.code().as_deref() {
                    Some("3D000") => Failure::new(
                        Exit::DatabaseMissing,
                        format!(
                            "the database \"{database}\" does not exist on the PostgreSQL server of \
                             {at}: check the database name in DATABASE_URL (`dropgate serve` \
                             creates it; read-only commands never do)"
                        ),
                    ),
                    Some("28000" | "28P01") => Failure::new(
                        Exit::PostgresRefused,
                        format!(
                            "PostgreSQL at {at} refused the login: {msg}; check the user and \
                             password in DATABASE_URL (and the server's pg_hba.conf)"
                        ),
                    ),
                    Some("42501") => Failure::new(
                        Exit::PostgresRefused,
                        format!(
                            "PostgreSQL at {at} refused: {msg}; give the user the permission \
                             (CREATEDB to let `serve` create the database) or create it first"
                        ),
                    ),
                    _ => Failure::new(Exit::Other, format!("PostgreSQL at {at}: {msg}")),
                }
            }
            sqlx::Error::Configuration(c) => Failure::new(
                Exit::Config,
                format!("DATABASE_URL {at} is not a usable PostgreSQL URL: {c}"),
            ),
            sqlx::Error::Migrate(m) => Failure::migration(url, m),
            other => Failure::new(
                Exit::PostgresUnreachable,
                format!(
                    "cannot reach PostgreSQL at {at}: {}; is it running and listening there? \
                     Check the host and port in DATABASE_URL",
                    innermost(other)
                ),
            ),
        }
    }

    /// A migration that could not be applied by `serve` (or `demo`).
    pub fn migration(url: &str, e: &sqlx::migrate::MigrateError) -> Self {
        use sqlx::migrate::MigrateError as M;
        let at = redact(url);
        let message = match e {
            M::VersionMissing(v) => format!(
                "the database of {at} was migrated by a newer dropgate (migration {v} is not one \
                 of this binary's): run that version, or a newer one"
            ),
            M::Execute(sqlx::Error::Database(d)) => {
                format!("applying the migrations to {at} failed: {}", d.message())
            }
            other => format!("applying the migrations to {at} failed: {other}"),
        };
        Failure::new(Exit::Schema, message)
    }

    /// A failure connecting to Redis at `url` (one URL, or a cluster's comma-separated list).
    pub fn redis(url: &str, e: &crate::error::StoreError) -> Self {
        use crate::error::StoreError as S;
        let at = redact(url);
        let why = match e {
            S::Timeout => "no answer in time".to_string(),
            S::Redis(r) if r.kind() == redis::ErrorKind::AuthenticationFailed => format!(
                "{}; check the user and password in REDIS_URL",
                r.detail().unwrap_or("authentication failed")
            ),
            S::Redis(r) => r.detail().unwrap_or("refused").to_string(),
            S::Unavailable(detail) => detail.clone(),
            other => other.to_string(),
        };
        Failure::new(
            Exit::RedisUnreachable,
            format!(
                "cannot use Redis at {at}: {why}; is it running and listening there? Check \
                 REDIS_URL"
            ),
        )
    }

    /// `serve` could not bind its listener.
    pub fn listen(addr: std::net::SocketAddr, e: &std::io::Error) -> Self {
        let todo = match e.kind() {
            std::io::ErrorKind::AddrInUse => {
                "another process holds the port: stop it, or set DROPGATE_LISTEN to another \
                 port (:0 picks a free one)"
            }
            std::io::ErrorKind::PermissionDenied => {
                "ports below 1024 need CAP_NET_BIND_SERVICE: use a higher port"
            }
            std::io::ErrorKind::AddrNotAvailable => {
                "no interface of this machine has that address: use one it has, or 0.0.0.0"
            }
            _ => "check DROPGATE_LISTEN",
        };
        Failure::new(
            Exit::Listen,
            format!("cannot listen on {addr}: {e}; {todo}"),
        )
    }
}

/// The exit status and message of a command's error: its [`Failure`] when it has one,
/// else [`Exit::Other`] and the error's causes, each said once.
pub fn explain(e: &anyhow::Error) -> (Exit, String) {
    if let Some(f) = e.chain().find_map(|c| c.downcast_ref::<Failure>()) {
        return (f.exit, f.to_string());
    }
    if let Some(c) = e
        .chain()
        .find_map(|c| c.downcast_ref::<crate::config::ConfigErrors>())
    {
        return (Exit::Config, c.to_string());
    }
    (Exit::Other, causes(e.chain()))
}

/// Causes joined by `: `, leaving out one whose text the cause before it already holds
/// (sqlx and redis put their source's text in their own, which `{:#}` then repeats).
fn causes<'a>(chain: impl Iterator<Item = &'a (dyn std::error::Error + 'static)>) -> String {
    let mut out = String::new();
    for c in chain {
        let text = c.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

/// The deepest cause's text (an I/O error's own words, without the wrappers' prefixes).
fn innermost(e: &(dyn std::error::Error + 'static)) -> String {
    let mut last: &dyn std::error::Error = e;
    while let Some(next) = last.source() {
        last = next;
    }
    last.to_string()
}

/// `url` without its password (in the user part or a `password=` parameter); each of
/// several comma-separated URLs alike.
pub fn redact(url: &str) -> String {
    url.split(',')
        .map(|u| redact_one(u.trim()))
        .collect::<Vec<_>>()
        .join(",")
}

fn redact_one(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((s, r)) => (format!("{s}://"), r),
        None => (String::new(), url),
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some(("", _password)) => host.to_string(),
            Some((user, _password)) => format!("{user}@{host}"),
            None => format!("{userinfo}@{host}"),
        },
        None => authority.to_string(),
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let kept: Vec<&str> = query
                .split('&')
                .filter(|p| !p.to_ascii_lowercase().starts_with("password="))
                .collect();
            if kept.is_empty() {
                path.to_string()
            } else {
                format!("{path}?{}", kept.join("&"))
            }
        }
        None => tail.to_string(),
    };
    format!("{scheme}{authority}{tail}")
}

/// The database `url` names (PostgreSQL's default: the user's name).
fn database_name(url: &str) -> String {
    use std::str::FromStr;
    sqlx::postgres::PgConnectOptions::from_str(url)
        .map(|o| {
            o.get_database()
                .unwrap_or_else(|| o.get_username())
                .to_string()
        })
        .unwrap_or_else(|_| "?".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_print() {
        for (url, shown) in [
            (
                "postgres://app:s3cret@db:5432/dropgate",
                "postgres://app@db:5432/dropgate",
            ),
            (
                "postgres://db/dropgate?user=app&password=s3cret&sslmode=require",
                "postgres://db/dropgate?user=app&sslmode=require",
            ),
            ("redis://:s3cret@127.0.0.1:6379", "redis://127.0.0.1:6379"),
            (
                "redis://a:s3cret@n1:7000,redis://b:s3cret@n2:7001",
                "redis://a@n1:7000,redis://b@n2:7001",
            ),
            (
                "postgres://postgres@127.0.0.1:5432/dropgate",
                "postgres://postgres@127.0.0.1:5432/dropgate",
            ),
        ] {
            assert_eq!(redact(url), shown);
        }
    }

    #[test]
    fn a_cause_already_said_is_not_said_again() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused");
        let e = anyhow::Error::from(sqlx::Error::Io(io));
        let (exit, text) = explain(&e);
        assert_eq!(exit, Exit::Other);
        assert_eq!(text.matches("Connection refused").count(), 1, "{text}");
    }

    #[test]
    fn exit_statuses_are_distinct() {
        let all = [
            Exit::Mismatch,
            Exit::Config,
            Exit::UnknownSku,
            Exit::DatabaseMissing,
            Exit::PostgresRefused,
            Exit::Schema,
            Exit::PostgresUnreachable,
            Exit::RedisUnreachable,
            Exit::RedisUnsafe,
            Exit::Listen,
            Exit::Other,
        ];
        let codes: std::collections::HashSet<u8> = all.iter().map(|e| e.code()).collect();
        assert_eq!(codes.len(), all.len());
        assert!(!codes.contains(&0) && !codes.contains(&2));
    }
}
