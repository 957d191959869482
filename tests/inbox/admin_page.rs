//! The inbox's admin page (`AdminService` at its root, feature `admin`) over a real
//! `MemoryInbox` behind an axum app: the hooks a browser test relies on, the filter and the
//! paging, an entry's page with its attempts, the forms' anti-forgery rule, read-only mode.
#![cfg(feature = "admin")]

use std::time::Duration;

use axum::Router;
use axum::routing::post;
use http::{HeaderMap, StatusCode};
use tower_idempotency::inbox::{
    AdminService, Failure, InboxAdmin, InboxLayer, InboxStore, MemoryInbox,
};

use crate::admin_fixture::{self, Deliveries};

const ROUTE: &str = "page-email";
const SCOPE: &str = "/inbox/email";
const LEASE: Duration = Duration::from_secs(30);
const SECRET: &[u8] = b"a secret the processes share";

/// The deliveries of the route; bodies with characters the page must escape.
const EMAIL: Deliveries = Deliveries {
    route: ROUTE,
    scope: SCOPE,
    more: ",\"x\":\"<b>&\"",
    why: "upstream <timeout> & \"more\"",
};

/// The admin service under `/admin/inbox`, and the inbox's door at `/inbox/email`.
fn app(inbox: &MemoryInbox, service: AdminService<MemoryInbox>) -> Router {
    let door = InboxLayer::new(inbox.clone()).namespace(ROUTE);
    Router::new()
        .route(SCOPE, post(|| async { "" }).route_layer(door))
        .nest_service("/admin/inbox", service)
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    text: String,
}

async fn send(
    app: &Router,
    method: &str,
    uri: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    let (status, headers, bytes) =
        admin_fixture::send(app, method, uri, headers, body.to_owned()).await;
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    Answer {
        status,
        headers,
        text,
    }
}

async fn page(app: &Router, uri: &str) -> String {
    let answer = send(app, "GET", uri, &[], "").await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text);
    assert_eq!(answer.headers["content-type"], "text/html; charset=utf-8");
    answer.text
}

/// The value of the first `name="csrf" value="…"` on a page.
fn csrf(page: &str) -> String {
    let at = page.find("name=\"csrf\" value=\"").expect("a csrf field") + 19;
    page[at..].split('"').next().unwrap().to_owned()
}

/// The text of the element opening with `opening` (up to its closing tag).
fn text_of<'a>(page: &'a str, opening: &str) -> &'a str {
    let at = page.find(opening).unwrap_or_else(|| panic!("no {opening}")) + opening.len();
    let rest = &page[at..];
    let start = rest.find('>').unwrap() + 1;
    let end = rest[start..].find('<').unwrap();
    &rest[start..start + end]
}

