//! Issue 47's attacks on `dagloop serve` under an operator config, each as a client (or a
//! hostile page, or a hostile tool service) would make it, through the real binary and real HTTP
//! on 127.0.0.1; each failed before its fix.
//!
//! - Secrets go where they are granted: a variable bound to host A is not sent to host B (in the
//!   URL, in a header, or by A's redirect), while A receives it; a variable granted by name alone
//!   is sent nowhere by a server.

#[path = "common/bin.rs"]
mod bin;
#[path = "common/serve.rs"]
mod serve;

use std::path::Path;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use serve::{Server, client, send, until};

/// What a recording service was sent: one line per request, its path and query, then each
/// header as `name: value`.
type Seen = Arc<Mutex<Vec<String>>>;

/// A loopback service that records every request; `/redirect?to=URL` answers with a redirect.
async fn recording_service() -> (u16, Seen) {
    let seen: Seen = Arc::default();
    let s = seen.clone();
    let app = axum::Router::new().fallback(move |req: axum::extract::Request| {
        let s = s.clone();
        async move {
            let mut line = req.uri().to_string();
            for (k, v) in req.headers() {
                line.push_str(&format!("\n{k}: {}", v.to_str().unwrap_or("")));
            }
            s.lock().expect("seen").push(line);
            let to = req
                .uri()
                .query()
                .and_then(|q| q.strip_prefix("to="))
                .map(str::to_string);
            match to {
                Some(to) if req.uri().path() == "/redirect" => {
                    axum::response::Redirect::temporary(&to).into_response()
                }
                _ => axum::Json(json!({"ok": true})).into_response(),
            }
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (port, seen)
}

use axum::response::IntoResponse;

/// An `http` tool without params.
fn get_tool(name: &str, url: &str, headers: Value) -> Value {
    json!({"_tool": name, "_activity": "http",
        "_http": {"method": "GET", "url": url, "headers": headers},
        "type": "object", "properties": {}})
}

/// A scripted model that calls `tools` once each, then answers `{"done": true}`.
fn script_calling(dir: &Path, tools: &[&str]) -> String {
    let calls: Vec<Value> = tools.iter().map(|t| json!({"_tool": t})).collect();
    let path = dir.join("s.json");
    let s = json!({"turns": [
        {"solution": {"calls": calls, "output": null}},
        {"solution": {"calls": [], "output": {"done": true}}}
    ]});
    std::fs::write(&path, s.to_string()).expect("script");
    format!("scripted:{}", path.display())
}

/// `dagloop serve` under the operator config `toml` (written into `dir`, its file root), with
/// the environment `env`.
fn serve_with(dir: &Path, toml: &str, env: &[(&str, &str)]) -> Server {
    let cfg = dir.join("dagloop.toml");
    std::fs::write(&cfg, toml).expect("config");
    Server::start_config(&dir.join("runs.db"), &cfg, None, |c| {
        c.current_dir(dir);
        for (k, v) in env {
            c.env(k, v);
        }
    })
}

/// Submits `goal` and returns the run once it finished.
async fn run_to_end(s: &Server, goal: &Value) -> Value {
    let (status, v) = send(client().post(s.url("/runs")).json(goal)).await;
    assert_eq!(status, 201, "{v}");
    let id = v["id"].as_str().expect("id").to_string();
    until(s, &id, |v| {
        !matches!(v["status"].as_str(), Some("running" | "stopped"))
    })
    .await
}

/// The call of `tool` in a run's view.
fn call_of<'a>(run: &'a Value, tool: &str) -> &'a Value {
    run["calls"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["tool"] == tool))
        .unwrap_or_else(|| panic!("no call of {tool}: {run}"))
}

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
             [grants.egress]\nhosts = [\"127.0.0.1\"]\n"
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
        "[grants]\nenv = [\"DAGLOOP_T47_KEY\"]\n[grants.egress]\nhosts = [\"127.0.0.1\"]\n",
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
