//! The reviewer's desk in a real browser (issue 26): `dagloop serve` on 127.0.0.1 (no token:
//! every caller is `local`), headless Chromium through chromedriver. A card shows what its call
//! will do (method and URL with header values hidden, the command line), the tool's
//! description, where each param came from and an edit as a diff; a blocked call lists what it
//! waits on; a nested agent's calls sit inside their delegate call and its end does not end
//! the run's stream; the critical path marks the chained calls; a second reviewer who is typing
//! when the first decides keeps the text and is told who decided what; the keyboard shortcuts;
//! the page follows the event stream instead of polling the run. Screenshots go to
//! `<target>/dagloop-artifacts/desk-*.png`.
//!
//! Needs `chromium` and `chromedriver` (`scripts/setup-browser.sh`); without them each test
//! fails, unless DAGLOOP_SKIP_BROWSER=1, which makes it print SKIPPED.

#[path = "common/bin.rs"]
mod bin;
#[path = "common/browser.rs"]
mod browser;
#[path = "common/serve.rs"]
mod serve;

use std::path::Path;
use std::time::Duration;

use axum::Json;
use axum::routing::post;
use browser::{ESCAPE, click, eval, no_errors, open_page_at_run, press, save_screenshot, until};
use fantoccini::Client;
use serde_json::{Value, json};
use serve::{Server, approve, awaiting, client, create, send};

/// A header value that must never reach the page.
const SECRET: &str = "sk-desk-secret-4711";

/// A tool service: `/step` echoes what it got, `/slow` does the same after 700 ms.
async fn service() -> String {
    let echo = |Json(body): Json<Value>| async move {
        Json(json!({"n": body["n"], "v": body["n"].as_u64().map(|n| n * 10), "got": body}))
    };
    let slow = |Json(body): Json<Value>| async move {
        tokio::time::sleep(Duration::from_millis(700)).await;
        Json(json!({"n": body["n"], "got": body}))
    };
    let app = axum::Router::new()
        .route("/step", post(echo))
        .route("/slow", post(slow));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    base
}

/// An http tool posting to `url`, with a description.
fn step_tool(name: &str, url: &str) -> Value {
    json!({"_tool": name, "_activity": "http",
        "_http": {"method": "POST", "url": url, "headers": {"X-Api-Key": SECRET}},
        "description": format!("Sends one {name} to the service."),
        "type": "object", "properties": {"n": {"type": "integer"}, "note": {"type": "string"}},
        "required": ["n"], "additionalProperties": false})
}

/// `goal` with a scripted model answering `turns` (the script is written in `dir`).
fn scripted(dir: &Path, name: &str, mut goal: Value, turns: Value) -> Value {
    let path = dir.join(format!("{name}.script.json"));
    let turns: Vec<Value> = turns
        .as_array()
        .expect("turns")
        .iter()
        .map(|t| json!({"solution": t, "chunk_chars": 64, "chunk_delay_ms": 1}))
        .collect();
    std::fs::write(&path, json!({ "turns": turns }).to_string()).expect("script");
    goal["model"] = json!(format!("scripted:{}", path.display()));
    goal
}

/// A server (no token) with its store in a fresh folder, and the tool service.
struct Desk {
    server: Server,
    url: String,
    dir: tempfile::TempDir,
}

fn desk_at(url: String) -> Desk {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("runs.db"), None);
    Desk { server, url, dir }
}

async fn desk() -> Desk {
    desk_at(service().await)
}

/// Waits until the run has `n` calls awaiting a decision; returns them.
async fn awaiting_n(s: &Server, id: &str, n: usize) -> Vec<Value> {
    awaiting(&serve::until(s, id, |v| awaiting(v).len() == n).await)
}

fn call_id(awaiting: &[Value], pred: impl Fn(&Value) -> bool) -> u64 {
    awaiting
        .iter()
        .find(|a| pred(&a["call"]))
        .and_then(|a| a["call_id"].as_u64())
        .unwrap_or_else(|| panic!("no such call awaits: {awaiting:?}"))
}

