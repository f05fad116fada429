//! The binary's spans against a real collector: Arize Phoenix (`scripts/setup-phoenix.sh`,
//! `DAGLOOP_PHOENIX`), started on 127.0.0.1, receives OTLP/HTTP from `dagloop run` and `resume`;
//! the spans are read back through Phoenix's REST API. Without `DAGLOOP_PHOENIX` the test prints
//! SKIPPED. A second test sends the spans over OTLP/gRPC to Phoenix's gRPC port. (Phoenix's API does not return span links: tests/otel_spans.rs pins those.)

#[path = "common/bin.rs"]
mod bin;
#[path = "common/browser.rs"]
mod browser;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

struct Phoenix {
    child: Child,
    port: u16,
    /// Where Phoenix takes OTLP over gRPC.
    grpc_port: u16,
    _dir: tempfile::TempDir,
    /// One Phoenix at a time: two starting at once on a 2-core machine did not come up
    /// within the deadline. Released after the process is killed.
    _turn: std::sync::MutexGuard<'static, ()>,
}

static ONE_PHOENIX: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl Drop for Phoenix {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn get(url: &str) -> Option<Value> {
    let out = Command::new("curl")
        .args(["-sf", "--max-time", "5", url])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    serde_json::from_slice(&out.stdout).ok()
}

impl Phoenix {
    fn start(phoenix: &str) -> Phoenix {
        let turn = ONE_PHOENIX.lock().unwrap_or_else(|e| e.into_inner());
        let dir = tempfile::tempdir().expect("dir");
        let port = free_port();
        let grpc_port = free_port();
        let child = Command::new(phoenix)
            .arg("serve")
            .env("PHOENIX_HOST", "127.0.0.1")
            .env("PHOENIX_PORT", port.to_string())
            .env("PHOENIX_GRPC_PORT", grpc_port.to_string())
            .env("PHOENIX_WORKING_DIR", dir.path())
            .env("PHOENIX_TELEMETRY_ENABLED", "false")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start phoenix");
        let p = Phoenix {
            child,
            port,
            grpc_port,
            _dir: dir,
            _turn: turn,
        };
        // Phoenix takes a while to start on a busy machine: wait for its API, not a fixed time.
        let deadline = Instant::now() + Duration::from_secs(240);
        while get(&p.url("/v1/projects")).is_none() {
            assert!(Instant::now() < deadline, "phoenix did not start");
            std::thread::sleep(Duration::from_millis(500));
        }
        p
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// The spans of `trace` once `want` of them arrived (the exporter sends in batches).
    fn spans(&self, trace: &str, want: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let all = get(&self.url("/v1/projects/default/spans?limit=1000"))
                .and_then(|v| v["data"].as_array().cloned())
                .unwrap_or_default();
            let mine: Vec<Value> = all
                .into_iter()
                .filter(|s| s["context"]["trace_id"] == trace)
                .collect();
            if want(&mine) {
                return mine;
            }
            assert!(
                Instant::now() < deadline,
                "spans of {trace} never arrived: {mine:#?}"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

fn dagloop(p: &Phoenix, store: &Path) -> Command {
    let mut c = bin::dagloop();
    c.env("DAGLOOP_STORE", store)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", p.url(""))
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env("OTEL_SERVICE_NAME", "dagloop-test")
        .env_remove("OTEL_SDK_DISABLED")
        .env_remove("OTEL_TRACES_SAMPLER");
    c
}

fn json_of(out: &std::process::Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
        panic!(
            "not JSON: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn trace_of(run: &Value) -> String {
    dagloop::telemetry::trace_id(run["run_id"].as_str().expect("run id")).to_string()
}

fn named<'a>(spans: &'a [Value], name: &str) -> Vec<&'a Value> {
    spans.iter().filter(|s| s["name"] == name).collect()
}

fn one<'a>(spans: &'a [Value], name: &str) -> &'a Value {
    let found = named(spans, name);
    assert_eq!(found.len(), 1, "one {name}: {spans:#?}");
    found[0]
}

fn parent<'a>(spans: &'a [Value], s: &Value) -> Option<&'a Value> {
    spans
        .iter()
        .find(|p| p["context"]["span_id"] == s["parent_id"])
}

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn phoenix_or_skip() -> Option<String> {
    match std::env::var("DAGLOOP_PHOENIX") {
        Ok(p) if !p.is_empty() => Some(p),
        _ => {
            println!("SKIPPED: DAGLOOP_PHOENIX is not set (scripts/setup-phoenix.sh)");
            None
        }
    }
}

