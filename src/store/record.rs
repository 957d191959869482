//! What is kept for a completed key, and the compact, versioned byte encoding that shared stores
//! (Redis, SQL) write.
//!
//! In ack mode a record is the request fingerprint and an owner tag: 12 bytes encoded. In replay mode it also
//! holds the original status, the allow-listed headers, the body and the trailers.
//!
//! The layer builds the records a store receives; a test that calls a store itself builds them
//! with `test_util::values` (feature `test-util`):
//!
//! ```
//! use bytes::Bytes;
//! use http::{HeaderMap, StatusCode};
//! use tower_idempotency::fingerprint::Fingerprint;
//! use tower_idempotency::store::record::Record;
//! use tower_idempotency::test_util::values;
//!
//! let fp = Fingerprint::of_bytes(b"{}");
//! let ack = values::record_ack(fp);
//! assert_eq!(ack.encode().len(), 12);
//!
//! let body = Bytes::from_static(b"{\"id\":1}");
//! let replay = values::record_replay(fp, StatusCode::CREATED, HeaderMap::new(), body, None);
//! let decoded = Record::decode(&replay.encode()).unwrap();
//! assert_eq!(decoded, replay);
//! ```

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

use super::error::{StoreError, StoreErrorKind};
use super::token::Token;
use crate::fingerprint::Fingerprint;

const TAG_IN_FLIGHT: u8 = 0x01;
/// Records of the first format, without an owner tag: still decoded.
const TAG_ACK_V1: u8 = 0x02;
const TAG_REPLAY_V1: u8 = 0x03;
const TAG_ACK: u8 = 0x04;
const TAG_REPLAY: u8 = 0x05;

/// The length of the owner tag a record keeps: the first bytes of its claim's random token.
///
/// Three bytes: with the tag byte and the 8-byte fingerprint an ack record is 12 bytes, the
/// most that fits Redis's smallest string allocation (88 bytes per key instead of 104). The tag
/// only tells a retried completion whose first attempt landed ("already written") from a claim
/// lost to another owner; two owners of one key share a tag with probability 2⁻²⁴, and then
/// only that log line is wrong, never what is recorded.
pub(crate) const OWNER_LEN: usize = 3;

/// The length of an encoded in-flight value: tag, token, fingerprint.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) const IN_FLIGHT_LEN: usize = 1 + 16 + Fingerprint::LEN;

/// The length of [`StoredValue::owner_prefix`]: the tag and the token.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) const OWNER_PREFIX_LEN: usize = 1 + 16;

/// A response kept for replay: status, allow-listed headers, body and trailers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct StoredResponse {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
    trailers: Option<HeaderMap>,
}

impl StoredResponse {
    /// A stored response from its parts. `headers` should already be filtered to the allow-list.
    pub(crate) fn new(
        status: StatusCode,
        headers: HeaderMap,
        body: Bytes,
        trailers: Option<HeaderMap>,
    ) -> Self {
        StoredResponse {
            status,
            headers,
            body,
            trailers,
        }
    }

    /// The stored (allow-listed) headers.
    pub(crate) fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    /// The original body.
    pub(crate) fn body(&self) -> &Bytes {
        &self.body
    }

    /// The original trailers, if the response had any.
    pub(crate) fn trailers(&self) -> Option<&HeaderMap> {
        self.trailers.as_ref()
    }

    /// Splits the stored response into its parts.
    pub(crate) fn into_parts(self) -> (StatusCode, HeaderMap, Bytes, Option<HeaderMap>) {
        (self.status, self.headers, self.body, self.trailers)
    }
}