fn card(call: u64) -> String {
    format!(".approval[data-call-id=\"{call}\"]")
}

async fn text_of(c: &Client, css: &str) -> String {
    let v = eval(
        c,
        &format!("var e = document.querySelector('{css}'); return e ? e.textContent : null"),
    )
    .await;
    v.as_str()
        .unwrap_or_else(|| panic!("no element {css}"))
        .to_string()
}

/// Three calls: two await a decision (an http step and a shell command), the third reads what
/// the first writes and waits for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_card_shows_what_the_call_will_do_where_params_came_from_and_an_edit_as_a_diff() {
    let Some(b) = browser::session().await else {
        return;
    };
    let d = desk().await;
    let shout = json!({"_tool": "shout", "_activity": "shell", "_shell": {"command": ["echo", "{msg}"]},
        "description": "Prints a message.", "type": "object",
        "properties": {"msg": {"type": "string"}}, "required": ["msg"]});
    let goal = scripted(
        d.dir.path(),
        "cards",
        json!({"goal": "three steps\nthe second line is not the title",
            "output_schema": {"type": "object"},
            "tools": [step_tool("step", &format!("{}/step", d.url)), shout],
            "approval": {"policy": "ask"}}),
        json!([
            {"calls": [
                {"_tool": "step", "n": 1, "note": "first", "_outputPath": "†state.a"},
                {"_tool": "shout", "msg": "hello world"},
                {"_tool": "step", "n": 2, "note": "†state.a.got.note", "_outputPath": "†state.b"}],
             "output": null},
            {"calls": [], "output": {"b": "†state.b.got"}}
        ]),
    );
    let id = create(&d.server, &goal).await;
    let first = awaiting_n(&d.server, &id, 2).await;
    let (step1, shout1) = (
        call_id(&first, |c| c["n"] == 1),
        call_id(&first, |c| c["_tool"] == "shout"),
    );
    let c = &b.c;
    open_page_at_run(c, &d.server.base, None, &id).await;
    until(
        c,
        "two cards",
        "return document.querySelectorAll('.approval').length === 2",
    )
    .await;

    // Bug: a blocked call read "waits on ,[object HTMLElement]".
    let waits = until(
        c,
        "the blocked call",
        "var w = document.querySelector('.call[data-status=\"blocked\"] .waits'); return w && w.textContent",
    )
    .await;
    let waits = waits.as_str().unwrap_or("");
    assert!(
        waits.starts_with("waits on ") && waits.contains("state.a") && !waits.contains("[object"),
        "{waits}"
    );

    // What each call will do, and the tool's description; never the header's value.
    let http = text_of(c, &format!("{} .action[data-kind=\"http\"]", card(step1))).await;
    assert!(
        http.contains(&format!("POST {}/step", d.url)) && http.contains("X-Api-Key"),
        "{http}"
    );
    assert!(http.contains("(values hidden)"), "{http}");
    assert_eq!(
        text_of(c, &format!("{} .description", card(step1))).await,
        "Sends one step to the service."
    );
    assert_eq!(
        text_of(c, &format!("{} .action .cmdline", card(shout1))).await,
        "echo 'hello world'"
    );
    let html = eval(c, "return document.documentElement.outerHTML").await;
    assert!(
        !html.as_str().unwrap_or("").contains(SECRET),
        "the header value reached the page"
    );
    let (_, api) = send(client().get(d.server.url(&format!("/runs/{id}")))).await;
    assert!(
        !api.to_string().contains(SECRET),
        "the API shows the header value"
    );
    save_screenshot(c, "desk-card-action.png").await;

    // The third call, once the first ran: its note came from a reference.
    approve(&d.server, &id, step1).await;
    let third = awaiting_n(&d.server, &id, 2).await;
    let step2 = call_id(&third, |c| c["n"] == 2);
    let src = format!("{} tr[data-param=\"note\"]", card(step2));
    until(
        c,
        "the third card",
        &format!("return document.querySelector('{src}') !== null"),
    )
    .await;
    let row = eval(
        c,
        &format!(
            "var r = document.querySelector('{src}'); \
             return [r.dataset.from, r.querySelector('.wrote').textContent, r.querySelector('.value').textContent]"
        ),
    )
    .await;
    assert_eq!(row, json!(["reference", "†state.a.got.note", "\"first\""]));
    let n_row = eval(
        c,
        &format!(
            "return document.querySelector('{} tr[data-param=\"n\"]').dataset.from",
            card(step2)
        ),
    )
    .await;
    assert_eq!(n_row, "model");

    // An edit is shown as a diff against what was proposed, as it is typed.
    click(c, &format!("{} button.edit", card(step2))).await;
    browser::type_into(
        c,
        &format!("{} textarea.params-editor", card(step2)),
        r#"{"n": 2, "note": "changed"}"#,
    )
    .await;
    let diff = until(
        c,
        "the edit's diff",
        &format!(
            "var d = document.querySelectorAll('{} .edit-diff .diff-line'); \
             return d.length > 0 && Array.from(d).map(function (l) {{ return l.className.split(' ')[1] + ' ' + l.textContent; }})",
            card(step2)
        ),
    )
    .await;
    assert_eq!(
        diff,
        json!([
            "same   n: 2",
            "del - note: \"first\"",
            "add + note: \"changed\""
        ])
    );
    save_screenshot(c, "desk-edit-diff.png").await;
    click(c, &format!("{} button.send-edit", card(step2))).await;
    // The call ran with the edit; its card in the calls shows what changed.
    let summary = until(
        c,
        "the edited call's diff",
        &format!(
            "var d = document.querySelector('.call[data-call-id=\"{step2}\"] .call-diff'); return d && d.textContent"
        ),
    )
    .await;
    assert!(
        summary
            .as_str()
            .unwrap_or("")
            .contains("+ note: \"changed\""),
        "{summary}"
    );
    no_errors(c).await;
}

