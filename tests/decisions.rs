//! Decisions answer presentations (issue 46, DESIGN.md 3.6, spec/approval.md R21-R24), through
//! the binary: of conflicting decisions about one call sent at once through two `dagloop serve`
//! processes on one store and `dagloop decide`, exactly one is accepted and the audit shows
//! that one; a decision is bound to the presentation it answers, so a call interrupted by a
//! SIGKILL of its driver and presented again after `resume` waits for a new decision whatever
//! was queued for it before, and runs once; an older client's decision, which names no
//! presentation, still answers the presentation it was checked against.

#[path = "common/bin.rs"]
mod bin;
#[path = "common/serve.rs"]
mod serve;

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use serve::{Server, client, send};

fn dagloop(store: &Path) -> Command {
    let mut c = bin::dagloop();
    c.env("DAGLOOP_STORE", store);
    c
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

/// `dagloop show RUN --json`.
fn show(store: &Path, run: &str) -> Value {
    json_of(
        &dagloop(store)
            .args(["show", run, "--json"])
            .output()
            .expect("show"),
    )
}

/// The entries of `dagloop show RUN --audit --json` of this kind about call `call`.
fn audited(store: &Path, run: &str, what: &str, call: u64) -> Vec<Value> {
    let v = json_of(
        &dagloop(store)
            .args(["show", run, "--audit", "--json"])
            .output()
            .expect("audit"),
    );
    v["audit"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["what"] == what && e["call_id"] == call)
        .cloned()
        .collect()
}

/// The awaiting call `call` of a run description, if it awaits a decision.
fn awaiting_call(v: &Value, call: u64) -> Option<Value> {
    v["awaiting"]
        .as_array()?
        .iter()
        .find(|a| a["call_id"] == call)
        .cloned()
}

/// Polls `check` until it gives something (bounded: 60 s).
async fn eventually<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(t) = check() {
            return t;
        }
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The ops queued for a run, as the store holds them (`op` JSON, presentation, taken by).
fn queued(store: &Path, run: &str) -> Vec<(String, Option<i64>, Option<String>)> {
    let db = rusqlite::Connection::open(store).expect("open");
    db.busy_timeout(Duration::from_secs(10)).expect("busy");
    let mut stmt = db
        .prepare("SELECT op, presentation, taken_by FROM ops WHERE run_id = ?1 ORDER BY id")
        .expect("prepare");
    stmt.query_map([run], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows")
}

/// What a recorder that checked a decision against presentation `p` before another decision
/// about it was applied would have left queued (the state issue 46 found): a decision for a
/// presentation that is no longer awaiting one.
fn leave_a_second_decision_queued(store: &Path, run: &str, p: u64) {
    let op = json!({"op": "decide", "call": 1, "decision": {"decision": "approve"},
        "presentation": p, "by": {"principal": "late", "channel": "cli"}});
    let db = rusqlite::Connection::open(store).expect("open");
    db.busy_timeout(Duration::from_secs(10)).expect("busy");
    db.execute(
        "INSERT INTO ops (run_id, op, presentation) VALUES (?1, ?2, ?3)",
        rusqlite::params![run, op.to_string(), p as i64],
    )
    .expect("queue");
}

/// `dagloop decide RUN CALL ARGS...`: Ok(its answer) when it was recorded, Err(code, message).
fn decide_cli(
    store: &Path,
    run: &str,
    call: u64,
    args: &[&str],
) -> Result<Value, (String, String)> {
    let out = dagloop(store)
        .args(["decide", run, &call.to_string()])
        .args(args)
        .output()
        .expect("decide");
    let v = json_of(&out);
    if out.status.success() {
        Ok(v)
    } else {
        Err((
            v["error"]["code"].as_str().unwrap_or("").to_string(),
            v["error"]["message"].as_str().unwrap_or("").to_string(),
        ))
    }
}

/// `dagloop resume RUN --json --detach`, tried again while the killed driver's lease lasts.
async fn resume_detached(store: &Path, run: &str) -> Value {
    eventually("the run resumed", || {
        let v = json_of(
            &dagloop(store)
                .args(["resume", run, "--json", "--detach"])
                .output()
                .expect("resume"),
        );
        (v["error"]["code"] != "store.busy").then_some(v)
    })
    .await
}

/// A driver of the run that stays up while its call is in flight: `dagloop resume --detach`
/// with a short lease (so that the next process takes over soon after it is killed).
fn driver(store: &Path, run: &str) -> Child {
    dagloop(store)
        .env("DAGLOOP_LEASE_MS", "300")
        .args(["resume", run, "--json", "--detach"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the driver")
}

/// With a call in flight and a second decision for it queued, the driver is SIGKILLed; after
/// `dagloop resume` the call is presented again (interrupted) and waits for a new decision:
/// nothing given before answers it, the leftover decision is dropped and audited as dropped,
/// and the service saw one execution. Twenty times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_re_presented_call_waits_for_a_new_decision_after_a_crash_and_resume() {
    let (url, counts) = serve::holding_service(1).await;
    for round in 0..20 {
        let dir = tempfile::tempdir().expect("dir");
        let store = dir.path().join("runs.db");
        let goal = dir.path().join("goal.json");
        std::fs::write(&goal, serve::goal(dir.path(), &url, "ask").to_string()).expect("goal");
        let before = serve::count(&counts, 1);
        let started = json_of(
            &dagloop(&store)
                .arg("run")
                .arg(&goal)
                .args(["--json", "--detach"])
                .output()
                .expect("run"),
        );
        assert_eq!(started["status"], "waiting", "{started}");
        let run = started["run_id"].as_str().expect("run id").to_string();
        let first = awaiting_call(&show(&store, &run), 1).expect("call 1 awaits");
        let p1 = first["presentation"].as_u64().expect("a presentation");
        assert!(p1 > 0, "{first}");
        // The decision names the presentation it answers (filled in when the command omits
        // it); a second one about that presentation is refused by the queue itself, before
        // any driver has applied the first.
        let recorded = decide_cli(&store, &run, 1, &["approve"]).expect("recorded");
        assert_eq!(recorded["presentation"], p1, "{recorded}");
        let (code, message) = decide_cli(&store, &run, 1, &["reject", "--reason", "no"])
            .expect_err("a second decision about one presentation");
        assert_eq!(code, "op.already_decided", "{message}");
        assert!(
            message.contains("approve"),
            "it names the winner: {message}"
        );
        // The driver applies the decision; the call is in flight when it is killed, with a
        // second decision for it left queued.
        let mut d = driver(&store, &run);
        eventually("the call is in flight", || {
            (serve::count(&counts, 1) == before + 1).then_some(())
        })
        .await;
        let (code, _) = decide_cli(&store, &run, 1, &["approve"]).expect_err("decided");
        assert_eq!(code, "op.already_decided", "round {round}");
        leave_a_second_decision_queued(&store, &run, p1);
        d.kill().expect("SIGKILL the driver");
        let _ = d.wait();
        let resumed = resume_detached(&store, &run).await;
        assert_eq!(resumed["status"], "waiting", "round {round}: {resumed}");
        let again = awaiting_call(&show(&store, &run), 1).expect("call 1 awaits again");
        assert_eq!(again["interrupted"], true, "{again}");
        let p2 = again["presentation"].as_u64().expect("a presentation");
        assert!(
            p2 > p1,
            "a re-presentation is a new request: {p1} then {again}"
        );
        assert_eq!(
            serve::count(&counts, 1),
            before + 1,
            "round {round}: the call ran once"
        );
        // The audit: the one decision that was applied, and the leftover one dropped.
        let decisions = audited(&store, &run, "decision", 1);
        assert_eq!(decisions.len(), 1, "round {round}: {decisions:?}");
        assert_eq!(decisions[0]["decision"], "approve");
        let dropped = audited(&store, &run, "dropped", 1);
        assert_eq!(dropped.len(), 1, "round {round}: {dropped:?}");
        assert_eq!(dropped[0]["principal"], "late", "{dropped:?}");
        assert!(
            queued(&store, &run).is_empty(),
            "nothing is left queued: {:?}",
            queued(&store, &run)
        );
        // A decision about the old presentation never answers the new one.
        let (code, message) = decide_cli(
            &store,
            &run,
            1,
            &["approve", "--presentation", &p1.to_string()],
        )
        .expect_err("stale");
        assert_eq!(code, "op.stale_presentation", "{message}");
        let ok = decide_cli(&store, &run, 1, &["reject", "--reason", "not twice"])
            .expect("the new presentation takes a decision");
        assert_eq!(ok["presentation"], p2, "{ok}");
    }
}

/// The same through servers: the server driving the run is killed with the call in flight
/// and a second decision for it queued; another server on the store takes the run over (even
/// rounds), or the killed server is started again on the store with nobody else there (odd
/// rounds; twenty rounds, ten of each), and the call waits for a new decision; the old
/// presentation is refused with 409.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_servers_a_call_re_presented_after_a_crash_waits_for_a_new_decision() {
    let (url, counts) = serve::holding_service(1).await;
    for round in 0..20 {
        let dir = tempfile::tempdir().expect("dir");
        let store = dir.path().join("runs.db");
        let before = serve::count(&counts, 1);
        let mut a = Server::start_with(&store, None, |c| {
            c.env("DAGLOOP_LEASE_MS", "300");
        });
        let mut b = Server::start(&store, None);
        let goal = serve::goal(dir.path(), &url, "ask");
        let run = serve::create(&a, &json!({"goal": goal})).await;
        let v = serve::until(&a, &run, |v| awaiting_call(v, 1).is_some()).await;
        let p1 = awaiting_call(&v, 1).expect("awaits")["presentation"]
            .as_u64()
            .expect("presentation");
        let (st, v) = send(
            client()
                .post(a.url(&format!("/runs/{run}/approvals/1")))
                .json(&json!({"decision": "approve", "presentation": p1})),
        )
        .await;
        assert!(st == 200 || st == 202, "{st}: {v}");
        eventually("the call is in flight", || {
            (serve::count(&counts, 1) == before + 1).then_some(())
        })
        .await;
        // Another reviewer, through the other server: refused, naming the decision that won.
        let (st, v) = send(
            client()
                .post(b.url(&format!("/runs/{run}/approvals/1")))
                .json(&json!({"decision": "reject", "reason": "no", "presentation": p1})),
        )
        .await;
        assert_eq!(
            (st, v["code"].as_str()),
            (409, Some("op.already_decided")),
            "{v}"
        );
        leave_a_second_decision_queued(&store, &run, p1);
        a.kill();
        if round % 2 == 1 {
            // The same server again: the only one on the store, started after the kill.
            b.kill();
            b = Server::start(&store, None);
        }
        // The other server (or the restarted one) takes the run over at once: the dead one's
        // process is gone on this host.
        let v = serve::until(&b, &run, |v| {
            awaiting_call(v, 1).is_some_and(|c| c["interrupted"] == true)
        })
        .await;
        let p2 = awaiting_call(&v, 1).expect("awaits")["presentation"]
            .as_u64()
            .expect("presentation");
        assert!(p2 > p1, "{v}");
        assert_eq!(serve::count(&counts, 1), before + 1, "round {round}");
        let decisions = audited(&store, &run, "decision", 1);
        assert_eq!(decisions.len(), 1, "round {round}: {decisions:?}");
        eventually("the leftover decision is dropped", || {
            (audited(&store, &run, "dropped", 1).len() == 1).then_some(())
        })
        .await;
        serve::refused(
            send(
                client()
                    .post(b.url(&format!("/runs/{run}/approvals/1")))
                    .json(&json!({"decision": "approve", "presentation": p1})),
            )
            .await,
            409,
            "op.stale_presentation",
        );
        assert_eq!(serve::count(&counts, 1), before + 1, "round {round}");
    }
}

/// One reviewer's way of sending a decision.
#[derive(Clone, Copy, Debug)]
enum Via {
    ServerA,
    ServerB,
    Cli,
}

/// N conflicting decisions about one call sent at once through two servers on one store and
/// `dagloop decide`: exactly one is accepted (2xx, or a recorded `decide`); every other is 409
/// `op.already_decided` naming the winner; the audit shows exactly that one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_conflicting_decisions_sent_at_once_exactly_one_is_accepted() {
    let (url, counts) = serve::counting_service().await;
    for n in [2usize, 3, 8] {
        let dir = tempfile::tempdir().expect("dir");
        let store = dir.path().join("runs.db");
        let a = Server::start(&store, None);
        let b = Server::start(&store, None);
        let goal = serve::goal(dir.path(), &url, "ask");
        let run = serve::create(&a, &json!({"goal": goal})).await;
        serve::until(&a, &run, |v| awaiting_call(v, 1).is_some()).await;
        let before = serve::count(&counts, 1);
        // Decision i: approve for 0, a reject with its own reason for the others.
        let body = |i: usize| {
            if i == 0 {
                json!({"decision": "approve"})
            } else {
                json!({"decision": "reject", "reason": format!("r{i}")})
            }
        };
        let via = |i: usize| match (n, i % 3) {
            // Two decisions: one through a server, one through the command line.
            (2, 1) => Via::Cli,
            (_, 0) => Via::ServerA,
            (_, 1) => Via::ServerB,
            _ => Via::Cli,
        };
        let sends = (0..n).map(|i| {
            let (run, store) = (run.clone(), store.clone());
            let url = match via(i) {
                Via::ServerA => Some(a.url(&format!("/runs/{run}/approvals/1"))),
                Via::ServerB => Some(b.url(&format!("/runs/{run}/approvals/1"))),
                Via::Cli => None,
            };
            let b = body(i);
            async move {
                match url {
                    Some(url) => {
                        let (st, v) = send(client().post(url).json(&b)).await;
                        let code = v["code"].as_str().unwrap_or("").to_string();
                        let msg = v["message"].as_str().unwrap_or("").to_string();
                        (i, (200..300).contains(&st), code, msg)
                    }
                    None => {
                        let mut c = bin::dagloop_tokio();
                        c.env("DAGLOOP_STORE", &store).args(["decide", &run, "1"]);
                        match b["decision"].as_str() {
                            Some("approve") => c.arg("approve"),
                            _ => c.args(["reject", "--reason", b["reason"].as_str().unwrap_or("")]),
                        };
                        let out = c.output().await.expect("decide");
                        let v = json_of(&out);
                        let code = v["error"]["code"].as_str().unwrap_or("").to_string();
                        let msg = v["error"]["message"].as_str().unwrap_or("").to_string();
                        (i, out.status.success(), code, msg)
                    }
                }
            }
        });
        let answers = futures::future::join_all(sends).await;
        let won: Vec<_> = answers.iter().filter(|a| a.1).collect();
        assert_eq!(won.len(), 1, "n = {n}: {answers:?}");
        let winner = won[0].0;
        let winning = if winner == 0 { "approve" } else { "reject" };
        for (i, ok, code, msg) in &answers {
            if !ok {
                assert_eq!(
                    code,
                    "op.already_decided",
                    "n = {n}, {i:?} via {:?}: {msg}",
                    via(*i)
                );
                assert!(
                    msg.contains(winning),
                    "it names the winner ({winning}): {msg}"
                );
            }
        }
        // The audit shows exactly the accepted decision, once it is applied.
        let decisions = eventually("the accepted decision is applied", || {
            let d = audited(&store, &run, "decision", 1);
            (!d.is_empty()).then_some(d)
        })
        .await;
        // The other call is decided too, so that anything else about call 1 would be in by now.
        let (st, v) = send(
            client()
                .post(a.url(&format!("/runs/{run}/approvals/2")))
                .json(&json!({"decision": "approve"})),
        )
        .await;
        assert!(st == 200 || st == 202, "{st}: {v}");
        eventually("call 2 is decided", || {
            (!audited(&store, &run, "decision", 2).is_empty()).then_some(())
        })
        .await;
        let decisions_after = audited(&store, &run, "decision", 1);
        assert_eq!(decisions_after, decisions, "n = {n}");
        assert_eq!(decisions.len(), 1, "n = {n}: {decisions:?}");
        assert_eq!(decisions[0]["decision"], winning, "n = {n}: {decisions:?}");
        if winner > 0 {
            assert_eq!(
                decisions[0]["reason"],
                format!("r{winner}"),
                "{decisions:?}"
            );
        }
        assert!(audited(&store, &run, "dropped", 1).is_empty());
        let ran = serve::count(&counts, 1) - before;
        assert!(
            ran <= u64::from(winner == 0),
            "n = {n}: call 1 ran {ran} times"
        );
    }
}

/// A decision that names no presentation (an older client's) answers the presentation
/// awaiting a decision when it is checked, through the API and the command line; one naming
/// a presentation the call does not await is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_style_decision_without_a_presentation_still_works() {
    let (url, counts) = serve::counting_service().await;
    let dir = tempfile::tempdir().expect("dir");
    let store = dir.path().join("runs.db");
    let a = Server::start(&store, None);
    let goal = serve::goal(dir.path(), &url, "ask");
    let run = serve::create(&a, &json!({"goal": goal})).await;
    let v = serve::until(&a, &run, |v| serve::awaiting(v).len() == 2).await;
    let p1 = awaiting_call(&v, 1).expect("awaits")["presentation"]
        .as_u64()
        .expect("presentation");
    serve::refused(
        send(
            client()
                .post(a.url(&format!("/runs/{run}/approvals/1")))
                .json(&json!({"decision": "approve", "presentation": p1 + 1000})),
        )
        .await,
        409,
        "op.stale_presentation",
    );
    serve::refused(
        send(
            client()
                .post(a.url(&format!("/runs/{run}/approvals/1")))
                .json(&json!({"decision": "approve", "presentation": "p1"})),
        )
        .await,
        400,
        "op.bad_decision",
    );
    // No presentation, as an older page or client sends it.
    let (st, v) = send(
        client()
            .post(a.url(&format!("/runs/{run}/approvals/1")))
            .json(&json!({"decision": "approve"})),
    )
    .await;
    assert!(st == 200 || st == 202, "{st}: {v}");
    // And from the command line, without --presentation.
    let (code, _) = decide_cli(&store, &run, 2, &["approve", "--presentation", "999999"])
        .expect_err("not the presentation call 2 awaits");
    assert_eq!(code, "op.stale_presentation");
    let ok = decide_cli(&store, &run, 2, &["approve"]).expect("recorded");
    assert!(ok["presentation"].as_u64().is_some(), "{ok}");
    let done = serve::until(&a, &run, |v| v["status"] == "succeeded").await;
    assert_eq!(done["output"]["b"], 20, "{done}");
    assert_eq!((serve::count(&counts, 1), serve::count(&counts, 2)), (1, 1));
}
