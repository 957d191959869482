//! Finds the id values that simple JSONPath expressions name in a request
//! body, without building a `serde_json::Value`.
//!
//! [`scan`] reads the body once. It validates every byte as JSON (RFC 8259,
//! plus the limits that `serde_json` applies to a `Value`: numbers must be
//! finite as `f64`, and nesting is bounded by [`MAX_DEPTH`]) and records the
//! values that the given [`SimplePath`]s select. A selected value becomes a key
//! string when it is a string or an integer.
//!
//! How it works:
//! - In the accepted subset of RFC 9535 a path applies segment `d` to values
//!   nested `d` levels deep, so the paths still alive at a value form a bit
//!   mask. Values that no path reaches are validated by an iterative loop
//!   ([`Scanner::skip_value`]) that keeps the kind of every open container in
//!   one bit of a `u128`; values that some path reaches are walked by a
//!   recursion ([`Scanner::value`]) whose depth is bounded by the nesting limit.
//! - `serde_json` keeps the last of several members with the same name. The
//!   scanner remembers, for every member that a path goes through, its name and
//!   the range of results found under it; when the object closes, results under
//!   a member that a later member with the same decoded name shadows are
//!   dropped. Results are therefore buffered and handed over only once the
//!   whole body is known to be JSON: `found` is never called for a body that is
//!   not JSON.
//! - A negative index needs the length of the array: the elements are counted
//!   by a quick pre-scan before the array is walked.
//!
//! Why not serde: a `DeserializeSeed` over `serde_json::Deserializer` was tried
//! in its place. serde_json's quick skip (`IgnoredAny`) checks neither UTF-8,
//! nor escapes, nor number range, nor depth, so a walk that refuses every body
//! a `Value` refuses must visit the skipped values one by one, must buffer an
//! array to learn its length and needs raw values to keep an integer's digits;
//! it executes more instructions than this scanner on webhook bodies (figures in
//! docs/performance.md), even with the quick skip.

use std::borrow::{Borrow, Cow};
use std::cmp::Ordering;
use std::fmt;

/// Deepest nesting of arrays and objects that a body may have.
pub(crate) const MAX_DEPTH: usize = 127;

/// Largest absolute value of an index in a path (RFC 9535 limits integers to
/// the I-JSON range).
const MAX_INDEX: i64 = (1 << 53) - 1;

/// How many paths one pass over the body follows (one bit each in a `u64`).
const PATHS_PER_PASS: usize = 64;

/// What [`ScanError::NotAnId`] says about a number with a fraction or an
/// exponent.
const FRACTIONAL: &str = "a number with a fraction or an exponent";

/// Error class of input that ends inside a string.
const END_IN_STRING: &str = "unexpected end of input in a string";

/// Error class of a `\u` escape that is half of a surrogate pair.
const LONE_SURROGATE: &str = "lone surrogate in a \\u escape";

/// Error class of invalid UTF-8 inside a string.
const BAD_UTF8: &str = "invalid UTF-8 in a string";

mod lexical;
mod path;
#[cfg(test)]
mod tests;

use self::lexical::bits;
use self::lexical::{compare_names, name_is};
use self::path::Segment;
pub(crate) use self::path::SimplePath;

/// How a selected value failed to be an id, or the body failed to be JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ScanError {
    /// The body is not valid JSON (RFC 8259), is not UTF-8, or nests deeper
    /// than 128 arrays/objects. `String` is a short message naming the byte
    /// offset and the class of error, never quoting input.
    NotJson(String),
    /// A selected value is not a string or an integer. `&'static str` names
    /// what it is: "a number with a fraction or an exponent", "an object",
    /// "an array", "a boolean", "null".
    NotAnId(&'static str),
}

impl fmt::Display for ScanError {
    /// Writes a short English description, never quoting the body.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScanError::NotJson(message) => f.write_str(message),
            ScanError::NotAnId(what) => {
                write!(f, "selected value is {what}, not a string or an integer")
            }
        }
    }
}

