//! The query parameters of the listing and of the bulk re-queue: a filter, a cursor, a limit.

use std::fmt::Write;

use super::html;
use super::json::Refusal;
use super::page::FilterForm;
use crate::inbox::{Filter, KeyState};
use crate::store::{ObjectKey, StoreKey};

/// The page sizes of a listing: (default, most).
pub(super) const LIST: (usize, usize) = (50, 500);

/// The page sizes of a bulk re-queue: (default, most).
pub(super) const REQUEUE: (usize, usize) = (500, 1000);

/// `raw` percent-decoded (and `+` as a space in a query); `None` when an escape is malformed
/// or the result is not UTF-8.
pub(super) fn percent_decode(raw: &str, query: bool) -> Option<String> {
    let mut bytes = Vec::with_capacity(raw.len());
    let mut rest = raw.as_bytes();
    while let Some((&first, tail)) = rest.split_first() {
        rest = tail;
        match first {
            b'%' => {
                let hex = std::str::from_utf8(rest.get(..2)?).ok()?;
                bytes.push(u8::from_str_radix(hex, 16).ok()?);
                rest = &rest[2..];
            }
            b'+' if query => bytes.push(b' '),
            other => bytes.push(other),
        }
    }
    String::from_utf8(bytes).ok()
}

/// The decoded parameters of `query`, empty values left out: 400 for a malformed or repeated
/// one.
fn pairs(query: &str) -> Result<Vec<(String, String)>, Refusal> {
    let mut pairs: Vec<(String, String)> = Vec::new();
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let decode = |raw| {
            percent_decode(raw, true)
                .ok_or_else(|| bad("a query parameter is not valid percent-encoded UTF-8"))
        };
        let (name, value) = (decode(name)?, decode(value)?);
        if pairs.iter().any(|(seen, _)| *seen == name) {
            return Err(Refusal::BadParameter(format!("`{name}` is given twice")));
        }
        if !value.is_empty() {
            pairs.push((name, value));
        }
    }
    Ok(pairs)
}

/// The fields of a form's `application/x-www-form-urlencoded` body.
pub(super) fn form(body: &[u8]) -> Result<Vec<(String, String)>, Refusal> {
    let body = std::str::from_utf8(body).map_err(|_| bad("the form is not UTF-8"))?;
    pairs(body.trim_end())
}

/// What an action did, for the page it redirects to: one of a fixed set of messages, named in
/// the redirect's query (`done`, with `done_key` or `done_n`) and written by the server, so
/// that a link cannot put text of its own on the operator's page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Flash {
    Requeued(StoreKey),
    Discarded(StoreKey),
    NotDead(StoreKey),
    Paused,
    Resumed,
    RequeuedMatching(u64),
}

impl Flash {
    /// The redirect's query parameters that name this message.
    pub(super) fn query(&self) -> String {
        let (done, key, n) = match self {
            Flash::Requeued(key) => ("requeued", Some(key), None),
            Flash::Discarded(key) => ("discarded", Some(key), None),
            Flash::NotDead(key) => ("not_dead", Some(key), None),
            Flash::Paused => ("paused", None, None),
            Flash::Resumed => ("resumed", None, None),
            Flash::RequeuedMatching(n) => ("requeued_matching", None, Some(n.to_string())),
        };
        let key = key.map(StoreKey::as_str).unwrap_or_default();
        html::query([
            ("done", done),
            ("done_key", key),
            ("done_n", n.as_deref().unwrap_or_default()),
        ])
    }

    /// The message named by `done` with its `done_key` or `done_n`; 400 for any other.
    fn parse(done: &str, key: Option<&str>, n: Option<&str>) -> Result<Flash, Refusal> {
        let key = || {
            key.and_then(StoreKey::parse)
                .ok_or_else(|| bad("`done_key` is not a store key"))
        };
        Ok(match done {
            "requeued" => Flash::Requeued(key()?),
            "discarded" => Flash::Discarded(key()?),
            "not_dead" => Flash::NotDead(key()?),
            "paused" => Flash::Paused,
            "resumed" => Flash::Resumed,
            "requeued_matching" => Flash::RequeuedMatching(
                n.and_then(|n| n.parse().ok())
                    .ok_or_else(|| bad("`done_n` is not a count"))?,
            ),
            _ => return Err(bad("`done` names no message")),
        })
    }

