//! What a client of `dagloop serve` can and cannot do, over real HTTP on 127.0.0.1 against the
//! real binary: each attack of issue 24 (browser safety, identities) as a client would make it.
//!
//! - DNS rebinding: a `Host` that is not allowed gets 421 `http.bad_host` (page and API), while
//!   loopback names, the listening address and `--allow-host` names are served.
//! - Cross-origin "simple" POSTs (text/plain, form-encoded, no content type) are refused with
//!   415 and leave the run running; a JSON cancel works and says who cancelled.
//! - A ticket opens only the events of the run it was issued for.
//! - `presented` must be a string.
//! - A repeated `Idempotency-Key` starts one run, also across a restart and when two requests
//!   race.
//! - Principals and roles: a submitter may not decide, nor see or cancel another submitter's
//!   runs (404, as for a run that does not exist); a reviewer's decision is journaled with its
//!   name and shown by `GET /runs/{id}`, the events and `dagloop show --json`.

#[path = "common/bin.rs"]
mod bin;
#[path = "common/serve.rs"]
mod serve;

use std::path::Path;

use eventsource_stream::Eventsource;
use futures::StreamExt;
use serde_json::{Value, json};
use serve::{Server, awaiting, client, counting_service, create, goal, refused, send, until};

/// Tokens of the principals [`principals_file`] configures.
const CI: &str = "token-of-ci";
const OTHER: &str = "token-of-other";
const ALICE: &str = "token-of-alice";
const ROOT: &str = "token-of-root";

/// A `--principals` file: `ci` and `other` submit, `alice` reviews, `root` is an admin.
fn principals_file(dir: &Path) -> std::path::PathBuf {
    let p = |name: &str, token: &str, roles: &[&str]| json!({"name": name, "token_sha256": dagloop::server::token_sha256(token), "roles": roles});
    let path = dir.join("principals.json");
    let list = json!([
        p("ci", CI, &["submit"]),
        p("other", OTHER, &["submit"]),
        p("alice", ALICE, &["review"]),
        p("root", ROOT, &["admin"]),
    ]);
    std::fs::write(&path, list.to_string()).expect("principals file");
    path
}

fn with_principals(store: &Path, dir: &Path) -> Server {
    let file = principals_file(dir);
    Server::start_with(store, None, |c| {
        c.arg("--principals").arg(&file);
    })
}

/// The port of a server's base URL.
fn port(s: &Server) -> u16 {
    s.base
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("a port")
}

