//! The reviewer's desk through the binary (spec/approval.md R5-R10): a run-wide grant given in a
//! decisions file survives `kill -9` and resume; a sub-graph approval through the API covers
//! exactly the calls presented, not one added later; grants are revoked; an interrupted call is
//! marked done with a supplied result; every decision is in the audit with its principal,
//! channel and rule or grant; the operator's webhook receives `approval_requested`, retried.

#[path = "common/bin.rs"]
mod bin;
#[path = "common/desk.rs"]
mod desk;
#[path = "common/serve.rs"]
mod serve;

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use serve::{Server, awaiting, client, create, send, until};

fn write(dir: &Path, name: &str, v: &Value) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, v.to_string()).expect("write");
    p
}

fn turn(calls: Value, output: Value) -> Value {
    json!({"solution": {"calls": calls, "output": output}, "chunk_chars": 40, "chunk_delay_ms": 1})
}

fn run_id(stderr: &[u8]) -> String {
    String::from_utf8_lossy(stderr)
        .lines()
        .find_map(|l| {
            serde_json::from_str::<Value>(l).ok()?["run_id"]
                .as_str()
                .map(String::from)
        })
        .expect("the run id on stderr")
}

/// R6: the terminal's "approve every call of this tool", given as a decisions-file grant, is
/// journaled: after SIGKILL mid-call and `resume` with no reviewer (anything not covered would
/// be rejected), a later call of the tool is approved by that grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_wide_grant_survives_kill_9_and_resume() {
    let svc = desk::gated_service().await;
    let dir = tempfile::tempdir().expect("dir");
    let script = json!({"turns": [
        turn(json!([{"_tool": "step", "n": 1, "_outputPath": "†state.a"},
                    {"_tool": "gate", "after": "†state.a", "_outputPath": "†state.g"}]), Value::Null),
        turn(json!([{"_tool": "step", "n": 2, "_outputPath": "†state.b"}]), Value::Null),
        turn(json!([]), json!({"total": "†state.b"}))
    ]});
    let s = write(dir.path(), "s.json", &script);
    let goal = write(
        dir.path(),
        "goal.json",
        &json!({"goal": "grant", "model": format!("scripted:{}", s.display()),
        "output_schema": {"type": "object", "required": ["total"]},
        "tools": [desk::http_tool("step", &format!("{}/step", svc.base), false),
                  desk::http_tool("gate", &format!("{}/gate", svc.base), true)],
        "approval": {"policy": "ask"}}),
    );
    let decisions = write(
        dir.path(),
        "decisions.json",
        &json!({"decisions": [
            {"grant": {"scope": "tool", "tool": "step"}},
            {"tool": "gate", "decision": "approve"}
        ]}),
    );
    let store = dir.path().join("runs.db");
    let mut child = bin::dagloop()
        .env("DAGLOOP_STORE", &store)
        .env("DAGLOOP_LEASE_MS", "200")
        .args(["run"])
        .arg(&goal)
        .args(["--json", "--decisions"])
        .arg(&decisions)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run");
    desk::gate_hit(&svc).await;
    child.kill().expect("SIGKILL");
    let out = child.wait_with_output().expect("wait");
    let id = run_id(&out.stderr);
    tokio::time::sleep(Duration::from_millis(300)).await; // the lease runs out
    let out = bin::dagloop()
        .env("DAGLOOP_STORE", &store)
        .args(["resume", &id, "--json", "--on-no-reviewer", "reject"])
        .output()
        .expect("resume");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let result: Value = serde_json::from_slice(&out.stdout).expect("json");
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
    let out = bin::dagloop()
        .env("DAGLOOP_STORE", &store)
        .args(["show", &id, "--audit", "--json"])
        .output()
        .expect("show");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let audit: Value = serde_json::from_slice(&out.stdout).expect("json");
    let entries = audit["audit"].as_array().cloned().unwrap_or_default();
    let grants: Vec<&Value> = entries.iter().filter(|e| e["what"] == "grant").collect();
    assert_eq!(grants.len(), 1, "the grant is journaled once: {audit}");
    assert_eq!(grants[0]["channel"], "decisions_file", "{audit}");
    let steps: Vec<&Value> = entries
        .iter()
        .filter(|e| e["what"] == "decision" && e["tool"] == "step")
        .collect();
    assert_eq!(steps.len(), 2, "{audit}");
    for d in steps {
        assert_eq!(
            (d["decision"].as_str(), d["grant"].as_str()),
            (Some("approve"), Some("g1")),
            "{audit}"
        );
        assert_eq!(d["rule"], "policy:ask", "the rule that asked: {audit}");
    }
    assert_eq!(
        audit["grants"][0]["calls"].as_array().map(Vec::len),
        Some(2),
        "{audit}"
    );
    // The people's view lists them too.
    let out = bin::dagloop()
        .env("DAGLOOP_STORE", &store)
        .args(["show", &id, "--audit"])
        .output()
        .expect("show");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("grant g1") && text.contains("(decisions_file)"),
        "{text}"
    );
}

