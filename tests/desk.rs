//! The reviewer's desk through the binary (spec/approval.md R5-R10): a run-wide standing
//! approval given in a decisions file survives `kill -9` and resume; a sub-graph approval through the API covers
//! exactly the calls presented, not one added later; standing approvals are revoked; an interrupted call is
//! marked done with a supplied result; every decision is in the audit with its principal,
//! channel and rule or standing approval; the operator's webhook receives `approval_requested`, retried.

#[path = "common/bin.rs"]
mod bin;
#[path = "common/desk.rs"]
mod desk;
#[path = "common/serve.rs"]
mod serve;

use std::path::Path;
use std::time::Duration;

use desk::{chain_goal, ids, run_id, turn, write};
use serde_json::{Value, json};
use serve::{Server, awaiting, client, create, send, until};

/// The goal of the kill-9 tests: step 1 (ask), the gate (ask, idempotent; it hangs the first
/// time) reading step 1; then step 2; the output is step 2's result.
fn gated_goal(dir: &Path, svc: &desk::Gated) -> std::path::PathBuf {
    let script = json!({"turns": [
        turn(json!([{"_tool": "step", "n": 1, "_outputPath": "†state.a"},
                    {"_tool": "gate", "after": "†state.a", "_outputPath": "†state.g"}]), Value::Null),
        turn(json!([{"_tool": "step", "n": 2, "_outputPath": "†state.b"}]), Value::Null),
        turn(json!([]), json!({"total": "†state.b"}))
    ]});
    let s = write(dir, "s.json", &script);
    write(
        dir,
        "goal.json",
        &json!({"goal": "standing", "model": format!("scripted:{}", s.display()),
        "output_schema": {"type": "object", "required": ["total"]},
        "tools": [desk::http_tool("step", &format!("{}/step", svc.base), false),
                  desk::http_tool("gate", &format!("{}/gate", svc.base), true)],
        "approval": {"policy": "ask"}}),
    )
}

/// `dagloop ARGS` on `store`, its stdout as JSON (asserting the exit code is `code`).
fn cli(store: &Path, args: &[&str], code: i32) -> Value {
    let out = bin::dagloop()
        .env("DAGLOOP_STORE", store)
        .args(args)
        .output()
        .expect("dagloop");
    assert_eq!(
        out.status.code(),
        Some(code),
        "dagloop {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "dagloop {args:?} printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// Starts `dagloop ARGS` on `store` (a 200 ms lease), SIGKILLs it once the gate hangs; returns
/// what it printed on stderr. Waits until its lease ran out.
async fn killed_at_the_gate(store: &Path, svc: &desk::Gated, args: &[&std::ffi::OsStr]) -> Vec<u8> {
    let mut child = bin::dagloop()
        .env("DAGLOOP_STORE", store)
        .env("DAGLOOP_LEASE_MS", "200")
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("dagloop");
    desk::gate_hit(svc).await;
    child.kill().expect("SIGKILL");
    let out = child.wait_with_output().expect("wait");
    tokio::time::sleep(Duration::from_millis(300)).await; // the lease runs out
    out.stderr
}

/// Resumes the run with no reviewer (anything no standing approval covers would be rejected): it ends with
/// step 2's result, and each step ran once.
fn resumed_to_the_end(store: &Path, svc: &desk::Gated, id: &str) {
    let result = cli(
        store,
        &["resume", id, "--json", "--on-no-reviewer", "reject"],
        0,
    );
    assert_eq!(
        result["output"]["total"],
        json!({"n": 2, "v": 20}),
        "{result}"
    );
    let counts = svc.counts.lock().expect("counts").clone();
    assert_eq!(
        (counts.get(&1), counts.get(&2)),
        (Some(&1), Some(&1)),
        "{counts:?}"
    );
}

/// The audit's entries of one kind (`what`), with the JSON of the whole audit.
fn entries<'a>(audit: &'a Value, what: &str) -> Vec<&'a Value> {
    audit["audit"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["what"] == what)
        .collect()
}

