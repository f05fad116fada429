//! The reviewer page gives the context to decide and the tools to move on (issue 48, item 5),
//! in headless Chromium against `dagloop serve` on 127.0.0.1: the run's goal, its input and
//! its submitter beside the cards; a waiting run's duration that goes on counting; run titles
//! with their input, submitter and duration; the calls drawn as a graph with one edge per dependency,
//! live; an edit's inline schema errors that go once its text changes, the card's action that
//! follows the edit being typed (`POST .../preview`), and the edited call's
//! "what was presented → what ran" in values, not references; the audit as a tab with ISO times
//! and the diff of the edit; and the queue across runs ("next waiting call", `n`) that opens the
//! oldest waiting call of any run.
//!
//! Needs `chromium` and `chromedriver` (`scripts/setup-browser.sh`); DAGLOOP_SKIP_BROWSER=1
//! skips these tests when they are missing. Screenshots go to `<target>/dagloop-artifacts/`.

#[path = "common/bin.rs"]
mod bin;
#[path = "common/browser.rs"]
mod browser;
#[path = "common/serve.rs"]
mod serve;

use std::path::Path;

use serde_json::{Value, json};

/// Four calls: the first two independent, the third reads what both wrote (the first twice),
/// the fourth reads what the third wrote and the goal's input. Every call is asked about.
fn dependent_goal(dir: &Path, url: &str) -> Value {
    let step = json!({"_tool": "step", "_activity": "http", "_http": {"method": "POST", "url": url},
        "description": "Sends one step to the service.",
        "type": "object",
        "properties": {"n": {"type": "integer"}, "note": {"type": "string"}, "from": {}},
        "required": ["n"], "additionalProperties": false});
    let script = json!({"turns": [
        {"solution": {"calls": [
            {"_tool": "step", "n": 1, "note": "first", "_outputPath": "†state.a"},
            {"_tool": "step", "n": 2, "note": "second", "_outputPath": "†state.b"},
            {"_tool": "step", "n": "†state.a.v", "note": "†state.a.got.note", "from": "†state.b",
             "_outputPath": "†state.c"},
            {"_tool": "step", "n": "†state.c.n", "note": "†input.city", "_outputPath": "†state.d"}
        ], "output": null}, "chunk_chars": 64, "chunk_delay_ms": 1},
        {"solution": {"calls": [], "output": {"d": "†state.d.got"}}, "chunk_chars": 64, "chunk_delay_ms": 1}
    ]});
    let script_path = dir.join("dependent.script.json");
    std::fs::write(&script_path, script.to_string()).expect("script");
    json!({"goal": "Plan the weekly delivery round for one city\nthen report the stops.",
        "input": {"city": "Lyon", "stops": 4},
        "model": format!("scripted:{}", script_path.display()),
        "output_schema": {"type": "object", "required": ["d"]},
        "tools": [step], "approval": {"policy": "ask"}})
}

/// The run's call ids in the order the model wrote them.
async fn call_ids(server: &serve::Server, id: &str, count: usize) -> Vec<u64> {
    let v = serve::until(server, id, |v| {
        v["calls"].as_array().map_or(0, Vec::len) == count
    })
    .await;
    let mut ids: Vec<u64> = v["calls"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["id"].as_u64())
        .collect();
    ids.sort_unstable();
    ids
}

