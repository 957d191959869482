//! The built-in positions: one JSON value of the body, read exactly.

use std::collections::HashMap;
use std::sync::Arc;

use super::{ExtractPosition, Position};
use crate::key::{ExtractKey, JsonPathKey, KeyError, KeyErrorKind, KeyInput, PathError};

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

/// What the built-in positions share: a path to one value, and how its text is read.
trait Reading {
    fn path(&self) -> &JsonPathKey;
    /// The position the text means, if any.
    fn read(&self, text: &str) -> Option<Position>;
    /// What the value should be, for the `400` detail.
    fn should_be(&self) -> String;
    /// Whether the positions are instants (nanoseconds since the Unix epoch).
    fn instant(&self) -> bool {
        false
    }

    fn position_of(&self, text: Option<String>) -> Result<Option<Position>, KeyError> {
        let Some(text) = text else { return Ok(None) };
        self.read(&text).map(Some).ok_or_else(|| {
            malformed(format!(
                "the value at {} is not {}",
                self.path().path(),
                self.should_be()
            ))
        })
    }
}

/// [`ExtractPosition`] for a [`Reading`], and its reading of one item (see
/// [`OrderedItems`](super::OrderedItems)).
macro_rules! reading_position {
    ($($ty:ident),+) => {$(
        impl ExtractPosition for $ty {
            fn extract_position(&self, input: &KeyInput<'_>) -> Result<Option<Position>, KeyError> {
                self.position_of(one_value(self.path(), input)?)
            }

            fn expected(&self) -> Option<String> {
                Some(format!("at {}", self.path().path()))
            }

            fn instant(&self) -> bool {
                Reading::instant(self)
            }
        }

        impl $ty {
            /// The position in one value of the body (an item of a batch).
            pub(crate) fn in_value(&self, item: &serde_json::Value) -> Result<Option<Position>, KeyError> {
                self.position_of(self.path().one_in(item)?)
            }
        }
    )+};
}

reading_position!(TimestampAt, UnixSecondsAt, SequenceAt, RankAt);

/// The position is an RFC 3339 date-time at a JSON path (`"2024-05-01T14:02:03.5+02:00"`):
/// nanoseconds since the Unix epoch, in UTC, exactly (see [`Position::from_rfc3339`]). A value
/// that is not one is a `400` saying so.
///
/// ```
/// use tower_idempotency::order::TimestampAt;
///
/// let occurred_at = TimestampAt::new("$.occurred_at")?;
/// let stripe_created = TimestampAt::new("$.data.object.created_at")?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct TimestampAt {
    path: JsonPathKey,
}

impl TimestampAt {
    /// The timestamp at `path` (RFC 9535 JSONPath).
    pub fn new(path: &str) -> Result<Self, PathError> {
        Ok(TimestampAt {
            path: JsonPathKey::new(path)?,
        })
    }
}

impl Reading for TimestampAt {
    fn path(&self) -> &JsonPathKey {
        &self.path
    }

    fn instant(&self) -> bool {
        true
    }

    fn read(&self, text: &str) -> Option<Position> {
        Position::from_rfc3339(text)
    }

    fn should_be(&self) -> String {
        "an RFC 3339 date-time (such as 2024-05-01T14:02:03Z, with an offset)".to_owned()
    }
}

/// The position is a Unix time in whole seconds at a JSON path, as an integer or a string of
/// digits (WhatsApp's `"timestamp": "1603059201"`); compared as nanoseconds, like
/// [`TimestampAt`].
#[derive(Clone, Debug)]
pub struct UnixSecondsAt {
    path: JsonPathKey,
}

impl UnixSecondsAt {
    /// The Unix time at `path` (RFC 9535 JSONPath).
    pub fn new(path: &str) -> Result<Self, PathError> {
        Ok(UnixSecondsAt {
            path: JsonPathKey::new(path)?,
        })
    }
}

impl Reading for UnixSecondsAt {
    fn path(&self) -> &JsonPathKey {
        &self.path
    }

