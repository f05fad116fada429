//! The reviewer's deadline and answers, through the binaries (issue 48, items 3 and 4): a call's
//! reviewer timeout starts when it is shown to somebody (a terminal prompt, the API or the page
//! listing it), not when its batch was asked about, and is journaled; the terminal prompt shows
//! the call's card (action, each param's source, the rule that asked, the deadline); "send back"
//! reaches the model's next request as feedback to do it differently, not a veto; `d` at the
//! prompt leaves the call waiting and detaches the run.

mod common;

#[path = "common/bin.rs"]
mod bin;
#[path = "common/browser.rs"]
mod browser;
#[path = "common/serve.rs"]
mod serve;

use std::path::Path;

use dagloop::store::{RunStore, SqliteStore};
use dagloop::{CallId, RunInput};
use rexpect::session::spawn_command;
use serde_json::{Value, json};

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// [`serve::goal`]'s two independent calls under `approval`, written to `dir/goal.json`.
fn goal_with(dir: &Path, url: &str, approval: Value) {
    let mut goal = serve::goal(dir, url, "ask");
    goal["approval"] = approval;
    std::fs::write(dir.join("goal.json"), goal.to_string()).expect("goal");
}

/// When each call was shown, and when its reviewer timer fired, from the run's journal (ms).
fn shown_and_fired(store: &Path, run: &str, call: u64) -> (u64, u64) {
    let stored = SqliteStore::open(store)
        .and_then(|s| s.load(run))
        .expect("load");
    let at = |f: &dyn Fn(&RunInput) -> bool| {
        stored
            .journal
            .iter()
            .find(|e| f(&e.input))
            .map(|e| e.at)
            .unwrap_or_else(|| panic!("call {call}: no such entry in {:?}", stored.journal))
    };
    let shown = at(&|i| matches!(i, RunInput::Shown { call: c, .. } if *c == CallId(call)));
    let fired = at(
        &|i| matches!(i, RunInput::TimerFired { timer: dagloop::Timer::Approval { call: c } } if *c == CallId(call)),
    );
    (shown, fired)
}

