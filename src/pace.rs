//! Retry pace (the `backon` crate's exponential backoff): how long a background loop waits
//! after a failure before it tries again.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

/// The pauses of a loop that retries every round while a backend is unreachable: from `min`,
/// doubling, up to `max`, each with up to as much again of random jitter, so that the loops of
/// several gateways that met the same outage do not retry in step. Never runs out.
pub fn retries(min: Duration, max: Duration) -> ExponentialBackoff {
    ExponentialBuilder::default()
        .with_min_delay(min)
        .with_max_delay(max / 2)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .build()
}

/// The wait before retry number `attempt` (1 = the first retry) of a schedule that starts at
/// `first` and doubles per attempt up to `cap`, without jitter: a parked claim's
/// `next_attempt_at` (API.md: `DROPGATE_REPROCESS_BACKOFF_MS`, doubling, capped at 60 s).
pub fn nth_retry(first: Duration, cap: Duration, attempt: u32) -> Duration {
    ExponentialBuilder::default()
        .with_min_delay(first.min(cap))
        .with_max_delay(cap)
        .with_factor(2.0)
        .without_max_times()
        .build()
        .nth(attempt.saturating_sub(1) as usize)
        .unwrap_or(cap)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_parked_claims_retries_double_up_to_the_cap() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        let got: Vec<Duration> = (1..=9).map(|a| nth_retry(s(1), s(60), a)).collect();
        assert_eq!(
            got,
            [s(1), s(2), s(4), s(8), s(16), s(32), s(60), s(60), s(60)]
        );
        assert_eq!(nth_retry(ms(50), s(60), 1), ms(50));
        assert_eq!(nth_retry(s(90), s(60), 1), s(60));
        assert_eq!(nth_retry(s(1), s(60), 500), s(60));
    }

    #[test]
    fn a_loops_pauses_grow_to_its_bound_with_jitter() {
        let (min, max) = (Duration::from_millis(50), Duration::from_secs(2));
        let pauses: Vec<Duration> = retries(min, max).take(12).collect();
        assert!(pauses[0] >= min && pauses[0] <= min * 2, "{pauses:?}");
        assert!(pauses.iter().all(|p| *p <= max), "{pauses:?}");
        assert!(pauses[11] >= max / 2, "{pauses:?}");
    }
}
