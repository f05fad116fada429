//! Issue 47 item 2, secrets go where they are granted: an operator's env grant names the hosts
//! a variable's value may be sent to and, optionally, the published agents whose runs may send
//! it. Through the real binary (`dagloop serve` under an operator config, `dagloop run` for the
//! command line) and real services on 127.0.0.1 granted for egress; each failed before its fix.
//!
//! - A variable bound to host A is not sent to host B (in the URL, in a header, in another
//!   spelling of B's address, or by A's redirect), while A receives it.
//! - A variable granted by name alone is sent nowhere by a server; the command line, where the
//!   user is the operator, sends it where the goal says.
//! - A variable bound to agent `weather` is sent by `weather`'s calls (its delegate's included)
//!   and by no other run's: agent `other`, a client's own goal, a client goal whose delegate is
//!   `weather`'s own delegate goal, or a client's follow-up of a `weather` run with a goal of
//!   its own; A sees none of those requests.

#[path = "common/bin.rs"]
mod bin;
#[path = "common/serve.rs"]
mod serve;

use std::path::Path;

use serde_json::{Value, json};
use serve::{
    Server, call_of, client, get_tool, recording_service, run_to_end, script_calling, send,
    serve_with, until,
};

const SECRET: &str = "k-s3cret-47";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_bound_to_one_host_is_never_sent_to_another() {
    let dir = tempfile::tempdir().expect("tmp");
    let (a, seen_a) = recording_service().await;
    let (b, seen_b) = recording_service().await;
    // Both services are granted for egress; the key only to A.
    let s = serve_with(
        dir.path(),
        &format!(
            "[grants]\nenv = [{{name = \"DAGLOOP_T47_KEY\", hosts = [\"127.0.0.1:{a}\"]}}]\n\
             [grants.egress]\nhosts = [\"127.0.0.1\"]\nports = [{a}, {b}]\n"
        ),
        &[("DAGLOOP_T47_KEY", SECRET)],
    );
    let key = "${DAGLOOP_T47_KEY}";
    let goal = json!({"goal": "x", "output_schema": {"type": "object"},
    "model": script_calling(dir.path(), &["to_a", "b_url", "b_header", "b_spelled", "a_redirects_to_b"]),
    "env": ["DAGLOOP_T47_KEY"],
    "tools": [
        get_tool("to_a", &format!("http://127.0.0.1:{a}/a?key={key}"), json!({})),
        get_tool("b_url", &format!("http://127.0.0.1:{b}/b?key={key}"), json!({})),
        get_tool("b_header", &format!("http://127.0.0.1:{b}/h"), json!({"X-Key": key})),
        get_tool("b_spelled", &format!("http://2130706433:{b}/s?key={key}"), json!({})),
        get_tool("a_redirects_to_b",
            &format!("http://127.0.0.1:{a}/redirect?to=http://127.0.0.1:{b}/r"),
            json!({"X-Key": key})),
    ]});
    let run = run_to_end(&s, &goal).await;
    assert_eq!(call_of(&run, "to_a")["status"], "done", "{run}");
    for t in ["b_url", "b_header", "b_spelled", "a_redirects_to_b"] {
        let c = call_of(&run, t);
        assert_eq!(c["status"], "error", "{t}: {c}");
        assert!(
            c["error"].to_string().contains("grant.env_host"),
            "{t}: {c}"
        );
    }
    assert!(!run.to_string().contains(SECRET), "{run}");
    assert_eq!(
        seen_b.lock().expect("seen").len(),
        0,
        "B was sent something: {:?}",
        seen_b.lock().expect("seen")
    );
    let a_got = seen_a.lock().expect("seen").clone();
    assert!(
        a_got
            .iter()
            .any(|l| l.starts_with("/a?key=") && l.contains(SECRET)),
        "{a_got:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_granted_by_name_alone_is_sent_nowhere_by_a_server() {
    let dir = tempfile::tempdir().expect("tmp");
    let (a, seen_a) = recording_service().await;
    let s = serve_with(
        dir.path(),
        &format!(
            "[grants]\nenv = [\"DAGLOOP_T47_KEY\"]\n[grants.egress]\nhosts = [\"127.0.0.1\"]\nports = [{a}]\n"
        ),
        &[("DAGLOOP_T47_KEY", SECRET)],
    );
    let goal = json!({"goal": "x", "output_schema": {"type": "object"},
    "model": script_calling(dir.path(), &["to_a", "plain"]),
    "env": ["DAGLOOP_T47_KEY"],
    "tools": [
        get_tool("to_a", &format!("http://127.0.0.1:{a}/a?key=${{DAGLOOP_T47_KEY}}"), json!({})),
        get_tool("plain", &format!("http://127.0.0.1:{a}/plain"), json!({})),
    ]});
    let run = run_to_end(&s, &goal).await;
    let c = call_of(&run, "to_a");
    assert_eq!(c["status"], "error", "{c}");
    assert!(c["error"].to_string().contains("grant.env_host"), "{c}");
    assert_eq!(call_of(&run, "plain")["status"], "done", "{run}");
    let got = seen_a.lock().expect("seen").clone();
    assert!(got.iter().all(|l| !l.contains(SECRET)), "{got:?}");
    assert_eq!(got.len(), 1, "{got:?}");
}

/// Writes a scripted model `name` that calls `tools` once each, then answers `{"done": true}`.
fn script(dir: &Path, name: &str, tools: &[&str]) {
    let calls: Vec<Value> = tools.iter().map(|t| json!({"_tool": t})).collect();
    let s = json!({"turns": [
        {"solution": {"calls": calls, "output": null}},
        {"solution": {"calls": [], "output": {"done": true}}}
    ]});
    std::fs::write(dir.join(name), s.to_string()).expect("script");
}

/// A goal on the scripted model `model`, reading the key, with `tools`.
fn keyed_goal(model: &str, tools: Value) -> Value {
    json!({"goal": "x", "model": model, "output_schema": {"type": "object"},
        "env": ["DAGLOOP_T47_KEY"], "tools": tools})
}

/// An http tool sending the key to `path` on port `a`.
fn key_tool(a: u16, path: &str) -> Value {
    get_tool(
        "to_a",
        &format!("http://127.0.0.1:{a}/{path}?key=${{DAGLOOP_T47_KEY}}"),
        json!({}),
    )
}

/// Every call of `tool` in a run's view, its delegates' included.
fn calls_of<'a>(run: &'a Value, tool: &str) -> Vec<&'a Value> {
    run["calls"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["tool"] == tool)
        .collect()
}

