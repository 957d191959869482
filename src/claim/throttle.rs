//! [`LogThrottle`]: at most one log line per kind of problem and interval, so that problems an
//! outsider can cause at will (forged signatures, malformed keys, bodies too large, a full
//! store) cannot flood the logs; the lines that are written say how many were left out
//! since the last one. Metrics still count every request.
//!
//! A leaf: it imports nothing of the request path.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// At most one line per kind (a pair of static names, such as an outcome and its reason) per
/// interval. A layer has one, shared by its clones.
#[derive(Debug)]
pub(crate) struct LogThrottle {
    interval: Duration,
    /// One window per kind seen: a handful (outcomes × reasons), so a list is enough.
    windows: Mutex<Vec<Window>>,
}

#[derive(Debug)]
struct Window {
    kind: (&'static str, &'static str),
    /// When the last line of this kind was written.
    logged_at: Instant,
    /// Lines of this kind left out since.
    suppressed: u64,
}

impl LogThrottle {
    /// A throttle that writes at most one line per kind every `interval` (zero: every line).
    pub(crate) fn new(interval: Duration) -> Self {
        LogThrottle {
            interval,
            windows: Mutex::new(Vec::new()),
        }
    }

    /// Whether a line of `kind` may be written now: `Some(n)` with the lines of that kind
    /// left out since the last one written, or `None` (this one is left out, and counted).
    pub(crate) fn admit(&self, kind: (&'static str, &'static str)) -> Option<u64> {
        self.admit_at(kind, Instant::now())
    }

    fn admit_at(&self, kind: (&'static str, &'static str), now: Instant) -> Option<u64> {
        // A poisoned lock only means a panic elsewhere while counting: the counts are whole.
        let mut windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        let Some(window) = windows.iter_mut().find(|w| w.kind == kind) else {
            windows.push(Window {
                kind,
                logged_at: now,
                suppressed: 0,
            });
            return Some(0);
        };
        if now.saturating_duration_since(window.logged_at) < self.interval {
            window.suppressed += 1;
            return None;
        }
        window.logged_at = now;
        Some(std::mem::take(&mut window.suppressed))
    }
}

impl Default for LogThrottle {
    fn default() -> Self {
        Self::new(crate::defaults::LOG_INTERVAL)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_kind_and_interval_with_the_count_left_out() {
        let interval = Duration::from_secs(10);
        let throttle = LogThrottle::new(interval);
        let (kind, start) = (("unverified", "signature_mismatch"), Instant::now());
        assert_eq!(throttle.admit_at(kind, start), Some(0));
        for _ in 0..999 {
            assert_eq!(throttle.admit_at(kind, start + interval / 2), None);
        }
        // Another kind has a window of its own.
        assert_eq!(throttle.admit(("rejected", "malformed_key")), Some(0));
        assert_eq!(throttle.admit(("unverified", "missing_signature")), Some(0));
        // Once the interval has passed, the next line says how many were left out.
        assert_eq!(throttle.admit_at(kind, start + interval), Some(999));
        assert_eq!(throttle.admit_at(kind, start + interval), None);
        assert_eq!(throttle.admit_at(kind, start + 2 * interval), Some(1));
    }

    #[test]
    fn a_zero_interval_writes_every_line() {
        let throttle = LogThrottle::new(Duration::ZERO);
        for _ in 0..10 {
            assert_eq!(throttle.admit(("store_error", "none")), Some(0));
        }
    }
}