impl std::error::Error for ScanError {}

/// Validates the whole `body` as JSON (every byte, also outside the selected
/// paths: bad JSON anywhere is an error) and calls `found` once per value
/// selected by any of `paths`, in document order, with the exact key text:
/// - strings: their decoded value (all escapes incl. `\uXXXX` and surrogate
///   pairs; lone surrogates are NotJson) — borrowed from the body when there
///   are no escapes (`Cow::Borrowed`), owned otherwise;
/// - integers (`-?(0|[1-9][0-9]*)` with no fraction/exponent): their exact
///   digits, any length, with `-0` written `0`; borrowed when already
///   canonical;
/// - anything else: `Err(NotAnId(..))` (a number with fraction or exponent
///   like `1e2` or `1.0` is NOT an id).
///
/// Returns the error of the first problem. `found` returning Err stops the
/// scan and that error is returned.
///
/// The first argument of `found` is the index of the path in `paths`; a value
/// selected by several paths is reported once per path, in path order. The
/// body is validated completely before `found` is first called, so a body
/// that is not JSON yields `NotJson` (the first syntax error in the body) and
/// no call at all; otherwise calls go in document order until the first
/// selected value that is not an id, whose `NotAnId` is returned.
///
/// As with `serde_json::Value`, a later member with the same name replaces an
/// earlier one, and a number whose magnitude overflows `f64` (such as `1e400`
/// or an integer of more than 309 digits) makes the body NotJson.
pub(crate) fn scan<'a, P: Borrow<SimplePath>>(
    body: &'a [u8],
    paths: &[P],
    found: &mut dyn FnMut(usize, Cow<'a, str>) -> Result<(), ScanError>,
) -> Result<(), ScanError> {
    let mut scanner = Scanner {
        bytes: body,
        pos: 0,
        paths: &[],
        first_path: 0,
        hits: Vec::new(),
        members: Vec::new(),
    };
    // One pass per group of 64 paths; almost always a single pass. An empty
    // `paths` still takes one pass, which validates the body.
    let mut groups = paths.chunks(PATHS_PER_PASS);
    let mut group = groups.next().unwrap_or(&[]);
    loop {
        scanner.pos = 0;
        scanner.paths = group;
        scanner.run().map_err(Syntax::into_error)?;
        scanner.first_path += group.len();
        match groups.next() {
            Some(next) => group = next,
            None => break,
        }
    }
    if paths.len() > PATHS_PER_PASS {
        // Each pass recorded its hits in document order; merge them.
        scanner.hits.sort_by_key(|hit| (hit.offset, hit.path));
    }
    for hit in scanner.hits {
        if hit.live {
            match hit.value {
                Ok(key) => found(hit.path, key)?,
                Err(what) => return Err(ScanError::NotAnId(what)),
            }
        }
    }
    Ok(())
}

/// A syntax problem in the body: where it is and what kind it is.
#[derive(Debug, Clone, Copy)]
struct Syntax {
    /// Byte offset in the body.
    at: usize,
    /// Class of the problem, in a few words.
    what: &'static str,
}

impl Syntax {
    /// The public error for this problem.
    fn into_error(self) -> ScanError {
        ScanError::NotJson(format!("invalid JSON at byte {}: {}", self.at, self.what))
    }
}

/// Result of a step of the scanner.
type Parsed<T> = Result<T, Syntax>;

/// The contents of a JSON string in the body (between its quotes).
#[derive(Debug, Clone, Copy)]
struct Span {
    /// Offset of the first byte after the opening quote.
    start: usize,
    /// Offset of the closing quote.
    end: usize,
    /// Whether the contents contain a backslash escape.
    escaped: bool,
}

