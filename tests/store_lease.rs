//! Nothing strands a run (issue 25), through the binary: commands that only read or continue
//! runs refuse a store file that does not exist; ownership of a run is a lease in the store
//! (concurrent `resume`s leave exactly one driver, a stale lease is taken over, a PID means
//! nothing); a journal that cannot be written stops a run resumable; `--detach` detaches even
//! when the goal has a deadline, and `resume` without a reviewer refuses as `run` does.

#[path = "common/bin.rs"]
mod bin;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use axum::routing::post;
use dagloop::store::OwnerProcess;
use serde_json::{Value, json};

/// What the service does when a call `n` arrives, before it answers (on a blocking thread).
type Hook = Arc<dyn Fn(u64) + Send + Sync>;

/// A service that counts how many times each `n` ran, answers after `delay`, and runs a hook
/// first when one is set.
#[derive(Clone)]
struct Service {
    url: String,
    counts: Arc<Mutex<BTreeMap<u64, u64>>>,
    hook: Arc<Mutex<Option<Hook>>>,
    delay: Arc<Mutex<Duration>>,
}

impl Service {
    async fn start() -> Service {
        let svc = Service {
            url: String::new(),
            counts: Arc::default(),
            hook: Arc::default(),
            delay: Arc::new(Mutex::new(Duration::from_millis(10))),
        };
        let app = axum::Router::new()
            .route(
                "/step",
                post(
                    |State(s): State<Service>, Json(body): Json<Value>| async move {
                        let n = body["n"].as_u64().unwrap_or(0);
                        *s.counts.lock().expect("counts").entry(n).or_default() += 1;
                        let hook = s.hook.lock().expect("hook").clone();
                        if let Some(h) = hook {
                            tokio::task::spawn_blocking(move || h(n))
                                .await
                                .expect("hook");
                        }
                        let delay = *s.delay.lock().expect("delay");
                        tokio::time::sleep(delay).await;
                        Json(json!({"n": n, "v": n * 10}))
                    },
                ),
            )
            .with_state(svc.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}/step", listener.local_addr().expect("addr"));
        tokio::spawn(async move { axum::serve(listener, app).await });
        Service { url, ..svc }
    }

    fn set_hook(&self, h: impl Fn(u64) + Send + Sync + 'static) {
        *self.hook.lock().expect("hook") = Some(Arc::new(h));
    }

    fn clear_hook(&self) {
        *self.hook.lock().expect("hook") = None;
    }

    fn set_delay(&self, d: Duration) {
        *self.delay.lock().expect("delay") = d;
    }

    fn counts(&self) -> BTreeMap<u64, u64> {
        self.counts.lock().expect("counts").clone()
    }
}

