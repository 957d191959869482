//! The kept headers of an entry as bytes, one format for every backend that stores entries
//! outside the process (Redis, SQL).

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue};

use crate::store::{StoreError, StoreErrorKind};

/// The kept headers, each as its name's length (2 bytes), name, value's length (4 bytes) and
/// value.
pub(crate) fn encode_headers(headers: &HeaderMap) -> Bytes {
    let mut out = BytesMut::new();
    for (name, value) in headers {
        out.put_u16(name.as_str().len() as u16);
        out.put_slice(name.as_str().as_bytes());
        out.put_u32(value.len() as u32);
        out.put_slice(value.as_bytes());
    }
    out.freeze()
}

/// The headers [`encode_headers`] wrote; a `Corrupt` error for anything else.
pub(crate) fn decode_headers(mut bytes: &[u8]) -> Result<HeaderMap, StoreError> {
    let mut headers = HeaderMap::new();
    while bytes.has_remaining() {
        let name = take_part(&mut bytes, 2)?;
        let name = HeaderName::from_bytes(name).map_err(|_| corrupt("a header name"))?;
        let value = take_part(&mut bytes, 4)?;
        let value = HeaderValue::from_bytes(value).map_err(|_| corrupt("a header value"))?;
        headers.append(name, value);
    }
    Ok(headers)
}

/// A part prefixed by its length in `width` big-endian bytes.
fn take_part<'a>(bytes: &mut &'a [u8], width: usize) -> Result<&'a [u8], StoreError> {
    if bytes.len() < width {
        return Err(corrupt("headers are cut short"));
    }
    let len = match width {
        2 => bytes.get_u16() as usize,
        _ => bytes.get_u32() as usize,
    };
    if bytes.len() < len {
        return Err(corrupt("headers are cut short"));
    }
    let (part, rest) = bytes.split_at(len);
    *bytes = rest;
    Ok(part)
}

fn corrupt(what: &str) -> StoreError {
    StoreError::with_source(StoreErrorKind::Corrupt, format!("inbox: {what}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip() {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        headers.append("x-multi", HeaderValue::from_static("a: b"));
        headers.append("x-multi", HeaderValue::from_static(""));
        let decoded = decode_headers(&encode_headers(&headers)).unwrap();
        assert_eq!(decoded, headers);
        assert!(decode_headers(&encode_headers(&headers)[..5]).is_err());
        assert!(decode_headers(b"no length prefix").is_err());
    }
}
