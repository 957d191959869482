//! The admin page: server-rendered HTML, no external resource, complete without JavaScript.
//!
//! `GET /` is the index (this process's figures per route, the inbox's counts, the entries
//! with the filter, paging); `GET /?entry={key}` an entry's page; `GET /?confirm=requeue&…`
//! the confirmation of a bulk re-queue. Every page lives at the service's root, its links
//! being query strings only, so that they resolve wherever it is mounted, with or without a
//! trailing slash. Its forms `POST /` with a `do` field and an anti-forgery `csrf` field.

use std::fmt::Write;
use std::time::{Duration, SystemTime};

use super::html::{self, esc};
use super::params::state_name;
use crate::inbox::{AttemptOutcome, EntryInfo, InboxCounts, KeyState, Page};
use crate::stats::{Count, Latency, MINUTES, REASONS, Window};

/// The page's style: small, system fonts, numbers in fixed-width cells.
const STYLE: &str = "body{font:15px/1.45 system-ui,sans-serif;margin:1rem auto;max-width:76rem;\
padding:0 1rem;color:#1a1a1a;background:#fff}h1{font-size:1.3rem}h2{font-size:1.1rem;margin-top:1.6rem}\
table{border-collapse:collapse;width:100%}th,td{padding:.2rem .45rem;border-bottom:1px solid #ddd;\
text-align:left;vertical-align:top}.n{text-align:right;font-variant-numeric:tabular-nums;\
white-space:nowrap;min-width:6ch}dl{display:grid;grid-template-columns:max-content 10ch;gap:.1rem 1rem}\
dd{margin:0;font-variant-numeric:tabular-nums;text-align:right}#entry{grid-template-columns:max-content auto}\
#entry dd{text-align:left}form{margin:.4rem 0}fieldset{border:1px solid #ccc}label{margin-right:.7rem}\
input,select,button{font:inherit}button{padding:.15rem .7rem}#flash{background:#eef6ee;\
border:1px solid #7a7;padding:.4rem .7rem}.dead,.failed{color:#a00}.note{color:#555;font-size:.9rem}\
svg{display:block}pre{white-space:pre-wrap;background:#f6f6f6;padding:.5rem}";

/// Swaps the live figures (`data-live`) for fresh ones every 5 s while the page is visible;
/// nothing else (a half-filled form stays as it is). Without JavaScript, the Refresh link.
const SCRIPT: &str = "setInterval(async()=>{if(document.hidden)return;try{const r=await fetch(\
location.href,{credentials:'same-origin'});if(!r.ok)return;const d=new DOMParser().parseFromString(\
await r.text(),'text/html'),o=document.querySelectorAll('[data-live]'),n=d.querySelectorAll(\
'[data-live]');if(o.length==n.length)o.forEach((e,i)=>e.replaceWith(n[i]))}catch(e){}},5000)";

/// The filter as the form shows it, and as links carry it.
#[derive(Debug, Default)]
pub(super) struct FilterForm {
    pub(super) state: String,
    pub(super) correlation_id: String,
    pub(super) id_prefix: String,
    pub(super) route: String,
    pub(super) error: String,
    pub(super) object: String,
}

impl FilterForm {
    /// The filter's fields, each by its name in the query string and the form.
    fn fields(&self) -> [(&'static str, &str); 6] {
        [
            ("state", self.state.as_str()),
            ("correlation_id", &self.correlation_id),
            ("id_prefix", &self.id_prefix),
            ("route", &self.route),
            ("error", &self.error),
            ("object", &self.object),
        ]
    }

    /// The filter as a query string.
    pub(super) fn query(&self) -> String {
        html::query(self.fields())
    }
}

/// What the index shows.
pub(super) struct Index<'a> {
    pub(super) routes: &'a [(String, Window)],
    pub(super) minute: u64,
    pub(super) counts: &'a InboxCounts,
    pub(super) paused: bool,
    /// Queued entries that failed before (read from one page of the queue), and whether
    /// there are more than that page.
    pub(super) retries: (u64, bool),
    pub(super) filter: &'a FilterForm,
    pub(super) page: &'a Page,
    pub(super) next: Option<String>,
    pub(super) actions: bool,
    pub(super) csrf: &'a str,
    pub(super) flash: Option<&'a str>,
    pub(super) now: SystemTime,
}

