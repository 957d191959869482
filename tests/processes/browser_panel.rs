//! The inbox's admin panel in a real browser (issue 57): headless Chromium through WebDriver
//! (`tests/support/browser.rs`) on the demo (`webhook_receiver`, memory store). A person's
//! path through the page: counts that move, a dead letter found by its correlation id and
//! re-queued from its page, workers paused and resumed, the matching dead letters re-driven in
//! bulk, and the same page without JavaScript.
//!
//! The `harness_*` tests prove the browser harness itself on a page of their own and on the
//! demo's JSON. On failure, `<target>/browser/<test>-failure.png` and `.html` hold what the
//! browser showed. `PANEL_SCREENSHOT=1` also writes the README's `docs/images/panel.png`.
#![cfg(all(feature = "metrics", feature = "verify", feature = "admin"))]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Form, State};
use axum::http::HeaderMap;
use axum::response::{Html, IntoResponse, Redirect};
use axum::routing::get;
use http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::browser;
use crate::harness;

use browser::{Browser, Options, artifacts_dir};
use harness::{Example, Http, email, start_demo};

// The harness on a page of its own: a form, a cookie, a script.

#[derive(Default)]
struct Notes(Mutex<Vec<(String, String)>>);

#[derive(Deserialize)]
struct Note {
    text: String,
    kind: String,
}

/// A page with what the panel has: a form with a text input, a select and a submit button
/// (POST, then a redirect with a flash), a list, a link, the cookie the server received, and a
/// script that marks that it ran.
async fn fixture_page(State(notes): State<Arc<Notes>>, headers: HeaderMap) -> Html<String> {
    let cookie = headers
        .get("cookie")
        .and_then(|value| value.to_str().ok())
        .unwrap_or("");
    let items: String = notes
        .0
        .lock()
        .unwrap()
        .iter()
        .map(|(text, kind)| format!("<li data-kind=\"{kind}\">{text}</li>"))
        .collect();
    Html(format!(
        "<!doctype html><html><head><title>fixture</title></head><body>\
         <h1 id=\"title\">Harness fixture</h1>\
         <p id=\"cookie\">{cookie}</p>\
         <p id=\"script-ran\">no</p>\
         <script>document.getElementById('script-ran').textContent = 'yes';</script>\
         <form id=\"note\" method=\"post\" action=\"/notes\">\
         <input name=\"text\" value=\"placeholder\">\
         <select name=\"kind\"><option value=\"plain\">plain</option>\
         <option value=\"urgent\">urgent</option></select>\
         <button id=\"save\" type=\"submit\">Save</button></form>\
         <ul id=\"notes\">{items}</ul>\
         <a id=\"back\" class=\"nav\" href=\"/\">back</a></body></html>"
    ))
}

async fn fixture_save(State(notes): State<Arc<Notes>>, Form(note): Form<Note>) -> Redirect {
    notes.0.lock().unwrap().push((note.text, note.kind));
    Redirect::to("/")
}

