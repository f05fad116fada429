//! Issue 47 item 3, runs: one principal has at most the operator's `[limits] active_runs` runs
//! that have not ended. Through the real binary and real HTTP on 127.0.0.1, under an operator
//! config that sets the limit to 2:
//!
//! - a principal with two runs waiting for a reviewer is refused a third at once (429
//!   `server.too_many_runs`, the message naming the limit and how many are active), and so is
//!   its fork of one of them; another principal's `POST /runs` is still answered, and the
//!   operator's own principal (`admin`) is held to no limit;
//! - the count comes from the store: after a restart of the server the principal is still at
//!   its limit;
//! - once one of its runs ends (cancelled), it may submit again.

#[path = "common/bin.rs"]
mod bin;
#[path = "common/serve.rs"]
mod serve;

use serde_json::{Value, json};
use serve::{Server, client, counting_service, goal, send};

const A: &str = "token-of-a";
const B: &str = "token-of-b";
const ADMIN: &str = "token-of-admin";

/// `POST /runs` of `body` as the principal of `token`.
async fn submit(s: &Server, token: &str, body: &Value) -> (u16, Value) {
    send(client().post(s.url("/runs")).bearer_auth(token).json(body)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_principal_at_its_run_limit_is_refused_until_one_ends_and_others_are_not() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("runs.db");
    let principal = |name: &str, token: &str, roles: &[&str]| json!({"name": name, "token_sha256": dagloop::server::token_sha256(token), "roles": roles});
    let cfg = dir.path().join("config.json");
    std::fs::write(
        &cfg,
        json!({"grants": {"tools": ["http"], "egress": {"private": true},
                          "files": [dir.path().display().to_string()]},
               "limits": {"active_runs": 2},
               "principals": [principal("a", A, &["submit"]), principal("b", B, &["submit"]),
                              principal("admin", ADMIN, &["admin"])]})
        .to_string(),
    )
    .expect("config");
    let (url, counts) = counting_service().await;
    // Every call asks a reviewer: the runs stay active until decided or cancelled.
    let body = goal(dir.path(), &url, "ask");
    let mut s = Server::start_config(&store, &cfg, None, |_| {});
    let mut mine = Vec::new();
    for _ in 0..2 {
        let (st, v) = submit(&s, A, &body).await;
        assert_eq!(st, 201, "{v}");
        let id = v["id"].as_str().expect("id").to_string();
        until_as(&s, &id, |v| v["status"] == "waiting").await;
        mine.push(id);
    }
    let refused = |(st, v): (u16, Value)| {
        assert_eq!(
            (st, v["code"].as_str()),
            (429, Some("server.too_many_runs")),
            "{v}"
        );
        let m = v["message"].as_str().unwrap_or_default();
        assert!(
            m.contains("`a` has 2 active runs") && m.contains("(2,"),
            "{m}"
        );
    };
    refused(submit(&s, A, &body).await);
    // A fork is a run too.
    refused(
        send(
            client()
                .post(s.url(&format!("/runs/{}/fork", mine[0])))
                .bearer_auth(A)
                .json(&json!({"at_step": 0})),
        )
        .await,
    );
    // Another principal is not held to a's runs; the operator's own (`admin`) to none.
    let (st, v) = submit(&s, B, &body).await;
    assert_eq!(st, 201, "{v}");
    for _ in 0..3 {
        let (st, v) = submit(&s, ADMIN, &body).await;
        assert_eq!(st, 201, "{v}");
    }

    // The count is the store's: a restarted server still refuses a third.
    s.kill();
    let s = Server::start_config(&store, &cfg, None, |_| {});
    refused(submit(&s, A, &body).await);

    // One of a's runs ends: a may submit again, once.
    let (st, v) = send(
        client()
            .post(s.url(&format!("/runs/{}/cancel", mine[0])))
            .bearer_auth(A)
            .json(&json!({})),
    )
    .await;
    assert!(matches!(st, 200 | 202), "{st} {v}");
    let ended = until_as(&s, &mine[0], |v| v["status"] == "cancelled").await;
    assert_eq!(ended["status"], "cancelled");
    let (st, v) = submit(&s, A, &body).await;
    assert_eq!(st, 201, "{v}");
    refused(submit(&s, A, &body).await);
    // No call of any run ran without its reviewer.
    assert!(counts.lock().expect("counts").is_empty());
}

/// Polls run `id` (as the admin) until `pred` holds (bounded).
async fn until_as(s: &Server, id: &str, pred: impl Fn(&Value) -> bool) -> Value {
    for _ in 0..400 {
        let (_, v) = send(
            client()
                .get(s.url(&format!("/runs/{id}")))
                .bearer_auth(ADMIN),
        )
        .await;
        if pred(&v) {
            return v;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    panic!("run {id} never reached the expected state");
}
