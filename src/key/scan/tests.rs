use super::*;
use proptest::collection::vec;
use proptest::prelude::*;
use serde_json::Value;
use std::fmt::Write as _;

/// Path of the message ids in a WhatsApp Cloud API webhook batch.
const WHATSAPP: &str = "$.entry[*].changes[*].value.messages[*].id";

/// Parses `text`, which the test expects to be in the subset.
fn path(text: &str) -> SimplePath {
    SimplePath::parse(text).unwrap_or_else(|| panic!("{text:?} should parse"))
}

/// Scans `body` for `paths` and collects `(path index, key)` pairs,
/// checking that keys borrowed from the body come in document order.
fn scan_all(body: &[u8], paths: &[&SimplePath]) -> Result<Vec<(usize, String)>, ScanError> {
    let range = body.as_ptr_range();
    let mut last = range.start;
    let mut out = Vec::new();
    scan(body, paths, &mut |index, key| {
        if let Cow::Borrowed(text) = &key {
            let at = text.as_ptr();
            if range.start <= at && at <= range.end {
                assert!(at >= last, "keys out of document order");
                last = at;
            }
        }
        out.push((index, key.into_owned()));
        Ok(())
    })?;
    Ok(out)
}

/// The keys that the single path `p` selects in `body`.
fn keys(body: &str, p: &str) -> Result<Vec<String>, ScanError> {
    let p = path(p);
    Ok(scan_all(body.as_bytes(), &[&p])?
        .into_iter()
        .map(|(_, key)| key)
        .collect())
}

/// The expected successful result of [`keys`].
fn ok(keys: &[&str]) -> Result<Vec<String>, ScanError> {
    Ok(keys.iter().map(|key| key.to_string()).collect())
}

/// Whether the scanner calls `body` NotJson, checked with no path, with a
/// path that selects nothing and with a path that goes everywhere.
fn not_json(body: &[u8]) -> bool {
    let (none, all) = (path("$.zz"), path("$.*.*.*"));
    let verdicts: Vec<bool> = [&[][..], &[&none], &[&all]]
        .iter()
        .map(|paths| {
            matches!(
                scan(body, paths, &mut |_, _| Ok(())),
                Err(ScanError::NotJson(_))
            )
        })
        .collect();
    assert!(
        verdicts.iter().all(|v| *v == verdicts[0]),
        "verdicts differ by path"
    );
    verdicts[0]
}

/// The values that `segments` select in `value`, in the DOM's order:
/// the reference implementation of the subset over serde_json's DOM.
fn select<'v>(value: &'v Value, segments: &[Segment]) -> Vec<&'v Value> {
    let mut out = Vec::new();
    select_into(value, segments, &mut out);
    out
}

/// Adds to `out` the values that `segments` select in `value`.
fn select_into<'v>(value: &'v Value, segments: &[Segment], out: &mut Vec<&'v Value>) {
    let Some((segment, rest)) = segments.split_first() else {
        out.push(value);
        return;
    };
    match (segment, value) {
        (Segment::Name(name), Value::Object(map)) => {
            if let Some(child) = map.get(name) {
                select_into(child, rest, out);
            }
        }
        (Segment::Index(i), Value::Array(items)) => {
            let index = if *i < 0 { items.len() as i64 + i } else { *i };
            if let Some(child) = usize::try_from(index).ok().and_then(|k| items.get(k)) {
                select_into(child, rest, out);
            }
        }
        (Segment::Wildcard, Value::Array(items)) => {
            items.iter().for_each(|child| select_into(child, rest, out));
        }
        (Segment::Wildcard, Value::Object(map)) => {
            map.values().for_each(|child| select_into(child, rest, out));
        }
        _ => {}
    }
}

/// The key of a DOM value, as the reference computes it.
fn as_id(value: &Value) -> Result<String, &'static str> {
    match value {
        Value::String(text) => Ok(text.clone()),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Ok(i.to_string()),
            (None, Some(u)) => Ok(u.to_string()),
            _ => Err(FRACTIONAL),
        },
        Value::Object(_) => Err("an object"),
        Value::Array(_) => Err("an array"),
        Value::Bool(_) => Err("a boolean"),
        Value::Null => Err("null"),
    }
}

/// A WhatsApp-like webhook batch with `entries` entries of `changes`
/// changes of `messages` messages, and its message ids in order.
fn whatsapp_body(entries: usize, changes: usize, messages: usize) -> (String, Vec<String>) {
    let mut body = String::from(r#"{"object":"whatsapp_business_account","entry":["#);
    let mut ids = Vec::new();
    for e in 0..entries {
        if e > 0 {
            body.push(',');
        }
        write!(body, r#"{{"id":"10229012934{e:04}","changes":["#).unwrap();
        for c in 0..changes {
            if c > 0 {
                body.push(',');
            }
            body.push_str(concat!(
                r#"{"value":{"messaging_product":"whatsapp","metadata":"#,
                r#"{"display_phone_number":"15550001111","phone_number_id":"106540352242922"},"#,
                r#""contacts":[{"profile":{"name":"Kerry Fisher"},"wa_id":"16315551234"}],"#,
                r#""messages":["#
            ));
            for m in 0..messages {
                if m > 0 {
                    body.push(',');
                }
                let id = format!("wamid.HBgLMTYzMTU1NTEyMzQVAgASGBQzQUFCQ0Q{e:04}{c:03}{m:03}A=");
                write!(
                    body,
                    r#"{{"from":"16315551234","id":"{id}","timestamp":"17000{m:05}","#
                )
                .unwrap();
                write!(
                    body,
                    r#""text":{{"body":"Hello there, this is message {m} of the batch \u00e9\n"}},"type":"text"}}"#
                )
                .unwrap();
                ids.push(id);
            }
            body.push_str(r#"]},"field":"messages"}"#);
        }
        body.push_str("]}");
    }
    body.push_str("]}");
    (body, ids)
}

/// Nests `inner` in `depth` arrays.
fn nested_arrays(depth: usize, inner: &str) -> String {
    format!("{}{inner}{}", "[".repeat(depth), "]".repeat(depth))
}

/// Nests `inner` in `depth` objects, each under the member `a`.
fn nested_objects(depth: usize, inner: &str) -> String {
    format!("{}{inner}{}", r#"{"a":"#.repeat(depth), "}".repeat(depth))
}

/// WhatsApp batches: every message id, in order, across entries and changes.
#[test]
fn whatsapp_batch() {
    let (body, ids) = whatsapp_body(2, 2, 3);
    assert_eq!(ids.len(), 12);
    assert_eq!(keys(&body, WHATSAPP), Ok(ids));
    // A status-only change has no messages: nothing selected, no error.
    let statuses = r#"{"entry":[{"changes":[{"value":{"statuses":[{"id":"s1"}]}}]}]}"#;
    assert_eq!(keys(statuses, WHATSAPP), ok(&[]));
}

/// Instagram messaging webhooks.
#[test]
fn instagram_messaging() {
    let body = r#"{"object":"instagram","entry":[{"time":1700000000,"id":"17841405","messaging":[
        {"sender":{"id":"1"},"recipient":{"id":"2"},"timestamp":1700000000,"message":{"mid":"aWdfZAG1faXRlbToxOklH","text":"hi"}},
        {"sender":{"id":"1"},"recipient":{"id":"2"},"timestamp":1700000001,"read":{"mid":"other"}},
        {"sender":{"id":"1"},"recipient":{"id":"2"},"message":{"text":"no mid","mid":"second"}}]}]}"#;
    assert_eq!(
        keys(body, "$.entry[*].messaging[*].message.mid"),
        ok(&["aWdfZAG1faXRlbToxOklH", "second"])
    );
}