    fn instant(&self) -> bool {
        true
    }

    fn read(&self, text: &str) -> Option<Position> {
        let seconds = Position::from_integer_text(text)?;
        seconds.get().checked_mul(1_000_000_000).map(Position::new)
    }

    fn should_be(&self) -> String {
        "a Unix time in whole seconds".to_owned()
    }
}

/// The position is an integer sequence number at a JSON path, of any length that fits 128
/// bits, exactly (the digits are read from the raw body: `18446744073709551617` is not
/// rounded); the string `"100"` and the integer `100` are the same position, as for ids.
/// Fractions, exponents and other types are a `400`.
#[derive(Clone, Debug)]
pub struct SequenceAt {
    path: JsonPathKey,
}

impl SequenceAt {
    /// The sequence number at `path` (RFC 9535 JSONPath).
    pub fn new(path: &str) -> Result<Self, PathError> {
        Ok(SequenceAt {
            path: JsonPathKey::new(path)?,
        })
    }
}

impl Reading for SequenceAt {
    fn path(&self) -> &JsonPathKey {
        &self.path
    }

    fn read(&self, text: &str) -> Option<Position> {
        Position::from_integer_text(text)
    }

    fn should_be(&self) -> String {
        "an integer sequence number that fits 128 bits".to_owned()
    }
}

/// The position is the rank of a value at a JSON path, from a table: email statuses
/// (`email.processed` < `email.delivered`), WhatsApp's (`sent` < `delivered` < `read`). Values
/// may share a rank (a message delivered or failed has reached its end either way). A value
/// not in the table is a `400`.
///
/// ```
/// use tower_idempotency::order::RankAt;
///
/// let email = RankAt::new("$.type", [
///     ("email.received", 0),
///     ("email.processed", 1),
///     ("email.delivered", 2),
///     ("email.failed", 2),
/// ])?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct RankAt {
    path: JsonPathKey,
    ranks: Arc<HashMap<String, i64>>,
}

impl RankAt {
    /// The rank of the value at `path` in `ranks`.
    pub fn new<I, S>(path: &str, ranks: I) -> Result<Self, PathError>
    where
        I: IntoIterator<Item = (S, i64)>,
        S: Into<String>,
    {
        Ok(RankAt {
            path: JsonPathKey::new(path)?,
            ranks: Arc::new(ranks.into_iter().map(|(v, r)| (v.into(), r)).collect()),
        })
    }

    /// The rank of `value`, if it is in the table.
    pub(crate) fn rank(&self, value: &str) -> Option<Position> {
        self.ranks
            .get(value)
            .map(|&rank| Position::new(i128::from(rank)))
    }
}

impl Reading for RankAt {
    fn path(&self) -> &JsonPathKey {
        &self.path
    }

    fn read(&self, text: &str) -> Option<Position> {
        self.rank(text)
    }

    fn should_be(&self) -> String {
        format!("one of the {} ranked values", self.ranks.len())
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
        let at = TimestampAt::new("$.at").unwrap();
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

        let unix = UnixSecondsAt::new("$.ts").unwrap();
        assert_eq!(
            position(&unix, r#"{"ts":"2"}"#).unwrap(),
            position(&at, r#"{"at":"1970-01-01T00:00:02Z"}"#).unwrap()
        );

        let seq = SequenceAt::new("$.seq").unwrap();
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
        let many = SequenceAt::new("$.s[*]").unwrap();
        assert!(
            position(&many, r#"{"s":[1,2]}"#)
                .unwrap_err()
                .to_string()
                .contains("several")
        );

        let rank = RankAt::new("$.type", [("sent", 1), ("delivered", 2), ("read", 3)]).unwrap();
        assert_eq!(
            position(&rank, r#"{"type":"delivered"}"#).unwrap(),
            Some(Position::new(2))
        );
        let err = position(&rank, r#"{"type":"opened"}"#).unwrap_err();
        assert!(err.to_string().contains("3 ranked values"), "{err}");
        assert!(position(&rank, "not json").is_err());
    }
}
