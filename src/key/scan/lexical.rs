//! The body's tokens: strings, numbers and literals, the iterative skip of values no path
//! selects, and the byte-level helpers they share.

use super::path::hex4;
use super::*;

impl<'a, P: Borrow<SimplePath>> Scanner<'a, '_, P> {
    /// Validates the value at the current position, `depth` containers deep,
    /// that no path selects or goes into. Iterative: the kinds of the
    /// containers it opens are bits of a `u128` (1 for an object).
    pub(super) fn skip_value(&mut self, depth: usize) -> Parsed<()> {
        let mut objects: u128 = 0;
        let mut level = 0usize;
        'value: loop {
            match self.peek() {
                Some(open @ (b'{' | b'[')) => {
                    self.check_depth(depth + level)?;
                    self.pos += 1;
                    self.skip_ws();
                    let close = if open == b'{' { b'}' } else { b']' };
                    if self.peek() == Some(close) {
                        self.pos += 1;
                    } else {
                        if open == b'{' {
                            objects |= 1 << level;
                            self.member_name()?;
                        } else {
                            objects &= !(1 << level);
                        }
                        level += 1;
                        continue 'value;
                    }
                }
                Some(b'"') => {
                    self.string()?;
                }
                Some(b'-' | b'0'..=b'9') => {
                    self.number()?;
                }
                Some(b't') => self.literal(b"true")?,
                Some(b'f') => self.literal(b"false")?,
                Some(b'n') => self.literal(b"null")?,
                _ => return Err(self.unexpected("expected a value")),
            }
            // A value is complete: continue or close the enclosing containers.
            match self.after_value(objects, level)? {
                Some(open) => level = open,
                None => return Ok(()),
            }
        }
    }

    /// Goes on after a complete value inside `level` open containers (`objects` has a 1 for
    /// each that is an object): reads a `,` and the next member's name, or closes containers.
    /// The number of containers still open when another value follows; `None` once the
    /// outermost is closed.
    fn after_value(&mut self, objects: u128, mut level: usize) -> Parsed<Option<usize>> {
        loop {
            if level == 0 {
                return Ok(None);
            }
            self.skip_ws();
            let in_object = (objects >> (level - 1)) & 1 == 1;
            match self.peek() {
                Some(b',') => {
                    self.pos += 1;
                    self.skip_ws();
                    if in_object {
                        self.member_name()?;
                    }
                    return Ok(Some(level));
                }
                Some(b'}') if in_object => {
                    self.pos += 1;
                    level -= 1;
                }
                Some(b']') if !in_object => {
                    self.pos += 1;
                    level -= 1;
                }
                _ if in_object => return Err(self.unexpected("expected ',' or '}'")),
                _ => return Err(self.unexpected("expected ',' or ']'")),
            }
        }
    }

    /// Reads a member name and its `:`, leaving the position at its value.
    fn member_name(&mut self) -> Parsed<()> {
        if self.peek() != Some(b'"') {
            return Err(self.unexpected("expected a member name"));
        }
        self.string()?;
        self.skip_ws();
        self.expect(b':', "expected ':'")?;
        self.skip_ws();
        Ok(())
    }

    /// Reads `word` (`true`, `false` or `null`).
    pub(super) fn literal(&mut self, word: &'static [u8]) -> Parsed<()> {
        if self.bytes.get(self.pos..self.pos + word.len()) == Some(word) {
            self.pos += word.len();
            Ok(())
        } else {
            Err(self.fail("invalid literal"))
        }
    }

    /// Reads and validates the string whose opening quote is at the current
    /// position: escapes, UTF-8, no control characters.
    pub(super) fn string(&mut self) -> Parsed<Span> {
        let bytes = self.bytes;
        let start = self.pos + 1;
        let mut i = start;
        let mut escaped = false;
        loop {
            i = skip_plain(bytes, i);
            match bytes.get(i) {
                Some(b'"') => {
                    self.pos = i + 1;
                    return Ok(Span {
                        start,
                        end: i,
                        escaped,
                    });
                }
                Some(b'\\') => {
                    escaped = true;
                    i = decode_escape(bytes, i)
                        .map_err(|what| Syntax { at: i, what })?
                        .1;
                }
                Some(&b) if b < 0x20 => {
                    return Err(Syntax {
                        at: i,
                        what: "control character in a string",
                    });
                }
                Some(_) => {
                    i += utf8_len(bytes, i).ok_or(Syntax {
                        at: i,
                        what: BAD_UTF8,
                    })?
                }
                None => {
                    return Err(Syntax {
                        at: i,
                        what: END_IN_STRING,
                    });
                }
            }
        }
    }

    /// Reads and validates the number at the current position, including
    /// serde_json's requirement that its magnitude fits in an `f64`.
    pub(super) fn number(&mut self) -> Parsed<Number> {
        let bytes = self.bytes;
        let start = self.pos;
        let mut i = start;
        if bytes.get(i) == Some(&b'-') {
            i += 1;
        }
        let int_start = i;
        match bytes.get(i) {
            Some(b'0') => i += 1,
            Some(b'1'..=b'9') => i = skip_digits(bytes, i + 1),
            _ => {
                return Err(Syntax {
                    at: i,
                    what: "invalid number",
                });
            }
        }
        let int_end = i;
        let mut integer = true;
        let mut fraction = (i, i);
        if bytes.get(i) == Some(&b'.') {
            integer = false;
            let fraction_start = i + 1;
            i = skip_digits(bytes, fraction_start);
            if i == fraction_start {
                return Err(Syntax {
                    at: i,
                    what: "invalid number",
                });
            }
            fraction = (fraction_start, i);
        }
        let mut exponent: i64 = 0;
        if let Some(b'e' | b'E') = bytes.get(i) {
            integer = false;
            (i, exponent) = read_exponent(bytes, i + 1)?;
        }
        self.pos = i;
        let number = Number {
            start,
            end: i,
            integer,
        };
        if !integer || int_end - int_start > 308 {
            self.check_magnitude(number, (int_start, int_end), fraction, exponent)?;
        }
        Ok(number)
    }

    /// Fails, like serde_json, when `number` is too large for an `f64`.
    /// `int` and `fraction` are the offsets of its digits before and after the
    /// point, `exponent` its (saturated) exponent.
    fn check_magnitude(
        &self,
        number: Number,
        int: (usize, usize),
        fraction: (usize, usize),
        exponent: i64,
    ) -> Parsed<()> {
        let bytes = self.bytes;
        let int_digits = bytes.get(int.0..int.1).unwrap_or_default();
        let fraction_digits = bytes.get(fraction.0..fraction.1).unwrap_or_default();
        // The value lies in [10^(magnitude-1), 10^magnitude).
        let magnitude = if int_digits != b"0" {
            i64::try_from(int_digits.len()).unwrap_or(i64::MAX)
        } else {
            match fraction_digits.iter().position(|&d| d != b'0') {
                // Zero is never out of range.
                None => return Ok(()),
                Some(zeros) => -i64::try_from(zeros).unwrap_or(i64::MAX),
            }
        }
        .saturating_add(exponent);
        let out_of_range = match magnitude {
            ..=308 => false,
            309 => std::str::from_utf8(bytes.get(number.start..number.end).unwrap_or_default())
                .ok()
                .and_then(|text| text.parse::<f64>().ok())
                .is_some_and(f64::is_infinite),
            _ => true,
        };
        if out_of_range {
            Err(Syntax {
                at: number.start,
                what: "number out of range",
            })
        } else {
            Ok(())
        }
    }

    /// The key of a selected string.
    pub(super) fn string_key(&self, span: Span) -> Parsed<Cow<'a, str>> {
        let bytes: &'a [u8] = self.bytes;
        let raw = bytes.get(span.start..span.end).ok_or(Syntax {
            at: span.start,
            what: END_IN_STRING,
        })?;
        if span.escaped {
            decode_string(raw, span.start).map(Cow::Owned)
        } else {
            std::str::from_utf8(raw)
                .map(Cow::Borrowed)
                .map_err(|e| Syntax {
                    at: span.start + e.valid_up_to(),
                    what: BAD_UTF8,
                })
        }
    }

    /// The key of a selected integer: its digits, with `-0` written `0`.
    pub(super) fn integer_key(&self, number: Number) -> Parsed<Cow<'a, str>> {
        let bytes: &'a [u8] = self.bytes;
        let text = bytes.get(number.start..number.end).unwrap_or_default();
        if text == b"-0" {
            return Ok(Cow::Borrowed("0"));
        }
        std::str::from_utf8(text)
            .map(Cow::Borrowed)
            .map_err(|_| Syntax {
                at: number.start,
                what: "invalid number",
            })
    }
}