/// The record of a completed key.
///
/// The layer builds records; a store receives them in
/// [`complete`](crate::IdempotencyStore::complete) and gives them back in
/// [`reserve`](crate::IdempotencyStore::reserve)
/// ([`Reservation::Completed`](super::Reservation::Completed)), keeping them as they are or as
/// the bytes of [`encode`](Self::encode).
///
/// Two records are equal when their encodings are (`expires_in`, which
/// says when one was read, is not part of it).
#[derive(Clone, Debug)]
pub struct Record {
    fingerprint: Fingerprint,
    /// The first bytes of the token of the claim that completed the key (zero when unknown):
    /// how a retried completion recognises its own earlier write.
    owner: [u8; OWNER_LEN],
    response: Option<Box<StoredResponse>>,
    /// How long the store said it keeps the record, when it was read, in milliseconds (8
    /// bytes: every cached and stored record carries this field).
    expires_in: Option<std::num::NonZeroU64>,
}

impl PartialEq for Record {
    fn eq(&self, other: &Self) -> bool {
        self.fingerprint == other.fingerprint
            && self.owner == other.owner
            && self.response == other.response
    }
}

impl Eq for Record {}

impl Record {
    /// An ack-mode record: duplicates get the configured acknowledgement.
    pub(crate) fn ack(fingerprint: Fingerprint) -> Self {
        Record {
            fingerprint,
            owner: [0; OWNER_LEN],
            response: None,
            expires_in: None,
        }
    }

    /// A replay-mode record: duplicates get `response` again.
    pub(crate) fn replay(fingerprint: Fingerprint, response: StoredResponse) -> Self {
        Record {
            fingerprint,
            owner: [0; OWNER_LEN],
            response: Some(Box::new(response)),
            expires_in: None,
        }
    }

    /// The record, read from a store that keeps it `left` longer (from a moment during the
    /// read). What a store sets on the records its [`reserve`](crate::IdempotencyStore::reserve)
    /// answers when it knows (the memory and SQL stores do): a local cache then keeps the
    /// record no longer, without asking the store again. Not part of the record's encoding.
    pub fn expiring_in(mut self, left: std::time::Duration) -> Self {
        let millis = u64::try_from(left.as_millis()).unwrap_or(u64::MAX);
        self.expires_in = std::num::NonZeroU64::new(millis);
        self
    }

    /// How long the store that returned this record said it keeps it (from a moment during the
    /// read), when it said.
    pub(crate) fn expires_in(&self) -> Option<std::time::Duration> {
        self.expires_in
            .map(|millis| std::time::Duration::from_millis(millis.get()))
    }

    /// The record as written by the claim of `token`.
    pub(crate) fn owned_by(mut self, token: &Token) -> Self {
        self.owner = owner_tag(token);
        self
    }

    /// Whether the claim of `token` wrote this record.
    pub fn is_owned_by(&self, token: &Token) -> bool {
        self.owner == owner_tag(token)
    }

    /// The fingerprint of the request that completed the key.
    pub(crate) fn fingerprint(&self) -> Fingerprint {
        self.fingerprint
    }

    /// The stored response, in replay mode.
    pub(crate) fn response(&self) -> Option<&StoredResponse> {
        self.response.as_deref()
    }

    /// Takes the stored response out of the record.
    pub(crate) fn into_response(self) -> Option<StoredResponse> {
        self.response.map(|r| *r)
    }

    /// The encoded record, as written by shared stores: compact, versioned bytes that
    /// [`decode`](Self::decode) reads back (with the owner the record holds). For a store of
    /// your own that keeps records as bytes.
    pub fn encode(&self) -> Bytes {
        self.encode_with_owner(&self.owner)
    }

    /// The record of bytes written by [`encode`](Self::encode), by this version of the crate or
    /// an earlier one.
    ///
    /// Never panics: truncated or unknown data, or anything else than a record, is a
    /// [`StoreErrorKind::Corrupt`] error.
    pub fn decode(bytes: &[u8]) -> Result<Record, StoreError> {
        match StoredValue::decode(bytes)? {
            StoredValue::Completed(record) => Ok(record),
            StoredValue::InFlight { .. } => Err(StoreError::new(StoreErrorKind::Corrupt)),
        }
    }

