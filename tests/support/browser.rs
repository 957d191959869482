//! A real headless Chromium for tests, driven through WebDriver: `chromedriver` started on a
//! free loopback port, one session on a fresh profile, and the few verbs a page test needs
//! (go to, find by CSS, read, click, fill, select, submit, cookies, wait, screenshot, source).
//!
//! The WebDriver protocol is fantoccini's; this module owns the processes and the artifacts.
//! A [`Browser`] dropped while its test panics saves `<target>/browser/<test>-failure.png`
//! and `<test>-failure.html` first (the cargo target directory, `CARGO_TARGET_DIR` when set).
//! Its `Drop` cannot await, so it speaks to chromedriver over a plain blocking HTTP/1.0
//! connection, which works whatever state the test's runtime is in; then it ends the
//! session (Chromium quits) and kills chromedriver's process group, so that no browser
//! outlives the test.
//!
//! Missing binaries are a failure, never a skip: CI installs `chromium chromium-driver`.

#![allow(dead_code)]

use std::future::Future;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use fantoccini::elements::Element;
use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::{Value, json};

/// How long a wait lasts unless told otherwise: generous, for a loaded two-core machine.
pub const WAIT: Duration = Duration::from_secs(15);

/// How a session starts.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Whether pages run JavaScript (off: `--blink-settings=scriptEnabled=false`).
    pub javascript: bool,
    /// The window's width and height, which screenshots have.
    pub window: (u32, u32),
}

impl Default for Options {
    fn default() -> Self {
        Options {
            javascript: true,
            window: (1280, 900),
        }
    }
}

/// A headless Chromium session, with its chromedriver and profile; see the module docs for
/// what its `Drop` does.
pub struct Browser {
    client: Client,
    driver: Driver,
    session: String,
    name: String,
}

/// The chromedriver process (in a process group of its own, with Chromium under it) and the
/// profile directory, both gone when dropped.
struct Driver {
    child: Child,
    port: u16,
    profile: PathBuf,
}

impl Drop for Driver {
    fn drop(&mut self) {
        // Chromium runs in chromedriver's group: one signal to the group ends both, even when
        // the session could not be closed.
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill")
            .args(["-KILL", "--", &group])
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.save_failure();
        }
        // Chromium quits with its session; `Driver::drop` then kills what is left.
        let path = format!("/session/{}", self.session);
        let _ = blocking_http(self.driver.port, "DELETE", &path);
    }
}

/// The binary `name` on `PATH`, else the first of `fallbacks` that exists.
fn which(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    names.iter().find_map(|name| {
        std::env::split_paths(&path)
            .map(|dir| dir.join(name))
            .find(|candidate| candidate.is_file())
    })
}

fn require(env: &str, names: &[&str]) -> PathBuf {
    let found = match std::env::var_os(env) {
        Some(path) => Some(PathBuf::from(path)).filter(|path| path.is_file()),
        None => which(names),
    };
    found.unwrap_or_else(|| {
        panic!(
            "{} not found (on PATH, or at {env}): the browser test needs Chromium and ChromeDriver; \
             install them with `apt-get install chromium chromium-driver` (scripts/test, run by CI, does)",
            names.join(" or ")
        )
    })
}

