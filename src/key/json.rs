use serde_json::Value;
use serde_json_path::JsonPath;

use super::{ExtractKey, IdempotencyKey, KeyError, KeyErrorKind, KeyInput};

/// Takes the key from the JSON body, selected by an RFC 9535 JSONPath (through
/// `serde_json_path`).
///
/// - A path that selects one value (`$.event.id`, `$.id`) gives that value as the key.
/// - A path that selects many (`$.entry[*].changes[*].value.messages[*].id` of a WhatsApp batch)
///   gives one composite key of all of them: order-independent and de-duplicated.
/// - Strings and numbers are accepted (numbers by their exact JSON text, so a 64-bit id such as
///   `9007199254740993` is not rounded); objects, arrays, booleans and null are a 400.
/// - No match is "no key" (the layer's missing-key policy applies); a body that is not JSON is
///   a 400.
///
/// ```
/// use tower_idempotency::key::JsonPathKey;
///
/// let whatsapp = JsonPathKey::new("$.entry[*].changes[*].value.messages[*].id").unwrap();
/// assert!(JsonPathKey::new("$.entry[").is_err());
/// ```
#[derive(Clone, Debug)]
pub struct JsonPathKey {
    path: JsonPath,
    source: String,
}

impl JsonPathKey {
    /// Parses `path` (RFC 9535 syntax).
    pub fn new(path: &str) -> Result<Self, serde_json_path::ParseError> {
        Ok(JsonPathKey {
            path: JsonPath::parse(path)?,
            source: path.to_owned(),
        })
    }

    /// The path as written.
    pub fn path(&self) -> &str {
        &self.source
    }
}

/// The key text of one selected JSON value.
pub(super) fn scalar_text(value: &Value, path: &str) -> Result<String, KeyError> {
    match value {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        other => Err(KeyError::new(
            KeyErrorKind::WrongType,
            format!(
                "the JSON value at {path} is {}; a key must be a string or a number",
                type_name(other)
            ),
        )),
    }
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

impl ExtractKey for JsonPathKey {
    fn extract_key(&self, input: &KeyInput<'_>) -> Result<Option<IdempotencyKey>, KeyError> {
        let json = input.json()?;
        let values = self
            .path
            .query(json)
            .all()
            .into_iter()
            .map(|value| scalar_text(value, &self.source))
            .collect::<Result<Vec<_>, _>>()?;
        IdempotencyKey::composite(values)
    }

    fn needs_body(&self) -> bool {
        true
    }
}