/// Two dependent calls (`n` 1 then 2), then the output `{"total": <call 2's result>}`. `extra`
/// is merged into the goal (`limits`, `approval`).
fn write_goal(dir: &Path, url: &str, idempotent: bool, extra: Value) -> PathBuf {
    let step = json!({"_tool": "step", "_activity": "http", "_idempotent": idempotent,
        "_http": {"method": "POST", "url": url},
        "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]});
    let mut goal = json!({"goal": "lease test", "model": "scripted:s.json",
        "output_schema": {"type": "object", "required": ["total"]}, "tools": [step]});
    if let (Some(g), Some(x)) = (goal.as_object_mut(), extra.as_object()) {
        for (k, v) in x {
            g.insert(k.clone(), v.clone());
        }
    }
    let calls = json!([
        {"_tool": "step", "n": 1, "_outputPath": "†state.a"},
        {"_tool": "step", "n": 2, "after": "†state.a", "_outputPath": "†state.b"}
    ]);
    let script = json!({"turns": [
        {"solution": {"calls": calls, "output": null}},
        {"solution": {"calls": [], "output": {"total": "†state.b"}}}
    ]});
    std::fs::write(dir.join("s.json"), script.to_string()).expect("script");
    let path = dir.join("goal.json");
    std::fs::write(&path, goal.to_string()).expect("goal");
    path
}

/// A decisions file approving every call.
fn approve_all(dir: &Path) -> PathBuf {
    let path = dir.join("approve.json");
    std::fs::write(
        &path,
        json!({"decisions": [{"tool": "step", "decision": "approve"}]}).to_string(),
    )
    .expect("decisions");
    path
}

fn total() -> Value {
    json!({"total": {"n": 2, "v": 20}})
}

/// `n` processes made by `command`, started together; their outputs once all have ended.
fn at_once(n: usize, command: impl Fn() -> Command) -> Vec<Output> {
    let children: Vec<_> = (0..n)
        .map(|_| {
            command()
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn")
        })
        .collect();
    children
        .into_iter()
        .map(|c| c.wait_with_output().expect("wait"))
        .collect()
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Sets the lease on `run` directly, as another owner would have left it.
fn set_lease(store: &Path, run: &str, owner: Option<&str>, expires_at: Option<i64>) {
    let db = rusqlite::Connection::open(store).expect("open");
    db.busy_timeout(Duration::from_secs(10)).expect("busy");
    let n = db
        .execute(
            "UPDATE runs SET owner = ?2, lease_expires_at = ?3 WHERE id = ?1",
            rusqlite::params![run, owner, expires_at],
        )
        .expect("update");
    assert_eq!(n, 1);
}

/// `(owner, lease_expires_at, result is set)` of `run` as stored.
fn lease_of(store: &Path, run: &str) -> (Option<String>, Option<i64>, bool) {
    let db = rusqlite::Connection::open(store).expect("open");
    db.query_row(
        "SELECT owner, lease_expires_at, result IS NOT NULL FROM runs WHERE id = ?1",
        [run],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )
    .expect("row")
}

/// `run GOAL --approve ask --detach --json`: the run waits for its first call's decision.
fn waiting_run(store: &Path, goal: &Path) -> String {
    let out = dagloop(store)
        .arg("run")
        .arg(goal)
        .args(["--approve", "ask", "--detach", "--json"])
        .output()
        .expect("run");
    let v = json_of(&out);
    assert_eq!(v["status"], "waiting", "{v}");
    v["run_id"].as_str().expect("run id").to_string()
}

fn code_of(out: &Output) -> String {
    json_of(out)["error"]["code"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

/// The run's status as `dagloop show` has it.
fn shown_status(store: &Path, run: &str) -> Value {
    let v = json_of(
        &dagloop(store)
            .args(["show", run, "--json"])
            .output()
            .expect("show"),
    );
    v["status"].clone()
}

/// Of processes that each tried to drive one run: exactly one drove it to success, every other
/// one was refused with `store.busy` (exit 2).
fn one_driver(outs: &[Output]) {
    let mut drove = 0;
    let mut busy = 0;
    for out in outs {
        let v = json_of(out);
        match out.status.code() {
            Some(0) if v["status"] == "succeeded" => {
                assert_eq!(v["output"], total(), "{v}");
                drove += 1;
            }
            Some(2) if v["error"]["code"] == "store.busy" => busy += 1,
            other => panic!(
                "neither the driver nor refused as busy ({other:?}): {v}\nstderr: {}",
                String::from_utf8_lossy(&out.stderr)
            ),
        }
    }
    assert_eq!((drove, busy), (1, outs.len() - 1));
}

fn dagloop(store: &Path) -> Command {
    let mut c = bin::dagloop();
    c.env("DAGLOOP_STORE", store).stdin(Stdio::null());
    c
}

/// The one run `dagloop runs --json` lists.
fn listed_row(store: &Path) -> Value {
    let out = dagloop(store)
        .args(["runs", "--json"])
        .output()
        .expect("runs");
    let v = json_of(&out);
    assert_eq!(v.as_array().map(Vec::len), Some(1), "{v}");
    v[0].clone()
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

/// A store path that does not exist, in a folder that does not exist either.
fn missing(dir: &Path) -> PathBuf {
    dir.join("typo").join("runz.db")
}

#[test]
fn read_only_commands_refuse_a_store_file_that_does_not_exist_and_create_nothing() {
    let dir = tempfile::tempdir().expect("dir");
    let path = missing(dir.path());
    for args in [
        vec!["show", "run-1", "--json"],
        vec!["runs", "--json"],
        vec!["runs", "prune", "--older-than", "1d"],
        vec!["decide", "run-1", "1", "approve"],
        vec!["resume", "run-1", "--json"],
    ] {
        // Through --store, and through DAGLOOP_STORE.
        for by_flag in [true, false] {
            let mut c = bin::dagloop();
            c.stdin(Stdio::null());
            if by_flag {
                c.arg("--store").arg(&path);
            } else {
                c.env("DAGLOOP_STORE", &path);
            }
            let out = c.args(&args).output().expect("dagloop");
            assert_eq!(out.status.code(), Some(2), "{args:?}");
            let v = json_of(&out);
            assert_eq!(v["error"]["code"], "store.not_found", "{args:?}: {v}");
            assert!(
                v["error"]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains(&path.display().to_string())),
                "{args:?}: the message names the path: {v}"
            );
            assert!(!path.exists(), "{args:?} created the store");
            assert!(
                !path.parent().is_some_and(Path::exists),
                "{args:?} made its folder"
            );
        }
    }
    // A command that starts runs still creates its store.
    let goal = dir.path().join("goal.json");
    std::fs::write(
        dir.path().join("s.json"),
        json!({"turns": [{"solution": {"calls": [], "output": {"x": 1}}}]}).to_string(),
    )
    .expect("script");
    std::fs::write(
        &goal,
        json!({"goal": "g", "model": "scripted:s.json", "output_schema": {"type": "object"}})
            .to_string(),
    )
    .expect("goal");
    let out = dagloop(&path)
        .arg("run")
        .arg(&goal)
        .arg("--json")
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed = json_of(
        &dagloop(&path)
            .args(["runs", "--json"])
            .output()
            .expect("runs"),
    );
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");
}

/// N `resume --no-wait`s of a run that waits for a decision, started at once (N = 2 and 8):
/// exactly one drives it (with the decisions file) to its end, the others are refused with
/// `store.busy`; every call ran once and no write failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_resumes_of_a_waiting_run_leave_exactly_one_driver() {
    let svc = Service::start().await;
    let dir = tempfile::tempdir().expect("dir");
    let goal = write_goal(dir.path(), &svc.url, false, json!({}));
    let decisions = approve_all(dir.path());
    for n in [2, 8] {
        let store = dir.path().join(format!("wait-{n}.db"));
        let run = waiting_run(&store, &goal);
        // `resume --detach` at once: each one parks the run again or is refused as busy; none
        // ends it (they used to end it `journal_failed`).
        let outs = at_once(n, || {
            let mut c = dagloop(&store);
            c.args(["resume", &run, "--json", "--detach", "--no-wait"]);
            c
        });
        for out in &outs {
            let v = json_of(out);
            assert!(
                (out.status.code() == Some(0) && v["status"] == "waiting")
                    || (out.status.code() == Some(2) && v["error"]["code"] == "store.busy"),
                "{v}"
            );
        }
        assert_eq!(shown_status(&store, &run), "waiting");
        // Slow calls: the driver holds the lease while the others start.
        svc.set_delay(Duration::from_millis(2000));
        svc.counts.lock().expect("counts").clear();
        let outs = at_once(n, || {
            let mut c = dagloop(&store);
            c.args(["resume", &run, "--json", "--no-wait", "--decisions"])
                .arg(&decisions);
            c
        });
        one_driver(&outs);
        assert_eq!(svc.counts(), BTreeMap::from([(1, 1), (2, 1)]), "n={n}");
        assert_eq!(shown_status(&store, &run), "succeeded");
        assert_eq!(lease_of(&store, &run), (None, None, true), "released");
    }
}

/// A run killed (SIGKILL) mid-call, then at once (its 20 s lease far from expired) 8 `resume
/// --no-wait`s: the owner's process is gone, so one takes the run over at once and drives it to
/// its end; the seven others find that one alive and are refused with `store.busy`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_resumes_of_a_killed_run_leave_exactly_one_driver() {
    let svc = Service::start().await;
    let dir = tempfile::tempdir().expect("dir");
    let goal = write_goal(dir.path(), &svc.url, true, json!({}));
    let store = dir.path().join("killed.db");
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let tx = Mutex::new(tx);
    svc.set_hook(move |n| {
        if n == 1 {
            let _ = tx.lock().expect("tx").send(());
        }
    });
    svc.set_delay(Duration::from_secs(3));
    let mut child = dagloop(&store)
        .arg("run")
        .arg(&goal)
        .arg("--json")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    rx.recv_timeout(Duration::from_secs(60))
        .expect("call 1 arrived");
    // While its owner lives, the list says it is driven, and by whom.
    let listed = listed_row(&store);
    assert_eq!(
        (listed["status"].as_str(), listed["owner"].is_string()),
        (Some("running"), true),
        "{listed}"
    );
    child.kill().expect("kill");
    let out = child.wait_with_output().expect("wait");
    let run = String::from_utf8_lossy(&out.stderr)
        .lines()
        .find_map(|l| {
            serde_json::from_str::<Value>(l).ok()?["run_id"]
                .as_str()
                .map(String::from)
        })
        .expect("run id");
    // Its owner is gone (its lease has not expired): `runs` lists it as driven by nobody, as
    // `show` does, and `?status=running` no longer finds it.
    let listed = listed_row(&store);
    assert_eq!(listed["id"], run.as_str());
    assert_eq!(listed["status"], "stopped", "{listed}");
    assert!(listed.get("owner").is_none(), "{listed}");
    let running = json_of(
        &dagloop(&store)
            .args(["runs", "--json", "--status", "running"])
            .output()
            .expect("runs"),
    );
    assert_eq!(running, json!([]), "no run is driven");
    svc.clear_hook();
    svc.set_delay(Duration::from_millis(1500));
    let (_, expires, _) = lease_of(&store, &run);
    assert!(
        expires.is_some_and(|e| e > now_ms() + 5_000),
        "the killed process's lease has not expired"
    );
    // `show` reads the owner's process too: gone, so nobody drives the run.
    assert_eq!(shown_status(&store, &run), "stopped");
    let outs = at_once(8, || {
        let mut c = dagloop(&store);
        c.args(["resume", &run, "--json", "--no-wait"]);
        c
    });
    one_driver(&outs);
    // Call 1 was cut off by the kill and is idempotent: run again once, by the one driver.
    assert_eq!(svc.counts(), BTreeMap::from([(1, 2), (2, 1)]));
    assert_eq!(shown_status(&store, &run), "succeeded");
}

/// A lease held by another owner refuses `resume` with `store.busy` (naming the owner) while
/// it has not expired, `runs` lists the run as running and `decide` says the owner applies the
/// decision; once the lease has expired (its owner crashed), the next `resume` takes the run
/// over and finishes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_lease_refuses_and_a_stale_one_is_taken_over() {
    let svc = Service::start().await;
    let dir = tempfile::tempdir().expect("dir");
    let goal = write_goal(dir.path(), &svc.url, false, json!({}));
    let decisions = approve_all(dir.path());
    let store = dir.path().join("runs.db");
    let run = waiting_run(&store, &goal);
    assert_eq!(
        lease_of(&store, &run),
        (None, None, false),
        "detach released it"
    );
    let other = "00112233445566778899aabbccddeeff (pid 1 on elsewhere)";
    set_lease(&store, &run, Some(other), Some(now_ms() + 60_000));
    let out = dagloop(&store)
        .args(["resume", &run, "--json", "--no-wait", "--decisions"])
        .arg(&decisions)
        .output()
        .expect("resume");
    assert_eq!(out.status.code(), Some(2));
    let v = json_of(&out);
    assert_eq!(v["error"]["code"], "store.busy", "{v}");
    // It names the owner, and a time a person can read: seconds from now.
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(other), "{v}");
    assert!(
        message.contains("for another 60 s") || message.contains("for another 59 s"),
        "{v}"
    );
    let listed = json_of(
        &dagloop(&store)
            .args(["runs", "--json"])
            .output()
            .expect("runs"),
    );
    // It waits for a decision (what the list says first), driven by the other owner.
    assert_eq!(listed[0]["status"], "waiting", "{listed}");
    assert_eq!(listed[0]["owner"], other, "{listed}");
    let decided = json_of(
        &dagloop(&store)
            .args(["decide", &run, "1", "approve"])
            .output()
            .expect("decide"),
    );
    assert_eq!(decided["status"], "recorded", "{decided}");
    assert!(
        decided["next"]
            .as_str()
            .is_some_and(|n| n.contains("process running it")),
        "{decided}"
    );
    // The owner crashed: its lease ran out a second ago.
    set_lease(&store, &run, Some(other), Some(now_ms() - 1000));
    let listed = json_of(
        &dagloop(&store)
            .args(["runs", "--json"])
            .output()
            .expect("runs"),
    );
    assert_eq!(listed[0]["status"], "waiting", "{listed}");
    let out = dagloop(&store)
        .args(["resume", &run, "--json", "--decisions"])
        .arg(&decisions)
        .output()
        .expect("resume");
    let v = json_of(&out);
    assert_eq!(v["status"], "succeeded", "{v}");
    assert_eq!(v["output"], total());
    assert_eq!(svc.counts(), BTreeMap::from([(1, 1), (2, 1)]));
}

/// Sets the lease on `run` as a process left it: its owner id and expiry, and the process
/// (host, pid, start time) the lease names.
fn set_process_lease(
    store: &Path,
    run: &str,
    owner: &str,
    expires_at: i64,
    process: &OwnerProcess,
) {
    let db = rusqlite::Connection::open(store).expect("open");
    db.busy_timeout(Duration::from_secs(10)).expect("busy");
    let n = db
        .execute(
            "UPDATE runs SET owner = ?2, lease_expires_at = ?3, lease_host = ?4, lease_pid = ?5,
             lease_started = ?6 WHERE id = ?1",
            rusqlite::params![
                run,
                owner,
                expires_at,
                process.host,
                process.pid,
                process.started as i64
            ],
        )
        .expect("update");
    assert_eq!(n, 1);
}

/// `resume RUN --json --no-wait --detach`: the run parks again (`waiting`), or the error.
fn resume_no_wait(store: &Path, run: &str) -> Value {
    json_of(
        &dagloop(store)
            .args(["resume", run, "--json", "--no-wait", "--detach"])
            .output()
            .expect("resume"),
    )
}

/// A lease names its owner's process. One of this host that is gone (a pid no process has, or
/// a pid now held by a process that started at another time) is taken over at once, however
/// long the lease still runs. One of this host that is alive (this test's process), and one of
/// another host (another boot id), are waited for: `--no-wait` refuses with `store.busy`;
/// without it, `resume` prints one line naming the holder and how many seconds its lease runs,
/// waits for the lease to expire, and finishes the run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gone_owner_on_this_host_is_taken_over_at_once_and_any_other_is_waited_for() {
    let Some(me) = OwnerProcess::current() else {
        eprintln!("SKIPPED: this system does not tell processes apart (/proc)");
        return;
    };
    let svc = Service::start().await;
    let dir = tempfile::tempdir().expect("dir");
    let goal = write_goal(dir.path(), &svc.url, false, json!({}));
    let decisions = approve_all(dir.path());
    let store = dir.path().join("runs.db");
    let run = waiting_run(&store, &goal);
    let other = "00112233445566778899aabbccddeeff (pid 1234 on here)";
    let long = || now_ms() + 60_000;
    // Alive on this host: refused.
    set_process_lease(&store, &run, other, long(), me);
    let v = resume_no_wait(&store, &run);
    assert_eq!(v["error"]["code"], "store.busy", "a live owner: {v}");
    // The same pid, started at another time: a reused pid, its owner is gone.
    let reused = OwnerProcess {
        started: me.started + 1,
        ..me.clone()
    };
    set_process_lease(&store, &run, other, long(), &reused);
    let v = resume_no_wait(&store, &run);
    assert_eq!(v["status"], "waiting", "a reused pid: {v}");
    // A pid no process has.
    let mut exited = Command::new("true").spawn().expect("spawn");
    let gone = OwnerProcess {
        pid: exited.id(),
        ..me.clone()
    };
    exited.wait().expect("wait");
    set_process_lease(&store, &run, other, long(), &gone);
    let v = resume_no_wait(&store, &run);
    assert_eq!(v["status"], "waiting", "an exited owner: {v}");
    // Another host: its process cannot be judged from here, only its lease's expiry counts.
    let elsewhere = OwnerProcess {
        host: "0b0e0d1d-0000-4000-8000-000000000000/pid:[4026531836]".into(),
        ..gone
    };
    set_process_lease(&store, &run, other, long(), &elsewhere);
    let v = resume_no_wait(&store, &run);
    assert_eq!(v["error"]["code"], "store.busy", "another host: {v}");
    // Waited for: a lease of another host that runs out in 2 s.
    set_process_lease(&store, &run, other, now_ms() + 2_000, &elsewhere);
    let started = Instant::now();
    let out = dagloop(&store)
        .args(["resume", &run, "--json", "--decisions"])
        .arg(&decisions)
        .output()
        .expect("resume");
    let v = json_of(&out);
    assert_eq!(v["status"], "succeeded", "{v}");
    assert_eq!(v["output"], total());
    assert!(
        started.elapsed() >= Duration::from_millis(1_500),
        "it waited for the lease"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let told: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("is being run by"))
        .collect();
    assert_eq!(told.len(), 1, "one line about the holder: {stderr}");
    assert!(told[0].contains(other), "{stderr}");
    let seconds: Option<u64> = told[0]
        .split("for another ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok());
    assert!(
        seconds.is_some_and(|s| (1..=2).contains(&s)),
        "how long, in seconds: {stderr}"
    );
    assert_eq!(svc.counts(), BTreeMap::from([(1, 1), (2, 1)]));
}

/// A process whose lease another owner took while it drove the run never writes to the run
/// again: its next journal append is refused inside the append's transaction, and the run
/// stops (`stopped`, `store.lease_lost`) with no result recorded. The owner that holds the
/// lease (here: once it expired) continues it to its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_that_lost_its_lease_stops_and_never_appends() {
    let svc = Service::start().await;
    let dir = tempfile::tempdir().expect("dir");
    let goal = write_goal(dir.path(), &svc.url, true, json!({}));
    let store = dir.path().join("runs.db");
    let thief = "ffeeddccbbaa99887766554433221100 (pid 7 on elsewhere)";
    {
        let store = store.clone();
        svc.set_hook(move |n| {
            if n == 1 {
                let db = rusqlite::Connection::open(&store).expect("open");
                db.busy_timeout(Duration::from_secs(10)).expect("busy");
                db.execute(
                    "UPDATE runs SET owner = ?1, lease_expires_at = ?2",
                    rusqlite::params![thief, now_ms() + 60_000],
                )
                .expect("steal");
            }
        });
    }
    let out = dagloop(&store)
        .arg("run")
        .arg(&goal)
        .arg("--json")
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    let v = json_of(&out);
    assert_eq!(v["status"], "stopped", "{v}");
    assert_eq!(v["error"]["code"], "store.lease_lost", "{v}");
    let run = v["run_id"].as_str().expect("run id").to_string();
    let (owner, _, finished) = lease_of(&store, &run);
    assert_eq!(owner.as_deref(), Some(thief), "the lease stays the thief's");
    assert!(!finished, "no result was recorded");
    let journal = {
        use dagloop::store::{RunStore, SqliteStore};
        SqliteStore::open(&store)
            .and_then(|s| s.load(&run))
            .expect("load")
            .journal
    };
    assert!(
        !journal.iter().any(|e| e.input.name() == "outcome"),
        "call 1's outcome was not appended"
    );
    svc.clear_hook();
    set_lease(&store, &run, Some(thief), Some(now_ms() - 1));
    let v = json_of(
        &dagloop(&store)
            .args(["resume", &run, "--json"])
            .output()
            .expect("resume"),
    );
    assert_eq!(v["status"], "succeeded", "{v}");
    assert_eq!(v["output"], total());
}