/// A JSON number in the body.
#[derive(Debug, Clone, Copy)]
struct Number {
    /// Offset of its first byte.
    start: usize,
    /// Offset just after its last byte.
    end: usize,
    /// Whether it has neither a fraction nor an exponent.
    integer: bool,
}

/// A value selected by a path, kept until the whole body has been checked.
#[derive(Debug)]
struct Hit<'a> {
    /// Index of the path in the caller's list.
    path: usize,
    /// Offset of the value in the body (orders the hits of several passes).
    offset: usize,
    /// The key, or what the value is when it is not an id.
    value: Result<Cow<'a, str>, &'static str>,
    /// False once a later member with the same name has shadowed the value.
    live: bool,
}

/// A member of an open object that some path goes through or selects.
#[derive(Debug, Clone, Copy)]
struct Member {
    /// The member's name in the body.
    name: Span,
    /// Start of the hits recorded under this member.
    hits_start: usize,
    /// End of the hits recorded under this member.
    hits_end: usize,
}

/// State of one pass over the body.
struct Scanner<'a, 'p, P> {
    /// The body.
    bytes: &'a [u8],
    /// Offset of the next unread byte.
    pos: usize,
    /// The paths that this pass follows (at most 64).
    paths: &'p [P],
    /// Index, in the caller's list, of `paths[0]`.
    first_path: usize,
    /// Selected values, in document order.
    hits: Vec<Hit<'a>>,
    /// Stack of the matched members of the open objects.
    members: Vec<Member>,
}

