//! [`Position`]: where an event stands in the order of its object's events, and the exact
//! parsing of the three kinds built in: RFC 3339 timestamps, integer sequences and ranks.

use std::fmt;

/// Where an event stands among the events of its object: greater is newer.
///
/// An integer of 128 bits: a sequence number, a timestamp in nanoseconds since the Unix epoch
/// ([`Position::from_rfc3339`]), or a rank. Positions of one route must be of one kind (a
/// timestamp and a sequence number do not compare meaningfully).
///
/// ```
/// use tower_idempotency::order::Position;
///
/// let a = Position::from_rfc3339("2024-05-01T14:01:00Z").unwrap();
/// let b = Position::from_rfc3339("2024-05-01T16:02:00.5+02:00").unwrap();
/// assert!(a < b, "14:01 UTC is before 16:02:00.5 at UTC+2 (14:02:00.5 UTC)");
/// assert_eq!(Position::new(7).get(), 7);
/// ```
#[derive(Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Position(i128);

impl Position {
    /// The length of [`to_bytes`](Self::to_bytes).
    #[cfg_attr(
        not(any(feature = "redis", feature = "postgres", feature = "sqlite")),
        allow(dead_code)
    )]
    pub(crate) const LEN: usize = 16;

    /// A position from its integer value.
    pub const fn new(value: i128) -> Self {
        Position(value)
    }

    /// The integer value.
    pub const fn get(self) -> i128 {
        self.0
    }

    /// Sixteen bytes whose byte-wise order is the positions' order (big-endian, sign bit
    /// flipped): what the stores write and compare (`memcmp` in SQL, byte by byte in Lua).
    #[cfg_attr(
        not(any(feature = "redis", feature = "postgres", feature = "sqlite")),
        allow(dead_code)
    )]
    pub(crate) fn to_bytes(self) -> [u8; Self::LEN] {
        ((self.0 as u128) ^ (1 << 127)).to_be_bytes()
    }

    /// The position of [`to_bytes`](Self::to_bytes).
    #[cfg_attr(
        not(any(feature = "redis", feature = "postgres", feature = "sqlite")),
        allow(dead_code)
    )]
    pub(crate) fn from_bytes(bytes: [u8; Self::LEN]) -> Self {
        Position((u128::from_be_bytes(bytes) ^ (1 << 127)) as i128)
    }

    /// An integer written in decimal digits (`-?[0-9]+`, no sign `+`, no fraction, no
    /// exponent), exactly: `None` when it is not one or does not fit 128 bits.
    pub fn from_integer_text(text: &str) -> Option<Self> {
        let digits = text.strip_prefix('-').unwrap_or(text);
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        text.parse::<i128>().ok().map(Position)
    }

    /// An RFC 3339 date-time (`2024-05-01T14:02:03.123456789Z`, `...+02:00`; `t`, `z` and a
    /// space for `T` accepted, as RFC 3339 allows), as nanoseconds since the Unix epoch in
    /// UTC. Fractional digits beyond nanoseconds are cut (not rounded). A leap second (`:60`,
    /// which RFC 3339 allows) is taken as the next second: `23:59:60Z` is the next day's
    /// `00:00:00Z` (the Unix clock has no leap seconds). `None` when `text` is not one: a
    /// missing offset, a month 13, February 30, an hour 24, a second 61, or years outside 0000
    /// to 9999.
    pub fn from_rfc3339(text: &str) -> Option<Self> {
        rfc3339_nanos(text.as_bytes()).map(Position)
    }

    /// The instant this position is as nanoseconds since the Unix epoch, as an RFC 3339
    /// date-time in UTC (`2024-05-01T14:02:03.5Z`; the fraction without trailing zeros, none
    /// for a whole second): `None` outside the years 0000 to 9999. How logs show the positions
    /// of an extractor whose positions are instants.
    pub(crate) fn to_rfc3339(self) -> Option<String> {
        let seconds = i64::try_from(self.0.div_euclid(1_000_000_000)).ok()?;
        let nanos = self.0.rem_euclid(1_000_000_000);
        let (days, second_of_day) = (seconds.div_euclid(86_400), seconds.rem_euclid(86_400));
        let (year, month, day) = civil_from_days(days);
        if !(0..=9999).contains(&year) {
            return None;
        }
        let (hour, minute, second) = (
            second_of_day / 3600,
            second_of_day / 60 % 60,
            second_of_day % 60,
        );
        let mut text = format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}");
        if nanos > 0 {
            let fraction = format!("{nanos:09}");
            text.push('.');
            text.push_str(fraction.trim_end_matches('0'));
        }
        text.push('Z');
        Some(text)
    }
}

