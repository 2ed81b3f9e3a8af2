//! Configuration: environment variables (every name and default a `const`), parsed at once,
//! every error reported together. Goose's own flags (`--users`, `--run-time`, `--scenarios`,
//! `--report-file`, ...) are parsed by goose; this module reads only what goose does not know.

use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

pub const ENV_URL: &str = "DROPGATE_URL";
pub const DEFAULT_URL: &str = "http://127.0.0.1:8080";
pub const ENV_ADMISSION_SECRET: &str = "DROPGATE_ADMISSION_SECRET";
pub const ENV_ADMIN_TOKEN: &str = "DROPGATE_ADMIN_TOKEN";
/// Alternative to goose's `--scenarios`: a comma-separated list of scenario names.
pub const ENV_SCENARIO: &str = "DROPGATE_SCENARIO";
/// How many SKUs `many_skus` spreads its buyers over.
pub const ENV_SKU_COUNT: &str = "DROPGATE_LOAD_SKUS";
pub const DEFAULT_SKU_COUNT: usize = 50;
/// Units per SKU; without it each scenario sizes its stock far below its buyers.
pub const ENV_STOCK: &str = "DROPGATE_LOAD_STOCK";
/// In `retry_storm`, how many goose users share one buyer (token and Idempotency-Key), so
/// duplicates also arrive concurrently, not only one after the other.
pub const ENV_RETRY_FANOUT: &str = "DROPGATE_LOAD_RETRY_FANOUT";
pub const DEFAULT_RETRY_FANOUT: usize = 2;
/// Upper bound of the wait for the journal writer to drain after the load.
pub const ENV_DRAIN_SECS: &str = "DROPGATE_LOAD_DRAIN_SECS";
pub const DEFAULT_DRAIN_SECS: u64 = 60;
/// Names this run's SKUs (`lt-<run id>-...`); defaults to the start time in milliseconds.
pub const ENV_RUN_ID: &str = "DROPGATE_LOAD_RUN_ID";
/// Set to 1 to allow a target that is not a loopback address.
pub const ENV_ALLOW_REMOTE: &str = "DROPGATE_LOAD_ALLOW_REMOTE";
/// `checkout`: how long a won claim is held before it expires, and how long a waitlist offer
/// is held. Small, so that holds and offers end within a bounded run.
pub const ENV_HOLD_SECS: &str = "DROPGATE_LOAD_HOLD_SECS";
pub const DEFAULT_HOLD_SECS: u32 = 8;
pub const ENV_OFFER_SECS: &str = "DROPGATE_LOAD_OFFER_SECS";
pub const DEFAULT_OFFER_SECS: u32 = 6;
/// `checkout` reads the ledger (`issuances`, `waitlist`, `outbox`) after the run: the
/// gateway's PostgreSQL, under the gateway's own variable name.
pub const ENV_DATABASE_URL: &str = "DATABASE_URL";
/// `queue_drop`: the waiting room's admissions per second (0: a tenth of the visitors, at
/// least 5), and how long after the declare it opens (the visitors join before).
pub const ENV_ADMIT_PER_SECOND: &str = "DROPGATE_LOAD_ADMIT_PER_SECOND";
pub const DEFAULT_ADMIT_PER_SECOND: u32 = 0;
pub const ENV_OPEN_SECS: &str = "DROPGATE_LOAD_OPEN_SECS";
pub const DEFAULT_OPEN_SECS: u32 = 5;

/// Goose defaults this tool sets when the command line leaves them open, so that a bare run
/// is bounded in time.
pub const DEFAULT_USERS: usize = 200;
pub const DEFAULT_RUN_TIME_SECS: usize = 20;
pub const REQUEST_TIMEOUT_SECS: &str = "10";

/// Exit code for bad configuration (EX_USAGE), as the gateway uses.
pub const EXIT_CONFIG: u8 = 64;

/// A secret that never prints.
#[derive(Clone)]
pub struct Secret(String);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// Everything read from the environment.
#[derive(Debug, Clone)]
pub struct Settings {
    pub url: String,
    pub admission_secret: Secret,
    pub admin_token: Secret,
    pub scenarios: Option<String>,
    pub sku_count: usize,
    pub stock: Option<i64>,
    pub retry_fanout: usize,
    pub drain: Duration,
    pub run_id: String,
    pub allow_remote: bool,
    pub hold_secs: u32,
    pub offer_secs: u32,
    pub admit_per_second: u32,
    pub open_secs: u32,
    /// Needed by `checkout` only.
    pub database_url: Option<Secret>,
}

/// Where settings come from; tests inject a map.
pub trait Env {
    fn get(&self, name: &str) -> Option<String>;
}

pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn get(&self, name: &str) -> Option<String> {
        std::env::var(name).ok().filter(|v| !v.is_empty())
    }
}

