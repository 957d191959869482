//! The accepted subset of RFC 9535 JSONPath: parsing a path, and following it member by
//! member while the body is read.

use super::*;

/// One step of a [`SimplePath`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Segment {
    /// `.name`, `['name']` or `["name"]`: the member with this (decoded) name.
    Name(String),
    /// `[N]`: the element at this index; a negative index counts from the end.
    Index(i64),
    /// `.*` or `[*]`: every element of an array or member value of an object.
    Wildcard,
}

/// A path in the subset providers use: `$`, then segments `.name`,
/// `['name']` / `["name"]` (with JSON-style escapes in the quoted form), `[N]`
/// (non-negative or negative index, negative counts from the end), `[*]` and
/// `.*` (wildcard over array elements or object member values).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SimplePath {
    /// The segments after `$`, in order.
    pub(super) segments: Vec<Segment>,
}

impl SimplePath {
    /// None when `path` uses anything outside the subset (filters `?`,
    /// descendant `..`, slices `a:b`, unions `a,b`, functions) or is
    /// malformed; callers then fall back to a DOM-based RFC 9535
    /// implementation.
    ///
    /// Blank space (space, tab, CR, LF) is accepted where RFC 9535 allows it:
    /// before a segment and inside brackets. Where `serde_json_path` is
    /// stricter than RFC 9535 (a high surrogate escape must be written
    /// `\uD8..` to `\uDB..` with upper-case `D` and second digit), this parser
    /// is as strict, so that it never accepts a path the fallback rejects.
    pub(crate) fn parse(path: &str) -> Option<SimplePath> {
        let mut cur = PathCursor { text: path, pos: 0 };
        if !cur.eat(b'$') {
            return None;
        }
        let mut segments = Vec::new();
        loop {
            let before_blank = cur.pos;
            cur.skip_blank();
            match cur.peek() {
                // Blank space must be followed by a segment.
                None if cur.pos == before_blank => return Some(SimplePath { segments }),
                Some(b'.') => {
                    cur.pos += 1;
                    let segment = if cur.eat(b'*') {
                        Segment::Wildcard
                    } else {
                        Segment::Name(cur.shorthand_name()?)
                    };
                    segments.push(segment);
                }
                Some(b'[') => {
                    cur.pos += 1;
                    cur.skip_blank();
                    let segment = match cur.peek()? {
                        b'*' => {
                            cur.pos += 1;
                            Segment::Wildcard
                        }
                        quote @ (b'\'' | b'"') => {
                            cur.pos += 1;
                            Segment::Name(cur.quoted_name(quote)?)
                        }
                        b'-' | b'0'..=b'9' => Segment::Index(cur.index()?),
                        _ => return None,
                    };
                    cur.skip_blank();
                    if !cur.eat(b']') {
                        return None;
                    }
                    segments.push(segment);
                }
                _ => return None,
            }
        }
    }
}

impl SimplePath {
    /// The values this path selects in a parsed document, in its order (an object's members in
    /// serde_json's order, as `serde_json_path` returns them): what a batch's items and a
    /// fingerprint's fields are read with.
    pub(crate) fn select<'v>(&self, root: &'v serde_json::Value) -> Vec<&'v serde_json::Value> {
        use serde_json::Value;
        let mut nodes = vec![root];
        for segment in &self.segments {
            let mut next = Vec::with_capacity(nodes.len());
            for node in nodes {
                match (segment, node) {
                    (Segment::Name(name), Value::Object(map)) => next.extend(map.get(name)),
                    (Segment::Index(index), Value::Array(items)) => {
                        let at = if *index < 0 {
                            usize::try_from(index.unsigned_abs())
                                .ok()
                                .and_then(|back| items.len().checked_sub(back))
                        } else {
                            usize::try_from(*index).ok()
                        };
                        next.extend(at.and_then(|at| items.get(at)));
                    }
                    (Segment::Wildcard, Value::Array(items)) => next.extend(items),
                    (Segment::Wildcard, Value::Object(map)) => next.extend(map.values()),
                    _ => {}
                }
            }
            nodes = next;
        }
        nodes
    }
}

