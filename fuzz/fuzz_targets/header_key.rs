//! `HeaderKey` over arbitrary header bytes: never panics, and accepts exactly the values that
//! are 1 to 255 bytes of visible ASCII and spaces.
#![no_main]

use http::{HeaderValue, Request};
use libfuzzer_sys::fuzz_target;
use tower_idempotency::key::{ExtractKey, HeaderKey, KeyInput};

/// The longest key part the extractors accept, in bytes (documented on `IdempotencyKey::new`).
const MAX_KEY_LEN: usize = 255;

fuzz_target!(|data: &[u8]| {
    let Ok(value) = HeaderValue::from_bytes(data) else {
        return;
    };
    let (parts, ()) = Request::post("/hook")
        .header("idempotency-key", value)
        .body(())
        .unwrap()
        .into_parts();
    let result = HeaderKey::idempotency_key().extract_key(&KeyInput::new(&parts, None));
    let expected = !data.is_empty()
        && data.len() <= MAX_KEY_LEN
        && data.iter().all(|b| (0x20..0x7f).contains(b));
    match result {
        Ok(Some(key)) => {
            assert!(expected, "accepted {data:?}");
            assert_eq!(key.as_str().as_bytes(), data);
        }
        Ok(None) => panic!("a present header is never `None`"),
        Err(_) => assert!(!expected, "rejected {data:?}"),
    }
});
