//! `dagloop serve --engine temporal` (feature `temporal`): two servers and two `dagloop worker`
//! processes against Temporal's development server (`DAGLOOP_TEMPORAL`; without it the test
//! prints SKIPPED). No run state lives in a server: runs submitted to one are read, decided and
//! followed through the other, one server is killed and its SSE client continues on the other
//! with `Last-Event-ID`, and concurrent decisions through both servers get exactly one 2xx.
#![cfg(feature = "temporal")]

#[path = "common/bin.rs"]
mod bin;
#[path = "common/browser.rs"]
mod browser;
#[path = "common/cluster.rs"]
mod cluster;
#[path = "common/desk.rs"]
mod desk;
#[path = "common/serve.rs"]
mod serve;
#[path = "common/temporal.rs"]
mod temporal;

use std::time::{Duration, Instant};

use cluster::{Cluster, awaits_both, cluster, decide, until};
use futures::StreamExt;
use serde_json::{Value, json};
use serve::{Server, client, count, counting_service, goal, read_events, send};

/// How many runs the test submits.
const RUNS: usize = 50;

/// Runs whose call 1 gets two concurrent approvals, one through each server.
const RACED: std::ops::Range<usize> = 2..12;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_serve_the_same_runs_on_temporal() {
    // Bound whole: the fields not named below (the dev server, the workers) live to the end.
    let Some(cluster) = cluster(None).await else {
        return;
    };
    let Cluster {
        mut a, b, ref dir, ..
    } = cluster;
    let (url, counts) = counting_service().await;
    let body = goal(dir.path(), &url, "ask");

    // Submitted alternately to both servers; each run asks a reviewer for both its calls.
    let mut runs = Vec::new();
    for i in 0..RUNS {
        let on = if i % 2 == 0 { &a } else { &b };
        runs.push((serve::create(on, &body).await, i % 2));
    }

    // Run 0 (started on A): conflicting decisions through both servers, exactly one 2xx; the
    // loser is refused as the embedded engine refuses it.
    let (first, _) = &runs[0];
    let v = until(&b, first, awaits_both).await;
    let presentation = serve::awaiting(&v)[0]["presentation"].clone();
    let approve = json!({"decision": "approve", "presentation": presentation});
    let reject = json!({"decision": "reject", "reason": "no", "presentation": presentation});
    let (x, y) = tokio::join!(
        decide(&a, first, 1, approve.clone()),
        decide(&b, first, 1, reject)
    );
    let ok = [x.0, y.0]
        .iter()
        .filter(|c| (200..300).contains(*c))
        .count();
    assert_eq!(ok, 1, "exactly one decision wins: {x:?} {y:?}");
    let loser = if (200..300).contains(&x.0) { y } else { x };
    assert_eq!(loser.0, 409, "{loser:?}");
    assert!(
        ["op.already_decided", "op.not_awaiting"].contains(&loser.1["code"].as_str().unwrap_or("")),
        "{loser:?}"
    );
    // An unknown call: the embedded engine's 404 and code.
    let (st, v) = decide(&b, first, 9, json!({"decision": "approve"})).await;
    assert_eq!(
        (st, v["code"].as_str()),
        (404, Some("op.unknown_call")),
        "{v}"
    );

    // More races: two approvals of one presentation at once, one through each server.
    for (id, _) in &runs[RACED] {
        let v = until(&a, id, awaits_both).await;
        let presentation = serve::awaiting(&v)[0]["presentation"].clone();
        let body = json!({"decision": "approve", "presentation": presentation});
        let (x, y) = tokio::join!(decide(&a, id, 1, body.clone()), decide(&b, id, 1, body));
        let codes = [x.0, y.0];
        assert!(codes.contains(&200) && codes.contains(&409), "{x:?} {y:?}");
    }

    // An SSE client follows run 1 (started on B) on A.
    let (followed, _) = runs[1].clone();
    let first_part = read_events(&a.url(&format!("/runs/{followed}/events")), None, 3, None).await;
    assert_eq!(first_part.len(), 3, "{first_part:?}");

    // Decisions go to the server that did not start the run; A is killed half-way.
    for (i, (id, started_on)) in runs.iter().enumerate() {
        if i == RUNS / 2 {
            a.kill();
        }
        let other = if i >= RUNS / 2 || *started_on == 1 {
            &b
        } else {
            &a
        };
        until(other, id, |v| !serve::awaiting(v).is_empty()).await;
        for call in [1, 2] {
            let v = until(other, id, |v| {
                serve::awaiting(v).iter().any(|c| c["call_id"] == call)
                    || v["calls"].as_array().is_some_and(|cs| {
                        cs.iter()
                            .any(|c| c["id"] == call && c["decision"].is_string())
                    })
            })
            .await;
            if !serve::awaiting(&v).iter().any(|c| c["call_id"] == call) {
                continue; // run 0's call 1, decided above
            }
            let (st, v) = decide(other, id, call, json!({"decision": "approve"})).await;
            assert_eq!(st, 200, "run {i} call {call}: {v}");
        }
    }

    // The follower moves to B with Last-Event-ID: no gap, no duplicate.
    let last = first_part.last().map(|e| e.0);
    let rest = read_events(&b.url(&format!("/runs/{followed}/events")), last, 0, None).await;
    let rest = if rest.last().is_some_and(|e| e.1 == "run_finished") {
        rest
    } else {
        let mut more = rest.clone();
        let after = rest.last().map(|e| e.0).or(last);
        more.extend(
            read_events(
                &b.url(&format!("/runs/{followed}/events")),
                after,
                1000,
                None,
            )
            .await,
        );
        more
    };
    let whole = read_events(
        &b.url(&format!("/runs/{followed}/events")),
        None,
        1000,
        None,
    )
    .await;
    let mut joined = first_part.clone();
    joined.extend(rest);
    assert_eq!(
        joined, whole,
        "the stream continued on B without gap or duplicate"
    );
    assert_eq!(whole.last().map(|e| e.1.as_str()), Some("run_finished"));

    // Every run ends, each call executed once per run.
    for (id, _) in &runs {
        let (st, v) = send(client().get(b.url(&format!("/runs/{id}/result?wait=60")))).await;
        assert_eq!(st, 200, "{v}");
        let expected = if id == first && v["status"] != "succeeded" {
            v["status"].clone() // run 0's call 1 may have been rejected
        } else {
            json!("succeeded")
        };
        assert_eq!(v["status"], expected, "{v}");
    }
    let rejected_first = {
        let (_, v) = send(client().get(b.url(&format!("/runs/{first}")))).await;
        v["calls"][0]["decision"] == "reject"
    };
    assert_eq!(
        count(&counts, 1),
        RUNS as u64 - u64::from(rejected_first),
        "call 1 ran once per run it was approved in"
    );
    assert_eq!(count(&counts, 2), RUNS as u64, "call 2 ran once per run");

    // `wait` on POST /runs answers with the result of a run that needs no reviewer.
    let auto = goal(dir.path(), &url, "auto");
    let (st, v) = send(
        client()
            .post(b.url("/runs"))
            .json(&json!({"goal": auto, "wait": 60})),
    )
    .await;
    assert_eq!(st, 201, "{v}");
    assert_eq!(
        (v["finished"].as_bool(), v["status"].as_str()),
        (Some(true), Some("succeeded")),
        "{v}"
    );

    // The list on B has every run (visibility is eventually consistent: polled).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (st, v) = send(client().get(b.url("/runs?limit=500"))).await;
        assert_eq!(st, 200, "{v}");
        let listed: Vec<&str> = v
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r["id"].as_str())
            .collect();
        if runs.iter().all(|(id, _)| listed.contains(&id.as_str())) {
            break;
        }
        assert!(Instant::now() < deadline, "not every run listed: {v}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A finished run takes no more decisions, nor a cancellation: 409 as embedded.
    let (st, v) = decide(&b, first, 2, json!({"decision": "approve"})).await;
    assert_eq!(
        (st, v["code"].as_str()),
        (409, Some("op.run_finished")),
        "{v}"
    );
    let (st, v) = send(
        client()
            .post(b.url(&format!("/runs/{first}/cancel")))
            .json(&json!({})),
    )
    .await;
    assert_eq!(
        (st, v["code"].as_str()),
        (409, Some("op.run_finished")),
        "{v}"
    );
}