    /// The encoded record as completed by the claim of `token` (its owner tag set to the
    /// token's), whatever owner the record holds: what a store writes in `complete`.
    #[cfg(any(test, feature = "postgres", feature = "sqlite"))]
    pub(crate) fn encode_for(&self, token: &Token) -> Bytes {
        let mut out = BytesMut::with_capacity(self.encoded_len());
        self.put_for(token, &mut out);
        out.freeze()
    }

    fn encode_with_owner(&self, owner: &[u8; OWNER_LEN]) -> Bytes {
        let mut out = BytesMut::with_capacity(self.encoded_len());
        self.put_with_owner(owner, &mut out);
        out.freeze()
    }

    /// Appends [`encode_for`](Self::encode_for)'s bytes to `out`, so that a store can send
    /// them with other arguments out of one buffer.
    #[cfg(any(test, feature = "redis", feature = "postgres", feature = "sqlite"))]
    pub(crate) fn put_for(&self, token: &Token, out: &mut BytesMut) {
        self.put_with_owner(&owner_tag(token), out);
    }

    /// The length of the encoded record, exactly.
    pub(crate) fn encoded_len(&self) -> usize {
        let head = 1 + OWNER_LEN + Fingerprint::LEN;
        let Some(response) = &self.response else {
            return head;
        };
        let trailers = response.trailers.as_ref().map_or(0, headers_len);
        head + 2 + headers_len(&response.headers) + 4 + response.body.len() + 1 + trailers
    }

    fn put_with_owner(&self, owner: &[u8; OWNER_LEN], out: &mut BytesMut) {
        let Some(response) = &self.response else {
            out.put_u8(TAG_ACK);
            out.put_slice(owner);
            out.put_slice(self.fingerprint.as_bytes());
            return;
        };
        out.put_u8(TAG_REPLAY);
        out.put_slice(owner);
        out.put_slice(self.fingerprint.as_bytes());
        out.put_u16(response.status.as_u16());
        put_headers(out, &response.headers);
        out.put_u32(response.body.len() as u32);
        out.put_slice(&response.body);
        match &response.trailers {
            None => out.put_u8(0),
            Some(trailers) => {
                out.put_u8(1);
                put_headers(out, trailers);
            }
        }
    }
}

/// The owner tag of `token`.
fn owner_tag(token: &Token) -> [u8; OWNER_LEN] {
    let mut tag = [0; OWNER_LEN];
    tag.copy_from_slice(&token.as_bytes()[..OWNER_LEN]);
    tag
}

/// What [`put_headers`] writes for `headers`.
fn headers_len(headers: &HeaderMap) -> usize {
    2 + headers
        .iter()
        .map(|(name, value)| 2 + name.as_str().len() + 4 + value.len())
        .sum::<usize>()
}

fn put_headers(out: &mut BytesMut, headers: &HeaderMap) {
    out.put_u16(headers.len() as u16);
    for (name, value) in headers {
        out.put_u16(name.as_str().len() as u16);
        out.put_slice(name.as_str().as_bytes());
        out.put_u32(value.len() as u32);
        out.put_slice(value.as_bytes());
    }
}

/// A decoded store value: an in-flight claim or a completed record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum StoredValue {
    /// A claim whose owner has not finished.
    InFlight {
        /// The owner's token.
        token: Token,
        /// The fingerprint of the owner's request.
        fingerprint: Fingerprint,
    },
    /// A completed record.
    Completed(Record),
}

