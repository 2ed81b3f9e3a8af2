//! This gateway's wall clock, in the unit every record and script argument uses.
//!
//! A wall clock never decides an order that a sequence number should decide (gateways' clocks
//! differ): it only stamps records (`created_ms`), ages things (a journal lag, an idle mark) and
//! passes "now" to a script whose own decisions run on Redis's clock.

/// Unix time in milliseconds.
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}