fn run_id_of(text: &str) -> String {
    text.split("\"run_id\": \"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .unwrap_or_default()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_parallel_calls_are_each_shown_for_their_whole_timeout_before_the_default_applies() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("runs.db");
    let (url, counts) = serve::counting_service().await;
    goal_with(
        dir.path(),
        &url,
        json!({"policy": "ask", "timeout_s": 2, "default_decision": "approve"}),
    );
    let (d, s) = (dir.path().to_path_buf(), store.clone());
    let (screen, rest) = tokio::task::spawn_blocking(move || {
        let mut cmd = bin::dagloop();
        cmd.current_dir(&d)
            .arg("--store")
            .arg(&s)
            .args(["run", "goal.json"]);
        let mut p = spawn_command(cmd, Some(30_000)).expect("spawn in a pty");
        // The first call's card: what it does, where each value came from, the rule, the
        // deadline with its default.
        let first = p
            .exp_regex(r"deadline: approve at \d\d:\d\d:\d\d UTC \(in 2 s\) unless you decide")
            .expect("the first card's deadline")
            .0;
        p.exp_string("[s]end back").expect("the answers");
        p.exp_string("was decided: approved (the reviewer's time ran out)")
            .expect("the first default");
        p.exp_regex(r"deadline: approve at \d\d:\d\d:\d\d UTC \(in 2 s\)")
            .expect("the second call gets its own 2 s");
        p.exp_string("was decided: approved (the reviewer's time ran out)")
            .expect("the second default");
        let rest = p.exp_eof().expect("exits when the run ends");
        (first, rest)
    })
    .await
    .expect("pty");
    assert!(
        screen.contains("action: POST http://127.0.0.1:"),
        "{screen}"
    );
    assert!(screen.contains("(as the model wrote it)"), "{screen}");
    assert!(screen.contains("asked by: "), "{screen}");
    assert!(rest.contains("\"status\": \"succeeded\""), "{rest}");
    let id = run_id_of(&rest);
    let (s1, f1) = shown_and_fired(&store, &id, 1);
    let (s2, f2) = shown_and_fired(&store, &id, 2);
    // Each call's whole timeout ran from its own showing (bounds, no sleeps).
    assert!(
        (2000..3500).contains(&(f1 - s1)),
        "call 1: shown {s1}, fired {f1}"
    );
    assert!(
        (2000..3500).contains(&(f2 - s2)),
        "call 2: shown {s2}, fired {f2}"
    );
    // The second was shown only once the first prompt was done with.
    assert!(
        s2 >= f1,
        "call 2 shown at {s2}, before call 1's default at {f1}"
    );
    assert_eq!(counts.lock().expect("counts").len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_starts_and_shows_the_deadline_when_it_lists_a_call() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("runs.db");
    let (url, _counts) = serve::counting_service().await;
    goal_with(
        dir.path(),
        &url,
        json!({"policy": "ask", "timeout_s": 60, "default_decision": "reject"}),
    );
    let out = bin::dagloop()
        .current_dir(dir.path())
        .arg("--store")
        .arg(&store)
        .args(["run", "goal.json", "--detach", "--json"])
        .output()
        .expect("run");
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["status"], "waiting", "{v}");
    let id = v["run_id"].as_str().expect("id").to_string();
    // Nobody was shown the calls yet: no clock runs.
    let stored = SqliteStore::open(&store)
        .and_then(|s| s.load(&id))
        .expect("load");
    assert!(
        !stored
            .journal
            .iter()
            .any(|e| matches!(e.input, RunInput::Shown { .. })),
        "{:?}",
        stored.journal
    );
    let server = serve::Server::start(&store, None);
    let before = now_ms();
    let (status, listed) =
        serve::send(serve::client().get(server.url(&format!("/runs/{id}/approvals")))).await;
    let after = now_ms();
    assert_eq!(status, 200, "{listed}");
    let cards = listed.as_array().cloned().unwrap_or_default();
    assert_eq!(cards.len(), 2, "{listed}");
    for a in &cards {
        assert_eq!(a["timeout_ms"], 60_000, "{a}");
        assert_eq!(a["default_decision"], "reject", "{a}");
        let at = a["deadline_at"].as_u64().expect("a deadline once listed");
        // It started with this listing, not when the run asked.
        assert!(
            (before + 60_000..=after + 60_000).contains(&at),
            "{before}..{after}: {a}"
        );
    }
    // Every later reader sees the same deadline (it started once).
    let (_, run) = serve::send(serve::client().get(server.url(&format!("/runs/{id}")))).await;
    let deadlines =
        |v: &[Value]| -> Vec<Value> { v.iter().map(|a| a["deadline_at"].clone()).collect() };
    assert_eq!(
        deadlines(run["awaiting"].as_array().expect("awaiting")),
        deadlines(&cards),
        "{run}"
    );
    // Journaled: the server gone, the run rebuilt from its record keeps the same deadlines.
    let mut server = server;
    server.kill();
    let out = bin::dagloop()
        .arg("--store")
        .arg(&store)
        .args(["show", "--json", &id])
        .output()
        .expect("show");
    let shown: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(
        deadlines(shown["awaiting"].as_array().expect("awaiting")),
        deadlines(&cards),
        "{shown}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_back_reaches_the_models_next_request_as_feedback_not_a_veto() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("runs.db");
    let (url, counts) = serve::counting_service().await;
    goal_with(dir.path(), &url, json!({"policy": "ask"}));
    let first =
        json!({"calls": [{"_tool": "step", "n": 1, "_outputPath": "†state.a"}], "output": null});
    let second = json!({"calls": [], "output": {"a": 0, "b": 0}});
    let model = common::serve(vec![
        common::Canned::sse(&common::oa_stream(&first.to_string())),
        common::Canned::sse(&common::oa_stream(&second.to_string())),
    ])
    .await;
    let dagloop = |args: &[&str]| {
        bin::dagloop()
            .current_dir(dir.path())
            .arg("--store")
            .arg(&store)
            .args(args)
            .env("OPENAI_BASE_URL", model.openai_base())
            .env("OPENAI_API_KEY", "dummy")
            .output()
            .expect("dagloop")
    };
    let out = dagloop(&[
        "run",
        "goal.json",
        "--model",
        "openai:test",
        "--detach",
        "--json",
    ]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
        panic!(
            "{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_eq!(v["status"], "waiting", "{v}");
    let id = v["run_id"].as_str().expect("id").to_string();
    let feedback = "use n = 5: the first step starts at five";
    let out = dagloop(&["decide", &id, "c1", "send-back", "--feedback", feedback]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // Nothing is left to ask: `resume` runs without a terminal.
    let out = dagloop(&["resume", &id, "--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
        panic!(
            "{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_eq!(v["status"], "succeeded", "{v}");
    // The call never ran; the model's next request carries the feedback, as a retry.
    assert!(counts.lock().expect("counts").is_empty());
    let requests = model.requests();
    assert_eq!(requests.len(), 2);
    let told = requests[1].body["messages"].to_string();
    assert!(told.contains(feedback), "{told}");
    assert!(told.contains("sent this call back"), "{told}");
    assert!(told.contains("approval.sent_back"), "{told}");
    assert!(!told.contains("Do not retry it"), "{told}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d_at_the_prompt_leaves_the_call_waiting_and_detaches_the_run() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("runs.db");
    let (url, counts) = serve::counting_service().await;
    goal_with(dir.path(), &url, json!({"policy": "ask"}));
    let (d, s) = (dir.path().to_path_buf(), store.clone());
    let rest = tokio::task::spawn_blocking(move || {
        let mut cmd = bin::dagloop();
        cmd.current_dir(&d)
            .arg("--store")
            .arg(&s)
            .args(["run", "goal.json"]);
        let mut p = spawn_command(cmd, Some(30_000)).expect("spawn in a pty");
        p.exp_string("no deadline: the call waits for a decision")
            .expect("the card");
        p.exp_string("[d]etach").expect("the answers");
        p.send_line("d").expect("send");
        p.exp_string("left waiting; the run is detached")
            .expect("said");
        p.exp_eof().expect("exits")
    })
    .await
    .expect("pty");
    assert!(rest.contains("\"status\": \"waiting\""), "{rest}");
    assert!(rest.contains("dagloop resume"), "{rest}");
    assert!(counts.lock().expect("counts").is_empty());
    let id = run_id_of(&rest);
    let stored = SqliteStore::open(&store)
        .and_then(|s| s.load(&id))
        .expect("load");
    assert!(stored.result.is_none());
    let rb = dagloop::runs::rebuild(&stored.record, &stored.journal).expect("rebuild");
    assert_eq!(rb.machine.awaiting().len(), 2);
}

/// Without a store the prompt still has the whole card (rebuilt from the run's live journal),
/// and the line the answer is typed on counts down to the deadline, redrawn each second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_store_the_prompt_shows_the_card_and_counts_down() {
    let dir = tempfile::tempdir().expect("tmp");
    let (url, counts) = serve::counting_service().await;
    goal_with(
        dir.path(),
        &url,
        json!({"policy": "ask", "timeout_s": 5, "default_decision": "reject"}),
    );
    let d = dir.path().to_path_buf();
    let (card, left, rest) = tokio::task::spawn_blocking(move || {
        let mut cmd = bin::dagloop();
        cmd.current_dir(&d).args(["--no-store", "run", "goal.json"]);
        let mut p = spawn_command(cmd, Some(30_000)).expect("spawn in a pty");
        let card = p
            .exp_regex(r"deadline: reject at \d\d:\d\d:\d\d UTC \(in 5 s\) unless you decide")
            .expect("the card's deadline")
            .0;
        // Drawn with the answers, then redrawn in place (from the line's start) each second.
        let drawn = p.exp_regex(r"reject in \d s > ").expect("the countdown").1;
        let redrawn = p
            .exp_regex(r"\r  reject in \d s > ")
            .expect("the countdown redrawn")
            .1;
        let left = [drawn, redrawn];
        p.send_line("a").expect("send");
        p.exp_regex(r"reject in \d s > ")
            .expect("the second call's countdown");
        p.send_line("a").expect("send");
        let rest = p.exp_eof().expect("exits when the run ends");
        (card, left, rest)
    })
    .await
    .expect("pty");
    assert!(card.contains("action: POST http://127.0.0.1:"), "{card}");
    assert!(
        card.contains("note = \"first\"   (as the model wrote it)"),
        "{card}"
    );
    assert!(card.contains("asked by: "), "{card}");
    assert_ne!(
        left[0].trim(),
        left[1].trim(),
        "the time left did not change: {left:?}"
    );
    assert!(rest.contains("\"status\": \"succeeded\""), "{rest}");
    assert_eq!(counts.lock().expect("counts").len(), 2);
}

/// The page's card shows the deadline as a countdown with its default, and sends a call back
/// with feedback (the screenshot is docs/img/reviewer-deadline.png).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_counts_down_to_the_deadline_and_sends_a_call_back() {
    let Some(session) = browser::session().await else {
        return;
    };
    let c = &session.c;
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("runs.db");
    let (url, counts) = serve::counting_service().await;
    goal_with(
        dir.path(),
        &url,
        json!({"policy": "ask", "timeout_s": 600, "default_decision": "reject"}),
    );
    let out = bin::dagloop()
        .current_dir(dir.path())
        .arg("--store")
        .arg(&store)
        .args(["run", "goal.json", "--detach", "--json"])
        .output()
        .expect("run");
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let id = v["run_id"].as_str().expect("id").to_string();
    let server = serve::Server::start(&store, None);
    c.goto(&server.url(&format!("/?run={id}&call=1")))
        .await
        .expect("open the link");
    let countdown =
        r"/deadline: rejected by default in \d+ s \(at \d\d:\d\d:\d\d UTC\) unless you decide/";
    let first = browser::until(
        c,
        "the deadline counting down",
        &format!(
            "const d = document.querySelector('.approval[data-call-id=\"1\"] .deadline');
             return d && {countdown}.test(d.textContent) ? d.textContent : null;"
        ),
    )
    .await;
    browser::until(
        c,
        "the rule that asked",
        "return document.querySelector('.approval[data-call-id=\"1\"] .rule') !== null",
    )
    .await;
    browser::save_screenshot(c, "reviewer-deadline.png").await;
    // It ticks.
    browser::until(
        c,
        "the countdown moving",
        &format!(
            "const d = document.querySelector('.approval[data-call-id=\"1\"] .deadline');
             return d && d.textContent !== {first};"
        ),
    )
    .await;
    browser::click(c, ".approval[data-call-id=\"1\"] button.send-back").await;
    browser::type_into(
        c,
        ".approval[data-call-id=\"1\"] .send-back-feedback",
        "start at five",
    )
    .await;
    browser::click(c, ".approval[data-call-id=\"1\"] button.send-send-back").await;
    let v = serve::until(&server, &id, |v| serve::awaiting(v).len() == 1).await;
    let call = v["calls"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["id"] == 1))
        .cloned()
        .unwrap_or_default();
    assert_eq!(call["decision"], "send_back", "{v}");
    browser::no_errors(c).await;
    assert!(counts.lock().expect("counts").get(&1).is_none());
}

/// The model's thoughts for the step are on the page beside the cards (journaled with the turn),
/// and the Fork tab starts a new run from a step of this one (docs/img/reviewer-thoughts.png).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_the_models_thoughts_and_forks_from_a_step() {
    let Some(session) = browser::session().await else {
        return;
    };
    let c = &session.c;
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("runs.db");
    let (url, _counts) = serve::counting_service().await;
    goal_with(dir.path(), &url, json!({"policy": "ask"}));
    let thoughts = "Two independent steps: both can run at once, neither reads the other.";
    let script = json!({"turns": [
        {"solution": {"thoughts": thoughts, "calls": [
            {"_tool": "step", "n": 1, "note": "first", "_outputPath": "†state.a"},
            {"_tool": "step", "n": 2, "_outputPath": "†state.b"}
        ], "output": null}, "chunk_chars": 32, "chunk_delay_ms": 2},
        {"solution": {"calls": [], "output": {"a": "†state.a", "b": "†state.b.v"}}, "chunk_chars": 32}
    ]});
    std::fs::write(dir.path().join("s.json"), script.to_string()).expect("script");
    let out = bin::dagloop()
        .current_dir(dir.path())
        .arg("--store")
        .arg(&store)
        .args(["run", "goal.json", "--detach", "--json"])
        .output()
        .expect("run");
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let id = v["run_id"].as_str().expect("id").to_string();
    let server = serve::Server::start(&store, None);
    let (_, run) = serve::send(serve::client().get(server.url(&format!("/runs/{id}")))).await;
    assert_eq!(
        run["thoughts"],
        json!([{"step": 1, "thoughts": thoughts}]),
        "{run}"
    );

    c.goto(&server.url(&format!("/#{id}"))).await.expect("open");
    browser::until(
        c,
        "the model's thoughts",
        &format!(
            "const t = document.querySelector('#thoughts .thought[data-step=\"1\"] .thought-text');
             return t !== null && !document.querySelector('#ctx-thoughts').hidden
                 && t.textContent === {};",
            json!(thoughts)
        ),
    )
    .await;
    browser::save_screenshot(c, "reviewer-thoughts.png").await;
    browser::click(c, "#tabs button[data-tab=\"fork\"]").await;
    browser::until(
        c,
        "the fork form",
        "return document.querySelector('#fork-step') !== null && !document.querySelector('#fork').closest('.tab-panel').hidden",
    )
    .await;
    browser::eval(
        c,
        "document.querySelector('#fork-step').value = '0'; return true;",
    )
    .await;
    browser::click(c, "#fork-go").await;
    let forked = browser::until(
        c,
        "the fork opened",
        &format!(
            "const r = document.querySelector('#run-id').textContent;
             return r && r !== '{id}' ? r : null;"
        ),
    )
    .await;
    let forked = forked.as_str().expect("an id").to_string();
    let (status, v) =
        serve::send(serve::client().get(server.url(&format!("/runs/{forked}")))).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["forked_from"]["run"], id.as_str(), "{v}");
    assert_eq!(v["forked_from"]["step"], 0, "{v}");
    browser::no_errors(c).await;
}