/// The graph's edges as drawn: `[[from, to], ...]`, sorted.
const EDGES: &str = "return [...document.querySelectorAll('#graph svg path.edge')]
    .map(e => [Number(e.dataset.from), Number(e.dataset.to)])
    .sort((a, b) => a[0] - b[0] || a[1] - b[1]);";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_the_goal_the_graph_of_dependencies_and_the_audit_with_the_edit() {
    let Some(session) = browser::session().await else {
        return;
    };
    let c = &session.c;
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("runs.db");
    let (url, _counts) = serve::counting_service().await;
    let server = serve::Server::start(&store, None);
    let id = serve::create(&server, &dependent_goal(dir.path(), &url)).await;
    let ids = call_ids(&server, &id, 4).await;
    let (listed_status, listed) = serve::send(serve::client().get(server.url("/runs"))).await;
    assert_eq!(listed_status, 200, "{listed}");
    let submitter = listed[0]["submitted_by"]
        .as_str()
        .expect("a run submitted to the server has a submitter")
        .to_string();

    browser::open_page_at_run(c, &server.base, None, &id).await;
    // The goal's text (both lines), its input and who submitted it, beside the cards.
    browser::until(
        c,
        "the goal, its input and its submitter",
        &format!(
            "return !document.querySelector('#context').hidden
                && document.querySelector('#ctx-goal').textContent.includes('then report the stops.')
                && JSON.parse(document.querySelector('#ctx-input').textContent).city === 'Lyon'
                && document.querySelector('#ctx-submitter').textContent === '{submitter}'"
        ),
    )
    .await;
    // The run waits for a reviewer: its duration counts on (it read a few ms before).
    browser::until(
        c,
        "a waiting run's duration counting on",
        "const t = document.querySelector('#run-duration').textContent;
         const m = /^([0-9.]+) (ms|s|min)/.exec(t);
         return m !== null && m[2] !== 'ms' && Number(m[1]) >= 1;",
    )
    .await;
    // The list tells the run by its submitter and duration, the title on two lines, not cut.
    let meta = browser::until(
        c,
        "the run's submitter and duration in the list",
        &format!(
            "const li = document.querySelector('#runs li[data-run-id=\"{id}\"]');
             const m = li && li.querySelector('.run-meta');
             const t = li && li.querySelector('.run-title');
             return m && t && getComputedStyle(t).whiteSpace !== 'nowrap' ? m.textContent : null;"
        ),
    )
    .await;
    let meta = meta.as_str().unwrap_or("");
    assert!(meta.contains(&format!("by {submitter}")), "{meta}");
    assert!(
        meta.starts_with("input {\"city\":\"Lyon\",\"stops\":4}"),
        "the input tells runs of one goal apart: {meta}"
    );
    assert_eq!(
        listed[0]["input"], "{\"city\":\"Lyon\",\"stops\":4}",
        "GET /runs: {listed}"
    );
    assert!(meta.contains("started "), "{meta}");

    // One edge per dependency: the third call reads the first (twice) and the second; the
    // fourth reads the third (and the input, which no call writes).
    let want = json!([[ids[0], ids[2]], [ids[1], ids[2]], [ids[2], ids[3]]]);
    let drawn = browser::until(
        c,
        "the graph's edges",
        &format!("const e = (() => {{ {EDGES} }})(); return e.length === 3 ? e : null;"),
    )
    .await;
    assert_eq!(drawn, want);
    let nodes = browser::eval(
        c,
        "return document.querySelectorAll('#graph svg g.node').length",
    )
    .await;
    assert_eq!(nodes, json!(4));

    // Live: the first two approved, the third is presented and its node says so.
    serve::approve(&server, &id, ids[0]).await;
    serve::approve(&server, &id, ids[1]).await;
    serve::until(&server, &id, |v| {
        serve::awaiting(v).iter().any(|a| a["call_id"] == ids[2])
    })
    .await;
    browser::until(
        c,
        "the third call's node awaiting a decision",
        &format!(
            "const n = document.querySelector('#graph g.node[data-call-id=\"{}\"]');
             return n !== null && n.dataset.status === 'awaiting_approval';",
            ids[2]
        ),
    )
    .await;
    browser::save_screenshot(c, "page-context-graph.png").await;

    // An edit of the third call on the page: one that breaks the tool's schema is refused
    // inline; the errors go as soon as the text changes; the fixed edit is sent.
    let card = format!(".approval[data-call-id=\"{}\"]", ids[2]);
    browser::click(c, &format!("{card} button.edit")).await;
    let editor = format!("{card} textarea.params-editor");
    browser::type_into(c, &editor, r#"{"n": "ten"}"#).await;
    browser::click(c, &format!("{card} button.send-edit")).await;
    let errors_shown = format!("return document.querySelectorAll('{card} ul.errors li').length");
    browser::until(
        c,
        "the edit's schema errors",
        &format!("{errors_shown} > 0"),
    )
    .await;
    browser::type_into(c, &editor, r#"{"n": 10, "note": "edited", "from": {}}"#).await;
    assert_eq!(
        browser::eval(c, &errors_shown).await,
        json!(0),
        "the errors went with the text they were about"
    );
    // The card's action follows the edit: the request it would send, with the edited params.
    browser::until(
        c,
        "the action following the edit",
        &format!(
            "const b = document.querySelector('{card} > .action.previewed .body');
             return b !== null && b.textContent === '{{\"n\":10,\"note\":\"edited\",\"from\":{{}}}}';"
        ),
    )
    .await;
    browser::click(c, &format!("{card} button.send-edit")).await;
    serve::until(&server, &id, |v| {
        serve::awaiting(v).iter().any(|a| a["call_id"] == ids[3])
    })
    .await;
    serve::approve(&server, &id, ids[3]).await;
    serve::until(&server, &id, |v| v["status"] == "succeeded").await;

    // The audit tab: ISO times, the four decisions, and what the edit changed.
    browser::click(c, "#tabs button[data-tab=\"audit\"]").await;
    let edit_row = format!(
        "#audit tr[data-what=\"decision\"][data-call-id=\"{}\"]",
        ids[2]
    );
    let times = browser::until(
        c,
        "the audit's decisions",
        "const rows = [...document.querySelectorAll('#audit tr[data-what=\"decision\"]')];
         return rows.length === 4 ? rows.map(r => r.querySelector('time').textContent) : null;",
    )
    .await;
    for t in times.as_array().expect("times") {
        let t = t.as_str().unwrap_or("");
        assert!(
            t.len() == 24 && t.as_bytes()[10] == b'T' && t.ends_with('Z'),
            "an ISO time: {t}"
        );
    }
    let diff = browser::until(
        c,
        "the edit's diff",
        &format!(
            "const d = document.querySelector('{}');
             const lines = (cls) => [...d.querySelectorAll('.audit-diff .diff-line.' + cls)].map(l => l.textContent);
             return d && d.querySelector('.audit-diff') ? {{what: d.querySelector('.audit-what').textContent,
                 del: lines('del'), add: lines('add'), text: d.textContent}} : null;",
            edit_row.replace('\'', "\\'")
        ),
    )
    .await;
    // Presented (references resolved to values): n 10, note "first", from what the second call
    // wrote; ran: note "edited", from {}. `n` did not change.
    assert_eq!(diff["what"], "edit", "{diff}");
    let del: Vec<&str> = diff["del"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let add: Vec<&str> = diff["add"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(add, vec!["+ note: \"edited\"", "+ from: {}"], "{diff}");
    assert_eq!(del.len(), 2, "{diff}");
    assert_eq!(del[0], "- note: \"first\"", "{diff}");
    assert!(
        del[1].starts_with("- from: {") && del[1].contains("\"n\":2"),
        "{diff}"
    );
    assert!(
        !diff["text"].as_str().unwrap_or("").contains('†'),
        "values, not references: {diff}"
    );
    browser::save_screenshot(c, "page-context-audit.png").await;
    // Back to the calls: every node done; the edited call shows what was presented (values,
    // not references) against what ran.
    browser::click(c, "#tabs button[data-tab=\"calls\"]").await;
    browser::until(
        c,
        "every node done",
        "const n = [...document.querySelectorAll('#graph g.node')];
         return n.length === 4 && n.every(x => x.dataset.status === 'done');",
    )
    .await;
    let ran = browser::eval(
        c,
        &format!(
            "return document.querySelector('#calls .call[data-call-id=\"{}\"] .call-diff').textContent",
            ids[2]
        ),
    )
    .await;
    let ran = ran.as_str().unwrap_or("");
    assert!(ran.starts_with("what was presented → what ran"), "{ran}");
    assert!(
        ran.contains("- note: \"first\"") && ran.contains("+ note: \"edited\""),
        "{ran}"
    );
    assert!(!ran.contains('†'), "values, not references: {ran}");
    browser::no_errors(c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn next_waiting_call_opens_the_oldest_waiting_call_of_any_run() {
    let Some(session) = browser::session().await else {
        return;
    };
    let c = &session.c;
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("runs.db");
    let (url, _counts) = serve::counting_service().await;
    let server = serve::Server::start(&store, None);
    // The older run first: its two calls wait before the newer run's.
    let older = serve::create(&server, &serve::goal(dir.path(), &url, "ask")).await;
    let v = serve::until(&server, &older, |v| serve::awaiting(v).len() == 2).await;
    let mut older_calls: Vec<(u64, u64)> = v["calls"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| Some((c["asked_ms"].as_u64()?, c["id"].as_u64()?)))
        .collect();
    older_calls.sort_unstable();
    let newer = serve::create(&server, &serve::goal(dir.path(), &url, "ask")).await;
    serve::until(&server, &newer, |v| serve::awaiting(v).len() == 2).await;

    // The reviewer is on the newer run; `n` opens the older run's first presented call.
    browser::open_page_at_run(c, &server.base, None, &newer).await;
    let focused = |run: &str, call: u64| {
        format!(
            "const card = document.querySelector('.approval[data-call-id=\"{call}\"]');
             return document.querySelector('#run-id').textContent === '{run}'
                 && card !== null && card.classList.contains('current')
                 && document.activeElement === card;"
        )
    };
    browser::until(
        c,
        "the newer run's cards",
        "return document.querySelectorAll('.approval').length === 2",
    )
    .await;
    browser::press(c, "n").await;
    browser::until(
        c,
        "the oldest waiting call focused",
        &focused(&older, older_calls[0].1),
    )
    .await;
    // Pressed on that call, it goes on to the next one in the queue.
    browser::click(c, "#next-waiting").await;
    browser::until(
        c,
        "the next waiting call focused",
        &focused(&older, older_calls[1].1),
    )
    .await;
    assert_eq!(
        browser::eval(
            c,
            "return document.querySelectorAll('.approval.linked, .approval.current').length"
        )
        .await,
        json!(1),
        "one card is the one opened"
    );
    browser::save_screenshot(c, "page-context-next-waiting.png").await;
    browser::no_errors(c).await;

    // The preview an edit's card follows: what the call would do with other params; a call
    // that does not await a decision, or a body without params, is refused.
    let preview = |call: u64| server.url(&format!("/runs/{older}/approvals/{call}/preview"));
    let (status, v) = serve::send(
        serve::client()
            .post(preview(older_calls[0].1))
            .json(&json!({"params": {"n": 7, "note": "seven"}})),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["action"]["kind"], "http", "{v}");
    assert_eq!(v["action"]["body"], json!({"n": 7, "note": "seven"}), "{v}");
    let (status, v) = serve::send(
        serve::client()
            .post(preview(99))
            .json(&json!({"params": {}})),
    )
    .await;
    serve::refused((status, v), 409, "op.not_awaiting");
    let (status, v) = serve::send(
        serve::client()
            .post(preview(older_calls[0].1))
            .json(&json!({"params": [1]})),
    )
    .await;
    serve::refused((status, v), 400, "http.bad_body");
}

/// The list's "failed" filter is the API's: every ending but success (a model that never gave
/// a valid output, a cancelled run), and nothing else (a run that succeeded, one that waits);
/// a failed run's error is shown in words (docs/img/page-failed-filter.png).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_failed_filter_lists_exactly_the_failed_runs() {
    let Some(session) = browser::session().await else {
        return;
    };
    let c = &session.c;
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("runs.db");
    let (url, _counts) = serve::counting_service().await;
    let server = serve::Server::start(&store, None);
    let succeeded = serve::create(&server, &serve::goal(dir.path(), &url, "auto")).await;
    serve::until(&server, &succeeded, |v| v["status"] == "succeeded").await;
    let waiting = serve::create(&server, &serve::goal(dir.path(), &url, "ask")).await;
    serve::until(&server, &waiting, |v| serve::awaiting(v).len() == 2).await;
    // A script whose only output breaks the schema: the run ends `model_error`.
    let bad_script = dir.path().join("bad.script.json");
    std::fs::write(
        &bad_script,
        json!({"turns": [{"solution": {"calls": [], "output": {"answer": "forty-two"}}}]})
            .to_string(),
    )
    .expect("script");
    let model_error = serve::create(
        &server,
        &json!({"goal": "Answer with a number.",
            "model": format!("scripted:{}", bad_script.display()),
            "output_schema": {"type": "object", "required": ["answer"],
                              "properties": {"answer": {"type": "integer"}}},
            "tools": []}),
    )
    .await;
    serve::until(&server, &model_error, |v| v["status"] == "model_error").await;
    let cancelled = serve::create(&server, &serve::goal(dir.path(), &url, "ask")).await;
    serve::until(&server, &cancelled, |v| serve::awaiting(v).len() == 2).await;
    let (status, v) = serve::send(
        serve::client()
            .post(server.url(&format!("/runs/{cancelled}/cancel")))
            .json(&json!({"reason": "not today"})),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    serve::until(&server, &cancelled, |v| v["status"] == "cancelled").await;
    let mut failed = vec![model_error.clone(), cancelled.clone()];
    failed.sort();
    // The API's answer to the same filter (the runs' rows are written as they finish: bounded
    // polling).
    let mut api = Vec::new();
    for _ in 0..200 {
        let (status, listed) =
            serve::send(serve::client().get(server.url("/runs?status=failed"))).await;
        assert_eq!(status, 200, "{listed}");
        api = listed
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r["id"].as_str().map(String::from))
            .collect();
        api.sort();
        if api == failed {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    assert_eq!(api, failed);

    browser::open_page_at_run(c, &server.base, None, &waiting).await;
    browser::until(
        c,
        "four runs listed",
        "return document.querySelectorAll('#runs li').length === 4",
    )
    .await;
    browser::eval(
        c,
        "const s = document.querySelector('#runs-status'); s.value = 'failed';
         s.dispatchEvent(new Event('change'));",
    )
    .await;
    let shown = browser::until(
        c,
        "the failed runs",
        "const li = [...document.querySelectorAll('#runs li')];
         return li.length === 2 && !li.some(l => l.dataset.status === 'waiting')
             ? li.map(l => [l.dataset.runId, l.querySelector('.badge').textContent]) : null;",
    )
    .await;
    let mut shown: Vec<(String, String)> =
        serde_json::from_value(shown).expect("pairs of id and badge");
    shown.sort();
    let mut want = vec![
        (model_error.clone(), "model_error".to_string()),
        (cancelled.clone(), "cancelled".to_string()),
    ];
    want.sort();
    assert_eq!(shown, want);
    // Why it failed, in words: the message, then its cause with the output's schema errors.
    browser::click(c, &format!("#runs li[data-run-id=\"{model_error}\"]")).await;
    let words = browser::until(
        c,
        "the error in words",
        "const e = document.querySelector('#run-error');
         return e && !e.hidden && e.querySelector('.error-words') ? {
             lead: e.querySelector('.error-words').textContent,
             cause: [...e.querySelectorAll('.error-cause')].map(p => p.textContent),
             output: [...e.querySelectorAll('.output-errors li')].map(li => li.textContent)} : null;",
    )
    .await;
    let lead = words["lead"].as_str().unwrap_or("");
    assert!(
        lead.starts_with("the model failed") && lead.ends_with("run.model_error"),
        "{words}"
    );
    assert!(
        words["cause"][0]
            .as_str()
            .is_some_and(|c| c.starts_with("because: ") && c.ends_with("llm.script_exhausted")),
        "{words}"
    );
    assert_eq!(
        words["output"],
        json!(["at /answer: \"forty-two\" is not of type \"integer\""]),
        "{words}"
    );
    browser::save_screenshot(c, "page-failed-filter.png").await;
    browser::no_errors(c).await;
}
