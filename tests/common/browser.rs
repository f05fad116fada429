//! Headless Chromium driven through chromedriver with fantoccini, as the reviewer-page tests
//! use it: finding the binaries (or skipping), a driver on a free port, a browser session,
//! bounded waits on the page, clicks, typing and screenshots saved under
//! `<target>/dagloop-artifacts/`.
//!
//! Included with `#[path = "common/browser.rs"] mod browser;`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

/// Kills the child process when dropped.
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A browser profile directory that ends the browser using it when dropped. Killing
/// chromedriver leaves the Chromium it started running (reparented to init, its page's timers
/// and event streams still going), so every process started with this profile is killed, then
/// the directory removed.
pub struct Profile(tempfile::TempDir);

impl Profile {
    pub fn new() -> Profile {
        Profile(tempfile::tempdir().expect("profile dir"))
    }

    pub fn path(&self) -> &Path {
        self.0.path()
    }
}

impl Drop for Profile {
    fn drop(&mut self) {
        let _ = Command::new("pkill")
            .arg("-KILL")
            .arg("-f")
            .arg("--")
            .arg(format!("--user-data-dir={}", self.0.path().display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// An executable at `fixed`, or else found on PATH under `name`.
fn find_binary(fixed: &str, name: &str) -> Option<PathBuf> {
    let p = PathBuf::from(fixed);
    if p.is_file() {
        return Some(p);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Chromium and chromedriver, or None when the test is to be skipped.
pub fn browser_binaries() -> Option<(PathBuf, PathBuf)> {
    let chromium = find_binary("/usr/bin/chromium", "chromium");
    let driver = find_binary("/usr/bin/chromedriver", "chromedriver");
    match (chromium, driver) {
        (Some(c), Some(d)) => Some((c, d)),
        _ if std::env::var("DAGLOOP_SKIP_BROWSER").as_deref() == Ok("1") => {
            println!(
                "browser test: SKIPPED (chromium or chromedriver missing; DAGLOOP_SKIP_BROWSER=1)"
            );
            None
        }
        _ => panic!(
            "the browser test needs chromium and chromedriver (/usr/bin/chromium, /usr/bin/chromedriver): \
             run scripts/setup-browser.sh, or set DAGLOOP_SKIP_BROWSER=1 to skip it"
        ),
    }
}

/// Where artifacts go: `<target dir>/dagloop-artifacts` (the target dir holds the binary).
pub fn artifacts_dir() -> PathBuf {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_dagloop"));
    let target = bin
        .parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("target"));
    let dir = target.join("dagloop-artifacts");
    std::fs::create_dir_all(&dir).expect("artifacts dir");
    dir
}

/// chromedriver on a free port, answering.
pub async fn start_driver(driver: &Path) -> (Killed, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let child = Command::new(driver)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn chromedriver");
    let child = Killed(child);
    let url = format!("http://127.0.0.1:{port}");
    let http = dagloop::net::client().expect("an HTTP client");
    for _ in 0..600 {
        if let Ok(r) = http.get(format!("{url}/status")).send().await
            && r.status().is_success()
        {
            return (child, url);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("chromedriver did not answer on {url}");
}

pub async fn browser(chromium: &Path, driver_url: &str, profile: &Path) -> Client {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": chromium.display().to_string(),
            "args": ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                     "--disable-background-networking", "--disable-component-update", "--disable-sync",
                     "--disable-dev-shm-usage", "--window-size=1400,1250",
                     format!("--user-data-dir={}", profile.display())],
        }),
    );
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(driver_url)
        .await
        .expect("a chromedriver session")
}

/// A browser session with its own chromedriver and profile (both end when it is dropped).
pub struct Session {
    pub c: Client,
    _driver: Killed,
    _profile: Profile,
}

/// A fresh [`Session`], or None when the browser binaries are missing (the test then says
/// SKIPPED).
pub async fn session() -> Option<Session> {
    let (chromium, driver) = browser_binaries()?;
    let (driver, driver_url) = start_driver(&driver).await;
    let profile = Profile::new();
    let c = browser(&chromium, &driver_url, profile.path()).await;
    Some(Session {
        c,
        _driver: driver,
        _profile: profile,
    })
}

/// Runs `script` in the page until it returns something other than null/false (bounded).
pub async fn until(c: &Client, what: &str, script: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let v = c.execute(script, vec![]).await.expect("execute");
        if !(v.is_null() || v == Value::Bool(false)) {
            return v;
        }
        if Instant::now() > deadline {
            let errors = c.execute("return window.__errors", vec![]).await.ok();
            let _ = save_screenshot(c, &format!("failed-{}.png", what.replace(' ', "-"))).await;
            panic!("the page never showed {what} (JavaScript errors: {errors:?})");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs `script` once and returns its value.
pub async fn eval(c: &Client, script: &str) -> Value {
    c.execute(script, vec![]).await.expect("execute")
}

pub async fn save_screenshot(c: &Client, name: &str) -> PathBuf {
    let png = c.screenshot().await.expect("screenshot");
    let path = artifacts_dir().join(name);
    std::fs::write(&path, png).expect("write the screenshot");
    println!("browser test: screenshot {}", path.display());
    path
}

pub async fn click(c: &Client, css: &str) {
    c.find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("no element {css}: {e}"))
        .click()
        .await
        .unwrap_or_else(|e| panic!("cannot click {css}: {e}"));
}

pub async fn type_into(c: &Client, css: &str, text: &str) {
    let e = c
        .find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("no element {css}: {e}"));
    e.clear().await.expect("clear");
    e.send_keys(text).await.expect("type");
}

/// Asserts that no uncaught JavaScript error happened on the page.
pub async fn no_errors(c: &Client) {
    let errors = eval(c, "return window.__errors").await;
    assert_eq!(errors, json!([]), "JavaScript errors on the page");
}

/// Opens the page at `base`, gives `token` when the page asks for one, and waits for the run
/// list to show `id`, then selects it.
pub async fn open_page_at_run(c: &Client, base: &str, token: Option<&str>, id: &str) {
    c.goto(&format!("{base}/#")).await.expect("open the page");
    if let Some(t) = token {
        until(
            c,
            "the token form",
            "return !document.querySelector('#token-form').hidden",
        )
        .await;
        type_into(c, "#token-input", t).await;
        click(c, "#token-save").await;
    }
    let run_item = format!("#runs li[data-run-id=\"{id}\"]");
    until(
        c,
        "the run in the list",
        &format!("return document.querySelector('{run_item}') !== null"),
    )
    .await;
    click(c, &run_item).await;
    until(
        c,
        "the run selected",
        &format!("return document.querySelector('#run-id').textContent === '{id}'"),
    )
    .await;
}

/// Presses these keys, one after the other, wherever the focus is (as a person would type).
pub async fn press(c: &Client, keys: &str) {
    use fantoccini::actions::{InputSource, KeyAction, KeyActions};
    let mut actions = KeyActions::new("keyboard".into());
    for k in keys.chars() {
        actions = actions
            .then(KeyAction::Down { value: k })
            .then(KeyAction::Up { value: k });
    }
    c.perform_actions(actions).await.expect("key presses");
}

/// The Escape key, for [`press`].
pub const ESCAPE: &str = "\u{e00c}";
