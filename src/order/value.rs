//! The built-in positions: one JSON value of the body, read exactly.

use std::collections::HashMap;
use std::sync::Arc;

use super::{ExtractPosition, Position};
use crate::key::{ExtractKey, JsonPathKey, KeyError, KeyErrorKind, KeyInput};

/// The text of the one value `path` selects in the body (a string's value, an integer's exact
/// digits), `None` when it selects none.
fn one_value(path: &JsonPathKey, input: &KeyInput<'_>) -> Result<Option<String>, KeyError> {
    let Some(key) = path.extract_key(input)? else {
        return Ok(None);
    };
    if key.parts().nth(1).is_some() {
        return Err(malformed(format!(
            "the position at {} must be one value; the path selects several",
            path.path()
        )));
    }
    Ok(Some(key.as_str().to_owned()))
}

fn malformed(detail: String) -> KeyError {
    KeyError::new(KeyErrorKind::Other, detail)
}

/// The position at a JSON path of the body (or of each item of a batch, see
/// [`OrderedItems`](super::OrderedItems)): one value, read exactly, as a date-time, a Unix
/// time, a sequence number or a rank, by its constructor. A value that is not what its
/// constructor reads is a `400` saying so (never echoing the body); a path that selects
/// several values is a `400` too, and one that selects none gives no position.
///
/// ```
/// use tower_idempotency::order::PositionAt;
///
/// let occurred_at = PositionAt::timestamp("$.occurred_at")?;
/// let sequence = PositionAt::sequence("$.data.sequence")?;
/// let email = PositionAt::rank("$.type", [
///     ("email.received", 0),
///     ("email.processed", 1),
///     ("email.delivered", 2),
///     ("email.failed", 2),
/// ])?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct PositionAt {
    path: JsonPathKey,
    reading: Reading,
}

/// How a position's text is read.
#[derive(Clone, Debug)]
enum Reading {
    Timestamp,
    UnixSeconds,
    Sequence,
    Rank(Arc<HashMap<String, i64>>),
}

impl PositionAt {
    /// An RFC 3339 date-time at `path` (`"2024-05-01T14:02:03.5+02:00"`): nanoseconds since
    /// the Unix epoch, in UTC, exactly (see [`Position::from_rfc3339`]).
    pub fn timestamp(path: &str) -> Result<Self, crate::ConfigError> {
        Self::at(path, Reading::Timestamp)
    }

    /// A Unix time in whole seconds at `path`, as an integer or a string of digits (WhatsApp's
    /// `"timestamp": "1603059201"`); compared as nanoseconds, like
    /// [`timestamp`](Self::timestamp).
    pub fn unix_seconds(path: &str) -> Result<Self, crate::ConfigError> {
        Self::at(path, Reading::UnixSeconds)
    }

    /// An integer sequence number at `path`, of any length that fits 128 bits, exactly (the
    /// digits are read from the raw body: `18446744073709551617` is not rounded); the string
    /// `"100"` and the integer `100` are the same position, as for ids. Fractions, exponents
    /// and other types are a `400`.
    pub fn sequence(path: &str) -> Result<Self, crate::ConfigError> {
        Self::at(path, Reading::Sequence)
    }

    /// The rank of the value at `path` in `ranks`: email statuses (`email.processed` <
    /// `email.delivered`), WhatsApp's (`sent` < `delivered` < `read`). Values may share a rank
    /// (a message delivered or failed has reached its end either way). A value not in the
    /// table is a `400`.
    pub fn rank<I, S>(path: &str, ranks: I) -> Result<Self, crate::ConfigError>
    where
        I: IntoIterator<Item = (S, i64)>,
        S: Into<String>,
    {
        let ranks = ranks.into_iter().map(|(v, r)| (v.into(), r)).collect();
        Self::at(path, Reading::Rank(Arc::new(ranks)))
    }

    fn at(path: &str, reading: Reading) -> Result<Self, crate::ConfigError> {
        Ok(PositionAt {
            path: JsonPathKey::new(path)?,
            reading,
        })
    }

    /// Whether the positions are instants (nanoseconds since the Unix epoch).
    pub(crate) fn is_instant(&self) -> bool {
        matches!(self.reading, Reading::Timestamp | Reading::UnixSeconds)
    }

    /// The position in one value of the body (an item of a batch).
    pub(crate) fn in_value(&self, item: &serde_json::Value) -> Result<Option<Position>, KeyError> {
        self.position_of(self.path.one_in(item)?)
    }

