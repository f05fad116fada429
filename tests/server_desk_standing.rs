//! Standing approvals from the reviewer's page in a real browser (issue 26, spec/approval.md R14-R15):
//! `dagloop serve` on 127.0.0.1 (no token: every caller is `local`), headless Chromium through
//! chromedriver. On a card, "approve every call of this tool" (here with a schema typed in) and
//! "approve this call and the calls waiting on it" (the exact list the card shows); under the
//! cards, the run's standing approvals with the calls each approved and a revoke button. Each click is
//! checked in the run as the API describes it. Screenshots go to
//! `<target>/dagloop-artifacts/desk-standing-*.png`.
//!
//! Needs `chromium` and `chromedriver` (`scripts/setup-browser.sh`); without them each test
//! fails, unless DAGLOOP_SKIP_BROWSER=1, which makes it print SKIPPED.

#[path = "common/bin.rs"]
mod bin;
#[path = "common/browser.rs"]
mod browser;
#[path = "common/desk.rs"]
mod desk;
#[path = "common/serve.rs"]
mod serve;

use browser::{click, eval, no_errors, open_page_at_run, save_screenshot, until};
use desk::{chain_goal, ids, turn, write};
use serde_json::{Value, json};
use serve::{Server, approve, awaiting, client, create, send};

fn card(call: u64) -> String {
    format!(".approval[data-call-id=\"{call}\"]")
}

fn standing_row(g: &str) -> String {
    format!("#standing li[data-standing-id=\"{g}\"]")
}

/// The call `id` of the run as the API describes it.
fn call_of(run: &Value, id: u64) -> Value {
    run["calls"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["id"] == id))
        .cloned()
        .unwrap_or_else(|| panic!("no call {id}: {run}"))
}

/// Waits until the page lists standing approval `g` as having approved exactly `calls`.
async fn page_lists(c: &fantoccini::Client, g: &str, calls: &str) {
    until(
        c,
        &format!("standing approval {g} approved {calls}"),
        &format!(
            "var r = document.querySelector('{} .standing-calls'); return r !== null && r.dataset.calls === '{calls}'",
            standing_row(g)
        ),
    )
    .await;
}