impl StoredValue {
    /// Encodes an in-flight claim: `[0x01][token: 16][fingerprint: 16]`.
    ///
    /// Shared stores compare the first 17 bytes ([`StoredValue::owner_prefix`]) to check the
    /// token in complete and release.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn encode_in_flight(token: &Token, fingerprint: &Fingerprint) -> Bytes {
        let mut out = BytesMut::with_capacity(IN_FLIGHT_LEN);
        Self::put_in_flight(token, fingerprint, &mut out);
        out.freeze()
    }

    /// Appends [`encode_in_flight`](Self::encode_in_flight)'s bytes to `out`.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn put_in_flight(token: &Token, fingerprint: &Fingerprint, out: &mut BytesMut) {
        out.put_u8(TAG_IN_FLIGHT);
        out.put_slice(token.as_bytes());
        out.put_slice(fingerprint.as_bytes());
    }

    /// The first 17 bytes of the in-flight value of `token`: what a token check compares.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn owner_prefix(token: &Token) -> Bytes {
        let mut out = BytesMut::with_capacity(OWNER_PREFIX_LEN);
        Self::put_owner_prefix(token, &mut out);
        out.freeze()
    }

    /// Appends [`owner_prefix`](Self::owner_prefix)'s bytes to `out`.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn put_owner_prefix(token: &Token, out: &mut BytesMut) {
        out.put_u8(TAG_IN_FLIGHT);
        out.put_slice(token.as_bytes());
    }

    /// Decodes a value written by [`Record::encode`] or [`StoredValue::encode_in_flight`].
    ///
    /// Never panics: truncated or unknown data is a [`StoreErrorKind::Corrupt`] error.
    pub(crate) fn decode(bytes: &[u8]) -> Result<StoredValue, StoreError> {
        let mut r = Reader(bytes);
        let value = match r.u8()? {
            TAG_IN_FLIGHT => StoredValue::InFlight {
                token: Token::from_bytes(r.array()?),
                fingerprint: Fingerprint::from_bytes(r.array()?),
            },
            tag @ (TAG_ACK | TAG_ACK_V1) => {
                let owner = if tag == TAG_ACK {
                    r.array()?
                } else {
                    [0; OWNER_LEN]
                };
                let mut record = Record::ack(Fingerprint::from_bytes(r.array()?));
                record.owner = owner;
                StoredValue::Completed(record)
            }
            tag @ (TAG_REPLAY | TAG_REPLAY_V1) => {
                let owner = if tag == TAG_REPLAY {
                    r.array()?
                } else {
                    [0; OWNER_LEN]
                };
                let fingerprint = Fingerprint::from_bytes(r.array()?);
                let status = StatusCode::from_u16(r.u16()?).map_err(corrupt)?;
                let headers = r.headers()?;
                let len = r.u32()? as usize;
                let body = Bytes::copy_from_slice(r.take(len)?);
                let trailers = match r.u8()? {
                    0 => None,
                    1 => Some(r.headers()?),
                    _ => return Err(StoreError::new(StoreErrorKind::Corrupt)),
                };
                let mut record = Record::replay(
                    fingerprint,
                    StoredResponse::new(status, headers, body, trailers),
                );
                record.owner = owner;
                StoredValue::Completed(record)
            }
            _ => return Err(StoreError::new(StoreErrorKind::Corrupt)),
        };
        if !r.0.is_empty() {
            return Err(StoreError::new(StoreErrorKind::Corrupt));
        }
        Ok(value)
    }
}

