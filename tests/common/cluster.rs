//! Two `dagloop serve --engine temporal` servers and two `dagloop worker` processes against
//! Temporal's development server, for the tests of the Temporal server (`temporal_serve`,
//! `temporal_bounds`). Deliberately not here: the dev server and worker processes themselves
//! (`temporal.rs`), the servers' own helpers (`serve.rs`).
#![allow(dead_code)]

use std::time::{Duration, Instant};

use serde_json::Value;

use super::bin;
use super::serve::{self, Server, client, send};
use super::temporal::{DevServer, WorkerProcess};

/// `dagloop serve --engine temporal` on a free port under the operator config `config`, in
/// `dir` (where the goals' scripts are).
pub fn temporal_server(
    dir: &std::path::Path,
    config: &std::path::Path,
    s: &DevServer,
    queue: &str,
    env: &[(&str, &str)],
) -> Server {
    let store = dir.join(format!("unused-{}.db", rand_suffix()));
    Server::start_config(&store, config, None, |c| {
        c.envs(env.iter().copied());
        c.current_dir(dir).args([
            "--engine",
            "temporal",
            "--temporal",
            &s.address,
            "--task-queue",
            queue,
        ]);
    })
}

pub fn rand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// Polls `GET /runs/{id}` on `s` until `pred` holds (60 s at most).
pub async fn until(s: &Server, id: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, v) = send(client().get(s.url(&format!("/runs/{id}")))).await;
        if status == 200 && pred(&v) {
            return v;
        }
        assert!(Instant::now() < deadline, "never reached: {status} {v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub async fn decide(s: &Server, id: &str, call: u64, body: Value) -> (u16, Value) {
    send(
        client()
            .post(s.url(&format!("/runs/{id}/approvals/{call}")))
            .json(&body),
    )
    .await
}

pub fn awaits_both(v: &Value) -> bool {
    serve::awaiting(v).len() == 2
}

/// Temporal's dev server, two workers and two servers on it, in a folder of their own.
pub struct Cluster {
    pub a: Server,
    pub b: Server,
    pub workers: [WorkerProcess; 2],
    pub dir: tempfile::TempDir,
    pub dev: DevServer,
}

/// A [`Cluster`] whose servers run under the operator config `config` (the tests' open one when
/// None), or None (SKIPPED) without `DAGLOOP_TEMPORAL`.
pub async fn cluster(config: Option<Value>) -> Option<Cluster> {
    cluster_with(config, &[]).await
}

/// [`cluster`], its servers started with `env` set.
pub async fn cluster_with(config: Option<Value>, env: &[(&str, &str)]) -> Option<Cluster> {
    cluster_full(config, env, false).await
}

/// [`cluster_with`]; with `shared`, the workers run under the servers' config too.
pub async fn cluster_full(
    config: Option<Value>,
    env: &[(&str, &str)],
    shared: bool,
) -> Option<Cluster> {
    let Some(s) = DevServer::start() else {
        println!("SKIPPED: DAGLOOP_TEMPORAL is not set (scripts/setup-temporal.sh prints it)");
        return None;
    };
    let _conn = s.connect().await;
    let dir = tempfile::tempdir().expect("dir");
    let config = match config {
        Some(c) => {
            let path = dir.path().join("config.json");
            std::fs::write(&path, c.to_string()).expect("config");
            path
        }
        None => bin::open_config(),
    };
    let worker = || match shared {
        true => WorkerProcess::start_config(bin::dagloop(), &s, "serve", &config),
        false => WorkerProcess::start(bin::dagloop(), &s, "serve"),
    };
    let (w1, w2) = (worker(), worker());
    s.wait_for_pollers("serve", &[&w1, &w2]);
    let a = temporal_server(dir.path(), &config, &s, "serve", env);
    let b = temporal_server(dir.path(), &config, &s, "serve", env);
    Some(Cluster {
        a,
        b,
        workers: [w1, w2],
        dir,
        dev: s,
    })
}
