//! The reviewer page in a real browser: `dagloop serve` (with a token) on 127.0.0.1, headless
//! Chromium driven through chromedriver with fantoccini. A reviewer opens the page, gives the
//! token, selects the run, sees five calls awaiting approval with their resolved params, is
//! told when another reviewer decided first, has an edit that breaks the tool's schema refused
//! inline (nothing is sent), rejects a call with a reason, replaces one, edits a param, approves
//! another call, and sees the run complete with the edited value in its output, the calls done
//! (the rejected one rejected) and the critical path highlighted. Screenshots
//! go to `<target>/dagloop-artifacts/`; any uncaught JavaScript error fails the test.
//!
//! Needs `chromium` and `chromedriver` (`scripts/setup-browser.sh` installs Debian's); without
//! them the test fails, unless DAGLOOP_SKIP_BROWSER=1, which makes it print SKIPPED.

#[path = "common/bin.rs"]
mod bin;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use axum::Json;
use axum::routing::post;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

const TOKEN: &str = "browser-test-token";

/// Kills the child process when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
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
fn browser_binaries() -> Option<(PathBuf, PathBuf)> {
    let chromium = find_binary("/usr/bin/chromium", "chromium");
    let driver = find_binary("/usr/bin/chromedriver", "chromedriver");
    match (chromium, driver) {
        (Some(c), Some(d)) => Some((c, d)),
        _ if std::env::var("DAGLOOP_SKIP_BROWSER").as_deref() == Ok("1") => {
            println!(
                "server_browser: SKIPPED (chromium or chromedriver missing; DAGLOOP_SKIP_BROWSER=1)"
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
fn artifacts_dir() -> PathBuf {
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

/// An HTTP service the `step` tool calls: it echoes the params it got.
async fn echo_service() -> String {
    let app = axum::Router::new().route(
        "/step",
        post(|Json(body): Json<Value>| async move { Json(json!({"got": body})) }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/step", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

/// Five independent `step` calls, every call asked about; the final output reads what four of
/// them wrote (the fourth is the one the reviewer rejects). The scripted model file is written in `dir`.
fn goal(dir: &Path, url: &str) -> Value {
    let step = json!({"_tool": "step", "_activity": "http", "_http": {"method": "POST", "url": url},
        "description": "Sends one step to the service.",
        "type": "object", "properties": {"n": {"type": "integer"}, "note": {"type": "string"}},
        "required": ["n"], "additionalProperties": false});
    let script = json!({"turns": [
        {"solution": {"calls": [
            {"_tool": "step", "n": 1, "note": "first", "_outputPath": "†state.a"},
            {"_tool": "step", "n": 2, "note": "second", "_outputPath": "†state.b"},
            {"_tool": "step", "n": 3, "note": "third", "_outputPath": "†state.c"},
            {"_tool": "step", "n": 4, "note": "fourth", "_outputPath": "†state.d"},
            {"_tool": "step", "n": 5, "note": "fifth", "_outputPath": "†state.e"}
        ], "output": null}, "chunk_chars": 40, "chunk_delay_ms": 1},
        {"solution": {"calls": [], "output": {"a": "†state.a.got", "b": "†state.b.got", "c": "†state.c.got", "e": "†state.e.got"}},
         "chunk_chars": 40, "chunk_delay_ms": 1}
    ]});
    let script_path = dir.join("steps.script.json");
    std::fs::write(&script_path, script.to_string()).expect("script");
    json!({"goal": "five steps, each decided by a reviewer",
        "model": format!("scripted:{}", script_path.display()),
        "output_schema": {"type": "object", "required": ["a", "b", "c", "e"]},
        "tools": [step], "approval": {"policy": "ask"}})
}

/// `dagloop serve` on `addr` (port 0: a free port, which it reports), with a token; None when
/// it does not listen (the address is still taken).
fn try_start_server(store: &Path, addr: &str) -> Option<(Killed, String)> {
    let mut child = Killed(
        bin::dagloop()
            .arg("--config")
            .arg(bin::open_config())
            .args(["serve", "--addr", addr, "--store"])
            .arg(store)
            .env("DAGLOOP_TOKEN", TOKEN)
            // A short lease: a server started again after a kill takes its runs over soon
            // (at once when the old lease has run out), as it would after a 20 s one.
            .env("DAGLOOP_LEASE_MS", "1000")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn dagloop serve"),
    );
    let mut line = String::new();
    BufReader::new(child.0.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .ok()?;
    let v: Value = serde_json::from_str(&line).ok()?;
    if v["status"] != "listening" {
        return None;
    }
    let base = v["url"].as_str()?.trim_end_matches('/').to_string();
    Some((child, base))
}

fn start_server(store: &Path) -> (Killed, String) {
    try_start_server(store, "127.0.0.1:0").expect("dagloop serve listens")
}

/// chromedriver on a free port, answering.
async fn start_driver(driver: &Path) -> (Killed, String) {
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

async fn browser(chromium: &Path, driver_url: &str, profile: &Path) -> Client {
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

/// Runs `script` in the page until it returns something other than null/false (bounded).
async fn until(c: &Client, what: &str, script: &str) -> Value {
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

async fn save_screenshot(c: &Client, name: &str) -> PathBuf {
    let png = c.screenshot().await.expect("screenshot");
    let path = artifacts_dir().join(name);
    std::fs::write(&path, png).expect("write the screenshot");
    println!("server_browser: screenshot {}", path.display());
    path
}

async fn api_get(base: &str, path: &str) -> Value {
    let r = dagloop::net::client()
        .expect("an HTTP client")
        .get(format!("{base}{path}"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("GET");
    assert!(r.status().is_success(), "GET {path}: {}", r.status());
    r.json().await.expect("JSON")
}

fn call_with_n(awaiting: &[Value], n: u64) -> u64 {
    awaiting
        .iter()
        .find(|a| a["call"]["n"] == n)
        .and_then(|a| a["call_id"].as_u64())
        .unwrap_or_else(|| panic!("no call with n = {n} awaits: {awaiting:?}"))
}

async fn click(c: &Client, css: &str) {
    c.find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("no element {css}: {e}"))
        .click()
        .await
        .unwrap_or_else(|e| panic!("cannot click {css}: {e}"));
}

async fn type_into(c: &Client, css: &str, text: &str) {
    let e = c
        .find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("no element {css}: {e}"));
    e.clear().await.expect("clear");
    e.send_keys(text).await.expect("type");
}

/// Submits the goal and waits until its five calls await a decision; returns the run id and
/// the `awaiting` list.
async fn submit(base: &str, dir: &Path, url: &str) -> (String, Vec<Value>) {
    let r = dagloop::net::client()
        .expect("an HTTP client")
        .post(format!("{base}/runs"))
        .bearer_auth(TOKEN)
        .json(&goal(dir, url))
        .send()
        .await
        .expect("POST /runs");
    assert_eq!(r.status().as_u16(), 201);
    let run: Value = r.json().await.expect("JSON");
    let id = run["id"].as_str().expect("id").to_string();
    let mut awaiting = Vec::new();
    for _ in 0..2400 {
        awaiting = api_get(base, &format!("/runs/{id}"))
            .await
            .get("awaiting")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        if awaiting.len() == 5 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(
        awaiting.len(),
        5,
        "five calls await a decision: {awaiting:?}"
    );
    (id, awaiting)
}

/// Opens the page; the API answers 401, so the page asks for the token once; then the run is
/// selected in the list and its five approvals and live stream are there.
async fn open_run(c: &Client, base: &str, id: &str) {
    c.goto(&format!("{base}/")).await.expect("open the page");
    until(
        c,
        "the token form",
        "return !document.querySelector('#token-form').hidden",
    )
    .await;
    type_into(c, "#token-input", TOKEN).await;
    click(c, "#token-save").await;
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
        "five approvals",
        "return document.querySelectorAll('.approval[data-call-id]').length === 5",
    )
    .await;
    until(
        c,
        "the live stream",
        "return document.querySelector('#conn').dataset.state === 'live'",
    )
    .await;
}

async fn decide_by_api(base: &str, id: &str, call: u64) {
    let r = dagloop::net::client()
        .expect("an HTTP client")
        .post(format!("{base}/runs/{id}/approvals/{call}"))
        .bearer_auth(TOKEN)
        .json(&json!({"decision": "approve"}))
        .send()
        .await
        .expect("a decision through the API");
    assert_eq!(r.status().as_u16(), 200, "{:?}", r.text().await);
}

/// A server with a submitted run whose five calls await a decision, opened in a fresh browser.
/// The guards keep the server, the driver and their folders alive as long as the page.
struct OpenRun {
    c: Client,
    base: String,
    id: String,
    awaiting: Vec<Value>,
    _driver: Killed,
    _profile: tempfile::TempDir,
    _server: Killed,
    _dir: tempfile::TempDir,
}

/// [`OpenRun`], or None when the browser binaries are missing (the test then says SKIPPED).
async fn open_submitted_run() -> Option<OpenRun> {
    let (chromium, driver) = browser_binaries()?;
    let dir = tempfile::tempdir().expect("tempdir");
    let url = echo_service().await;
    let (server, base) = start_server(&dir.path().join("runs.db"));
    let (id, awaiting) = submit(&base, dir.path(), &url).await;
    let (driver, driver_url) = start_driver(&driver).await;
    let profile = tempfile::tempdir().expect("profile dir");
    let c = browser(&chromium, &driver_url, profile.path()).await;
    open_run(&c, &base, &id).await;
    Some(OpenRun {
        c,
        base,
        id,
        awaiting,
        _driver: driver,
        _profile: profile,
        _server: server,
        _dir: dir,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reviewer_edits_and_approves_calls_in_the_browser_and_sees_the_run_complete() {
    // A program submits the goal; the reviewer opens the run.
    let Some(run) = open_submitted_run().await else {
        return;
    };
    let OpenRun {
        c,
        base,
        id,
        awaiting,
        ..
    } = &run;
    let (c, base, id) = (c, base.as_str(), id.as_str());
    let (edited, approved, taken, rejected, replaced) = (
        call_with_n(awaiting, 1),
        call_with_n(awaiting, 2),
        call_with_n(awaiting, 3),
        call_with_n(awaiting, 4),
        call_with_n(awaiting, 5),
    );

    // Every call awaiting approval, with its resolved params; the calls drawn as awaiting.
    let shown = c
        .execute(
            &format!(
                "return document.querySelector('.approval[data-call-id=\"{edited}\"] pre.params').textContent"
            ),
            vec![],
        )
        .await
        .expect("params");
    let shown: Value = serde_json::from_str(shown.as_str().expect("text")).expect("params JSON");
    assert_eq!(shown, json!({"n": 1, "note": "first"}));
    let drawn = c
        .execute(
            "return document.querySelectorAll('.call[data-status=\"awaiting_approval\"]').length",
            vec![],
        )
        .await
        .expect("calls");
    assert_eq!(drawn, json!(5));

    // Another reviewer decides first while this page has not caught up yet (its live updates
    // held back): approving here is refused with 409, and the page says so and refreshes.
    c.execute(
        "window.__openStream = openStream; openStream = function () {}; closeStream();",
        vec![],
    )
    .await
    .expect("hold the stream");
    // Let refreshes already under way land before the other reviewer decides.
    tokio::time::sleep(Duration::from_millis(500)).await;
    decide_by_api(base, id, taken).await;
    click(
        c,
        &format!(".approval[data-call-id=\"{taken}\"] button.approve"),
    )
    .await;
    let notice = until(
        c,
        "the conflict notice",
        "var n = document.querySelector('#notice'); \
         return !n.hidden && n.textContent.includes('Another reviewer decided first') && n.textContent",
    )
    .await;
    println!("server_browser: notice: {notice}");
    until(
        c,
        "the decided call gone from the approvals",
        &format!("return document.querySelector('.approval[data-call-id=\"{taken}\"]') === null"),
    )
    .await;
    c.execute("openStream = window.__openStream; openStream();", vec![])
        .await
        .expect("resume the stream");

    // An edit that breaks the tool's schema is refused inline and not sent.
    click(
        c,
        &format!(".approval[data-call-id=\"{edited}\"] button.edit"),
    )
    .await;
    let editor = format!(".approval[data-call-id=\"{edited}\"] textarea.params-editor");
    let prefilled = c
        .execute(
            &format!("return document.querySelector('{editor}').value"),
            vec![],
        )
        .await
        .expect("editor");
    let prefilled: Value =
        serde_json::from_str(prefilled.as_str().expect("text")).expect("editor JSON");
    assert_eq!(prefilled, json!({"n": 1, "note": "first"}));
    type_into(c, &editor, r#"{"note": 5, "extra": true}"#).await;
    click(
        c,
        &format!(".approval[data-call-id=\"{edited}\"] button.send-edit"),
    )
    .await;
    let errors = until(
        c,
        "the schema errors",
        &format!(
            "var l = document.querySelectorAll('.approval[data-call-id=\"{edited}\"] ul.errors li'); \
             return l.length > 0 && Array.from(l).map(function (e) {{ return e.textContent; }})"
        ),
    )
    .await;
    let errors: Vec<String> = serde_json::from_value(errors).expect("error texts");
    for expected in [
        "/n is required",
        "/note must be string",
        "/extra is not a parameter",
    ] {
        assert!(
            errors.iter().any(|e| e.starts_with(expected)),
            "{expected:?} in {errors:?}"
        );
    }
    save_screenshot(c, "reviewer-page-editing.png").await;
    let now = api_get(base, &format!("/runs/{id}")).await;
    let still = now["calls"]
        .as_array()
        .expect("calls")
        .iter()
        .find(|x| x["id"] == edited)
        .expect("the edited call");
    assert_eq!(
        still["status"], "awaiting_approval",
        "nothing was sent: {still}"
    );

    // A rejection with a reason, a replacement, a valid edit, and an approval.
    click(
        c,
        &format!(".approval[data-call-id=\"{rejected}\"] button.reject"),
    )
    .await;
    type_into(
        c,
        &format!(".approval[data-call-id=\"{rejected}\"] input.reject-reason"),
        "not needed today",
    )
    .await;
    click(
        c,
        &format!(".approval[data-call-id=\"{rejected}\"] button.send-reject"),
    )
    .await;
    click(
        c,
        &format!(".approval[data-call-id=\"{replaced}\"] button.replace"),
    )
    .await;
    type_into(
        c,
        &format!(".approval[data-call-id=\"{replaced}\"] textarea.call-editor"),
        r#"{"_tool": "step", "n": 50, "note": "replaced", "_outputPath": "†state.e"}"#,
    )
    .await;
    click(
        c,
        &format!(".approval[data-call-id=\"{replaced}\"] button.send-replace"),
    )
    .await;
    type_into(c, &editor, r#"{"n": 41, "note": "edited in the browser"}"#).await;
    click(
        c,
        &format!(".approval[data-call-id=\"{edited}\"] button.send-edit"),
    )
    .await;
    click(
        c,
        &format!(".approval[data-call-id=\"{approved}\"] button.approve"),
    )
    .await;

    // The run completes: its output carries the edited value, every call is done, the timeline
    // shows the reviewer's waits and the critical path.
    until(
        c,
        "the run succeeded",
        "return document.querySelector('#run-status').dataset.status === 'succeeded'",
    )
    .await;
    let output = until(
        c,
        "the output",
        "var t = document.querySelector('#output').textContent; return t.includes('{') && t",
    )
    .await;
    let output: Value = serde_json::from_str(output.as_str().expect("text")).expect("output JSON");
    assert_eq!(
        output,
        json!({"a": {"n": 41, "note": "edited in the browser"},
               "b": {"n": 2, "note": "second"},
               "c": {"n": 3, "note": "third"},
               "e": {"n": 50, "note": "replaced"}})
    );
    let state = c
        .execute(
            "return document.querySelector('#state').textContent",
            vec![],
        )
        .await
        .expect("state");
    assert!(
        state
            .as_str()
            .unwrap_or("")
            .contains("edited in the browser"),
        "{state}"
    );
    let counts = c
        .execute(
            "return [document.querySelectorAll('.call[data-status=\"done\"]').length, \
                     document.querySelectorAll('.call[data-status=\"rejected\"]').length, \
                     document.querySelectorAll('.approval').length, \
                     document.querySelectorAll('#gantt .span.reviewer').length, \
                     document.querySelectorAll('#gantt .span.critical').length, \
                     document.querySelector('#runs li[data-run-id] .badge').textContent]",
            vec![],
        )
        .await
        .expect("counts");
    assert_eq!(
        counts[0], 4,
        "every call but the rejected one done: {counts}"
    );
    assert_eq!(counts[1], 1, "the rejected call: {counts}");
    assert_eq!(counts[2], 0, "nothing awaits: {counts}");
    assert_eq!(counts[3], 5, "five reviewer spans: {counts}");
    assert!(
        counts[4].as_u64().unwrap_or(0) >= 1,
        "a critical path: {counts}"
    );
    let api = api_get(base, &format!("/runs/{id}")).await;
    assert_eq!(api["output"], output, "the page shows what the API says");
    println!(
        "server_browser: spans {}\nserver_browser: critical path {}",
        api["spans"], api["critical_path"]
    );
    let decisions: Vec<(u64, String)> = api["calls"]
        .as_array()
        .expect("calls")
        .iter()
        .map(|x| {
            (
                x["id"].as_u64().unwrap_or(0),
                x["decision"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    assert!(
        decisions.contains(&(edited, "edit".into())),
        "{decisions:?}"
    );
    for expected in [
        (edited, "edit"),
        (approved, "approve"),
        (taken, "approve"),
        (rejected, "reject"),
        (replaced, "replace"),
    ] {
        assert!(
            decisions.contains(&(expected.0, expected.1.to_string())),
            "{expected:?} in {decisions:?}"
        );
    }
    let reason = api["calls"]
        .as_array()
        .expect("calls")
        .iter()
        .find(|x| x["id"] == rejected)
        .map(|x| x["error"].to_string())
        .unwrap_or_default();
    assert!(reason.contains("not needed today"), "{reason}");

    let shot = save_screenshot(c, "reviewer-page.png").await;
    assert!(std::fs::metadata(&shot).expect("screenshot").len() > 1000);
    let errors = c
        .execute("return window.__errors", vec![])
        .await
        .expect("errors");
    assert_eq!(errors, json!([]), "JavaScript errors on the page");
    c.clone().close().await.expect("close the browser");
}

/// A reviewer typing a replacement keeps the focus and the text while another call above it is
/// decided elsewhere and its card goes: the cards still awaiting keep their places.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_card_being_typed_in_keeps_its_focus_when_a_card_above_it_goes() {
    let Some(run) = open_submitted_run().await else {
        return;
    };
    let (c, base, id) = (&run.c, run.base.as_str(), run.id.as_str());
    let (above, typing) = (call_with_n(&run.awaiting, 4), call_with_n(&run.awaiting, 5));

    click(
        c,
        &format!(".approval[data-call-id=\"{typing}\"] button.replace"),
    )
    .await;
    let editor = format!(".approval[data-call-id=\"{typing}\"] textarea.call-editor");
    type_into(c, &editor, r#"{"_tool": "step", "n": 50"#).await;
    decide_by_api(base, id, above).await;
    until(
        c,
        "the decided card gone",
        &format!("return document.querySelector('.approval[data-call-id=\"{above}\"]') === null"),
    )
    .await;
    let kept = c
        .execute(
            &format!(
                "var t = document.querySelector('{editor}'); \
                 return [document.activeElement === t, t.value]"
            ),
            vec![],
        )
        .await
        .expect("the editor");
    assert_eq!(kept, json!([true, r#"{"_tool": "step", "n": 50"#]));
    c.clone().close().await.expect("close the browser");
}

/// The server is killed (SIGKILL) while the page follows a run, and started again on the same
/// address: the page's stream breaks, its ticket is gone with the old process, so the page gets a
/// new ticket and a new stream by itself; decisions made elsewhere then reach it live, and it
/// shows the run complete without anybody touching it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_reconnects_by_itself_when_the_server_restarts() {
    let Some((chromium, driver)) = browser_binaries() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path().join("runs.db");
    let url = echo_service().await;
    let (mut server, base) = start_server(&store);
    let (id, awaiting) = submit(&base, dir.path(), &url).await;

    let (_driver, driver_url) = start_driver(&driver).await;
    let profile = tempfile::tempdir().expect("profile dir");
    let c = browser(&chromium, &driver_url, profile.path()).await;
    open_run(&c, &base, &id).await;

    let _ = server.0.kill(); // SIGKILL
    let _ = server.0.wait();
    until(
        &c,
        "the stream broken",
        "return document.querySelector('#conn').dataset.state === 'reconnecting'",
    )
    .await;
    let addr = base.trim_start_matches("http://").to_string();
    let mut again = None;
    for _ in 0..50 {
        if let Some((child, b)) = try_start_server(&store, &addr) {
            assert_eq!(b, base);
            again = Some(child);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    server = again.expect("the server listens on its old address again");
    until(
        &c,
        "the stream back",
        "return document.querySelector('#conn').dataset.state === 'live'",
    )
    .await;

    // Only the stream tells the page about these (it refreshes a running run on events only).
    for a in &awaiting {
        decide_by_api(&base, &id, a["call_id"].as_u64().expect("call id")).await;
    }
    until(
        &c,
        "the run succeeded",
        "return document.querySelector('#run-status').dataset.status === 'succeeded'",
    )
    .await;
    let done = c
        .execute(
            "return [document.querySelectorAll('.call[data-status=\"done\"]').length, \
                     document.querySelectorAll('.approval').length, \
                     document.querySelector('#conn').dataset.state]",
            vec![],
        )
        .await
        .expect("counts");
    assert_eq!(done, json!([5, 0, "finished"]));
    save_screenshot(&c, "reviewer-page-after-restart.png").await;
    let errors = c
        .execute("return window.__errors", vec![])
        .await
        .expect("errors");
    assert_eq!(errors, json!([]), "JavaScript errors on the page");
    c.clone().close().await.expect("close the browser");
    drop(server);
}
