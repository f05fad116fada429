//! A store whose disk fills up, through the binary (issue 46: "a command that fails gives its
//! lease back"). The store lives on a tiny file system (a tmpfs mounted in a user and mount
//! namespace of the test's own, so no privileges are needed); a waiting run is resumed with
//! the disk filled up to leave 0, 8, 16... KiB, so that the resume fails at every step it can
//! fail at (claiming the run, recording the decision, journaling the call's output, recording
//! the end). Whatever step failed, the resume ends (it used to wait forever for a decision it
//! could not record, holding its lease) and gives the lease back in the store's row (it used to
//! keep it: only a process of the same host could tell its owner was gone), and the next
//! `resume --no-wait` continues the run at once. The same through `dagloop serve`: a run the
//! server drives on such a disk ends with a `store.*` code, its lease given back, and the
//! server answers every request with a coded answer and goes on serving.

#[path = "common/bin.rs"]
mod bin;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

/// A tmpfs of `SIZE` mounted on a folder in a mount namespace of its own, kept by a sleeping
/// process: commands run in it through `nsenter`, and the test reaches its files through
/// `/proc/PID/root`.
struct TinyDisk {
    holder: Child,
    /// The mount point, as the namespace sees it.
    inside: PathBuf,
    /// The same folder, from the test's namespace.
    outside: PathBuf,
}

impl TinyDisk {
    const SIZE: &'static str = "1m";

    /// A tiny disk mounted at `dir/mnt`; None (saying the test is skipped) when this system
    /// cannot make one.
    fn mount_in(dir: &Path) -> Option<TinyDisk> {
        let mnt = dir.join("mnt");
        std::fs::create_dir(&mnt).unwrap_or_else(|e| panic!("{e}"));
        let disk = TinyDisk::mount(&mnt);
        if disk.is_none() {
            eprintln!("SKIPPED: no user namespaces here to mount a tiny file system in");
        }
        disk
    }

    /// None when this system cannot make one (no `unshare`, no user namespaces).
    fn mount(dir: &Path) -> Option<TinyDisk> {
        let mut holder = Command::new("unshare")
            .args(["-Urm", "sh", "-c"])
            .arg("mount -t tmpfs -o size=\"$1\" tmpfs \"$0\" && echo mounted && exec sleep 3600")
            .arg(dir)
            .arg(TinyDisk::SIZE)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        let mut line = String::new();
        let read = holder
            .stdout
            .take()
            .map(|out| BufReader::new(out).read_line(&mut line));
        if !matches!(read, Some(Ok(_))) || line.trim() != "mounted" {
            let _ = holder.kill();
            let _ = holder.wait();
            return None;
        }
        let outside = PathBuf::from(format!("/proc/{}/root", holder.id())).join(
            dir.strip_prefix("/")
                .unwrap_or_else(|e| panic!("{}: {e}", dir.display())),
        );
        Some(TinyDisk {
            holder,
            inside: dir.to_path_buf(),
            outside,
        })
    }

    /// `dagloop ARGS` in the namespace, on the store on this disk.
    fn dagloop(&self) -> Command {
        let inner = bin::dagloop();
        let mut c = Command::new("nsenter");
        c.arg("-t")
            .arg(self.holder.id().to_string())
            .args(["-U", "-m", "--"])
            .arg(inner.get_program())
            .args(inner.get_args());
        for (k, v) in inner.get_envs() {
            match v {
                Some(v) => c.env(k, v),
                None => c.env_remove(k),
            };
        }
        c.env("DAGLOOP_STORE", self.inside.join("runs.db"))
            .stdin(Stdio::null());
        c
    }

