use std::borrow::Cow;

use serde_json::Value;

use super::query::ValuePath;
use super::scan::{ScanError, SimplePath, scan};
use super::{ExtractKey, IdempotencyKey, KeyError, KeyErrorKind, KeyInput, PathError};
use crate::verify::VerifyRequest;

/// Takes the key from the JSON body, selected by RFC 9535 JSONPaths.
///
/// - [`JsonPathKey::new`]: one path that selects one value (`$.event.id`, `$.id`) gives that
///   value as the key; a path that selects many gives one composite key of all of them
///   (order-independent, de-duplicated): the whole batch is one event.
/// - [`JsonPathKey::each`] / [`JsonPathKey::each_of`]: **per-item keys**. Every value the paths
///   select is the key of one item (every WhatsApp message id and Instagram mid of a Meta
///   batch). The layer claims, records and releases each item on its own, and the handler
///   sees which items are new in the [`BatchItems`](crate::BatchItems) request extension.
///   This is what Meta asks for ("deduplicate at the message level"): `{A,B}` then `{B,C}`
///   then `{A}` runs A, B and C once each.
///
/// Ids are compared by value, exactly:
/// - strings by their decoded value (`"\u0061bc"` is `abc`);
/// - integers by their exact digits, any length (`-0` is `0`; `18446744073709551617` is not
///   rounded); the string `"100"` and the integer `100` are the same key, so a header → body
///   fallback agrees;
/// - other numbers (`1e2`, `1.0`), objects, arrays, booleans and null are a 400 saying that
///   an id must be a string or an integer.
///
/// No match is "no key" (the layer's missing-key policy, or the next extractor of a fallback
/// chain, applies); a body that is not JSON is a 400.
///
/// Paths made of members, indexes and wildcards (`$.a.b`, `$['a b']`, `[0]`, `[-1]`, `[*]`,
/// `.*`: every path providers document) are read straight from the raw body, without building
/// a DOM: a few microseconds at 1 KiB. Other RFC 9535 forms (filters, descendants, slices)
/// need the crate feature `jsonpath` (without it, [`new`](Self::new) says so) and query a
/// parsed `serde_json::Value`; there, integers beyond 64 bits are a 400, since the DOM cannot
/// hold their digits.
///
/// ```
/// use tower_idempotency::key::{ExtractKey, HeaderKey, JsonPathKey};
///
/// // One event per body.
/// let sangho = JsonPathKey::new("$.id")?;
/// // Meta: one key per message, WhatsApp and Instagram alike; status callbacks carry no
/// // message id and fall back to the delivery id header.
/// let meta = JsonPathKey::each_of([
///     "$.entry[*].changes[*].value.messages[*].id",
///     "$.entry[*].messaging[*].message.mid",
/// ])?
/// .or(HeaderKey::new("X-Kalipto-Delivery-Id")?);
/// assert!(JsonPathKey::new("$.entry[").is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct JsonPathKey {
    paths: Vec<Path>,
    items: bool,
    /// The paths as the scanner reads them, when every one is in its subset (members, indexes,
    /// wildcards): the ids are then found in the raw body without building a DOM, and integers
    /// keep every digit.
    simple: Option<Vec<SimplePath>>,
}

#[derive(Clone, Debug)]
struct Path {
    dom: ValuePath,
    source: String,
}

impl Path {
    fn parse(path: &str) -> Result<Self, PathError> {
        Ok(Path {
            dom: ValuePath::parse(path)?,
            source: path.to_owned(),
        })
    }
}

impl JsonPathKey {
    /// One key from `path` (RFC 9535 syntax): the selected value, or a composite of all
    /// selected values.
    pub fn new(path: &str) -> Result<Self, crate::ConfigError> {
        Ok(JsonPathKey::from_paths(vec![Path::parse(path)?], false))
    }

    /// Per-item keys: every value `path` selects is the key of one item.
    pub fn each(path: &str) -> Result<Self, crate::ConfigError> {
        Self::each_of([path])
    }