/// A position in the text of a path being parsed.
struct PathCursor<'s> {
    /// The whole path.
    text: &'s str,
    /// Byte offset of the next unread character (always a char boundary).
    pos: usize,
}

impl<'s> PathCursor<'s> {
    /// The next byte, if any.
    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.pos).copied()
    }

    /// Consumes `byte` if it comes next; tells whether it did.
    fn eat(&mut self, byte: u8) -> bool {
        let found = self.peek() == Some(byte);
        if found {
            self.pos += 1;
        }
        found
    }

    /// Consumes blank space as RFC 9535 defines it.
    fn skip_blank(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    /// The unread rest of the path.
    fn rest(&self) -> &'s str {
        self.text.get(self.pos..).unwrap_or("")
    }

    /// Reads a `member-name-shorthand`: a letter, `_` or non-ASCII character,
    /// then also digits.
    fn shorthand_name(&mut self) -> Option<String> {
        let rest = self.rest();
        let mut end = 0;
        for (i, c) in rest.char_indices() {
            let allowed = c.is_ascii_alphabetic()
                || c == '_'
                || !c.is_ascii()
                || (i > 0 && c.is_ascii_digit());
            if !allowed {
                break;
            }
            end = i + c.len_utf8();
        }
        let name = rest.get(..end).filter(|name| !name.is_empty())?;
        self.pos += end;
        Some(name.to_owned())
    }

    /// Reads an index: `0` or `-?[1-9][0-9]*` within the I-JSON range.
    fn index(&mut self) -> Option<i64> {
        let negative = self.eat(b'-');
        let start = self.pos;
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.pos += 1;
        }
        let digits = self.text.as_bytes().get(start..self.pos)?;
        match digits {
            [] => None,
            [b'0'] if !negative => Some(0),
            [b'0', ..] => None,
            _ if digits.len() > 16 => None,
            _ => {
                let value = digits
                    .iter()
                    .fold(0i64, |acc, d| acc * 10 + i64::from(d - b'0'));
                (value <= MAX_INDEX).then_some(if negative { -value } else { value })
            }
        }
    }

    /// Reads the rest of a quoted name whose opening `quote` was consumed.
    fn quoted_name(&mut self, quote: u8) -> Option<String> {
        let mut name = String::new();
        loop {
            let c = self.rest().chars().next()?;
            self.pos += c.len_utf8();
            match c {
                _ if c == char::from(quote) => return Some(name),
                '\\' => name.push(self.escape(quote)?),
                c if c < ' ' => return None,
                c => name.push(c),
            }
        }
    }

    /// Reads an escape in a quoted name after its backslash.
    fn escape(&mut self, quote: u8) -> Option<char> {
        let byte = self.peek()?;
        self.pos += 1;
        Some(match byte {
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'/' => '/',
            b'\\' => '\\',
            b'u' => return self.unicode_escape(),
            _ if byte == quote => char::from(quote),
            _ => return None,
        })
    }

    /// Reads the hex digits of a `\u` escape (and the low half of a surrogate
    /// pair).
    fn unicode_escape(&mut self) -> Option<char> {
        let digits = self.text.as_bytes().get(self.pos..self.pos + 4)?;
        let high = hex4(digits)?;
        self.pos += 4;
        match high {
            0xD800..=0xDBFF => {
                if !matches!(digits, [b'D', b'8' | b'9' | b'A' | b'B', ..]) {
                    return None;
                }
                if !(self.eat(b'\\') && self.eat(b'u')) {
                    return None;
                }
                let low = hex4(self.text.as_bytes().get(self.pos..self.pos + 4)?)?;
                if !(0xDC00..=0xDFFF).contains(&low) {
                    return None;
                }
                self.pos += 4;
                char::from_u32(0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00))
            }
            0xDC00..=0xDFFF => None,
            _ => char::from_u32(high),
        }
    }
}

/// The value of four hex digits (either case), or None.
pub(super) fn hex4(digits: &[u8]) -> Option<u32> {
    if digits.len() != 4 {
        return None;
    }
    digits
        .iter()
        .try_fold(0u32, |acc, &d| Some(acc * 16 + char::from(d).to_digit(16)?))
}