/// The page's head and opening, with its title.
fn open(out: &mut String, title: &str, flash: Option<&str>) {
    let _ = write!(
        out,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\"><title>{}</title>\
<style>{STYLE}</style></head><body><main><h1>{}</h1>",
        esc(title),
        esc(title)
    );
    if let Some(flash) = flash {
        let _ = write!(out, "<p id=\"flash\" role=\"status\">{}</p>", esc(flash));
    }
}

fn close(out: &mut String, script: bool) {
    out.push_str("</main>");
    if script {
        let _ = write!(out, "<script>{SCRIPT}</script>");
    }
    out.push_str("</body></html>");
}

/// The index.
pub(super) fn index(index: &Index<'_>) -> String {
    let mut out = String::with_capacity(16 * 1024);
    open(&mut out, "Inbox", index.flash);
    let here = index.filter.query();
    let _ = write!(
        out,
        "<p><a href=\"?{}\" id=\"refresh\">Refresh</a> <span class=\"note\">(the figures \
refresh by themselves every 5 s while JavaScript is on)</span></p>",
        esc(&here)
    );
    routes(&mut out, index.routes, index.minute);
    inbox(&mut out, index);
    entries(&mut out, index);
    close(&mut out, true);
    out
}

/// Per route, from this process.
fn routes(out: &mut String, routes: &[(String, Window)], minute: u64) {
    out.push_str(
        "<h2>Routes in this process, last 15 minutes</h2><p class=\"note\">These figures are this \
process's alone; across processes, the Prometheus metrics (<code>idempotency_requests_total</code>, \
<code>idempotency_inner_duration_seconds</code>, <code>idempotency_inbox_*</code>) and the dashboard \
in <code>ops/</code> aggregate them.</p><table id=\"routes\"><thead><tr><th scope=\"col\">route</th>",
    );
    for head in [
        "received",
        "first",
        "duplicates",
        "rejected",
        "stale",
        "queued",
        "handler p50",
        "handler p95",
        "worker p50",
        "worker p95",
    ] {
        let _ = write!(out, "<th scope=\"col\" class=\"n\">{head}</th>");
    }
    out.push_str(
        "<th scope=\"col\">rejected by reason</th><th scope=\"col\">per minute</th></tr></thead>\
<tbody data-live>",
    );
    if routes.is_empty() {
        out.push_str("<tr><td colspan=\"13\">No request or attempt yet in this process.</td></tr>");
    }
    for (namespace, window) in routes {
        route_row(out, namespace, window, minute);
    }
    out.push_str("</tbody></table>");
}

fn route_row(out: &mut String, namespace: &str, window: &Window, minute: u64) {
    let total = window.total();
    let _ = write!(
        out,
        "<tr data-route=\"{0}\"><th scope=\"row\">{0}</th>",
        esc(namespace)
    );
    let counts = [
        ("received", total.count(Count::Received)),
        ("first", total.count(Count::First)),
        ("duplicates", total.count(Count::Duplicate)),
        ("rejected", total.rejected()),
        ("stale", total.count(Count::Stale)),
        ("queued", total.count(Count::Queued)),
    ];
    for (stat, n) in counts {
        let _ = write!(out, "<td class=\"n\" data-stat=\"{stat}\">{n}</td>");
    }
    for (name, latency) in [("handler", Latency::Handler), ("worker", Latency::Worker)] {
        let hist = total.latency(latency);
        for (q, at) in [("p50", 0.5), ("p95", 0.95)] {
            let shown = hist
                .quantile(at)
                .map_or_else(|| "–".to_owned(), html::duration);
            let _ = write!(
                out,
                "<td class=\"n\" data-stat=\"{name}_{q}\">{}</td>",
                esc(&shown)
            );
        }
    }
    out.push_str("<td>");
    let reasons = REASONS.iter().zip(total.rejected);
    let mut any = false;
    for (reason, n) in reasons.filter(|(_, n)| *n > 0) {
        let _ = write!(out, "{}{reason}&nbsp;{n}", if any { ", " } else { "" });
        any = true;
    }
    out.push_str("</td><td>");
    chart(out, window, minute);
    out.push_str("</td></tr>");
}