/// The page, unchanged, on server B approves a run started on server A (Chromium; without the
/// browser binaries the test says SKIPPED).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_on_one_server_approves_a_run_started_on_the_other() {
    let Some(cluster) = cluster(None).await else {
        return;
    };
    let Cluster { a, b, ref dir, .. } = cluster;
    let Some(session) = browser::session().await else {
        return;
    };
    let (url, counts) = counting_service().await;
    let id = serve::create(&a, &goal(dir.path(), &url, "ask")).await;
    until(&b, &id, awaits_both).await;
    let c = &session.c;
    browser::open_page_at_run(c, &b.base, None, &id).await;
    browser::until(
        c,
        "two approvals",
        "return document.querySelectorAll('.approval[data-call-id]').length === 2",
    )
    .await;
    for call in [1, 2] {
        let card = format!(".approval[data-call-id=\"{call}\"]");
        browser::until(
            c,
            "the card's approve button",
            &format!("return document.querySelector('{card} button.approve') !== null"),
        )
        .await;
        browser::click(c, &format!("{card} button.approve")).await;
        browser::until(
            c,
            "the card gone",
            &format!("return document.querySelector('{card}') === null"),
        )
        .await;
    }
    let (st, v) = send(client().get(a.url(&format!("/runs/{id}/result?wait=60")))).await;
    assert_eq!((st, v["status"].as_str()), (200, Some("succeeded")), "{v}");
    assert_eq!((count(&counts, 1), count(&counts, 2)), (1, 1));
    browser::until(
        c,
        "the run shown succeeded",
        "return document.querySelector('#run-status').dataset.status === 'succeeded'",
    )
    .await;
    browser::no_errors(c).await;
}