fn corrupt<E: std::error::Error + Send + Sync + 'static>(e: E) -> StoreError {
    StoreError::with_source(StoreErrorKind::Corrupt, e)
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], StoreError> {
        if self.0.len() < n {
            return Err(StoreError::new(StoreErrorKind::Corrupt));
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], StoreError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8, StoreError> {
        Ok(self.array::<1>()?[0])
    }

    fn u16(&mut self) -> Result<u16, StoreError> {
        Ok(u16::from_be_bytes(self.array()?))
    }

    fn u32(&mut self) -> Result<u32, StoreError> {
        Ok(u32::from_be_bytes(self.array()?))
    }

    fn headers(&mut self) -> Result<HeaderMap, StoreError> {
        let count = self.u16()? as usize;
        let mut headers = HeaderMap::with_capacity(count.min(64));
        for _ in 0..count {
            let len = self.u16()? as usize;
            let name = HeaderName::from_bytes(self.take(len)?).map_err(corrupt)?;
            let len = self.u32()? as usize;
            let value = HeaderValue::from_bytes(self.take(len)?).map_err(corrupt)?;
            headers.append(name, value);
        }
        Ok(headers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Record {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        headers.append("x-multi", HeaderValue::from_static("a"));
        headers.append("x-multi", HeaderValue::from_static("b"));
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        Record::replay(
            Fingerprint::of_bytes(b"x"),
            StoredResponse::new(
                StatusCode::CREATED,
                headers,
                Bytes::from_static(b"{\"order\":\"ord_1\"}"),
                Some(trailers),
            ),
        )
    }

    #[test]
    fn round_trips() {
        let record = sample();
        assert_eq!(
            StoredValue::decode(&record.encode()).unwrap(),
            StoredValue::Completed(record)
        );
        let ack = Record::ack(Fingerprint::of_bytes(b"y"));
        assert_eq!(ack.encode().len(), 12);
        assert_eq!(
            StoredValue::decode(&ack.encode()).unwrap(),
            StoredValue::Completed(ack)
        );
        let token = Token::random();
        let fp = Fingerprint::of_bytes(b"z");
        let in_flight = StoredValue::encode_in_flight(&token, &fp);
        assert_eq!(in_flight.len(), IN_FLIGHT_LEN);
        assert!(in_flight.starts_with(&StoredValue::owner_prefix(&token)));
        assert_eq!(
            StoredValue::decode(&in_flight).unwrap(),
            StoredValue::InFlight {
                token,
                fingerprint: fp
            }
        );
    }

    /// `encoded_len` is exact (the Redis store sizes one buffer for all its arguments with it),
    /// and the bytes put into a shared buffer are the ones `encode_for` returns.
    #[test]
    fn encoded_len_is_exact_and_put_matches_encode() {
        let token = Token::random();
        let without_trailers = Record::replay(
            Fingerprint::of_bytes(b"w"),
            StoredResponse::new(StatusCode::OK, HeaderMap::new(), Bytes::new(), None),
        );
        for record in [
            sample(),
            without_trailers,
            Record::ack(Fingerprint::of_bytes(b"y")),
        ] {
            assert_eq!(record.encoded_len(), record.encode().len());
            let mut out = BytesMut::from(&b"prefix"[..]);
            record.put_for(&token, &mut out);
            assert_eq!(&out[..6], b"prefix");
            assert_eq!(&out[6..], &record.encode_for(&token)[..]);
        }
        let mut out = BytesMut::new();
        StoredValue::put_owner_prefix(&token, &mut out);
        assert_eq!(out.len(), OWNER_PREFIX_LEN);
        assert_eq!(&out[..], &StoredValue::owner_prefix(&token)[..]);
        // The Redis `complete` scripts read a record's owner tag (its bytes after the tag
        // byte) as the owner prefix's bytes after its tag byte.
        assert_eq!(&out[1..1 + OWNER_LEN], &owner_tag(&token)[..]);
        for record in [sample(), Record::ack(Fingerprint::of_bytes(b"y"))] {
            let encoded = record.encode_for(&token);
            assert!(matches!(encoded[0], 4 | 5), "{}", encoded[0]);
            assert_eq!(&encoded[1..1 + OWNER_LEN], &out[1..1 + OWNER_LEN]);
        }
    }

    #[test]
    fn truncated_or_garbage_is_corrupt_not_a_panic() {
        let encoded = sample().encode();
        for len in 0..encoded.len() {
            let err = StoredValue::decode(&encoded[..len]).unwrap_err();
            assert_eq!(err.kind(), StoreErrorKind::Corrupt);
        }
        assert!(StoredValue::decode(&[0x7f, 1, 2]).is_err());
        let mut extra = encoded.to_vec();
        extra.push(0);
        assert!(StoredValue::decode(&extra).is_err());
    }
}

/// The encoding's properties, moved from `tests/http/properties.rs` when the encoding became
/// internal.
#[cfg(test)]
mod properties {
    use bytes::Bytes;
    use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
    use proptest::prelude::*;

    use super::{Record, StoredResponse, StoredValue};
    use crate::fingerprint::Fingerprint;
    use crate::store::Token;

    fn header_name() -> impl Strategy<Value = HeaderName> {
        "[a-z0-9][a-z0-9!#$%&'*+.^_`|~-]{0,20}"
            .prop_map(|name| HeaderName::from_bytes(name.as_bytes()).unwrap())
    }

    fn header_value() -> impl Strategy<Value = HeaderValue> {
        prop::collection::vec(prop_oneof![0x20u8..0x7f, Just(b'\t'), 0x80u8..=0xff], 0..48)
            .prop_map(|bytes| HeaderValue::from_bytes(&bytes).unwrap())
    }

    fn header_map() -> impl Strategy<Value = HeaderMap> {
        prop::collection::vec((header_name(), header_value()), 0..12).prop_map(|pairs| {
            let mut map = HeaderMap::new();
            for (name, value) in pairs {
                map.append(name, value);
            }
            map
        })
    }

    fn record() -> impl Strategy<Value = Record> {
        let fingerprint = any::<[u8; Fingerprint::LEN]>().prop_map(Fingerprint::from_bytes);
        let response = (
            100u16..=999,
            header_map(),
            prop::collection::vec(any::<u8>(), 0..2048),
            prop::option::of(header_map()),
        )
            .prop_map(|(status, headers, body, trailers)| {
                StoredResponse::new(
                    StatusCode::from_u16(status).unwrap(),
                    headers,
                    Bytes::from(body),
                    trailers,
                )
            });
        (fingerprint, prop::option::of(response)).prop_map(|(fp, response)| match response {
            Some(response) => Record::replay(fp, response),
            None => Record::ack(fp),
        })
    }

    proptest! {
        #[test]
        fn records_round_trip(record in record()) {
            let encoded = record.encode();
            let decoded = StoredValue::decode(&encoded).unwrap();
            prop_assert_eq!(decoded, StoredValue::Completed(record));
        }

        #[test]
        fn in_flight_values_round_trip(token in any::<[u8; 16]>(), fp in any::<[u8; Fingerprint::LEN]>()) {
            let (token, fingerprint) = (Token::from_bytes(token), Fingerprint::from_bytes(fp));
            let encoded = StoredValue::encode_in_flight(&token, &fingerprint);
            prop_assert!(encoded.starts_with(&StoredValue::owner_prefix(&token)));
            prop_assert_eq!(
                StoredValue::decode(&encoded).unwrap(),
                StoredValue::InFlight { token, fingerprint }
            );
        }

        #[test]
        fn decode_never_panics_on_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..1024)) {
            let _ = StoredValue::decode(&bytes);
        }

        #[test]
        fn decode_never_panics_on_damaged_records(
            record in record(),
            edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 1..8),
        ) {
            let mut bytes = record.encode().to_vec();
            for (at, byte, op) in edits {
                match op {
                    0 if !bytes.is_empty() => {
                        let i = at.index(bytes.len());
                        bytes[i] = byte;
                    }
                    1 => {
                        let i = at.index(bytes.len() + 1);
                        bytes.insert(i, byte);
                    }
                    _ => {
                        let i = at.index(bytes.len() + 1);
                        bytes.truncate(i);
                    }
                }
            }
            // Whatever decodes is a well-formed value: it encodes and decodes again.
            if let Ok(StoredValue::Completed(record)) = StoredValue::decode(&bytes) {
                let again = StoredValue::decode(&record.encode()).unwrap();
                prop_assert_eq!(again, StoredValue::Completed(record));
            }
        }
    }
}