#[tokio::test]
async fn the_index_shows_routes_counts_and_entries_with_their_hooks() {
    let inbox = EMAIL
        .inbox(&["evt_dead"], &["evt_1", "evt_2", "evt_3"])
        .await;
    let app = app(&inbox, AdminService::new(inbox.clone()).actions(true));
    // Two deliveries through the door: one queued, one duplicate; one without a key.
    for id in ["evt_9", "evt_9"] {
        let key = [("idempotency-key", id)];
        let answer = send(&app, "POST", SCOPE, &key, "{}").await;
        assert!(answer.status.is_success(), "{}", answer.status);
    }
    let missing = send(&app, "POST", SCOPE, &[], "{}").await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);

    for index in ["/admin/inbox", "/admin/inbox/"] {
        let html = page(&app, index).await;
        assert!(html.len() < 30_000, "{} bytes", html.len());
        assert!(html.contains("<table id=\"routes\">"));
        let row = &html[html
            .find(&format!("<tr data-route=\"{ROUTE}\">"))
            .expect("the route's row")..];
        assert_eq!(text_of(row, "data-stat=\"received\""), "3");
        assert_eq!(text_of(row, "data-stat=\"queued\""), "1");
        assert_eq!(text_of(row, "data-stat=\"duplicates\""), "1");
        assert_eq!(text_of(row, "data-stat=\"rejected\""), "1");
        assert!(row.contains("missing_key&nbsp;1"));
        for stat in [
            "first",
            "stale",
            "handler_p50",
            "handler_p95",
            "worker_p50",
            "worker_p95",
        ] {
            assert!(row.contains(&format!("data-stat=\"{stat}\"")), "{stat}");
        }
        assert!(html.contains("Prometheus"));
        assert!(html.contains("<section id=\"inbox\""));
        assert_eq!(text_of(&html, "data-count=\"pending\""), "4");
        assert_eq!(text_of(&html, "data-count=\"dead\""), "1");
        assert_eq!(text_of(&html, "data-count=\"in_flight\""), "0");
        assert!(html.contains("data-count=\"oldest_age\""));
        assert!(html.contains("data-count=\"retries\""));
        assert!(html.contains("id=\"paused-state\" data-paused=\"false\""));
        assert!(html.contains("id=\"pause-form\"") && html.contains("id=\"pause\""));
        assert!(!html.contains("id=\"resume-form\""));
        assert!(html.contains("<form id=\"filter\" method=\"get\""));
        for name in ["state", "correlation_id", "id_prefix", "route", "error"] {
            assert!(
                html.contains(&format!("<label for=\"f-{name}\">")),
                "{name}"
            );
            assert!(html.contains(&format!("name=\"{name}\"")), "{name}");
        }
        assert!(html.contains("id=\"apply-filter\""));
        assert!(html.contains("<table id=\"entries\">"));
        assert_eq!(html.matches("<tr data-key=").count(), 5);
        let dead = format!(
            "<tr data-key=\"{}\" data-state=\"dead\">",
            EMAIL.key("evt_dead")
        );
        assert!(html.contains(&dead));
        assert!(html.contains("class=\"entry-link\""));
        assert!(html.contains("id=\"redrive-matching\""));
        assert!(!html.contains("id=\"next-page\""));
        // What the inbox holds is escaped: the error's markup is text.
        assert!(html.contains("upstream &lt;timeout&gt; &amp; &quot;more&quot;"));
        assert!(!html.contains("<timeout>"));
        // Nothing from elsewhere.
        assert!(!html.contains("http://") && !html.contains("https://"));
        assert!(html.contains("id=\"refresh\""));
    }
}