impl<'a, P: Borrow<SimplePath>> Scanner<'a, '_, P> {
    /// Path `p` of this pass.
    fn path(&self, p: usize) -> Option<&SimplePath> {
        self.paths.get(p).map(Borrow::borrow)
    }

    /// Scans the whole body: one value between optional blank space.
    fn run(&mut self) -> Parsed<()> {
        let mut mask = 0u64;
        for (i, path) in self.paths.iter().map(Borrow::borrow).enumerate() {
            // No value lies deeper than the nesting limit.
            if path.segments.len() <= MAX_DEPTH {
                mask |= 1 << i;
            }
        }
        self.skip_ws();
        self.value(0, mask)?;
        self.skip_ws();
        if self.pos < self.bytes.len() {
            return Err(self.fail("trailing characters after the top-level value"));
        }
        Ok(())
    }

    /// The next byte, if any.
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    /// A problem of class `what` at the current position.
    fn fail(&self, what: &'static str) -> Syntax {
        Syntax { at: self.pos, what }
    }

    /// A problem at the current position: `expected`, or the end of input.
    fn unexpected(&self, expected: &'static str) -> Syntax {
        if self.pos >= self.bytes.len() {
            self.fail("unexpected end of input")
        } else {
            self.fail(expected)
        }
    }

    /// Consumes JSON white space.
    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = self.peek() {
            self.pos += 1;
        }
    }

    /// Consumes `byte`, or fails with `expected`.
    fn expect(&mut self, byte: u8, expected: &'static str) -> Parsed<()> {
        if self.peek() == Some(byte) {
            self.pos += 1;
            Ok(())
        } else {
            Err(self.unexpected(expected))
        }
    }

    /// Checks that one more level of nesting stays within the limit, for a
    /// container that starts at nesting `depth`.
    fn check_depth(&self, depth: usize) -> Parsed<()> {
        if depth >= MAX_DEPTH {
            Err(self.fail("arrays/objects nested too deep"))
        } else {
            Ok(())
        }
    }

    /// Reads the value at the current position, which lies `depth` containers
    /// deep and is reached by the paths in `mask`.
    fn value(&mut self, depth: usize, mask: u64) -> Parsed<()> {
        if mask == 0 {
            return self.skip_value(depth);
        }
        let mut ends = 0u64;
        for p in bits(mask) {
            if self
                .path(p)
                .is_some_and(|path| path.segments.len() == depth)
            {
                ends |= 1 << p;
            }
        }
        let rest = mask & !ends;
        let start = self.pos;
        match self.peek() {
            Some(b'{') => {
                self.record(ends, start, Err("an object"));
                if rest == 0 {
                    self.skip_value(depth)
                } else {
                    self.object(depth, rest)
                }
            }
            Some(b'[') => {
                self.record(ends, start, Err("an array"));
                if rest == 0 {
                    self.skip_value(depth)
                } else {
                    self.array(depth, rest)
                }
            }
            _ => self.scalar(ends, start),
        }
    }

    /// Reads the scalar at the current position (`start`), recorded for the paths in `ends`
    /// that end there.
    fn scalar(&mut self, ends: u64, start: usize) -> Parsed<()> {
        match self.peek() {
            Some(b'"') => {
                let span = self.string()?;
                if ends != 0 {
                    let key = self.string_key(span)?;
                    self.record(ends, start, Ok(key));
                }
                Ok(())
            }
            Some(b'-' | b'0'..=b'9') => {
                let number = self.number()?;
                if ends != 0 {
                    let key = if number.integer {
                        Ok(self.integer_key(number)?)
                    } else {
                        Err(FRACTIONAL)
                    };
                    self.record(ends, start, key);
                }
                Ok(())
            }
            Some(b't') => {
                self.literal(b"true")?;
                self.record(ends, start, Err("a boolean"));
                Ok(())
            }
            Some(b'f') => {
                self.literal(b"false")?;
                self.record(ends, start, Err("a boolean"));
                Ok(())
            }
            Some(b'n') => {
                self.literal(b"null")?;
                self.record(ends, start, Err("null"));
                Ok(())
            }
            _ => Err(self.unexpected("expected a value")),
        }
    }

    /// Records `value`, found at `offset`, as selected by each path in `ends`.
    fn record(&mut self, ends: u64, offset: usize, value: Result<Cow<'a, str>, &'static str>) {
        for p in bits(ends) {
            self.hits.push(Hit {
                path: self.first_path + p,
                offset,
                value: value.clone(),
                live: true,
            });
        }
    }

    /// Reads an object, `depth` containers deep, whose members the paths in
    /// `mask` (none of which ends here) may go into.
    fn object(&mut self, depth: usize, mask: u64) -> Parsed<()> {
        self.check_depth(depth)?;
        self.pos += 1;
        self.skip_ws();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Ok(());
        }
        let base = self.members.len();
        loop {
            if self.peek() != Some(b'"') {
                return Err(self.unexpected("expected a member name"));
            }
            let name = self.string()?;
            self.skip_ws();
            self.expect(b':', "expected ':'")?;
            self.skip_ws();
            let child = self.member_mask(depth, mask, name);
            if child == 0 {
                self.skip_value(depth + 1)?;
            } else {
                let hits_start = self.hits.len();
                self.value(depth + 1, child)?;
                self.members.push(Member {
                    name,
                    hits_start,
                    hits_end: self.hits.len(),
                });
            }
            self.skip_ws();
            match self.peek() {
                Some(b',') => {
                    self.pos += 1;
                    self.skip_ws();
                }
                Some(b'}') => {
                    self.pos += 1;
                    break;
                }
                _ => return Err(self.unexpected("expected ',' or '}'")),
            }
        }
        self.drop_shadowed(base);
        self.members.truncate(base);
        Ok(())
    }

    /// The paths in `mask` that go into the member called `name` of an object
    /// `depth` containers deep.
    fn member_mask(&self, depth: usize, mask: u64, name: Span) -> u64 {
        let mut child = 0;
        for p in bits(mask) {
            let matches = match self.path(p).and_then(|path| path.segments.get(depth)) {
                Some(Segment::Wildcard) => true,
                Some(Segment::Name(wanted)) => name_is(self.bytes, name, wanted),
                _ => false,
            };
            if matches {
                child |= 1 << p;
            }
        }
        child
    }

    /// Marks dead the hits under the members (from `members[base..]`, those
    /// of the object that just closed) that a later member with the same name
    /// shadows.
    fn drop_shadowed(&mut self, base: usize) {
        let bytes = self.bytes;
        let Some(members) = self.members.get_mut(base..) else {
            return;
        };
        if members.len() < 2 {
            return;
        }
        members.sort_unstable_by(|a, b| {
            compare_names(bytes, a.name, b.name).then(a.name.start.cmp(&b.name.start))
        });
        for pair in members.windows(2) {
            if let [earlier, later] = pair {
                if compare_names(bytes, earlier.name, later.name) == Ordering::Equal {
                    if let Some(hits) = self.hits.get_mut(earlier.hits_start..earlier.hits_end) {
                        for hit in hits {
                            hit.live = false;
                        }
                    }
                }
            }
        }
    }

    /// Reads an array, `depth` containers deep, whose elements the paths in
    /// `mask` (none of which ends here) may go into.
    fn array(&mut self, depth: usize, mask: u64) -> Parsed<()> {
        self.check_depth(depth)?;
        self.pos += 1;
        let needs_len = bits(mask).any(|p| {
            matches!(
                self.path(p).and_then(|path| path.segments.get(depth)),
                Some(Segment::Index(i)) if *i < 0
            )
        });
        let len = if needs_len { self.count_elements() } else { 0 };
        self.skip_ws();
        if self.peek() == Some(b']') {
            self.pos += 1;
            return Ok(());
        }
        let mut index = 0usize;
        loop {
            let child = self.element_mask(depth, mask, index, len);
            if child == 0 {
                self.skip_value(depth + 1)?;
            } else {
                self.value(depth + 1, child)?;
            }
            self.skip_ws();
            match self.peek() {
                Some(b',') => {
                    self.pos += 1;
                    self.skip_ws();
                    index += 1;
                }
                Some(b']') => {
                    self.pos += 1;
                    return Ok(());
                }
                _ => return Err(self.unexpected("expected ',' or ']'")),
            }
        }
    }

    /// The paths in `mask` that go into element `index` of an array `depth`
    /// containers deep and `len` elements long (`len` is only meaningful when
    /// some path uses a negative index here).
    fn element_mask(&self, depth: usize, mask: u64, index: usize, len: usize) -> u64 {
        let mut child = 0;
        for p in bits(mask) {
            let matches = match self.path(p).and_then(|path| path.segments.get(depth)) {
                Some(Segment::Wildcard) => true,
                Some(&Segment::Index(i)) => {
                    let target = if i < 0 {
                        len as i128 + i128::from(i)
                    } else {
                        i128::from(i)
                    };
                    target == index as i128
                }
                _ => false,
            };
            if matches {
                child |= 1 << p;
            }
        }
        child
    }

    /// Counts the elements of the array whose `[` was just consumed, without
    /// moving. Exact for valid JSON; for anything else the count does not
    /// matter, because the scan that follows fails.
    fn count_elements(&self) -> usize {
        let bytes = self.bytes;
        let mut i = self.pos;
        let mut nesting = 0usize;
        let mut commas = 0usize;
        let mut empty = true;
        while let Some(&b) = bytes.get(i) {
            match b {
                b' ' | b'\t' | b'\n' | b'\r' => {}
                b'"' => {
                    empty = false;
                    i += 1;
                    while let Some(&c) = bytes.get(i) {
                        match c {
                            b'"' => break,
                            b'\\' => i += 2,
                            _ => i += 1,
                        }
                    }
                }
                b'[' | b'{' => {
                    empty = false;
                    nesting += 1;
                }
                b']' | b'}' => {
                    if nesting == 0 {
                        break;
                    }
                    nesting -= 1;
                }
                b',' if nesting == 0 => commas += 1,
                _ => empty = false,
            }
            i += 1;
        }
        if empty { 0 } else { commas + 1 }
    }
}
