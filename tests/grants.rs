//! A goal asks, the operator grants (DESIGN.md section 3.3), tried as an attacker with an HTTP
//! client of `dagloop serve` would, and as a user of `dagloop run` and `validate`: every
//! reproduction of the trust-boundary issue, through the binary and real HTTP on 127.0.0.1.
//! Each fails on a dagloop without grants: the MCP command ran, the secret and the loopback
//! service were reached, files outside the server's folder were opened.

#[path = "common/bin.rs"]
mod bin;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};

/// A loopback service that counts every request it gets (on any path).
async fn counting_service() -> (u16, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    let app = axum::Router::new().fallback(move || {
        let h = h.clone();
        async move {
            h.fetch_add(1, Ordering::SeqCst);
            axum::Json(json!({"ok": true}))
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (port, hits)
}

/// A loopback service that answers every request with a redirect to `to`.
async fn redirecting_service(to: String) -> u16 {
    let app = axum::Router::new().fallback(move || {
        let to = to.clone();
        async move { axum::response::Redirect::temporary(&to) }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    port
}

/// `dagloop serve` started in `cwd` (its default file root), with `config` when given.
struct Server {
    child: Child,
    base: String,
}

impl Server {
    fn start(cwd: &Path, config: Option<&Path>, env: &[(&str, &str)]) -> Server {
        let mut c: Command = bin::dagloop();
        c.current_dir(cwd);
        if let Some(cfg) = config {
            c.arg("--config").arg(cfg);
        }
        for (k, v) in env {
            c.env(k, v);
        }
        let mut child = c
            .args(["serve", "--addr", "127.0.0.1:0", "--store"])
            .arg(cwd.join("runs.db"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn dagloop serve");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("read");
        let v: Value = serde_json::from_str(&line).unwrap_or_else(|_| panic!("not JSON: {line}"));
        let base = v["url"]
            .as_str()
            .expect("url")
            .trim_end_matches('/')
            .to_string();
        Server { child, base }
    }

    async fn post(&self, body: &Value) -> (u16, Value) {
        let r = dagloop::net::client()
            .expect("client")
            .post(format!("{}/runs", self.base))
            .json(body)
            .send()
            .await
            .expect("POST /runs");
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// The run, once it has finished (or after 20 s, as it then is).
    async fn finished(&self, id: &str) -> Value {
        let mut v = Value::Null;
        for _ in 0..200 {
            v = dagloop::net::client()
                .expect("client")
                .get(format!("{}/runs/{id}", self.base))
                .send()
                .await
                .expect("GET")
                .json()
                .await
                .expect("JSON");
            if !matches!(v["status"].as_str(), Some("running" | "stopped")) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        v
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A scripted-model file in `dir` whose first turn makes `calls` and whose second outputs
/// `{"done": true}`.
fn script(dir: &Path, name: &str, calls: Value) -> PathBuf {
    let path = dir.join(name);
    let s = json!({"turns": [
        {"solution": {"calls": calls, "output": null}},
        {"solution": {"calls": [], "output": {"done": true}}}
    ]});
    std::fs::write(&path, s.to_string()).expect("script");
    path
}

fn http_tool(url: &str) -> Value {
    json!({"_tool": "fetch", "_activity": "http", "_http": {"method": "GET", "url": url},
        "type": "object", "properties": {"host": {"type": "string"}}})
}

fn refused(got: &(u16, Value), code: &str, pointer: &str) {
    assert_eq!(got.0, 400, "{}", got.1);
    assert_eq!(got.1["code"], code, "{}", got.1);
    assert_eq!(got.1["errors"][0]["pointer"], pointer, "{}", got.1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_command_in_a_submitted_goal_never_runs() {
    let dir = tempfile::tempdir().expect("tmp");
    let marker = dir.path().join("marker");
    let s = Server::start(dir.path(), None, &[]);
    let goal = json!({"goal": "x", "model": "scripted:s.json", "output_schema": {"type": "object"},
        "mcp_servers": [{"name": "p", "command": "/bin/sh",
            "args": ["-c", format!("id > {}", marker.display())]}]});
    let got = s.post(&goal).await;
    refused(&got, "grant.mcp_server", "/mcp_servers/0");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!marker.exists(), "the goal's MCP command ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_servers_environment_never_reaches_a_tool() {
    let dir = tempfile::tempdir().expect("tmp");
    let (port, hits) = counting_service().await;
    // The operator grants loopback egress, but no environment variable.
    let cfg = dir.path().join("dagloop.toml");
    std::fs::write(&cfg, "[grants.egress]\nprivate = true\n").expect("config");
    let s = Server::start(dir.path(), Some(&cfg), &[("DAGLOOP_TEST_SECRET", "s3cret")]);
    script(dir.path(), "s.json", json!([{"_tool": "fetch"}]));
    let goal = json!({"goal": "x", "model": "scripted:s.json", "output_schema": {"type": "object"},
        "env": ["DAGLOOP_TEST_SECRET"],
        "tools": [http_tool(&format!("http://127.0.0.1:{port}/k/${{DAGLOOP_TEST_SECRET}}"))]});
    let got = s.post(&goal).await;
    refused(&got, "grant.env", "/env/0");
    assert!(!got.1.to_string().contains("s3cret"), "{}", got.1);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(hits.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loopback_targets_are_never_contacted_in_any_spelling() {
    let dir = tempfile::tempdir().expect("tmp");
    let (port, hits) = counting_service().await;
    let s = Server::start(dir.path(), None, &[]);
    // A literal loopback URL is refused where the run is defined.
    let goal = json!({"goal": "x", "output_schema": {"type": "object"},
        "tools": [http_tool(&format!("http://127.0.0.1:{port}/x"))]});
    refused(&s.post(&goal).await, "grant.egress", "/tools/0/_http/url");
    // A host that comes from a call's params is checked when the call runs: names that resolve
    // to loopback and every spelling of 127.0.0.1 fail the call, and nothing connects.
    let hosts = [
        "127.0.0.1",
        "localhost",
        "2130706433",
        "0x7f.1",
        "0177.0.0.1",
        "127.1",
    ];
    let calls: Vec<Value> = hosts
        .iter()
        .map(|h| json!({"_tool": "fetch", "host": h}))
        .collect();
    script(dir.path(), "s.json", Value::Array(calls));
    let goal = json!({"goal": "x", "model": "scripted:s.json", "output_schema": {"type": "object"},
        "tools": [http_tool(&format!("http://{{host}}:{port}/x"))]});
    let (st, v) = s.post(&goal).await;
    assert_eq!(st, 201, "{v}");
    let run = s.finished(v["id"].as_str().expect("id")).await;
    assert_eq!(run["status"], "succeeded", "{run}");
    let calls = run["calls"].as_array().expect("calls");
    assert_eq!(calls.len(), hosts.len(), "{run}");
    for c in calls {
        assert_eq!(c["status"], "error", "{c}");
        assert!(c["error"].to_string().contains("grant.egress"), "{c}");
    }
    assert_eq!(
        hits.load(Ordering::SeqCst),
        0,
        "a loopback target was contacted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_to_an_address_not_granted_is_not_followed() {
    let dir = tempfile::tempdir().expect("tmp");
    let (target, hits) = counting_service().await;
    let hop = redirecting_service(format!("http://localhost:{target}/secret")).await;
    // The operator grants exactly the first service (an address listed is granted although it
    // is loopback); the redirect names another.
    let cfg = dir.path().join("dagloop.json");
    std::fs::write(
        &cfg,
        json!({"grants": {"egress": {"hosts": ["127.0.0.1"], "ports": [hop, target]}}}).to_string(),
    )
    .expect("config");
    let s = Server::start(dir.path(), Some(&cfg), &[]);
    script(dir.path(), "s.json", json!([{"_tool": "fetch"}]));
    let goal = json!({"goal": "x", "model": "scripted:s.json", "output_schema": {"type": "object"},
        "tools": [http_tool(&format!("http://127.0.0.1:{hop}/start"))]});
    let (st, v) = s.post(&goal).await;
    assert_eq!(st, 201, "{v}");
    let run = s.finished(v["id"].as_str().expect("id")).await;
    let call = &run["calls"][0];
    assert_eq!(call["status"], "error", "{run}");
    assert!(call["error"].to_string().contains("grant.egress"), "{call}");
    assert_eq!(hits.load(Ordering::SeqCst), 0, "the redirect was followed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_outside_the_servers_folder_are_refused_alike_whether_they_exist_or_not() {
    let dir = tempfile::tempdir().expect("tmp");
    let root = dir.path().join("root");
    std::fs::create_dir(&root).expect("mkdir");
    std::fs::write(
        dir.path().join("outside.json"),
        r#"{"db_password": "hunter2"}"#,
    )
    .expect("write");
    let s = Server::start(&root, None, &[]);
    let mut messages = Vec::new();
    for (path, what) in [
        ("../outside.json", "exists"),
        ("../missing.json", "missing"),
        ("/etc/shadow", "exists"),
        ("/nonexistent/x.json", "missing"),
    ] {
        let goal = json!({"goal": "x", "model": format!("scripted:{path}"),
            "output_schema": {"type": "object"}});
        let got = s.post(&goal).await;
        refused(&got, "grant.file", "/model");
        let text = got.1.to_string();
        assert!(
            !text.contains("db_password") && !text.contains("hunter2"),
            "{text}"
        );
        let m = got.1["message"]
            .as_str()
            .unwrap_or("")
            .replace(path, "PATH");
        messages.push((m, what));
        // A delegate goal outside the roots is never read either.
        let goal = json!({"goal": "x", "output_schema": {"type": "object"},
            "tools": [{"_tool": "d", "_activity": "delegate", "_delegate": path, "type": "object"}]});
        refused(&s.post(&goal).await, "grant.file", "/tools/0/_delegate");
    }
    assert!(
        messages.windows(2).all(|w| w[0].0 == w[1].0),
        "the refusal tells existing and missing files apart: {messages:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn published_agents_run_by_name_with_their_input() {
    let dir = tempfile::tempdir().expect("tmp");
    let agents = dir.path().join("agents");
    std::fs::create_dir(&agents).expect("mkdir");
    std::fs::write(
        agents.join("s.json"),
        json!({"turns": [{"solution": {"calls": [], "output": {"hello": "†input.name"}}}]})
            .to_string(),
    )
    .expect("script");
    std::fs::write(
        agents.join("greet.json"),
        json!({"goal": "greet", "model": "scripted:s.json",
            "input_schema": {"type": "object", "required": ["name"]},
            "output_schema": {"type": "object", "required": ["hello"]}})
        .to_string(),
    )
    .expect("goal");
    let cfg = dir.path().join("dagloop.toml");
    std::fs::write(
        &cfg,
        "[grants]\nfiles = [\"agents\"]\n\n[agents.greet]\ngoal = \"agents/greet.json\"\n",
    )
    .expect("config");
    let s = Server::start(dir.path(), Some(&cfg), &[]);
    let (st, v) = s
        .post(&json!({"agent": "greet", "input": {"name": "Ada"}}))
        .await;
    assert_eq!(st, 201, "{v}");
    let run = s.finished(v["id"].as_str().expect("id")).await;
    assert_eq!(run["output"], json!({"hello": "Ada"}), "{run}");
    // The input is checked against the agent's input schema; unknown agents are 404.
    let (st, v) = s.post(&json!({"agent": "greet", "input": {}})).await;
    assert_eq!((st, v["code"].as_str()), (400, Some("goal.invalid")), "{v}");
    let (st, v) = s.post(&json!({"agent": "nope"})).await;
    assert_eq!(
        (st, v["code"].as_str()),
        (404, Some("server.unknown_agent")),
        "{v}"
    );
}

#[test]
fn the_command_line_and_validate_apply_the_same_grants() {
    let dir = tempfile::tempdir().expect("tmp");
    let goal = dir.path().join("goal.json");
    std::fs::write(
        &goal,
        json!({"goal": "x", "output_schema": {"type": "object"},
            "tools": [{"_tool": "sh", "_activity": "shell", "_shell": {"command": ["true"]}, "type": "object"}]})
        .to_string(),
    )
    .expect("goal");
    // Without --allow-shell the shell is not granted: `run` refuses at start, `validate` says so.
    let out = bin::dagloop()
        .args(["run", "--no-store", "--model", "scripted:none.json"])
        .arg(&goal)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["error"]["code"], "grant.tool_kind", "{v}");
    let out = bin::dagloop()
        .arg("validate")
        .arg(&goal)
        .output()
        .expect("validate");
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["findings"][0]["code"], "grant.tool_kind", "{v}");
    let out = bin::dagloop()
        .args(["validate", "--allow-shell"])
        .arg(&goal)
        .output()
        .expect("validate");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // A config's grants hold on the command line too; a misspelled grant is refused.
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, "[grants]\ntools = [\"http\"]\n").expect("config");
    let out = bin::dagloop()
        .arg("--config")
        .arg(&cfg)
        .args(["validate", "--allow-shell"])
        .arg(&goal)
        .output()
        .expect("validate");
    assert_eq!(
        out.status.code(),
        Some(0),
        "--allow-shell adds the shell to a config's grants"
    );
    std::fs::write(&cfg, "[grants]\ntool = [\"http\"]\n").expect("config");
    let out = bin::dagloop()
        .arg("--config")
        .arg(&cfg)
        .arg("validate")
        .arg(&goal)
        .output()
        .expect("validate");
    assert_eq!(out.status.code(), Some(2));
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["error"]["code"], "config.invalid", "{v}");
}

mod egress_spellings {
    use dagloop::grants::Egress;
    use proptest::prelude::*;
    use std::net::Ipv4Addr;

    /// Every spelling the URL parser accepts of one IPv4 address.
    fn spellings(ip: Ipv4Addr) -> Vec<String> {
        let [a, b, c, d] = ip.octets();
        let n = u32::from(ip);
        vec![
            format!("{ip}"),
            format!("{n}"),
            format!("0x{n:x}"),
            format!("0{a:o}.0{b:o}.0{c:o}.0{d:o}"),
            format!("0x{a:x}.0x{b:x}.0x{c:x}.0x{d:x}"),
            format!(
                "{a}.{}",
                (u32::from(b) << 16) | (u32::from(c) << 8) | u32::from(d)
            ),
            format!("[::ffff:{ip}]"),
            format!("[::ffff:{:x}:{:x}]", n >> 16, n & 0xffff),
            format!("[::{ip}]"),
            format!("user:pw@{ip}"),
        ]
    }

    fn private_v4() -> impl Strategy<Value = Ipv4Addr> {
        prop_oneof![
            any::<[u8; 3]>().prop_map(|[b, c, d]| Ipv4Addr::new(127, b, c, d)),
            any::<[u8; 3]>().prop_map(|[b, c, d]| Ipv4Addr::new(10, b, c, d)),
            (16u8..32, any::<[u8; 2]>()).prop_map(|(b, [c, d])| Ipv4Addr::new(172, b, c, d)),
            any::<[u8; 2]>().prop_map(|[c, d]| Ipv4Addr::new(192, 168, c, d)),
            any::<[u8; 2]>().prop_map(|[c, d]| Ipv4Addr::new(169, 254, c, d)),
            any::<[u8; 3]>().prop_map(|[b, c, d]| Ipv4Addr::new(0, b, c, d)),
        ]
    }

    proptest! {
        #[test]
        fn non_public_addresses_are_refused_in_every_spelling(ip in private_v4(), port in 1u16..) {
            let e = Egress::default();
            for host in spellings(ip) {
                let url = format!("http://{host}:{port}/x");
                prop_assert!(e.check_str(&url).is_err(), "{} passed", url);
            }
        }

        #[test]
        fn public_addresses_pass_in_every_spelling(a in 1u8..=223, b: u8, c: u8, d: u8) {
            let ip = Ipv4Addr::new(a, b, c, d);
            prop_assume!(dagloop::grants::egress::non_public(ip.into()).is_none());
            let e = Egress::default();
            for host in spellings(ip) {
                let url = format!("http://{host}/x");
                // The IPv4-compatible form (::a.b.c.d) is deprecated and refused whatever it holds.
                if host.starts_with("[::") && !host.starts_with("[::ffff") {
                    prop_assert!(e.check_str(&url).is_err(), "{} passed", url);
                } else {
                    prop_assert!(e.check_str(&url).is_ok(), "{} refused: {:?}", url, e.check_str(&url));
                }
            }
        }
    }
}

#[test]
fn the_published_config_fixtures_load_as_the_typed_config() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/schemas/config");
    for entry in std::fs::read_dir(&dir).expect("fixtures") {
        let path = entry.expect("entry").path();
        let name = path
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        let loaded = dagloop::config::Config::load(&path);
        if name.starts_with("valid-") {
            let c = loaded.unwrap_or_else(|e| panic!("{name}: {e}"));
            c.grants(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
        } else {
            let e = loaded.expect_err(&name);
            assert_eq!(e.code(), "config.invalid", "{name}: {e}");
        }
    }
}
