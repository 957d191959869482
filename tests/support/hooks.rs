//! Store hooks shared by the test binaries (`test_util::store::Hooked` runs them around each
//! call of a real store).

use tower_idempotency::store::{StoreError, StoreErrorKind, Target};
use tower_idempotency::test_util::store::{Call, Hook};

/// Releases and renewals never land, as for a holder that lost the store: its claim stays
/// until its lease runs out.
#[derive(Clone)]
pub struct Unreleased;

impl Hook for Unreleased {
    async fn before(&self, call: Call, _: &[Target]) -> Result<(), StoreError> {
        match call {
            Call::Release | Call::Renew => Err(StoreError::new(StoreErrorKind::Unavailable)),
            Call::Reserve | Call::Complete => Ok(()),
        }
    }
}