/// A nested agent (a delegate) finishes while the parent still waits for a decision: the page
/// keeps following the run (bug: the nested `run_finished` closed the stream and the badge
/// said "finished"); the nested call is shown inside its delegate call, and its card says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nested_agents_end_does_not_end_the_runs_stream_and_its_calls_sit_inside_their_parent() {
    let Some(b) = browser::session().await else {
        return;
    };
    let d = desk().await;
    let helper = json!({"goal": "helper", "output_schema": {"type": "object"},
        "tools": [step_tool("hstep", &format!("{}/step", d.url))], "approval": {"policy": "ask"}});
    std::fs::write(d.dir.path().join("helper.goal.json"), helper.to_string()).expect("helper");
    let goal = scripted(
        d.dir.path(),
        "nested",
        json!({"goal": "a parent with a helper", "output_schema": {"type": "object"},
            "tools": [{"_tool": "askHelper", "_delegate": d.dir.path().join("helper.goal.json").display().to_string(),
                       "type": "object"},
                      step_tool("step", &format!("{}/step", d.url))],
            "approval": {"policy": "allowlist", "allow": ["askHelper"]}}),
        json!([
            {"calls": [{"_tool": "askHelper", "q": "go", "_outputPath": "†state.h"},
                       {"_tool": "step", "n": 1, "_outputPath": "†state.s"}], "output": null},
            {"calls": [{"_tool": "hstep", "n": 7, "_outputPath": "†state.x"}], "output": null},
            {"calls": [], "output": {"helped": true}},
            {"calls": [], "output": {"h": "†state.h", "s": "†state.s.got"}}
        ]),
    );
    let id = create(&d.server, &goal).await;
    let both = awaiting_n(&d.server, &id, 2).await;
    let (step, hstep) = (
        call_id(&both, |c| c["_tool"] == "step"),
        call_id(&both, |c| c["_tool"] == "hstep"),
    );
    let (_, run) = send(client().get(d.server.url(&format!("/runs/{id}")))).await;
    let ask = run["calls"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["tool"] == "askHelper"))
        .and_then(|c| c["id"].as_u64())
        .expect("the delegate call");
    let c = &b.c;
    open_page_at_run(c, &d.server.base, None, &id).await;
    until(
        c,
        "the live stream",
        "return document.querySelector('#conn').dataset.state === 'live'",
    )
    .await;
    // Every state the live badge takes from now on.
    eval(
        c,
        "window.__conn = []; new MutationObserver(function () { \
           window.__conn.push(document.querySelector('#conn').dataset.state); \
         }).observe(document.querySelector('#conn'), {attributes: true});",
    )
    .await;
    let inside = until(
        c,
        "the nested call inside its parent",
        &format!(
            "return document.querySelector('.call[data-call-id=\"{ask}\"] .nested-calls .call[data-call-id=\"{hstep}\"]') !== null \
               && document.querySelector('{} .nested-in').textContent",
            card(hstep)
        ),
    )
    .await;
    assert_eq!(inside, json!(format!("in the nested agent of call #{ask}")));
    save_screenshot(c, "desk-nested.png").await;

    // The helper's call is approved here; the helper finishes; the parent still waits.
    click(c, &format!("{} button.approve", card(hstep))).await;
    serve::until(&d.server, &id, |v| {
        v["calls"].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c["tool"] == "askHelper" && c["status"] == "done")
        })
    })
    .await;
    until(
        c,
        "the delegate call done on the page",
        &format!(
            "return document.querySelector('.call[data-call-id=\"{ask}\"]').dataset.status === 'done'"
        ),
    )
    .await;
    // Long enough for the page to act on the nested run_finished it has received.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let seen = eval(
        c,
        "return [window.__conn, document.querySelector('#conn').dataset.state, \
                 document.querySelector('#run-status').dataset.status]",
    )
    .await;
    assert_eq!(seen[1], "live", "{seen}");
    assert_eq!(seen[2], "waiting", "{seen}");
    assert!(
        !seen[0]
            .as_array()
            .is_some_and(|s| s.iter().any(|x| x == "finished")),
        "the badge said finished while the run ran: {seen}"
    );
    // Only the stream tells the page about this decision and the run's end.
    approve(&d.server, &id, step).await;
    until(
        c,
        "the run succeeded",
        "return document.querySelector('#run-status').dataset.status === 'succeeded' \
           && document.querySelector('#conn').dataset.state === 'finished'",
    )
    .await;
    no_errors(c).await;
}