/// Bars of the requests per minute (accepted, duplicates, rejected stacked) and a line of the
/// handler's (solid) and the worker's (dashed) p95 per minute.
fn chart(out: &mut String, window: &Window, minute: u64) {
    let (w, h) = (8.0, 24.0);
    let most = (window.minutes.iter())
        .map(|m| m.count(Count::Received))
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let received: Vec<String> = (window.minutes.iter())
        .map(|m| m.count(Count::Received).to_string())
        .collect();
    let _ = write!(
        out,
        "<svg width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" role=\"img\" aria-label=\"requests \
per minute, the last {MINUTES} minutes up to {2}: {3}\">",
        w as usize * MINUTES,
        h as usize * 2 + 2,
        minute_label(minute),
        received.join(" ")
    );
    for (i, m) in window.minutes.iter().enumerate() {
        let x = i as f64 * w;
        let mut y = h;
        let parts = [
            (
                (m.count(Count::Received)).saturating_sub(m.count(Count::Duplicate) + m.rejected()),
                "#2b6cb0",
            ),
            (m.count(Count::Duplicate), "#9aa5b1"),
            (m.rejected(), "#c53030"),
        ];
        for (n, color) in parts.into_iter().filter(|(n, _)| *n > 0) {
            let height = (n as f64 / most * h).max(1.0);
            y -= height;
            let _ = write!(
                out,
                "<rect x=\"{x}\" y=\"{y:.1}\" width=\"{}\" height=\"{height:.1}\" fill=\"{color}\"/>",
                w - 1.0
            );
        }
    }
    let p95 = |latency| -> Vec<Option<f64>> {
        (window.minutes.iter())
            .map(|m| m.latency(latency).quantile(0.95).map(|d| d.as_secs_f64()))
            .collect()
    };
    let (handler, worker) = (p95(Latency::Handler), p95(Latency::Worker));
    let slowest = handler
        .iter()
        .chain(&worker)
        .flatten()
        .fold(0.0, |a: f64, &b| a.max(b));
    for (line, dash) in [(handler, ""), (worker, " stroke-dasharray=\"2\"")] {
        let points: Vec<String> = (line.iter().enumerate())
            .filter_map(|(i, p)| p.map(|p| (i, p)))
            .map(|(i, p)| {
                let y = 2.0 * h + 1.0 - p / slowest.max(f64::MIN_POSITIVE) * (h - 2.0);
                format!("{:.1},{y:.1}", i as f64 * w + w / 2.0)
            })
            .collect();
        if !points.is_empty() {
            let _ = write!(
                out,
                "<polyline points=\"{}\" fill=\"none\" stroke=\"#444\"{dash}/>",
                points.join(" ")
            );
        }
    }
    out.push_str("</svg>");
}

fn minute_label(minute: u64) -> String {
    let at = SystemTime::UNIX_EPOCH + Duration::from_secs(minute * 60);
    let full = html::time(at);
    full[11..16].to_owned()
}