/// The paths service A was sent the key on.
fn keyed_paths(seen: &serve::Seen) -> Vec<String> {
    seen.lock()
        .expect("seen")
        .iter()
        .filter(|l| l.contains(SECRET))
        .map(|l| l.split('?').next().unwrap_or("").to_string())
        .collect()
}

/// Runs a submission to its end and checks that each of its `to_a` calls was refused with
/// `grant.env_host` and that service A was sent nothing.
async fn refused_everywhere(s: &Server, what: &str, body: &Value, seen: &serve::Seen) {
    let before = seen.lock().expect("seen").len();
    let run = run_to_end(s, body).await;
    let calls = calls_of(&run, "to_a");
    assert!(!calls.is_empty(), "{what}: no call of to_a: {run}");
    for c in calls {
        assert_eq!(c["status"], "error", "{what}: {c}");
        assert!(
            c["error"].to_string().contains("grant.env_host"),
            "{what}: {c}"
        );
    }
    assert!(!run.to_string().contains(SECRET), "{what}: {run}");
    assert_eq!(
        seen.lock().expect("seen").len(),
        before,
        "{what}: A was sent a request: {:?}",
        seen.lock().expect("seen")
    );
}

/// The env grant `{name, hosts = [A], agents = ["weather"]}`: `weather`'s calls and its
/// delegate's send the key to A; agent `other`, a client's own goal, a client goal delegating
/// to `weather`'s delegate goal, and a client's follow-up of a `weather` run with its own goal
/// are refused before any request, and A sees nothing of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_bound_to_an_agent_is_sent_by_that_agents_calls_only() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let (a, seen) = recording_service().await;
    script(d, "s_root.json", &["to_a", "sub"]);
    script(d, "s_one.json", &["to_a"]);
    let sub = keyed_goal("scripted:s_one.json", json!([key_tool(a, "sub")]));
    std::fs::write(d.join("sub.json"), sub.to_string()).expect("sub");
    let delegate = json!({"_tool": "sub", "_activity": "delegate", "_delegate": "sub.json",
        "type": "object", "properties": {}});
    let weather = keyed_goal(
        "scripted:s_root.json",
        json!([key_tool(a, "weather"), delegate.clone()]),
    );
    std::fs::write(d.join("weather.json"), weather.to_string()).expect("weather");
    let other = keyed_goal("scripted:s_one.json", json!([key_tool(a, "other")]));
    std::fs::write(d.join("other.json"), other.to_string()).expect("other");
    let s = serve_with(
        d,
        &format!(
            "[grants]\ntools = [\"http\", \"delegate\"]\n\
             env = [{{name = \"DAGLOOP_T47_KEY\", hosts = [\"127.0.0.1:{a}\"], agents = [\"weather\"]}}]\n\
             [grants.egress]\nhosts = [\"127.0.0.1\"]\nports = [{a}]\n\
             [agents.weather]\ngoal = \"weather.json\"\n[agents.other]\ngoal = \"other.json\"\n"
        ),
        &[("DAGLOOP_T47_KEY", SECRET)],
    );
    // The agent the key is bound to: its own call and its delegate's reach A.
    let run = run_to_end(&s, &json!({"agent": "weather", "input": {}})).await;
    assert_eq!(run["status"], "succeeded", "{run}");
    let calls = calls_of(&run, "to_a");
    assert_eq!(calls.len(), 2, "{run}");
    assert!(calls.iter().all(|c| c["status"] == "done"), "{run}");
    let mut got = keyed_paths(&seen);
    got.sort();
    assert_eq!(
        got,
        ["/sub", "/weather"],
        "{:?}",
        seen.lock().expect("seen")
    );
    let weather_run = run["id"].as_str().expect("id").to_string();

    refused_everywhere(
        &s,
        "agent other",
        &json!({"agent": "other", "input": {}}),
        &seen,
    )
    .await;
    let own = keyed_goal(
        &script_calling(d, &["to_a"]),
        json!([key_tool(a, "client")]),
    );
    refused_everywhere(&s, "a client's own goal", &own, &seen).await;
    script(d, "s_deleg.json", &["sub"]);
    let via = keyed_goal(
        &format!("scripted:{}", d.join("s_deleg.json").display()),
        json!([delegate]),
    );
    refused_everywhere(
        &s,
        "a client goal delegating to weather's delegate",
        &via,
        &seen,
    )
    .await;
    // A follow-up of weather's run with a goal of the client's is the client's, not weather's.
    let (st, v) = send(
        client()
            .post(s.url(&format!("/runs/{weather_run}/continue")))
            .json(&json!({"goal": own})),
    )
    .await;
    assert_eq!(st, 201, "{v}");
    let id = v["id"].as_str().expect("id").to_string();
    let followed = until(&s, &id, |v| {
        !matches!(v["status"].as_str(), Some("running" | "stopped"))
    })
    .await;
    let c = call_of(&followed, "to_a");
    assert!(c["error"].to_string().contains("grant.env_host"), "{c}");
    assert_eq!(
        keyed_paths(&seen).len(),
        2,
        "{:?}",
        seen.lock().expect("seen")
    );
}