const CI: &str = "token-of-ci";
const ALICE: &str = "token-of-alice";
const DUAL: &str = "token-of-dual";

async fn as_(token: &str, rb: reqwest::RequestBuilder) -> (u16, Value) {
    send(rb.bearer_auth(token)).await
}

/// Polls `GET /runs/{id}` as `token` until `pred` holds (60 s at most).
async fn until_as(s: &Server, token: &str, id: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, v) = as_(token, client().get(s.url(&format!("/runs/{id}")))).await;
        if status == 200 && pred(&v) {
            return v;
        }
        assert!(Instant::now() < deadline, "never reached: {status} {v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Principals, the operator's floor and separation of duties hold on Temporal as embedded
/// (the same functions define and check): `ci`'s `approve: auto` under a floor of `http = "ask"`
/// still waits for a reviewer under the floor's rule; a submitter cannot read another's run
/// (404, through either server); `dual` may not decide the run it submitted (403 `approval.own_run`), through either
/// server; `alice` may.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn principals_and_the_floor_hold_across_servers() {
    let p = |name: &str, token: &str, roles: &[&str]| json!({"name": name, "token_sha256": dagloop::server::token_sha256(token), "roles": roles});
    let config = json!({
        "grants": {"tools": ["http"], "egress": {"private": true}, "files": ["/"]},
        "principals": [p("ci", CI, &["submit"]), p("alice", ALICE, &["review"]),
                       p("dual", DUAL, &["submit", "review"])],
        "approval": {"kinds": {"http": "ask"}, "separate_duties": true},
    });
    let Some(cluster) = cluster(Some(config)).await else {
        return;
    };
    let Cluster { a, b, ref dir, .. } = cluster;
    let (url, counts) = counting_service().await;
    let auto = goal(dir.path(), &url, "auto");
    let (st, v) = as_(
        CI,
        client()
            .post(a.url("/runs"))
            .json(&json!({"goal": auto, "approve": "auto"})),
    )
    .await;
    assert_eq!(st, 201, "{v}");
    let ci_run = v["id"].as_str().expect("id").to_string();
    let run = until_as(&b, ALICE, &ci_run, awaits_both).await;
    let rules: Vec<String> = serve::awaiting(&run)
        .iter()
        .filter_map(|c| c["rule"].as_str().map(str::to_string))
        .collect();
    assert_eq!(rules, ["floor:kind:http", "floor:kind:http"], "{run}");
    assert_eq!(run["submitted_by"], "ci", "{run}");
    // A stream ticket from A opens the run's events on B (the servers share the principals,
    // so the key tickets are signed with), once.
    let (st, t) = as_(
        ALICE,
        client()
            .post(a.url("/tickets"))
            .json(&json!({"run": ci_run})),
    )
    .await;
    assert_eq!(st, 200, "{t}");
    let ticket = t["ticket"].as_str().expect("ticket").to_string();
    let events = b.url(&format!("/runs/{ci_run}/events"));
    let opened = client()
        .get(&events)
        .header("x-dagloop-ticket", &ticket)
        .send()
        .await
        .expect("events");
    assert_eq!(opened.status().as_u16(), 200);
    let first = tokio::time::timeout(Duration::from_secs(30), opened.bytes_stream().next())
        .await
        .expect("an event within 30 s")
        .expect("a chunk")
        .expect("bytes");
    assert!(
        String::from_utf8_lossy(&first).contains("run_started"),
        "{first:?}"
    );
    serve::refused(
        send(client().get(&events).header("x-dagloop-ticket", &ticket)).await,
        401,
        "auth.ticket",
    );
    // `dual`'s own run: it may not decide it, through either server; alice may.
    let (st, v) = as_(
        DUAL,
        client()
            .post(b.url("/runs"))
            .json(&json!({"goal": goal(dir.path(), &url, "ask")})),
    )
    .await;
    assert_eq!(st, 201, "{v}");
    let own = v["id"].as_str().expect("id").to_string();
    until_as(&a, ALICE, &own, awaits_both).await;
    // Another submitter's run is nothing to `ci` (a submitter only), on either server.
    for s in [&a, &b] {
        let (st, v) = as_(CI, client().get(s.url(&format!("/runs/{own}")))).await;
        assert_eq!(st, 404, "{v}");
    }
    for s in [&a, &b] {
        let got = as_(
            DUAL,
            client()
                .post(s.url(&format!("/runs/{own}/approvals/1")))
                .json(&json!({"decision": "approve"})),
        )
        .await;
        serve::refused(got, 403, "approval.own_run");
    }
    assert!(
        counts.lock().expect("counts").is_empty(),
        "nothing ran unreviewed"
    );
    for (id, s) in [(&ci_run, &b), (&own, &a)] {
        for call in [1, 2] {
            let (st, v) = as_(
                ALICE,
                client()
                    .post(s.url(&format!("/runs/{id}/approvals/{call}")))
                    .json(&json!({"decision": "approve"})),
            )
            .await;
            assert_eq!(st, 200, "{v}");
        }
        let (st, v) = as_(
            ALICE,
            client().get(s.url(&format!("/runs/{id}/result?wait=60"))),
        )
        .await;
        assert_eq!((st, v["status"].as_str()), (200, Some("succeeded")), "{v}");
    }
    assert_eq!((count(&counts, 1), count(&counts, 2)), (2, 2));
}