/// Writes `run` into a store at schema version 2 the way dagloop 2 did, its owner recorded as
/// a process id (and, with `result`, its result and status as given).
fn write_v2_run(
    db: &rusqlite::Connection,
    run: &dagloop::store::StoredRun,
    owner_pid: u32,
    result: Option<(&str, Value)>,
) {
    let record = serde_json::to_string(&run.record).expect("record");
    let (status, result) = match result {
        Some((s, r)) => (s.to_string(), Some(r.to_string())),
        None => ("running".to_string(), None),
    };
    db.execute(
        "INSERT INTO runs (id, created_at, updated_at, record, result, status, entries, owner_pid)
         VALUES (?1, ?2, ?2, ?3, ?4, ?5, ?6, ?7)",
        rusqlite::params![
            run.record.id,
            run.record.created_at as i64,
            record,
            result,
            status,
            run.journal.len() as i64,
            owner_pid
        ],
    )
    .expect("run row");
    for e in &run.journal {
        db.execute(
            "INSERT INTO journal (run_id, seq, n, at, inputs) VALUES (?1, ?2, 1, ?3, ?4)",
            rusqlite::params![
                run.record.id,
                e.seq as i64,
                e.at as i64,
                serde_json::to_string(&e.input).expect("input")
            ],
        )
        .expect("journal row");
    }
}

