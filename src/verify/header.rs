//! Reading the signature, timestamp and id headers: present once, visible ASCII, and the
//! timestamp a plain decimal number. Every failure names the header and what is wrong, never
//! its value.

use http::HeaderName;
use http::request::Parts;

use super::VerifyError;

/// The value of header `name`, which must appear exactly once and be visible ASCII (spaces
/// allowed, no tabs, no control characters, no bytes above 0x7E).
///
/// Appearing twice is an error rather than "take the first": a proxy that appends, or a
/// forger who prepends, must not choose which value is checked.
pub(crate) fn single<'a>(parts: &'a Parts, name: &HeaderName) -> Result<&'a str, VerifyError> {
    let mut values = parts.headers.get_all(name).iter();
    let value = values
        .next()
        .ok_or_else(|| VerifyError::missing_header(name.as_str()))?;
    if values.next().is_some() {
        return Err(VerifyError::malformed_header(
            name.as_str(),
            "it appears more than once",
        ));
    }
    let visible = value.as_bytes().iter().all(|b| (0x20..0x7F).contains(b));
    match value.to_str() {
        Ok(text) if visible => Ok(text),
        _ => Err(VerifyError::malformed_header(
            name.as_str(),
            "it is not visible ASCII (control characters or non-ASCII bytes)",
        )),
    }
}

/// The raw values of headers `names` that the request carries, in that order: the signed
/// context of a scheme whose signature covers those headers (called after verification, so
/// each is there once).
pub(crate) fn signed_values<'a>(parts: &'a Parts, names: &[&HeaderName]) -> Vec<&'a [u8]> {
    names
        .iter()
        .filter_map(|name| parts.headers.get(*name))
        .map(|value| value.as_bytes())
        .collect()
}

/// A unix timestamp in seconds, written as a plain unsigned decimal integer: no sign, no
/// spaces, no fraction, no exponent (`u64::from_str` would accept a leading `+`).
pub(crate) fn unix_seconds(name: &str, text: &str) -> Result<u64, VerifyError> {
    let malformed = || {
        VerifyError::malformed_header(
            name,
            "the timestamp is not a plain unsigned decimal integer",
        )
    };
    if text.is_empty() {
        return Err(malformed());
    }
    text.bytes().try_fold(0u64, |acc, b| {
        let digit = u64::from(
            b.checked_sub(b'0')
                .filter(|d| *d <= 9)
                .ok_or_else(malformed)?,
        );
        acc.checked_mul(10)
            .and_then(|acc| acc.checked_add(digit))
            .ok_or_else(|| VerifyError::malformed_header(name, "the timestamp is out of range"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::VerifyErrorKind;
    use crate::verify::testing::kind;
    use http::{HeaderValue, Request};

    const NAME: HeaderName = HeaderName::from_static("x-signature");

    fn parts(values: &[&[u8]]) -> Parts {
        let mut request = Request::post("/").body(()).unwrap();
        for value in values {
            let value = HeaderValue::from_bytes(value).unwrap();
            request.headers_mut().append(NAME, value);
        }
        request.into_parts().0
    }

    #[test]
    fn one_visible_ascii_value() {
        assert_eq!(
            single(&parts(&[b"v1,abc def"]), &NAME).unwrap(),
            "v1,abc def"
        );
        assert_eq!(single(&parts(&[b""]), &NAME).unwrap(), "");
    }

    #[test]
    fn missing() {
        let err = single(&parts(&[]), &NAME).unwrap_err();
        assert_eq!(err.kind(), VerifyErrorKind::MissingHeader);
        assert_eq!(err.to_string(), "the x-signature header is missing");
    }

    #[test]
    fn repeated() {
        let err = single(&parts(&[b"a", b"a"]), &NAME).unwrap_err();
        assert_eq!(err.kind(), VerifyErrorKind::MalformedHeader);
        assert!(err.to_string().contains("appears more than once"), "{err}");
    }

    #[test]
    fn not_visible_ascii() {
        for value in [&b"caf\xc3\xa9"[..], b"\xff\xfe", b"a\tb", b"\x80"] {
            let err = single(&parts(&[value]), &NAME).unwrap_err();
            assert_eq!(err.kind(), VerifyErrorKind::MalformedHeader, "{value:?}");
            assert!(err.to_string().contains("not visible ASCII"), "{err}");
        }
        assert_eq!(
            kind(single(&parts(&["é".as_bytes()]), &NAME)),
            VerifyErrorKind::MalformedHeader
        );
    }

    #[test]
    fn timestamps_are_plain_decimal() {
        assert_eq!(unix_seconds("t", "1614265330").unwrap(), 1_614_265_330);
        assert_eq!(unix_seconds("t", "0").unwrap(), 0);
        assert_eq!(unix_seconds("t", "007").unwrap(), 7);
        assert_eq!(unix_seconds("t", &u64::MAX.to_string()).unwrap(), u64::MAX);
        for bad in [
            "",
            "+1614265330",
            "-1",
            " 1614265330",
            "1614265330 ",
            "1614265330.5",
            "1.6e9",
            "0x10",
            "١٢٣", // Arabic-Indic digits: digits to Unicode, not to the header.
            "18446744073709551616",
        ] {
            let err = unix_seconds("webhook-timestamp", bad).unwrap_err();
            assert_eq!(err.kind(), VerifyErrorKind::MalformedHeader, "{bad:?}");
            assert!(
                err.to_string().starts_with("the webhook-timestamp header"),
                "{err}"
            );
        }
    }
}