/// Webhooks as embedded: a run started on a server whose operator config has `notify.webhook`
/// has each `approval_requested` posted once (by a worker, which reads the same config), with a
/// link to the page on the server that started it; the receiver refuses the first delivery,
/// which Temporal retries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_are_posted_by_the_workers() {
    let hook = desk::receiver(1).await;
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(bin::open_config()).expect("config"))
            .expect("config JSON");
    config["notify"] = json!({"webhook": {"url": hook.url}});
    let Some(c) = cluster::cluster_full(Some(config), &[], true).await else {
        return;
    };
    let (url, _counts) = counting_service().await;
    let id = serve::create(&c.a, &goal(c.dir.path(), &url, "ask")).await;
    until(&c.b, &id, awaits_both).await;
    // Both calls' notifications, the first one retried after its 500.
    let deadline = Instant::now() + Duration::from_secs(60);
    let delivered = loop {
        let got: Vec<Value> = hook
            .got
            .lock()
            .expect("got")
            .iter()
            .map(|g| g.1.clone())
            .collect();
        if got.len() >= 3 {
            break got;
        }
        assert!(
            Instant::now() < deadline,
            "notifications never came: {got:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    let all = hook.got.lock().expect("got").len();
    assert_eq!(
        all, 3,
        "one refused delivery, then one per call: {delivered:?}"
    );
    let mut calls: Vec<u64> = delivered[1..]
        .iter()
        .filter_map(|b| b["call_id"].as_u64())
        .collect();
    calls.sort_unstable();
    assert_eq!(calls, [1, 2], "{delivered:?}");
    for b in &delivered {
        assert_eq!(
            (b["event"].as_str(), b["run_id"].as_str()),
            (Some("approval_requested"), Some(id.as_str())),
            "{b}"
        );
        let link = b["link"].as_str().expect("a link");
        let call = b["call_id"].as_u64().expect("call");
        assert_eq!(link, c.a.url(&format!("/?run={id}&call={call}")), "{b}");
        // The link works: it opens the page.
        let r = client().get(link).send().await.expect("page");
        assert_eq!(r.status().as_u16(), 200);
        assert!(
            r.text().await.unwrap_or_default().contains("<html"),
            "the page"
        );
    }
    let _ = &c.workers;
}

/// `Idempotency-Key` across servers: the key names the workflow, so the key reused on the
/// other server returns the same run (200, `Idempotent-Replayed`), with another body 422; two
/// concurrent first uses through both servers start one run. Cassettes on Temporal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotency_key_holds_across_servers() {
    let Some(c) = cluster(None).await else {
        return;
    };
    let (url, _counts) = counting_service().await;
    let body = json!({"goal": goal(c.dir.path(), &url, "ask")});
    let post = |s: &Server, key: &str, b: &Value| {
        client()
            .post(s.url("/runs"))
            .header("Idempotency-Key", key)
            .json(b)
            .send()
    };
    let first = post(&c.a, "k1", &body).await.expect("post");
    assert_eq!(first.status().as_u16(), 201);
    let first: Value = first.json().await.expect("json");
    let again = post(&c.b, "k1", &body).await.expect("post");
    assert_eq!(again.status().as_u16(), 200);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    let again: Value = again.json().await.expect("json");
    assert_eq!(
        again["id"], first["id"],
        "the same run from the other server"
    );
    let mut other = body.clone();
    other["goal"]["goal"] = json!("something else");
    let (st, v) = send(
        client()
            .post(c.b.url("/runs"))
            .header("Idempotency-Key", "k1")
            .json(&other),
    )
    .await;
    assert_eq!(
        (st, v["code"].as_str()),
        (422, Some("http.idempotency_key_reused")),
        "{v}"
    );
    // Two first uses at once, one through each server: one run.
    let (x, y) = tokio::join!(post(&c.a, "k2", &body), post(&c.b, "k2", &body));
    let (x, y) = (x.expect("post"), y.expect("post"));
    let mut codes = [x.status().as_u16(), y.status().as_u16()];
    codes.sort_unstable();
    assert_eq!(codes, [200, 201]);
    let (x, y): (Value, Value) = (x.json().await.expect("json"), y.json().await.expect("json"));
    assert_eq!(x["id"], y["id"]);
    assert_ne!(x["id"], first["id"], "another key, another run");

    // A cassette is exported from the workflow's journal on either server.
    let id = first["id"].as_str().expect("id");
    until(&c.a, id, awaits_both).await;
    let (st, v) = send(client().get(c.b.url(&format!("/runs/{id}/cassette")))).await;
    assert_eq!(st, 200, "{v}");
    assert!(
        v["model"]["turns"]
            .as_array()
            .is_some_and(|t| !t.is_empty()),
        "{v}"
    );
    let _ = &c.workers;
}