/// A store written by dagloop 2 is upgraded in place: a run whose recorded owner PID belongs
/// to a live process (this test's: a reused PID) is not taken for a driven one, and a run that
/// dagloop 2 ended `journal_failed` (a failed write, not an ending) is resumed to its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_2_store_is_upgraded_and_neither_a_live_pid_nor_journal_failed_strands_a_run() {
    use dagloop::store::{RunStore, SqliteStore};
    let svc = Service::start().await;
    let dir = tempfile::tempdir().expect("dir");
    let goal = write_goal(dir.path(), &svc.url, false, json!({}));
    let decisions = approve_all(dir.path());
    let made = dir.path().join("made.db");
    let a = waiting_run(&made, &goal);
    let b = waiting_run(&made, &goal);
    let (a, b) = {
        let s = SqliteStore::open(&made).expect("store");
        (s.load(&a).expect("load"), s.load(&b).expect("load"))
    };
    let old = dir.path().join("old.db");
    SqliteStore::create_at_version(&old, 2).expect("v2");
    {
        let db = rusqlite::Connection::open(&old).expect("open");
        write_v2_run(&db, &a, std::process::id(), None);
        let failed = json!({"status": "journal_failed", "output": null, "state": null,
            "steps": 0, "usage": {}, "calls": [],
            "error": {"code": "run.journal", "message": "UNIQUE constraint failed: journal.run_id, journal.seq"}});
        write_v2_run(&db, &b, 1, Some(("journal_failed", failed)));
    }
    let listed = json_of(
        &dagloop(&old)
            .args(["runs", "--json"])
            .output()
            .expect("runs"),
    );
    for r in listed.as_array().expect("runs") {
        assert_eq!(r["status"], "waiting", "{listed}");
        assert!(
            r.get("owner").is_none() && r.get("owner_pid").is_none(),
            "{listed}"
        );
    }
    let version: i64 = rusqlite::Connection::open(&old)
        .expect("open")
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .expect("version");
    assert_eq!(version, dagloop::store::SCHEMA_VERSION);
    svc.counts.lock().expect("counts").clear();
    for run in [&a.record.id, &b.record.id] {
        let v = json_of(
            &dagloop(&old)
                .args(["resume", run, "--json", "--decisions"])
                .arg(&decisions)
                .output()
                .expect("resume"),
        );
        assert_eq!(v["status"], "succeeded", "{run}: {v}");
        assert_eq!(v["output"], total());
    }
    assert_eq!(svc.counts(), BTreeMap::from([(1, 2), (2, 2)]));
}