/// The cargo target directory's `browser/` folder, made if missing.
pub fn artifacts_dir() -> PathBuf {
    // <target>/debug/deps/<test>-<hash> → <target>/browser
    let exe = std::env::current_exe().unwrap();
    let target = exe.ancestors().nth(3).expect("a test binary under target/");
    let dir = target.join("browser");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Browser {
    /// A session with JavaScript on and a 1280×900 window; `name` names its artifacts
    /// (the test's name).
    pub async fn start(name: &str) -> Browser {
        Browser::start_with(name, Options::default()).await
    }

    /// A session as `options` say. A session that chromedriver could not start (an empty
    /// answer while a loaded host starts Chromium) is tried again, with a new chromedriver, up
    /// to three times: what the tests check is the page, not the start of a browser.
    pub async fn start_with(name: &str, options: Options) -> Browser {
        let mut failed = Vec::new();
        for _ in 0..3 {
            match Self::try_start(name, &options).await {
                Ok(browser) => return browser,
                Err(err) => failed.push(err),
            }
        }
        panic!("a Chromium session through chromedriver, three times: {failed:?}")
    }

    async fn try_start(name: &str, options: &Options) -> Result<Browser, String> {
        let chromium = require("CHROME", &["chromium", "chromium-browser", "google-chrome"]);
        let chromedriver = require("CHROMEDRIVER", &["chromedriver"]);
        let port = free_port();
        let profile = std::env::temp_dir().join(format!(
            "tower-idempotency-browser-{}-{port}",
            std::process::id()
        ));
        std::fs::create_dir_all(&profile).unwrap();
        let child = Command::new(&chromedriver)
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|err| panic!("starting {}: {err}", chromedriver.display()));
        let driver = Driver {
            child,
            port,
            profile,
        };
        wait_listening(port, &chromedriver);

        let (width, height) = options.window;
        let mut args = vec![
            "--headless".to_owned(),
            "--no-sandbox".to_owned(),
            "--disable-gpu".to_owned(),
            "--disable-quic".to_owned(),
            "--no-first-run".to_owned(),
            // The network is closed: without these Chromium keeps calling home.
            "--disable-background-networking".to_owned(),
            "--disable-component-update".to_owned(),
            "--disable-sync".to_owned(),
            "--disable-dev-shm-usage".to_owned(),
            format!("--user-data-dir={}", driver.profile.display()),
            format!("--window-size={width},{height}"),
        ];
        if !options.javascript {
            args.push("--blink-settings=scriptEnabled=false".to_owned());
        }
        let capabilities = json!({
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": chromium, "args": args},
        });
        let Value::Object(capabilities) = capabilities else {
            unreachable!()
        };
        // On an error `driver` is dropped: chromedriver's process group is killed.
        let client = ClientBuilder::new(HttpConnector::new())
            .capabilities(capabilities)
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
            .map_err(|err| err.to_string())?;
        let session = client.session_id().await.unwrap().expect("a session id");
        Ok(Browser {
            client,
            driver,
            session,
            name: name.to_owned(),
        })
    }

    /// The fantoccini client, for what this module does not wrap.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Opens `url` and waits until it has loaded.
    pub async fn goto(&self, url: &str) {
        self.client
            .goto(url)
            .await
            .unwrap_or_else(|err| panic!("goto {url}: {err}"));
    }

    /// Reloads the page.
    pub async fn refresh(&self) {
        self.client.refresh().await.unwrap();
    }

    /// The page's URL.
    pub async fn url(&self) -> String {
        self.client.current_url().await.unwrap().to_string()
    }

    /// The first element matching `css`, waited for (a click that navigates may return
    /// before the next page is there), failing after `WAIT`.
    pub async fn find(&self, css: &str) -> Element {
        self.wait_for(css).await
    }

    /// The first element matching `css`, if any.
    pub async fn try_find(&self, css: &str) -> Option<Element> {
        self.client.find(Locator::Css(css)).await.ok()
    }

    /// How many elements match `css`.
    pub async fn count(&self, css: &str) -> usize {
        self.client
            .find_all(Locator::Css(css))
            .await
            .map_or(0, |all| all.len())
    }

    /// The visible text of the first element matching `css` (waited for), trimmed.
    pub async fn text(&self, css: &str) -> String {
        let text = self.find(css).await.text().await.unwrap();
        text.trim().to_owned()
    }

    /// [`text`](Self::text), `None` when nothing matches (or the page changed under it).
    pub async fn try_text(&self, css: &str) -> Option<String> {
        let element = self.try_find(css).await?;
        Some(element.text().await.ok()?.trim().to_owned())
    }

    /// An attribute of the first element matching `css`.
    pub async fn attr(&self, css: &str, name: &str) -> Option<String> {
        self.find(css).await.attr(name).await.unwrap()
    }

    /// Clicks the first element matching `css`.
    pub async fn click(&self, css: &str) {
        self.find(css)
            .await
            .click()
            .await
            .unwrap_or_else(|err| panic!("click {css:?}: {err}"));
    }

    /// Replaces the value of the input matching `css` by `value`.
    pub async fn fill(&self, css: &str, value: &str) {
        let input = self.find(css).await;
        input.clear().await.unwrap();
        input.send_keys(value).await.unwrap();
    }

    /// Selects the option of value `value` in the `<select>` matching `css`.
    pub async fn select(&self, css: &str, value: &str) {
        self.find(css)
            .await
            .select_by_value(value)
            .await
            .unwrap_or_else(|err| panic!("select {value:?} in {css:?}: {err}"));
    }

    /// Submits the form matching `css` with its submit button (as a person would).
    pub async fn submit(&self, css: &str) {
        let form = self
            .client
            .form(Locator::Css(css))
            .await
            .unwrap_or_else(|err| panic!("no form matches {css:?}: {err}"));
        form.submit().await.unwrap();
    }

    /// Sets a cookie for the current page's site, path `/`: go first to a page of the site
    /// that answers (Chromium's error page for an empty 404 is not the site's).
    pub async fn set_cookie(&self, name: &str, value: &str) {
        // Chromium refuses `SameSite=None` (fantoccini's default) without `Secure`, and
        // chromedriver a null domain: Lax, on the page's host.
        let url = self.client.current_url().await.unwrap();
        let host = url.host_str().expect("a page with a host");
        let cookie = format!("{name}={value}; Path=/; SameSite=Lax; Domain={host}");
        let cookie = fantoccini::cookies::Cookie::parse(cookie).unwrap();
        self.client.add_cookie(cookie).await.unwrap();
    }

    /// The value of the cookie `name`, if the browser has it.
    pub async fn cookie(&self, name: &str) -> Option<String> {
        let cookie = self.client.get_named_cookie(name).await.ok()?;
        Some(cookie.value().to_owned())
    }

    /// The page's HTML as the browser has it now.
    pub async fn source(&self) -> String {
        self.client.source().await.unwrap()
    }

    /// A PNG of the window, written to `path`.
    pub async fn screenshot(&self, path: &Path) {
        let png = self.client.screenshot().await.unwrap();
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(path, png).unwrap();
    }

    /// Polls `check` every 100 ms until it gives a value, failing after `WAIT` with `what`.
    pub async fn until<T, F, Fut>(&self, what: &str, check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        self.until_within(WAIT, what, check).await
    }

    /// [`until`](Self::until) with its own deadline.
    pub async fn until_within<T, F, Fut>(&self, limit: Duration, what: &str, check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        self.poll(limit, || what.to_owned(), check).await
    }

    /// The one polling loop: `what` tells the failure, once it is known.
    async fn poll<T, F, Fut>(&self, limit: Duration, what: impl Fn() -> String, mut check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        let start = Instant::now();
        loop {
            if let Some(value) = check().await {
                return value;
            }
            assert!(
                start.elapsed() < limit,
                "{}: not within {limit:?}: {} (page {})",
                self.name,
                what(),
                self.url().await
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until an element matches `css`, and returns it.
    pub async fn wait_for(&self, css: &str) -> Element {
        self.until(&format!("an element matching {css:?}"), || {
            self.try_find(css)
        })
        .await
    }

    /// Reloads `url` until `check` holds on the text of `css`; returns that text. A failure
    /// says what the page showed last.
    pub async fn reload_until(&self, url: &str, css: &str, check: impl Fn(&str) -> bool) -> String {
        let seen = std::cell::RefCell::new(None::<String>);
        let what = || format!("{css:?} on {url}, last seen {:?}", seen.borrow());
        self.poll(WAIT, what, || async {
            self.goto(url).await;
            let text = self.try_text(css).await;
            seen.replace(text.clone());
            text.filter(|text| check(text))
        })
        .await
    }

    /// Ends the session (Chromium quits); `Drop` would too, without waiting for an answer.
    pub async fn close(self) {
        let client = self.client.clone();
        let _ = client.close().await;
    }

    /// The screenshot and HTML of the page, read over a plain connection (see the module
    /// docs); what cannot be read is left out, never a second panic.
    fn save_failure(&self) {
        let dir = artifacts_dir();
        let session = &self.session;
        let port = self.driver.port;
        let value = |path: &str| {
            let body = blocking_http(port, "GET", &format!("/session/{session}{path}"))?;
            let json: Value = serde_json::from_str(&body).ok()?;
            json["value"].as_str().map(str::to_owned)
        };
        let png = value("/screenshot").and_then(|png| {
            base64::engine::general_purpose::STANDARD
                .decode(png.as_bytes())
                .ok()
        });
        if let Some(png) = png {
            let path = dir.join(format!("{}-failure.png", self.name));
            if std::fs::write(&path, png).is_ok() {
                eprintln!("browser: screenshot at {}", path.display());
            }
        }
        if let Some(html) = value("/source") {
            let path = dir.join(format!("{}-failure.html", self.name));
            if std::fs::write(&path, html).is_ok() {
                eprintln!("browser: page source at {}", path.display());
            }
        }
    }
}

/// Waits until chromedriver accepts connections on `port`.
fn wait_listening(port: u16, binary: &Path) {
    let start = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            start.elapsed() < WAIT,
            "{} not listening on port {port} within {WAIT:?}",
            binary.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One HTTP/1.1 exchange with chromedriver on a connection of its own (it does not answer
/// HTTP/1.0, and keeps the connection open after its answer): the body of a 2xx answer, as
/// long as its `Content-Length` says.
fn blocking_http(port: u16, method: &str, path: &str) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .ok()?;
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\n\
         Connection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).ok()?;
    let mut answer = Vec::new();
    let mut buffer = [0u8; 64 * 1024];
    loop {
        if let Some(end) = answer.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&answer[..end]).to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|line| line.strip_prefix("content-length:"))?
                .trim()
                .parse()
                .ok()?;
            if answer.len() >= end + 4 + length {
                let ok = head.split(' ').nth(1)?.starts_with('2');
                let body = &answer[end + 4..end + 4 + length];
                return ok.then(|| String::from_utf8_lossy(body).into_owned());
            }
        }
        let read = stream.read(&mut buffer).ok()?;
        if read == 0 {
            return None;
        }
        answer.extend_from_slice(&buffer[..read]);
    }
}
