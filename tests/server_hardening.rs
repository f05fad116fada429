//! Issue 47's attacks on `dagloop serve` under an operator config, each as a client (or a
//! hostile page, or a hostile tool service) would make it, through the real binary and real HTTP
//! on 127.0.0.1; each failed before its fix.
//!
//! - (Secrets go where they are granted: tests/env_grants.rs.)
//! - Half-sent requests do not lock a token holder out.
//! - A client's flood of notifications does not hold back the operator's.
//! - The page in another site's frame does not render (Chromium); every answer forbids framing.
//! - Tickets travel in a cookie or a header, never the URL, and open a stream once.
//! - An `Idempotency-Key` reused with another body gets 422.
//! - `/metrics` is for `admin` and `metrics` principals only.
//! - Two `Host` headers are refused.
//! - Names a goal chose are escaped in the Slack message.
//! - A granted internal address without a port list is granted on 80 and 443 only.
//! - Answers carry no host name, pid or working directory, and no file's content.

#[path = "common/bin.rs"]
mod bin;
#[path = "common/browser.rs"]
mod browser;
#[path = "common/desk.rs"]
mod desk;
#[path = "common/serve.rs"]
mod serve;

use std::path::Path;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use serve::{
    Server, call_of, client, counting_service, get_tool, goal, recording_service, refused,
    run_to_end, script_calling, send, serve_with, until,
};