/// Per inbox, from the store.
fn inbox(out: &mut String, index: &Index<'_>) {
    let counts = index.counts;
    let oldest = counts
        .oldest_age
        .map_or_else(|| "–".to_owned(), html::duration);
    let (retries, more) = index.retries;
    let _ = write!(
        out,
        "<section id=\"inbox\" data-live><h2>Inbox (from the store: the same in every process)</h2>\
<dl><dt>pending</dt><dd data-count=\"pending\">{}</dd><dt>in flight</dt><dd data-count=\"in_flight\">{}</dd>\
<dt>oldest age</dt><dd data-count=\"oldest_age\">{}</dd><dt>dead letters</dt><dd data-count=\"dead\">{}</dd>\
<dt>waiting to retry</dt><dd data-count=\"retries\">{retries}{}</dd></dl>",
        counts.pending,
        counts.in_flight,
        esc(&oldest),
        counts.dead,
        if more { "+" } else { "" },
    );
    let (paused, word) = match index.paused {
        true => ("true", "paused: workers take nothing"),
        false => ("false", "running: workers take entries"),
    };
    let _ = write!(
        out,
        "<p>Taking: <strong id=\"paused-state\" data-paused=\"{paused}\">{word}</strong></p>"
    );
    if index.actions {
        let (id, action, label) = match index.paused {
            true => ("resume", "resume", "Resume taking"),
            false => ("pause", "pause", "Pause taking"),
        };
        let _ = write!(
            out,
            "<form id=\"{id}-form\" method=\"post\" action=\"?\">{}<button id=\"{id}\" \
type=\"submit\">{label}</button></form>",
            hidden(action, index.csrf, &index.filter.query())
        );
    }
    out.push_str("</section>");
}

/// The hidden fields of an action's form: what to do, the token, the page to come back to.
fn hidden(action: &str, csrf: &str, back: &str) -> String {
    format!(
        "<input type=\"hidden\" name=\"do\" value=\"{}\"><input type=\"hidden\" name=\"csrf\" \
value=\"{}\"><input type=\"hidden\" name=\"back\" value=\"{}\">",
        esc(action),
        esc(csrf),
        esc(back)
    )
}

/// The filter, the entries, the next page.
fn entries(out: &mut String, index: &Index<'_>) {
    let filter = index.filter;
    out.push_str(
        "<h2>Entries</h2><form id=\"filter\" method=\"get\" action=\"?\"><fieldset>\
<legend>Filter</legend><label for=\"f-state\">state</label><select id=\"f-state\" name=\"state\">",
    );
    for state in ["any", "queued", "running", "dead", "done"] {
        let chosen = filter.state == state || (filter.state.is_empty() && state == "any");
        let selected = if chosen { " selected" } else { "" };
        let _ = write!(out, "<option value=\"{state}\"{selected}>{state}</option>");
    }
    out.push_str("</select> ");
    for (name, label, value) in [
        ("correlation_id", "correlation id", &filter.correlation_id),
        ("id_prefix", "delivery id starts with", &filter.id_prefix),
        ("route", "route", &filter.route),
        ("error", "last error contains", &filter.error),
    ] {
        let _ = write!(
            out,
            "<label for=\"f-{name}\">{label}</label> <input id=\"f-{name}\" name=\"{name}\" \
value=\"{}\" size=\"14\"> ",
            esc(value)
        );
    }
    if !filter.object.is_empty() {
        let _ = write!(
            out,
            "<input type=\"hidden\" name=\"object\" value=\"{}\">",
            esc(&filter.object)
        );
    }
    out.push_str("<button id=\"apply-filter\" type=\"submit\">Apply</button></fieldset></form>");
    let redrive = index.actions && matches!(filter.state.as_str(), "" | "any" | "dead");
    if redrive {
        let mut fields = String::new();
        for (name, value) in filter.fields() {
            if !value.is_empty() && value != "any" {
                let _ = write!(
                    fields,
                    "<input type=\"hidden\" name=\"{name}\" value=\"{}\">",
                    esc(value)
                );
            }
        }
        let _ = write!(
            out,
            "<form id=\"redrive-matching\" method=\"get\" action=\"?\"><input type=\"hidden\" \
name=\"confirm\" value=\"requeue\">{fields}<button type=\"submit\">Redrive all matching dead \
letters…</button></form>"
        );
    }
    entry_table(out, &index.page.entries, index.now);
    if let Some(next) = &index.next {
        let _ = write!(
            out,
            "<p><a id=\"next-page\" href=\"?{}\">Next page</a></p>",
            esc(next)
        );
    }
}