/// Another connection holds the store's write lock for longer than the busy timeout and its
/// retries while a run tries to journal: the run stops (`stopped`, `store.journal_write`,
/// nothing recorded as its end), and once the lock is released `resume` completes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_locked_past_the_busy_timeout_stops_the_run_resumable() {
    let svc = Service::start().await;
    let dir = tempfile::tempdir().expect("dir");
    let goal = write_goal(dir.path(), &svc.url, true, json!({}));
    let store = dir.path().join("runs.db");
    let holder: Arc<Mutex<Option<std::thread::JoinHandle<()>>>> = Arc::default();
    {
        let store = store.clone();
        let holder = holder.clone();
        svc.set_hook(move |n| {
            if n != 1 {
                return;
            }
            let (locked_tx, locked) = std::sync::mpsc::channel();
            let store = store.clone();
            let t = std::thread::spawn(move || {
                let db = rusqlite::Connection::open(&store).expect("open");
                db.busy_timeout(Duration::from_secs(10)).expect("busy");
                db.execute_batch("BEGIN IMMEDIATE").expect("lock");
                let _ = locked_tx.send(());
                std::thread::sleep(Duration::from_secs(5));
                db.execute_batch("ROLLBACK").expect("unlock");
            });
            locked.recv().expect("locked");
            *holder.lock().expect("holder") = Some(t);
        });
    }
    let started = Instant::now();
    let out = dagloop(&store)
        .env("DAGLOOP_BUSY_TIMEOUT_MS", "300")
        .env("DAGLOOP_LEASE_MS", "1000")
        .arg("run")
        .arg(&goal)
        .arg("--json")
        .output()
        .expect("run");
    let v = json_of(&out);
    assert_eq!(out.status.code(), Some(1), "{v}");
    assert_eq!(v["status"], "stopped", "{v}");
    assert_eq!(v["error"]["code"], "store.journal_write", "{v}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "it did not hang"
    );
    let run = v["run_id"].as_str().expect("run id").to_string();
    let t = holder.lock().expect("holder").take();
    t.expect("the lock was held").join().expect("holder");
    svc.clear_hook();
    assert!(!lease_of(&store, &run).2, "no result was recorded");
    // Its lease (1 s, not renewed once the process ended) has run out.
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(
        json_of(
            &dagloop(&store)
                .args(["runs", "--json"])
                .output()
                .expect("runs")
        )[0]["status"],
        "stopped"
    );
    let v = json_of(
        &dagloop(&store)
            .args(["resume", &run, "--json"])
            .output()
            .expect("resume"),
    );
    assert_eq!(v["status"], "succeeded", "{v}");
    assert_eq!(v["output"], total());
}