/// Three calls in a chain (each reads the one before), 700 ms each, then a last model step
/// that answers at once: the page marks the three calls as the critical path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_critical_path_marks_the_chained_calls_before_an_instant_last_step() {
    let Some(b) = browser::session().await else {
        return;
    };
    let d = desk().await;
    let path = d.dir.path().join("chain.script.json");
    let calls = json!([
        {"_tool": "slow", "n": 1, "_outputPath": "†state.a"},
        {"_tool": "slow", "n": "†state.a.n", "_outputPath": "†state.b"},
        {"_tool": "slow", "n": "†state.b.n", "_outputPath": "†state.c"}]);
    // The last turn in one chunk, without delay: a model step of (about) no length.
    let script = json!({"turns": [
        {"solution": {"calls": calls, "output": null}, "chunk_chars": 64, "chunk_delay_ms": 1},
        {"solution": {"calls": [], "output": {"c": "†state.c.n"}}, "chunk_chars": 4096}]});
    std::fs::write(&path, script.to_string()).expect("script");
    let goal = json!({"goal": "a chain", "model": format!("scripted:{}", path.display()),
        "output_schema": {"type": "object"},
        "tools": [step_tool("slow", &format!("{}/slow", d.url))], "approval": {"policy": "auto"}});
    let id = create(&d.server, &goal).await;
    let run = serve::until(&d.server, &id, |v| v["status"] == "succeeded").await;
    let ids: Vec<u64> = run["calls"]
        .as_array()
        .expect("calls")
        .iter()
        .filter_map(|c| c["id"].as_u64())
        .collect();
    assert_eq!(ids.len(), 3, "{run}");
    println!("critical path: {}", run["critical_path"]);
    let c = &b.c;
    open_page_at_run(c, &d.server.base, None, &id).await;
    let marked = until(
        c,
        "the critical path",
        "var s = document.querySelectorAll('#gantt .span.run.critical[data-call-id]'); \
         return s.length > 0 && Array.from(s).map(function (e) { return Number(e.dataset.callId); })",
    )
    .await;
    assert_eq!(
        marked,
        json!(ids),
        "the three calls are on the critical path"
    );
    save_screenshot(c, "desk-critical-path.png").await;
    no_errors(c).await;
}