impl fmt::Debug for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Position({})", self.0)
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// `digits` as a number, when every byte is an ASCII digit.
fn number(digits: &[u8]) -> Option<i64> {
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(digits.iter().fold(0, |n, d| n * 10 + i64::from(d - b'0')))
}

/// Days from 1970-01-01 to `year-month-day` (proleptic Gregorian; H. Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month_from_march = (month + 9) % 12;
    let day_of_year = (153 * month_from_march + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The `(year, month, day)` of `days` since 1970-01-01 (the inverse of [`days_from_civil`]).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let days = days + 719_468;
    let era = days.div_euclid(146_097);
    let day_of_era = days - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// RFC 3339 `date-time` (section 5.6) as nanoseconds since the Unix epoch.
fn rfc3339_nanos(s: &[u8]) -> Option<i128> {
    // date-fullyear "-" date-month "-" date-mday "T" time-hour ":" time-minute ":" time-second
    if s.len() < 20 {
        return None;
    }
    let field = |from: usize, to: usize| number(&s[from..to]);
    let (year, month, day) = (field(0, 4)?, field(5, 7)?, field(8, 10)?);
    let (hour, minute, second) = (field(11, 13)?, field(14, 16)?, field(17, 19)?);
    let separators = s[4] == b'-' && s[7] == b'-' && s[13] == b':' && s[16] == b':';
    if !separators || !matches!(s[10], b'T' | b't' | b' ') {
        return None;
    }
    if !(1..=12).contains(&month) || day < 1 || day > days_in_month(year, month) {
        return None;
    }
    // A leap second, 60, counts as the next one (what the Unix clock shows).
    if hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let mut rest = &s[19..];
    let mut nanos: i128 = 0;
    if let Some(fraction) = rest.strip_prefix(b".") {
        let digits = fraction.iter().take_while(|b| b.is_ascii_digit()).count();
        if digits == 0 {
            return None;
        }
        for (i, d) in fraction[..digits].iter().enumerate().take(9) {
            nanos += i128::from(d - b'0') * 10i128.pow(8 - i as u32);
        }
        rest = &fraction[digits..];
    }
    let offset_minutes = match rest {
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] => {
            let (hours, minutes) = (number(&[*h1, *h2])?, number(&[*m1, *m2])?);
            if hours > 23 || minutes > 59 {
                return None;
            }
            let offset = hours * 60 + minutes;
            if *sign == b'-' { -offset } else { offset }
        }
        _ => return None,
    };
    let days = days_from_civil(year, month, day);
    let seconds = days * 86_400 + hour * 3600 + minute * 60 + second - offset_minutes * 60;
    Some(i128::from(seconds) * 1_000_000_000 + nanos)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Was the doctest of `to_rfc3339` while it was public.
    #[test]
    fn to_rfc3339_writes_utc_without_trailing_zeros() {
        let at = Position::from_rfc3339("2024-05-01T16:02:03.500+02:00").unwrap();
        assert_eq!(at.to_rfc3339().as_deref(), Some("2024-05-01T14:02:03.5Z"));
    }

    fn at(text: &str) -> i128 {
        Position::from_rfc3339(text)
            .unwrap_or_else(|| panic!("{text}"))
            .get()
    }

    #[test]
    fn timestamps_are_exact_nanoseconds_in_utc() {
        assert_eq!(at("1970-01-01T00:00:00Z"), 0);
        assert_eq!(at("1970-01-01T00:00:01.5Z"), 1_500_000_000);
        assert_eq!(at("2024-05-01T14:02:00Z"), 1_714_572_120 * 1_000_000_000);
        // The same instant in three spellings.
        let utc = at("2024-05-01T14:02:03.123456789Z");
        assert_eq!(utc, at("2024-05-01T16:02:03.123456789+02:00"));
        assert_eq!(utc, at("2024-05-01t09:32:03.123456789-04:30"));
        // Digits beyond nanoseconds are cut.
        assert_eq!(at("2024-05-01T14:02:03.1234567891Z"), utc);
        assert_eq!(at("1969-12-31T23:59:59Z"), -1_000_000_000);
        assert_eq!(at("2000-02-29T00:00:00Z"), 951_782_400 * 1_000_000_000);
        assert_eq!(at("2024-05-01 14:02:00z"), at("2024-05-01T14:02:00Z"));
    }

    #[test]
    fn timestamps_are_shown_in_rfc3339() {
        for text in [
            "1970-01-01T00:00:00Z",
            "1969-12-31T23:59:59.999999999Z",
            "2000-02-29T12:00:00.5Z",
            "2024-05-01T14:02:03.123456789Z",
            "0000-01-01T00:00:00Z",
            "9999-12-31T23:59:59Z",
        ] {
            let position = Position::from_rfc3339(text).unwrap();
            assert_eq!(position.to_rfc3339().as_deref(), Some(text));
        }
        assert_eq!(Position::new(i128::MAX).to_rfc3339(), None);
    }

    #[test]
    fn a_leap_second_is_the_next_second() {
        assert_eq!(at("2016-12-31T23:59:60Z"), at("2017-01-01T00:00:00Z"));
        assert_eq!(at("2016-12-31T23:59:60.5Z"), at("2017-01-01T00:00:00.5Z"));
        // The same leap second in another offset.
        assert_eq!(at("2017-01-01T05:29:60+05:30"), at("2017-01-01T00:00:00Z"));
        assert!(at("2016-12-31T23:59:59.999999999Z") < at("2016-12-31T23:59:60Z"));
    }

    #[test]
    fn malformed_timestamps_are_refused() {
        for bad in [
            "",
            "2024-05-01",
            "2024-05-01T14:02:00",
            "2024-05-01T14:02:00+0200",
            "2024-13-01T14:02:00Z",
            "2023-02-29T14:02:00Z",
            "2024-04-31T14:02:00Z",
            "2024-05-01T24:00:00Z",
            "2024-05-01T14:60:00Z",
            "2024-05-01T14:02:61Z",
            "2024-05-01T14:02:00.Z",
            "2024-05-01T14:02:00+24:00",
            "2024-05-01T14:02:00Zjunk",
            "２０２４-05-01T14:02:00Z",
            "+2024-05-01T14:02:00Z",
            "1714572120",
        ] {
            assert!(Position::from_rfc3339(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn integers_are_exact() {
        assert_eq!(Position::from_integer_text("0"), Some(Position(0)));
        assert_eq!(Position::from_integer_text("-17"), Some(Position(-17)));
        let big = "170141183460469231731687303715884105727";
        assert_eq!(Position::from_integer_text(big), Some(Position(i128::MAX)));
        for bad in [
            "",
            "-",
            "+1",
            "1.0",
            "1e3",
            " 1",
            "1_000",
            "170141183460469231731687303715884105728",
        ] {
            assert!(Position::from_integer_text(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn byte_order_is_numeric_order() {
        let values = [
            i128::MIN,
            -1_000_000,
            -1,
            0,
            1,
            255,
            256,
            1 << 70,
            i128::MAX,
        ];
        for pair in values.windows(2) {
            let (a, b) = (Position(pair[0]), Position(pair[1]));
            assert!(a.to_bytes() < b.to_bytes(), "{a:?} {b:?}");
            assert_eq!(Position::from_bytes(a.to_bytes()), a);
        }
    }
}