    /// The message.
    pub(super) fn text(&self) -> String {
        match self {
            Flash::Requeued(key) => format!("{key}: re-queued."),
            Flash::Discarded(key) => format!("{key}: discarded, its key kept as done."),
            Flash::NotDead(key) => format!("{key} is not a dead letter (any more)."),
            Flash::Paused => "Taking paused in every worker process.".to_owned(),
            Flash::Resumed => "Taking resumed.".to_owned(),
            Flash::RequeuedMatching(n) => format!("{n} dead letters re-queued."),
        }
    }
}

/// What the page's query asks: a message to show, an entry's page, the confirmation of a
/// bulk re-queue, or the index with a filter (`state=any` meaning none).
#[derive(Debug, Default)]
pub(super) struct PageQuery {
    pub(super) flash: Option<Flash>,
    pub(super) entry: Option<String>,
    pub(super) confirm: bool,
    /// The listing's parameters, as given (for [`listing`]).
    pub(super) listing: String,
    pub(super) filter: FilterForm,
}

/// The page's query: 400 for a malformed one (the listing's parameters are checked by
/// [`listing`]).
pub(super) fn page(query: &str) -> Result<PageQuery, Refusal> {
    let mut page = PageQuery::default();
    let mut listing = Vec::new();
    let (mut done, mut done_key, mut done_n) = (None, None, None);
    for raw in query.split('&').filter(|pair| !pair.is_empty()) {
        let (name, value) = raw.split_once('=').unwrap_or((raw, ""));
        let value = percent_decode(value, true)
            .ok_or_else(|| bad("a query parameter is not valid percent-encoded UTF-8"))?;
        let name = percent_decode(name, true)
            .ok_or_else(|| bad("a query parameter is not valid percent-encoded UTF-8"))?;
        let form = &mut page.filter;
        match name.as_str() {
            "done" => done = Some(value),
            "done_key" => done_key = Some(value),
            "done_n" => done_n = Some(value),
            "entry" => page.entry = Some(value),
            "confirm" => page.confirm = value == "requeue",
            "state" if value == "any" => form.state = value,
            name => {
                listing.push(raw);
                let slot = match name {
                    "state" => &mut form.state,
                    "correlation_id" => &mut form.correlation_id,
                    "id_prefix" => &mut form.id_prefix,
                    "route" => &mut form.route,
                    "error" => &mut form.error,
                    "object" => &mut form.object,
                    _ => continue,
                };
                *slot = value;
            }
        }
    }
    page.listing = listing.join("&");
    if let Some(done) = done {
        page.flash = Some(Flash::parse(&done, done_key.as_deref(), done_n.as_deref())?);
    }
    Ok(page)
}

fn bad(detail: &str) -> Refusal {
    Refusal::BadParameter(detail.to_owned())
}

/// 400 unless `query` has no parameter (the endpoints that take none).
pub(super) fn none(query: &str) -> Result<(), Refusal> {
    match pairs(query)?.first() {
        Some((name, _)) => Err(Refusal::BadParameter(format!("unknown parameter `{name}`"))),
        None => Ok(()),
    }
}

/// The filter, the cursor (as the store gave it) and the limit of `query`, the limit's
/// `(default, most)` being `sizes`.
pub(super) fn listing(
    query: &str,
    (default, most): (usize, usize),
) -> Result<(Filter, Option<String>, usize), Refusal> {
    let mut filter = Filter::default();
    let (mut cursor, mut limit) = (None, default);
    for (name, value) in pairs(query)? {
        match name.as_str() {
            "state" => filter.state = Some(state(&value)?),
            "id_prefix" => filter.id_prefix = Some(value),
            "route" => filter.route = Some(value),
            "object" => filter.object = Some(object(&value)?),
            "correlation_id" => filter.correlation_id = Some(value),
            "error" => filter.error_contains = Some(value),
            "cursor" => cursor = Some(open_cursor(&value)?),
            "limit" => {
                limit = value
                    .parse()
                    .ok()
                    .filter(|n| (1..=most).contains(n))
                    .ok_or_else(|| {
                        Refusal::BadParameter(format!("`limit` is a number from 1 to {most}"))
                    })?;
            }
            _ => return Err(Refusal::BadParameter(format!("unknown parameter `{name}`"))),
        }
    }
    Ok((filter, cursor, limit))
}

fn state(value: &str) -> Result<KeyState, Refusal> {
    Ok(match value {
        "queued" => KeyState::Queued,
        "running" => KeyState::Running,
        "dead" => KeyState::Dead,
        "done" => KeyState::Done,
        _ => return Err(bad("`state` is one of queued, running, dead, done")),
    })
}