/// Two reviewers on one run: B is typing a rejection reason when A approves the same call.
/// B's card stays, says who decided what, and keeps B's text (it used to vanish with it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reviewer_typing_when_another_decides_is_told_and_keeps_the_text() {
    let (Some(a), Some(b)) = (browser::session().await, browser::session().await) else {
        return;
    };
    let d = desk().await;
    let goal = serve::goal(d.dir.path(), &format!("{}/step", d.url), "ask");
    let id = create(&d.server, &goal).await;
    let calls = awaiting_n(&d.server, &id, 2).await;
    let first = call_id(&calls, |c| c["n"] == 1);
    let base = &d.server.base;
    open_page_at_run(&a.c, base, None, &id).await;
    open_page_at_run(&b.c, base, None, &id).await;
    for c in [&a.c, &b.c] {
        until(
            c,
            "two cards and the stream",
            "return document.querySelectorAll('.approval').length === 2 \
               && document.querySelector('#conn').dataset.state === 'live'",
        )
        .await;
    }
    click(&b.c, &format!("{} button.reject", card(first))).await;
    let reason = format!("{} input.reject-reason", card(first));
    browser::type_into(&b.c, &reason, "too risky on a Friday").await;

    click(&a.c, &format!("{} button.approve", card(first))).await;
    let told = until(
        &b.c,
        "the decided notice",
        &format!(
            "var n = document.querySelector('{} .decided-notice'); return n && n.textContent",
            card(first)
        ),
    )
    .await;
    assert!(
        told.as_str()
            .unwrap_or("")
            .contains("decided by local (http): approved"),
        "{told}"
    );
    let kept = eval(
        &b.c,
        &format!(
            "var i = document.querySelector('{reason}'); \
             return [i.value, i.readOnly, document.querySelector('{} button.send-reject').disabled]",
            card(first)
        ),
    )
    .await;
    assert_eq!(kept, json!(["too risky on a Friday", true, true]));
    save_screenshot(&b.c, "desk-decided-by-another.png").await;
    // The other card is still B's to decide; dismissing the notice removes the decided card.
    click(&b.c, &format!("{} button.dismiss", card(first))).await;
    let left = eval(
        &b.c,
        "return Array.from(document.querySelectorAll('.approval')).map(function (c) { return c.className; })",
    )
    .await;
    assert_eq!(left, json!(["approval"]), "{left}");
    no_errors(&a.c).await;
    no_errors(&b.c).await;
}