/// "Approve every step call…" (opened with the `A` shortcut) with a schema typed in (`n` at most 10): the card's call and a
/// later call of the tool that satisfies it are approved by the standing approval without a prompt, one
/// that does not is asked about; after the page's revoke button, the next call is asked about.
/// A standing approval whose schema leaves the card's own call out leaves the card usable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_allow_tool_button_approves_later_calls_until_revoked() {
    let Some(b) = browser::session().await else {
        return;
    };
    let svc = desk::gated_service().await;
    let dir = tempfile::tempdir().expect("dir");
    let s = Server::start(&dir.path().join("runs.db"), None);
    let script = json!({"turns": [
        turn(json!([{"_tool": "step", "n": 1, "_outputPath": "†state.a"},
                    {"_tool": "step", "n": 50, "_outputPath": "†state.x"}]), Value::Null),
        turn(json!([{"_tool": "step", "n": 2, "_outputPath": "†state.b"},
                    {"_tool": "step", "n": 60, "_outputPath": "†state.y"}]), Value::Null),
        turn(json!([{"_tool": "step", "n": 3, "_outputPath": "†state.c"}]), Value::Null),
        turn(json!([]), json!({"c": "†state.c.v"}))
    ]});
    let sp = write(dir.path(), "s.json", &script);
    let goal = json!({"goal": "standing", "model": format!("scripted:{}", sp.display()),
        "output_schema": {"type": "object", "required": ["c"]},
        "tools": [desk::http_tool("step", &format!("{}/step", svc.base), false)],
        "approval": {"policy": "ask"}});
    let id = create(&s, &json!({ "goal": goal })).await;
    serve::until(&s, &id, |v| ids(&awaiting(v)) == [1, 2]).await;
    let c = &b.c;
    open_page_at_run(c, &s.base, None, &id).await;
    let button = format!("{} button.allow-tool", card(1));
    until(
        c,
        "the allow-tool button",
        &format!("return document.querySelector('{button}') !== null"),
    )
    .await;
    // A tool without a description and a card with no call waiting on it: nothing printed as
    // "null" (an optional piece the card left out).
    let text = eval(
        c,
        &format!("return document.querySelector('{}').textContent", card(1)),
    )
    .await;
    assert!(!text.as_str().unwrap_or("").contains("null"), "{text}");
    // Shift-a on the current (first) card opens the panel, as the terminal's `A` approves every call of the tool.
    browser::press(c, "A").await;
    // "only calls with exactly these params" fills in a schema of this call's params.
    click(c, &format!("{} button.allow-exact", card(1))).await;
    let when = format!("{} textarea.allow-when", card(1));
    let exact = eval(
        c,
        &format!("return JSON.parse(document.querySelector('{when}').value)"),
    )
    .await;
    assert_eq!(
        exact,
        json!({"type": "object", "properties": {"n": {"const": 1}}, "required": ["n"]})
    );
    let schema = json!({"properties": {"n": {"maximum": 10}}});
    browser::type_into(c, &when, &schema.to_string()).await;
    save_screenshot(c, "desk-standing-tool-panel.png").await;
    click(c, &format!("{} button.send-allow-tool", card(1))).await;

    // Call 1 approved by the standing approval; 2 (n: 50) does not satisfy its schema and still waits.
    let run = serve::until(&s, &id, |v| {
        ids(&awaiting(v)) == [2] && call_of(v, 1)["status"] == "done"
    })
    .await;
    assert_eq!(call_of(&run, 1)["decided_by_standing"], "g1", "{run}");
    assert_eq!(
        run["standing"][0]["covers"],
        json!({"scope": "tool", "tool": "step", "when": schema}),
        "{run}"
    );
    page_lists(c, "g1", "1").await;
    until(
        c,
        "call 1 shown approved through the standing approval",
        "var m = document.querySelector('.call[data-call-id=\"1\"] .call-meta'); \
         return m !== null && m.textContent.includes('through standing approval g1')",
    )
    .await;
    approve(&s, &id, 2).await;
    // The next turn: call 3 (n: 2) is approved by the standing approval, 4 (n: 60) is asked about.
    let run = serve::until(&s, &id, |v| {
        ids(&awaiting(v)) == [4] && call_of(v, 3)["status"] == "done"
    })
    .await;
    assert_eq!(call_of(&run, 3)["decided_by_standing"], "g1", "{run}");
    page_lists(c, "g1", "1,3").await;
    save_screenshot(c, "desk-standing-tool-list.png").await;

    // Revoked from the page: the next call of the tool (n: 3, within the schema) is asked about.
    click(c, &format!("{} button.revoke", standing_row("g1"))).await;
    serve::until(&s, &id, |v| v["standing"][0]["revoked"] == true).await;
    until(
        c,
        "the standing approval shown revoked",
        &format!(
            "var r = document.querySelector('{}'); return r !== null && r.dataset.revoked === 'true' \
               && r.querySelector('button.revoke') === null",
            standing_row("g1")
        ),
    )
    .await;
    // A standing approval whose schema leaves the card's own call out: the card stays, and still decides.
    click(c, &format!("{} button.allow-tool", card(4))).await;
    browser::type_into(
        c,
        &format!("{} textarea.allow-when", card(4)),
        r#"{"properties": {"n": {"maximum": 0}}}"#,
    )
    .await;
    click(c, &format!("{} button.send-allow-tool", card(4))).await;
    serve::until(&s, &id, |v| {
        v["standing"].as_array().map(Vec::len) == Some(2)
    })
    .await;
    page_lists(c, "g2", "").await;
    click(c, &format!("{} button.approve", card(4))).await;
    serve::until(&s, &id, |v| ids(&awaiting(v)) == [5]).await;
    approve(&s, &id, 5).await;
    let run = serve::until(&s, &id, |v| v["status"] == "succeeded").await;
    assert_eq!(run["output"], json!({"c": 30}), "{run}");
    assert_eq!(
        call_of(&run, 5)["decided_by_standing"],
        Value::Null,
        "{run}"
    );
    assert_eq!(run["standing"][0]["calls"], json!([1, 3]), "{run}");
    let (_, audit) = send(client().get(s.url(&format!("/runs/{id}/audit")))).await;
    let given: Vec<(&str, &str)> = audit
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["what"] == "allow" || e["what"] == "revoke")
        .map(|e| {
            (
                e["what"].as_str().unwrap_or(""),
                e["channel"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        given,
        [("allow", "http"), ("revoke", "http"), ("allow", "http")],
        "{audit}"
    );
    no_errors(c).await;
}

/// "Approve with the 2 waiting on it…" on call 1 of a chain 1 → 2 → 3 lists exactly those
/// three calls and approves exactly them: the independent call 4 and call 5, which the model
/// adds later reading 3, are asked about. A card with no call waiting on it has no such button.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_subgraph_button_approves_exactly_the_calls_it_shows() {
    let Some(b) = browser::session().await else {
        return;
    };
    let svc = desk::gated_service().await;
    let dir = tempfile::tempdir().expect("dir");
    let s = Server::start(&dir.path().join("runs.db"), None);
    let goal = chain_goal(dir.path(), &format!("{}/step", svc.base));
    let id = create(&s, &json!({ "goal": goal })).await;
    let run = serve::until(&s, &id, |v| {
        let a = awaiting(v);
        ids(&a) == [1, 4] && a[0]["downstream"].as_array().map(Vec::len) == Some(2)
    })
    .await;
    let first = &awaiting(&run)[0];
    let mut shown = vec![json!({"call": 1, "params_hash": first["params_hash"]})];
    for d in first["downstream"].as_array().into_iter().flatten() {
        shown.push(json!({"call": d["call_id"], "params_hash": d["params_hash"]}));
    }
    let c = &b.c;
    open_page_at_run(c, &s.base, None, &id).await;
    let button = format!("{} button.allow-calls", card(1));
    until(
        c,
        "the sub-graph button",
        &format!(
            "return document.querySelector('{button}') !== null && document.querySelector('{}') !== null",
            card(4)
        ),
    )
    .await;
    assert_eq!(
        eval(
            c,
            &format!(
                "return document.querySelector('{} button.allow-calls') === null",
                card(4)
            )
        )
        .await,
        true,
        "call 4 has no call waiting on it"
    );
    click(c, &button).await;
    let listed = until(
        c,
        "the listed calls",
        &format!(
            "var l = document.querySelectorAll('{} .allow-calls-list li'); \
             return l.length > 0 && Array.from(l).map(function (e) {{ return Number(e.dataset.callId); }})",
            card(1)
        ),
    )
    .await;
    assert_eq!(listed, json!([1, 2, 3]));
    save_screenshot(c, "desk-standing-subgraph-panel.png").await;
    click(c, &format!("{} button.send-allow-calls", card(1))).await;

    // 1-3 ran without a reviewer; 4 still waits.
    let run = serve::until(&s, &id, |v| {
        ids(&awaiting(v)) == [4] && (1..=3).all(|n| call_of(v, n)["status"] == "done")
    })
    .await;
    assert_eq!(
        run["standing"][0]["covers"],
        json!({"scope": "calls", "calls": shown}),
        "the standing approval quotes exactly the calls and hashes shown: {run}"
    );
    assert_eq!(run["standing"][0]["calls"], json!([1, 2, 3]), "{run}");
    page_lists(c, "g1", "1,2,3").await;
    save_screenshot(c, "desk-standing-subgraph-list.png").await;
    // Call 5, added later, reads call 3: no standing approval covers it.
    approve(&s, &id, 4).await;
    serve::until(&s, &id, |v| ids(&awaiting(v)) == [5]).await;
    approve(&s, &id, 5).await;
    let run = serve::until(&s, &id, |v| v["status"] == "succeeded").await;
    assert_eq!(run["output"], json!({"d": 40}), "{run}");
    assert_eq!(run["standing"][0]["calls"], json!([1, 2, 3]), "{run}");
    no_errors(c).await;
}
