//! Retry, backoff and polling budgets, shared by every REST adapter.

use std::time::{Duration, SystemTime};

/// How HTTP requests are retried on 429/503 and on connection failures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Most requests sent for one call (the first one included); at least 1.
    pub max_attempts: u32,
    /// The first backoff when the server gave no `Retry-After`.
    pub initial_backoff: Duration,
    /// Backoff cap (exponential growth stops here).
    pub max_backoff: Duration,
    /// The longest `Retry-After` we are willing to honour; longer values are clamped to it.
    pub max_retry_after: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 6,
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(16),
            max_retry_after: Duration::from_secs(60),
        }
    }
}

impl RetryPolicy {
    /// The wait before retry number `retry` (0 = after the first failure). A server's
    /// `Retry-After` is honoured (clamped to `max_retry_after`), otherwise capped exponential
    /// backoff with up to 25 % added jitter.
    pub fn delay(&self, retry: u32, retry_after: Option<Duration>) -> Duration {
        if let Some(ra) = retry_after {
            return ra.min(self.max_retry_after);
        }
        let base = self
            .initial_backoff
            .saturating_mul(2u32.saturating_pow(retry.min(16)))
            .min(self.max_backoff);
        base + jitter(base / 4)
    }
}

/// How long-running operations (and endpoints without a host yet) are polled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PollPolicy {
    /// The first wait between polls.
    pub initial_interval: Duration,
    /// The wait grows by half each poll up to this.
    pub max_interval: Duration,
    /// Give up after this long.
    pub timeout: Duration,
}

impl Default for PollPolicy {
    fn default() -> Self {
        PollPolicy {
            initial_interval: Duration::from_secs(1),
            max_interval: Duration::from_secs(5),
            timeout: Duration::from_secs(120),
        }
    }
}

impl PollPolicy {
    /// The interval after `current`.
    pub fn next_interval(&self, current: Duration) -> Duration {
        (current + current / 2).min(self.max_interval)
    }
}

/// How the first login to a new branch is retried while the service still answers
/// "External authorization failed" (a fresh credential is minted for every attempt).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuthReadyPolicy {
    /// The first wait between attempts.
    pub initial_backoff: Duration,
    /// Backoff cap.
    pub max_backoff: Duration,
    /// Give up after this long.
    pub budget: Duration,
}

impl Default for AuthReadyPolicy {
    fn default() -> Self {
        AuthReadyPolicy {
            initial_backoff: Duration::from_secs(2),
            max_backoff: Duration::from_secs(8),
            budget: Duration::from_secs(60),
        }
    }
}

/// Parses a `Retry-After` header given in seconds (integer or decimal). HTTP dates and
/// garbage give `None` (the caller then backs off by itself).
pub(super) fn parse_retry_after(value: &str) -> Option<Duration> {
    let v = value.trim();
    let secs: f64 = v.parse().ok()?;
    if secs.is_finite() && (0.0..86_400.0).contains(&secs) {
        Some(Duration::from_secs_f64(secs))
    } else {
        None
    }
}

/// A pseudo-random duration in `[0, max]`, from the clock's low bits (good enough to spread
/// retries; no randomness is needed for correctness).
fn jitter(max: Duration) -> Duration {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        // A clock before 1970 only loses the jitter, never a retry.
        .unwrap_or(0);
    let max_ns = max.as_nanos().min(u128::from(u64::MAX)) as u64;
    if max_ns == 0 {
        return Duration::ZERO;
    }
    Duration::from_nanos(u64::from(nanos) % (max_ns + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_parses_seconds_only() {
        assert_eq!(parse_retry_after("2"), Some(Duration::from_secs(2)));
        assert_eq!(parse_retry_after(" 0.5 "), Some(Duration::from_millis(500)));
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), None);
        assert_eq!(parse_retry_after("-1"), None);
        assert_eq!(parse_retry_after("NaN"), None);
    }

    #[test]
    fn delay_honours_retry_after_and_caps_backoff() {
        let p = RetryPolicy {
            max_attempts: 5,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(400),
            max_retry_after: Duration::from_secs(3),
        };
        assert_eq!(
            p.delay(0, Some(Duration::from_secs(2))),
            Duration::from_secs(2)
        );
        assert_eq!(
            p.delay(0, Some(Duration::from_secs(30))),
            Duration::from_secs(3)
        );
        let d0 = p.delay(0, None);
        assert!(d0 >= Duration::from_millis(100) && d0 <= Duration::from_millis(125));
        let d9 = p.delay(9, None);
        assert!(d9 >= Duration::from_millis(400) && d9 <= Duration::from_millis(500));
    }

    #[test]
    fn poll_interval_grows_to_the_cap() {
        let p = PollPolicy {
            initial_interval: Duration::from_millis(100),
            max_interval: Duration::from_millis(200),
            timeout: Duration::from_secs(1),
        };
        assert_eq!(
            p.next_interval(Duration::from_millis(100)),
            Duration::from_millis(150)
        );
        assert_eq!(
            p.next_interval(Duration::from_millis(150)),
            Duration::from_millis(200)
        );
    }
}