/// j/k move between the cards, ? shows the help, r opens the reason (typing "a" there does
/// not approve anything), Esc leaves the field, e opens the editor, a approves the current
/// card's call. And while nothing happens, the page asks the server nothing about the run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyboard_shortcuts_decide_the_current_card_but_not_while_typing() {
    let Some(b) = browser::session().await else {
        return;
    };
    let d = desk().await;
    let goal = serve::goal(d.dir.path(), &format!("{}/step", d.url), "ask");
    let id = create(&d.server, &goal).await;
    let calls = awaiting_n(&d.server, &id, 2).await;
    let (first, second) = (
        call_id(&calls, |c| c["n"] == 1),
        call_id(&calls, |c| c["n"] == 2),
    );
    let c = &b.c;
    open_page_at_run(c, &d.server.base, None, &id).await;
    until(
        c,
        "two cards",
        "return document.querySelectorAll('.approval').length === 2 \
           && document.querySelector('#conn').dataset.state === 'live'",
    )
    .await;

    // Following the stream, not polling: the run is fetched again only after an event of it
    // (once the catch-up the stream's opening asks for has landed).
    tokio::time::sleep(Duration::from_millis(1000)).await;
    eval(
        c,
        "window.__fetched = []; window.__seq = page.lastSeq; var f = window.fetch; \
         window.fetch = function (u, o) { window.__fetched.push(String(u)); return f(u, o); };",
    )
    .await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let events = eval(c, "return page.lastSeq - window.__seq").await;
    let events = events.as_u64().unwrap_or(0) as usize;
    let fetched = eval(c, "return window.__fetched").await;
    let about_run = fetched
        .as_array()
        .map(|f| {
            f.iter()
                .filter(|u| u.as_str().is_some_and(|u| u.contains(&id)))
                .count()
        })
        .unwrap_or(0);
    assert!(
        about_run <= events,
        "the run was fetched {about_run} times after {events} events: {fetched}"
    );
    let lists = fetched.as_array().map_or(0, |f| {
        f.iter()
            .filter(|u| u.as_str().is_some_and(|u| u.starts_with("/runs?")))
            .count()
    });
    assert!(
        lists <= 1 + events,
        "one light list poll in 4 s, or one after an event: {fetched}"
    );

    let current = "var c = document.querySelector('.approval.current'); return c ? Number(c.dataset.callId) : null";
    press(c, "j").await;
    assert_eq!(until(c, "a current card", current).await, first);
    press(c, "?").await;
    assert_eq!(
        eval(c, "return document.querySelector('#help').hidden").await,
        false
    );
    press(c, "?").await;
    press(c, "r").await;
    until(
        c,
        "the reason field focused",
        &format!(
            "return document.activeElement === document.querySelector('{} input.reject-reason')",
            card(first)
        ),
    )
    .await;
    press(c, "a").await;
    assert_eq!(
        eval(
            c,
            &format!(
                "return document.querySelector('{} input.reject-reason').value",
                card(first)
            )
        )
        .await,
        "a"
    );
    press(c, ESCAPE).await;
    press(c, "j").await;
    assert_eq!(until(c, "the second card current", current).await, second);
    press(c, "e").await;
    until(
        c,
        "the editor focused",
        &format!(
            "return document.activeElement === document.querySelector('{} textarea.params-editor')",
            card(second)
        ),
    )
    .await;
    save_screenshot(c, "desk-shortcuts.png").await;
    press(c, ESCAPE).await;
    press(c, "a").await;
    let run = serve::until(&d.server, &id, |v| awaiting(v).len() == 1).await;
    assert_eq!(
        awaiting(&run)[0]["call_id"],
        first,
        "the second call was approved, the first still waits: {run}"
    );
    let decided = run["calls"]
        .as_array()
        .and_then(|cs| cs.iter().find(|x| x["id"] == second))
        .map(|x| x["decision"].clone());
    assert_eq!(decided, Some(json!("approve")));
    // The page's decision named the presentation it answered (DESIGN.md 3.6).
    let (named, shown) = serve::decided_presentation(&d.dir.path().join("runs.db"), &id, second);
    assert!(named.is_some() && named == shown, "{named:?} / {shown:?}");
    no_errors(c).await;
}