fn entry_table(out: &mut String, entries: &[EntryInfo], now: SystemTime) {
    out.push_str(
        "<table id=\"entries\"><thead><tr><th scope=\"col\">key</th><th scope=\"col\">delivery id</th>\
<th scope=\"col\">route</th><th scope=\"col\">state</th><th scope=\"col\" class=\"n\">attempts</th>\
<th scope=\"col\">enqueued</th><th scope=\"col\">last error</th></tr></thead><tbody>",
    );
    if entries.is_empty() {
        out.push_str("<tr><td colspan=\"7\">No entry matches on this page.</td></tr>");
    }
    for info in entries {
        let entry = &info.entry;
        let (state, shown) = state(info, now);
        let error = info.last_error.as_deref().unwrap_or_default();
        let cut: String = error.chars().take(80).collect();
        let _ = write!(
            out,
            "<tr data-key=\"{key}\" data-state=\"{state}\"><td><a class=\"entry-link\" \
href=\"?entry={}\">{key}</a></td><td>{}</td><td>{}</td><td class=\"{state}\">{}</td>\
<td class=\"n\">{}</td><td>{}</td><td>{}{}</td></tr>",
            html::query_value(entry.key.as_str()),
            esc(&entry.id),
            esc(&entry.route),
            esc(&shown),
            entry.attempts,
            html::time(entry.enqueued_at),
            esc(&cut),
            if cut.len() < error.len() { "…" } else { "" },
            key = esc(entry.key.as_str()),
        );
    }
    out.push_str("</tbody></table>");
}

/// The entry's state as the inbox names it (`data-state`), and as a person reads it.
pub(super) fn state(info: &EntryInfo, now: SystemTime) -> (&'static str, String) {
    let failed = (info.history.iter()).any(|a| matches!(a.outcome, AttemptOutcome::Failed(_)));
    match (info.state, info.until) {
        (KeyState::Queued, Some(due)) if failed && due > now => {
            ("retrying", format!("retrying at {}", html::time(due)))
        }
        (state, _) => (state_name(state), state_name(state).to_owned()),
    }
}

/// An entry's page.
pub(super) fn entry(
    info: &EntryInfo,
    bodies: bool,
    actions: bool,
    csrf: &str,
    flash: Option<&str>,
    now: SystemTime,
) -> String {
    let mut out = String::with_capacity(8 * 1024);
    let entry = &info.entry;
    open(&mut out, &format!("Inbox entry {}", entry.key), flash);
    out.push_str("<p><a href=\"?\">Back to the inbox</a></p><dl id=\"entry\">");
    let (_, shown) = state(info, now);
    let until = info.until.map(html::time).unwrap_or_else(|| "–".to_owned());
    let until_label = match info.state {
        KeyState::Queued => "due",
        KeyState::Running => "lease ends",
        KeyState::Done => "key kept until",
        KeyState::Dead => "until",
    };
    let attempts = entry.attempts.to_string();
    let mut fields = vec![
        ("state", "state", shown.as_str()),
        ("id", "delivery id", entry.id.as_str()),
        ("route", "route", entry.route.as_str()),
        (
            "correlation_id",
            "correlation id",
            entry.correlation_id.as_str(),
        ),
        ("attempts", "attempts", attempts.as_str()),
        ("until", until_label, until.as_str()),
    ];
    if let Some(error) = &info.last_error {
        fields.push(("last_error", "last error", error.as_str()));
    }
    for (field, label, value) in fields {
        let _ = write!(
            out,
            "<dt>{label}</dt><dd data-field=\"{field}\">{}</dd>",
            esc(value)
        );
    }
    let _ = write!(
        out,
        "<dt>enqueued</dt><dd>{}</dd></dl>",
        html::time(entry.enqueued_at)
    );
    attempts_table(&mut out, info);
    if actions && info.state == KeyState::Dead {
        let back = format!("entry={}", html::query_value(entry.key.as_str()));
        for (id, label) in [("requeue", "Redrive (re-queue)"), ("discard", "Discard")] {
            let _ = write!(
                out,
                "<form id=\"{id}-form\" method=\"post\" action=\"?\">{}<input type=\"hidden\" \
name=\"key\" value=\"{}\"><button id=\"{id}\" type=\"submit\">{label}</button></form>",
                hidden(id, csrf, &back),
                esc(entry.key.as_str())
            );
        }
    }
    if bodies {
        let body = String::from_utf8_lossy(&entry.body);
        let _ = write!(
            out,
            "<h2>Body ({} bytes)</h2><pre id=\"body\">{}</pre>",
            entry.body.len(),
            esc(&body)
        );
    }
    close(&mut out, false);
    out
}