fn object(value: &str) -> Result<ObjectKey, Refusal> {
    ObjectKey::parse(value)
        .ok_or_else(|| bad("`object` is a printed object key: `to:` and 16 base64url digits"))
}

/// The state's name in the answers and the query.
pub(super) fn state_name(state: KeyState) -> &'static str {
    match state {
        KeyState::Queued => "queued",
        KeyState::Running => "running",
        KeyState::Dead => "dead",
        KeyState::Done => "done",
    }
}

/// The cursor handed out for the store's `cursor`: it, a dot and a check of it, so that a
/// cursor cut or made up is a 400 rather than whatever the store makes of it.
pub(super) fn seal_cursor(cursor: &str) -> String {
    format!("{cursor}.{:08x}", check(cursor))
}

/// The store's cursor in a sealed one: 400 if it is not one the service handed out.
pub(super) fn open_cursor(sealed: &str) -> Result<String, Refusal> {
    let invalid = || bad("`cursor` is not a `next` this service gave");
    let (cursor, digits) = sealed.rsplit_once('.').ok_or_else(invalid)?;
    let valid =
        u32::from_str_radix(digits, 16).is_ok_and(|c| digits.len() == 8 && c == check(cursor));
    valid.then(|| cursor.to_owned()).ok_or_else(invalid)
}

fn check(cursor: &str) -> u32 {
    // A check against mistakes (a cursor cut, or of another listing's making), not a secret.
    xxhash_rust::xxh3::xxh3_64(cursor.as_bytes()) as u32
}

/// `filter` for a log line: the conditions set (never a body).
pub(super) fn describe(filter: &Filter) -> String {
    let mut out = String::new();
    let mut add = |name: &str, value: Option<&str>| {
        if let Some(value) = value {
            let _ = write!(
                out,
                "{}{name}={value:?}",
                if out.is_empty() { "" } else { " " }
            );
        }
    };
    add("state", filter.state.map(state_name));
    add("id_prefix", filter.id_prefix.as_deref());
    add("route", filter.route.as_deref());
    add("object", filter.object.as_ref().map(ObjectKey::as_str));
    add("correlation_id", filter.correlation_id.as_deref());
    add("error", filter.error_contains.as_deref());
    if out.is_empty() {
        out.push_str("all");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_reads_every_filter_and_refuses_what_it_does_not_know() {
        let object = ObjectKey::new("email", None, "msg-1");
        let query = format!(
            "state=dead&id_prefix=evt%5F&route=inbox-email&object={}&correlation_id=a+b&error=time&limit=7&cursor=",
            object.as_str()
        );
        let (filter, cursor, limit) = listing(&query, LIST).unwrap();
        let wanted = Filter {
            state: Some(KeyState::Dead),
            id_prefix: Some("evt_".into()),
            route: Some("inbox-email".into()),
            object: Some(object),
            correlation_id: Some("a b".into()),
            error_contains: Some("time".into()),
            with_bodies: false,
        };
        assert_eq!((filter, cursor, limit), (wanted, None, 7));
        assert_eq!(listing("", REQUEUE).unwrap().2, 500);
        for wrong in [
            "state=gone",
            "limit=0",
            "limit=501",
            "limit=x",
            "object=evt_1",
            "stat=dead",
            "route=a&route=b",
            "cursor=abc",
            "error=%E9",
        ] {
            assert!(
                matches!(listing(wrong, LIST), Err(Refusal::BadParameter(_))),
                "{wrong}"
            );
        }
        assert!(none("").is_ok() && none("x=1").is_err());
    }

    #[test]
    fn a_cursor_goes_back_to_the_store_as_it_gave_it_and_only_so() {
        let sealed = seal_cursor("ti:abc.def");
        assert_eq!(open_cursor(&sealed).unwrap(), "ti:abc.def");
        let cut = &sealed[..sealed.len() - 1];
        assert!(open_cursor(cut).is_err());
        assert!(open_cursor("ti:abc.def").is_err());
    }

    #[test]
    fn a_filter_is_described_for_the_log() {
        assert_eq!(describe(&Filter::default()), "all");
        let filter = Filter {
            state: Some(KeyState::Dead),
            error_contains: Some("x".into()),
            ..Filter::default()
        };
        assert_eq!(describe(&filter), "state=\"dead\" error=\"x\"");
    }
}