/// The run list: each run's goal (first line), waiting runs first, a status filter, a search
/// and pages (`GET /runs?status=&q=&limit=&cursor=`, the next page from the `Link` header).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_run_list_puts_waiting_runs_first_filters_searches_and_pages() {
    let Some(b) = browser::session().await else {
        return;
    };
    let d = desk().await;
    let url = format!("{}/step", d.url);
    let mut ids = std::collections::BTreeMap::new();
    for (title, policy) in [
        ("alpha report", "auto"),
        ("beta summary", "auto"),
        ("gamma waits", "ask"),
        ("delta digest", "auto"),
        ("epsilon waits", "ask"),
    ] {
        let mut goal = serve::goal(d.dir.path(), &url, policy);
        goal["goal"] = json!(format!("{title}\nsecond line, not shown"));
        let id = create(&d.server, &goal).await;
        let done = |v: &Value| {
            if policy == "ask" {
                awaiting(v).len() == 2
            } else {
                v["status"] == "succeeded"
            }
        };
        serve::until(&d.server, &id, done).await;
        ids.insert(title, id);
    }
    let c = &b.c;
    open_page_at_run(c, &d.server.base, None, &ids["alpha report"]).await;
    let titles = "return Array.from(document.querySelectorAll('#runs li .run-title')).map(function (e) { return e.textContent; })";
    let shown = until(
        c,
        "five runs",
        &format!("var t = (function () {{ {titles} }})(); return t.length === 5 && t"),
    )
    .await;
    assert_eq!(
        shown,
        json!([
            "epsilon waits",
            "gamma waits",
            "delta digest",
            "beta summary",
            "alpha report"
        ]),
        "waiting runs first, then the newest"
    );
    save_screenshot(c, "desk-run-list.png").await;

    // Only the finished ones.
    eval(
        c,
        "var s = document.querySelector('#runs-status'); s.value = 'finished'; \
         s.dispatchEvent(new Event('change'));",
    )
    .await;
    let finished = until(
        c,
        "the finished runs",
        &format!("var t = (function () {{ {titles} }})(); return t.length === 3 && t"),
    )
    .await;
    assert_eq!(
        finished,
        json!(["delta digest", "beta summary", "alpha report"])
    );

    // A search, across every status.
    eval(
        c,
        "var s = document.querySelector('#runs-status'); s.value = ''; \
         s.dispatchEvent(new Event('change'));",
    )
    .await;
    browser::type_into(c, "#runs-q", "beta").await;
    let found = until(
        c,
        "the search's one run",
        &format!("var t = (function () {{ {titles} }})(); return t.length === 1 && t"),
    )
    .await;
    assert_eq!(found, json!(["beta summary"]));
    // The search cleared.
    eval(
        c,
        "var q = document.querySelector('#runs-q'); q.value = ''; q.dispatchEvent(new Event('input'));",
    )
    .await;

    // Pages of two.
    eval(c, "list.limit = 2; resetRuns();").await;
    let mut pages = Vec::new();
    for n in 1..=3 {
        let page = until(
            c,
            "a page of runs",
            &format!(
                "var t = (function () {{ {titles} }})(); \
                 return document.querySelector('#runs-page').textContent === 'page {n}' \
                   && t.length === {} && t",
                if n < 3 { 2 } else { 1 }
            ),
        )
        .await;
        pages.push(page);
        let next_disabled = eval(c, "return document.querySelector('#runs-next').disabled").await;
        assert_eq!(next_disabled, json!(n == 3), "page {n}");
        if n < 3 {
            click(c, "#runs-next").await;
        }
    }
    assert_eq!(
        pages,
        [
            json!(["epsilon waits", "gamma waits"]),
            json!(["delta digest", "beta summary"]),
            json!(["alpha report"])
        ]
    );
    click(c, "#runs-prev").await;
    until(
        c,
        "page 2 again",
        "return document.querySelector('#runs-page').textContent === 'page 2'",
    )
    .await;
    no_errors(c).await;
}
