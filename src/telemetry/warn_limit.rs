//! A rate limit for warnings that a peer can trigger at will (bad lines, refused scrapes): each
//! source keeps one, so a flood of bad input cannot flood the log.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Logs a repeated warning at most once per `period`, counting what it held back: each
/// connection keeps one, so a peer flooding bad lines cannot flood the log.
#[derive(Debug)]
pub struct WarnLimiter {
    period: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

/// The period of [`WarnLimiter::default`].
pub const WARN_PERIOD: Duration = Duration::from_secs(10);

impl Default for WarnLimiter {
    fn default() -> Self {
        Self::new(WARN_PERIOD)
    }
}

impl WarnLimiter {
    pub fn new(period: Duration) -> Self {
        Self {
            period,
            last: None,
            suppressed: 0,
        }
    }

    /// `Some(suppressed since the last one)` when a warning may be logged now, else `None`
    /// (and it is counted).
    pub fn allow(&mut self) -> Option<u64> {
        self.allow_at(Instant::now())
    }

    fn allow_at(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(last) if now.saturating_duration_since(last) < self.period => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }
}

/// A [`WarnLimiter`] shared by tasks that warn about the same thing.
#[derive(Debug, Default)]
pub struct SharedWarnLimiter(Mutex<WarnLimiter>);

impl SharedWarnLimiter {
    /// Calls `what` with the number of warnings held back since the last one, at most once per
    /// period; a warning within the period is only counted.
    pub fn warn(&self, what: impl FnOnce(u64)) {
        let allowed = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .allow();
        if let Some(suppressed) = allowed {
            what(suppressed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn warnings_are_rate_limited_with_a_count() {
        let mut limiter = WarnLimiter::new(Duration::from_secs(10));
        let start = Instant::now();
        assert_eq!(limiter.allow_at(start), Some(0));
        assert_eq!(limiter.allow_at(start + Duration::from_secs(1)), None);
        assert_eq!(limiter.allow_at(start + Duration::from_secs(9)), None);
        assert_eq!(limiter.allow_at(start + Duration::from_secs(10)), Some(2));
        assert_eq!(limiter.allow_at(start + Duration::from_secs(11)), None);
        assert_eq!(limiter.allow_at(start + Duration::from_secs(30)), Some(1));
    }
}