/// Top-level and nested member paths (Stripe-like events).
#[test]
fn member_paths() {
    let body = r#" {"id":"evt_1","object":"event","data":{"object":{"object":"payment_intent","id":"pi_3"}}} "#;
    assert_eq!(keys(body, "$.id"), ok(&["evt_1"]));
    assert_eq!(keys(body, "$.data.object.id"), ok(&["pi_3"]));
    assert_eq!(keys(body, "$['data'][\"object\"]['id']"), ok(&["pi_3"]));
    assert_eq!(keys(body, "$.missing.id"), ok(&[]));
    assert_eq!(keys(r#"{"id":42}"#, "$.id"), ok(&["42"]));
    assert_eq!(keys(r#""whole""#, "$"), ok(&["whole"]));
}

/// Quoted names, with spaces, quotes, escapes and non-ASCII text.
#[test]
fn quoted_names() {
    let body = r#"{"a b":"1","it's":"2","say \"hi\"":"3","é":"4","\u00e9x":"5","":"6"}"#;
    assert_eq!(keys(body, "$['a b']"), ok(&["1"]));
    assert_eq!(keys(body, r#"$["a b"]"#), ok(&["1"]));
    assert_eq!(keys(body, r"$['it\'s']"), ok(&["2"]));
    assert_eq!(keys(body, r#"$["it's"]"#), ok(&["2"]));
    assert_eq!(keys(body, r#"$['say "hi"']"#), ok(&["3"]));
    assert_eq!(keys(body, r#"$["say \"hi\""]"#), ok(&["3"]));
    assert_eq!(keys(body, "$.é"), ok(&["4"]));
    assert_eq!(keys(body, r"$['\u00E9']"), ok(&["4"]));
    assert_eq!(keys(body, "$.éx"), ok(&["5"]));
    assert_eq!(keys(body, "$['']"), ok(&["6"]));
    assert_eq!(keys(r#"{"😀":"7"}"#, r"$['\uD83D\ude00']"), ok(&["7"]));
    assert_eq!(keys(r#"{"\ud83d\ude00":"7"}"#, "$['😀']"), ok(&["7"]));
}

/// Indexes, negative indexes and out-of-range indexes.
#[test]
fn indexes() {
    let body = r#"["a","b","c"]"#;
    assert_eq!(keys(body, "$[0]"), ok(&["a"]));
    assert_eq!(keys(body, "$[2]"), ok(&["c"]));
    assert_eq!(keys(body, "$[3]"), ok(&[]));
    assert_eq!(keys(body, "$[-1]"), ok(&["c"]));
    assert_eq!(keys(body, "$[-3]"), ok(&["a"]));
    assert_eq!(keys(body, "$[-4]"), ok(&[]));
    assert_eq!(keys("[]", "$[0]"), ok(&[]));
    assert_eq!(keys("[ ]", "$[-1]"), ok(&[]));
    // Counting elements must not be fooled by nested or quoted brackets and commas.
    let tricky = r#"[ "x,]\"", [1,2,[3]], {"a":[4,5],"b":"]"}, "last" ]"#;
    assert_eq!(keys(tricky, "$[-1]"), ok(&["last"]));
    assert_eq!(keys(tricky, "$[-4]"), ok(&["x,]\""]));
    assert_eq!(keys(tricky, "$[-3]"), Err(ScanError::NotAnId("an array")));
    assert_eq!(keys(tricky, "$[-3][-1][-1]"), ok(&["3"]));
    assert_eq!(keys(tricky, "$[-2].a[-1]"), ok(&["5"]));
    assert_eq!(
        keys(r#"{"items":[{"id":"1"},{"id":"2"}]}"#, "$.items[-1].id"),
        ok(&["2"])
    );
}

/// Wildcards over objects, arrays and scalars.
#[test]
fn wildcards() {
    let body = r#"{"b":"1","a":"2","c":[3,"4"]}"#;
    assert_eq!(keys(body, "$.*"), Err(ScanError::NotAnId("an array")));
    assert_eq!(keys(body, "$.c.*"), ok(&["3", "4"]));
    assert_eq!(keys(body, "$.c[*]"), ok(&["3", "4"]));
    assert_eq!(keys(r#"{"b":"1","a":"2"}"#, "$.*"), ok(&["1", "2"]));
    assert_eq!(keys(r#"{"b":"1","a":"2"}"#, "$[*]"), ok(&["1", "2"]));
    assert_eq!(keys(body, "$.a.*"), ok(&[]));
    assert_eq!(keys("7", "$.*"), ok(&[]));
    assert_eq!(keys("[[1],[2,3],{}]", "$[*][*]"), ok(&["1", "2", "3"]));
}

/// A segment applied to the wrong kind of value selects nothing.
#[test]
fn kind_mismatches_select_nothing() {
    assert_eq!(keys(r#"["a"]"#, "$.a"), ok(&[]));
    assert_eq!(keys(r#"{"0":"a"}"#, "$[0]"), ok(&[]));
    assert_eq!(keys(r#""text""#, "$[0]"), ok(&[]));
    assert_eq!(keys(r#"{"a":"text"}"#, "$.a.b"), ok(&[]));
}

/// String keys: escapes are decoded; plain strings are borrowed.
#[test]
fn string_escapes() {
    assert_eq!(keys(r#"{"id":"\u0061bc"}"#, "$.id"), ok(&["abc"]));
    assert_eq!(keys(r#"{"id":"\ud83d\ude00!"}"#, "$.id"), ok(&["😀!"]));
    assert_eq!(keys(r#"{"id":"\uD83D\uDE00"}"#, "$.id"), ok(&["😀"]));
    assert_eq!(
        keys(r#"{"id":"q\"b\\s\/b\bf\fn\nr\rt\t\u00e9é"}"#, "$.id"),
        ok(&["q\"b\\s/b\u{8}f\u{c}n\nr\rt\téé"])
    );
    let p = path("$[*]");
    let mut borrowed = Vec::new();
    scan(
        r#"["plain é", "esc\u0061ped", 12, -0, ""]"#.as_bytes(),
        &[&p],
        &mut |_, key| {
            borrowed.push(matches!(key, Cow::Borrowed(_)));
            Ok(())
        },
    )
    .unwrap();
    assert_eq!(borrowed, [true, false, true, true, true]);
}

/// Integer keys: exact digits of any length, `-0` written `0`.
#[test]
fn integers() {
    assert_eq!(keys("[0, -0, 7, -42]", "$[*]"), ok(&["0", "0", "7", "-42"]));
    assert_eq!(
        keys("[18446744073709551616, 18446744073709551617]", "$[*]"),
        ok(&["18446744073709551616", "18446744073709551617"])
    );
    let long = format!("-{}", "9".repeat(300));
    assert_eq!(keys(&format!("[{long}]"), "$[0]"), Ok(vec![long]));
    assert_eq!(keys("100", "$"), ok(&["100"]));
}

/// Values that are not ids.
#[test]
fn not_ids() {
    for number in ["1e2", "1E2", "1e+2", "1e-2", "1.0", "-0.0", "0.5", "1.5e3"] {
        assert_eq!(
            keys(number, "$"),
            Err(ScanError::NotAnId(FRACTIONAL)),
            "{number}"
        );
    }
    for (body, what) in [
        (r#"{"id":{}}"#, "an object"),
        (r#"{"id":[]}"#, "an array"),
        (r#"{"id":true}"#, "a boolean"),
        (r#"{"id":false}"#, "a boolean"),
        (r#"{"id":null}"#, "null"),
    ] {
        assert_eq!(keys(body, "$.id"), Err(ScanError::NotAnId(what)), "{body}");
    }
}

/// Keys before the first value that is not an id are handed over; the
/// scan then stops with that error.
#[test]
fn first_problem_wins() {
    let p = path("$[*]");
    let mut seen = Vec::new();
    let result = scan(br#"["a", 1.5, "b", {}]"#, &[&p], &mut |_, key| {
        seen.push(key.into_owned());
        Ok(())
    });
    assert_eq!(result, Err(ScanError::NotAnId(FRACTIONAL)));
    assert_eq!(seen, ["a"]);
}

/// An error from `found` stops the scan and is returned.
#[test]
fn found_error_stops() {
    let p = path("$[*]");
    let mut calls = 0;
    let result = scan(br#"["a","b","c"]"#, &[&p], &mut |_, _| {
        calls += 1;
        Err(ScanError::NotAnId("stop"))
    });
    assert_eq!(result, Err(ScanError::NotAnId("stop")));
    assert_eq!(calls, 1);
}

/// Bodies that are not JSON, anywhere, are NotJson; serde_json agrees.
#[test]
fn invalid_json() {
    let cases: &[&[u8]] = &[
        b"",
        b"   ",
        br#"{"a":1,}"#,
        b"[1,]",
        b"[,1]",
        br#"{"id":"x","other":[1,]}"#,
        br#"{"id":"\x"}"#,
        br#"{"id":"\u12"}"#,
        br#"{"id":"\u12G4"}"#,
        br#"{"id":"#,
        br#"{"id":"abc"#,
        br#"{"id":"abc\"#,
        br#"{"id":"x""#,
        br#"{"id":"x"} x"#,
        br#"{"id":"x"}}"#,
        b"[1]]",
        br#"{id:"x"}"#,
        br#"{'id':"x"}"#,
        b"\"a\x01b\"",
        b"\"a\x1fb\"",
        b"\"\xff\"",
        b"\"\xc3\"",
        b"\"\xc0\xaf\"",
        b"\"\xed\xa0\x80\"",
        b"\"\xf4\x90\x80\x80\"",
        b"\xef\xbb\xbf1",
        br#""\ud800""#,
        br#""\udc00""#,
        br#""\ud800\u0041""#,
        br#""\ud800x""#,
        br#""\ud800\ud800""#,
        b"01",
        b"1.",
        b"1.e1",
        b".5",
        b"-",
        b"-a",
        b"+1",
        b"1e",
        b"1e+",
        b"tru",
        b"nul",
        b"True",
        b"NaN",
        b"Infinity",
        b"[1 2]",
        br#"{"a" 1}"#,
        br#"{"a":1 "b":2}"#,
        b"[}",
        br#"{"a":1]"#,
        b"1e400",
        b"-1e400",
        b"1e99999999999999999999999",
        b"\x00",
        b"[\"a\"\x0b]",
    ];
    for &body in cases {
        assert!(
            serde_json::from_slice::<Value>(body).is_err(),
            "serde_json accepts {body:?}"
        );
        assert!(not_json(body), "scanner accepts {body:?}");
    }
    // Nothing is handed over for a body that is not JSON, even when a
    // selected value comes before the error.
    let p = path("$.id");
    let mut calls = 0;
    let result = scan(br#"{"id":"x","other":tru}"#, &[&p], &mut |_, _| {
        calls += 1;
        Ok(())
    });
    assert!(matches!(result, Err(ScanError::NotJson(_))));
    assert_eq!(calls, 0);
}

/// Valid bodies with unusual spelling are accepted; serde_json agrees.
#[test]
fn valid_json_edge_cases() {
    let cases: &[&[u8]] = &[
        b" \t\r\n1 \t\r\n",
        b"-0",
        b"0e0",
        b"1E-5",
        b"1e308",
        b"-1e308",
        b"1.7976931348623157e308",
        b"0e999999999999999999",
        b"0.0e400",
        b"1e-400",
        b"0.00001e310",
        b"\"\x7f\xc2\x80\xf4\x8f\xbf\xbf\"",
        br#""\u0000\u001f\/""#,
        b"[[],{},[{}],{\"\":[]}]",
        br#"{"a":1,"a":2}"#,
    ];
    for &body in cases {
        assert!(
            serde_json::from_slice::<Value>(body).is_ok(),
            "serde_json rejects {body:?}"
        );
        assert!(!not_json(body), "scanner rejects {body:?}");
    }
    // An integer of 308 digits is fine, one of 310 is out of range.
    for (digits, valid) in [(308, true), (309, true), (310, false)] {
        let body = "9".repeat(digits);
        let valid = valid && digits < 309;
        assert_eq!(
            serde_json::from_str::<Value>(&body).is_ok(),
            valid,
            "{digits}"
        );
        assert_eq!(!not_json(body.as_bytes()), valid, "{digits}");
    }
}

/// Near the largest `f64` the scanner decides like serde_json.
#[test]
fn number_range_boundary() {
    for text in [
        "1.7976931348623157e308",
        "1.79769313486231e308",
        "1.8e308",
        "17976931348623157e292",
        "0.17976931348623157e309",
        "179.76931348623157e306",
        "999e306",
    ] {
        let dom = serde_json::from_str::<Value>(text).is_ok();
        assert_eq!(!not_json(text.as_bytes()), dom, "{text}");
    }
}

/// Nesting: 127 levels are accepted, 128 are not, wherever they are.
#[test]
fn depth_limit() {
    let max = MAX_DEPTH;
    assert_eq!(max, 127);
    let deepest_path = format!("${}", "[0]".repeat(max));
    assert_eq!(
        keys(&nested_arrays(max, "\"x\""), &deepest_path),
        ok(&["x"])
    );
    assert!(!not_json(nested_arrays(max, "").as_bytes()));
    assert!(not_json(nested_arrays(max + 1, "").as_bytes()));
    assert!(not_json(nested_arrays(max + 1, "\"x\"").as_bytes()));
    let deepest_path = format!("${}", ".a".repeat(max));
    assert_eq!(keys(&nested_objects(max, "1"), &deepest_path), ok(&["1"]));
    assert!(not_json(nested_objects(max, "{}").as_bytes()));
    assert!(!not_json(nested_objects(max - 1, "{}").as_bytes()));
    assert!(not_json(nested_objects(max + 1, "1").as_bytes()));
    // Too deep inside an otherwise selected document.
    let body = format!(r#"{{"id":"x","deep":{}}}"#, nested_arrays(max, ""));
    assert!(not_json(body.as_bytes()));
    let body = format!(r#"{{"id":"x","deep":{}}}"#, nested_arrays(max - 1, ""));
    assert_eq!(keys(&body, "$.id"), ok(&["x"]));
    // A path longer than the nesting limit selects nothing.
    let too_long = format!("${}", "[0]".repeat(max + 1));
    assert_eq!(keys(&nested_arrays(max, "1"), &too_long), ok(&[]));
}

/// The scanner's limit is serde_json's own (as of 1.0.154): 127 nested arrays are
/// accepted, 128 are not, so the scanner and the DOM agree on which bodies are JSON.
#[test]
fn serde_json_depth_limit() {
    assert!(serde_json::from_str::<Value>(&nested_arrays(MAX_DEPTH, "")).is_ok());
    assert!(serde_json::from_str::<Value>(&nested_arrays(MAX_DEPTH + 1, "")).is_err());
}

/// Duplicate member names: the last one wins, like serde_json's DOM.
#[test]
fn duplicate_members() {
    assert_eq!(keys(r#"{"id":"a","id":"b"}"#, "$.id"), ok(&["b"]));
    assert_eq!(keys(r#"{"id":{},"x":1,"id":"b"}"#, "$.id"), ok(&["b"]));
    assert_eq!(
        keys(r#"{"id":"a","id":{}}"#, "$.id"),
        Err(ScanError::NotAnId("an object"))
    );
    assert_eq!(keys(r#"{"id":"a","\u0069d":"b"}"#, "$.id"), ok(&["b"]));
    assert_eq!(
        keys(r#"{"\u0069d":"a","id":"b","i\u0064":"c"}"#, "$.id"),
        ok(&["c"])
    );
    assert_eq!(keys(r#"{"a":{"b":"x"},"a":{}}"#, "$.a.b"), ok(&[]));
    assert_eq!(
        keys(r#"{"a":{"b":"x"},"a":{"b":"y","b":"z"}}"#, "$.a.b"),
        ok(&["z"])
    );
    assert_eq!(keys(r#"{"x":"1","y":"2","x":"3"}"#, "$.*"), ok(&["2", "3"]));
    assert_eq!(keys(r#"{"x":[1,2],"x":[3]}"#, "$.x[*]"), ok(&["3"]));
    assert_eq!(keys(r#"{"x":[1,2],"x":[3]}"#, "$.x[-1]"), ok(&["3"]));
    let many: String = (0..40).map(|i| format!(r#""k{}":"{i}","#, i % 7)).collect();
    let body = format!("{{{many}\"end\":\"e\"}}");
    let value: Value = serde_json::from_str(&body).unwrap();
    let mut expected: Vec<String> = select(&value, &[Segment::Wildcard])
        .into_iter()
        .map(|v| as_id(v).unwrap())
        .collect();
    let mut got = keys(&body, "$.*").unwrap();
    expected.sort();
    got.sort();
    assert_eq!(got, expected);
}

/// Several paths: document order, path order for a shared value.
#[test]
fn several_paths() {
    let (a, b, c) = (path("$.b"), path("$.*"), path("$.a"));
    let body = br#"{"a":"1","b":"2"}"#;
    assert_eq!(
        scan_all(body, &[&a, &b, &c]),
        Ok(vec![
            (1, "1".into()),
            (2, "1".into()),
            (0, "2".into()),
            (1, "2".into())
        ])
    );
    let (object, inside) = (path("$.a"), path("$.a.b"));
    assert_eq!(
        scan_all(br#"{"a":{"b":"x"}}"#, &[&inside, &object]),
        Err(ScanError::NotAnId("an object"))
    );
    assert_eq!(
        scan_all(br#"{"a":{"b":"x"}}"#, &[&inside]),
        Ok(vec![(0, "x".into())])
    );
    assert_eq!(scan_all(br#"{"a":{"b":"x"}}"#, &[]), Ok(vec![]));
}

/// More than 64 paths take several passes and still come in order.
#[test]
fn many_paths() {
    let texts: Vec<String> = (0..70).rev().map(|i| format!("$[{i}]")).collect();
    let paths: Vec<SimplePath> = texts.iter().map(|t| path(t)).collect();
    let refs: Vec<&SimplePath> = paths.iter().collect();
    let body = format!(
        "[{}]",
        (0..70).map(|i| i.to_string()).collect::<Vec<_>>().join(",")
    );
    let got = scan_all(body.as_bytes(), &refs).unwrap();
    let expected: Vec<(usize, String)> = (0..70).map(|i| (69 - i, i.to_string())).collect();
    assert_eq!(got, expected);
}

/// NotJson messages name an offset and a class, never the input.
#[test]
fn messages_do_not_quote_input() {
    let Err(ScanError::NotJson(message)) = keys(r#"{"secret": tru}"#, "$.id") else {
        panic!("expected NotJson");
    };
    assert_eq!(message, "invalid JSON at byte 11: invalid literal");
    let Err(ScanError::NotJson(message)) = keys("[\"secret\"\n secret]", "$.id") else {
        panic!("expected NotJson");
    };
    assert!(!message.contains("secret"), "{message}");
}

/// The parser accepts the subset.
#[test]
fn parse_accepts() {
    use Segment::*;
    let name = |n: &str| Name(n.to_string());
    let cases: Vec<(&str, Vec<Segment>)> = vec![
        ("$", vec![]),
        ("$.id", vec![name("id")]),
        (
            "$.entry[*].changes[*].value.messages[*].id",
            vec![
                name("entry"),
                Wildcard,
                name("changes"),
                Wildcard,
                name("value"),
                name("messages"),
                Wildcard,
                name("id"),
            ],
        ),
        ("$['a b']", vec![name("a b")]),
        (r#"$["a\"b\\c\/d\u00e9\n"]"#, vec![name("a\"b\\c/dé\n")]),
        (r"$['\'']", vec![name("'")]),
        ("$[0]", vec![Index(0)]),
        ("$[-1]", vec![Index(-1)]),
        ("$[9007199254740991]", vec![Index(MAX_INDEX)]),
        ("$[-9007199254740991]", vec![Index(-MAX_INDEX)]),
        ("$.*", vec![Wildcard]),
        ("$[*]", vec![Wildcard]),
        ("$[ * ]", vec![Wildcard]),
        ("$[\t'a'\n]", vec![name("a")]),
        ("$ .a [0]", vec![name("a"), Index(0)]),
        ("$._a1.é", vec![name("_a1"), name("é")]),
        (r"$['\uD83D\uDE00']", vec![name("😀")]),
    ];
    for (text, segments) in cases {
        assert_eq!(
            SimplePath::parse(text),
            Some(SimplePath { segments }),
            "{text}"
        );
    }
}

/// The parser rejects everything outside the subset, and malformed paths.
#[test]
fn parse_rejects() {
    for text in [
        "$..id",
        "$[?@.a]",
        "$[0:2]",
        "$['a','b']",
        "$.a[",
        "a.b",
        "",
        "$.",
        "$.1a",
        "$[]",
        "$[01]",
        "$[-0]",
        "$[+1]",
        "$[9007199254740992]",
        "$[1,2]",
        "$[:]",
        "$.a ",
        " $",
        "$['a]",
        "$['a\"]",
        r#"$["a\'"]"#,
        r"$['\x']",
        "$['\u{1}']",
        r"$['\ud800']",
        r"$['\uDC00']",
        r"$['\ud83d\ude00']",
        r"$['\uD83D']",
        "$.length()",
        "$[length(@)]",
        "@.a",
        "$*",
        "$.a.",
        "$[*",
        "$[0",
        "$['a'",
    ] {
        assert_eq!(SimplePath::parse(text), None, "{text}");
    }
}

// ---- property tests ----

/// Member names used by generated documents and paths (few, so that
/// paths hit and duplicates happen).
const NAMES: &[&str] = &["a", "b", "id", "x y", "é", ""];

/// A member name.
fn arb_name() -> impl Strategy<Value = String> {
    prop::sample::select(NAMES).prop_map(str::to_owned)
}

/// A short string with characters that need escaping.
fn arb_text() -> impl Strategy<Value = String> {
    let chars = vec![
        'a', 'i', 'd', '"', '\\', '/', '\u{1}', '\n', '\u{7f}', 'é', '\u{2028}', '😀',
    ];
    vec(prop::sample::select(chars), 0..5).prop_map(|chars| chars.into_iter().collect())
}

/// A scalar DOM value.
fn arb_leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-5i64..5).prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        arb_text().prop_map(Value::String),
    ]
}

/// A DOM document.
fn arb_value() -> impl Strategy<Value = Value> {
    arb_leaf().prop_recursive(4, 48, 5, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..5).prop_map(Value::Array),
            vec((arb_name(), inner), 0..5)
                .prop_map(|members| Value::Object(members.into_iter().collect())),
        ]
    })
}

/// A document tree whose objects may repeat member names.
#[derive(Debug, Clone)]
enum Doc {
    /// A scalar.
    Leaf(Value),
    /// An array.
    Array(Vec<Doc>),
    /// An object, members in order, duplicates allowed.
    Object(Vec<(String, Doc)>),
    /// A token written as it is (a number serde_json may refuse).
    Raw(&'static str),
}

/// A document tree with duplicate member names.
fn arb_doc() -> impl Strategy<Value = Doc> {
    arb_leaf()
        .prop_map(Doc::Leaf)
        .prop_recursive(4, 48, 5, |inner| {
            prop_oneof![
                vec(inner.clone(), 0..5).prop_map(Doc::Array),
                vec((arb_name(), inner), 0..6).prop_map(Doc::Object),
            ]
        })
}

/// Writes `doc` as JSON text. `style` bit 0 adds white space, bit 1
/// escapes every other character of strings, bit 2 writes those escapes
/// in upper case.
fn write_doc(doc: &Doc, style: u8, out: &mut String) {
    let space = if style & 1 != 0 { " \n\t\r" } else { "" };
    match doc {
        Doc::Leaf(Value::String(text)) => write_string(text, style, out),
        Doc::Leaf(value) => out.push_str(&value.to_string()),
        Doc::Raw(token) => out.push_str(token),
        Doc::Array(items) => write_list(items, ['[', ']'], space, out, |item, out| {
            write_doc(item, style, out);
        }),
        Doc::Object(members) => {
            write_list(members, ['{', '}'], space, out, |(name, value), out| {
                write_string(name, style, out);
                out.push_str(space);
                out.push(':');
                out.push_str(space);
                write_doc(value, style, out);
            });
        }
    }
}

/// Writes `items` with `write` between the `brackets`, separated by commas, `space`
/// before each item and before the closing bracket.
fn write_list<T>(
    items: &[T],
    [open, close]: [char; 2],
    space: &str,
    out: &mut String,
    mut write: impl FnMut(&T, &mut String),
) {
    out.push(open);
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(space);
        write(item, out);
    }
    out.push_str(space);
    out.push(close);
}

/// Writes `text` as a JSON string in the given `style` (see [`write_doc`]).
fn write_string(text: &str, style: u8, out: &mut String) {
    out.push('"');
    for (i, c) in text.chars().enumerate() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '/' if style & 2 != 0 => out.push_str("\\/"),
            c if c < ' ' || (style & 2 != 0 && i % 2 == 0) => {
                for unit in c.encode_utf16(&mut [0; 2]) {
                    if style & 4 != 0 {
                        write!(out, "\\u{unit:04X}").unwrap();
                    } else {
                        write!(out, "\\u{unit:04x}").unwrap();
                    }
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Path segments over [`NAMES`].
fn arb_segments() -> impl Strategy<Value = Vec<Segment>> {
    let segment = prop_oneof![
        arb_name().prop_map(Segment::Name),
        (-3i64..3).prop_map(Segment::Index),
        Just(Segment::Wildcard),
    ];
    vec(segment, 0..4)
}

/// Writes `segments` as path text; `variant` picks among the spellings.
fn render(segments: &[Segment], variant: u8) -> String {
    let mut text = String::from("$");
    for segment in segments {
        match segment {
            Segment::Wildcard if variant == 0 => text.push_str(".*"),
            Segment::Wildcard => text.push_str("[ * ]"),
            Segment::Index(i) if variant == 2 => write!(text, " [\t{i} ]").unwrap(),
            Segment::Index(i) => write!(text, "[{i}]").unwrap(),
            Segment::Name(name) => {
                let mut chars = name.chars();
                let shorthand = chars.next().is_some_and(|c| c.is_alphabetic() || c == '_')
                    && chars.all(|c| c.is_alphanumeric() || c == '_');
                if variant == 0 && shorthand {
                    write!(text, ".{name}").unwrap();
                } else if variant == 1 {
                    text.push_str("[\"");
                    for c in name.chars() {
                        match c {
                            '"' | '\\' => write!(text, "\\{c}").unwrap(),
                            c => text.push(c),
                        }
                    }
                    text.push_str("\"]");
                } else {
                    text.push_str("['");
                    for c in name.chars() {
                        for unit in c.encode_utf16(&mut [0; 2]) {
                            write!(text, "\\u{unit:04X}").unwrap();
                        }
                    }
                    text.push_str("']");
                }
            }
        }
    }
    text
}

/// Checks that the scanner and serde_json agree on whether `body` is JSON
/// (unless it may nest 127 levels or more, where their limits differ).
fn check_validity(body: &[u8], paths: &[&SimplePath]) -> Result<(), TestCaseError> {
    let dom_ok = serde_json::from_slice::<Value>(body).is_ok();
    let result = scan(body, paths, &mut |_, _| Ok(()));
    let opens = body.iter().filter(|&&b| b == b'[' || b == b'{').count();
    if opens < 127 {
        prop_assert_eq!(
            dom_ok,
            !matches!(result, Err(ScanError::NotJson(_))),
            "{:?} {:?}",
            body,
            result
        );
    }
    Ok(())
}

proptest! {
    /// Serialized DOM documents: the scanner gives exactly what the
    /// reference gives over the DOM, in the same order (serde_json writes
    /// members in the order its map iterates them).
    #[test]
    fn serialized_values_match_dom(
        value in arb_value(),
        pretty in any::<bool>(),
        segments in arb_segments(),
        variant in 0u8..3,
        others in vec(arb_segments(), 0..3),
    ) {
        let body = if pretty { serde_json::to_vec_pretty(&value) } else { serde_json::to_vec(&value) }.unwrap();
        let text = render(&segments, variant);
        let parsed = SimplePath::parse(&text);
        prop_assert_eq!(parsed.as_ref(), Some(&SimplePath { segments: segments.clone() }), "{}", text);
        let p = parsed.unwrap();

        let expected: Vec<Result<String, &str>> = select(&value, &p.segments).into_iter().map(as_id).collect();
        let cut = expected.iter().position(Result::is_err).unwrap_or(expected.len());
        let mut calls = Vec::new();
        let result = scan(&body, &[&p], &mut |index, key| {
            calls.push((index, key.into_owned()));
            Ok(())
        });
        let before: Vec<(usize, String)> = expected[..cut].iter().filter_map(|r| r.clone().ok()).map(|k| (0, k)).collect();
        prop_assert_eq!(calls, before);
        match expected.get(cut) {
            Some(Err(what)) => prop_assert_eq!(result, Err(ScanError::NotAnId(what))),
            _ => prop_assert_eq!(result, Ok(())),
        }

        // All paths at once: each path's keys, in order, when all are ids.
        let mut all = vec![p];
        all.extend(others.into_iter().map(|segments| SimplePath { segments }));
        let refs: Vec<&SimplePath> = all.iter().collect();
        let per_path: Vec<Vec<Result<String, &str>>> = all.iter().map(|p| select(&value, &p.segments).into_iter().map(as_id).collect()).collect();
        let any_bad = per_path.iter().flatten().any(Result::is_err);
        match scan_all(&body, &refs) {
            Ok(got) => {
                prop_assert!(!any_bad);
                for (i, expected) in per_path.iter().enumerate() {
                    let mine: Vec<Result<String, &str>> = got.iter().filter(|(p, _)| *p == i).map(|(_, k)| Ok(k.clone())).collect();
                    prop_assert_eq!(&mine, expected);
                }
            }
            Err(ScanError::NotAnId(what)) => prop_assert!(per_path.iter().flatten().any(|r| *r == Err(what))),
            Err(other) => prop_assert!(false, "unexpected {:?}", other),
        }
    }

    /// Hand-written documents with duplicate names, escapes and white
    /// space: the scanner selects what the DOM (last member wins) selects.
    #[test]
    fn duplicates_and_escapes_match_dom(doc in arb_doc(), style in 0u8..8, paths in vec(arb_segments(), 1..4)) {
        let mut text = String::new();
        write_doc(&doc, style, &mut text);
        let value: Value = serde_json::from_str(&text).unwrap();
        let all: Vec<SimplePath> = paths.into_iter().map(|segments| SimplePath { segments }).collect();
        let refs: Vec<&SimplePath> = all.iter().collect();
        let mut expected = Vec::new();
        let mut bad = Vec::new();
        for (i, p) in all.iter().enumerate() {
            for selected in select(&value, &p.segments) {
                match as_id(selected) {
                    Ok(key) => expected.push((i, key)),
                    Err(what) => bad.push(what),
                }
            }
        }
        match scan_all(text.as_bytes(), &refs) {
            Ok(mut got) => {
                prop_assert!(bad.is_empty(), "missed {:?} in {}", bad, text);
                got.sort();
                expected.sort();
                prop_assert_eq!(got, expected, "{}", text);
            }
            Err(ScanError::NotAnId(what)) => prop_assert!(bad.contains(&what), "{} in {}", what, text),
            Err(other) => prop_assert!(false, "unexpected {:?} for {}", other, text),
        }
    }

    /// Arbitrary bytes never make the scanner panic, and it agrees with
    /// serde_json on validity.
    #[test]
    fn arbitrary_bytes(body in vec(any::<u8>(), 0..64), segments in arb_segments()) {
        let p = SimplePath { segments };
        check_validity(&body, &[&p])?;
    }

    /// Bytes from JSON's alphabet (mostly near-JSON): no panic, same
    /// validity as serde_json.
    #[test]
    fn json_alphabet_bytes(
        body in vec(prop::sample::select(b"[]{}\"\",,::0123456789-+.eEtrufalsn \\u\t\nA\x00\x1f\xff\xc3\xa9".to_vec()), 0..48),
        segments in arb_segments(),
    ) {
        let p = SimplePath { segments };
        check_validity(&body, &[&p])?;
    }

    /// Valid documents with a few bytes replaced, inserted or removed: no
    /// panic, same validity as serde_json.
    #[test]
    fn mutated_documents(
        value in arb_value(),
        pretty in any::<bool>(),
        edits in vec((any::<prop::sample::Index>(), prop::sample::select(b"[]{}\",:0-.eE+tn\\ ua\x00\xff\x80".to_vec()), 0u8..3), 1..4),
        segments in arb_segments(),
    ) {
        let mut body = if pretty { serde_json::to_vec_pretty(&value) } else { serde_json::to_vec(&value) }.unwrap();
        for (at, byte, op) in edits {
            let i = at.index(body.len() + 1);
            match op {
                0 if i < body.len() => body[i] = byte,
                2 if i < body.len() => { body.remove(i); }
                _ => body.insert(i, byte),
            }
        }
        let p = SimplePath { segments };
        check_validity(&body, &[&p])?;
    }
}

// ---- differential fuzzing against a reference on `serde_json::Value` ----

/// What the reference says about a body: `None` when serde_json does not take it as a
/// `Value`; otherwise, per path, the ids (or what the value is when it is not an id) that
/// the path selects in the DOM.
fn reference(body: &[u8], paths: &[SimplePath]) -> Option<Vec<Vec<Result<String, &'static str>>>> {
    let value: Value = serde_json::from_slice(body).ok()?;
    Some(
        paths
            .iter()
            .map(|p| select(&value, &p.segments).into_iter().map(as_id).collect())
            .collect(),
    )
}

/// Checks the scanner against [`reference`] on `body`: the same verdict on validity, no
/// id handed out for a body that is not JSON, the same ids per path (as multisets: the
/// scanner goes in document order, the DOM in its map's order), and, when a selected value
/// is not an id, an error that names one of them after ids the reference also selects.
fn check_against_reference(body: &[u8], paths: &[SimplePath]) -> Result<(), TestCaseError> {
    let refs: Vec<&SimplePath> = paths.iter().collect();
    let mut calls: Vec<(usize, String)> = Vec::new();
    let result = scan(body, &refs, &mut |index, key| {
        calls.push((index, key.into_owned()));
        Ok(())
    });
    let shown = String::from_utf8_lossy(body);
    let Some(per_path) = reference(body, paths) else {
        prop_assert!(
            matches!(result, Err(ScanError::NotJson(_))),
            "{:?} for {}",
            result,
            shown
        );
        prop_assert!(
            calls.is_empty(),
            "ids handed out for a body that is not JSON: {}",
            shown
        );
        return Ok(());
    };
    let bad: Vec<&str> = per_path
        .iter()
        .flatten()
        .filter_map(|r| r.clone().err())
        .collect();
    let mut expected: Vec<(usize, String)> = per_path
        .iter()
        .enumerate()
        .flat_map(|(i, ids)| {
            ids.iter()
                .filter_map(move |r| r.clone().ok().map(|k| (i, k)))
        })
        .collect();
    expected.sort();
    calls.sort();
    match result {
        Ok(()) => {
            prop_assert!(bad.is_empty(), "missed {:?} in {}", bad, shown);
            prop_assert_eq!(calls, expected, "{}", shown);
        }
        Err(ScanError::NotAnId(what)) => {
            prop_assert!(bad.contains(&what), "{} in {}", what, shown);
            // Every id handed out before the error is one the reference selects.
            let mut left = expected;
            for call in calls {
                let at = left.iter().position(|e| *e == call);
                prop_assert!(at.is_some(), "{:?} not selected in {}", call, shown);
                if let Some(at) = at {
                    left.remove(at);
                }
            }
        }
        Err(ScanError::NotJson(why)) => prop_assert!(false, "NotJson ({}) for {}", why, shown),
    }
    Ok(())
}

/// Number tokens whose DOM value the reference reads exactly (so no `-0` and no integer
/// beyond 64 bits, which a `Value` holds as a float), and tokens at the edge of, or beyond,
/// what serde_json accepts.
const NUMBERS: &[&str] = &[
    "0",
    "7",
    "-12",
    "18446744073709551615",
    "-9223372036854775808",
    "1.5",
    "-0.0",
    "1e2",
    "2E-3",
    "1e-400",
    "1e308",
    "1.7976931348623157e308",
    "1.8e308",
    "1e400",
    "-1e400",
    "01",
    "1.",
    ".5",
    "-",
    "1e",
    "+1",
];

/// Invalid UTF-8 (a lone continuation byte, a truncated sequence, an overlong form, an
/// encoded surrogate, a code point above U+10FFFF) and escapes serde_json refuses (lone
/// surrogates, a low surrogate first, a bad escape letter, short hex).
const BAD_IN_STRINGS: &[&[u8]] = &[
    b"\x80",
    b"\xc3",
    b"\xe2\x82",
    b"\xc0\xaf",
    b"\xed\xa0\x80",
    b"\xf4\x90\x80\x80",
    b"\xff",
    br"\ud800",
    br"\udc00",
    br"\udc00\ud800",
    br"\ud800x",
    br"\x",
    br"\u12",
    b"\x01",
];

/// A document tree like [`arb_doc`] whose leaves may also be raw number tokens.
fn arb_doc_with_numbers() -> impl Strategy<Value = Doc> {
    let leaf = prop_oneof![
        4 => arb_leaf().prop_map(Doc::Leaf),
        1 => prop::sample::select(NUMBERS).prop_map(Doc::Raw),
    ];
    leaf.prop_recursive(5, 64, 6, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..6).prop_map(Doc::Array),
            vec((arb_name(), inner), 0..7).prop_map(Doc::Object),
        ]
    })
}

/// `doc` written as JSON (see [`write_doc`]).
fn write_with_numbers(doc: &Doc, style: u8) -> String {
    let mut text = String::new();
    write_doc(doc, style, &mut text);
    text
}

/// How a generated body is damaged before it is scanned.
#[derive(Debug, Clone)]
enum Damage {
    /// Left as it is.
    None,
    /// Cut after this many bytes (an index into the body).
    Truncate(prop::sample::Index),
    /// A bad sequence put just after the opening quote of one of its strings.
    InString(prop::sample::Index, &'static [u8]),
    /// A byte put anywhere. Never a digit or `-`: put in a number, they could make an
    /// integer beyond 64 bits or `-0`, which the reference's `Value` holds as a float
    /// while the scanner keeps the digits (the unit tests `integers` check those).
    Byte(prop::sample::Index, u8),
}

fn arb_damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        3 => Just(Damage::None),
        1 => any::<prop::sample::Index>().prop_map(Damage::Truncate),
        1 => (any::<prop::sample::Index>(), prop::sample::select(BAD_IN_STRINGS))
            .prop_map(|(at, bad)| Damage::InString(at, bad)),
        1 => (any::<prop::sample::Index>(), prop::sample::select(b"[]{}\",:.eE\\ \x00\xff".to_vec()))
            .prop_map(|(at, byte)| Damage::Byte(at, byte)),
    ]
}

fn damage(mut body: Vec<u8>, how: &Damage) -> Vec<u8> {
    match how {
        Damage::None => {}
        Damage::Truncate(at) => body.truncate(at.index(body.len() + 1)),
        Damage::InString(at, bad) => {
            let quotes: Vec<usize> = body
                .iter()
                .enumerate()
                .filter(|(_, b)| **b == b'"')
                .map(|(i, _)| i)
                .collect();
            if !quotes.is_empty() {
                let i = quotes[at.index(quotes.len())] + 1;
                body.splice(i..i, bad.iter().copied());
            }
        }
        Damage::Byte(at, byte) => {
            let i = at.index(body.len() + 1);
            body.insert(i, *byte);
        }
    }
    body
}

/// The nesting a document is wrapped in: `levels` arrays (`[..]`) or objects
/// (`{"a":..}`, or `{"a":..,"a":..}` with a decoy first).
fn wrap(inner: &str, levels: usize, kind: u8) -> (String, Vec<Segment>) {
    let mut text = String::new();
    let mut prefix = Vec::new();
    for level in 0..levels {
        match (kind + level as u8) % 3 {
            0 => {
                text.push('[');
                prefix.push(Segment::Index(0));
            }
            1 => {
                text.push_str(r#"{"a":"#);
                prefix.push(Segment::Name("a".into()));
            }
            _ => {
                text.push_str(r#"{"a":"decoy","a":"#);
                prefix.push(Segment::Wildcard);
            }
        }
    }
    text.push_str(inner);
    for level in (0..levels).rev() {
        text.push(if (kind + level as u8).is_multiple_of(3) {
            ']'
        } else {
            '}'
        });
    }
    (text, prefix)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Random documents (duplicate names, escapes, white space, number tokens at and beyond
    /// serde_json's range), damaged or not (truncated, invalid UTF-8 and lone surrogates in
    /// strings, stray bytes), and random paths: the scanner agrees with the reference on
    /// validity and on the selected ids.
    #[test]
    fn agrees_with_the_dom(
        doc in arb_doc_with_numbers(),
        style in 0u8..8,
        paths in vec(vec(prop_oneof![
            arb_name().prop_map(Segment::Name),
            (-4i64..4).prop_map(Segment::Index),
            Just(Segment::Wildcard),
        ], 0..6), 0..5),
        how in arb_damage(),
    ) {
        let body = damage(write_with_numbers(&doc, style).into_bytes(), &how);
        let paths: Vec<SimplePath> = paths.into_iter().map(|segments| SimplePath { segments }).collect();
        check_against_reference(&body, &paths)?;
    }

    /// The same, inside 100 to 135 levels of nesting (serde_json's limit and the scanner's
    /// are the same: 127), with paths that go down through it or stop on the way.
    #[test]
    fn deep_documents_agree_with_the_dom(
        doc in arb_doc_with_numbers(),
        levels in 100usize..136,
        kind in 0u8..3,
        tails in vec(vec(prop_oneof![
            arb_name().prop_map(Segment::Name),
            (-2i64..2).prop_map(Segment::Index),
            Just(Segment::Wildcard),
        ], 0..3), 1..4),
        cut in 0usize..140,
        how in arb_damage(),
    ) {
        let inner = write_with_numbers(&doc, 0);
        let (text, prefix) = wrap(&inner, levels, kind);
        let body = damage(text.into_bytes(), &how);
        let paths: Vec<SimplePath> = tails
            .into_iter()
            .map(|tail| {
                let mut segments = prefix[..cut.min(prefix.len())].to_vec();
                segments.extend(tail);
                SimplePath { segments }
            })
            .collect();
        check_against_reference(&body, &paths)?;
    }
}