    /// The position the text means, if any.
    fn read(&self, text: &str) -> Option<Position> {
        match &self.reading {
            Reading::Timestamp => Position::from_rfc3339(text),
            Reading::UnixSeconds => {
                let seconds = Position::from_integer_text(text)?;
                seconds.get().checked_mul(1_000_000_000).map(Position::new)
            }
            Reading::Sequence => Position::from_integer_text(text),
            Reading::Rank(ranks) => ranks.get(text).map(|&rank| Position::new(i128::from(rank))),
        }
    }

    /// What the value should be, for the `400` detail.
    fn should_be(&self) -> String {
        match &self.reading {
            Reading::Timestamp => {
                "an RFC 3339 date-time (such as 2024-05-01T14:02:03Z, with an offset)".to_owned()
            }
            Reading::UnixSeconds => "a Unix time in whole seconds".to_owned(),
            Reading::Sequence => "an integer sequence number that fits 128 bits".to_owned(),
            Reading::Rank(ranks) => format!("one of the {} ranked values", ranks.len()),
        }
    }

    fn position_of(&self, text: Option<String>) -> Result<Option<Position>, KeyError> {
        let Some(text) = text else { return Ok(None) };
        self.read(&text).map(Some).ok_or_else(|| {
            malformed(format!(
                "the value at {} is not {}",
                self.path.path(),
                self.should_be()
            ))
        })
    }
}

impl ExtractPosition for PositionAt {
    fn extract_position(&self, input: &KeyInput<'_>) -> Result<Option<Position>, KeyError> {
        self.position_of(one_value(&self.path, input)?)
    }

    fn expected(&self) -> Option<String> {
        Some(format!("at {}", self.path.path()))
    }

    fn instant(&self) -> bool {
        self.is_instant()
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn position<P: ExtractPosition>(
        extractor: &P,
        body: &'static str,
    ) -> Result<Option<Position>, KeyError> {
        let (parts, ()) = http::Request::post("/").body(()).unwrap().into_parts();
        let body = Bytes::from_static(body.as_bytes());
        extractor.extract_position(&KeyInput::new(&parts, Some(&body)))
    }

    #[test]
    fn timestamps_sequences_and_ranks() {
        let at = PositionAt::timestamp("$.at").unwrap();
        assert_eq!(
            position(&at, r#"{"at":"1970-01-01T00:00:01Z"}"#).unwrap(),
            Some(Position::new(1_000_000_000))
        );
        assert_eq!(position(&at, r#"{"other":1}"#).unwrap(), None);
        let err = position(&at, r#"{"at":"yesterday"}"#).unwrap_err();
        assert!(err.to_string().contains("RFC 3339"), "{err}");
        assert!(
            !err.to_string().contains("yesterday"),
            "never echoes the body"
        );
        assert!(position(&at, r#"{"at":1714572120}"#).is_err());

        let unix = PositionAt::unix_seconds("$.ts").unwrap();
        assert_eq!(
            position(&unix, r#"{"ts":"2"}"#).unwrap(),
            position(&at, r#"{"at":"1970-01-01T00:00:02Z"}"#).unwrap()
        );

        let seq = PositionAt::sequence("$.seq").unwrap();
        assert_eq!(
            position(&seq, r#"{"seq":-3}"#).unwrap(),
            Some(Position::new(-3))
        );
        assert_eq!(
            position(&seq, r#"{"seq":"7"}"#).unwrap(),
            Some(Position::new(7))
        );
        for bad in [
            r#"{"seq":1.5}"#,
            r#"{"seq":1e3}"#,
            r#"{"seq":true}"#,
            r#"{"seq":"x"}"#,
        ] {
            assert!(position(&seq, bad).is_err(), "{bad}");
        }
        let many = PositionAt::sequence("$.s[*]").unwrap();
        assert!(
            position(&many, r#"{"s":[1,2]}"#)
                .unwrap_err()
                .to_string()
                .contains("several")
        );

        let rank =
            PositionAt::rank("$.type", [("sent", 1), ("delivered", 2), ("read", 3)]).unwrap();
        assert_eq!(
            position(&rank, r#"{"type":"delivered"}"#).unwrap(),
            Some(Position::new(2))
        );
        let err = position(&rank, r#"{"type":"opened"}"#).unwrap_err();
        assert!(err.to_string().contains("3 ranked values"), "{err}");
        assert!(position(&rank, "not json").is_err());
    }
}