#[tokio::test]
async fn the_filter_and_the_pages_list_what_matches() {
    let inbox = EMAIL
        .inbox(&["evt_dead_1", "evt_dead_2"], &["evt_1", "evt_2", "evt_3"])
        .await;
    let app = app(&inbox, AdminService::new(inbox.clone()).actions(true));
    let html = page(
        &app,
        "/admin/inbox?state=dead&correlation_id=&id_prefix=evt&route=&error=timeout",
    )
    .await;
    assert_eq!(html.matches("data-state=\"dead\"").count(), 2);
    assert_eq!(html.matches("<tr data-key=").count(), 2);
    assert!(html.contains("<option value=\"dead\" selected>"));
    assert!(html.contains("name=\"error\" value=\"timeout\""));
    let html = page(&app, "/admin/inbox?state=queued").await;
    assert_eq!(html.matches("data-state=\"queued\"").count(), 3);
    // `any` is no state at all.
    let html = page(&app, "/admin/inbox?state=any&limit=2").await;
    assert_eq!(html.matches("<tr data-key=").count(), 2);
    let at = html.find("id=\"next-page\" href=\"?").expect("a next page") + 22;
    let next = html[at..].split('"').next().unwrap().replace("&amp;", "&");
    let html = page(&app, &format!("/admin/inbox?{next}&limit=2")).await;
    assert_eq!(html.matches("<tr data-key=").count(), 2);
    // A bad parameter is a problem document.
    let answer = send(&app, "GET", "/admin/inbox?state=gone", &[], "").await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn an_entry_page_shows_its_state_and_attempts() {
    let inbox = MemoryInbox::default();
    EMAIL.kill(&inbox, &["evt_dead"]).await;
    EMAIL.enqueue(&inbox, "evt_retry").await;
    let lease = inbox.take(1, LEASE).await.unwrap().pop().unwrap();
    let later = std::time::SystemTime::now() + Duration::from_secs(600);
    let why = Failure::RetryAt(later, "try again".to_owned());
    assert!(
        inbox
            .fail(&lease.entry.key, &lease.token, why)
            .await
            .unwrap()
    );
    let app = app(&inbox, AdminService::new(inbox.clone()).actions(true));

    let html = page(
        &app,
        &format!("/admin/inbox?entry={}", EMAIL.key("evt_dead")),
    )
    .await;
    assert!(html.contains("<dl id=\"entry\">"));
    assert_eq!(text_of(&html, "data-field=\"state\""), "dead");
    assert_eq!(text_of(&html, "data-field=\"id\""), "evt_dead");
    assert_eq!(text_of(&html, "data-field=\"route\""), ROUTE);
    assert_eq!(
        text_of(&html, "data-field=\"correlation_id\""),
        "corr-evt_dead"
    );
    assert_eq!(text_of(&html, "data-field=\"attempts\""), "1");
    assert!(html.contains("data-field=\"until\""));
    assert!(text_of(&html, "data-field=\"last_error\"").contains("upstream &lt;timeout&gt;"));
    assert!(html.contains("<table id=\"attempts\">"));
    assert_eq!(html.matches("<tr data-outcome=\"failed\">").count(), 1);
    assert!(html.contains("id=\"requeue\"") && html.contains("id=\"discard\""));
    // Bodies hidden by default.
    assert!(!html.contains("id=\"body\""));

    let html = page(
        &app,
        &format!("/admin/inbox?entry={}", EMAIL.key("evt_retry")),
    )
    .await;
    assert!(text_of(&html, "data-field=\"state\"").starts_with("retrying at "));
    assert!(!html.contains("id=\"requeue\""));
    let index = page(&app, "/admin/inbox").await;
    assert!(index.contains(&format!(
        "data-key=\"{}\" data-state=\"retrying\"",
        EMAIL.key("evt_retry")
    )));
    assert_eq!(text_of(&index, "data-count=\"retries\""), "1");

    let shown = AdminService::new(inbox.clone()).show_bodies(true);
    let app = self::app(&inbox, shown);
    let html = page(
        &app,
        &format!("/admin/inbox?entry={}", EMAIL.key("evt_dead")),
    )
    .await;
    assert!(html.contains("<pre id=\"body\">{&quot;event_id&quot;:&quot;evt_dead&quot;,&quot;x&quot;:&quot;&lt;b&gt;&amp;&quot;}</pre>"));
    let unknown = send(
        &app,
        "GET",
        &format!("/admin/inbox?entry={}", EMAIL.key("nope")),
        &[],
        "",
    )
    .await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_browser_form_needs_its_token_and_lands_on_the_page_with_a_message() {
    let inbox = MemoryInbox::default();
    EMAIL.kill(&inbox, &["evt_a", "evt_b", "evt_c"]).await;
    let app = app(
        &inbox,
        AdminService::new(inbox.clone())
            .actions(true)
            .csrf_secret(SECRET),
    );
    let entry = format!("/admin/inbox?entry={}", EMAIL.key("evt_a"));
    let html = page(&app, &entry).await;
    let token = csrf(&html);
    let form = [
        ("content-type", "application/x-www-form-urlencoded"),
        ("origin", "http://localhost"),
    ];
    let body = |token: &str| {
        format!(
            "do=requeue&key={}&back=entry%3D{}&csrf={token}",
            EMAIL.key("evt_a"),
            EMAIL.key("evt_a").as_str().replace(':', "%3A")
        )
    };

    // Without a token, or with a wrong one: 403, nothing done.
    for token in ["", "1.00"] {
        let answer = send(&app, "POST", "/admin/inbox", &form, &body(token)).await;
        assert_eq!(answer.status, StatusCode::FORBIDDEN);
        assert!(answer.text.contains("admin_forgery"), "{}", answer.text);
    }
    // The JSON endpoints too, for a browser (a cookie), unless the header carries the token.
    let cookie = [("cookie", "session=1")];
    let answer = send(&app, "POST", "/admin/inbox/pause", &cookie, "").await;
    assert_eq!(answer.status, StatusCode::FORBIDDEN);
    assert!(!inbox.is_paused().await.unwrap());
    // A form or a plain-text body needs it whatever the headers say (an old browser on basic
    // authentication sends none of a browser's headers); a JSON body or none does not.
    for content_type in ["application/x-www-form-urlencoded", "text/plain"] {
        let bare = [("content-type", content_type)];
        let answer = send(&app, "POST", "/admin/inbox/pause", &bare, "x").await;
        assert_eq!(answer.status, StatusCode::FORBIDDEN, "{content_type}");
        assert!(answer.text.contains("admin_forgery"), "{}", answer.text);
        assert!(!inbox.is_paused().await.unwrap());
    }
    let form_only = [("content-type", "application/x-www-form-urlencoded")];
    let answer = send(&app, "POST", "/admin/inbox", &form_only, &body("")).await;
    assert_eq!(answer.status, StatusCode::FORBIDDEN);
    let json = [("content-type", "application/json")];
    let answer = send(&app, "POST", "/admin/inbox/pause", &json, "{}").await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text);
    assert!(inbox.is_paused().await.unwrap());
    let answer = send(&app, "POST", "/admin/inbox/resume", &[], "").await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text);
    assert!(!inbox.is_paused().await.unwrap());
    let with = [("cookie", "session=1"), ("x-csrf-token", token.as_str())];
    let answer = send(&app, "POST", "/admin/inbox/pause", &with, "").await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text);
    assert!(inbox.is_paused().await.unwrap());
    let info = inbox.find(&EMAIL.key("evt_a")).await.unwrap().unwrap();
    assert_eq!(info.state, tower_idempotency::inbox::KeyState::Dead);

    // With it: done, and 303 back to the entry's page with a message.
    let answer = send(&app, "POST", "/admin/inbox", &form, &body(&token)).await;
    assert_eq!(answer.status, StatusCode::SEE_OTHER, "{}", answer.text);
    let location = answer.headers["location"].to_str().unwrap().to_owned();
    assert!(location.starts_with("?entry=ti:"), "{location}");
    let info = inbox.find(&EMAIL.key("evt_a")).await.unwrap().unwrap();
    assert_eq!(info.state, tower_idempotency::inbox::KeyState::Queued);
    let landed = page(&app, &format!("/admin/inbox{location}")).await;
    assert!(text_of(&landed, "id=\"flash\"").contains("re-queued"));
    // A token made by another process with the same secret is accepted.
    let other = AdminService::new(inbox.clone())
        .actions(true)
        .csrf_secret(SECRET);
    let other = self::app(&inbox, other);
    let body = format!("do=resume&csrf={token}");
    let answer = send(&other, "POST", "/admin/inbox/", &form, &body).await;
    assert_eq!(answer.status, StatusCode::SEE_OTHER, "{}", answer.text);
    assert!(!inbox.is_paused().await.unwrap());

    // The bulk re-queue: a confirmation with the count, then every one re-queued.
    let html = page(&app, "/admin/inbox?confirm=requeue&state=dead").await;
    assert_eq!(text_of(&html, "id=\"redrive-count\""), "2");
    assert!(html.contains("id=\"confirm-redrive\""));
    let form_at = html.find("id=\"redrive-form\"").unwrap();
    let at = form_at + html[form_at..].find("action=\"").unwrap() + 8;
    let action = html[at..].split('"').next().unwrap().replace("&amp;", "&");
    let body = format!("do=requeue_matching&back=state%3Ddead&csrf={}", csrf(&html));
    let answer = send(&app, "POST", &format!("/admin/inbox{action}"), &form, &body).await;
    assert_eq!(answer.status, StatusCode::SEE_OTHER, "{}", answer.text);
    assert_eq!(inbox.counts().await.unwrap().dead, 0);
    let landed = answer.headers["location"].to_str().unwrap().to_owned();
    let landed = page(&app, &format!("/admin/inbox{landed}")).await;
    assert_eq!(
        text_of(&landed, "id=\"flash\""),
        "2 dead letters re-queued."
    );

    // A client that is not a browser needs no token: the JSON API as before.
    let answer = send(
        &app,
        "POST",
        "/admin/inbox/pause",
        &[("authorization", "Bearer x")],
        "",
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.text, "{\"paused\":true}");
    let html = page(&app, "/admin/inbox").await;
    assert!(html.contains("data-paused=\"true\"") && html.contains("id=\"resume-form\""));
    assert!(!html.contains("id=\"pause-form\""));
}