/// Another connection holds the store's write lock longer than the busy timeout (300 ms here)
/// but less than the three tries take in all (3 × 300 ms + 1.25 s of pauses) while a run
/// tries to journal: the run waits, then completes, every call once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_locked_longer_than_the_busy_timeout_waits_and_the_run_completes() {
    let svc = Service::start().await;
    let dir = tempfile::tempdir().expect("dir");
    let goal = write_goal(dir.path(), &svc.url, true, json!({}));
    let store = dir.path().join("runs.db");
    let held: Arc<Mutex<Option<std::thread::JoinHandle<Duration>>>> = Arc::default();
    {
        let store = store.clone();
        let held = held.clone();
        svc.set_hook(move |n| {
            if n != 1 {
                return;
            }
            let (locked_tx, locked) = std::sync::mpsc::channel();
            let store = store.clone();
            let t = std::thread::spawn(move || {
                let db = rusqlite::Connection::open(&store).expect("open");
                db.busy_timeout(Duration::from_secs(10)).expect("busy");
                db.execute_batch("BEGIN IMMEDIATE").expect("lock");
                let at = Instant::now();
                let _ = locked_tx.send(());
                std::thread::sleep(Duration::from_millis(900));
                db.execute_batch("ROLLBACK").expect("unlock");
                at.elapsed()
            });
            locked.recv().expect("locked");
            *held.lock().expect("held") = Some(t);
        });
    }
    let out = dagloop(&store)
        .env("DAGLOOP_BUSY_TIMEOUT_MS", "300")
        .arg("run")
        .arg(&goal)
        .arg("--json")
        .output()
        .expect("run");
    let v = json_of(&out);
    let t = held.lock().expect("held").take();
    let held_for = t.expect("the lock was held").join().expect("holder");
    assert!(
        held_for > Duration::from_millis(300),
        "locked past the busy timeout"
    );
    assert_eq!(out.status.code(), Some(0), "{v}");
    assert_eq!(v["status"], "succeeded", "{v}");
    assert_eq!(v["output"], total());
    assert_eq!(svc.counts(), BTreeMap::from([(1, 1), (2, 1)]));
    assert_eq!(
        shown_status(&store, v["run_id"].as_str().unwrap_or("")),
        "succeeded"
    );
}

/// `run --approve ask --detach` on a goal with `limits.timeout_s` returns at once with the run
/// waiting (it used to block until the deadline and end the run `timeout`); the deadline is
/// kept by the run and fires when the run is next driven after it, not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detach_returns_at_once_and_the_deadline_fires_when_the_run_is_next_driven() {
    let svc = Service::start().await;
    let dir = tempfile::tempdir().expect("dir");
    let goal = write_goal(
        dir.path(),
        &svc.url,
        false,
        json!({"limits": {"timeout_s": 6}}),
    );
    let store = dir.path().join("runs.db");
    let started = Instant::now();
    let run = waiting_run(&store, &goal);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "detach waited for the deadline: {:?}",
        started.elapsed()
    );
    // The deadline counts from the run's start as journaled.
    let start_at = {
        use dagloop::store::{RunStore, SqliteStore};
        let stored = SqliteStore::open(&store)
            .and_then(|s| s.load(&run))
            .expect("load");
        stored.journal.first().expect("the start").at as i64
    };
    // Before the deadline: still waiting.
    let v = json_of(
        &dagloop(&store)
            .args(["resume", &run, "--detach", "--json"])
            .output()
            .expect("resume"),
    );
    if now_ms() < start_at + 6000 {
        assert_eq!(v["status"], "waiting", "{v}");
        assert_eq!(v["awaiting"].as_array().map(Vec::len), Some(1), "{v}");
    }
    // After it: the deadline fires as soon as the run is driven again.
    while now_ms() < start_at + 6300 {
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = dagloop(&store)
        .args(["resume", &run, "--detach", "--json"])
        .output()
        .expect("resume");
    let v = json_of(&out);
    assert_eq!(v["status"], "timeout", "{v}");
    assert_eq!(out.status.code(), Some(1));
    assert!(svc.counts().is_empty(), "no call ran: {:?}", svc.counts());
    assert_eq!(shown_status(&store, &run), "timeout");
}

