//! Constructors of the values the layer builds and a store only receives (claims, records,
//! inbox entries), for tests and harnesses that drive a store directly.

use bytes::Bytes;
use http::{HeaderMap, StatusCode};

use crate::fingerprint::Fingerprint;
use crate::inbox::InboxEntry;
use crate::store::record::{Record, StoredResponse};
use crate::store::{Claim, StoreKey, Token};

/// A claim of a request with `fingerprint` and a fresh random token, as the layer makes one.
pub fn claim(fingerprint: Fingerprint) -> Claim {
    Claim::new(fingerprint)
}

/// A claim of a request with `fingerprint` and the given `token`.
pub fn claim_with_token(token: Token, fingerprint: Fingerprint) -> Claim {
    Claim::with_token(token, fingerprint)
}

/// An ack-mode record of a request with `fingerprint` (owner unknown).
pub fn record_ack(fingerprint: Fingerprint) -> Record {
    Record::ack(fingerprint)
}

/// A replay-mode record of a request with `fingerprint` and its response (owner unknown).
pub fn record_replay(
    fingerprint: Fingerprint,
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
    trailers: Option<HeaderMap>,
) -> Record {
    Record::replay(
        fingerprint,
        StoredResponse::new(status, headers, body, trailers),
    )
}

/// `record` as written by the claim of `token` (its owner tag set to the token's).
pub fn owned_by(record: Record, token: &Token) -> Record {
    record.owned_by(token)
}

/// The fingerprint of the request that completed `record`'s key.
pub fn fingerprint_of(record: &Record) -> Fingerprint {
    record.fingerprint()
}

/// An inbox entry of `key` carrying `body`, due now, with no kept headers, no order and an
/// empty `id` and `route`, as the layer makes one before setting them.
pub fn inbox_entry(key: StoreKey, body: Bytes, correlation_id: impl Into<String>) -> InboxEntry {
    InboxEntry::new(key, body, correlation_id)
}