/// Forks on Temporal (`POST /runs/{id}/fork`, `dagloop fork --engine temporal`): a new workflow
/// from the original's journal prefix, by the embedded engine's rule (`runs::fork`). Forked
/// after step 1 through the server that did not start it, the fork asks the model for step 2
/// only (no call runs again) and reaches the original's output; forked after step 0 (from
/// the command line), it asks for step 1 again and waits for a reviewer for both calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_forks_on_temporal() {
    let Some(c) = cluster(None).await else {
        return;
    };
    let (url, counts) = counting_service().await;
    let id = serve::create(&c.a, &goal(c.dir.path(), &url, "ask")).await;
    until(&c.b, &id, awaits_both).await;
    for call in [1, 2] {
        let (st, v) = decide(&c.b, &id, call, json!({"decision": "approve"})).await;
        assert_eq!(st, 200, "{v}");
    }
    let (st, original) = send(client().get(c.a.url(&format!("/runs/{id}/result?wait=60")))).await;
    assert_eq!(
        (st, original["status"].as_str()),
        (200, Some("succeeded")),
        "{original}"
    );

    let (st, v) = send(
        client()
            .post(c.b.url(&format!("/runs/{id}/fork")))
            .json(&json!({"at_step": 1})),
    )
    .await;
    assert_eq!(st, 201, "{v}");
    assert_eq!(v["forked_from"], json!({"run": id, "step": 1}), "{v}");
    let fork = v["id"].as_str().expect("id").to_string();
    let (st, done) = send(client().get(c.a.url(&format!("/runs/{fork}/result?wait=60")))).await;
    assert_eq!(
        (st, done["status"].as_str()),
        (200, Some("succeeded")),
        "{done}"
    );
    assert_eq!(done["output"], original["output"], "{done}");
    let (_, shown) = send(client().get(c.a.url(&format!("/runs/{fork}")))).await;
    assert_eq!(shown["forked_from"]["run"], id.as_str(), "{shown}");
    assert_eq!(
        (count(&counts, 1), count(&counts, 2)),
        (1, 1),
        "the fork's step 1 stands as recorded"
    );
    serve::refused(
        send(
            client()
                .post(c.a.url(&format!("/runs/{id}/fork")))
                .json(&json!({"at_step": 9})),
        )
        .await,
        400,
        "fork.no_such_step",
    );

    // From the command line, after step 0: step 1 is asked again and waits for a reviewer;
    // approved, the fork ends as the original did (and `dagloop fork` prints its result).
    let mut cli = bin::dagloop()
        .current_dir(c.dir.path())
        .arg("--config")
        .arg(bin::open_config())
        .args(["--no-store", "fork", &id, "--at-step", "0", "--json"])
        .args(["--engine", "temporal", "--temporal", &c.dev.address])
        .args(["--task-queue", "serve"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("dagloop fork");
    let mut said = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(cli.stderr.take().expect("stderr")),
        &mut said,
    )
    .expect("stderr line");
    let said: Value = serde_json::from_str(&said).expect("{run_id} on stderr");
    let cli_fork = said["run_id"].as_str().expect("run_id").to_string();
    let v = until(&c.b, &cli_fork, awaits_both).await;
    assert_eq!(v["forked_from"], json!({"run": id, "step": 0}), "{v}");
    for call in [1, 2] {
        let (st, v) = decide(&c.a, &cli_fork, call, json!({"decision": "approve"})).await;
        assert_eq!(st, 200, "{v}");
    }
    let out = tokio::task::spawn_blocking(move || cli.wait_with_output())
        .await
        .expect("join")
        .expect("dagloop fork ends");
    assert!(out.status.success(), "{out:?}");
    let printed: Value = serde_json::from_slice(&out.stdout).expect("result JSON");
    assert_eq!(printed["output"], original["output"], "{printed}");
    assert_eq!((count(&counts, 1), count(&counts, 2)), (2, 2));
    let _ = &c.workers;
}