/// The fixture page served on a free loopback port: its `http://ADDR`.
async fn start_fixture() -> String {
    let app = axum::Router::new()
        .route("/", get(fixture_page))
        .route("/notes", axum::routing::post(fixture_save))
        .route(
            "/missing",
            get(|| async { StatusCode::NOT_FOUND.into_response() }),
        )
        .with_state(Arc::new(Notes::default()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

/// Go to, find, text, attribute, cookie (sent to the server), fill, select, click, wait,
/// source and screenshot on a real page.
#[tokio::test]
async fn harness_drives_a_form_with_a_cookie() {
    let base = start_fixture().await;
    let browser = Browser::start("harness_drives_a_form_with_a_cookie").await;
    browser.goto(&format!("{base}/")).await;
    assert_eq!(browser.text("#title").await, "Harness fixture");
    assert_eq!(browser.text("#script-ran").await, "yes");
    assert_eq!(
        browser.attr("a#back", "class").await.as_deref(),
        Some("nav")
    );
    browser.set_cookie("admin_token", "t0ken").await;
    assert_eq!(
        browser.cookie("admin_token").await.as_deref(),
        Some("t0ken")
    );
    browser.goto(&format!("{base}/")).await;
    assert_eq!(browser.text("#cookie").await, "admin_token=t0ken");

    browser
        .fill("form#note input[name=text]", "first note")
        .await;
    browser
        .select("form#note select[name=kind]", "urgent")
        .await;
    browser.click("#save").await;
    let note = browser.wait_for("#notes li").await;
    assert_eq!(note.text().await.unwrap(), "first note");
    assert_eq!(
        browser.attr("#notes li", "data-kind").await.as_deref(),
        Some("urgent")
    );
    browser.fill("form#note input[name=text]", "second").await;
    browser.submit("form#note").await;
    browser
        .until("two notes", || async {
            (browser.count("#notes li").await == 2).then_some(())
        })
        .await;
    assert!(browser.source().await.contains("second"));

    let png = artifacts_dir().join("harness_fixture.png");
    browser.screenshot(&png).await;
    let bytes = std::fs::read(&png).unwrap();
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG");
    // IHDR: the width and the height of the window.
    let width = u32::from_be_bytes(bytes[16..20].try_into().unwrap());
    assert_eq!(width, 1280);
    browser.close().await;
}

/// With scripts disabled the page's script does not run, and the harness still reads and
/// submits it.
#[tokio::test]
async fn harness_works_without_javascript() {
    let base = start_fixture().await;
    let options = Options {
        javascript: false,
        ..Options::default()
    };
    let browser = Browser::start_with("harness_works_without_javascript", options).await;
    browser.goto(&format!("{base}/")).await;
    assert_eq!(browser.text("#script-ran").await, "no");
    browser
        .fill("form#note input[name=text]", "no script")
        .await;
    browser.select("form#note select[name=kind]", "plain").await;
    browser.submit("form#note").await;
    assert_eq!(browser.text("#notes li").await, "no script");
    browser.close().await;
}

/// A test that panics leaves the page's screenshot and HTML under `<target>/browser/`.
#[test]
fn harness_saves_artifacts_on_failure() {
    let name = "harness_failure_probe";
    let dir = artifacts_dir();
    let (png, html) = (
        dir.join(format!("{name}-failure.png")),
        dir.join(format!("{name}-failure.html")),
    );
    let _ = std::fs::remove_file(&png);
    let _ = std::fs::remove_file(&html);
    let failed = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let base = start_fixture().await;
            let browser = Browser::start(name).await;
            browser.goto(&format!("{base}/")).await;
            // A failing wait, as a real test would fail.
            browser
                .until_within(Duration::from_millis(300), "a missing element", || {
                    browser.try_find("#never-there")
                })
                .await;
        });
    })
    .join();
    assert!(failed.is_err(), "the probe was meant to fail");
    let bytes = std::fs::read(&png).unwrap();
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG");
    let source = std::fs::read_to_string(&html).unwrap();
    assert!(source.contains("Harness fixture"), "{source}");
}