#[test]
fn runs_export_their_trace_to_phoenix_delegate_rejected_failed_and_resumed() {
    let Some(phoenix) = phoenix_or_skip() else {
        return;
    };
    let p = Phoenix::start(&phoenix);
    let dir = tempfile::tempdir().expect("dir");
    let store = dir.path().join("runs.db");

    // 1. The delegate example: run → step → chat and calls → the nested agent.
    let out = dagloop(&p, &store)
        .args(["run", "--json"])
        .arg(repo("examples/delegate/goal.json"))
        .current_dir(repo("examples/delegate"))
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = json_of(&out);
    let spans = p.spans(&trace_of(&run), |s| {
        s.iter().any(|x| x["name"] == "invoke_workflow")
    });
    let root = one(&spans, "invoke_workflow");
    assert!(root["parent_id"].is_null(), "{root}");
    assert_eq!(
        root["attributes"]["gen_ai.operation.name"],
        "invoke_workflow"
    );
    let delegate = one(&spans, "execute_tool translateReply");
    let a = &delegate["attributes"];
    assert_eq!(a["gen_ai.tool.name"], "translateReply");
    assert_eq!(a["gen_ai.tool.type"], "function");
    assert_eq!(a["dagloop.activity"], "delegate");
    assert!(a["gen_ai.tool.call.id"].is_string(), "{a}");
    let step = parent(&spans, delegate).expect("the call's step");
    assert!(
        step["name"].as_str().unwrap_or("").starts_with("step "),
        "{step}"
    );
    assert_eq!(
        parent(&spans, step).expect("the run")["name"],
        "invoke_workflow"
    );
    let nested = one(&spans, "invoke_agent translateReply");
    assert_eq!(
        parent(&spans, nested).expect("parent")["name"],
        "execute_tool translateReply"
    );
    let chats: Vec<&Value> = spans
        .iter()
        .filter(|s| s["name"].as_str().unwrap_or("").starts_with("chat"))
        .collect();
    assert!(chats.len() >= 3, "{chats:#?}");
    for c in &chats {
        let a = &c["attributes"];
        assert_eq!(a["gen_ai.operation.name"], "chat", "{c}");
        assert!(a["gen_ai.provider.name"].is_string(), "{c}");
        assert!(a["gen_ai.usage.input_tokens"].is_number(), "{c}");
    }
    // A chat of the nested agent hangs under its own step, under the nested agent.
    assert!(chats.iter().any(|c| {
        parent(&spans, c)
            .and_then(|s| parent(&spans, s))
            .is_some_and(|a| a["name"] == "invoke_agent translateReply")
    }));
    // Nothing of the content is recorded without DAGLOOP_OTEL_CONTENT=on.
    assert!(
        !serde_json::to_string(&spans)
            .expect("json")
            .contains("Camille")
    );

    // 2. A rejected call and a failed one.
    let goal_dir = tempfile::tempdir().expect("dir");
    let goal = goal_dir.path().join("goal.json");
    std::fs::write(
        goal_dir.path().join("s.json"),
        json!({"turns": [
            {"solution": {"calls": [{"_tool": "wire"}, {"_tool": "broken"}], "output": null}},
            {"solution": {"calls": [], "output": {"done": true}}}
        ]})
        .to_string(),
    )
    .expect("script");
    std::fs::write(
        &goal,
        json!({"goal": "try", "model": "scripted:s.json",
               "output_schema": {"type": "object"},
               "tools": [
                   {"_tool": "wire", "_activity": "shell", "_approval": "always", "_shell": {"command": ["true"]}, "type": "object"},
                   {"_tool": "broken", "_activity": "shell", "_shell": {"command": ["false"]}, "type": "object"}
               ]})
        .to_string(),
    )
    .expect("goal");
    let decisions = goal_dir.path().join("decisions.json");
    std::fs::write(
        &decisions,
        json!({"decisions": [
            {"tool": "wire", "decision": "reject", "reason": "not today"},
            {"tool": "broken", "decision": "approve"}
        ]})
        .to_string(),
    )
    .expect("decisions");
    let out = dagloop(&p, &store)
        .args([
            "run",
            "--json",
            "--allow-shell",
            "--approve",
            "ask",
            "--decisions",
        ])
        .arg(&decisions)
        .arg(&goal)
        .current_dir(goal_dir.path())
        .output()
        .expect("run");
    let run = json_of(&out);
    let spans = p.spans(&trace_of(&run), |s| {
        s.iter().any(|x| x["name"] == "invoke_agent dagloop")
    });
    let wire = one(&spans, "execute_tool wire");
    assert_eq!(wire["attributes"]["dagloop.call.status"], "rejected");
    assert_eq!(wire["status_code"], "ERROR");
    let approval = one(&spans, "approval wire");
    assert_eq!(
        approval["attributes"]["dagloop.approval.decision"],
        "reject"
    );
    assert_eq!(approval["attributes"]["dagloop.approval.timed_out"], false);
    assert_eq!(
        approval["attributes"]["gen_ai.tool.call.id"],
        wire["attributes"]["gen_ai.tool.call.id"]
    );
    assert!(
        approval["attributes"]["gen_ai.tool.call.id"].is_string(),
        "{approval}"
    );
    assert_eq!(
        approval["attributes"]["dagloop.approval.channel"],
        "decisions_file"
    );
    assert_eq!(
        parent(&spans, approval).expect("parent")["name"],
        "execute_tool wire"
    );
    let broken = one(&spans, "execute_tool broken");
    assert_eq!(broken["attributes"]["dagloop.call.status"], "error");
    assert!(broken["attributes"]["error.type"].is_string(), "{broken}");

    // 3. A run killed (SIGKILL) part-way, then resumed: one trace; the resumed run's span says
    // so; no call is reported as executed twice.
    let out = dagloop(&p, &store)
        .env("DAGLOOP_CRASH_AFTER_ENTRIES", "8")
        .env("DAGLOOP_LEASE_MS", "200")
        .args(["run", "--json"])
        .arg(repo("examples/delegate/goal.json"))
        .current_dir(repo("examples/delegate"))
        .output()
        .expect("run");
    assert!(!out.status.success(), "the run was to be killed");
    let listed = json_of(
        &dagloop(&p, &store)
            .args(["runs", "--json"])
            .output()
            .expect("runs"),
    );
    let crashed = listed
        .as_array()
        .and_then(|rows| {
            rows.iter()
                .find(|r| r["status"] != "succeeded" && r["status"] != "failed")
        })
        .and_then(|r| r["id"].as_str())
        .expect("the crashed run")
        .to_string();
    std::thread::sleep(Duration::from_millis(300));
    let out = dagloop(&p, &store)
        .args(["resume", &crashed, "--json"])
        .output()
        .expect("resume");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let trace = dagloop::telemetry::trace_id(&crashed).to_string();
    let spans = p.spans(&trace, |s| {
        s.iter().any(|x| {
            x["name"] == "invoke_workflow" && x["attributes"]["dagloop.run.resumed"] == true
        })
    });
    // Two run spans: the killed process's, reported by the resumed one (it never ended its
    // own), and the resumed process's.
    let runs = named(&spans, "invoke_workflow");
    assert_eq!(runs.len(), 2, "{runs:#?}");
    let root = runs
        .iter()
        .find(|s| s["attributes"]["dagloop.run.resumed"] == true)
        .expect("the resumed process's run span");
    assert_eq!(
        root["attributes"]["dagloop.run.status"], "succeeded",
        "{root}"
    );
    assert!(
        runs.iter()
            .any(|s| s["attributes"]["dagloop.run.status"] == "stopped"),
        "{runs:#?}"
    );
    let mut executed: BTreeMap<String, usize> = BTreeMap::new();
    for s in &spans {
        if s["name"].as_str().unwrap_or("").starts_with("execute_tool")
            && s["attributes"]["dagloop.replayed"] != true
        {
            *executed
                .entry(s["attributes"]["gen_ai.tool.call.id"].to_string())
                .or_default() += 1;
        }
    }
    assert!(executed.values().all(|n| *n == 1), "{executed:?}");

    // `show --trace` names the same trace.
    let shown = json_of(
        &dagloop(&p, &store)
            .args(["show", &crashed, "--trace", "--json"])
            .output()
            .expect("show"),
    );
    assert_eq!(shown["trace_id"], trace.as_str());
    assert!(!shown["critical_path"].as_array().expect("path").is_empty());
}