fn chain_goal(dir: &Path, url: &str) -> Value {
    let script = json!({"turns": [
        turn(json!([
            {"_tool": "step", "n": 1, "_outputPath": "†state.a"},
            {"_tool": "step", "n": 2, "after": "†state.a.v", "_outputPath": "†state.b"},
            {"_tool": "step", "n": 3, "after": "†state.b.v", "_outputPath": "†state.c"},
            {"_tool": "step", "n": 9, "_outputPath": "†state.z"}
        ]), Value::Null),
        turn(json!([{"_tool": "step", "n": 4, "after": "†state.c.v", "_outputPath": "†state.d"}]), Value::Null),
        turn(json!([]), json!({"d": "†state.d.v"}))
    ]});
    let s = write(dir, "s.json", &script);
    json!({"goal": "chain", "model": format!("scripted:{}", s.display()),
        "output_schema": {"type": "object", "required": ["d"]},
        "tools": [desk::http_tool("step", url, false)], "approval": {"policy": "ask"}})
}

fn ids(list: &[Value]) -> Vec<u64> {
    list.iter().filter_map(|a| a["call_id"].as_u64()).collect()
}

/// R7-R9: "approve this call and the calls waiting on it, as presented" through the API covers
/// exactly the listed calls (1, 2, 3), not the independent one (4) nor one added later (5);
/// grants are listed with the calls they covered, revoked, and audited with their principal.
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
    let (st, g) = send(
        client()
            .post(s.url(&format!("/runs/{id}/grants")))
            .json(&json!({"scope": "calls", "calls": calls})),
    )
    .await;
    assert_eq!((st, g["grant"].as_str()), (200, Some("g2")), "{g}");
    // Calls 1-3 ran without a reviewer; 4 (not listed) still waits.
    let v = until(&s, &id, |v| {
        ids(&awaiting(v)) == [4]
            && v["calls"]
                .as_array()
                .is_some_and(|c| c.iter().filter(|c| c["status"] == "done").count() == 3)
    })
    .await;
    assert_eq!(v["grants"][1]["calls"], json!([1, 2, 3]), "{}", v["grants"]);
    assert_eq!(v["grants"][0]["calls"], json!([]), "{}", v["grants"]);
    // A tool grant that covers nothing here, given and revoked.
    let (st, g) = send(client().post(s.url(&format!("/runs/{id}/grants"))).json(&json!({
        "scope": "tool", "tool": "step", "when": {"properties": {"n": {"const": 999}}, "required": ["n"]}}))).await;
    assert_eq!((st, g["grant"].as_str()), (200, Some("g3")), "{g}");
    let (st, r) = send(
        client()
            .delete(s.url(&format!("/runs/{id}/grants/g3")))
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
        "op.unknown_grant",
    );
    serve::refused(
        send(
            client()
                .post(s.url(&format!("/runs/{id}/grants")))
                .json(&json!({"scope": "tool", "tool": "nope"})),
        )
        .await,
        422,
        "op.invalid_grant",
    );
    // Call 5, added by the model later, waits for a reviewer: no grant covers it.
    for c in [4, 5] {
        until(&s, &id, |v| ids(&awaiting(v)) == [c]).await;
        let (st, r) = send(
            client()
                .post(s.url(&format!("/runs/{id}/approvals/{c}")))
                .json(&json!({"decision": "approve"})),
        )
        .await;
        assert_eq!(st, 200, "{r}");
    }
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
                e["grant"].as_str().map(String::from),
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
            (4, None, "approve".into()),
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
        whats.iter().filter(|w| **w == "grant").count(),
        3,
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
        let (st, r) = send(
            client()
                .post(s.url(&format!("/runs/{id}/approvals/{c}")))
                .json(&json!({"decision": "approve"})),
        )
        .await;
        assert_eq!(st, 200, "{r}");
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