impl Settings {
    /// # Errors
    /// Every problem found, one line each.
    pub fn from_env(env: &impl Env) -> Result<Settings, Vec<String>> {
        let mut errors = Vec::new();
        let url = env.get(ENV_URL).unwrap_or_else(|| DEFAULT_URL.into());
        let mut secret = |name: &str| match env.get(name) {
            Some(v) if v.len() >= 16 => Some(Secret(v)),
            Some(_) => {
                errors.push(format!("{name} must be at least 16 bytes"));
                None
            }
            None => {
                errors.push(format!("{name} is required"));
                None
            }
        };
        let admission_secret = secret(ENV_ADMISSION_SECRET);
        let admin_token = secret(ENV_ADMIN_TOKEN);
        let sku_count = number(
            env,
            ENV_SKU_COUNT,
            DEFAULT_SKU_COUNT,
            1..=10_000,
            &mut errors,
        );
        let retry_fanout = number(
            env,
            ENV_RETRY_FANOUT,
            DEFAULT_RETRY_FANOUT,
            1..=64,
            &mut errors,
        );
        let drain = number(
            env,
            ENV_DRAIN_SECS,
            DEFAULT_DRAIN_SECS,
            1..=3600,
            &mut errors,
        );
        let hold_secs = number(env, ENV_HOLD_SECS, DEFAULT_HOLD_SECS, 1..=600, &mut errors);
        let offer_secs = number(
            env,
            ENV_OFFER_SECS,
            DEFAULT_OFFER_SECS,
            1..=600,
            &mut errors,
        );
        let admit_per_second = number(
            env,
            ENV_ADMIT_PER_SECOND,
            DEFAULT_ADMIT_PER_SECOND,
            0..=100_000,
            &mut errors,
        );
        let open_secs = number(env, ENV_OPEN_SECS, DEFAULT_OPEN_SECS, 1..=600, &mut errors);
        let stock = env.get(ENV_STOCK).and_then(|v| match v.parse::<i64>() {
            Ok(n) if n >= 1 => Some(n),
            _ => {
                errors.push(format!("{ENV_STOCK}={v:?}: expected an integer >= 1"));
                None
            }
        });
        let run_id = env.get(ENV_RUN_ID).unwrap_or_else(default_run_id);
        if !run_id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            || run_id.len() > 32
        {
            errors.push(format!(
                "{ENV_RUN_ID}={run_id:?}: use at most 32 of [A-Za-z0-9_-]"
            ));
        }
        let allow_remote = env.get(ENV_ALLOW_REMOTE).is_some_and(|v| v == "1");
        match (errors.is_empty(), admission_secret, admin_token) {
            (true, Some(admission_secret), Some(admin_token)) => Ok(Settings {
                url,
                admission_secret,
                admin_token,
                scenarios: env.get(ENV_SCENARIO),
                sku_count,
                stock,
                retry_fanout,
                drain: Duration::from_secs(drain),
                run_id,
                allow_remote,
                hold_secs,
                offer_secs,
                admit_per_second,
                open_secs,
                database_url: env.get(ENV_DATABASE_URL).map(Secret),
            }),
            _ => Err(errors),
        }
    }
}

fn number<T>(
    env: &impl Env,
    name: &str,
    default: T,
    range: std::ops::RangeInclusive<T>,
    errors: &mut Vec<String>,
) -> T
where
    T: std::str::FromStr + PartialOrd + fmt::Display + Copy,
{
    match env.get(name) {
        None => default,
        Some(v) => match v.parse::<T>() {
            Ok(n) if range.contains(&n) => n,
            _ => {
                errors.push(format!(
                    "{name}={v:?}: expected an integer in {}..={}",
                    range.start(),
                    range.end()
                ));
                default
            }
        },
    }
}

fn default_run_id() -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    ms.to_string()
}

/// Refuses a target that is not on this machine, unless explicitly allowed: a load tool
/// pointed at the wrong host is an incident.
///
/// # Errors
/// A sentence naming the host.
pub fn check_loopback(url: &str, allow_remote: bool) -> Result<(), String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("{url:?} is not a URL: {e}"))?;
    let host = parsed
        .host_str()
        .ok_or_else(|| format!("{url:?} names no host"))?;
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let loopback = bare.eq_ignore_ascii_case("localhost")
        || bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
    if loopback || allow_remote {
        Ok(())
    } else {
        Err(format!(
            "{host} is not a loopback address; set {ENV_ALLOW_REMOTE}=1 to load it anyway"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    struct Map(HashMap<&'static str, &'static str>);

    impl Env for Map {
        fn get(&self, name: &str) -> Option<String> {
            self.0.get(name).map(|v| v.to_string())
        }
    }

    #[test]
    fn every_error_is_reported_at_once() {
        let env = Map(HashMap::from([
            (ENV_ADMISSION_SECRET, "short"),
            (ENV_SKU_COUNT, "0"),
            (ENV_STOCK, "-3"),
        ]));
        let errors = Settings::from_env(&env).unwrap_err();
        assert_eq!(errors.len(), 4, "{errors:?}");
    }

    #[test]
    fn defaults_fill_what_is_not_set() {
        let env = Map(HashMap::from([
            (ENV_ADMISSION_SECRET, "0123456789abcdef"),
            (ENV_ADMIN_TOKEN, "fedcba9876543210"),
        ]));
        let s = Settings::from_env(&env).unwrap();
        assert_eq!(s.url, DEFAULT_URL);
        assert_eq!(s.sku_count, DEFAULT_SKU_COUNT);
        assert_eq!(s.stock, None);
        assert!(!format!("{s:?}").contains("0123456789abcdef"));
    }

    #[test]
    fn only_loopback_targets_pass_unless_allowed() {
        assert!(check_loopback("http://127.0.0.1:8080", false).is_ok());
        assert!(check_loopback("http://localhost:1", false).is_ok());
        assert!(check_loopback("http://[::1]:1", false).is_ok());
        assert!(check_loopback("http://10.1.2.3:80", false).is_err());
        assert!(check_loopback("http://10.1.2.3:80", true).is_ok());
    }
}
