//! The tolerance of schemes that sign a timestamp: how far from now, in the past or the future,
//! a signed timestamp may be, and the clock that says what now is.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::{DEFAULT_TOLERANCE, VerifyError};

/// A clock that can be replaced in tests.
type Clock = Arc<dyn Fn() -> SystemTime + Send + Sync>;

/// A tolerance and a clock, shared by the schemes that sign a timestamp.
#[derive(Clone)]
pub(crate) struct Freshness {
    tolerance: Duration,
    /// `None`: [`SystemTime::now`] (no allocation for the common case).
    clock: Option<Clock>,
}

impl Default for Freshness {
    fn default() -> Self {
        Freshness {
            tolerance: DEFAULT_TOLERANCE,
            clock: None,
        }
    }
}

impl Freshness {
    pub(crate) fn with_tolerance(self, tolerance: Duration) -> Self {
        Freshness { tolerance, ..self }
    }

    pub(crate) fn with_clock(self, clock: impl Fn() -> SystemTime + Send + Sync + 'static) -> Self {
        Freshness {
            clock: Some(Arc::new(clock)),
            ..self
        }
    }

    /// `Ok` when `signed_at` (unix seconds) is at most the tolerance away from now, in either
    /// direction; the bound itself is inside. Timestamps have whole seconds, so the tolerance
    /// and now are taken in whole seconds too.
    pub(crate) fn check(&self, signed_at: u64) -> Result<(), VerifyError> {
        let now = self
            .clock
            .as_ref()
            .map_or_else(SystemTime::now, |clock| clock());
        // Signed seconds, so that a clock before 1970 (a test, a broken host) is an answer,
        // not a panic.
        let now = match now.duration_since(UNIX_EPOCH) {
            Ok(since) => i128::from(since.as_secs()),
            Err(before) => -i128::from(before.duration().as_secs()),
        };
        let skew = now - i128::from(signed_at);
        if skew.unsigned_abs() <= u128::from(self.tolerance.as_secs()) {
            Ok(())
        } else {
            Err(VerifyError::timestamp_skew(self.tolerance, skew))
        }
    }
}

impl fmt::Debug for Freshness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Freshness")
            .field("tolerance", &self.tolerance)
            .field(
                "clock",
                &if self.clock.is_some() {
                    "custom"
                } else {
                    "system"
                },
            )
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::VerifyErrorKind;

    const NOW: u64 = 1_614_265_330;

    fn at(secs: u64) -> Freshness {
        Freshness::default().with_clock(move || UNIX_EPOCH + Duration::from_secs(secs))
    }

    #[test]
    fn five_minutes_either_way_by_default() {
        let fresh = at(NOW);
        assert_eq!(fresh.tolerance, Duration::from_secs(300));
        for signed_at in [NOW, NOW - 299, NOW - 300, NOW + 299, NOW + 300] {
            assert!(fresh.check(signed_at).is_ok(), "{signed_at}");
        }
        for signed_at in [NOW - 301, NOW - 600, NOW + 301, NOW + 600, 0, u64::MAX] {
            let err = fresh.check(signed_at).unwrap_err();
            assert_eq!(err.kind(), VerifyErrorKind::OutsideTolerance, "{signed_at}");
        }
    }

    #[test]
    fn the_detail_says_how_far_and_which_way() {
        let old = at(NOW).check(NOW - 600).unwrap_err().to_string();
        assert!(old.contains("600 s in the past"), "{old}");
        assert!(old.contains("300 s"), "{old}");
        let ahead = at(NOW).check(NOW + 600).unwrap_err().to_string();
        assert!(ahead.contains("600 s in the future"), "{ahead}");
    }

    #[test]
    fn a_custom_tolerance() {
        let fresh = at(NOW).with_tolerance(Duration::from_secs(30));
        assert!(fresh.check(NOW - 30).is_ok());
        assert!(fresh.check(NOW - 31).is_err());
        // Sub-second parts of a tolerance do not count: timestamps have whole seconds.
        let fresh = at(NOW).with_tolerance(Duration::from_millis(1500));
        assert!(fresh.check(NOW + 1).is_ok());
        assert!(fresh.check(NOW + 2).is_err());
    }

    #[test]
    fn a_clock_before_1970_does_not_panic() {
        let fresh = Freshness::default().with_clock(|| UNIX_EPOCH - Duration::from_secs(10));
        assert!(fresh.check(0).is_ok());
        assert!(fresh.check(NOW).is_err());
    }

    #[test]
    fn the_system_clock_by_default() {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        assert!(Freshness::default().check(now).is_ok());
        assert!(Freshness::default().check(now - 3600).is_err());
        assert!(format!("{:?}", Freshness::default()).contains("system"));
    }
}
