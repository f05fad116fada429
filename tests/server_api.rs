//! `dagloop serve` over real HTTP on 127.0.0.1, driven as a client would: auth (token, tickets,
//! loopback rule), goal checks with JSON pointers, unknown ids, decisions (applied, stale,
//! twice), SSE with `Last-Event-ID`, a server killed with SIGKILL mid-run and started again,
//! and the OpenAPI document (served, and committed as schemas/openapi.json).

#[path = "common/bin.rs"]
mod bin;
#[path = "common/serve.rs"]
mod serve;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};
use serve::{
    Server, awaiting, client, counting_service, create, goal, read_events, refused, send, until,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reviewer_decides_over_http_and_stale_or_repeated_decisions_are_refused() {
    let dir = tempfile::tempdir().expect("tmp");
    let (url, counts) = counting_service().await;
    let s = Server::start(&dir.path().join("runs.db"), None);
    let id = create(&s, &goal(dir.path(), &url, "ask")).await;
    let v = until(&s, &id, |v| awaiting(v).len() == 2).await;
    assert_eq!(v["status"], "waiting");
    // The list reads the run's row, which the driver updates as it commits.
    let mut listed = Value::Null;
    for _ in 0..400 {
        listed = send(client().get(s.url("/runs"))).await.1;
        if listed[0]["awaiting"] == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(listed[0]["id"], id.as_str());
    assert_eq!(listed[0]["awaiting"], 2, "{listed}");
    assert_eq!(listed[0]["status"], "waiting");
    let (_, approvals) = send(client().get(s.url(&format!("/runs/{id}/approvals")))).await;
    let first = approvals
        .as_array()
        .and_then(|a| a.iter().find(|a| a["call_id"] == 1))
        .cloned()
        .expect("call 1 awaits");
    assert_eq!(first["call"]["n"], 1);
    assert_eq!(first["tool_schema"]["required"], json!(["n"]));
    let decide = |call: u64, body: Value| {
        client()
            .post(s.url(&format!("/runs/{id}/approvals/{call}")))
            .json(&body)
    };
    // A decision quoting params the reviewer did not see is stale.
    refused(
        send(decide(
            1,
            json!({"decision": "approve", "presented": "0000000000000000"}),
        ))
        .await,
        409,
        "op.stale",
    );
    // An edit that breaks the tool's schema cannot apply.
    refused(
        send(decide(
            1,
            json!({"decision": "edit", "params": {"n": "one"}}),
        ))
        .await,
        422,
        "op.invalid_decision",
    );
    refused(
        send(decide(1, json!({"decision": "maybe"}))).await,
        400,
        "op.bad_decision",
    );
    let (st, e) = send(decide(
        1,
        json!({"decision": "edit", "params": {"n": 1, "note": "edited"}, "presented": first["params_hash"]}),
    ))
    .await;
    assert_eq!((st, e["status"].as_str()), (200, Some("applied")), "{e}");
    // Somebody decided first.
    let (st, e) = send(decide(1, json!({"decision": "approve"}))).await;
    assert_eq!(st, 409, "{e}");
    assert!(
        ["op.already_decided", "op.not_awaiting"].contains(&e["code"].as_str().unwrap_or("")),
        "{e}"
    );
    refused(
        send(decide(99, json!({"decision": "approve"}))).await,
        404,
        "op.unknown_call",
    );
    let (st, _) = send(decide(2, json!({"decision": "approve"}))).await;
    assert_eq!(st, 200);
    let done = until(&s, &id, |v| v["status"] == "succeeded").await;
    assert_eq!(done["output"]["a"]["got"]["note"], "edited", "{done}");
    assert_eq!(done["output"]["b"], 20);
    let calls = done["calls"].as_array().expect("calls");
    assert!(calls.iter().all(|c| c["status"] == "done"), "{done}");
    assert_eq!(calls[0]["decision"], "edit");
    // The reviewer's waits and the calls set this run's duration, not the model's turns.
    let path: Vec<&str> = done["critical_path"]
        .as_array()
        .expect("path")
        .iter()
        .filter_map(|s| s["what"].as_str())
        .collect();
    assert!(
        path.contains(&"reviewer") && path.contains(&"call step"),
        "{path:?}"
    );
    assert!(
        first["tool_schema"].get("_http").is_none(),
        "tool configuration stays hidden"
    );
    assert_eq!(
        *counts.lock().expect("counts"),
        BTreeMap::from([(1, 1), (2, 1)])
    );
    refused(
        send(decide(2, json!({"decision": "approve"}))).await,
        409,
        "op.run_finished",
    );
    refused(
        send(
            client()
                .post(s.url(&format!("/runs/{id}/cancel")))
                .json(&json!({})),
        )
        .await,
        409,
        "op.run_finished",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_goals_and_bodies_are_refused_with_pointers_and_codes() {
    let dir = tempfile::tempdir().expect("tmp");
    let s = Server::start(&dir.path().join("runs.db"), None);
    let post = |body: Value| client().post(s.url("/runs")).json(&body);
    // Every schema violation, each with its pointer.
    let (st, e) = send(post(json!({"goal": 5, "tools": [{"_tool": 7}]}))).await;
    refused((st, e.clone()), 400, "goal.invalid");
    let pointers: Vec<&str> = e["errors"]
        .as_array()
        .expect("errors")
        .iter()
        .filter_map(|p| p["pointer"].as_str())
        .collect();
    assert!(pointers.contains(&"/goal"), "{e}");
    assert!(pointers.iter().any(|p| p.starts_with("/tools/0")), "{e}");
    assert!(
        pointers.contains(&""),
        "the missing output_schema is at the root: {e}"
    );
    // The envelope's own fields are checked too.
    let g = json!({"goal": "x", "output_schema": {"type": "object"}});
    let (st, e) = send(post(
        json!({"goal": g, "approve": "sometimes", "colour": 1}),
    ))
    .await;
    assert_eq!(st, 400, "{e}");
    let pointers: Vec<&str> = e["errors"]
        .as_array()
        .expect("errors")
        .iter()
        .filter_map(|p| p["pointer"].as_str())
        .collect();
    assert_eq!(pointers, ["/approve", "/colour"], "{e}");
    // A schema inside the goal that is not a JSON Schema.
    let bad = json!({"goal": "x", "output_schema": {"type": "object"},
        "tools": [{"_tool": "t", "type": "object", "properties": {"a": {"type": "nonsense"}}}]});
    let (st, e) = send(post(bad)).await;
    assert_eq!(st, 400, "{e}");
    assert!(
        e["errors"][0]["pointer"]
            .as_str()
            .unwrap_or("")
            .starts_with("/tools"),
        "{e}"
    );
    // A misspelt meta key (issue 23): refused as `run` refuses it, at its pointer, with the
    // closest known key.
    let typo = json!({"goal": "x", "output_schema": {"type": "object"},
        "tools": [{"_tool": "Refund", "_aproval": "always", "type": "object"}]});
    let (st, e) = send(post(typo)).await;
    refused((st, e.clone()), 400, "goal.unknown_meta_key");
    assert_eq!(e["errors"][0]["pointer"], "/tools/0/_aproval", "{e}");
    assert!(
        e["errors"][0]["message"]
            .as_str()
            .unwrap_or("")
            .contains("did you mean `_approval`?"),
        "{e}"
    );
    // Not JSON; too large.
    refused(
        send(
            client()
                .post(s.url("/runs"))
                .header("content-type", "application/json")
                .body("{not json"),
        )
        .await,
        400,
        "http.bad_body",
    );
    let huge = json!({"goal": "x".repeat(2 << 20), "output_schema": {}});
    let (st, _) = send(post(huge)).await;
    assert_eq!(st, 413);
    // Unknown ids.
    refused(
        send(client().get(s.url("/runs/run-nope"))).await,
        404,
        "store.unknown_run",
    );
    refused(
        send(
            client()
                .post(s.url("/runs/run-nope/approvals/1"))
                .json(&json!({"decision": "approve"})),
        )
        .await,
        404,
        "store.unknown_run",
    );
    let (st, _) = send(client().get(s.url("/runs/run-nope/events"))).await;
    assert_eq!(st, 404);
    let (st, _) = send(client().get(s.url("/runs"))).await;
    assert_eq!(st, 200);
}

/// `GET /runs` with its headers, the body parsed.
async fn list(s: &Server, query: &str) -> (u16, Option<String>, Value) {
    let r = client()
        .get(s.url(&format!("/runs{query}")))
        .send()
        .await
        .expect("request");
    let status = r.status().as_u16();
    let link = r
        .headers()
        .get("link")
        .and_then(|h| h.to_str().ok())
        .map(str::to_string);
    (status, link, r.json().await.expect("json"))
}

/// The run list comes from the runs' rows: waiting runs first, then newest; filtered by status
/// and text; a page at a time with a `Link` to the next; bad parameters are coded 400s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_run_list_filters_pages_and_puts_waiting_runs_first() {
    let dir = tempfile::tempdir().expect("tmp");
    let (url, _) = counting_service().await;
    let s = Server::start(&dir.path().join("runs.db"), None);
    let mut asked = goal(dir.path(), &url, "ask");
    asked["goal"] = json!("Review the steps\nsecond line");
    let waiting = create(&s, &asked).await;
    until(&s, &waiting, |v| awaiting(v).len() == 2).await;
    let mut done = Vec::new();
    for _ in 0..3 {
        let id = create(&s, &goal(dir.path(), &url, "auto")).await;
        until(&s, &id, |v| v["status"] == "succeeded").await;
        done.push(id);
    }
    // Stored status and count are written as the runs go: wait until the list says so.
    let mut all = Value::Null;
    for _ in 0..400 {
        all = list(&s, "").await.2;
        if all[0]["awaiting"] == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let ids: Vec<&str> = all
        .as_array()
        .expect("array")
        .iter()
        .filter_map(|r| r["id"].as_str())
        .collect();
    // Waiting first (though oldest), then newest first.
    assert_eq!(
        ids,
        vec![waiting.as_str(), &done[2], &done[1], &done[0]],
        "{all:#}"
    );
    assert_eq!(all[0]["status"], "waiting");
    assert_eq!(all[0]["title"], "Review the steps");
    assert_eq!(all[1]["status"], "succeeded");
    assert_eq!(all[1]["awaiting"], 0);
    assert!(all[1]["created_at"].as_u64() <= all[1]["updated_at"].as_u64());
    let (_, _, w) = list(&s, "?status=waiting").await;
    assert_eq!(w.as_array().map(Vec::len), Some(1), "{w}");
    let (_, _, f) = list(&s, "?status=finished").await;
    assert_eq!(f.as_array().map(Vec::len), Some(3), "{f}");
    let (_, _, q) = list(&s, "?q=REVIEW%20the").await;
    assert_eq!(q[0]["id"], waiting.as_str(), "{q}");
    assert_eq!(q.as_array().map(Vec::len), Some(1));
    // Pages of two: the Link header leads to the rest, keeping the filters.
    let (st, link, first) = list(&s, "?limit=2").await;
    assert_eq!(st, 200);
    assert_eq!(first.as_array().map(Vec::len), Some(2));
    let link = link.expect("a next page");
    let next = link
        .strip_prefix('<')
        .and_then(|l| l.split_once(">; rel=\"next\""))
        .map(|(u, _)| u.to_string())
        .expect("a Link header");
    assert!(next.starts_with("/runs?limit=2&cursor="), "{next}");
    let (_, link2, second) = list(&s, next.trim_start_matches("/runs")).await;
    assert!(link2.is_none(), "the last page has no next");
    let paged: Vec<Value> = first
        .as_array()
        .into_iter()
        .chain(second.as_array())
        .flatten()
        .map(|r| r["id"].clone())
        .collect();
    assert_eq!(paged, ids.iter().map(|i| json!(i)).collect::<Vec<_>>());
    for (query, code) in [
        ("?status=sleeping", "runs.bad_status"),
        ("?limit=0", "runs.bad_limit"),
        ("?limit=501", "runs.bad_limit"),
        ("?cursor=zzz", "runs.bad_cursor"),
        ("?sort=id", "runs.bad_param"),
    ] {
        refused(
            send(client().get(s.url(&format!("/runs{query}")))).await,
            400,
            code,
        );
    }
    // Every status in the one list is a filter the API takes and the page offers: every
    // ending included (`context_overflow` was once refused, missing from a hand-kept copy).
    let page = client()
        .get(s.url("/"))
        .send()
        .await
        .expect("page")
        .text()
        .await
        .expect("html");
    assert!(
        !page.contains("<!-- statuses"),
        "the filter was not written"
    );
    for status in dagloop::store::STATUSES {
        let (st, _, v) = list(&s, &format!("?status={status}")).await;
        assert_eq!(st, 200, "{status}: {v}");
        assert!(
            page.contains(&format!("<option value=\"{status}\">")),
            "the page's filter lacks {status}"
        );
    }
    for ending in ["context_overflow", "setup_failed"] {
        assert!(dagloop::store::STATUSES.contains(&ending), "{ending}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_guards_the_api_and_tickets_open_the_event_stream() {
    let dir = tempfile::tempdir().expect("tmp");
    let (url, _) = counting_service().await;
    let s = Server::start(&dir.path().join("runs.db"), Some("s3cret"));
    refused(
        send(client().get(s.url("/runs"))).await,
        401,
        "auth.missing",
    );
    refused(
        send(client().get(s.url("/runs")).bearer_auth("wrong")).await,
        401,
        "auth.invalid",
    );
    let (st, _) = send(client().get(s.url("/openapi.json"))).await;
    assert_eq!(st, 401);
    // The page itself is public.
    let page = client().get(s.url("/")).send().await.expect("page");
    assert_eq!(page.status().as_u16(), 200);
    let (st, e) = send(
        client()
            .post(s.url("/runs"))
            .bearer_auth("s3cret")
            .json(&goal(dir.path(), &url, "auto")),
    )
    .await;
    assert_eq!(st, 201, "{e}");
    let id = e["id"].as_str().expect("id").to_string();
    let events = s.url(&format!("/runs/{id}/events"));
    refused(
        send(client().get(&events).header("x-dagloop-ticket", "forged")).await,
        401,
        "auth.ticket",
    );
    let (_, t) = send(
        client()
            .post(s.url("/tickets"))
            .bearer_auth("s3cret")
            .json(&json!({"run": id})),
    )
    .await;
    let ticket = t["ticket"].as_str().expect("ticket");
    assert!(ticket.starts_with("v1."), "a signed ticket: {ticket}");
    // A ticket opens the event stream only (sent as a header; tests/server_hardening.rs has
    // the cookie, single use and the URL).
    let (st, _) = send(
        client()
            .get(s.url("/runs"))
            .header("x-dagloop-ticket", ticket),
    )
    .await;
    assert_eq!(st, 401);
    let r = client()
        .get(&events)
        .header("x-dagloop-ticket", ticket)
        .send()
        .await
        .expect("events");
    assert_eq!(r.status().as_u16(), 200);
    let got = read_events(&events, None, 1000, Some("s3cret")).await;
    assert_eq!(got.last().map(|e| e.1.as_str()), Some("run_finished"));
}

#[test]
fn a_non_loopback_address_needs_a_token() {
    let out = bin::dagloop()
        .args(["serve", "--addr", "0.0.0.0:0", "--no-store"])
        .env_remove("DAGLOOP_TOKEN")
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let dir = tempfile::tempdir().expect("tmp");
    let out = bin::dagloop()
        .args(["serve", "--addr", "0.0.0.0:0", "--store"])
        .arg(dir.path().join("runs.db"))
        .env_remove("DAGLOOP_TOKEN")
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON error");
    assert_eq!(v["error"]["code"], "server.token_required", "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_resume_after_last_event_id_without_gap_or_duplicate() {
    let dir = tempfile::tempdir().expect("tmp");
    let (url, _) = counting_service().await;
    let s = Server::start(&dir.path().join("runs.db"), None);
    let id = create(&s, &goal(dir.path(), &url, "ask")).await;
    let events = s.url(&format!("/runs/{id}/events"));
    until(&s, &id, |v| awaiting(v).len() == 2).await;
    // A client reads a few events, drops the connection, and comes back.
    let first = read_events(&events, None, 4, None).await;
    assert_eq!(first.len(), 4);
    for call in [1, 2] {
        let (st, _) = send(
            client()
                .post(s.url(&format!("/runs/{id}/approvals/{call}")))
                .json(&json!({"decision": "approve"})),
        )
        .await;
        assert_eq!(st, 200);
    }
    let rest = read_events(&events, Some(first[3].0), 1000, None).await;
    let seqs: Vec<u64> = first.iter().chain(&rest).map(|e| e.0).collect();
    let expected: Vec<u64> = (1..=seqs.len() as u64).collect();
    assert_eq!(seqs, expected, "no gap, no duplicate");
    assert_eq!(rest.last().map(|e| e.1.as_str()), Some("run_finished"));
    // The whole stream again, from the journal, is the same.
    let all = read_events(&events, None, 1000, None).await;
    assert_eq!(all, first.into_iter().chain(rest).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_mid_run_continues_the_run_after_a_restart() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("runs.db");
    let (url, counts) = counting_service().await;
    // The default lease (20 s): the server started again on this host takes the run over at
    // once, since the process that held it is gone.
    let mut s = Server::start(&store, None);
    let id = create(&s, &goal(dir.path(), &url, "allowlist")).await;
    until(&s, &id, |v| awaiting(v).len() == 2).await;
    // One call runs and completes; the other still waits for its reviewer.
    let (st, _) = send(
        client()
            .post(s.url(&format!("/runs/{id}/approvals/1")))
            .json(&json!({"decision": "approve"})),
    )
    .await;
    assert_eq!(st, 200);
    let before = until(&s, &id, |v| {
        v["calls"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c["status"] == "done"))
    })
    .await;
    assert_eq!(
        before["state"]["a"]["n"], 1,
        "state is shown while the run goes on: {before}"
    );
    let seen = read_events(&s.url(&format!("/runs/{id}/events")), None, 0, None)
        .await
        .len();
    assert!(seen > 0);
    s.kill();
    let s = Server::start(&store, None);
    assert_eq!(s.resumed, vec![id.clone()], "the server continues its run");
    let v = until(&s, &id, |v| awaiting(v).len() == 1).await;
    assert_eq!(awaiting(&v)[0]["call_id"], 2, "{v}");
    // The event stream picks up where the client was.
    let events = s.url(&format!("/runs/{id}/events"));
    let (st, _) = send(
        client()
            .post(s.url(&format!("/runs/{id}/approvals/2")))
            .json(&json!({"decision": "approve"})),
    )
    .await;
    assert_eq!(st, 200);
    let rest = read_events(&events, Some(seen as u64), 1000, None).await;
    assert_eq!(rest.first().map(|e| e.0), Some(seen as u64 + 1), "{rest:?}");
    assert_eq!(rest.last().map(|e| e.1.as_str()), Some("run_finished"));
    let done = until(&s, &id, |v| v["status"] == "succeeded").await;
    assert_eq!(done["output"]["b"], 20, "{done}");
    assert_eq!(before["id"], done["id"]);
    assert_eq!(
        *counts.lock().expect("counts"),
        BTreeMap::from([(1, 1), (2, 1)]),
        "no completed call ran twice"
    );
}

/// `dagloop serve` shares a goal's MCP servers between its runs: two runs of the mcp-files
/// example start the filesystem server once (a wrapper script logs every start), both succeed,
/// and the second one reads what it wrote through the same server.
#[cfg(feature = "mcp")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_starts_each_mcp_server_once_for_all_its_runs() {
    if std::env::var("DAGLOOP_SKIP_MCP").as_deref() == Ok("1") {
        eprintln!("SKIPPED (DAGLOOP_SKIP_MCP=1)");
        return;
    }
    let npm = std::env::var_os("DAGLOOP_MCP_NPM")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/dagloop/npm")))
        .unwrap_or_default()
        .join("node_modules/.bin/mcp-server-filesystem");
    assert!(
        npm.exists(),
        "{} is missing: run scripts/setup-mcp.sh (or set DAGLOOP_SKIP_MCP=1)",
        npm.display()
    );
    let dir = tempfile::tempdir().expect("tmp");
    let files = dir.path().join("files");
    std::fs::create_dir(&files).expect("files dir");
    let starts = dir.path().join("starts.log");
    let wrapper = dir.path().join("fs-server.sh");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\necho started >> '{}'\nexec '{}' \"$@\"\n",
            starts.display(),
            npm.display()
        ),
    )
    .expect("wrapper");
    let chmod = Command::new("chmod")
        .arg("755")
        .arg(&wrapper)
        .status()
        .expect("chmod");
    assert!(chmod.success());
    let example = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/mcp-files");
    let mut goal: Value = serde_json::from_str(
        &std::fs::read_to_string(example.join("goal.json")).expect("example goal"),
    )
    .expect("JSON");
    goal["mcp_servers"][0]["command"] = json!(wrapper.display().to_string());
    goal["mcp_servers"][0]["args"] = json!([files.display().to_string()]);
    goal["mcp_servers"][0]["from_env"] = json!([]);
    let s = Server::start_with(&dir.path().join("runs.db"), None, |c| {
        c.current_dir(&example);
    });
    for round in 0..2 {
        let id = create(&s, &json!({"goal": goal})).await;
        let done = until(&s, &id, |v| {
            v["status"] != "running" && v["status"] != "waiting"
        })
        .await;
        assert_eq!(done["status"], "succeeded", "round {round}: {done}");
        assert_eq!(
            done["output"]["content"], "Buy oat milk. Call the plumber.",
            "{done}"
        );
    }
    let log = std::fs::read_to_string(&starts).expect("the wrapper ran");
    assert_eq!(log.lines().count(), 1, "one start for two runs: {log:?}");
}

/// `DAGLOOP_UPDATE_OPENAPI=1 cargo test --test server_api` rewrites schemas/openapi.json.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_document_is_served_and_matches_the_committed_one() {
    let dir = tempfile::tempdir().expect("tmp");
    let s = Server::start(&dir.path().join("runs.db"), None);
    let (st, served) = send(client().get(s.url("/openapi.json"))).await;
    assert_eq!(st, 200);
    let file = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("schemas/openapi.json");
    if std::env::var_os("DAGLOOP_UPDATE_OPENAPI").is_some() {
        let text = serde_json::to_string_pretty(&served).expect("json") + "\n";
        std::fs::write(&file, text).expect("write");
    }
    let committed: Value =
        serde_json::from_str(&std::fs::read_to_string(&file).expect("schemas/openapi.json"))
            .expect("JSON");
    assert_eq!(
        served, committed,
        "the routes changed: run DAGLOOP_UPDATE_OPENAPI=1 cargo test --test server_api and commit schemas/openapi.json"
    );
    let paths = served["paths"].as_object().expect("paths");
    for p in [
        "/runs",
        "/runs/{id}",
        "/runs/{id}/events",
        "/runs/{id}/approvals",
        "/runs/{id}/approvals/{call}",
        "/runs/{id}/cancel",
        "/runs/{id}/result",
        "/tickets",
    ] {
        assert!(paths.contains_key(p), "{p} is documented");
    }
}

/// `POST /runs` with `wait`: one call answers with the run's result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_gets_the_result_in_one_call_with_wait() {
    let dir = tempfile::tempdir().expect("tmp");
    let (url, _) = counting_service().await;
    let s = Server::start(&dir.path().join("runs.db"), None);
    let mut body = goal(dir.path(), &url, "auto");
    body["wait"] = json!(120);
    let (st, v) = send(client().post(s.url("/runs")).json(&body)).await;
    assert_eq!(st, 201, "{v}");
    assert_eq!(
        (v["status"].as_str(), v["finished"].as_bool()),
        (Some("succeeded"), Some(true)),
        "{v}"
    );
    assert_eq!(v["output"]["b"], 20, "{v}");
    assert_eq!(v["awaiting"], json!([]), "{v}");
    assert!(v["usage"].is_object(), "{v}");
    // Without `wait`, the answer is at once.
    body.as_object_mut().expect("goal").remove("wait");
    let (st, v) = send(client().post(s.url("/runs")).json(&body)).await;
    assert_eq!((st, v["finished"].as_bool()), (201, Some(false)), "{v}");
    assert!(v.get("output").is_none(), "{v}");
}

/// A run that waits for a reviewer: the result call answers 202 with the calls awaiting a
/// decision when the wait runs out, and 200 with the result once the decisions let it end
/// (the waiting request is answered by the run's end, not by polling).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_result_call_answers_with_what_awaits_a_decision_then_with_the_result() {
    let dir = tempfile::tempdir().expect("tmp");
    let (url, _) = counting_service().await;
    let s = Server::start(&dir.path().join("runs.db"), None);
    let mut body = goal(dir.path(), &url, "ask");
    body["wait"] = json!(0.2);
    let (st, v) = send(client().post(s.url("/runs")).json(&body)).await;
    assert_eq!((st, v["finished"].as_bool()), (201, Some(false)), "{v}");
    let id = v["id"].as_str().expect("id").to_string();
    until(&s, &id, |v| awaiting(v).len() == 2).await;
    let result = |wait: &str| client().get(s.url(&format!("/runs/{id}/result?wait={wait}")));
    let (st, v) = send(result("0.1")).await;
    assert_eq!(st, 202, "{v}");
    assert_eq!(v["status"], "waiting", "{v}");
    let waiting: Vec<u64> = v["awaiting"]
        .as_array()
        .expect("awaiting")
        .iter()
        .filter_map(|a| a["call_id"].as_u64())
        .collect();
    assert_eq!(waiting, [1, 2], "{v}");
    let waiter = tokio::spawn(send(result("120")));
    for call in waiting {
        let (st, e) = send(
            client()
                .post(s.url(&format!("/runs/{id}/approvals/{call}")))
                .json(&json!({"decision": "approve"})),
        )
        .await;
        assert_eq!(st, 200, "{e}");
    }
    let (st, v) = waiter.await.expect("the waiting request");
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        (v["status"].as_str(), v["finished"].as_bool()),
        (Some("succeeded"), Some(true)),
        "{v}"
    );
    assert_eq!(v["output"]["a"]["n"], 1, "{v}");
    // Once ended, the answer is at once.
    let (st, again) = send(result("0")).await;
    assert_eq!((st, &again["output"]), (200, &v["output"]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_that_is_not_a_bounded_number_of_seconds_is_refused() {
    let dir = tempfile::tempdir().expect("tmp");
    let s = Server::start(&dir.path().join("runs.db"), None);
    let mut body = goal(dir.path(), "http://127.0.0.1:9/step", "ask");
    for bad in [json!(-1), json!(301), json!("10"), json!(null), json!([1])] {
        body["wait"] = bad;
        refused(
            send(client().post(s.url("/runs")).json(&body)).await,
            400,
            "http.bad_wait",
        );
    }
    assert_eq!(send(client().get(s.url("/runs"))).await.1, json!([]));
    for bad in ["-1", "301", "soon", "NaN", "inf"] {
        refused(
            send(client().get(s.url(&format!("/runs/run-x/result?wait={bad}")))).await,
            400,
            "http.bad_wait",
        );
    }
    refused(
        send(client().get(s.url("/runs/run-x/result"))).await,
        404,
        "store.unknown_run",
    );
}

/// The contract checker itself: answers that do not match the document are caught.
#[test]
fn the_contract_check_catches_answers_that_do_not_match_the_document() {
    use serve::contract::check_in;
    let doc = serve::contract::document();
    let ok =
        |m: &str, p: &str, st: u16, body: Value| check_in(doc, m, p, st, "application/json", &body);
    let summary = json!({"id": "run-1", "status": "running", "title": "a goal", "awaiting": 0,
        "entries": 3, "created_at": 1, "updated_at": 2, "waiting": 0});
    assert_eq!(ok("GET", "/runs", 200, json!([summary])), Ok(()));
    // `GET /runs` answering an object, a summary without its status, a status of the wrong
    // type, an undeclared success, a refusal without a code: each is caught.
    for (m, p, st, body) in [
        ("GET", "/runs", 200, json!({"runs": [summary]})),
        ("GET", "/runs", 200, json!([{"id": "run-1", "entries": 3}])),
        (
            "GET",
            "/runs/run-1/result",
            202,
            json!({"id": "r", "status": 7, "finished": false}),
        ),
        ("GET", "/runs/run-1", 201, json!({})),
        (
            "POST",
            "/runs/run-1/cancel",
            409,
            json!({"message": "finished"}),
        ),
    ] {
        assert!(ok(m, p, st, body.clone()).is_err(), "{m} {p} {st} {body}");
    }
    // A JSON answer where the document declares none, and an event of no known type.
    assert!(check_in(doc, "GET", "/runs", 200, "text/plain", &json!("x")).is_err());
    let event = |t: &str| json!({"seq": 1, "step": 1, "at": 5, "type": t, "goal": "g"});
    let sse = |e: &Value| check_in(doc, "GET", "/runs/r/events", 200, "text/event-stream", e);
    assert_eq!(sse(&event("run_started")), Ok(()));
    assert!(sse(&event("run_exploded")).is_err());
    // Paths the document does not describe are not checked.
    assert_eq!(ok("GET", "/app.js", 200, json!("x")), Ok(()));
}
