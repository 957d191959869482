//! The retry policy: it decides, the worker's loop executes (the shape of tower's
//! `retry::Policy` and its backoff).

use std::time::Duration;

/// What to do with an entry whose attempt failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Try again after this delay.
    RetryAfter(Duration),
    /// No attempts left: keep it as a dead letter.
    DeadLetter,
}

/// Decides, from the number of attempts made, whether and when an entry runs again.
pub trait RetryPolicy: Send + Sync + 'static {
    /// The decision after attempt number `attempts` (from 1) failed.
    fn decide(&self, attempts: u32) -> Decision;
}

impl<F> RetryPolicy for F
where
    F: Fn(u32) -> Decision + Send + Sync + 'static,
{
    fn decide(&self, attempts: u32) -> Decision {
        self(attempts)
    }
}

/// Exponential backoff with jitter and a bound on attempts: after attempt `n` fails the entry
/// waits a random time between half and all of `base · 2^(n-1)` (capped at `max_delay`), and
/// after `max_attempts` it is a dead letter.
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency::inbox::{Backoff, Decision, RetryPolicy};
///
/// let policy = Backoff::new(Duration::from_millis(200)).max_attempts(3);
/// let Decision::RetryAfter(delay) = policy.decide(2) else { panic!() };
/// assert!(delay >= Duration::from_millis(200) && delay <= Duration::from_millis(400));
/// assert_eq!(policy.decide(3), Decision::DeadLetter);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    base: Duration,
    max_delay: Duration,
    max_attempts: u32,
}

impl Backoff {
    /// Backoff from `base`, at most 5 attempts, delays capped at 10 minutes.
    pub fn new(base: Duration) -> Self {
        Backoff {
            base,
            max_delay: Duration::from_secs(600),
            max_attempts: 5,
        }
    }

    /// At most `attempts` attempts (at least 1) before the entry is a dead letter.
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }

    /// The longest delay between two attempts.
    pub fn max_delay(mut self, delay: Duration) -> Self {
        self.max_delay = delay;
        self
    }

    /// The delay before the attempt after `attempts`, without jitter.
    fn ceiling(&self, attempts: u32) -> Duration {
        crate::claim::backoff::nth(self.base, self.max_delay, attempts)
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::new(Duration::from_millis(200))
    }
}

impl RetryPolicy for Backoff {
    fn decide(&self, attempts: u32) -> Decision {
        if attempts >= self.max_attempts {
            return Decision::DeadLetter;
        }
        let ceiling = self.ceiling(attempts);
        // Half fixed, half random ("equal jitter"): retries of many entries that failed
        // together spread out, and none comes back sooner than half the backoff.
        let half = ceiling / 2;
        Decision::RetryAfter(half + half.mul_f64(unit_random()))
    }
}

/// A uniform number in [0, 1] from the operating system's generator.
fn unit_random() -> f64 {
    let mut bytes = [0u8; 4];
    if getrandom::fill(&mut bytes).is_err() {
        return 0.5;
    }
    f64::from(u32::from_le_bytes(bytes)) / f64::from(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_within_their_jitter_and_stop_at_the_cap() {
        let policy = Backoff::new(Duration::from_millis(100))
            .max_attempts(20)
            .max_delay(Duration::from_millis(1_000));
        for (attempts, ceiling) in [
            (1, 100),
            (2, 200),
            (3, 400),
            (4, 800),
            (5, 1_000),
            (19, 1_000),
        ] {
            let Decision::RetryAfter(delay) = policy.decide(attempts) else {
                panic!("attempt {attempts} should be retried");
            };
            let ceiling = Duration::from_millis(ceiling);
            assert!(
                delay >= ceiling / 2 && delay <= ceiling,
                "{attempts}: {delay:?}"
            );
        }
        assert_eq!(policy.decide(20), Decision::DeadLetter);
    }
}
