//! Property tests (proptest): key validation and composite keys, canonical field fingerprints,
//! the record encoding, and decoding of arbitrary bytes.

use bytes::Bytes;
use http::{HeaderValue, Request};
use proptest::prelude::*;
use serde_json::Value;
use tower_idempotency::key::{
    ExtractKey, FieldsFingerprintKey, HeaderKey, IdempotencyKey, JsonPathKey, KeyErrorKind,
    KeyInput,
};

/// The longest key part the extractors accept, in bytes (documented on `IdempotencyKey::new`).
const MAX_KEY_LEN: usize = 255;

// ---------------------------------------------------------------------------------------------
// Helpers

/// Runs `extractor` over a POST with `headers` and `body`.
fn extract(
    extractor: &impl ExtractKey,
    headers: &[(&str, HeaderValue)],
    body: &[u8],
) -> Result<Option<IdempotencyKey>, tower_idempotency::key::KeyError> {
    let mut builder = Request::post("/hook");
    for (name, value) in headers {
        builder = builder.header(*name, value.clone());
    }
    let (parts, ()) = builder.body(()).unwrap().into_parts();
    let body = Bytes::copy_from_slice(body);
    extractor.extract_key(&KeyInput::new(&parts, Some(&body)))
}

/// A tiny deterministic generator for layout choices (member order, whitespace, escapes).
struct Choices(u64);

impl Choices {
    fn next(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) % n as u64) as usize
    }

    fn whitespace(&mut self, out: &mut String) {
        out.push_str(["", "", " ", "\n", "\t", "\r\n  "][self.next(6)]);
    }

    fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.next(i + 1);
            items.swap(i, j);
        }
    }
}