/// R6: the terminal's "approve every call of this tool", given as a decisions file's `allow`
/// entry, is journaled: after SIGKILL mid-call and `resume` with no reviewer (anything not
/// covered would be rejected), a later call of the tool is approved by that standing approval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_wide_standing_approval_survives_kill_9_and_resume() {
    let svc = desk::gated_service().await;
    let dir = tempfile::tempdir().expect("dir");
    let goal = gated_goal(dir.path(), &svc);
    let decisions = write(
        dir.path(),
        "decisions.json",
        &json!({"decisions": [
            {"allow": {"scope": "tool", "tool": "step"}},
            {"tool": "gate", "decision": "approve"}
        ]}),
    );
    let store = dir.path().join("runs.db");
    let stderr = killed_at_the_gate(
        &store,
        &svc,
        &[
            "run".as_ref(),
            goal.as_os_str(),
            "--json".as_ref(),
            "--decisions".as_ref(),
            decisions.as_os_str(),
        ],
    )
    .await;
    let id = run_id(&stderr);
    resumed_to_the_end(&store, &svc, &id);
    let audit = cli(&store, &["show", &id, "--audit", "--json"], 0);
    let given = entries(&audit, "allow");
    assert_eq!(
        given.len(),
        1,
        "the standing approval is journaled once: {audit}"
    );
    assert_eq!(given[0]["channel"], "decisions_file", "{audit}");
    let steps: Vec<&Value> = entries(&audit, "decision")
        .into_iter()
        .filter(|e| e["tool"] == "step")
        .collect();
    assert_eq!(steps.len(), 2, "{audit}");
    for d in steps {
        // `grant` repeats `standing` for one release (docs/approval.md).
        assert_eq!(
            (
                d["decision"].as_str(),
                d["standing"].as_str(),
                d["grant"].as_str()
            ),
            (Some("approve"), Some("g1"), Some("g1")),
            "{audit}"
        );
        assert_eq!(d["rule"], "policy:ask", "the rule that asked: {audit}");
    }
    assert_eq!(
        audit["standing"][0]["calls"].as_array().map(Vec::len),
        Some(2),
        "{audit}"
    );
    assert_eq!(
        audit["grants"], audit["standing"],
        "the old key, for one release"
    );
    // The people's view lists them too.
    let out = bin::dagloop()
        .env("DAGLOOP_STORE", &store)
        .args(["show", &id, "--audit"])
        .output()
        .expect("show");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("allow g1")
            && text.contains("standing g1")
            && text.contains("(decisions_file)"),
        "{text}"
    );
}