    /// Empties the disk, then puts the files of the store at `store` (`runs.db*`) on it.
    fn load(&self, store: &Path) {
        self.clear();
        let dir = store.parent().unwrap_or_else(|| panic!("no folder"));
        for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{e}")) {
            let e = e.unwrap_or_else(|e| panic!("{e}"));
            let name = e.file_name();
            if name.to_string_lossy().starts_with("runs.db") {
                std::fs::copy(e.path(), self.outside.join(&name))
                    .unwrap_or_else(|err| panic!("{}: {err}", e.path().display()));
            }
        }
    }

    /// Fills the disk but for `left` bytes (whole pages): a file is written until the disk
    /// refuses, then cut back.
    fn fill(&self, left: u64) {
        let path = self.outside.join("filler");
        let mut f = std::fs::File::create(&path).unwrap_or_else(|e| panic!("{e}"));
        for chunk in [64 << 10, 4 << 10] {
            let block = vec![b'x'; chunk];
            while f.write_all(&block).is_ok() {}
        }
        let len = f.metadata().map_or(0, |m| m.len());
        f.set_len(len.saturating_sub(left))
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// Removes every file from the disk.
    fn clear(&self) {
        for e in std::fs::read_dir(&self.outside).unwrap_or_else(|e| panic!("{e}")) {
            let e = e.unwrap_or_else(|e| panic!("{e}"));
            std::fs::remove_file(e.path()).unwrap_or_else(|e| panic!("{e}"));
        }
    }

    /// `dagloop serve` in the namespace on the store on this disk, under the tests' open
    /// config (killed when dropped); and its base URL.
    fn serve(&self) -> (Served, String) {
        let mut c = self.dagloop();
        c.arg("--config")
            .arg(bin::open_config())
            .args(["serve", "--addr", "127.0.0.1:0", "--store"])
            .arg(self.inside.join("runs.db"))
            .env_remove("DAGLOOP_TOKEN")
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = c.spawn().unwrap_or_else(|e| panic!("spawn: {e}"));
        let mut line = String::new();
        let out = child.stdout.take().unwrap_or_else(|| panic!("stdout"));
        BufReader::new(out)
            .read_line(&mut line)
            .unwrap_or_else(|e| panic!("{e}"));
        let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
        let base = v["url"].as_str().unwrap_or_default();
        (Served(child), base.trim_end_matches('/').to_string())
    }

    fn unfill(&self) {
        std::fs::remove_file(self.outside.join("filler")).unwrap_or_else(|e| panic!("{e}"));
    }

    /// The run's lease holder as the store's row has it (read from a copy of the files).
    fn owner(&self, run: &str, scratch: &Path) -> Option<String> {
        let _ = std::fs::remove_dir_all(scratch);
        std::fs::create_dir_all(scratch).unwrap_or_else(|e| panic!("{e}"));
        for name in ["runs.db", "runs.db-wal"] {
            let from = self.outside.join(name);
            if from.exists() {
                std::fs::copy(&from, scratch.join(name)).unwrap_or_else(|e| panic!("{e}"));
            }
        }
        rusqlite::Connection::open(scratch.join("runs.db"))
            .and_then(|c| c.query_row("SELECT owner FROM runs WHERE id = ?1", [run], |r| r.get(0)))
            .unwrap_or_else(|e| panic!("{e}"))
    }
}

