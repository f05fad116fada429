//! The operator's approval floor (issue 47, deliverable 1; spec/approval.md R16-R20), attacked
//! as a client of `dagloop serve` would, over real HTTP on 127.0.0.1 against the real binary
//! with an operator config: nothing a client sends makes a call the floor asks about run
//! without a reviewer.
//!
//! - A submit-only client's `approve: auto` on a published agent whose goal asks: the calls
//!   wait for a reviewer; the counting service sees nothing until one approves.
//! - An operator MCP server's `approval = {delete_all = "always"}` (a server that counts the
//!   calls it gets) against a goal's map `{delete_all: never}`, a goal rule `{tool: "*",
//!   decision: "allow"}`, a reviewer timeout of 0.01 s that approves by default, and `approve:
//!   auto`: the call waits, and the server counts none.
//! - A tool-kind floor (`[approval] kinds = {http = "ask"}`) against the same tricks with an
//!   http tool: every call waits, the counting service sees none, and the floor is kept with
//!   the run across a restart under a config without it.
//! - Separation of duties: the submitter may not decide nor approve ahead its own run's calls.
//! - A published agent runs only on the models its operator lists.
//! - `dagloop policy explain` names the layer that decided.

#[path = "common/bin.rs"]
mod bin;
#[path = "common/serve.rs"]
mod serve;

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use serve::{Server, awaiting, client, counting_service, refused, send};

const CI: &str = "token-of-ci";
const ALICE: &str = "token-of-alice";
const DUAL: &str = "token-of-dual";

fn principal(name: &str, token: &str, roles: &[&str]) -> Value {
    json!({"name": name, "token_sha256": dagloop::server::token_sha256(token), "roles": roles})
}

/// `ci` submits, `alice` reviews, `dual` does both.
fn principals() -> Value {
    json!([
        principal("ci", CI, &["submit"]),
        principal("alice", ALICE, &["review"]),
        principal("dual", DUAL, &["submit", "review"]),
    ])
}

/// Writes an operator config granting http tools on loopback, the operator's MCP servers and
/// files under `dir`, with `extra` merged in at the top level.
fn config(dir: &Path, name: &str, extra: Value) -> PathBuf {
    let mut c = json!({
        "grants": {"tools": ["http", "mcp"], "egress": {"private": true},
                   "files": [dir.display().to_string()]},
        "principals": principals(),
    });
    if let (Some(m), Value::Object(e)) = (c.as_object_mut(), extra) {
        m.extend(e);
    }
    let path = dir.join(name);
    std::fs::write(&path, c.to_string()).expect("config");
    path
}

