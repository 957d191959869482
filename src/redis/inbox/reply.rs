//! Reading the inbox scripts' replies: flags, rows of an entry's fields, and the error of a
//! reply that is not what the script writes.

use super::*;

/// Whether a script that answers 1 when it wrote did.
pub(super) fn one(reply: &Value) -> bool {
    matches!(reply, Value::Integer(1))
}

/// Whether `complete_with` wrote: 1 (the writes and the completion) or 2 (the fence of a
/// repeat).
pub(super) fn one_or_two(reply: &Value) -> bool {
    matches!(reply, Value::Integer(1 | 2))
}

/// Whether `complete` wrote: a 1 among its flags (a completion, or the fence of a repeat).
pub(super) fn any_flag(reply: &Value) -> bool {
    matches!(reply, Value::Array(flags) if flags.contains(&Value::Integer(1)))
}

/// Whether `enqueue` wrote: everything but the refusal of a full inbox (a duplicate or a stale
/// answer writes the fence, durable).
pub(super) fn enqueue_wrote(reply: &Value) -> bool {
    !matches!(reply, Value::Integer(5))
}

/// A script's 0 or 1.
pub(super) fn flag(reply: Value) -> Result<bool, StoreError> {
    match reply {
        Value::Integer(n @ 0..=1) => Ok(n == 1),
        other => Err(unexpected("inbox script", &other)),
    }
}

/// The rows of a script that answers an array of arrays.
pub(super) fn rows(reply: Value, what: &str) -> Result<Vec<Value>, StoreError> {
    match reply {
        Value::Array(rows) => Ok(rows),
        other => Err(unexpected(what, &other)),
    }
}

pub(super) fn corrupt(what: &str) -> StoreError {
    StoreError::with_source(StoreErrorKind::Corrupt, format!("inbox: {what}"))
}

/// One row of a script's reply, read field by field.
pub(super) struct Row {
    fields: std::vec::IntoIter<Value>,
}

impl Row {
    pub(super) fn new(row: Value, what: &str) -> Result<Row, StoreError> {
        match row {
            Value::Array(fields) => Ok(Row {
                fields: fields.into_iter(),
            }),
            other => Err(unexpected(what, &other)),
        }
    }

    /// The next field's bytes, `None` for nil.
    pub(super) fn optional(&mut self) -> Result<Option<Bytes>, StoreError> {
        match self.fields.next() {
            None => Err(corrupt("a row is too short")),
            Some(Value::Null) => Ok(None),
            Some(Value::Integer(n)) => Ok(Some(Bytes::from(n.to_string()))),
            Some(value) => bytes_of(value)
                .map(Some)
                .ok_or_else(|| corrupt("a field is not a string")),
        }
    }

    pub(super) fn bytes(&mut self) -> Result<Bytes, StoreError> {
        self.optional()?
            .ok_or_else(|| corrupt("a field is missing"))
    }

    pub(super) fn text(&mut self) -> Result<String, StoreError> {
        String::from_utf8(self.bytes()?.to_vec()).map_err(|_| corrupt("a field is not UTF-8"))
    }

    pub(super) fn is_empty(&self) -> bool {
        self.fields.len() == 0
    }

    pub(super) fn optional_text(&mut self) -> Result<String, StoreError> {
        let bytes = self.optional()?.unwrap_or_default();
        String::from_utf8(bytes.to_vec()).map_err(|_| corrupt("a field is not UTF-8"))
    }

    pub(super) fn optional_int(&mut self) -> Result<Option<i64>, StoreError> {
        let Some(bytes) = self.optional()? else {
            return Ok(None);
        };
        let text = std::str::from_utf8(&bytes).map_err(|_| corrupt("a number is not UTF-8"))?;
        text.parse()
            .map(Some)
            .map_err(|_| corrupt("a field is not an integer"))
    }

    pub(super) fn int(&mut self) -> Result<i64, StoreError> {
        self.optional_int()?
            .ok_or_else(|| corrupt("a number is missing"))
    }

    pub(super) fn count(&mut self) -> Result<u64, StoreError> {
        Ok(self.int()?.max(0) as u64)
    }

    pub(super) fn key(&mut self) -> Result<StoreKey, StoreError> {
        StoreKey::from_stored(&self.bytes()?).ok_or_else(|| corrupt("not a store key"))
    }

    pub(super) fn token(&mut self) -> Result<Token, StoreError> {
        let bytes: [u8; 16] = self.bytes()?[..]
            .try_into()
            .map_err(|_| corrupt("a token of the wrong length"))?;
        Ok(Token::from_bytes(bytes))
    }

    /// The entry of `key` carrying `body`, from the fields headers, object, position,
    /// correlation id, attempts, next attempt, enqueue time, delivery id, route and the rule for
    /// equal positions (a missing headers, attempts, next attempt, id, route or rule is its
    /// default: none, 0, the enqueue time, empty, processed).
    pub(super) fn entry(&mut self, key: StoreKey, body: Bytes) -> Result<InboxEntry, StoreError> {
        let headers = decode_headers(&self.optional()?.unwrap_or_default())?;
        let mut order = self.order()?;
        let correlation_id = self.text()?;
        let attempts = self.optional_int()?.unwrap_or(0);
        let attempts = u32::try_from(attempts).map_err(|_| corrupt("attempts"))?;
        let next_attempt_at = self.optional_int()?;
        let enqueued_at = from_micros(self.int()?);
        // `enqueue` leaves a field out when it is the default.
        let next_attempt_at = next_attempt_at.map_or(enqueued_at, from_micros);
        let id = self.optional_text()?;
        let route = self.optional_text()?;
        // `eq` is there when an equal position is stale (absent: processed, `order`'s default).
        if let (Some(order), Some(_)) = (order.as_mut(), self.optional()?) {
            order.equal = EqualPositions::Stale;
        }
        Ok(InboxEntry {
            key,
            id,
            route,
            body,
            headers,
            order,
            correlation_id,
            attempts,
            next_attempt_at,
            enqueued_at,
        })
    }

    pub(super) fn order(&mut self) -> Result<Option<EntryOrder>, StoreError> {
        let (object, position) = (self.optional()?, self.optional()?);
        let (Some(object), Some(position)) = (object, position) else {
            return Ok(None);
        };
        let object = ObjectKey::from_stored(&object).ok_or_else(|| corrupt("not an object"))?;
        let position: [u8; Position::LEN] = position[..]
            .try_into()
            .map_err(|_| corrupt("a position of the wrong length"))?;
        Ok(Some(EntryOrder {
            object,
            position: Position::from_bytes(position),
            equal: EqualPositions::Process,
        }))
    }
}