/// `resume` with no terminal, no `--detach` and no decisions, for a run whose call was cut off
/// mid-call and must be presented again (its tool is not idempotent), refuses at once with
/// `approval.no_reviewer` as `run` does, and leaves the run to the next process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_without_a_reviewer_refuses_instead_of_hanging() {
    let svc = Service::start().await;
    let dir = tempfile::tempdir().expect("dir");
    let goal = write_goal(dir.path(), &svc.url, false, json!({}));
    let store = dir.path().join("runs.db");
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let tx = Mutex::new(tx);
    svc.set_hook(move |n| {
        if n == 1 {
            let _ = tx.lock().expect("tx").send(());
        }
    });
    svc.set_delay(Duration::from_secs(3));
    let mut child = dagloop(&store)
        .arg("run")
        .arg(&goal)
        .arg("--json")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    rx.recv_timeout(Duration::from_secs(60))
        .expect("call 1 arrived");
    // While its owner lives, the list says it is driven, and by whom.
    let listed = listed_row(&store);
    assert_eq!(
        (listed["status"].as_str(), listed["owner"].is_string()),
        (Some("running"), true),
        "{listed}"
    );
    child.kill().expect("kill");
    let out = child.wait_with_output().expect("wait");
    let run = String::from_utf8_lossy(&out.stderr)
        .lines()
        .find_map(|l| {
            serde_json::from_str::<Value>(l).ok()?["run_id"]
                .as_str()
                .map(String::from)
        })
        .expect("run id");
    // Its owner is gone (its lease has not expired): `runs` lists it as driven by nobody, as
    // `show` does, and `?status=running` no longer finds it.
    let listed = listed_row(&store);
    assert_eq!(listed["id"], run.as_str());
    assert_eq!(listed["status"], "stopped", "{listed}");
    assert!(listed.get("owner").is_none(), "{listed}");
    let running = json_of(
        &dagloop(&store)
            .args(["runs", "--json", "--status", "running"])
            .output()
            .expect("runs"),
    );
    assert_eq!(running, json!([]), "no run is driven");
    svc.clear_hook();
    svc.set_delay(Duration::from_millis(10));
    let mut child = dagloop(&store)
        .args(["resume", &run, "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("resume without a reviewer hangs");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("output");
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(code_of(&out), "approval.no_reviewer");
    // The refusal gave the lease back (it had taken it over from the killed process).
    assert_eq!(lease_of(&store, &run), (None, None, false), "given back");
    // A reviewer continues at once.
    let decisions = approve_all(dir.path());
    let v = json_of(
        &dagloop(&store)
            .args(["resume", &run, "--json", "--decisions"])
            .arg(&decisions)
            .output()
            .expect("resume"),
    );
    assert_eq!(v["status"], "succeeded", "{v}");
    assert_eq!(svc.counts(), BTreeMap::from([(1, 2), (2, 1)]));
}

/// A `dagloop serve` on a free loopback port, granted what the tests' goals use; killed
/// (SIGKILL) when dropped.
struct Serve {
    child: std::process::Child,
    base: String,
    resumed: Vec<Value>,
}

impl Serve {
    fn start(store: &Path, lease_ms: u64) -> Serve {
        use std::io::BufRead;
        let mut child = dagloop(store)
            .env("DAGLOOP_LEASE_MS", lease_ms.to_string())
            // Grants the goal's files and its http tool on loopback.
            .arg("--config")
            .arg(bin::open_config())
            .args(["serve", "--addr", "127.0.0.1:0", "--store"])
            .arg(store)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("serve");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("read");
        let v: Value = serde_json::from_str(&line).expect("the first line is JSON");
        assert_eq!(v["status"], "listening", "{v}");
        Serve {
            child,
            base: v["url"].as_str().expect("url").trim_end_matches('/').into(),
            resumed: v["resumed"].as_array().cloned().unwrap_or_default(),
        }
    }

    async fn get(&self, path: &str) -> Value {
        let r = dagloop::net::client()
            .expect("client")
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .expect("get");
        r.json().await.expect("json")
    }

    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let r = dagloop::net::client()
            .expect("client")
            .post(format!("{}{path}", self.base))
            .json(&body)
            .send()
            .await
            .expect("post");
        let st = r.status().as_u16();
        (st, r.json().await.unwrap_or(Value::Null))
    }

    /// The run as this server describes it, once `ok` holds (within 60 s).
    async fn until(&self, run: &str, ok: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let v = self.get(&format!("/runs/{run}")).await;
            if ok(&v) {
                return v;
            }
            assert!(Instant::now() < deadline, "never: {v}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        self.kill();
    }
}

fn awaits(call: u64) -> impl Fn(&Value) -> bool {
    move |v| {
        v["awaiting"]
            .as_array()
            .is_some_and(|a| a.iter().any(|c| c["call_id"] == call))
    }
}

/// Two servers on one store: a run waiting for a decision is parked (no server holds it);
/// the same decision sent to both at once is applied by exactly one of them, the run goes on
/// under one driver, parks again, is woken by the other server's decision, and every call runs
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_on_one_store_never_both_drive_a_run() {
    let svc = Service::start().await;
    let dir = tempfile::tempdir().expect("dir");
    let goal_path = write_goal(dir.path(), &svc.url, false, json!({}));
    let mut goal: Value =
        serde_json::from_str(&std::fs::read_to_string(goal_path).expect("goal")).expect("goal");
    goal["model"] = json!(format!("scripted:{}", dir.path().join("s.json").display()));
    let store = dir.path().join("runs.db");
    let a = Serve::start(&store, 1000);
    let (st, created) = a
        .post("/runs", json!({"goal": goal, "approve": "ask"}))
        .await;
    assert_eq!(st, 201, "{created}");
    let run = created["id"].as_str().expect("id").to_string();
    a.until(&run, awaits(1)).await;
    let b = Serve::start(&store, 1000);
    assert!(b.resumed.is_empty(), "{:?}", b.resumed);
    // Parked: nobody holds it while it waits.
    let deadline = Instant::now() + Duration::from_secs(30);
    while lease_of(&store, &run).0.is_some() {
        assert!(
            Instant::now() < deadline,
            "the waiting run was never parked"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let listed = b.get("/runs").await;
    assert_eq!(listed[0]["status"], "waiting", "{listed}");
    let approve = json!({"decision": "approve"});
    let path = format!("/runs/{run}/approvals/1");
    let ((sa, va), (sb, vb)) = tokio::join!(
        a.post(&path, approve.clone()),
        b.post(&path, approve.clone())
    );
    // One server wakes the run and applies the decision (200). The other either finds the
    // decision taken (409 op.already_decided) or, while the waking server holds the lease,
    // records it (202), in which case the woken driver applies the recorded copy first and the
    // waking server's own answer is the 409. Never two applications.
    assert!(
        [sa, sb].iter().all(|s| [200, 202, 409].contains(s)),
        "{sa}: {va} / {sb}: {vb}"
    );
    assert!(
        [sa, sb].iter().filter(|s| **s == 200).count() <= 1,
        "{sa}: {va} / {sb}: {vb}"
    );
    assert!(
        [sa, sb].iter().any(|s| *s != 409),
        "neither took the decision: {sa}: {va} / {sb}: {vb}"
    );
    for (s, v) in [(sa, &va), (sb, &vb)] {
        if s == 409 {
            assert_eq!(v["code"], "op.already_decided", "{v}");
        }
    }
    a.until(&run, awaits(2)).await;
    // The server that woke the run answered 200, or 409 when the other one's copy was recorded.
    let a_drives = sa == 200 || (sa == 409 && sb == 202);
    let other = if a_drives { &b } else { &a };
    let (st, v) = other
        .post(&format!("/runs/{run}/approvals/2"), approve.clone())
        .await;
    // Applied by the other server (it woke the parked run), or recorded while the first
    // server still drove it (its driver takes it).
    assert!(st == 200 || st == 202, "{st}: {v}");
    let done = a.until(&run, |v| v["status"] == "succeeded").await;
    assert_eq!(done["output"], total(), "{done}");
    assert_eq!(svc.counts(), BTreeMap::from([(1, 1), (2, 1)]));
}

/// A renewal that finds another owner stops the run at once, while a call is still running:
/// the process does not wait for the call, records nothing, and leaves the run to the owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_that_finds_another_owner_stops_the_run_at_once() {
    let svc = Service::start().await;
    let dir = tempfile::tempdir().expect("dir");
    let goal = write_goal(dir.path(), &svc.url, true, json!({}));
    let store = dir.path().join("runs.db");
    let thief = "0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f (pid 9 on elsewhere)";
    {
        let store = store.clone();
        svc.set_hook(move |n| {
            if n == 1 {
                let db = rusqlite::Connection::open(&store).expect("open");
                db.busy_timeout(Duration::from_secs(10)).expect("busy");
                db.execute(
                    "UPDATE runs SET owner = ?1, lease_expires_at = ?2",
                    rusqlite::params![thief, now_ms() + 60_000],
                )
                .expect("steal");
            }
        });
    }
    // Call 1 answers after 20 s; the run renews its 1 s lease every 250 ms.
    svc.set_delay(Duration::from_secs(20));
    let started = Instant::now();
    let out = dagloop(&store)
        .env("DAGLOOP_LEASE_MS", "1000")
        .arg("run")
        .arg(&goal)
        .arg("--json")
        .output()
        .expect("run");
    let v = json_of(&out);
    assert_eq!(v["status"], "stopped", "{v}");
    assert_eq!(v["error"]["code"], "store.lease_lost", "{v}");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "it waited for the call: {:?}",
        started.elapsed()
    );
    let run = v["run_id"].as_str().expect("run id").to_string();
    let (owner, _, finished) = lease_of(&store, &run);
    assert_eq!(owner.as_deref(), Some(thief));
    assert!(!finished);
}

/// A thousand runs waiting for a decision in one server are rows, not tasks: each is parked
/// (no lease held), then each gets its decision over HTTP (the server wakes it) and finishes,
/// every call run once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_parked_runs_each_get_a_decision_and_finish() {
    const N: usize = 1000;
    let svc = Service::start().await;
    let dir = tempfile::tempdir().expect("dir");
    let script = dir.path().join("one.json");
    std::fs::write(
        &script,
        json!({"turns": [
            {"solution": {"calls": [{"_tool": "step", "n": 1, "_outputPath": "†state.a"}], "output": null}},
            {"solution": {"calls": [], "output": {"total": "†state.a"}}}
        ]})
        .to_string(),
    )
    .expect("script");
    let goal = json!({"goal": "one asked call", "model": format!("scripted:{}", script.display()),
        "output_schema": {"type": "object", "required": ["total"]},
        "tools": [{"_tool": "step", "_activity": "http", "_http": {"method": "POST", "url": svc.url},
            "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}]});
    let store = dir.path().join("runs.db");
    let s = Serve::start(&store, 20_000);
    let mut runs = Vec::with_capacity(N);
    for _ in 0..N {
        let (st, v) = s
            .post("/runs", json!({"goal": goal, "approve": "ask"}))
            .await;
        assert_eq!(st, 201, "{v}");
        runs.push(v["id"].as_str().expect("id").to_string());
    }
    let parked = || -> i64 {
        rusqlite::Connection::open(&store)
            .expect("open")
            .query_row(
                "SELECT count(*) FROM runs WHERE parked = 1 AND owner IS NULL AND awaiting = 1",
                [],
                |r| r.get(0),
            )
            .expect("count")
    };
    let deadline = Instant::now() + Duration::from_secs(300);
    while parked() < N as i64 {
        assert!(
            Instant::now() < deadline,
            "only {} of {N} runs parked",
            parked()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for run in &runs {
        let (st, v) = s
            .post(
                &format!("/runs/{run}/approvals/1"),
                json!({"decision": "approve"}),
            )
            .await;
        assert_eq!(st, 200, "{run}: {v}");
    }
    let finished = || -> i64 {
        rusqlite::Connection::open(&store)
            .expect("open")
            .query_row(
                "SELECT count(*) FROM runs WHERE status = 'succeeded'",
                [],
                |r| r.get(0),
            )
            .expect("count")
    };
    while finished() < N as i64 {
        assert!(
            Instant::now() < deadline,
            "only {} of {N} runs finished",
            finished()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(svc.counts(), BTreeMap::from([(1, N as u64)]));
}
