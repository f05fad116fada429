//! `cargo bench --bench server`: `dagloop serve` driven over loopback by concurrent clients.
//! Each client submits a run (a scripted model, a latent call and an output that reads it),
//! follows its SSE stream until `run_finished`, and starts the next. Prints runs/s and p50/p99
//! submit→finished latency at 1, 10 and 100 clients, and the server's resident memory per live
//! run (runs held waiting for a reviewer). Then the bounded-store rows (support/parked.rs):
//! idle cost of 10,000 parked runs, first answer over 10,000 stored runs, decision latency among
//! them, WAL and database sizes after 20,000 runs (`DAGLOOP_BENCH_PARKED`,
//! `DAGLOOP_BENCH_STORED` change the counts). Then issue 46's rows (support/burst.rs): RSS and
//! threads after a burst of 5,000 runs parked and a minute idle, beside a restarted server, and
//! the time from SIGKILL of a run's server to another server driving it.
//! `DAGLOOP_BENCH_ONLY=burst` runs only those; `DAGLOOP_BENCH_BIN` runs another build's
//! `dagloop` (its figures beside this one's).

#[path = "support/burst.rs"]
mod burst;
#[path = "support/parked.rs"]
mod parked;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use eventsource_stream::Eventsource;
use futures::StreamExt;
use serde_json::{Value, json};

fn goal(dir: &std::path::Path, policy: &str) -> Value {
    let script = json!({"turns": [
        {"solution": {"calls": [{"_tool": "greet", "name": "Ada", "_output": {"greeting": "Hello Ada"},
            "_outputPath": "†state.g"}], "output": null}},
        {"solution": {"calls": [], "output": {"greeting": "†state.g.greeting"}}}
    ]});
    let path = dir.join("s.json");
    std::fs::write(&path, script.to_string()).expect("script");
    let greet = json!({"_tool": "greet", "type": "object", "properties": {"name": {"type": "string"}},
        "required": ["name"], "_output": {"type": "object"}});
    let hold = json!({"_tool": "hold", "_activity": "http", "_http": {"method": "POST", "url": "http://127.0.0.1:9/"},
        "type": "object"});
    let mut g = json!({"goal": "greet", "model": format!("scripted:{}", path.display()),
        "output_schema": {"type": "object", "required": ["greeting"]}, "tools": [greet, hold],
        "approval": {"policy": policy}});
    if policy == "ask" {
        // Held runs: one call that waits for a reviewer.
        let held = json!({"turns": [{"solution": {"calls": [{"_tool": "hold"}], "output": null}}]});
        let p = dir.join("held.json");
        std::fs::write(&p, held.to_string()).expect("script");
        g["model"] = json!(format!("scripted:{}", p.display()));
    }
    g
}

