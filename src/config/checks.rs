//! The checks of single values, shared by `serve`'s validation and the other subcommands.

use std::net::SocketAddr;

use super::Secret;

/// Accepts `ip:port`, the API.md shorthand `:port` (that port of loopback), and
/// `localhost:port` (the same: what a newcomer types, and what loopback means). Other host
/// names are refused rather than resolved: a name may stand for several addresses, and the
/// gateway would listen on one of them only.
pub(super) fn parse_listen(raw: &str) -> Result<SocketAddr, String> {
    let raw = raw.trim();
    let full = match raw.strip_prefix("localhost:") {
        Some(port) => format!("127.0.0.1:{port}"),
        None if raw.starts_with(':') => format!("127.0.0.1{raw}"),
        None => raw.to_string(),
    };
    full.parse::<SocketAddr>().map_err(|_| {
        "expected an IP address and a port, such as 127.0.0.1:8080, 0.0.0.0:8080, \
         [::1]:8080 or :8080 (host names other than localhost are not resolved)"
            .to_string()
    })
}

/// The signing secret of `DROPGATE_ADMISSION_SECRET` (its first key) as `serve` accepts it;
/// `token` applies the same check ([`super::tokens::admission_keys`]), so it never mints
/// tokens no gateway would verify.
///
/// # Errors
/// What is wrong with it, naming the variable.
pub fn admission_secret(raw: Option<&str>) -> Result<Secret, String> {
    let mut keys = super::tokens::admission_keys(raw)?;
    Ok(keys.swap_remove(0).secret)
}

/// One or more comma-separated `nats://` or `tls://` URLs (what async-nats accepts, minus
/// the bare `host:port` form, so a typo such as a `redis://` URL is caught here).
pub(super) fn check_nats_url(raw: &str) -> Result<(), String> {
    for url in raw.split(',').map(str::trim) {
        let rest = url
            .strip_prefix("nats://")
            .or_else(|| url.strip_prefix("tls://"))
            .ok_or("expected nats:// or tls:// URLs, comma-separated")?;
        if rest.is_empty() {
            return Err("a URL names no host".into());
        }
    }
    Ok(())
}

/// JetStream stream names: no whitespace, `.`, `*`, `>`, or path separators.
pub fn check_stream_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 255
        && name
            .chars()
            .all(|c| c.is_ascii_graphic() && !matches!(c, '.' | '*' | '>' | '/' | '\\'));
    ok.then_some(())
        .ok_or_else(|| "1-255 visible ASCII characters without . * > / \\".into())
}

/// Subject tokens: non-empty, no whitespace, no wildcards.
pub fn check_subject_prefix(prefix: &str) -> Result<(), String> {
    let ok = !prefix.is_empty()
        && prefix.len() <= 128
        && prefix.split('.').all(|t| {
            !t.is_empty()
                && t.chars()
                    .all(|c| c.is_ascii_graphic() && !matches!(c, '*' | '>'))
        });
    ok.then_some(())
        .ok_or_else(|| "dot-separated tokens of visible ASCII without * or >, 1-128 chars".into())
}