/// The indexes of the bits set in `mask`, lowest first.
pub(super) fn bits(mut mask: u64) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        if mask == 0 {
            return None;
        }
        let bit = mask.trailing_zeros() as usize;
        mask &= mask - 1;
        Some(bit)
    })
}

/// Reads the exponent of a number whose `e` or `E` ends before `i`: an optional sign and at
/// least one digit. Returns the offset after it and its value, saturated (only whether the
/// magnitude passes 308 matters).
fn read_exponent(bytes: &[u8], mut i: usize) -> Result<(usize, i64), Syntax> {
    let negative = match bytes.get(i) {
        Some(b'-') => {
            i += 1;
            true
        }
        Some(b'+') => {
            i += 1;
            false
        }
        _ => false,
    };
    let digits_start = i;
    let mut exponent: i64 = 0;
    while let Some(&d @ b'0'..=b'9') = bytes.get(i) {
        exponent = (exponent * 10 + i64::from(d - b'0')).min(1 << 40);
        i += 1;
    }
    if i == digits_start {
        return Err(Syntax {
            at: i,
            what: "invalid number",
        });
    }
    Ok((i, if negative { -exponent } else { exponent }))
}

/// The offset of the first byte at or after `i` that is not an ASCII digit.
fn skip_digits(bytes: &[u8], mut i: usize) -> usize {
    while let Some(b'0'..=b'9') = bytes.get(i) {
        i += 1;
    }
    i
}

