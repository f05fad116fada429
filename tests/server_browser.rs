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
#[path = "common/browser.rs"]
mod browser;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use axum::Json;
use axum::routing::post;
use browser::{
    Killed, Profile, browser, browser_binaries, click, save_screenshot, start_driver, type_into,
    until,
};
use fantoccini::Client;
use serde_json::{Value, json};

const TOKEN: &str = "browser-test-token";

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
    try_start_server_with(store, addr, Some(TOKEN))
}

/// [`try_start_server`] with this token, or none (every caller is then the principal `local`).
fn try_start_server_with(
    store: &Path,
    addr: &str,
    token: Option<&str>,
) -> Option<(Killed, String)> {
    let mut cmd = bin::dagloop();
    cmd.arg("--config")
        .arg(bin::open_config())
        .args(["serve", "--addr", addr, "--store"])
        .arg(store)
        // A short lease: a server started again after a kill takes its runs over soon
        // (at once when the old lease has run out), as it would after a 20 s one.
        .env("DAGLOOP_LEASE_MS", "1000")
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    if let Some(t) = token {
        cmd.env("DAGLOOP_TOKEN", t);
    }
    let mut child = Killed(cmd.spawn().expect("spawn dagloop serve"));
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
    _profile: Profile,
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
    let profile = Profile::new();
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

    // An edit that breaks the tool's schema is refused by the server (the page has no schema
    // check of its own: the run's rules decide), shown inline, and changes nothing.
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
        "op.invalid_decision: ",
        "\"n\" is a required property",
        "at /note: 5 is not of type \"string\"",
        "'extra' was unexpected",
    ] {
        assert!(
            errors.iter().any(|e| e.contains(expected)),
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
        "the refused edit changed nothing: {still}"
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
    // The page catches up (the card leaves, the others move up) before the next click: a click
    // while the cards move can land beside its button.
    until(
        c,
        "the rejected call gone from the approvals",
        &format!(
            "return document.querySelector('.approval[data-call-id=\"{rejected}\"]') === null"
        ),
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
    // The page catches up (the card leaves, the others move up) before the next click: a click
    // while the cards move can land beside its button.
    until(
        c,
        "the replaced call gone from the approvals",
        &format!(
            "return document.querySelector('.approval[data-call-id=\"{replaced}\"]') === null"
        ),
    )
    .await;
    type_into(c, &editor, r#"{"n": 41, "note": "edited in the browser"}"#).await;
    click(
        c,
        &format!(".approval[data-call-id=\"{edited}\"] button.send-edit"),
    )
    .await;
    // The page catches up (the card leaves, the others move up) before the next click: a click
    // while the cards move can land beside its button.
    until(
        c,
        "the edited call gone from the approvals",
        &format!("return document.querySelector('.approval[data-call-id=\"{edited}\"]') === null"),
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
    let profile = Profile::new();
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

/// A page of another origin (another port on 127.0.0.1) sends a server without a token (the
/// default on loopback) the requests a page can make without a CORS preflight: a `no-cors`
/// fetch with `text/plain` and a form posted into an iframe. Both are refused (415) and the
/// run keeps waiting; a JSON fetch needs a preflight, which the server never grants, so it is
/// never sent. (Issue 24: the no-cors fetch used to cancel the run.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_origins_page_cannot_cancel_a_run() {
    let Some((chromium, driver)) = browser_binaries() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let url = echo_service().await;
    let (_server, base) = try_start_server_with(&dir.path().join("runs.db"), "127.0.0.1:0", None)
        .expect("dagloop serve listens");
    let (id, _) = submit(&base, dir.path(), &url).await;
    let cancel = format!("{base}/runs/{id}/cancel");
    let page = format!(
        r#"<!doctype html><title>another origin</title>
<form id="f" method="POST" action="{cancel}" enctype="text/plain" target="sink">
<input name='{{"reason": "x", "pad": "' value='"}}'></form>
<iframe name="sink"></iframe>
<script>
window.results = {{}};
const sink = document.querySelector("iframe");
fetch("{cancel}", {{method: "POST", mode: "no-cors", headers: {{"Content-Type": "text/plain"}},
                    body: JSON.stringify({{reason: "from another origin"}})}})
  .then(() => {{ window.results.no_cors = "sent"; }}, (e) => {{ window.results.no_cors = "error " + e; }})
  .then(() => fetch("{cancel}", {{method: "POST", headers: {{"Content-Type": "application/json"}}, body: "{{}}"}}))
  .then(() => {{ window.results.json = "sent"; }}, () => {{ window.results.json = "blocked"; }})
  .then(() => {{
    sink.addEventListener("load", () => {{ window.results.form = "sent"; }});
    document.getElementById("f").submit();
  }});
</script>"#
    );
    let app = axum::Router::new().route(
        "/",
        axum::routing::get(move || {
            let page = page.clone();
            async move { axum::response::Html(page) }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let other = format!("http://{}/", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });

    let (_driver, driver_url) = start_driver(&driver).await;
    let profile = Profile::new();
    let c = browser(&chromium, &driver_url, profile.path()).await;
    c.goto(&other).await.expect("open the other origin's page");
    let results = until(
        &c,
        "the three requests made",
        "const r = window.results; return r && r.form ? r : null",
    )
    .await;
    assert_eq!(
        results,
        json!({"no_cors": "sent", "json": "blocked", "form": "sent"}),
        "the browser sent the simple requests and withheld the JSON one"
    );
    // Give a request that slipped through time to act.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let run = api_get(&base, &format!("/runs/{id}")).await;
    assert_eq!(run["status"], "waiting", "the run was not cancelled: {run}");
    assert_eq!(run["awaiting"].as_array().map(Vec::len), Some(5), "{run}");
    c.clone().close().await.expect("close the browser");
}
