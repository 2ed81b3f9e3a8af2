//! `dropgate token`: admission tokens as the gateway verifies them, for tests and load runs.
//! It refuses what `serve` would refuse (a short secret, a user or SKU id the gateway never
//! accepts), so a token it prints is one a gateway with the same secret takes.

use std::io::{self, Write};
use std::time::Duration;

use crate::startup::{Exit, Failure};

/// Longest `--ttl`: a year (a load run's tokens, not credentials to keep).
const MAX_TTL: Duration = Duration::from_secs(366 * 24 * 3600);

#[derive(Debug, clap::Args)]
pub struct TokenArgs {
    /// The buyer (the token's `sub`): 1-128 characters, no control characters
    #[arg(long)]
    pub user: String,
    /// Mint tokens for <user>-0 .. <user>-<count - 1> instead, one `user<TAB>token` line
    /// each (the load tools' distinct buyers) [default: one token for --user]
    #[arg(long)]
    pub count: Option<u32>,
    /// Limit the token to this SKU: it then acts on that SKU's claims and entries only
    /// [default: any SKU]
    #[arg(long)]
    pub sku: Option<String>,
    /// How long the token is valid: seconds (3600) or a duration (90s, 15m, 1h, 2days)
    #[arg(long, default_value = "1h", value_parser = parse_ttl)]
    pub ttl: Duration,
    /// Mint a visitor token instead (`"scope": "queue"`): it joins and reads a SKU's waiting
    /// room (POST /v1/skus/{sku}/queue) and buys nothing; the queue mints the admission
    #[arg(long, conflicts_with = "sku")]
    pub visitor: bool,
    /// HS256 secret(s) the gateways verify with, as they take them (comma-separated, each
    /// optionally kid=secret); the first signs [required]
    #[arg(long, env = crate::config::ENV_ADMISSION_SECRET, hide_env_values = true)]
    pub admission_secret: Option<String>,
}

/// Seconds, as before, or a humantime duration; whole seconds from 1 s to [`MAX_TTL`] (a JWT's
/// `exp` counts seconds).
fn parse_ttl(raw: &str) -> Result<Duration, String> {
    let raw = raw.trim();
    let ttl = match raw.parse::<u64>() {
        Ok(secs) => Duration::from_secs(secs),
        Err(_) => humantime::parse_duration(raw)
            .map_err(|e| format!("{e}: give seconds (3600) or a duration such as 90s or 1h"))?,
    };
    if ttl < Duration::from_secs(1) || ttl > MAX_TTL {
        return Err("from 1 second to 366 days".into());
    }
    Ok(Duration::from_secs(ttl.as_secs()))
}

/// Prints the token(s). A reader that goes away (`| head -1`) ends the output quietly.
///
/// # Errors
/// [`Exit::Config`] for a secret, user or SKU the gateway would refuse.
pub fn run(t: &TokenArgs) -> Result<(), Failure> {
    let refused = |m: String| Failure::new(Exit::Config, m);
    // The first secret signs, with its kid, as a gateway signs what it mints.
    let keys = crate::config::admission_keys(t.admission_secret.as_deref()).map_err(refused)?;
    let secret = &keys[0];
    if let Some(sku) = &t.sku {
        if crate::sku::SkuId::parse(sku).is_none() {
            return Err(refused(
                "--sku: a SKU id matches ^[A-Za-z0-9._-]{1,64}$".into(),
            ));
        }
    }
    let ttl = t.ttl.as_secs();
    let users: Box<dyn Iterator<Item = String>> = match t.count {
        None => Box::new(std::iter::once(t.user.clone())),
        Some(n) => Box::new((0..n).map(|i| format!("{}-{i}", t.user))),
    };
    let mut out = io::BufWriter::new(io::stdout().lock());
    for user in users {
        if !crate::auth::valid_user_id(&user) {
            return Err(refused(format!(
                "--user: 1-128 characters without control characters (got {} characters)",
                user.chars().count()
            )));
        }
        let token = if t.visitor {
            crate::auth::mint_visitor(secret, &user, ttl)
        } else {
            crate::auth::mint(secret, &user, t.sku.as_deref(), ttl)
        }
        .map_err(|e| Failure::new(Exit::Other, format!("cannot sign a token: {e}")))?;
        let line = match t.count {
            None => writeln!(out, "{token}"),
            Some(_) => writeln!(out, "{user}\t{token}"),
        };
        if quiet_end(line)? {
            return Ok(());
        }
    }
    quiet_end(out.flush()).map(|_| ())
}

/// `Ok(true)` when stdout's reader went away (the output ends there, quietly), the write's
/// failure otherwise.
pub(super) fn quiet_end(written: io::Result<()>) -> Result<bool, Failure> {
    match written {
        Ok(()) => Ok(false),
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(true),
        Err(e) => Err(Failure::new(
            Exit::Other,
            format!("cannot write to stdout: {e}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_takes_seconds_or_a_duration() {
        assert_eq!(parse_ttl("3600"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_ttl("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_ttl("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_ttl("1m 30s"), Ok(Duration::from_secs(90)));
        for bad in ["0", "500ms", "soon", "-1", "400days"] {
            assert!(parse_ttl(bad).is_err(), "{bad}");
        }
    }
}