#[tokio::test]
async fn read_only_shows_everything_and_no_form_that_acts() {
    let inbox = MemoryInbox::default();
    EMAIL.kill(&inbox, &["evt_dead"]).await;
    let app = app(&inbox, AdminService::new(inbox.clone()));
    let html = page(&app, "/admin/inbox").await;
    assert!(!html.contains("method=\"post\""));
    assert!(!html.contains("name=\"csrf\""));
    assert!(!html.contains("id=\"redrive-matching\""));
    assert!(html.contains("id=\"paused-state\"") && html.contains("data-count=\"dead\""));
    let html = page(
        &app,
        &format!("/admin/inbox?entry={}", EMAIL.key("evt_dead")),
    )
    .await;
    assert!(!html.contains("<button") && !html.contains("method=\"post\""));
    assert!(html.contains("<table id=\"attempts\">"));
    let form = [("content-type", "application/x-www-form-urlencoded")];
    let answer = send(&app, "POST", "/admin/inbox", &form, "do=pause").await;
    assert_eq!(answer.status, StatusCode::FORBIDDEN);
    assert!(!inbox.is_paused().await.unwrap());
}

/// A link cannot put text of its own on the operator's page: an action's message is named in
/// the redirect (`done`), and the server writes it.
#[tokio::test]
async fn a_message_on_the_page_is_one_the_server_wrote() {
    let inbox = MemoryInbox::default();
    EMAIL.kill(&inbox, &["evt_dead"]).await;
    let app = app(&inbox, AdminService::new(inbox.clone()));
    let dead = EMAIL.key("evt_dead");
    let named = page(&app, &format!("/admin/inbox?done=requeued&done_key={dead}")).await;
    assert_eq!(
        text_of(&named, "id=\"flash\""),
        format!("{dead}: re-queued.")
    );
    let counted = page(&app, "/admin/inbox?done=requeued_matching&done_n=3").await;
    assert_eq!(
        text_of(&counted, "id=\"flash\""),
        "3 dead letters re-queued."
    );
    for forged in [
        "flash=Your%20session%20expired%3A%20sign%20in%20at%20evil.example",
        "done=Sign%20in%20at%20evil.example",
        "done=requeued&done_key=Sign%20in%20at%20evil.example",
        "done=requeued_matching&done_n=all%20of%20them",
    ] {
        let answer = send(&app, "GET", &format!("/admin/inbox?{forged}"), &[], "").await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{forged}");
        assert!(!answer.text.contains("evil.example"), "{}", answer.text);
        assert!(!answer.text.contains("all of them"), "{}", answer.text);
    }
}