/// On the command line the user is the operator: a variable granted by name alone in its config
/// is sent where the goal says (the egress grant permitting), as without a config; one bound to
/// hosts goes only there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_line_sends_a_secret_granted_by_name_where_the_goal_says() {
    let dir = tempfile::tempdir().expect("tmp");
    let (a, seen) = recording_service().await;
    let goal = dir.path().join("goal.json");
    std::fs::write(
        &goal,
        json!({"goal": "x", "output_schema": {"type": "object"},
            "model": script_calling(dir.path(), &["to_a"]),
            "env": ["DAGLOOP_T47_KEY"],
            "tools": [get_tool("to_a", &format!("http://127.0.0.1:{a}/a?key=${{DAGLOOP_T47_KEY}}"), json!({}))]})
        .to_string(),
    )
    .expect("goal");
    for (env, reaches) in [
        ("[\"DAGLOOP_T47_KEY\"]", true),
        (
            "[{name = \"DAGLOOP_T47_KEY\", hosts = [\"api.weather.example\"]}]",
            false,
        ),
    ] {
        let cfg = dir.path().join("cli.toml");
        std::fs::write(
            &cfg,
            format!("[grants]\nenv = {env}\nfiles = [\".\"]\n[grants.egress]\nprivate = true\n"),
        )
        .expect("config");
        seen.lock().expect("seen").clear();
        let out = bin::dagloop_tokio()
            .arg("--config")
            .arg(&cfg)
            .args(["run", "--no-store"])
            .arg(&goal)
            .env("DAGLOOP_T47_KEY", SECRET)
            .output()
            .await
            .expect("run");
        let got = seen.lock().expect("seen").clone();
        assert_eq!(
            got.iter().any(|l| l.contains(SECRET)),
            reaches,
            "{env}: {got:?} {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
}