/// R13: standing approvals from the command line. A detached run waits on step 1; `dagloop
/// allow --tool step --when SCHEMA` and `dagloop allow --call 1 --with-dependents` (step 1 and the gate
/// blocked on it, as they stand) are recorded; the resumed run applies them (step 1 and the
/// gate run without a reviewer) and is SIGKILLed in the gate; `dagloop revoke` takes the
/// sub-graph approval back; resumed with no reviewer, step 2 is approved by the tool one. The
/// audit lists both standing approvals and the revocation with channel `cli`; refusals carry their codes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standing_approvals_from_the_command_line_are_applied_journaled_and_survive_kill_9() {
    let svc = desk::gated_service().await;
    let dir = tempfile::tempdir().expect("dir");
    let goal = gated_goal(dir.path(), &svc);
    let store = dir.path().join("runs.db");
    let goal_arg = goal.display().to_string();
    let waiting = cli(&store, &["run", &goal_arg, "--json", "--detach"], 0);
    assert_eq!(waiting["status"], "waiting", "{waiting}");
    let id = waiting["run_id"].as_str().expect("run id").to_string();
    assert_eq!(
        ids(waiting["awaiting"].as_array().unwrap()),
        [1],
        "{waiting}"
    );
    // Refused before anything is recorded: an unknown tool, a schema that is not one, a call
    // seen with other params, a standing approval that does not exist.
    for (args, code) in [
        (vec!["--tool", "nope"], "op.invalid_standing_approval"),
        (
            vec!["--tool", "step", "--when", r#"{"type": 7}"#],
            "op.invalid_standing_approval",
        ),
        (
            vec!["--tool", "step", "--when", "{not json"],
            "cli.bad_standing_approval",
        ),
        (
            vec!["--call", "1", "--with-dependents", "--presented", "0000"],
            "op.stale",
        ),
        (vec!["--call", "2", "--with-dependents"], "op.not_awaiting"),
    ] {
        let mut a = vec!["allow", id.as_str()];
        a.extend(args);
        // A refused op exits 1, a bad command line 2.
        let e = cli(&store, &a, if code.starts_with("op.") { 1 } else { 2 });
        assert_eq!(e["error"]["code"], code, "{a:?}: {e}");
    }
    let e = cli(&store, &["revoke", &id, "g1"], 1);
    assert_eq!(e["error"]["code"], "op.unknown_standing_approval", "{e}");

    let g1 = cli(
        &store,
        &[
            "allow",
            &id,
            "--tool",
            "step",
            "--when",
            r#"{"properties": {"n": {"maximum": 5}}}"#,
        ],
        0,
    );
    assert_eq!(
        (g1["status"].as_str(), g1["covers"]["scope"].as_str()),
        (Some("recorded"), Some("tool")),
        "{g1}"
    );
    let g2 = cli(
        &store,
        &["allow", &id, "--call", "1", "--with-dependents"],
        0,
    );
    let listed: Vec<u64> = g2["covers"]["calls"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["call"].as_u64())
        .collect();
    assert_eq!(listed, [1, 2], "the call and the gate waiting on it: {g2}");

    // Resumed (nobody to answer: only the standing approvals can approve), killed while the gate runs.
    killed_at_the_gate(
        &store,
        &svc,
        &[
            "resume".as_ref(),
            id.as_ref(),
            "--json".as_ref(),
            "--detach".as_ref(),
        ],
    )
    .await;
    let r = cli(&store, &["revoke", &id, "g2"], 0);
    assert_eq!(r["status"], "recorded", "{r}");
    resumed_to_the_end(&store, &svc, &id);

    let audit = cli(&store, &["show", &id, "--audit", "--json"], 0);
    let given: Vec<(&str, &str)> = entries(&audit, "allow")
        .iter()
        .map(|g| {
            (
                g["standing"].as_str().unwrap_or(""),
                g["channel"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(given, [("g1", "cli"), ("g2", "cli")], "{audit}");
    let revoked = entries(&audit, "revoke");
    assert_eq!(
        (
            revoked.len(),
            revoked[0]["standing"].as_str(),
            revoked[0]["channel"].as_str()
        ),
        (1, Some("g2"), Some("cli")),
        "{audit}"
    );
    let decided: Vec<(u64, &str, &str)> = entries(&audit, "decision")
        .iter()
        .map(|d| {
            (
                d["call_id"].as_u64().unwrap_or(0),
                d["decision"].as_str().unwrap_or(""),
                d["standing"].as_str().unwrap_or("-"),
            )
        })
        .collect();
    assert_eq!(
        decided,
        [
            (1, "approve", "g1"),
            (2, "approve", "g2"),
            (3, "approve", "g1")
        ],
        "{audit}"
    );
    assert_eq!(audit["standing"][0]["calls"], json!([1, 3]), "{audit}");
    assert_eq!(audit["standing"][1]["calls"], json!([2]), "{audit}");
    assert_eq!(audit["standing"][1]["revoked"], true, "{audit}");
}

/// R7-R9: "approve this call and the calls waiting on it, as presented" through the API covers
/// exactly the listed calls (1, 2, 3), not the independent one (4) nor one added later (5);
/// standing approvals are listed with the calls they covered, revoked, and audited with their principal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subgraph_approval_covers_exactly_the_calls_presented() {
    let svc = desk::gated_service().await;
    let dir = tempfile::tempdir().expect("dir");
    let s = Server::start(&dir.path().join("runs.db"), None);
    let goal = chain_goal(dir.path(), &format!("{}/step", svc.base));
    let id = create(&s, &json!({"goal": goal})).await;
    let v = until(&s, &id, |v| {
        let a = awaiting(v);
        ids(&a) == [1, 4] && a[0]["downstream"].as_array().map(Vec::len) == Some(2)
    })
    .await;
    let first = &awaiting(&v)[0];
    assert_eq!(first["rule"], "policy:ask", "{first}");
    let mut calls = vec![json!({"call": 1, "params_hash": first["params_hash"]})];
    for d in first["downstream"].as_array().into_iter().flatten() {
        calls.push(json!({"call": d["call_id"], "params_hash": d["params_hash"]}));
    }
    assert_eq!(
        ids(first["downstream"].as_array().unwrap()),
        [2, 3],
        "{first}"
    );
    // A hash that is not what was presented covers nothing.
    let (st, g) = send(client().post(s.url(&format!("/runs/{id}/grants"))).json(
        &json!({"scope": "calls", "calls": [{"call": 4, "params_hash": "0000000000000000"}]}),
    ))
    .await;
    assert_eq!((st, g["grant"].as_str()), (200, Some("g1")), "{g}");
    // The routes are `/runs/{id}/standing`; `/runs/{id}/grants` (their old name) still answers.
    let (st, g) = send(
        client()
            .post(s.url(&format!("/runs/{id}/standing")))
            .json(&json!({"scope": "calls", "calls": calls})),
    )
    .await;
    assert_eq!(
        (st, g["standing"].as_str(), g["grant"].as_str()),
        (200, Some("g2"), Some("g2")),
        "{g}"
    );
    // Calls 1-3 ran without a reviewer; 4 (not listed) still waits.
    let v = until(&s, &id, |v| {
        ids(&awaiting(v)) == [4]
            && v["calls"]
                .as_array()
                .is_some_and(|c| c.iter().filter(|c| c["status"] == "done").count() == 3)
    })
    .await;
    assert_eq!(
        v["standing"][1]["calls"],
        json!([1, 2, 3]),
        "{}",
        v["standing"]
    );
    assert_eq!(v["standing"][0]["calls"], json!([]), "{}", v["standing"]);
    // The run's description names them `standing`; `grants` repeats it for one release, and
    // a call's `decided_by_grant` its `decided_by_standing`.
    assert_eq!(v["grants"], v["standing"], "{v}");
    let call1 = &v["calls"].as_array().expect("calls")[0];
    assert_eq!(
        (
            call1["decided_by_standing"].as_str(),
            call1["decided_by_grant"].as_str()
        ),
        (Some("g2"), Some("g2")),
        "{call1}"
    );
    // A tool standing approval that covers nothing here, given and revoked.
    let (st, g) = send(client().post(s.url(&format!("/runs/{id}/grants"))).json(&json!({
        "scope": "tool", "tool": "step", "when": {"properties": {"n": {"const": 999}}, "required": ["n"]}}))).await;
    assert_eq!((st, g["grant"].as_str()), (200, Some("g3")), "{g}");
    let (st, r) = send(
        client()
            .delete(s.url(&format!("/runs/{id}/standing/g3")))
            .json(&json!({})),
    )
    .await;
    assert_eq!(st, 200, "{r}");
    serve::refused(
        send(
            client()
                .delete(s.url(&format!("/runs/{id}/grants/g3")))
                .json(&json!({})),
        )
        .await,
        404,
        "op.unknown_standing_approval",
    );
    serve::refused(
        send(
            client()
                .post(s.url(&format!("/runs/{id}/grants")))
                .json(&json!({"scope": "tool", "tool": "nope"})),
        )
        .await,
        422,
        "op.invalid_standing_approval",
    );
    // Call 4 by a `subgraph` standing approval (the calls approval the server reads off the run: call 4 as
    // presented, nothing waits on it), after refusals: a hash it was not presented with, a
    // call that does not await a decision.
    let v = until(&s, &id, |v| ids(&awaiting(v)) == [4]).await;
    let old_route = s.url(&format!("/runs/{id}/grants"));
    serve::refused(
        send(
            client()
                .post(&old_route)
                .json(&json!({"scope": "subgraph", "call": 4, "presented": "0000000000000000"})),
        )
        .await,
        409,
        "op.stale",
    );
    serve::refused(
        send(
            client()
                .post(&old_route)
                .json(&json!({"scope": "subgraph", "call": 1})),
        )
        .await,
        409,
        "op.already_decided",
    );
    let (st, g) = send(client().post(&old_route).json(
        &json!({"scope": "subgraph", "call": 4, "presented": awaiting(&v)[0]["params_hash"]}),
    ))
    .await;
    assert_eq!((st, g["grant"].as_str()), (200, Some("g4")), "{g}");
    // Call 5, added by the model later, waits for a reviewer: none covers it.
    until(&s, &id, |v| ids(&awaiting(v)) == [5]).await;
    serve::approve(&s, &id, 5).await;
    let v = until(&s, &id, |v| v["status"] == "succeeded").await;
    assert_eq!(v["output"], json!({"d": 40}), "{v}");
    let (st, audit) = send(client().get(s.url(&format!("/runs/{id}/audit")))).await;
    assert_eq!(st, 200, "{audit}");
    let decisions: Vec<(u64, Option<String>, String)> = audit
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["what"] == "decision")
        .map(|e| {
            assert_eq!(
                (e["principal"].as_str(), e["channel"].as_str()),
                (Some("local"), Some("http")),
                "{e}"
            );
            (
                e["call_id"].as_u64().unwrap_or(0),
                e["standing"].as_str().map(String::from),
                e["decision"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    let mut sorted = decisions.clone();
    sorted.sort();
    let g2 = Some("g2".to_string());
    assert_eq!(
        sorted,
        vec![
            (1, g2.clone(), "approve".into()),
            (2, g2.clone(), "approve".into()),
            (3, g2, "approve".into()),
            (4, Some("g4".to_string()), "approve".into()),
            (5, None, "approve".into()),
        ],
        "{audit}"
    );
    let whats: Vec<&str> = audit
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["what"].as_str())
        .collect();
    assert_eq!(
        whats.iter().filter(|w| **w == "allow").count(),
        4,
        "{audit}"
    );
    assert_eq!(
        whats.iter().filter(|w| **w == "revoke").count(),
        1,
        "{audit}"
    );
}

/// R10 and R12: a call cut off by a `kill -9` of the server is presented again as interrupted
/// (the webhook hears of it, like of every request, retried after refusals); a reviewer marks it
/// done with a supplied result, which the run goes on with. Marking a call that was not
/// interrupted done is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_call_is_marked_done_and_the_webhook_hears_of_requests() {
    let svc = desk::gated_service().await;
    let hook = desk::receiver(2).await;
    let dir = tempfile::tempdir().expect("dir");
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(bin::open_config()).expect("config"))
            .expect("json");
    config["notify"] = json!({"webhook": {"url": hook.url, "backoff_ms": 100, "attempts": 6,
        "page_url": "http://desk.example"}});
    let config = write(dir.path(), "config.json", &config);
    let script = json!({"turns": [
        turn(json!([{"_tool": "step", "n": 1, "_outputPath": "†state.a"},
                    {"_tool": "gate", "after": "†state.a", "_outputPath": "†state.g"}]), Value::Null),
        turn(json!([]), json!({"g": "†state.g"}))
    ]});
    let sp = write(dir.path(), "s.json", &script);
    let goal = json!({"goal": "done", "model": format!("scripted:{}", sp.display()),
        "output_schema": {"type": "object", "required": ["g"]},
        "tools": [desk::http_tool("step", &format!("{}/step", svc.base), false),
                  desk::http_tool("gate", &format!("{}/gate", svc.base), false)],
        "approval": {"policy": "ask"}});
    let store = dir.path().join("runs.db");
    let mut s = Server::start_config(&store, &config, None, |c| {
        c.env("DAGLOOP_LEASE_MS", "300");
    });
    let id = create(&s, &json!({"goal": goal})).await;
    until(&s, &id, |v| ids(&awaiting(v)) == [1]).await;
    // Not interrupted: it cannot be marked done.
    serve::refused(
        send(
            client()
                .post(s.url(&format!("/runs/{id}/approvals/1")))
                .json(&json!({"decision": "done", "result": 1})),
        )
        .await,
        422,
        "op.invalid_decision",
    );
    for (c, delivered) in [(1, 3), (2, 4)] {
        until(&s, &id, |v| ids(&awaiting(v)) == [c]).await;
        // The request reached the webhook (for call 1 after two refused tries) while it waits.
        hook_got(&hook, delivered).await;
        serve::approve(&s, &id, c).await;
    }
    desk::gate_hit(&svc).await;
    s.kill(); // SIGKILL while the gate call runs
    let s = Server::start_config(&store, &config, None, |_| {});
    let v = until(&s, &id, |v| {
        awaiting(v)
            .first()
            .is_some_and(|a| a["call_id"] == 2 && a["interrupted"] == true)
    })
    .await;
    let a = &awaiting(&v)[0];
    assert_eq!(
        a["default_decision"], "reject",
        "the default is shown with the call: {a}"
    );
    let (st, r) = send(client().post(s.url(&format!("/runs/{id}/approvals/2")))
        .json(&json!({"decision": "done", "result": {"receipt": "R-17"}, "presented": a["params_hash"]}))).await;
    assert_eq!(st, 200, "{r}");
    let v = until(&s, &id, |v| v["status"] == "succeeded").await;
    assert_eq!(v["output"], json!({"g": {"receipt": "R-17"}}), "{v}");
    // The gate ran once (the hung call); marking it done did not run it again.
    let (_, audit) = send(client().get(s.url(&format!("/runs/{id}/audit")))).await;
    assert!(
        audit
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["call_id"] == 2 && e["decision"] == "done" && e["channel"] == "http"),
        "{audit}"
    );
    // The webhook: requests for calls 1 and 2 (and 2 again, interrupted, after the restart),
    // the first two deliveries refused and retried.
    hook_got(&hook, 5).await;
    {
        let got = hook.got.lock().expect("got").clone();
        let calls: Vec<(u64, bool)> = got
            .iter()
            .skip(2)
            .map(|(_, b)| {
                (
                    b["call_id"].as_u64().unwrap_or(0),
                    b["text"].as_str().unwrap_or("").contains("interrupted"),
                )
            })
            .collect();
        if calls.len() >= 3 {
            assert_eq!(calls, vec![(1, false), (2, false), (2, true)], "{got:?}");
            // The refused deliveries were the first request, tried again.
            assert_eq!(got[0].1, got[1].1);
            assert_eq!(got[0].1, got[2].1);
            let b = &got[2].1;
            assert_eq!(
                (
                    b["event"].as_str(),
                    b["run_id"].as_str(),
                    b["tool"].as_str()
                ),
                (Some("approval_requested"), Some(id.as_str()), Some("step")),
                "{b}"
            );
            assert_eq!(
                b["link"],
                json!(format!("http://desk.example/?run={id}&call=1")),
                "{b}"
            );
            assert!(
                b["text"].as_str().unwrap().contains(&id) && b["blocks"][0]["type"] == "section",
                "{b}"
            );
            assert!(
                got[2].0 - got[0].0 >= Duration::from_millis(300),
                "backoff 100 ms then 200 ms"
            );
        } else {
            panic!("the webhook got {got:?}");
        }
    }
}

/// The operator's config (the tests' open one) with `notify.webhook` = `webhook`, written in `dir`.
fn config_with(dir: &Path, name: &str, webhook: Value) -> std::path::PathBuf {
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(bin::open_config()).expect("config"))
            .expect("json");
    config["notify"] = json!({ "webhook": webhook });
    write(dir, name, &config)
}

/// The calls of the deliveries a receiver answered (every one but the first `refused`), with
/// their links, after checking each is an `approval_requested` of `run`.
fn delivered(hook: &desk::Receiver, refused: usize, run: &str) -> Vec<(u64, Value)> {
    let got = hook.got.lock().expect("got").clone();
    got.iter()
        .skip(refused)
        .map(|(_, b)| {
            assert_eq!(
                (
                    b["event"].as_str(),
                    b["run_id"].as_str(),
                    b["tool"].as_str()
                ),
                (Some("approval_requested"), Some(run), Some("step")),
                "{b}"
            );
            (b["call_id"].as_u64().unwrap_or(0), b["link"].clone())
        })
        .collect()
}

/// R12 beyond `serve`: `dagloop run` and `resume` given an operator config with
/// `notify.webhook` post each call they present (retried after a refusal) before the process
/// ends; with no `page_url` the body has no link, with one it links to that page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_and_resume_tell_the_operators_webhook() {
    let svc = desk::gated_service().await;
    let hook = desk::receiver(1).await;
    let dir = tempfile::tempdir().expect("dir");
    let goal = write(
        dir.path(),
        "goal.json",
        &chain_goal(dir.path(), &format!("{}/step", svc.base)),
    );
    let store = dir.path().join("runs.db");
    let plain = config_with(
        dir.path(),
        "plain.json",
        json!({"url": hook.url, "backoff_ms": 50}),
    );
    let (plain, goal) = (plain.display().to_string(), goal.display().to_string());
    let waiting = cli(
        &store,
        &["--config", &plain, "run", &goal, "--json", "--detach"],
        0,
    );
    let id = waiting["run_id"].as_str().expect("run id").to_string();
    assert_eq!(
        ids(waiting["awaiting"].as_array().unwrap()),
        [1, 4],
        "{waiting}"
    );
    // Delivered before the process ended (the first try refused, then tried again).
    let mut first = delivered(&hook, 1, &id);
    first.sort_by_key(|d| d.0);
    assert_eq!(
        first,
        [(1, Value::Null), (4, Value::Null)],
        "no page, no link: {:?}",
        hook.got.lock().expect("got")
    );
    let text = hook.got.lock().expect("got")[1].1["text"].clone();
    assert!(
        text.as_str()
            .is_some_and(|t| t.contains(&id) && t.contains("dagloop decide")),
        "{text}"
    );
    let linked = config_with(
        dir.path(),
        "linked.json",
        json!({"url": hook.url, "backoff_ms": 50, "page_url": "http://desk.example/"}),
    );
    let decisions = write(
        dir.path(),
        "decisions.json",
        &json!({"decisions": [{"tool": "step", "decision": "approve"}]}),
    );
    let before = hook.got.lock().expect("got").len();
    let done = cli(
        &store,
        &[
            "--config",
            &linked.display().to_string(),
            "resume",
            &id,
            "--json",
            "--decisions",
            &decisions.display().to_string(),
        ],
        0,
    );
    assert_eq!(done["output"], json!({"d": 40}), "{done}");
    let later: std::collections::BTreeMap<u64, Value> =
        delivered(&hook, before, &id).into_iter().collect();
    for c in [2, 3, 5] {
        assert_eq!(
            later.get(&c),
            Some(&json!(format!("http://desk.example/?run={id}&call={c}"))),
            "call {c} presented after resuming: {later:?}"
        );
    }
}