/// Polls the run as `token` until `pred` holds (bounded).
async fn until_as(s: &Server, token: &str, id: &str, pred: impl Fn(&Value) -> bool) -> Value {
    for _ in 0..400 {
        let (status, v) = send(
            client()
                .get(s.url(&format!("/runs/{id}")))
                .bearer_auth(token),
        )
        .await;
        assert_eq!(status, 200, "{v}");
        if pred(&v) {
            return v;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    panic!("the run never reached the expected state");
}

/// The status and, unless it is an event stream that opened (which would not end), the body.
async fn send_no_stream(rb: reqwest::RequestBuilder) -> (u16, Value) {
    let (c, req) = rb.build_split();
    let req = req.expect("a request");
    let path = req.url().path().to_string();
    let r = c.execute(req).await.expect("request");
    let status = r.status().as_u16();
    if status == 200 {
        return (status, Value::Null);
    }
    let ct = r
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let text = r.text().await.expect("body");
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    serve::contract::check("GET", &path, status, &ct, &body);
    (status, body)
}

async fn run_ids(s: &Server, token: Option<&str>) -> Vec<String> {
    let mut rb = client().get(s.url("/runs"));
    if let Some(t) = token {
        rb = rb.bearer_auth(t);
    }
    let (st, v) = send(rb).await;
    assert_eq!(st, 200, "{v}");
    v.as_array()
        .expect("a list")
        .iter()
        .filter_map(|r| r["id"].as_str().map(str::to_string))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebinding_host_gets_421_and_loopback_names_are_served() {
    let dir = tempfile::tempdir().expect("tmp");
    let (url, _) = counting_service().await;
    let s = Server::start_with(&dir.path().join("runs.db"), None, |c| {
        c.args(["--allow-host", "reviews.example"]);
    });
    let port = port(&s);
    // What a page on evil.example sends once its name resolves to 127.0.0.1.
    for host in [
        format!("evil.example:{port}"),
        "evil.example".to_string(),
        format!("localhost.evil.example:{port}"),
        format!("127.0.0.2:{port}"),
    ] {
        for path in ["/", "/app.js", "/runs", "/openapi.json"] {
            refused(
                send(client().get(s.url(path)).header("host", &host)).await,
                421,
                "http.bad_host",
            );
        }
        refused(
            send(
                client()
                    .post(s.url("/runs"))
                    .header("host", &host)
                    .json(&goal(dir.path(), &url, "auto")),
            )
            .await,
            421,
            "http.bad_host",
        );
    }
    assert!(run_ids(&s, None).await.is_empty(), "nothing was started");
    // Loopback names (any port), the listening address and the operator's names are served.
    for host in [
        format!("localhost:{port}"),
        "localhost".to_string(),
        format!("127.0.0.1:{port}"),
        format!("[::1]:{port}"),
        "reviews.example".to_string(),
        format!("reviews.example:{port}"),
    ] {
        let page = client()
            .get(s.url("/"))
            .header("host", &host)
            .send()
            .await
            .expect("page");
        assert_eq!(page.status().as_u16(), 200, "{host}");
        let (st, v) = send(client().get(s.url("/runs")).header("host", &host)).await;
        assert_eq!(st, 200, "{host}: {v}");
    }
    let (st, v) = send(
        client()
            .post(s.url("/runs"))
            .header("host", format!("localhost:{port}"))
            .json(&goal(dir.path(), &url, "auto")),
    )
    .await;
    assert_eq!(st, 201, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cross_origin_simple_post_cannot_cancel_and_a_json_cancel_can() {
    let dir = tempfile::tempdir().expect("tmp");
    let (url, counts) = counting_service().await;
    let s = Server::start(&dir.path().join("runs.db"), None);
    let id = create(&s, &goal(dir.path(), &url, "ask")).await;
    until(&s, &id, |v| awaiting(v).len() == 2).await;
    let cancel = s.url(&format!("/runs/{id}/cancel"));
    // What another origin's page can send without a CORS preflight (`fetch(..., {mode:
    // "no-cors"})` or a form): text/plain, form-encoded, multipart, or no content type.
    for (ct, body) in [
        (Some("text/plain"), r#"{"reason": "x"}"#),
        (Some("text/plain;charset=UTF-8"), ""),
        (Some("application/x-www-form-urlencoded"), "reason=x"),
        (Some("multipart/form-data; boundary=b"), "--b--\r\n"),
        (None, ""),
    ] {
        let mut rb = client()
            .post(&cancel)
            .header("origin", "http://evil.example")
            .body(body);
        if let Some(ct) = ct {
            rb = rb.header("content-type", ct);
        }
        refused(send(rb).await, 415, "http.unsupported_media_type");
    }
    // The same goes for the other state changes.
    refused(
        send(
            client()
                .post(s.url("/runs"))
                .header("content-type", "text/plain")
                .body(goal(dir.path(), &url, "auto").to_string()),
        )
        .await,
        415,
        "http.unsupported_media_type",
    );
    refused(
        send(
            client()
                .post(s.url(&format!("/runs/{id}/approvals/1")))
                .header("content-type", "text/plain")
                .body(r#"{"decision": "approve"}"#),
        )
        .await,
        415,
        "http.unsupported_media_type",
    );
    refused(
        send(
            client()
                .post(s.url("/tickets"))
                .header("content-type", "application/x-www-form-urlencoded")
                .body("run=x"),
        )
        .await,
        415,
        "http.unsupported_media_type",
    );
    assert_eq!(run_ids(&s, None).await, vec![id.clone()]);
    let v = until(&s, &id, |_| true).await;
    assert_eq!(v["status"], "waiting", "the run still runs: {v}");
    assert_eq!(awaiting(&v).len(), 2, "nothing was decided: {v}");
    // A body that is JSON but not {reason?} is refused too.
    refused(
        send(client().post(&cancel).json(&json!({"why": "x"}))).await,
        400,
        "http.bad_body",
    );
    // The run's own client cancels with JSON.
    let (st, v) = send(
        client()
            .post(&cancel)
            .json(&json!({"reason": "the operator stopped it"})),
    )
    .await;
    assert_eq!((st, v["status"].as_str()), (200, Some("applied")), "{v}");
    let done = until(&s, &id, |v| v["status"] == "cancelled").await;
    assert_eq!(
        done["cancelled_by"],
        json!({"principal": "local", "channel": "http"}),
        "{done}"
    );
    assert!(counts.lock().expect("counts").is_empty(), "no call ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ticket_opens_only_the_events_of_its_run() {
    let dir = tempfile::tempdir().expect("tmp");
    let (url, _) = counting_service().await;
    let s = Server::start(&dir.path().join("runs.db"), Some("s3cret"));
    let mut ids = Vec::new();
    for _ in 0..2 {
        let (st, v) = send(
            client()
                .post(s.url("/runs"))
                .bearer_auth("s3cret")
                .json(&goal(dir.path(), &url, "ask")),
        )
        .await;
        assert_eq!(st, 201, "{v}");
        ids.push(v["id"].as_str().expect("id").to_string());
    }
    let (a, b) = (&ids[0], &ids[1]);
    let ticket_for = |run: Value| {
        client()
            .post(s.url("/tickets"))
            .bearer_auth("s3cret")
            .json(&json!({ "run": run }))
    };
    let (st, t) = send(ticket_for(json!(a))).await;
    assert_eq!(st, 200, "{t}");
    assert_eq!(t["run"], a.as_str());
    let ticket = t["ticket"].as_str().expect("ticket");
    // Refused for run B, for the run list, and for A's other routes.
    for path in [
        format!("/runs/{b}/events"),
        "/runs".to_string(),
        format!("/runs/{a}"),
        format!("/runs/{a}/approvals"),
    ] {
        let (st, e) = send_no_stream(
            client()
                .get(s.url(&path))
                .header("x-dagloop-ticket", ticket),
        )
        .await;
        assert_eq!(st, 401, "{path}: {e}");
    }
    refused(
        send_no_stream(
            client()
                .get(s.url(&format!("/runs/{b}/events")))
                .header("x-dagloop-ticket", ticket),
        )
        .await,
        401,
        "auth.ticket",
    );
    // It opens A's events.
    let r = client()
        .get(s.url(&format!("/runs/{a}/events")))
        .header("x-dagloop-ticket", ticket)
        .send()
        .await
        .expect("events");
    assert_eq!(r.status().as_u16(), 200);
    let mut stream = r.bytes_stream().eventsource();
    let first = tokio::time::timeout(std::time::Duration::from_secs(10), stream.next())
        .await
        .expect("an event in time")
        .expect("an event")
        .expect("a good frame");
    let data: Value = serde_json::from_str(&first.data).expect("JSON");
    assert_eq!(data["run_id"], a.as_str(), "{data}");
    // Tickets are only for runs that exist, asked for as {run}.
    refused(
        send(ticket_for(json!("run-nope"))).await,
        404,
        "store.unknown_run",
    );
    refused(send(ticket_for(json!(5))).await, 400, "http.bad_body");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presented_must_be_a_string() {
    let dir = tempfile::tempdir().expect("tmp");
    let (url, counts) = counting_service().await;
    let s = Server::start(&dir.path().join("runs.db"), None);
    let id = create(&s, &goal(dir.path(), &url, "ask")).await;
    until(&s, &id, |v| awaiting(v).len() == 2).await;
    for presented in [json!(123), json!(null), json!({"hash": "x"}), json!(["x"])] {
        refused(
            send(
                client()
                    .post(s.url(&format!("/runs/{id}/approvals/1")))
                    .json(&json!({"decision": "approve", "presented": presented})),
            )
            .await,
            400,
            "op.bad_decision",
        );
    }
    let v = until(&s, &id, |_| true).await;
    assert_eq!(awaiting(&v).len(), 2, "nothing was decided: {v}");
    assert!(counts.lock().expect("counts").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_idempotency_key_starts_one_run() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("runs.db");
    let (url, _) = counting_service().await;
    let mut s = with_principals(&store, dir.path());
    let g = goal(dir.path(), &url, "ask");
    let post = |s: &Server, token: &str, key: &str| {
        client()
            .post(s.url("/runs"))
            .bearer_auth(token)
            .header("idempotency-key", key)
            .json(&g)
    };
    let r = post(&s, CI, "order-7").send().await.expect("first");
    assert_eq!(r.status().as_u16(), 201);
    assert!(r.headers().get("idempotent-replayed").is_none());
    let first: Value = r.json().await.expect("JSON");
    let id = first["id"].as_str().expect("id").to_string();
    // The client retries (it never saw the 201).
    for _ in 0..2 {
        let r = post(&s, CI, "order-7").send().await.expect("retry");
        assert_eq!(r.status().as_u16(), 200);
        assert_eq!(
            r.headers()
                .get("idempotent-replayed")
                .and_then(|v| v.to_str().ok()),
            Some("true")
        );
        let again: Value = r.json().await.expect("JSON");
        assert_eq!(again["id"], id.as_str(), "{again}");
        assert!(again["status"].is_string(), "{again}");
    }
    assert_eq!(run_ids(&s, Some(ROOT)).await, vec![id.clone()]);
    // Two requests with a new key at once: one run.
    let (x, y) = tokio::join!(
        post(&s, CI, "order-8").send(),
        post(&s, CI, "order-8").send()
    );
    let mut statuses = vec![
        x.expect("x").status().as_u16(),
        y.expect("y").status().as_u16(),
    ];
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 201]);
    assert_eq!(run_ids(&s, Some(ROOT)).await.len(), 2);
    // Another principal's key is its own.
    let r = post(&s, OTHER, "order-7").send().await.expect("other");
    assert_eq!(r.status().as_u16(), 201);
    assert_eq!(run_ids(&s, Some(ROOT)).await.len(), 3);
    // A malformed key is refused.
    refused(
        send(post(&s, CI, "")).await,
        400,
        "http.bad_idempotency_key",
    );
    refused(
        send(post(&s, CI, &"k".repeat(256))).await,
        400,
        "http.bad_idempotency_key",
    );
    // The keys outlive the process.
    s.kill();
    let s = with_principals(&store, dir.path());
    let r = post(&s, CI, "order-7")
        .send()
        .await
        .expect("after a restart");
    assert_eq!(r.status().as_u16(), 200);
    let again: Value = r.json().await.expect("JSON");
    assert_eq!(again["id"], id.as_str(), "{again}");
    assert_eq!(run_ids(&s, Some(ROOT)).await.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submitter_may_not_decide_and_a_reviewers_decision_is_journaled_with_its_name() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("runs.db");
    let (url, counts) = counting_service().await;
    let s = with_principals(&store, dir.path());
    // Tokens: none, wrong.
    refused(
        send(client().get(s.url("/runs"))).await,
        401,
        "auth.missing",
    );
    refused(
        send(client().get(s.url("/runs")).bearer_auth("nope")).await,
        401,
        "auth.invalid",
    );
    let (st, v) = send(client().post(s.url("/runs")).bearer_auth(CI).json(&goal(
        dir.path(),
        &url,
        "ask",
    )))
    .await;
    assert_eq!(st, 201, "{v}");
    let id = v["id"].as_str().expect("id").to_string();
    until_as(&s, CI, &id, |v| awaiting(v).len() == 2).await;
    let decide = |token: &str, call: u64| {
        client()
            .post(s.url(&format!("/runs/{id}/approvals/{call}")))
            .bearer_auth(token)
            .json(&json!({"decision": "approve"}))
    };
    // The submitter may not decide its own run's calls; a reviewer may not submit or cancel.
    refused(send(decide(CI, 1)).await, 403, "auth.forbidden");
    refused(
        send(client().post(s.url("/runs")).bearer_auth(ALICE).json(&goal(
            dir.path(),
            &url,
            "auto",
        )))
        .await,
        403,
        "auth.forbidden",
    );
    refused(
        send(
            client()
                .post(s.url(&format!("/runs/{id}/cancel")))
                .bearer_auth(ALICE)
                .json(&json!({})),
        )
        .await,
        403,
        "auth.forbidden",
    );
    assert!(counts.lock().expect("counts").is_empty());
    // The reviewer decides; the admin too.
    let (st, v) = send(decide(ALICE, 1)).await;
    assert_eq!(st, 200, "{v}");
    let (st, v) = send(decide(ROOT, 2)).await;
    assert_eq!(st, 200, "{v}");
    let done = until_as(&s, ALICE, &id, |v| v["status"] == "succeeded").await;
    let by = |v: &Value, call: u64| {
        v["calls"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["id"] == call))
            .map(|c| c["decided_by"].clone())
            .unwrap_or_default()
    };
    assert_eq!(
        by(&done, 1),
        json!({"principal": "alice", "channel": "http"}),
        "{done}"
    );
    assert_eq!(
        by(&done, 2),
        json!({"principal": "root", "channel": "http"}),
        "{done}"
    );
    // The events say it too.
    let r = client()
        .get(s.url(&format!("/runs/{id}/events")))
        .bearer_auth(ALICE)
        .send()
        .await
        .expect("events");
    let mut stream = r.bytes_stream().eventsource();
    let mut decisions = Vec::new();
    while let Ok(Some(Ok(ev))) =
        tokio::time::timeout(std::time::Duration::from_secs(10), stream.next()).await
    {
        let data: Value = serde_json::from_str(&ev.data).expect("JSON");
        if ev.event == "decision" {
            decisions.push((data["call_id"].clone(), data["by"]["principal"].clone()));
        }
        if ev.event == "run_finished" {
            break;
        }
    }
    decisions.sort_by_key(|d| d.0.as_u64());
    assert_eq!(
        decisions,
        [(json!(1), json!("alice")), (json!(2), json!("root"))]
    );
    // And `dagloop show --json`, from the store.
    let out = bin::dagloop()
        .args(["show", "--json", &id, "--store"])
        .arg(&store)
        .output()
        .expect("show");
    assert!(out.status.success(), "{out:?}");
    let shown: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(
        by(&shown, 1),
        json!({"principal": "alice", "channel": "http"}),
        "{shown}"
    );
    assert_eq!(shown["calls"], done["calls"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submitter_sees_and_cancels_only_its_own_runs() {
    let dir = tempfile::tempdir().expect("tmp");
    let (url, _) = counting_service().await;
    let s = with_principals(&dir.path().join("runs.db"), dir.path());
    let submit = |token: &str| {
        client()
            .post(s.url("/runs"))
            .bearer_auth(token)
            .json(&goal(dir.path(), &url, "ask"))
    };
    let (_, a) = send(submit(CI)).await;
    let a = a["id"].as_str().expect("id").to_string();
    let (_, b) = send(submit(OTHER)).await;
    let b = b["id"].as_str().expect("id").to_string();
    until_as(&s, CI, &a, |v| awaiting(v).len() == 2).await;
    until_as(&s, OTHER, &b, |v| awaiting(v).len() == 2).await;
    // Each submitter lists its own run only; the reviewer and the admin list both.
    assert_eq!(run_ids(&s, Some(CI)).await, vec![a.clone()]);
    assert_eq!(run_ids(&s, Some(OTHER)).await, vec![b.clone()]);
    assert_eq!(run_ids(&s, Some(ALICE)).await.len(), 2);
    assert_eq!(run_ids(&s, Some(ROOT)).await.len(), 2);
    // Another submitter's run answers as a run that does not exist.
    for path in [
        format!("/runs/{a}"),
        format!("/runs/{a}/approvals"),
        format!("/runs/{a}/events"),
        format!("/runs/{a}/cassette"),
        format!("/runs/{a}/audit"),
        format!("/runs/{a}/standing"),
        format!("/runs/{a}/grants"),
        format!("/runs/{a}/result"),
    ] {
        refused(
            send_no_stream(client().get(s.url(&path)).bearer_auth(OTHER)).await,
            404,
            "store.unknown_run",
        );
    }
    let cancel = |token: &str, run: &str| {
        client()
            .post(s.url(&format!("/runs/{run}/cancel")))
            .bearer_auth(token)
            .json(&json!({}))
    };
    refused(send(cancel(OTHER, &a)).await, 404, "store.unknown_run");
    refused(
        send(
            client()
                .post(s.url("/tickets"))
                .bearer_auth(OTHER)
                .json(&json!({ "run": a })),
        )
        .await,
        404,
        "store.unknown_run",
    );
    let v = until_as(&s, CI, &a, |_| true).await;
    assert_eq!(v["status"], "waiting", "{v}");
    // Its owner cancels it; the admin cancels the other one.
    let (st, v) = send(cancel(CI, &a)).await;
    assert_eq!(st, 200, "{v}");
    let (st, v) = send(cancel(ROOT, &b)).await;
    assert_eq!(st, 200, "{v}");
    let done = until_as(&s, CI, &a, |v| v["status"] == "cancelled").await;
    assert_eq!(done["cancelled_by"]["principal"], "ci", "{done}");
    // The run's last event says who cancelled it.
    let r = client()
        .get(s.url(&format!("/runs/{a}/events")))
        .bearer_auth(CI)
        .send()
        .await
        .expect("events");
    let mut stream = r.bytes_stream().eventsource();
    let mut last = Value::Null;
    while let Ok(Some(Ok(ev))) =
        tokio::time::timeout(std::time::Duration::from_secs(10), stream.next()).await
    {
        if ev.event == "run_finished" {
            last = serde_json::from_str(&ev.data).expect("JSON");
            break;
        }
    }
    assert_eq!(
        last["by"],
        json!({"principal": "ci", "channel": "http"}),
        "{last}"
    );
    let done = until_as(&s, ALICE, &b, |v| v["status"] == "cancelled").await;
    assert_eq!(done["cancelled_by"]["principal"], "root", "{done}");
}

#[test]
fn a_bad_principals_file_stops_the_server_with_a_code() {
    let dir = tempfile::tempdir().expect("tmp");
    let file = dir.path().join("principals.json");
    for (text, code) in [
        (
            r#"[{"name": "a", "token_sha256": "00", "roles": ["admin"]}]"#,
            "server.principal_hash",
        ),
        (
            r#"[{"name": "a", "token": "plain", "roles": ["admin"]}]"#,
            "cli.bad_principals",
        ),
    ] {
        std::fs::write(&file, text).expect("write");
        let out = bin::dagloop()
            .args(["serve", "--addr", "127.0.0.1:0", "--store"])
            .arg(dir.path().join("runs.db"))
            .arg("--principals")
            .arg(&file)
            .output()
            .expect("run");
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        let v: Value = serde_json::from_slice(&out.stdout).expect("JSON error");
        assert_eq!(v["error"]["code"], code, "{v}");
    }
}

/// The operator's config names the principals (`[[principals]]`) and the extra `Host` names
/// (`allowed_hosts`), as `--principals` and `--allow-host` do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn principals_and_host_names_come_from_the_operators_config() {
    let dir = tempfile::tempdir().expect("tmp");
    let (url, _) = counting_service().await;
    let open: Value = serde_json::from_str(
        &std::fs::read_to_string(bin::open_config()).expect("the tests' open config"),
    )
    .expect("JSON");
    let mut config = open.clone();
    config["principals"] = json!([
        {"name": "ci", "token_sha256": dagloop::server::token_sha256(CI), "roles": ["submit"]},
        {"name": "alice", "token_sha256": dagloop::server::token_sha256(ALICE), "roles": ["review"]}
    ]);
    config["allowed_hosts"] = json!(["reviews.example"]);
    let path = dir.path().join("config.json");
    std::fs::write(&path, config.to_string()).expect("config");
    let s = Server::start_config(&dir.path().join("runs.db"), &path, None, |_| {});
    refused(
        send(client().get(s.url("/runs"))).await,
        401,
        "auth.missing",
    );
    let (st, v) = send(client().post(s.url("/runs")).bearer_auth(CI).json(&goal(
        dir.path(),
        &url,
        "ask",
    )))
    .await;
    assert_eq!(st, 201, "{v}");
    let id = v["id"].as_str().expect("id").to_string();
    refused(
        send(
            client()
                .post(s.url(&format!("/runs/{id}/approvals/1")))
                .bearer_auth(CI)
                .json(&json!({"decision": "approve"})),
        )
        .await,
        403,
        "auth.forbidden",
    );
    let (st, v) = send(
        client()
            .get(s.url("/runs"))
            .bearer_auth(ALICE)
            .header("host", "reviews.example"),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    refused(
        send(
            client()
                .get(s.url("/runs"))
                .bearer_auth(ALICE)
                .header("host", "evil.example"),
        )
        .await,
        421,
        "http.bad_host",
    );
}