struct Server {
    child: Child,
    base: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(dir: &std::path::Path) -> Server {
    start_at(dir, &dir.join("runs.db"))
}

/// `dagloop serve` over the store `store` (the config in `dir`).
fn start_at(dir: &std::path::Path, store: &std::path::Path) -> Server {
    // The goals' scripted models live in a temporary folder and their tool on loopback: the
    // operator grants both.
    let config = dir.join("config.json");
    std::fs::write(
        &config,
        r#"{"grants": {"tools": ["http", "delegate", "mcp", "shell"], "egress": {"private": true}, "files": ["/"]}}"#,
    )
    .expect("config");
    // `DAGLOOP_BENCH_BIN`: another build's binary (e.g. main's, for before-and-after figures).
    let bin = std::env::var_os("DAGLOOP_BENCH_BIN")
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_dagloop").into());
    let mut child = Command::new(bin)
        .arg("--config")
        .arg(&config)
        .args(["serve", "--addr", "127.0.0.1:0", "--store"])
        .arg(store)
        .env_remove("DAGLOOP_TOKEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("line");
    let v: Value = serde_json::from_str(&line).expect("json");
    let base = v["url"]
        .as_str()
        .expect("url")
        .trim_end_matches('/')
        .to_string();
    Server { child, base }
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

async fn one_run(c: &reqwest::Client, base: &str, goal: &Value) -> Duration {
    let t = Instant::now();
    let r: Value = c
        .post(format!("{base}/runs"))
        .json(goal)
        .send()
        .await
        .expect("post")
        .json()
        .await
        .expect("json");
    let id = r["id"].as_str().expect("id");
    let mut s = c
        .get(format!("{base}/runs/{id}/events"))
        .send()
        .await
        .expect("events")
        .bytes_stream()
        .eventsource();
    while let Some(Ok(ev)) = s.next().await {
        if ev.event == "run_finished" {
            break;
        }
    }
    t.elapsed()
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)].as_secs_f64() * 1000.0
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tmp");
    let server = start(dir.path());
    let base = server.base.clone();
    let auto = goal(dir.path(), "auto");
    println!("server: dagloop serve on loopback, scripted model, SQLite store (WAL)");
    rt.block_on(async {
        let c = dagloop::net::client().expect("an HTTP client");
        if std::env::var("DAGLOOP_BENCH_ONLY").as_deref() == Ok("burst") {
            burst::burst(&c, dir.path(), &goal(dir.path(), "ask")).await;
            burst::takeover(&c, dir.path()).await;
            return;
        }
        one_run(&c, &base, &auto).await; // warm-up
        for (clients, runs_each) in [(1usize, 100usize), (10, 30), (100, 5)] {
            let t = Instant::now();
            let mut tasks = Vec::new();
            for _ in 0..clients {
                let (c, base, g) = (c.clone(), base.clone(), auto.clone());
                tasks.push(tokio::spawn(async move {
                    let mut lat = Vec::new();
                    for _ in 0..runs_each {
                        lat.push(one_run(&c, &base, &g).await);
                    }
                    lat
                }));
            }
            let mut lat: Vec<Duration> = Vec::new();
            for t in tasks {
                lat.extend(t.await.expect("client"));
            }
            let secs = t.elapsed().as_secs_f64();
            lat.sort();
            println!(
                "clients={clients:<4} runs={:<5} runs_per_s={:>8.1} p50_ms={:>8.2} p99_ms={:>8.2}",
                lat.len(),
                lat.len() as f64 / secs,
                pct(&lat, 0.5),
                pct(&lat, 0.99)
            );
        }
        // Memory per live run: runs held waiting for a reviewer.
        let held = goal(dir.path(), "ask");
        let pid = server.child.id();
        let before = rss_kib(pid);
        let n = 500;
        for _ in 0..n {
            c.post(format!("{base}/runs"))
                .json(&held)
                .send()
                .await
                .expect("post");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let after = rss_kib(pid);
        println!(
            "live_runs={n} rss_before_kib={before} rss_after_kib={after} kib_per_live_run={:.1}",
            after.saturating_sub(before) as f64 / n as f64
        );
        // A run that waits for a decision on its one call (a shell command: calls that carry
        // their own `_output` are never presented), then finishes.
        let script = json!({"turns": [
            {"solution": {"calls": [{"_tool": "echo", "_outputPath": "†state.g"}], "output": null}},
            {"solution": {"calls": [], "output": {"greeting": "†state.g.stdout"}}}
        ]});
        let p = dir.path().join("ask.json");
        std::fs::write(&p, script.to_string()).expect("script");
        let echo = json!({"_tool": "echo", "_activity": "shell", "_shell": {"command": ["echo", "Hello Ada"]},
            "type": "object"});
        let ask = json!({"goal": "greet after a decision", "model": format!("scripted:{}", p.display()),
            "output_schema": {"type": "object", "required": ["greeting"]}, "tools": [echo],
            "approval": {"policy": "ask"}});
        parked::rows(&c, dir.path(), &auto, &ask).await;
        burst::burst(&c, dir.path(), &held).await;
        burst::takeover(&c, dir.path()).await;
    });
}