#[test]
fn spans_reach_phoenix_over_grpc() {
    let Some(phoenix) = phoenix_or_skip() else {
        return;
    };
    let p = Phoenix::start(&phoenix);
    let dir = tempfile::tempdir().expect("dir");
    let out = dagloop(&p, &dir.path().join("runs.db"))
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        .env(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://127.0.0.1:{}", p.grpc_port),
        )
        // Sent as gRPC metadata, with a capital in the name (metadata names are lower case).
        .env(
            "OTEL_EXPORTER_OTLP_HEADERS",
            "X-Team=agents,authorization=Bearer%20abc",
        )
        .args(["run", "--json"])
        .arg(repo("examples/delegate/goal.json"))
        .current_dir(repo("examples/delegate"))
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = json_of(&out);
    let spans = p.spans(&trace_of(&run), |s| {
        s.iter().any(|x| x["name"] == "invoke_workflow")
    });
    let root = one(&spans, "invoke_workflow");
    assert!(root["parent_id"].is_null(), "{root}");
    screenshot_trace(&p, &trace_of(&run));
    let delegate = one(&spans, "execute_tool translateReply");
    assert_eq!(delegate["attributes"]["dagloop.activity"], "delegate");
    let nested = one(&spans, "invoke_agent translateReply");
    assert_eq!(
        parent(&spans, nested).expect("parent")["name"],
        "execute_tool translateReply"
    );
    assert!(
        spans
            .iter()
            .any(|s| s["name"].as_str().unwrap_or("").starts_with("chat")
                && s["attributes"]["gen_ai.usage.input_tokens"].is_number()),
        "{spans:#?}"
    );
}

/// Opens Phoenix's page of `trace` in headless Chromium, waits until it shows the run's spans by
/// name (not an error page) and saves it as `phoenix-trace.png` among the test artifacts.
fn screenshot_trace(p: &Phoenix, trace: &str) {
    let project = get(&p.url("/v1/projects"))
        .and_then(|v| {
            v["data"]
                .as_array()?
                .iter()
                .find(|x| x["name"] == "dagloop-test" || x["name"] == "default")
                .and_then(|x| x["id"].as_str().map(str::to_string))
        })
        .expect("the project");
    let url = p.url(&format!("/projects/{project}/traces/{trace}"));
    tokio::runtime::Runtime::new().expect("rt").block_on(async {
        let Some(b) = browser::session().await else {
            return;
        };
        b.c.goto(&url).await.expect("open the trace page");
        browser::until(
            &b.c,
            "the trace's spans",
            "const t = document.body.innerText; \
             return t.includes('invoke_workflow') && t.includes('execute_tool translateReply')",
        )
        .await;
        browser::save_screenshot(&b.c, "phoenix-trace.png").await;
    });
}