/// Waits (bounded) until the webhook receiver got `n` deliveries.
async fn hook_got(hook: &desk::Receiver, n: usize) {
    for _ in 0..1200 {
        if hook.got.lock().expect("got").len() >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the webhook got {:?}", hook.got.lock().expect("got"));
}

/// Journals written before a reviewer's standing approval got its own name (it was called a
/// grant: inputs `{"input": "grant", "grant": SPEC}` and `{"input": "revoke", "grant": ID}`)
/// load as they did: a run given two standing approvals from the command line, one revoked,
/// whose journal is rewritten to the old spelling, shows the same audit and replays identically.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_from_before_the_standing_approval_rename_loads() {
    let svc = desk::gated_service().await;
    let dir = tempfile::tempdir().expect("dir");
    let goal = write(
        dir.path(),
        "goal.json",
        &chain_goal(dir.path(), &format!("{}/step", svc.base)),
    );
    let store = dir.path().join("runs.db");
    let goal_arg = goal.display().to_string();
    let waiting = cli(&store, &["run", &goal_arg, "--json", "--detach"], 0);
    let id = waiting["run_id"].as_str().expect("run id").to_string();
    cli(
        &store,
        &["grant", &id, "--call", "1", "--with-dependents"],
        0,
    );
    let parked = cli(&store, &["resume", &id, "--json", "--detach"], 0);
    assert_eq!(parked["status"], "waiting", "{parked}");
    // `dagloop allow` is the command's name; `grant` (above) its hidden old one.
    cli(&store, &["allow", &id, "--tool", "step"], 0);
    cli(&store, &["revoke", &id, "g1"], 0);
    let done = cli(
        &store,
        &["resume", &id, "--json", "--on-no-reviewer", "reject"],
        0,
    );
    assert_eq!(done["output"]["d"], json!(40), "{done}");
    let before = cli(&store, &["show", &id, "--audit", "--json"], 0);

    let c = rusqlite::Connection::open(&store).expect("open");
    let rewritten = c
        .execute(
            "UPDATE journal SET inputs = replace(replace(replace(inputs, \
             '\"input\":\"allow\",\"standing\":', '\"input\":\"grant\",\"grant\":'), \
             '\"input\":\"revoke\",\"standing\":', '\"input\":\"revoke\",\"grant\":'), \
             '\"standing\":', '\"grant\":') WHERE run_id = ?1 AND inputs LIKE '%\"standing\":%'",
            [&id],
        )
        .expect("rewrite");
    assert!(rewritten >= 2, "the journal held the standing approvals");
    let old: i64 = c
        .query_row(
            "SELECT count(*) FROM journal WHERE run_id = ?1 AND inputs LIKE '%\"input\":\"grant\",\"grant\":%'",
            [&id],
            |r| r.get(0),
        )
        .expect("count");
    assert!(old >= 1, "rewritten to the old spelling");
    drop(c);

    let after = cli(&store, &["show", &id, "--audit", "--json"], 0);
    assert_eq!(after, before, "the old journal shows the same audit");
    assert_eq!(
        after["standing"].as_array().map(Vec::len),
        Some(2),
        "{after}"
    );
    let replay = cli(&store, &["replay", &id], 0);
    assert_eq!(replay["status"], "identical", "{replay}");
}