    /// Per-item keys from several paths: the values of all of them form one item set (the
    /// WhatsApp message ids and the Instagram mids of one Meta body).
    pub fn each_of<I, S>(paths: I) -> Result<Self, crate::ConfigError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let paths = paths
            .into_iter()
            .map(|p| Path::parse(p.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(JsonPathKey::from_paths(paths, true))
    }

    fn from_paths(paths: Vec<Path>, items: bool) -> Self {
        let simple = paths.iter().map(|p| SimplePath::parse(&p.source)).collect();
        JsonPathKey {
            paths,
            items,
            simple,
        }
    }

    /// The selected ids, found by the scanner in the raw body.
    fn scanned<'b>(
        &self,
        simple: &[SimplePath],
        body: &'b [u8],
    ) -> Result<Vec<Cow<'b, str>>, KeyError> {
        let mut values = Vec::new();
        let result = scan(body, simple, &mut |_, value| {
            values.push(value);
            Ok(())
        });
        match result {
            Ok(()) => Ok(values),
            Err(ScanError::NotJson(why)) => Err(KeyError::new(
                KeyErrorKind::BodyNotJson,
                format!("the request body is not valid JSON: {why}"),
            )),
            Err(ScanError::NotAnId(what)) => Err(not_an_id(&self.describe(), what)),
        }
    }

    /// The selected ids, from the body's DOM (paths with filters and other RFC 9535 forms).
    fn queried(&self, input: &KeyInput<'_>) -> Result<Vec<String>, KeyError> {
        let json = input.json()?;
        let mut values = Vec::new();
        for path in &self.paths {
            for value in path.dom.select(json) {
                values.push(scalar_text(value, &path.source)?);
            }
        }
        Ok(values)
    }

    /// The first path, as written.
    pub(crate) fn path(&self) -> &str {
        self.paths.first().map_or("", |p| &p.source)
    }

    /// The text of the one value the first path selects in `value` (a parsed JSON value: an
    /// item of a batch), `None` when it selects none; an error when it selects several, or a
    /// value that is not a string or an integer.
    pub(crate) fn one_in(&self, value: &Value) -> Result<Option<String>, KeyError> {
        let Some(path) = self.paths.first() else {
            return Ok(None);
        };
        let mut found = path.dom.select(value).into_iter();
        let Some(first) = found.next() else {
            return Ok(None);
        };
        if found.next().is_some() {
            return Err(KeyError::new(
                KeyErrorKind::Other,
                format!(
                    "the path {} selects several values; one was expected",
                    path.source
                ),
            ));
        }
        scalar_text(first, &path.source).map(Some)
    }

    /// Where the key is expected, for the `missing_key` detail: the paths, comma-separated.
    pub(crate) fn describe(&self) -> String {
        let paths: Vec<&str> = self.paths.iter().map(|p| p.source.as_str()).collect();
        paths.join(", ")
    }
}

/// The key text of one selected JSON value: a string's value, an integer's digits.
pub(super) fn scalar_text(value: &Value, path: &str) -> Result<String, KeyError> {
    match value {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) if n.is_i64() || n.is_u64() => Ok(n.to_string()),
        other => Err(not_an_id(path, type_name(other))),
    }
}

/// The error for a selected value that is not a string or an integer.
pub(super) fn not_an_id(path: &str, what: &str) -> KeyError {
    KeyError::new(
        KeyErrorKind::WrongType,
        format!("the JSON value at {path} is {what}; an id must be a string or an integer"),
    )
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        // Integers that fit 64 bits are ids; larger ones reach here only through a DOM path
        // (a filter): serde_json holds them as floats.
        Value::Number(_) => {
            "a number with a fraction or an exponent (or an integer too large for a filter path)"
        }
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

impl ExtractKey for JsonPathKey {
    fn extract_key(&self, input: &KeyInput<'_>) -> Result<Option<IdempotencyKey>, KeyError> {
        // Scanned ids are borrowed from the body: only the key itself is allocated.
        let values: Vec<Cow<'_, str>> = match &self.simple {
            Some(simple) => {
                let body = input.body().ok_or_else(KeyError::body_not_buffered)?;
                self.scanned(simple, body)?
            }
            None => self.queried(input)?.into_iter().map(Cow::Owned).collect(),
        };
        if self.items {
            IdempotencyKey::items_of(values)
        } else {
            IdempotencyKey::composite_of(values)
        }
    }

    fn needs_body(&self) -> bool {
        true
    }

    /// The body is signed by every built-in scheme.
    fn covered_by(&self, _verifier: &dyn VerifyRequest) -> bool {
        true
    }

    fn expected(&self) -> Option<String> {
        Some(format!("in the JSON body at {}", self.describe()))
    }
}