/// The index's size and the time to answer it with 5 routes and 50 entries (a measure, not a
/// check: `cargo test --release --features admin --test inbox admin_page:: -- --ignored
/// --nocapture`).
#[tokio::test]
#[ignore]
async fn measure_the_index() {
    let inbox = MemoryInbox::default();
    let ids: Vec<String> = (0..10).map(|i| format!("evt_dead_{i}")).collect();
    EMAIL
        .kill(&inbox, &ids.iter().map(String::as_str).collect::<Vec<_>>())
        .await;
    for i in 0..40 {
        EMAIL.enqueue(&inbox, &format!("evt_{i}")).await;
    }
    let mut app = Router::new();
    for route in 0..5 {
        let door = InboxLayer::new(inbox.clone()).namespace(format!("measure-{route}"));
        app = app.route(
            &format!("/in/{route}"),
            post(|| async { "" }).route_layer(door),
        );
    }
    let admin = AdminService::new(inbox.clone()).actions(true);
    let app = app.nest_service("/admin/inbox", admin);
    for route in 0..5 {
        for i in 0..20 {
            let key = format!("m{route}-{i}");
            send(
                &app,
                "POST",
                &format!("/in/{route}"),
                &[("idempotency-key", &key)],
                "{}",
            )
            .await;
        }
    }
    let html = page(&app, "/admin/inbox").await;
    assert_eq!(html.matches("<tr data-key=").count(), 50);
    let started = std::time::Instant::now();
    let rounds = 200;
    for _ in 0..rounds {
        page(&app, "/admin/inbox").await;
    }
    let each = started.elapsed() / rounds;
    println!(
        "index: {} bytes, {each:?} per answer (5 routes, 50 entries)",
        html.len()
    );
}
