//! The body extractors over arbitrary bodies: JSON paths (one value, a batch, a descendant
//! query) and the canonical fingerprint of fields. Never panics; every key found is valid;
//! the fields fingerprint of a JSON body does not depend on its layout.
#![no_main]

use std::sync::LazyLock;

use bytes::Bytes;
use http::Request;
use libfuzzer_sys::fuzz_target;
use tower_idempotency::key::{
    ExtractKey, FieldsFingerprintKey, IdempotencyKey, JsonPathKey, KeyInput,
};

/// The longest key part the extractors accept, in bytes (documented on `IdempotencyKey::new`).
const MAX_KEY_LEN: usize = 255;

static PATHS: LazyLock<Vec<JsonPathKey>> = LazyLock::new(|| {
    [
        "$.id",
        "$.event.id",
        "$.entry[*].changes[*].value.messages[*].id",
        "$..id",
        "$[0]",
    ]
    .into_iter()
    .map(|p| JsonPathKey::new(p).unwrap())
    .collect()
});

static FIELDS: LazyLock<FieldsFingerprintKey> = LazyLock::new(|| {
    FieldsFingerprintKey::new(["$.message_id", "$.type", "$..amount", "$.items[*]"]).unwrap()
});

fn check(key: &IdempotencyKey) {
    for part in key.parts() {
        assert!(!part.is_empty() && part.len() <= MAX_KEY_LEN);
        assert!(!part.chars().any(char::is_control));
    }
}

fuzz_target!(|data: &[u8]| {
    let (parts, ()) = Request::post("/hook").body(()).unwrap().into_parts();
    let body = Bytes::copy_from_slice(data);
    let input = KeyInput::new(&parts, Some(&body));
    for path in PATHS.iter() {
        if let Ok(Some(key)) = path.extract_key(&input) {
            check(&key);
        }
    }
    let fields = FIELDS.extract_key(&input);
    if let Ok(Some(key)) = &fields {
        check(key);
    }
    // The same JSON value, written compactly: the same fields fingerprint.
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) {
        let compact = Bytes::from(serde_json::to_vec(&value).unwrap());
        let again = FIELDS.extract_key(&KeyInput::new(&parts, Some(&compact)));
        match (&fields, &again) {
            (Ok(a), Ok(b)) => assert_eq!(a, b),
            // Nesting past serde_json's limit fails both ways.
            (Err(_), Err(_)) => {}
            _ => panic!("layout changed the outcome: {fields:?} / {again:?}"),
        }
    }
});
