//! The page's anti-forgery tokens: an hour's number and a keyed BLAKE3 hash of it under the
//! service's secret, valid for a day. A form carries one; a browser's `POST` without a valid
//! one is refused (see `AdminService`).

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use http::HeaderMap;

/// How many hours a token stays valid.
const VALID_HOURS: u64 = 24;

/// The service's key for its tokens.
#[derive(Clone)]
pub(super) struct Csrf {
    key: [u8; 32],
}

impl fmt::Debug for Csrf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Csrf(..)")
    }
}

impl Csrf {
    /// A key of this process's own: its tokens are valid here only.
    pub(super) fn random() -> Self {
        let mut key = [0; 32];
        if getrandom::fill(&mut key).is_err() {
            // No randomness from the system: a key no page can guess is still needed.
            let seed = format!("{:?}{}", SystemTime::now(), std::process::id());
            key = blake3::hash(seed.as_bytes()).into();
        }
        Csrf { key }
    }

    /// The key derived from a secret shared by the processes behind one address.
    pub(super) fn shared(secret: &[u8]) -> Self {
        let key = blake3::derive_key("tower-idempotency admin page csrf v1", secret);
        Csrf { key }
    }

    /// The token of the current hour.
    pub(super) fn token(&self) -> String {
        self.token_at(hour())
    }

    fn token_at(&self, hour: u64) -> String {
        let mac = blake3::keyed_hash(&self.key, &hour.to_be_bytes());
        let mut out = format!("{hour:x}.");
        for byte in &mac.as_bytes()[..16] {
            out.push_str(&format!("{byte:02x}"));
        }
        out
    }

    /// Whether `token` is one of this key's of the last day.
    pub(super) fn check(&self, token: &str) -> bool {
        self.check_at(token, hour())
    }

    fn check_at(&self, token: &str, now: u64) -> bool {
        let Some(Ok(hour)) = token
            .split_once('.')
            .map(|(h, _)| u64::from_str_radix(h, 16))
        else {
            return false;
        };
        let fresh = hour <= now + 1 && hour + VALID_HOURS >= now;
        fresh && same(token.as_bytes(), self.token_at(hour).as_bytes())
    }
}

fn hour() -> u64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH);
    since.unwrap_or_default().as_secs() / 3600
}

/// Whether `a` and `b` are equal, in a time that does not tell where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0, |diff, (x, y)| diff | (x ^ y)) == 0
}

/// Whether a `POST` needs the anti-forgery token: one that another site's page could have
/// sent on a signed-in operator's behalf.
///
/// That is a request from a browser, which sends at least one of `Origin`, `Sec-Fetch-Site`
/// (both on every form `POST` of a current one) and `Cookie` (where the application's login
/// is a cookie); and, whatever its headers, one with a body of any type but JSON: a page may
/// send a form, a multipart form, plain text or a ping (`text/ping`) to another site without
/// asking it first (a CORS preflight), and JSON only after asking. So an old browser that
/// sends none of those headers, logged in with HTTP basic authentication, is covered too. A
/// client that sends none of those headers and no body type or JSON (curl without `-d`, a
/// JSON client with a bearer token) needs no token.
pub(super) fn needs_token(headers: &HeaderMap) -> bool {
    let from_browser = ["origin", "sec-fetch-site", "cookie"]
        .iter()
        .any(|name| headers.contains_key(*name));
    // A type that is not text: nothing legitimate sends one, so err on the safe side.
    let not_json = (headers.get_all(http::header::CONTENT_TYPE).iter()).any(|value| {
        value
            .to_str()
            .map_or(true, |v| !essence_is(v, "application/json"))
    });
    from_browser || not_json
}

/// Whether a `Content-Type` of the request has this essence (type and subtype, in any case,
/// parameters aside), as the Fetch standard compares them.
pub(super) fn content_type_is(headers: &HeaderMap, essence: &str) -> bool {
    (headers.get_all(http::header::CONTENT_TYPE).iter())
        .filter_map(|value| value.to_str().ok())
        .any(|value| essence_is(value, essence))
}

/// Whether the content type `value` has this essence.
fn essence_is(value: &str, essence: &str) -> bool {
    let own = value.split(';').next().unwrap_or_default().trim();
    own.eq_ignore_ascii_case(essence)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn a_token_is_valid_for_a_day_under_its_key_only() {
        let csrf = Csrf::shared(b"secret");
        let token = csrf.token_at(1000);
        assert!(csrf.check_at(&token, 1000));
        assert!(csrf.check_at(&token, 1000 + VALID_HOURS));
        assert!(!csrf.check_at(&token, 1001 + VALID_HOURS));
        assert!(csrf.check_at(&token, 999));
        assert!(!csrf.check_at(&token, 998));
        // Another process with the same secret accepts it; another key does not.
        assert!(Csrf::shared(b"secret").check_at(&token, 1000));
        assert!(!Csrf::shared(b"other").check_at(&token, 1000));
        assert!(!Csrf::random().check_at(&token, 1000));
        // Tampered, cut, empty or made up.
        let mut tampered = token.clone().into_bytes();
        let last = tampered.len() - 1;
        tampered[last] = if tampered[last] == b'0' { b'1' } else { b'0' };
        assert!(!csrf.check_at(std::str::from_utf8(&tampered).unwrap(), 1000));
        assert!(!csrf.check_at(&token[..token.len() - 1], 1000));
        assert!(!csrf.check_at("", 1000));
        assert!(!csrf.check_at("3e8.", 1000));
        assert!(!csrf.check_at("zz.00", 1000));
        assert!(csrf.check(&csrf.token()));
    }

    #[test]
    fn browsers_and_cross_site_bodies_need_a_token() {
        let mut headers = HeaderMap::new();
        assert!(!needs_token(&headers));
        headers.insert("authorization", "Bearer x".parse().unwrap());
        assert!(!needs_token(&headers));
        headers.insert("content-type", "application/json".parse().unwrap());
        assert!(!needs_token(&headers));
        for name in ["origin", "sec-fetch-site", "cookie"] {
            let mut browser = headers.clone();
            browser.insert(name, "x".parse().unwrap());
            assert!(needs_token(&browser), "{name}");
        }
        // Without any browser header, a body another site's page can send unasked.
        for content_type in [
            "application/x-www-form-urlencoded",
            "Application/X-WWW-Form-Urlencoded; charset=UTF-8",
            "multipart/form-data; boundary=x",
            " text/plain ;charset=utf-8",
        ] {
            headers.insert("content-type", content_type.parse().unwrap());
            assert!(needs_token(&headers), "{content_type}");
        }
        headers.insert(
            "content-type",
            HeaderValue::from_bytes(b"\xfftext").unwrap(),
        );
        assert!(needs_token(&headers));
        // One such value among several is enough.
        headers.insert("content-type", "application/json".parse().unwrap());
        headers.append("content-type", "text/plain".parse().unwrap());
        assert!(needs_token(&headers));
        // Any other type too (a ping, an unknown one); JSON, in any case, does not.
        for content_type in ["text/ping", "text/plainx", "application/octet-stream"] {
            headers.insert("content-type", content_type.parse().unwrap());
            assert!(needs_token(&headers), "{content_type}");
        }
        for content_type in ["application/json", "Application/JSON; charset=utf-8"] {
            headers.insert("content-type", content_type.parse().unwrap());
            assert!(!needs_token(&headers), "{content_type}");
        }
    }
}