/// The offset of the first byte at or after `i` that ends a plain run of
/// string contents: a quote, a backslash, a control character or a byte that
/// is not ASCII. Looks at eight bytes at a time where it can.
fn skip_plain(bytes: &[u8], mut i: usize) -> usize {
    /// 0x01 in every byte.
    const ONES: u64 = 0x0101_0101_0101_0101;
    /// The high bit of every byte.
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    while let Some(Ok(word)) = bytes.get(i..i + 8).map(<[u8; 8]>::try_from) {
        let x = u64::from_le_bytes(word);
        let quote = x ^ (ONES * u64::from(b'"'));
        let backslash = x ^ (ONES * u64::from(b'\\'));
        // Each term has a high bit set in some byte iff such a byte exists:
        // below 0x20, equal to '"', equal to '\\', at least 0x80.
        let special = (x.wrapping_sub(ONES * 0x20) & !x)
            | (quote.wrapping_sub(ONES) & !quote)
            | (backslash.wrapping_sub(ONES) & !backslash)
            | x;
        if special & HIGHS != 0 {
            break;
        }
        i += 8;
    }
    while let Some(&b) = bytes.get(i) {
        if b == b'"' || b == b'\\' || !(0x20..0x80).contains(&b) {
            break;
        }
        i += 1;
    }
    i
}

/// The length of the valid UTF-8 sequence of a non-ASCII character starting
/// at `i`, or None when the bytes there are not one.
fn utf8_len(bytes: &[u8], i: usize) -> Option<usize> {
    let (len, low, high) = match *bytes.get(i)? {
        0xC2..=0xDF => (2, 0x80, 0xBF),
        0xE0 => (3, 0xA0, 0xBF),
        0xE1..=0xEC | 0xEE..=0xEF => (3, 0x80, 0xBF),
        0xED => (3, 0x80, 0x9F),
        0xF0 => (4, 0x90, 0xBF),
        0xF1..=0xF3 => (4, 0x80, 0xBF),
        0xF4 => (4, 0x80, 0x8F),
        _ => return None,
    };
    let second = *bytes.get(i + 1)?;
    if !(low..=high).contains(&second) {
        return None;
    }
    for k in 2..len {
        if *bytes.get(i + k)? & 0xC0 != 0x80 {
            return None;
        }
    }
    Some(len)
}

/// Decodes the escape whose backslash is at `i`: the character and the
/// offset after the escape, or the class of the problem.
fn decode_escape(bytes: &[u8], i: usize) -> Result<(char, usize), &'static str> {
    let c = match bytes.get(i + 1) {
        None => return Err(END_IN_STRING),
        Some(b'"') => '"',
        Some(b'\\') => '\\',
        Some(b'/') => '/',
        Some(b'b') => '\u{8}',
        Some(b'f') => '\u{c}',
        Some(b'n') => '\n',
        Some(b'r') => '\r',
        Some(b't') => '\t',
        Some(b'u') => {
            let high = hex_at(bytes, i + 2)?;
            return match high {
                0xD800..=0xDBFF => {
                    if bytes.get(i + 6) != Some(&b'\\') || bytes.get(i + 7) != Some(&b'u') {
                        return Err(LONE_SURROGATE);
                    }
                    let low = hex_at(bytes, i + 8)?;
                    if !(0xDC00..=0xDFFF).contains(&low) {
                        return Err(LONE_SURROGATE);
                    }
                    char::from_u32(0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00))
                        .map(|c| (c, i + 12))
                        .ok_or(LONE_SURROGATE)
                }
                0xDC00..=0xDFFF => Err(LONE_SURROGATE),
                _ => char::from_u32(high)
                    .map(|c| (c, i + 6))
                    .ok_or(LONE_SURROGATE),
            };
        }
        Some(_) => return Err("invalid escape in a string"),
    };
    Ok((c, i + 2))
}

