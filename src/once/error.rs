//! [`OnceError`]: why [`Idempotent::once`](super::Idempotent::once) returned no output.

use std::fmt;

use crate::store::StoreError;

/// Why a [`once`](super::Idempotent::once) call returned no output. `E` is the closure's error.
///
/// ```
/// use tower_idempotency::OnceError;
///
/// let err: OnceError<std::io::Error> = OnceError::InFlight;
/// assert_eq!(err.to_string(), "another call holds this key and has not finished");
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum OnceError<E> {
    /// The closure ran and failed: nothing was recorded, the key is free again.
    Failed(E),
    /// Another call holds the key and has not finished (or did not within the wait).
    InFlight,
    /// The key was used with another payload fingerprint.
    Mismatch,
    /// The key was extracted from the input and the input had none: nothing ran.
    MissingKey,
    /// The store failed: the closure did not run.
    Store(StoreError),
    /// The output (or the payload) could not be encoded as JSON; the key was released.
    Encode(serde_json::Error),
    /// The recorded output could not be decoded into the type asked for.
    Decode(serde_json::Error),
    /// The key was recorded without an output (by an HTTP layer in ack mode, on the same
    /// namespace and key).
    NoOutput,
    /// `Idempotent::once_in_tx` (features `postgres`, `sqlite`): the claim was no longer ours
    /// when its record was to be written (its lease ran out unrenewed, the database stalled):
    /// the transaction was rolled back, so neither the effect nor the record happened.
    Lost,
}

impl<E: fmt::Display> fmt::Display for OnceError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OnceError::Failed(err) => write!(f, "the closure failed: {err}"),
            OnceError::InFlight => f.write_str("another call holds this key and has not finished"),
            OnceError::Mismatch => f.write_str("the key was used with another payload"),
            OnceError::MissingKey => f.write_str("the input has no idempotency key"),
            OnceError::Store(err) => write!(f, "idempotency store error: {err}"),
            OnceError::Encode(err) => write!(f, "could not encode as JSON: {err}"),
            OnceError::Decode(err) => write!(f, "could not decode the recorded output: {err}"),
            OnceError::NoOutput => f.write_str("the key was recorded without an output"),
            OnceError::Lost => {
                f.write_str("the claim was lost before its record: the transaction was rolled back")
            }
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for OnceError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            OnceError::Failed(err) => Some(err),
            OnceError::Store(err) => Some(err),
            OnceError::Encode(err) | OnceError::Decode(err) => Some(err),
            _ => None,
        }
    }
}
