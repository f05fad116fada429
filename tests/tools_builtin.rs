//! The built-in `http` and `shell` activities against real servers and real processes.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path as AxPath, Query};
use axum::http::StatusCode;
use axum::routing::{get, post};
use dagloop::protocol::{Call, Tool};
use dagloop::tools::Registry;
use serde_json::{Map, Value, json};

fn tool(v: Value) -> Tool {
    Tool::from_value(v).unwrap()
}

async fn server() -> String {
    let app = Router::new()
        .route(
            "/users/{id}",
            get(
                |AxPath(id): AxPath<String>, Query(q): Query<Map<String, Value>>| async move {
                    axum::Json(json!({"id": id, "query": q}))
                },
            ),
        )
        .route(
            "/echo",
            post(|axum::Json(body): axum::Json<Value>| async move { axum::Json(body) }),
        )
        .route(
            "/missing",
            get(|| async { (StatusCode::NOT_FOUND, "no such thing") }),
        )
        .route("/big", get(|| async { "x".repeat(10_000) }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

#[tokio::test]
async fn http_fills_the_url_sends_json_and_reports_errors() {
    let base = server().await;
    let r = Registry::new();
    let get_user = tool(json!({"_tool": "getUser", "_activity": "http",
        "_http": {"method": "GET", "url": format!("{base}/users/{{id}}")}, "type": "object"}));
    let out = r
        .run(
            &get_user,
            Arc::new(
                Call::new("getUser")
                    .param("id", "a b")
                    .param("verbose", true),
            ),
            Map::new(),
        )
        .await
        .unwrap();
    assert_eq!(
        out.value,
        json!({"id": "a b", "query": {"verbose": "true"}})
    );

    let echo = tool(
        json!({"_tool": "echo", "_activity": "http", "_http": {"url": format!("{base}/echo")}, "type": "object"}),
    );
    let out = r
        .run(&echo, Arc::new(Call::new("echo").param("n", 3)), Map::new())
        .await
        .unwrap();
    assert_eq!(out.value, json!({"n": 3}));

    let missing = tool(
        json!({"_tool": "m", "_activity": "http", "_http": {"method": "GET", "url": format!("{base}/missing")}, "type": "object"}),
    );
    let e = r
        .run(&missing, Arc::new(Call::new("m")), Map::new())
        .await
        .unwrap_err();
    assert_eq!(
        e.to_value()["details"],
        json!({"status": 404, "body": "no such thing"})
    );

    let big = tool(
        json!({"_tool": "b", "_activity": "http", "_http": {"method": "GET", "url": format!("{base}/big"), "max_bytes": 1000}, "type": "object"}),
    );
    let e = r
        .run(&big, Arc::new(Call::new("b")), Map::new())
        .await
        .unwrap_err();
    assert_eq!(e.to_value()["details"]["code"], json!("http.too_large"));

    let no_config = tool(json!({"_tool": "c", "_activity": "http", "type": "object"}));
    let e = r
        .run(&no_config, Arc::new(Call::new("c")), Map::new())
        .await
        .unwrap_err();
    assert_eq!(e.code(), "activity.config");
}

#[tokio::test]
async fn shell_runs_programs_without_a_shell_and_reports_exit_codes_and_timeouts() {
    let mut r = Registry::new();
    r.enable_shell(true);
    let echo = tool(
        json!({"_tool": "say", "_activity": "shell", "_shell": {"command": ["echo", "{word}"]}, "type": "object"}),
    );
    // `;` reaches echo as text: no shell interprets the argument.
    let out = r
        .run(
            &echo,
            Arc::new(Call::new("say").param("word", "hi; rm -rf /")),
            Map::new(),
        )
        .await
        .unwrap();
    assert_eq!(
        out.value,
        json!({"exit_code": 0, "stdout": "hi; rm -rf /\n", "stderr": ""})
    );

    let fail = tool(
        json!({"_tool": "f", "_activity": "shell", "_shell": {"command": ["sh", "-c", "echo oops >&2; exit 3"]}, "type": "object"}),
    );
    let e = r
        .run(&fail, Arc::new(Call::new("f")), Map::new())
        .await
        .unwrap_err();
    assert_eq!(
        e.to_value()["details"],
        json!({"exit_code": 3, "stdout": "", "stderr": "oops\n"})
    );

    let slow = tool(
        json!({"_tool": "s", "_activity": "shell", "_shell": {"command": ["sleep", "5"], "timeout_s": 0.2}, "type": "object"}),
    );
    let e = r
        .run(&slow, Arc::new(Call::new("s")), Map::new())
        .await
        .unwrap_err();
    assert_eq!(e.code(), "activity.timeout");

    let capped = tool(
        json!({"_tool": "y", "_activity": "shell", "_shell": {"command": ["head", "-c", "5000", "/dev/zero"], "max_output_bytes": 100}, "type": "object"}),
    );
    let out = r
        .run(&capped, Arc::new(Call::new("y")), Map::new())
        .await
        .unwrap();
    assert!(
        out.value["stdout"]
            .as_str()
            .unwrap()
            .ends_with("…[truncated: 4900 more bytes]")
    );
}