/// The value of the four hex digits at `at`, or the class of the problem.
fn hex_at(bytes: &[u8], at: usize) -> Result<u32, &'static str> {
    let digits = bytes.get(at..at + 4).ok_or(END_IN_STRING)?;
    hex4(digits).ok_or("invalid \\u escape in a string")
}

/// Decodes the (validated) contents `raw` of a string that starts at offset
/// `at` in the body.
fn decode_string(raw: &[u8], at: usize) -> Parsed<String> {
    let mut out = String::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        let run_end = raw
            .get(i..)
            .and_then(|rest| rest.iter().position(|&b| b == b'\\'))
            .map_or(raw.len(), |k| i + k);
        let run = raw.get(i..run_end).unwrap_or_default();
        out.push_str(std::str::from_utf8(run).map_err(|e| Syntax {
            at: at + i + e.valid_up_to(),
            what: BAD_UTF8,
        })?);
        if run_end >= raw.len() {
            break;
        }
        let (c, next) = decode_escape(raw, run_end).map_err(|what| Syntax {
            at: at + run_end,
            what,
        })?;
        out.push(c);
        i = next;
    }
    Ok(out)
}

/// The bytes of the UTF-8 encoding of the decoded contents of a JSON string,
/// one at a time, from the (validated) raw contents.
pub(super) struct Decoded<'s> {
    /// Raw contents, escapes included.
    raw: &'s [u8],
    /// Offset of the next unread raw byte.
    pos: usize,
    /// Encoding of the last decoded escape.
    pending: [u8; 4],
    /// Next unread byte of `pending`.
    pending_pos: usize,
    /// Number of bytes in `pending`.
    pending_len: usize,
}

impl<'s> Decoded<'s> {
    /// Starts decoding `raw`.
    fn new(raw: &'s [u8]) -> Self {
        Decoded {
            raw,
            pos: 0,
            pending: [0; 4],
            pending_pos: 0,
            pending_len: 0,
        }
    }
}

impl Iterator for Decoded<'_> {
    /// One byte of decoded UTF-8.
    type Item = u8;

    /// The next byte of the decoded text; stops early at an invalid escape
    /// (which validated input never has).
    fn next(&mut self) -> Option<u8> {
        if self.pending_pos < self.pending_len {
            let b = self.pending.get(self.pending_pos).copied();
            self.pending_pos += 1;
            return b;
        }
        let b = *self.raw.get(self.pos)?;
        if b != b'\\' {
            self.pos += 1;
            return Some(b);
        }
        let (c, next) = decode_escape(self.raw, self.pos).ok()?;
        self.pos = next;
        self.pending_len = c.encode_utf8(&mut self.pending).len();
        self.pending_pos = 1;
        self.pending.first().copied()
    }
}

/// The raw contents of a string span of the body.
fn raw(bytes: &[u8], span: Span) -> &[u8] {
    bytes.get(span.start..span.end).unwrap_or_default()
}

/// Whether the member name `name` decodes to `wanted`.
pub(super) fn name_is(bytes: &[u8], name: Span, wanted: &str) -> bool {
    let raw = raw(bytes, name);
    if name.escaped {
        Decoded::new(raw).eq(wanted.bytes())
    } else {
        raw == wanted.as_bytes()
    }
}

/// Orders two member names by their decoded UTF-8 bytes.
pub(super) fn compare_names(bytes: &[u8], a: Span, b: Span) -> Ordering {
    let (raw_a, raw_b) = (raw(bytes, a), raw(bytes, b));
    if a.escaped || b.escaped {
        Decoded::new(raw_a).cmp(Decoded::new(raw_b))
    } else {
        raw_a.cmp(raw_b)
    }
}