fn attempts_table(out: &mut String, info: &EntryInfo) {
    out.push_str(
        "<h2>Attempts</h2><table id=\"attempts\"><thead><tr><th scope=\"col\" class=\"n\">#</th>\
<th scope=\"col\">started</th><th scope=\"col\" class=\"n\">took</th><th scope=\"col\">outcome</th>\
<th scope=\"col\">worker</th><th scope=\"col\">error</th></tr></thead><tbody>",
    );
    if info.history.is_empty() {
        out.push_str("<tr><td colspan=\"6\">Not attempted yet.</td></tr>");
    }
    for attempt in &info.history {
        let (outcome, error) = match &attempt.outcome {
            AttemptOutcome::Running => ("running", ""),
            AttemptOutcome::Succeeded => ("succeeded", ""),
            AttemptOutcome::Failed(error) => ("failed", error.as_str()),
            AttemptOutcome::LeaseLost => ("lease_lost", ""),
        };
        let took = attempt
            .duration
            .map_or_else(|| "–".to_owned(), html::duration);
        let _ = write!(
            out,
            "<tr data-outcome=\"{outcome}\"><td class=\"n\">{}</td><td>{}</td><td class=\"n\">{}</td>\
<td class=\"{outcome}\">{}</td><td>{}</td><td>{}</td></tr>",
            attempt.number,
            html::time(attempt.started_at),
            esc(&took),
            outcome.replace('_', " "),
            esc(&attempt.worker),
            esc(error)
        );
    }
    out.push_str("</tbody></table>");
}

/// The confirmation of a bulk re-queue: how many dead letters match.
pub(super) fn confirm(
    filter: &FilterForm,
    count: u64,
    more: bool,
    csrf: &str,
    actions: bool,
) -> String {
    let mut out = String::with_capacity(4 * 1024);
    open(&mut out, "Redrive dead letters", None);
    let query = filter.query();
    let _ = write!(
        out,
        "<p>Dead letters matching this filter: <strong id=\"redrive-count\">{count}</strong>{}.</p>",
        if more {
            " (at least; more were not counted)"
        } else {
            ""
        }
    );
    if actions && count > 0 {
        let _ = write!(
            out,
            "<form id=\"redrive-form\" method=\"post\" action=\"?{}\">{}<button id=\"confirm-redrive\" \
type=\"submit\">Re-queue {count} dead letter{}</button></form>",
            esc(&query),
            hidden("requeue_matching", csrf, &query),
            if count == 1 { "" } else { "s" }
        );
    }
    let _ = write!(out, "<p><a href=\"?{}\">Cancel</a></p>", esc(&query));
    close(&mut out, false);
    out
}
