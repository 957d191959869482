//! Writing HTML by hand, safely: every interpolated string goes through [`esc`], every query
//! value through [`query_value`].

use std::fmt::{self, Display, Write};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `text` escaped for HTML text and for a double-quoted attribute value.
pub(super) struct Esc<'a>(pub(super) &'a str);

/// Escapes `text` where it is written with `{}`.
pub(super) fn esc(text: &str) -> Esc<'_> {
    Esc(text)
}

impl Display for Esc<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut rest = self.0;
        while let Some(at) = rest.find(['&', '<', '>', '"', '\'']) {
            f.write_str(&rest[..at])?;
            f.write_str(match rest.as_bytes()[at] {
                b'&' => "&amp;",
                b'<' => "&lt;",
                b'>' => "&gt;",
                b'"' => "&quot;",
                _ => "&#39;",
            })?;
            rest = &rest[at + 1..];
        }
        f.write_str(rest)
    }
}

/// `value` percent-encoded for a query string (everything but unreserved characters).
pub(super) fn query_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                out.push(byte as char)
            }
            _ => {
                let _ = write!(out, "%{byte:02X}");
            }
        }
    }
    out
}

/// A query string of `pairs`, empty values left out.
pub(super) fn query<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut out = String::new();
    for (name, value) in pairs.into_iter().filter(|(_, value)| !value.is_empty()) {
        let sep = if out.is_empty() { "" } else { "&" };
        let _ = write!(out, "{sep}{name}={}", query_value(value));
    }
    out
}

/// `time` in UTC, to the second: `2025-12-02 09:20:00Z`.
pub(super) fn time(time: SystemTime) -> String {
    let secs = time
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil(days as i64);
    let (h, m, s) = (rest / 3600, rest % 3600 / 60, rest % 60);
    format!("{year:04}-{month:02}-{day:02} {h:02}:{m:02}:{s:02}Z")
}

/// The date of a day since 1970-01-01 (Howard Hinnant's `civil_from_days`).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// A duration for a person: `850 µs`, `12.5 ms`, `3.2 s`, `4m 05s`, `2h 10m`, `3d 04h`.
pub(super) fn duration(d: Duration) -> String {
    let secs = d.as_secs();
    match secs {
        0 if d.as_micros() < 1000 => format!("{} µs", d.as_micros()),
        0 if d.as_millis() < 100 => format!("{:.1} ms", d.as_secs_f64() * 1e3),
        0 => format!("{} ms", d.as_millis()),
        1..60 => format!("{:.1} s", d.as_secs_f64()),
        60..3600 => format!("{}m {:02}s", secs / 60, secs % 60),
        3600..86_400 => format!("{}h {:02}m", secs / 3600, secs % 3600 / 60),
        _ => format!("{}d {:02}h", secs / 86_400, secs % 86_400 / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_markup_character_is_escaped() {
        let hostile = r#"<script>alert("x")</script> & 'y' é"#;
        assert_eq!(
            esc(hostile).to_string(),
            "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &#39;y&#39; é"
        );
        assert_eq!(esc("plain").to_string(), "plain");
        assert_eq!(esc("").to_string(), "");
        assert_eq!(esc("&&").to_string(), "&amp;&amp;");
    }

    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(query_value("a b&c=d/é"), "a%20b%26c%3Dd%2F%C3%A9");
        let q = query([("state", "dead"), ("route", ""), ("error", "time out")]);
        assert_eq!(q, "state=dead&error=time%20out");
    }

    #[test]
    fn times_and_durations_read_as_a_person_reads_them() {
        let at = UNIX_EPOCH + Duration::from_secs(1_764_667_200);
        assert_eq!(time(at), "2025-12-02 09:20:00Z");
        assert_eq!(time(UNIX_EPOCH), "1970-01-01 00:00:00Z");
        assert_eq!(duration(Duration::from_micros(850)), "850 µs");
        assert_eq!(duration(Duration::from_micros(12_500)), "12.5 ms");
        assert_eq!(duration(Duration::from_millis(250)), "250 ms");
        assert_eq!(duration(Duration::from_millis(3_200)), "3.2 s");
        assert_eq!(duration(Duration::from_secs(245)), "4m 05s");
        assert_eq!(duration(Duration::from_secs(7_800)), "2h 10m");
        assert_eq!(duration(Duration::from_secs(273_600)), "3d 04h");
    }
}