/// The page on a token-less loopback server, framed by a page of another origin (the
/// clickjacking set-up: one key press in the frame approved a call): the browser does not render
/// it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_in_a_foreign_frame_does_not_render() {
    let Some(session) = browser::session().await else {
        return;
    };
    let dir = tempfile::tempdir().expect("tmp");
    let s = Server::start(&dir.path().join("runs.db"), None);
    // The page itself renders when opened directly.
    let c = &session.c;
    c.goto(&s.url("/")).await.expect("open the page");
    browser::until(
        c,
        "the page",
        "return document.querySelector('#notice') !== null",
    )
    .await;
    let framing = format!(
        r#"<!doctype html><title>another site</title>
<iframe id="f" src="{}/" width="800" height="600"></iframe>
<script>document.getElementById("f").addEventListener("load", () => {{ window.loaded = true; }});</script>"#,
        s.base
    );
    let app = axum::Router::new().route(
        "/",
        axum::routing::get(move || {
            let page = framing.clone();
            async move { axum::response::Html(page) }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let other = format!("http://{}/", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    c.goto(&other).await.expect("open the other site's page");
    browser::until(c, "the frame loaded", "return window.loaded === true").await;
    c.clone().enter_frame(0).await.expect("enter the frame");
    let inside = browser::eval(
        c,
        "return {href: location.href, title: document.title, page: document.querySelector('#notice') !== null}",
    )
    .await;
    assert_eq!(
        inside["page"], false,
        "the page rendered in the frame: {inside}"
    );
    assert_ne!(inside["title"], "dagloop · reviewer", "{inside}");
    c.clone().close().await.expect("close the browser");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_forbids_framing() {
    let dir = tempfile::tempdir().expect("tmp");
    let s = Server::start(&dir.path().join("runs.db"), Some("t0ken"));
    for (path, token) in [
        ("/", None),
        ("/app.js", None),
        ("/runs", Some("t0ken")),
        ("/runs", None),
    ] {
        let mut rb = client().get(s.url(path));
        if let Some(t) = token {
            rb = rb.bearer_auth(t);
        }
        let r = rb.send().await.expect("answer");
        let h = r.headers();
        assert_eq!(h["x-frame-options"], "DENY", "{path}");
        assert_eq!(
            h["content-security-policy"], "frame-ancestors 'none'",
            "{path}"
        );
    }
}

/// Submits the two-step goal (asked about) as `token`; the run id.
async fn waiting_run(s: &Server, dir: &Path, token: &str) -> String {
    let (url, _) = counting_service().await;
    let (st, v) = send(
        client()
            .post(s.url("/runs"))
            .bearer_auth(token)
            .json(&goal(dir, &url, "ask")),
    )
    .await;
    assert_eq!(st, 201, "{v}");
    v["id"].as_str().expect("id").to_string()
}

/// The status of `GET url` with `headers` (an event stream that opens is not read).
async fn status_of(url: &str, headers: &[(&str, &str)]) -> u16 {
    let mut rb = client().get(url);
    for (k, v) in headers {
        rb = rb.header(*k, *v);
    }
    rb.send().await.expect("answer").status().as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ticket_travels_in_a_cookie_or_a_header_never_the_url_and_opens_a_stream_once() {
    let dir = tempfile::tempdir().expect("tmp");
    let s = Server::start(&dir.path().join("runs.db"), Some("t0ken"));
    let id = waiting_run(&s, dir.path(), "t0ken").await;
    let events = s.url(&format!("/runs/{id}/events"));
    let ticket = || async {
        let r = client()
            .post(s.url("/tickets"))
            .bearer_auth("t0ken")
            .json(&json!({"run": id}))
            .send()
            .await
            .expect("ticket");
        assert_eq!(r.status().as_u16(), 200);
        let cookie = r.headers()["set-cookie"]
            .to_str()
            .expect("cookie")
            .to_string();
        let v: Value = r.json().await.expect("json");
        (v["ticket"].as_str().expect("ticket").to_string(), cookie)
    };
    // The cookie: that run's events only, not for scripts, not for other sites.
    let (t, cookie) = ticket().await;
    assert!(
        cookie.starts_with(&format!("dagloop_ticket={t};")),
        "{cookie}"
    );
    for part in [
        &format!("Path=/runs/{id}/events") as &str,
        "HttpOnly",
        "SameSite=Strict",
        "Max-Age=60",
    ] {
        assert!(cookie.contains(part), "{part}: {cookie}");
    }
    // In the URL it opens nothing, even unused.
    refused(
        send(client().get(format!("{events}?ticket={t}"))).await,
        401,
        "auth.ticket",
    );
    // As the cookie, once.
    let as_cookie = format!("dagloop_ticket={t}");
    assert_eq!(status_of(&events, &[("cookie", &as_cookie)]).await, 200);
    assert_eq!(status_of(&events, &[("cookie", &as_cookie)]).await, 401);
    // As the header, once.
    let (t, _) = ticket().await;
    assert_eq!(status_of(&events, &[("x-dagloop-ticket", &t)]).await, 200);
    refused(
        send(client().get(&events).header("x-dagloop-ticket", &t)).await,
        401,
        "auth.ticket",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotency_key_reused_with_another_body_is_refused() {
    let dir = tempfile::tempdir().expect("tmp");
    let (url, _) = counting_service().await;
    let s = Server::start(&dir.path().join("runs.db"), None);
    let first = goal(dir.path(), &url, "ask");
    let post = |body: &Value| {
        client()
            .post(s.url("/runs"))
            .header("idempotency-key", "k-47")
            .json(body)
    };
    let (st, v) = send(post(&json!({"goal": first}))).await;
    assert_eq!(st, 201, "{v}");
    let id = v["id"].clone();
    // The same body, keys in another order and a `wait` added: the first run.
    let mut same = json!({"goal": first});
    same["wait"] = json!(0);
    let (st, v) = send(post(&same)).await;
    assert_eq!((st, &v["id"]), (200, &id), "{v}");
    // Another body: refused, and no second run.
    let mut other = first.clone();
    other["goal"] = json!("another goal");
    refused(
        send(post(&json!({"goal": other}))).await,
        422,
        "http.idempotency_key_reused",
    );
    let (_, list) = send(client().get(s.url("/runs"))).await;
    assert_eq!(list.as_array().map(Vec::len), Some(1), "{list}");
    // The store keeps the body's digest: after a restart too.
    drop(s);
    let s = Server::start(&dir.path().join("runs.db"), None);
    let post = |body: &Value| {
        client()
            .post(s.url("/runs"))
            .header("idempotency-key", "k-47")
            .json(body)
    };
    refused(
        send(post(&json!({"goal": other}))).await,
        422,
        "http.idempotency_key_reused",
    );
    let (st, v) = send(post(&json!({"goal": first}))).await;
    assert_eq!((st, &v["id"]), (200, &id), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_for_admins_and_the_metrics_role_only() {
    let dir = tempfile::tempdir().expect("tmp");
    let p = |name: &str, roles: &[&str]| {
        json!({"name": name,
        "token_sha256": dagloop::server::token_sha256(&format!("token-of-{name}")), "roles": roles})
    };
    let cfg = dir.path().join("dagloop.json");
    std::fs::write(
        &cfg,
        json!({"principals": [p("ci", &["submit"]), p("alice", &["review"]),
                              p("root", &["admin"]), p("scraper", &["metrics"])]})
        .to_string(),
    )
    .expect("config");
    let s = Server::start_config(&dir.path().join("runs.db"), &cfg, None, |_| {});
    let get = |path: &str, who: &str| {
        client()
            .get(s.url(path))
            .bearer_auth(format!("token-of-{who}"))
    };
    for who in ["ci", "alice"] {
        let r = get("/metrics", who).send().await.expect("answer");
        assert_eq!(r.status().as_u16(), 403, "{who}");
    }
    for who in ["root", "scraper"] {
        let r = get("/metrics", who).send().await.expect("answer");
        assert_eq!(r.status().as_u16(), 200, "{who}");
        assert!(r.text().await.expect("text").contains("dagloop_"), "{who}");
    }
    // The metrics role does nothing else: it submits nothing and sees no run.
    let (st, _) = send(
        client()
            .post(s.url("/runs"))
            .bearer_auth("token-of-scraper")
            .json(&json!({"goal": {"goal": "x"}})),
    )
    .await;
    assert_eq!(st, 403);
    let (st, list) = send(get("/runs", "scraper")).await;
    assert_eq!((st, list), (200, json!([])));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_host_headers_are_refused() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().expect("tmp");
    let s = Server::start(&dir.path().join("runs.db"), None);
    let addr = s.base.trim_start_matches("http://").to_string();
    let status = |hosts: &'static [&'static str]| {
        let addr = addr.clone();
        async move {
            let mut tcp = tokio::net::TcpStream::connect(&addr)
                .await
                .expect("connect");
            let mut req = "GET /runs HTTP/1.1\r\n".to_string();
            for h in hosts {
                req.push_str(&format!("Host: {h}\r\n"));
            }
            req.push_str("Connection: close\r\n\r\n");
            tcp.write_all(req.as_bytes()).await.expect("write");
            let mut out = Vec::new();
            tcp.read_to_end(&mut out).await.expect("read");
            let text = String::from_utf8_lossy(&out).to_string();
            text.split(' ').nth(1).unwrap_or("").to_string()
        }
    };
    assert_eq!(status(&["localhost"]).await, "200");
    assert_eq!(status(&["localhost", "evil.example"]).await, "400");
    assert_eq!(status(&["evil.example", "localhost"]).await, "400");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_a_goal_chose_are_escaped_in_the_slack_message() {
    let hook = desk::receiver(0).await;
    let (url, _) = counting_service().await;
    let dir = tempfile::tempdir().expect("tmp");
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(bin::open_config()).expect("config"))
            .expect("json");
    config["notify"] = json!({"webhook": {"url": hook.url, "page_url": "http://desk.example"}});
    let cfg = dir.path().join("config.json");
    std::fs::write(&cfg, config.to_string()).expect("config");
    let s = Server::start_config(&dir.path().join("runs.db"), &cfg, None, |_| {});
    let mut g = goal(dir.path(), &url, "auto");
    let evil = "<!channel> <https://evil.example|Open the reviewer's page> & more";
    g["approval"]["rules"] = json!([{"name": evil, "tool": "*", "decision": "ask"}]);
    let (st, v) = send(client().post(s.url("/runs")).json(&json!({"goal": g}))).await;
    assert_eq!(st, 201, "{v}");
    let mut got = Vec::new();
    for _ in 0..600 {
        got = hook
            .got
            .lock()
            .expect("got")
            .iter()
            .map(|(_, b)| b.clone())
            .collect();
        if !got.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let body = got.first().unwrap_or_else(|| panic!("no notification"));
    for text in [&body["text"], &body["blocks"][0]["text"]["text"]] {
        let text = text.as_str().expect("text");
        assert!(!text.contains("<!channel>"), "{text}");
        assert!(!text.contains("<https://evil.example"), "{text}");
        assert!(text.contains("&lt;!channel&gt;"), "{text}");
        assert!(text.contains("&amp; more"), "{text}");
    }
    // The reviewer's link is still a link.
    assert!(
        body["blocks"][0]["text"]["text"]
            .as_str()
            .is_some_and(|t| t.contains("<http://desk.example/?run=")),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_granted_internal_address_without_ports_is_granted_on_80_and_443_only() {
    let dir = tempfile::tempdir().expect("tmp");
    let (a, seen) = recording_service().await;
    let s = serve_with(
        dir.path(),
        "[grants.egress]\nhosts = [\"127.0.0.1\", \"localhost\", \"::1\"]\n",
        &[],
    );
    // A literal address on another port: refused where the run is defined.
    let literal = json!({"goal": "x", "output_schema": {"type": "object"},
        "model": script_calling(dir.path(), &["to_a"]),
        "tools": [get_tool("to_a", &format!("http://127.0.0.1:{a}/x"), json!({}))]});
    let (st, v) = send(client().post(s.url("/runs")).json(&literal)).await;
    assert_eq!((st, v["code"].as_str()), (400, Some("grant.egress")), "{v}");
    // A name that resolves there: the call fails, nothing connects.
    let named = json!({"goal": "x", "output_schema": {"type": "object"},
        "model": script_calling(dir.path(), &["to_a"]),
        "tools": [get_tool("to_a", &format!("http://localhost:{a}/x"), json!({}))]});
    let run = run_to_end(&s, &named).await;
    let c = call_of(&run, "to_a");
    assert_eq!(c["status"], "error", "{c}");
    assert!(c["error"].to_string().contains("grant.egress"), "{c}");
    assert!(seen.lock().expect("seen").is_empty());
}

/// The server's host name as `store::new_owner_id` reads it.
fn host_name() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_carry_no_host_name_pid_or_working_directory() {
    let dir = tempfile::tempdir().expect("tmp");
    let (url, _) = counting_service().await;
    let store = dir.path().join("runs.db");
    let a = Server::start_with(&store, None, |c| {
        c.current_dir(dir.path());
    });
    // A second server on the same store: the run is A's; B answers about it too.
    let b = Server::start_with(&store, None, |c| {
        c.current_dir(dir.path());
    });
    let id = waiting_run_open(&a, dir.path(), &url).await;
    let mut answers = Vec::new();
    for s in [&a, &b] {
        answers.push(
            send(
                client()
                    .post(s.url(&format!("/runs/{id}/approvals/1")))
                    .json(&json!({"decision": "approve"})),
            )
            .await,
        );
        answers.push(send(client().get(s.url(&format!("/runs/{id}")))).await);
        answers.push(send(client().get(s.url("/runs"))).await);
    }
    // Where the run list names who drives the run (A, while it is not parked), it is by the
    // owner's id alone: the checks below find no host, pid or folder in any answer. (Whether
    // the run is still live when the list is read depends on how soon A parks it.)
    for (_, v) in &answers {
        for row in v.as_array().into_iter().flatten() {
            assert!(row["owner"].is_null() || row["owner"].is_string(), "{row}");
        }
    }
    let cwd = dir.path().canonicalize().expect("dir");
    let host = host_name();
    let pid = format!("pid {}", a.child.id());
    for (_, v) in &answers {
        let text = v.to_string();
        assert!(!text.contains(&pid), "{text}");
        assert!(host.is_empty() || !text.contains(&host), "{host}: {text}");
        assert!(!text.contains(&cwd.display().to_string()), "{text}");
        assert!(!text.contains(&dir.path().display().to_string()), "{text}");
    }
}

/// [`waiting_run`] on a server without tokens.
async fn waiting_run_open(s: &Server, dir: &Path, url: &str) -> String {
    let (st, v) = send(client().post(s.url("/runs")).json(&goal(dir, url, "ask"))).await;
    assert_eq!(st, 201, "{v}");
    let id = v["id"].as_str().expect("id").to_string();
    until(s, &id, |v| {
        !v["awaiting"].as_array().is_none_or(Vec::is_empty)
    })
    .await;
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_from_files_are_never_echoed_in_errors() {
    let dir = tempfile::tempdir().expect("tmp");
    let s = serve_with(dir.path(), "", &[]);
    std::fs::write(
        dir.path().join("secret.json"),
        r#"{"password": "hunter2-47"}"#,
    )
    .expect("w");
    std::fs::write(dir.path().join("arr.json"), r#"["hunter3-47"]"#).expect("w");
    std::fs::write(dir.path().join("plain.txt"), "hunter4-47 is here").expect("w");
    let script = script_calling(dir.path(), &["ask"]);
    let mut answers = Vec::new();
    for model in [
        "scripted:secret.json",
        "scripted:arr.json",
        "scripted:plain.txt",
    ] {
        let g = json!({"goal": "x", "model": model, "output_schema": {"type": "object"}});
        answers.push(send(client().post(s.url("/runs")).json(&g)).await);
    }
    for target in ["secret.json", "arr.json", "plain.txt"] {
        let g = json!({"goal": "x", "model": script, "output_schema": {"type": "object"},
            "tools": [{"_tool": "ask", "_delegate": target, "type": "object", "properties": {}}]});
        let (st, v) = send(client().post(s.url("/runs")).json(&g)).await;
        if st == 201 {
            let id = v["id"].as_str().expect("id").to_string();
            let run = until(&s, &id, |v| {
                !matches!(v["status"].as_str(), Some("running" | "stopped"))
            })
            .await;
            answers.push((200, run));
        } else {
            answers.push((st, v));
        }
    }
    let cwd = dir
        .path()
        .canonicalize()
        .expect("dir")
        .display()
        .to_string();
    for (st, v) in &answers {
        let text = v.to_string();
        for secret in ["hunter2-47", "hunter3-47", "hunter4-47", "password", &cwd] {
            assert!(!text.contains(secret), "{st} {secret}: {text}");
        }
    }
}

/// `dagloop serve` with a token, limited to 1024 open files as a process commonly is.
fn serve_with_1024_files(dir: &Path, token: &str) -> Server {
    use std::io::BufRead;
    // The tests' own environment for the binary (`bin::dagloop`), run through a shell that
    // lowers the limit first.
    let env = bin::dagloop();
    let mut c = std::process::Command::new("sh");
    for (k, v) in env.get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    c.arg("-c")
        .arg("ulimit -n 1024 && exec \"$0\" \"$@\"")
        .arg(bin::BIN)
        .arg("--config")
        .arg(bin::open_config())
        .args(["serve", "--addr", "127.0.0.1:0", "--store"])
        .arg(dir.join("runs.db"))
        .env("DAGLOOP_TOKEN", token)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null());
    let mut child = c.spawn().expect("spawn dagloop serve");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read");
    let v: Value = serde_json::from_str(&line).expect("the first line is JSON");
    let base = v["url"]
        .as_str()
        .expect("url")
        .trim_end_matches('/')
        .to_string();
    Server {
        child,
        base,
        resumed: Vec::new(),
    }
}

/// 1,100 connections that send half a request and wait (more than the server's 1024 files):
/// a token holder's `GET /runs` is still answered within a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_requests_do_not_lock_a_token_holder_out() {
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::tempdir().expect("tmp");
    let s = serve_with_1024_files(dir.path(), "t0ken");
    let addr = s.base.trim_start_matches("http://").to_string();
    let mut held = Vec::new();
    for _ in 0..1100 {
        let Ok(mut tcp) = tokio::net::TcpStream::connect(&addr).await else {
            break;
        };
        let _ = tcp
            .write_all(b"GET /runs HTTP/1.1\r\nHost: localhost\r\n")
            .await;
        held.push(tcp);
    }
    assert_eq!(
        held.len(),
        1100,
        "this test process could not open its connections"
    );
    let started = std::time::Instant::now();
    let answer = tokio::time::timeout(
        std::time::Duration::from_secs(1),
        client().get(s.url("/runs")).bearer_auth("t0ken").send(),
    )
    .await;
    let status = match answer {
        Ok(Ok(r)) => r.status().as_u16(),
        Ok(Err(e)) => panic!("the token holder's request failed: {e}"),
        Err(_) => panic!("no answer within 1 s (after {:?})", started.elapsed()),
    };
    assert_eq!(status, 200);
    drop(held);
}

/// A webhook receiver that takes `delay` over each delivery and records the run ids it got.
async fn slow_receiver(delay: std::time::Duration) -> (String, Arc<Mutex<Vec<String>>>) {
    let got: Arc<Mutex<Vec<String>>> = Arc::default();
    let g = got.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |axum::Json(b): axum::Json<Value>| {
            let g = g.clone();
            async move {
                tokio::time::sleep(delay).await;
                g.lock()
                    .expect("got")
                    .push(b["run_id"].as_str().unwrap_or_default().to_string());
                axum::http::StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/hook", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, got)
}

/// A client's run asks about 300 calls at once; the operator's run, started after, asks about
/// one: its notification is delivered in turn, not behind the client's flood.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_flood_of_notifications_does_not_hold_back_the_operators() {
    let dir = tempfile::tempdir().expect("tmp");
    let (hook, got) = slow_receiver(std::time::Duration::from_millis(30)).await;
    let (url, _) = counting_service().await;
    let p = |name: &str, roles: &[&str]| {
        json!({"name": name,
        "token_sha256": dagloop::server::token_sha256(&format!("token-of-{name}")), "roles": roles})
    };
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(bin::open_config()).expect("config"))
            .expect("json");
    config["notify"] = json!({"webhook": {"url": hook}});
    config["principals"] = json!([p("ci", &["submit"]), p("root", &["admin"])]);
    let cfg = dir.path().join("config.json");
    std::fs::write(&cfg, config.to_string()).expect("config");
    let s = Server::start_config(&dir.path().join("runs.db"), &cfg, None, |_| {});
    let asking = |name: &str, n: usize| {
        let calls: Vec<Value> = (0..n).map(|i| json!({"_tool": "step", "n": i})).collect();
        let script = dir.path().join(format!("{name}.json"));
        std::fs::write(
            &script,
            json!({"turns": [{"solution": {"calls": calls, "output": null}}]}).to_string(),
        )
        .expect("script");
        json!({"goal": name, "model": format!("scripted:{}", script.display()),
            "output_schema": {"type": "object"}, "approval": {"policy": "ask"},
            "tools": [{"_tool": "step", "_activity": "http", "_http": {"url": url},
                       "type": "object", "properties": {"n": {"type": "integer"}}}]})
    };
    let submit = |who: &str, goal: Value| {
        client()
            .post(s.url("/runs"))
            .bearer_auth(format!("token-of-{who}"))
            .json(&goal)
    };
    let (st, flood) = send(submit("ci", asking("flood", 300))).await;
    assert_eq!(st, 201, "{flood}");
    // The flood has begun to go out.
    for _ in 0..600 {
        if !got.lock().expect("got").is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let (st, own) = send(submit("root", asking("own", 1))).await;
    assert_eq!(st, 201, "{own}");
    let own = own["id"].as_str().expect("id").to_string();
    let mut at = None;
    for _ in 0..1200 {
        at = got.lock().expect("got").iter().position(|r| *r == own);
        if at.is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let at = at.unwrap_or_else(|| panic!("the operator's notification never came"));
    // In turn: long before the client's 300 (before, it came after all of them).
    assert!(at < 150, "the operator's notification came as number {at}");
}