/// The calls awaiting a decision, by id, with the rule that asked.
fn asked(run: &Value) -> Vec<(u64, String)> {
    awaiting(run)
        .iter()
        .map(|a| {
            (
                a["call_id"].as_u64().unwrap_or(0),
                a["rule"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

async fn post_as(s: &Server, token: &str, path: &str, body: &Value) -> (u16, Value) {
    send(client().post(s.url(path)).bearer_auth(token).json(body)).await
}

async fn submit_as(s: &Server, token: &str, body: &Value) -> String {
    let (status, v) = post_as(s, token, "/runs", body).await;
    assert_eq!(status, 201, "{v}");
    v["id"].as_str().expect("id").to_string()
}

/// Polls run `id` as `token` until `pred` holds (bounded).
async fn until_as(s: &Server, token: &str, id: &str, pred: impl Fn(&Value) -> bool) -> Value {
    for _ in 0..400 {
        let (status, v) = send(
            client()
                .get(s.url(&format!("/runs/{id}")))
                .bearer_auth(token),
        )
        .await;
        assert_eq!(status, 200, "{v}");
        if pred(&v) {
            return v;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    let (_, v) = send(
        client()
            .get(s.url(&format!("/runs/{id}")))
            .bearer_auth(token),
    )
    .await;
    panic!("run {id} never reached the expected state: {v}");
}

/// The status of call `id` in a run's description.
fn status_of(run: &Value, id: u64) -> String {
    run["calls"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["id"] == id))
        .and_then(|c| c["status"].as_str())
        .unwrap_or("")
        .to_string()
}

/// The npm MCP server `everything` (scripts/setup-mcp.sh), or None when MCP tests are skipped.
fn everything() -> Option<PathBuf> {
    if std::env::var("DAGLOOP_SKIP_MCP").as_deref() == Ok("1") {
        eprintln!("tests/approval_floor.rs: MCP case SKIPPED (DAGLOOP_SKIP_MCP=1)");
        return None;
    }
    let dir = std::env::var_os("DAGLOOP_MCP_NPM")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/dagloop/npm")))
        .unwrap_or_default();
    let bin = dir.join("node_modules/.bin/mcp-server-everything");
    assert!(
        bin.exists(),
        "{} is not installed: run scripts/setup-mcp.sh (or set DAGLOOP_SKIP_MCP=1)",
        bin.display()
    );
    Some(bin)
}

/// `dagloop serve` publishing the agent `refunds`: [`serve::goal`]'s two calls, asking about
/// every call.
fn refunds_agent(dir: &Path, url: &str) -> Server {
    let agent = serve::goal(dir, url, "ask");
    std::fs::write(dir.join("refunds.json"), agent.to_string()).expect("agent");
    let cfg = config(
        dir,
        "config.json",
        json!({"agents": {"refunds": {"goal": "refunds.json"}}}),
    );
    Server::start_config(&dir.join("runs.db"), &cfg, None, |_| {})
}

/// The attack of the issue: a submit-only principal runs the operator's published agent, whose
/// goal asks about every call, with `"approve": "auto"`. Both calls wait for a reviewer (the
/// agent goal's policy is the floor's), the counting service sees nothing, and a reviewer's
/// approval runs exactly the call it approved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_approve_auto_on_a_published_agent_waits_for_a_reviewer() {
    let (url, counts) = counting_service().await;
    let dir = tempfile::tempdir().expect("tmp");
    let s = refunds_agent(dir.path(), &url);
    let id = submit_as(
        &s,
        CI,
        &json!({"agent": "refunds", "input": {"amount": 5000}, "approve": "auto"}),
    )
    .await;
    let run = until_as(&s, CI, &id, |v| awaiting(v).len() == 2).await;
    let rule = "floor:agent:refunds:goal/policy:ask".to_string();
    assert_eq!(asked(&run), [(1, rule.clone()), (2, rule)], "{run}");
    assert!(counts.lock().expect("counts").is_empty());
    // A reviewer decides: the approved call runs, the other still waits.
    let (status, v) = post_as(
        &s,
        ALICE,
        &format!("/runs/{id}/approvals/1"),
        &json!({"decision": "approve"}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let run = until_as(&s, CI, &id, |v| status_of(v, 1) == "done").await;
    assert_eq!(status_of(&run, 2), "awaiting_approval", "{run}");
    assert_eq!(
        counts.lock().expect("counts").clone(),
        [(1, 1)].into_iter().collect()
    );
}

/// The goal of [`serve::goal`] with its approval and its tool changed by `tweak`.
fn client_goal(dir: &Path, url: &str, tweak: impl FnOnce(&mut Value)) -> Value {
    let mut g = serve::goal(dir, url, "auto");
    tweak(&mut g);
    g
}

/// `[approval] kinds = {http = "ask"}`: a client's `approve: auto`, a rule allowing everything,
/// a tool's own `_approval: never` and a 0.01 s reviewer timeout that approves by default each
/// leave both http calls waiting for a reviewer, under the floor's rule and with no deadline;
/// the counting service sees no call. After a restart under a config without the floor, the
/// stored run still waits (the floor is kept with the run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_a_client_sends_lowers_a_tool_kind_floor() {
    let (url, counts) = counting_service().await;
    let dir = tempfile::tempdir().expect("tmp");
    let cfg = config(
        dir.path(),
        "config.json",
        json!({"approval": {"kinds": {"http": "ask"}}}),
    );
    let store = dir.path().join("runs.db");
    let mut s = Server::start_config(&store, &cfg, None, |_| {});
    let tricks: Vec<(&str, Value)> = vec![
        ("approve auto", {
            let g = client_goal(dir.path(), &url, |_| {});
            json!({"goal": g, "approve": "auto"})
        }),
        (
            "a rule allowing every tool",
            client_goal(dir.path(), &url, |g| {
                g["approval"] = json!({"rules": [{"tool": "*", "decision": "allow"}]});
            }),
        ),
        (
            "the tool's own _approval: never",
            client_goal(dir.path(), &url, |g| {
                g["tools"][0]["_approval"] = json!("never")
            }),
        ),
        (
            "a 0.01 s timeout approving by default",
            client_goal(dir.path(), &url, |g| {
                g["approval"] =
                    json!({"policy": "ask", "timeout_s": 0.01, "default_decision": "approve"});
            }),
        ),
    ];
    let mut ids = Vec::new();
    for (what, body) in &tricks {
        let id = submit_as(&s, CI, body).await;
        let run = until_as(&s, CI, &id, |v| awaiting(v).len() == 2).await;
        let rule = "floor:kind:http".to_string();
        assert_eq!(asked(&run), [(1, rule.clone()), (2, rule)], "{what}: {run}");
        for a in awaiting(&run) {
            // The floor's deadline (none: a reviewer decides), not the client's 0.01 s.
            assert_eq!(
                (&a["timeout_ms"], &a["default_decision"]),
                (&Value::Null, &json!("reject")),
                "{what}: {a}"
            );
        }
        ids.push(id);
    }
    assert!(counts.lock().expect("counts").is_empty());
    // The floor is the run's: restarted under a config that sets none, the runs still wait.
    s.kill();
    let open = config(dir.path(), "open.json", json!({}));
    let s = Server::start_config(&store, &open, None, |_| {});
    for id in &ids {
        let run = until_as(&s, CI, id, |v| awaiting(v).len() == 2).await;
        assert!(
            asked(&run).iter().all(|(_, r)| r == "floor:kind:http"),
            "{run}"
        );
    }
    assert!(counts.lock().expect("counts").is_empty());
}

/// The issue's three ways past an operator MCP server's `approval = {delete_all = "always"}`,
/// and `approve: auto`: the `delete_all` call waits for a reviewer each time, and the MCP
/// server, which counts every call it gets (`tests/fixtures/mcp/counting-server.cjs`), gets none.
/// In the timeout case, a second (http) call the goal itself asks about times out and runs after
/// 0.01 s, as the goal says, while the floor's call goes on waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_goal_cannot_lower_an_operator_mcp_tools_always() {
    let Some(bin) = everything() else {
        return;
    };
    // The npm cache's node_modules, for the counting server's MCP SDK.
    let modules = bin
        .parent()
        .and_then(Path::parent)
        .expect("node_modules")
        .to_path_buf();
    let (url, counts) = counting_service().await;
    let dir = tempfile::tempdir().expect("tmp");
    let calls_file = dir.path().join("delete_all.calls");
    let server = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/mcp/counting-server.cjs"
    );
    let cfg = config(
        dir.path(),
        "config.json",
        json!({"mcp_servers": {"counting": {"command": "node",
            "args": [server, calls_file.display().to_string()],
            "env": {"NODE_PATH": modules.display().to_string()},
            "approval": {"delete_all": "always"}}}}),
    );
    let s = Server::start_config(&dir.path().join("runs.db"), &cfg, None, |_| {});
    let script = json!({"turns": [
        {"solution": {"calls": [
            {"_tool": "delete_all", "what": "everything", "_outputPath": "†state.e"},
            {"_tool": "step", "n": 1, "_outputPath": "†state.s"}
        ], "output": null}},
        {"solution": {"calls": [], "output": {"e": "†state.e"}}}
    ]});
    let sp = dir.path().join("mcp-script.json");
    std::fs::write(&sp, script.to_string()).expect("script");
    let goal = |server: Value, approval: Value| {
        json!({"goal": "echo", "model": format!("scripted:{}", sp.display()),
            "output_schema": {"type": "object"}, "mcp_servers": [server],
            "tools": [{"_tool": "step", "_activity": "http",
                "_http": {"method": "POST", "url": url}, "type": "object",
                "properties": {"n": {"type": "integer"}}, "required": ["n"]}],
            "approval": approval})
    };
    let named = json!({"name": "counting"});
    let cases = [
        (
            "the goal's map says never",
            json!({"goal": goal(json!({"name": "counting", "approval": {"delete_all": "never"}}), json!({}))}),
        ),
        (
            "a goal rule allows every tool",
            json!({"goal": goal(named.clone(), json!({"rules": [{"tool": "*", "decision": "allow"}]}))}),
        ),
        (
            "approve auto",
            json!({"goal": goal(named.clone(), json!({})), "approve": "auto"}),
        ),
        (
            "a 0.01 s timeout approving by default",
            json!({"goal": goal(named.clone(), json!({"policy": "ask", "timeout_s": 0.01, "default_decision": "approve"}))}),
        ),
    ];
    let is = |e: &Value, kind: &str, call: u64| e["type"] == kind && e["call_id"] == call;
    for (what, body) in &cases {
        let id = submit_as(&s, CI, body).await;
        if what.contains("timeout") {
            // A reviewer's deadline starts when the call is shown (spec/reviewer.md R1): here,
            // listed by the API to a reviewer.
            until_as(&s, ALICE, &id, |v| {
                v["calls"]
                    .as_array()
                    .is_some_and(|c| c.iter().any(|c| c["id"] == 2 && !c["decision"].is_null()))
            })
            .await;
        }
        // Read from the run's live events: `GET /runs/{id}` rebuilds a run without its MCP
        // servers' tools.
        let events = serve::events_until(&s.url(&format!("/runs/{id}/events")), Some(CI), |evs| {
            evs.iter().any(|e| is(e, "approval_requested", 1))
                && evs.iter().any(|e| is(e, "finished", 2))
        })
        .await;
        let asked = events.iter().find(|e| is(e, "approval_requested", 1));
        assert_eq!(
            asked.map(|e| &e["rule"]),
            Some(&json!("floor:mcp:counting:delete_all")),
            "{what}: {events:?}"
        );
        assert!(
            !events
                .iter()
                .any(|e| is(e, "started", 1) || is(e, "decision", 1)),
            "{what}: the delete_all call ran or was decided without a reviewer: {events:?}"
        );
    }
    // Call 2 of every run ran (the goal allowed it, or its 0.01 s default approved it); the
    // MCP server never got a call.
    assert_eq!(counts.lock().expect("counts").get(&1), Some(&4));
    assert!(
        !calls_file.exists(),
        "delete_all ran: {:?}",
        std::fs::read_to_string(&calls_file)
    );
}

/// `[approval] separate_duties`: `dual` (submit and review) may neither decide nor approve ahead
/// the calls of the run it submitted (403 `approval.own_run`); `alice` may.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submitter_does_not_decide_its_own_runs_calls() {
    let (url, counts) = counting_service().await;
    let dir = tempfile::tempdir().expect("tmp");
    let cfg = config(
        dir.path(),
        "config.json",
        json!({"approval": {"separate_duties": true}}),
    );
    let s = Server::start_config(&dir.path().join("runs.db"), &cfg, None, |_| {});
    let goal = serve::goal(dir.path(), &url, "ask");
    let id = submit_as(&s, DUAL, &json!({ "goal": goal })).await;
    until_as(&s, DUAL, &id, |v| awaiting(v).len() == 2).await;
    let own = post_as(
        &s,
        DUAL,
        &format!("/runs/{id}/approvals/1"),
        &json!({"decision": "approve"}),
    )
    .await;
    refused(own, 403, "approval.own_run");
    let ahead = post_as(
        &s,
        DUAL,
        &format!("/runs/{id}/standing"),
        &json!({"scope": "tool", "tool": "step"}),
    )
    .await;
    refused(ahead, 403, "approval.own_run");
    assert!(counts.lock().expect("counts").is_empty());
    let (status, v) = post_as(
        &s,
        ALICE,
        &format!("/runs/{id}/approvals/1"),
        &json!({"decision": "approve"}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    until_as(&s, DUAL, &id, |v| status_of(v, 1) == "done").await;
}

/// A published agent runs on its goal's model or one its operator lists; a client asking for
/// another (a provider's model on the operator's key, another script in the granted folders)
/// gets 403 `server.agent_model`, and no run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_picks_only_among_the_operators_models() {
    let (url, _counts) = counting_service().await;
    let dir = tempfile::tempdir().expect("tmp");
    let agent = serve::goal(dir.path(), &url, "auto");
    std::fs::write(dir.path().join("a.json"), agent.to_string()).expect("agent");
    // Another script than the goal's own model, listed by the operator.
    let other = dir.path().join("s2.json");
    std::fs::copy(dir.path().join("s.json"), &other).expect("copy");
    let listed = format!("scripted:{}", other.display());
    let cfg = config(
        dir.path(),
        "config.json",
        json!({"agents": {"a": {"goal": "a.json", "models": [listed]}}}),
    );
    let s = Server::start_config(&dir.path().join("runs.db"), &cfg, None, |_| {});
    for model in ["openai:gpt-4o", "anthropic:claude-sonnet-4-5"] {
        let got = post_as(&s, CI, "/runs", &json!({"agent": "a", "model": model})).await;
        refused(got, 403, "server.agent_model");
    }
    let (status, runs) = send(client().get(s.url("/runs")).bearer_auth(CI)).await;
    assert_eq!((status, runs.as_array().map(Vec::len)), (200, Some(0)));
    let unlisted = dir.path().join("s3.json");
    std::fs::copy(dir.path().join("s.json"), &unlisted).expect("copy");
    let got = post_as(
        &s,
        CI,
        "/runs",
        &json!({"agent": "a", "model": format!("scripted:{}", unlisted.display())}),
    )
    .await;
    refused(got, 403, "server.agent_model");
    let id = submit_as(&s, CI, &json!({"agent": "a", "model": listed})).await;
    until_as(&s, CI, &id, |v| v["status"] == "succeeded").await;
    let own = agent["model"].as_str().expect("the goal's model");
    let id = submit_as(&s, CI, &json!({"agent": "a", "model": own})).await;
    until_as(&s, CI, &id, |v| v["status"] == "succeeded").await;
}

/// `dagloop --config FILE policy explain` says which layer decided: the operator's MCP tool,
/// the server-wide rules, the tool kind, the published agent (its config entry or its goal), or
/// the goal and the client's `--approve`.
#[test]
fn policy_explain_names_the_deciding_layer() {
    let dir = tempfile::tempdir().expect("tmp");
    let cfg = config(
        dir.path(),
        "config.json",
        json!({"mcp_servers": {"billing": {"command": "billing-mcp", "approval": {"delete_all": "always"}}},
            "approval": {"kinds": {"shell": "deny"},
                "rules": [{"name": "wires", "tool": "wire*", "decision": "ask"}]},
            "agents": {"refunds": {"goal": "goal.json",
                "approval": {"rules": [{"tool": "delete_all", "decision": "deny"}]}}}}),
    );
    let goal = json!({"goal": "g", "output_schema": {"type": "object"},
        "mcp_servers": [{"name": "billing", "approval": {"delete_all": "never"}}],
        "tools": [{"_tool": "step", "_activity": "http", "_http": {"url": "http://127.0.0.1:9/x"},
                   "type": "object"}],
        "approval": {"policy": "ask"}});
    let gp = dir.path().join("goal.json");
    std::fs::write(&gp, goal.to_string()).expect("goal");
    let explain = |args: &[&str]| -> Value {
        let out = bin::dagloop()
            .arg("--config")
            .arg(&cfg)
            .args(["policy", "explain"])
            .args(args)
            .arg("--json")
            .output()
            .expect("run dagloop");
        assert!(out.status.success(), "{out:?}");
        serde_json::from_slice(&out.stdout).expect("JSON")
    };
    let g = gp.display().to_string();
    let mcp = explain(&[
        &g,
        "--call",
        r#"{"_tool": "delete_all"}"#,
        "--approve",
        "auto",
    ]);
    assert_eq!(
        (&mcp["decision"], &mcp["layer"], &mcp["rule"], &mcp["goal"]),
        (
            &json!("ask"),
            &json!("floor:mcp"),
            &json!("floor:mcp:billing:delete_all"),
            &json!("allow by _approval")
        ),
        "{mcp}"
    );
    let client = explain(&[&g, "--call", r#"{"_tool": "step"}"#, "--approve", "auto"]);
    assert_eq!(
        (&client["decision"], &client["layer"]),
        (&json!("allow"), &json!("client")),
        "{client}"
    );
    let goal_says = explain(&[&g, "--call", r#"{"_tool": "step"}"#]);
    assert_eq!(
        (&goal_says["decision"], &goal_says["layer"]),
        (&json!("ask"), &json!("goal")),
        "{goal_says}"
    );
    let agent = explain(&[
        "--agent",
        "refunds",
        "--call",
        r#"{"_tool": "step"}"#,
        "--approve",
        "auto",
    ]);
    assert_eq!(
        (&agent["decision"], &agent["layer"], &agent["rule"]),
        (
            &json!("ask"),
            &json!("floor:agent"),
            &json!("floor:agent:refunds:goal/policy:ask")
        ),
        "{agent}"
    );
    // The server-wide layer's rule, and the agent's own layer (stricter than the MCP tool's).
    let wire = explain(&[
        &g,
        "--call",
        r#"{"_tool": "wire_out"}"#,
        "--approve",
        "auto",
    ]);
    assert_eq!(
        (&wire["decision"], &wire["layer"], &wire["rule"]),
        (
            &json!("ask"),
            &json!("floor:server"),
            &json!("floor:server/wires")
        ),
        "{wire}"
    );
    let denied = explain(&["--agent", "refunds", "--call", r#"{"_tool": "delete_all"}"#]);
    assert_eq!(
        (&denied["decision"], &denied["layer"], &denied["rule"]),
        (
            &json!("deny"),
            &json!("floor:agent"),
            &json!("floor:agent:refunds/rules[0]")
        ),
        "{denied}"
    );
    // A shell tool in a goal: the kind layer denies whatever the goal says.
    let shell_goal = json!({"goal": "g", "output_schema": {"type": "object"},
        "tools": [{"_tool": "sh", "_activity": "shell", "_shell": {"command": ["true"]}, "type": "object"}]});
    let sp = dir.path().join("shell.json");
    std::fs::write(&sp, shell_goal.to_string()).expect("goal");
    let kind = explain(&[&sp.display().to_string(), "--call", r#"{"_tool": "sh"}"#]);
    assert_eq!(
        (&kind["decision"], &kind["layer"], &kind["rule"]),
        (
            &json!("deny"),
            &json!("floor:kind"),
            &json!("floor:kind:shell")
        ),
        "{kind}"
    );
}

/// `dagloop --config FILE run` holds its runs to the config's floor too: `--approve auto` on a
/// goal whose http tool says `_approval: never` still needs a reviewer under `kinds = {http =
/// "ask"}`, so without a terminal the run is refused before anything runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_line_holds_its_runs_to_the_configs_floor() {
    let (url, counts) = counting_service().await;
    let dir = tempfile::tempdir().expect("tmp");
    let cfg = config(
        dir.path(),
        "config.json",
        json!({"approval": {"kinds": {"http": "ask"}}}),
    );
    let goal = client_goal(dir.path(), &url, |g| {
        g["tools"][0]["_approval"] = json!("never")
    });
    let gp = dir.path().join("goal.json");
    std::fs::write(&gp, goal.to_string()).expect("goal");
    let out = bin::dagloop()
        .arg("--config")
        .arg(&cfg)
        .arg("run")
        .arg(&gp)
        .args(["--approve", "auto", "--no-store", "--json"])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run dagloop");
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["error"]["code"], "approval.no_reviewer", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("floor:kind:http")),
        "{v}"
    );
    assert!(counts.lock().expect("counts").is_empty());
}

/// A fork is a new run, not a way around the floor: forking the published agent's run (which
/// asked under the agent goal's floor) at step 0 waits for a reviewer again, and a fork asking
/// for a model the agent's operator does not list is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_keeps_the_floor_and_the_agents_models() {
    let (url, counts) = counting_service().await;
    let dir = tempfile::tempdir().expect("tmp");
    let s = refunds_agent(dir.path(), &url);
    let id = submit_as(&s, CI, &json!({"agent": "refunds", "approve": "auto"})).await;
    until_as(&s, CI, &id, |v| awaiting(v).len() == 2).await;
    let at = format!("/runs/{id}/fork");
    let refusal = post_as(
        &s,
        CI,
        &at,
        &json!({"at_step": 0, "model": "openai:gpt-4o"}),
    )
    .await;
    refused(refusal, 403, "server.agent_model");
    let (status, v) = post_as(&s, CI, &at, &json!({"at_step": 0})).await;
    assert_eq!(status, 201, "{v}");
    let forked = v["id"].as_str().expect("id").to_string();
    let run = until_as(&s, CI, &forked, |v| awaiting(v).len() == 2).await;
    let rule = "floor:agent:refunds:goal/policy:ask".to_string();
    assert_eq!(asked(&run), [(1, rule.clone()), (2, rule)], "{run}");
    assert!(counts.lock().expect("counts").is_empty());
}