/// A server process, killed when dropped (a failed assertion leaves none behind).
struct Served(Child);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for TinyDisk {
    fn drop(&mut self) {
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}

fn json_of(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// `command`'s output; `Err` with the end of what it printed when it had not ended within
/// `limit` (it is killed then).
fn output_within(mut command: Command, limit: Duration) -> Result<Output, String> {
    let child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn: {e}"));
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = match rx.recv_timeout(limit) {
        Ok(out) => return Ok(out.unwrap_or_else(|e| panic!("{e}"))),
        Err(_) => {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            rx.recv()
                .unwrap_or_else(|e| panic!("{e}"))
                .unwrap_or_else(|e| panic!("{e}"))
        }
    };
    let tail = |b: &[u8]| {
        let s = String::from_utf8_lossy(b);
        s.chars()
            .rev()
            .take(2000)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<String>()
    };
    Err(format!(
        "{}\nstderr: {}",
        tail(&out.stdout),
        tail(&out.stderr)
    ))
}

/// One call, to a shell tool whose output (200 KB) is journaled, then the answer.
fn goal(dir: &Path) -> Value {
    let script = json!({"turns": [
        {"solution": {"calls": [{"_tool": "big", "_outputPath": "†state.a"}], "output": null}},
        {"solution": {"calls": [], "output": {"done": true}}}
    ]});
    let path = dir.join("s.json");
    std::fs::write(&path, script.to_string()).unwrap_or_else(|e| panic!("{e}"));
    json!({"goal": "fill the disk", "model": format!("scripted:{}", path.display()),
        "output_schema": {"type": "object"},
        "tools": [{"_tool": "big", "_activity": "shell", "type": "object",
            "_shell": {"command": ["sh", "-c", "head -c 200000 /dev/zero | tr '\\0' x"]}}]})
}

/// [`goal`] as a file.
fn write_goal(dir: &Path) -> PathBuf {
    let path = dir.join("goal.json");
    std::fs::write(&path, goal(dir).to_string()).unwrap_or_else(|e| panic!("{e}"));
    path
}

#[test]
fn a_resume_that_fails_on_a_full_disk_ends_and_gives_its_lease_back() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let Some(disk) = TinyDisk::mount_in(dir.path()) else {
        return;
    };
    let goal = write_goal(dir.path());
    let decisions = dir.path().join("approve.json");
    std::fs::write(
        &decisions,
        json!({"decisions": [{"tool": "big", "decision": "approve"}]}).to_string(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    // The run, waiting for its call's decision, in a store on the ordinary disk: copied onto
    // the tiny one before each try.
    let pristine = dir.path().join("pristine");
    std::fs::create_dir(&pristine).unwrap_or_else(|e| panic!("{e}"));
    let out = bin::dagloop()
        .arg("run")
        .arg(&goal)
        .args([
            "--approve",
            "ask",
            "--detach",
            "--json",
            "--allow-shell",
            "--store",
        ])
        .arg(pristine.join("runs.db"))
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let v = json_of(&out);
    assert_eq!(v["status"], "waiting", "{v}");
    let run = v["run_id"].as_str().unwrap_or_default().to_string();
    let mut failed = 0;
    for pages in (0..=40).step_by(2) {
        let left = pages * 4096;
        disk.load(&pristine.join("runs.db"));
        disk.fill(left);
        let mut resume = disk.dagloop();
        resume
            .args(["resume", &run, "--json", "--allow-shell", "--decisions"])
            .arg(&decisions);
        let out = output_within(resume, Duration::from_secs(60)).unwrap_or_else(|printed| {
            panic!("with {left} bytes left, the resume never ended (it held the run's lease): {printed}")
        });
        disk.unfill();
        let v = json_of(&out);
        if v["status"] != "succeeded" {
            failed += 1;
            let code = v["error"]["code"].as_str().unwrap_or_default();
            assert!(
                code.starts_with("store."),
                "with {left} bytes left: {v}\nstderr: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        assert_eq!(
            disk.owner(&run, &dir.path().join("scratch")),
            None,
            "with {left} bytes left ({}), the resume gave the lease back",
            v["status"]
        );
        // The next process continues the run at once.
        let mut next = disk.dagloop();
        next.args(["resume", &run, "--json", "--no-wait", "--detach"]);
        let out = output_within(next, Duration::from_secs(60)).unwrap_or_else(|printed| {
            panic!(
                "with {left} bytes left, then room again, the next resume never ended: {printed}"
            )
        });
        let v = json_of(&out);
        assert!(
            v["status"] == "waiting" || v["status"] == "succeeded",
            "with {left} bytes left, then room again: {v}"
        );
    }
    assert!(failed >= 5, "the disk filled up in {failed} tries only");
}

/// A JSON answer of the server: its status and body.
async fn answer(r: reqwest::RequestBuilder) -> (u16, Value) {
    let r = r
        .send()
        .await
        .unwrap_or_else(|e| panic!("the server answers: {e}"));
    let status = r.status().as_u16();
    let text = r.text().await.unwrap_or_else(|e| panic!("{e}"));
    let body = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    (status, body)
}

/// A run `dagloop serve` drives on a store whose disk fills up once the run waits for its
/// call's decision, filled to leave 0, 16, 32... KiB: the decision, the call's 200 KB output
/// or the run's end cannot be written. Whatever step failed, the server answers with a
/// `store.*` code (never `server.internal`), drives the run no longer, the store's row gives
/// the lease back (the end or park is written in the room of the reserve, `STORE-reserve`),
/// and the server goes on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_whose_disk_fills_up_ends_the_run_with_a_store_code_and_gives_its_lease_back() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let Some(disk) = TinyDisk::mount_in(dir.path()) else {
        return;
    };
    let mut body = goal(dir.path());
    body["approval"] = json!({"policy": "ask"});
    let c = dagloop::net::client().unwrap_or_else(|e| panic!("{e}"));
    let mut failed = 0;
    for pages in (0..=40).step_by(4) {
        let left = pages * 4096;
        disk.clear();
        let (server, base) = disk.serve();
        let (status, v) = answer(c.post(format!("{base}/runs")).json(&body)).await;
        assert_eq!(status, 201, "{v}");
        let id = v["id"].as_str().unwrap_or_default().to_string();
        let run = format!("{base}/runs/{id}");
        let mut v = Value::Null;
        for _ in 0..400 {
            v = answer(c.get(&run)).await.1;
            if v["awaiting"].as_array().is_some_and(|a| !a.is_empty()) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        let call = v["awaiting"][0]["call_id"].as_u64().unwrap_or(1);
        disk.fill(left);
        let decided = answer(
            c.post(format!("{run}/approvals/{call}"))
                .json(&json!({"decision": "approve"})),
        )
        .await;
        // Applied, recorded, or refused with a code, never a 500: a decision the store cannot
        // record is 507 `store.io` saying the disk is full; a run the full disk stopped
        // already is `op.run_finished`; a run that cannot journal the decision
        // `op.unavailable` (503), naming the full disk.
        let coded = |(status, v): &(u16, Value)| {
            let code = v["code"].as_str().unwrap_or_default();
            let message = v["message"].as_str().unwrap_or_default();
            match status {
                ..400 => true,
                507 => code == "store.io" && message.contains("disk is full"),
                500 => false,
                _ => !code.is_empty() && code != "server.internal",
            }
        };
        assert!(
            coded(&decided),
            "with {left} bytes left, the decision: {decided:?}"
        );
        // The server stops driving the run (it ended, or stopped resumable): it no longer
        // counts it, and the run is not running.
        let mut driven = true;
        for _ in 0..600 {
            let (_, now) = answer(c.get(&run)).await;
            if now["status"] == "running" {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            let text = c
                .get(format!("{base}/metrics"))
                .send()
                .await
                .unwrap_or_else(|e| panic!("{e}"))
                .text()
                .await
                .unwrap_or_default();
            if text.lines().any(|l| l == "dagloop_runs_driven 0") {
                driven = false;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            !driven,
            "with {left} bytes left, the server drove the run on for 30 s"
        );
        let seen = answer(c.get(&run)).await;
        assert_eq!(seen.0, 200, "with {left} bytes left: {seen:?}");
        let status = seen.1["status"].as_str().unwrap_or_default().to_string();
        if status != "succeeded" {
            failed += 1;
        }
        if let Some(code) = seen.1["error"]["code"].as_str() {
            assert!(
                code.starts_with("store."),
                "with {left} bytes left: {}",
                seen.1
            );
        }
        disk.unfill();
        // Still serving, with room again; and the lease is given back (at once in the room of
        // the reserve, or, when the reserve was spent already, once there is room again: the
        // server tries again at each poll, 200 ms).
        let (code, v) = answer(c.get(&run)).await;
        assert_eq!(code, 200, "{v}");
        let scratch = dir.path().join("scratch");
        let mut owner = disk.owner(&id, &scratch);
        for _ in 0..30 {
            if owner.is_none() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            owner = disk.owner(&id, &scratch);
        }
        assert_eq!(
            owner, None,
            "with {left} bytes left ({status}), the server gave the lease back"
        );
        drop(server);
    }
    assert!(failed >= 3, "the disk filled up in {failed} tries only");
}