/// A JSON string literal, with some characters randomly written as `\uXXXX` escapes.
fn write_string(s: &str, choices: &mut Choices, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 || (c as u32 <= 0xFFFF && choices.next(4) == 0) => {
                out.push_str(&format!("\\u{:04x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// `value` as JSON text, with object members in a shuffled order, random whitespace and random
/// escapes: the same JSON value, a different byte string.
fn render(value: &Value, choices: &mut Choices, out: &mut String) {
    choices.whitespace(out);
    match value {
        Value::Object(map) => {
            let mut members: Vec<_> = map.iter().collect();
            choices.shuffle(&mut members);
            out.push('{');
            for (i, (name, value)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                choices.whitespace(out);
                write_string(name, choices, out);
                choices.whitespace(out);
                out.push(':');
                render(value, choices, out);
            }
            choices.whitespace(out);
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                render(item, choices, out);
            }
            choices.whitespace(out);
            out.push(']');
        }
        Value::String(s) => write_string(s, choices, out),
        scalar => out.push_str(&scalar.to_string()),
    }
    choices.whitespace(out);
}

fn rendered(value: &Value, seed: u64) -> String {
    let mut out = String::new();
    render(value, &mut Choices(seed), &mut out);
    out
}

/// Arbitrary JSON values, floats included or not.
fn json_value(floats: bool) -> impl Strategy<Value = Value> {
    let float = if floats { 1 } else { 0 };
    let leaf = prop_oneof![
        1 => Just(Value::Null),
        1 => any::<bool>().prop_map(Value::Bool),
        2 => any::<i64>().prop_map(Value::from),
        1 => any::<u64>().prop_map(Value::from),
        float => any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        3 => ".{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(".{0,8}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A valid key part: 1 to 255 bytes, no control character.
fn valid_key() -> impl Strategy<Value = String> {
    "\\PC{1,255}".prop_filter("at most 255 bytes", |s| s.len() <= MAX_KEY_LEN)
}

/// A valid key made of visible ASCII and spaces (what a header can carry), not blank.
fn valid_header_key() -> impl Strategy<Value = String> {
    "[ -~]{1,255}".prop_filter("not only spaces", |s| !s.trim().is_empty())
}

// ---------------------------------------------------------------------------------------------
// Keys

proptest! {
    #[test]
    fn any_key_up_to_255_bytes_without_controls_is_accepted(key in valid_key()) {
        let parsed = IdempotencyKey::new(key.clone()).unwrap();
        prop_assert_eq!(parsed.as_str(), key.as_str());
        // The same through a JSON body.
        let body = serde_json::to_vec(&serde_json::json!({ "id": key })).unwrap();
        let found = extract(&JsonPathKey::new("$.id").unwrap(), &[], &body).unwrap().unwrap();
        prop_assert_eq!(found.as_str(), key.as_str());
    }

    #[test]
    fn header_keys_of_visible_ascii_are_accepted(key in valid_header_key()) {
        let value = HeaderValue::from_str(&key).unwrap();
        let found = extract(&HeaderKey::idempotency_key(), &[("idempotency-key", value)], b"")
            .unwrap()
            .unwrap();
        prop_assert_eq!(found.as_str(), key.as_str());
    }

    #[test]
    fn keys_over_255_bytes_are_rejected(key in "\\PC{1,300}", pad in 1usize..64) {
        let key = format!("{key}{}", "x".repeat((MAX_KEY_LEN + pad).saturating_sub(key.len())));
        prop_assume!(key.len() > MAX_KEY_LEN);
        let err = IdempotencyKey::new(key.clone()).unwrap_err();
        prop_assert_eq!(err.kind(), KeyErrorKind::TooLong);
        let expected = format!("{} bytes", key.len());
        prop_assert!(err.to_string().contains(&expected), "{}", err);
        prop_assert!(!err.to_string().contains(&key), "the key is not echoed");
    }

    #[test]
    fn keys_with_a_control_character_are_rejected(
        // At most 60 × 4 = 240 bytes: room for a control character within 255 bytes.
        key in "\\PC{0,60}",
        control in prop::sample::select(
            ('\u{0}'..='\u{1f}').chain(['\u{7f}']).chain('\u{80}'..='\u{9f}').collect::<Vec<_>>()
        ),
        at in any::<prop::sample::Index>(),
    ) {
        let mut chars: Vec<char> = key.chars().collect();
        chars.insert(at.index(chars.len() + 1), control);
        let key: String = chars.into_iter().collect();
        let err = IdempotencyKey::new(key.clone()).unwrap_err();
        prop_assert_eq!(err.kind(), KeyErrorKind::ControlCharacter);
        // The same through a JSON body.
        let body = serde_json::to_vec(&serde_json::json!({ "id": key })).unwrap();
        let err = extract(&JsonPathKey::new("$.id").unwrap(), &[], &body).unwrap_err();
        prop_assert_eq!(err.kind(), KeyErrorKind::ControlCharacter);
    }

    #[test]
    fn composite_keys_are_order_independent_and_deduplicated(
        parts in prop::collection::vec("[a-z0-9_]{1,12}", 1..20),
        seed in any::<u64>(),
        repeats in prop::collection::vec(any::<prop::sample::Index>(), 0..10),
    ) {
        let mut shuffled = parts.clone();
        for index in &repeats {
            shuffled.push(index.get(&parts).clone());
        }
        Choices(seed).shuffle(&mut shuffled);
        let a = IdempotencyKey::composite(parts.clone()).unwrap().unwrap();
        let b = IdempotencyKey::composite(shuffled.clone()).unwrap().unwrap();
        prop_assert_eq!(&a, &b);
        let mut expected = parts.clone();
        expected.sort();
        expected.dedup();
        prop_assert_eq!(a.parts().collect::<Vec<_>>(), expected);

        // Through the extractor: a batch's ids in any order, with repeats, are one key.
        let path = JsonPathKey::new("$.entry[*].id").unwrap();
        let batch = |ids: &[String]| {
            let entry: Vec<Value> = ids.iter().map(|id| serde_json::json!({ "id": id })).collect();
            serde_json::to_vec(&serde_json::json!({ "entry": entry })).unwrap()
        };
        let from_parts = extract(&path, &[], &batch(&parts)).unwrap().unwrap();
        let from_shuffled = extract(&path, &[], &batch(&shuffled)).unwrap().unwrap();
        prop_assert_eq!(&from_parts, &from_shuffled);
        prop_assert_eq!(&from_parts, &a);
    }
}

// ---------------------------------------------------------------------------------------------
// Canonical fingerprints of fields

proptest! {
    #[test]
    fn fields_fingerprint_ignores_member_order_whitespace_and_escapes(
        value in json_value(true),
        noise in json_value(true),
        seeds in (any::<u64>(), any::<u64>()),
    ) {
        let key = FieldsFingerprintKey::new(["$.event", "$.type"]).unwrap();
        let body = serde_json::json!({ "event": value, "type": "payment", "noise": noise });
        let compact = serde_json::to_vec(&body).unwrap();
        let a = extract(&key, &[], &compact).unwrap().unwrap();
        let b = extract(&key, &[], rendered(&body, seeds.0).as_bytes()).unwrap().unwrap();
        let c = extract(&key, &[], rendered(&body, seeds.1).as_bytes()).unwrap().unwrap();
        prop_assert_eq!(&a, &b);
        prop_assert_eq!(&a, &c);
        prop_assert!(a.as_str().starts_with("fields:") && a.as_str().len() == 7 + 64);
    }

    #[test]
    fn fields_fingerprint_ignores_unlisted_fields_and_tells_listed_ones_apart(
        event in json_value(false),
        other_event in json_value(false),
        noise in (json_value(true), json_value(true)),
    ) {
        let key = FieldsFingerprintKey::new(["$.event"]).unwrap();
        let body = |event: &Value, noise: &Value| {
            serde_json::to_vec(&serde_json::json!({ "event": event, "delivered_at": noise })).unwrap()
        };
        let a = extract(&key, &[], &body(&event, &noise.0)).unwrap().unwrap();
        let b = extract(&key, &[], &body(&event, &noise.1)).unwrap().unwrap();
        prop_assert_eq!(&a, &b);
        let c = extract(&key, &[], &body(&other_event, &noise.0)).unwrap().unwrap();
        prop_assert_eq!(a == c, event == other_event);
    }

    #[test]
    fn json_path_keys_ignore_layout(id in valid_key(), rest in json_value(true), seed in any::<u64>()) {
        let key = JsonPathKey::new("$.data.id").unwrap();
        let body = serde_json::json!({ "data": { "id": id, "rest": rest } });
        let found = extract(&key, &[], rendered(&body, seed).as_bytes()).unwrap().unwrap();
        prop_assert_eq!(found.as_str(), id.as_str());
    }

    #[test]
    fn extractors_never_panic_on_arbitrary_bodies(body in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = extract(&JsonPathKey::new("$.a[*].id").unwrap(), &[], &body);
        let _ = extract(&FieldsFingerprintKey::new(["$.a", "$.b[*]"]).unwrap(), &[], &body);
        // Descendant paths query the parsed body (the `jsonpath` feature).
        #[cfg(feature = "jsonpath")]
        {
            let _ = extract(&JsonPathKey::new("$..id").unwrap(), &[], &body);
            let _ = extract(&FieldsFingerprintKey::new(["$.a", "$..b[*]"]).unwrap(), &[], &body);
        }
    }
}

// The record encoding's properties (round trips, decoding damaged bytes) are unit tests of
// `store::record` (`src/store/record.rs`), the encoding being internal.