/// The browser reads what the demo serves: its admin service's counts, as JSON, moving
/// with a delivery.
#[tokio::test]
async fn harness_reads_the_demo_counts() {
    let demo = start_demo(&[("INBOX_WORKERS", "0")]);
    let http = Http::new(&demo);
    let browser = Browser::start("harness_reads_the_demo_counts").await;
    let url = format!("{}/admin/inbox/counts", demo.base);
    browser.goto(&url).await;
    let counts: Value = serde_json::from_str(&browser.text("body").await).unwrap();
    assert_eq!(counts["pending"], 0, "{counts}");
    let (status, _, _) = http
        .send(
            "POST",
            "/inbox/email",
            &[],
            &email("evt_browser_json", json!({})),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    browser
        .reload_until(&url, "body", |text| {
            serde_json::from_str::<Value>(text).is_ok_and(|counts| counts["pending"] == 1)
        })
        .await;
    browser.close().await;
}

// The panel (served by `AdminService` at `/admin/inbox/`), as a person uses it.

/// A token nobody else guesses, for `ADMIN_TOKEN` and the `admin_token` cookie.
fn random_token() -> String {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).unwrap();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The demo with an admin token, the browser holding it as the `admin_token` cookie, on the
/// panel's index.
struct Panel {
    browser: Browser,
    http: Http,
    /// The panel's index, `http://ADDR/admin/inbox/`.
    index: String,
    _demo: Example,
}

const PENDING: &str = "#inbox dd[data-count=\"pending\"]";
const DEAD: &str = "#inbox dd[data-count=\"dead\"]";
const RECEIVED: &str = "table#routes tr[data-route=\"inbox-email\"] td[data-stat=\"received\"]";
const DEAD_ROW: &str = "table#entries tr[data-state=\"dead\"]";

impl Panel {
    async fn open(name: &str, envs: &[(&str, &str)], options: Options) -> Panel {
        let token = random_token();
        let mut envs = envs.to_vec();
        envs.push(("ADMIN_TOKEN", &token));
        let demo = start_demo(&envs);
        let http = Http::new(&demo);
        let browser = Browser::start_with(name, options).await;
        // A cookie is set for the page's site: go there first, to a page that answers (on an
        // empty 404 Chromium shows an error page of its own, not of the site).
        browser
            .goto(&format!("{}/admin/inbox/counts", demo.base))
            .await;
        browser.set_cookie("admin_token", &token).await;
        let index = format!("{}/admin/inbox/", demo.base);
        browser.goto(&index).await;
        Panel {
            browser,
            http,
            index,
            _demo: demo,
        }
    }

    /// Sends an email event to the inbox route: its correlation id.
    async fn deliver(&self, event: &str, extra: Value) -> String {
        let (status, headers, _) = self
            .http
            .send("POST", "/inbox/email", &[], &email(event, extra))
            .await;
        assert_eq!(status, StatusCode::ACCEPTED, "{event}");
        headers["idempotency-correlation-id"]
            .to_str()
            .unwrap()
            .to_owned()
    }

    /// Reloads the index until the number in `css` is `expected`.
    async fn index_shows(&self, css: &str, expected: u64) {
        let want = expected.to_string();
        self.browser
            .reload_until(&self.index, css, |text| text == want)
            .await;
    }

    /// The number in `css` on the page shown (0 when it is not there).
    async fn number(&self, css: &str) -> u64 {
        let text = self.browser.try_text(css).await.unwrap_or_default();
        text.parse().unwrap_or(0)
    }

    /// Polls the demo's `/effects` until `check` holds.
    async fn effects_until(&self, what: &str, check: impl Fn(&Value) -> bool) -> Value {
        self.browser
            .until(what, || async {
                let effects = self.http.effects().await;
                check(&effects).then_some(effects)
            })
            .await
    }

    /// Waits until the entries table shows `rows` rows, `dead` of them dead letters (so that
    /// the filtered page, not the one before it, is read).
    async fn rows_until(&self, what: &str, rows: usize, dead: usize) {
        let browser = &self.browser;
        browser
            .until(what, || async {
                let all = browser.count("table#entries tr[data-state]").await;
                (all == rows && browser.count(DEAD_ROW).await == dead).then_some(())
            })
            .await;
    }

    /// Filters the entries with the form `form#filter`: `field` (an input or a select) set to
    /// `value`.
    async fn filter(&self, field: &str, value: &str) {
        let css = format!("form#filter [name=\"{field}\"]");
        let tag = self.browser.find(&css).await.tag_name().await.unwrap();
        if tag.eq_ignore_ascii_case("select") {
            self.browser.select(&css, value).await;
        } else {
            self.browser.fill(&css, value).await;
        }
        self.browser.click("#apply-filter").await;
    }
}

/// Counts that move with deliveries; a dead letter found by its correlation id, its failed
/// attempts on its page, re-queued from there and then applied. Takes the README's picture.
#[tokio::test]
async fn panel_shows_counts_and_redrives_a_dead_letter() {
    let envs = [("INBOX_MAX_ATTEMPTS", "2"), ("INBOX_RETRY_BASE_MS", "50")];
    let panel = Panel::open(
        "panel_shows_counts_and_redrives_a_dead_letter",
        &envs,
        Options::default(),
    )
    .await;
    let browser = &panel.browser;
    let received = panel.number(RECEIVED).await;
    for n in 0..3 {
        panel.deliver(&format!("evt_panel_ok_{n}"), json!({})).await;
    }
    panel.index_shows(RECEIVED, received + 3).await;
    panel.effects_until("3 applied", |e| e["total"] == 3).await;
    panel.index_shows(PENDING, 0).await;

    // Failing exactly the two attempts it has: a dead letter, applied once re-queued (the
    // demo counts attempts across re-queues).
    let correlation = panel
        .deliver("evt_panel_dead", json!({"demo_fail_attempts": 2}))
        .await;
    panel.index_shows(DEAD, 1).await;
    let picture = artifacts_dir().join("panel.png");
    browser.screenshot(&picture).await;
    if std::env::var_os("PANEL_SCREENSHOT").is_some() {
        let readme = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/images/panel.png");
        browser.screenshot(std::path::Path::new(readme)).await;
    }

    panel.filter("correlation_id", &correlation).await;
    panel.rows_until("only the dead letter", 1, 1).await;
    browser.click(&format!("{DEAD_ROW} a.entry-link")).await;
    let state = "dl#entry dd[data-field=\"state\"]";
    browser.wait_for(state).await;
    assert_eq!(browser.text(state).await, "dead");
    let failed = browser
        .count("table#attempts tr[data-outcome=\"failed\"]")
        .await;
    assert_eq!(failed, 2);
    let entry = browser.url().await;

    browser.click("#requeue").await;
    browser.wait_for("#flash").await;
    browser.reload_until(&entry, state, |s| s == "done").await;
    let succeeded = browser
        .count("table#attempts tr[data-outcome=\"succeeded\"]")
        .await;
    assert_eq!(succeeded, 1);
    let effects = panel.http.effects().await;
    assert_eq!(effects["by_key"]["evt_panel_dead"], 1, "{effects}");
}

/// Paused from the page, the workers take nothing for 2 s; resumed, they apply what waited.
#[tokio::test]
async fn panel_pauses_and_resumes_the_workers() {
    let panel = Panel::open(
        "panel_pauses_and_resumes_the_workers",
        &[],
        Options::default(),
    )
    .await;
    let browser = &panel.browser;
    browser.click("#pause").await;
    // The page the action lands on says so, or the index once reloaded.
    let paused = "#paused-state[data-paused=\"true\"]";
    browser
        .until("the page says paused", || async {
            if let Some(found) = browser.try_find(paused).await {
                return Some(found);
            }
            browser.goto(&panel.index).await;
            browser.try_find(paused).await
        })
        .await;
    for n in 0..3 {
        panel
            .deliver(&format!("evt_panel_paused_{n}"), json!({}))
            .await;
    }
    panel.index_shows(PENDING, 3).await;
    // The one fixed wait: nothing may happen during it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    browser.goto(&panel.index).await;
    assert_eq!(browser.text(PENDING).await, "3");
    assert_eq!(panel.http.effects().await["total"], 0);
    let (_, _, message) = panel
        .http
        .send("GET", "/messages/msg-evt_panel_paused_0", &[], "")
        .await;
    assert_ne!(message["status"], "delivered", "{message}");

    browser.click("#resume").await;
    panel
        .effects_until("the 3 applied after resume", |e| e["total"] == 3)
        .await;
    panel.index_shows(PENDING, 0).await;
    assert!(
        browser
            .try_find("#paused-state[data-paused=\"false\"]")
            .await
            .is_some()
    );
}

/// Three dead letters filtered by state, re-driven with one confirmed bulk action, applied.
#[tokio::test]
async fn panel_redrives_the_matching_dead_letters() {
    let envs = [("INBOX_MAX_ATTEMPTS", "2"), ("INBOX_RETRY_BASE_MS", "50")];
    let panel = Panel::open(
        "panel_redrives_the_matching_dead_letters",
        &envs,
        Options::default(),
    )
    .await;
    let browser = &panel.browser;
    for n in 0..3 {
        let fail = json!({"demo_fail_attempts": 2});
        panel.deliver(&format!("evt_panel_bulk_{n}"), fail).await;
    }
    panel.index_shows(DEAD, 3).await;
    panel.filter("state", "dead").await;
    panel.rows_until("the 3 dead letters", 3, 3).await;
    browser
        .click("form#redrive-matching button, form#redrive-matching input[type=submit]")
        .await;
    browser.wait_for("#redrive-count").await;
    assert_eq!(browser.text("#redrive-count").await, "3");
    browser.click("#confirm-redrive").await;
    panel
        .effects_until("the 3 re-driven applied", |e| e["total"] == 3)
        .await;
    panel.index_shows(DEAD, 0).await;
}

/// Without JavaScript the index still shows the counts and the entries, and the filter form
/// still finds an entry.
#[tokio::test]
async fn panel_without_javascript_shows_counts_and_entries() {
    let envs = [("INBOX_MAX_ATTEMPTS", "1")];
    let options = Options {
        javascript: false,
        ..Options::default()
    };
    let panel = Panel::open(
        "panel_without_javascript_shows_counts_and_entries",
        &envs,
        options,
    )
    .await;
    let browser = &panel.browser;
    for n in 0..2 {
        panel
            .deliver(&format!("evt_panel_nojs_{n}"), json!({}))
            .await;
    }
    let dead = panel
        .deliver("evt_panel_nojs_dead", json!({"demo_fail_attempts": 1}))
        .await;
    panel.effects_until("2 applied", |e| e["total"] == 2).await;
    panel.index_shows(DEAD, 1).await;
    assert_eq!(browser.text(PENDING).await, "0");
    assert_eq!(browser.text(RECEIVED).await, "3");
    assert!(browser.count("table#entries tr[data-state]").await >= 1);
    panel.filter("correlation_id", &dead).await;
    panel.rows_until("only the dead letter", 1, 1).await;
}
