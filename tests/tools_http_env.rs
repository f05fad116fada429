//! Issue 12: the http activity takes its base URL and header values from environment variables
//! (`${VAR}`), never shows header values in errors, and names the cause of a transport error.
//! Against a real server on 127.0.0.1.

use std::sync::Arc;

use axum::Router;
use axum::http::HeaderMap;
use axum::routing::get;
use dagloop::protocol::{Call, Tool};
use dagloop::tools::Registry;
use serde_json::{Map, Value, json};

async fn server() -> String {
    let app = Router::new().route(
        "/whoami/{id}",
        get(
            |axum::extract::Path(id): axum::extract::Path<String>, h: HeaderMap| async move {
                let token = h
                    .get("authorization")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string();
                axum::Json(json!({"id": id, "authorization": token}))
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

fn tool(v: Value) -> Tool {
    Tool::from_value(v).unwrap()
}

#[tokio::test]
async fn base_url_and_headers_come_from_the_environment() {
    let base = server().await;
    // SAFETY: these variable names are used by this test only; nothing else reads them.
    unsafe {
        std::env::set_var("DAGLOOP_T12_BASE", &base);
        std::env::set_var("DAGLOOP_T12_TOKEN", "s3cret-token");
    }
    let t = tool(
        json!({"_tool": "who", "_activity": "http", "type": "object",
        "_http": {"method": "GET", "url": "${DAGLOOP_T12_BASE}/whoami/{id}",
                  "headers": {"Authorization": "Bearer ${DAGLOOP_T12_TOKEN}"}}}),
    );
    let out = Registry::new()
        .run(&t, Arc::new(Call::new("who").param("id", "u1")), Map::new())
        .await
        .unwrap();
    assert_eq!(
        out.value,
        json!({"id": "u1", "authorization": "Bearer s3cret-token"})
    );

    // A header value that is not a valid header: the error names the header, never the value.
    unsafe { std::env::set_var("DAGLOOP_T12_BAD", "bad\nvalue s3cret") };
    let t = tool(
        json!({"_tool": "who", "_activity": "http", "type": "object",
        "_http": {"method": "GET", "url": "${DAGLOOP_T12_BASE}/whoami/1",
                  "headers": {"Authorization": "${DAGLOOP_T12_BAD}"}}}),
    );
    let e = Registry::new()
        .run(&t, Arc::new(Call::new("who")), Map::new())
        .await
        .unwrap_err();
    let shown = e.to_value().to_string();
    assert!(!shown.contains("s3cret"), "{shown}");

    // An unset variable at call time is a configuration error naming it.
    let t = tool(
        json!({"_tool": "who", "_activity": "http", "type": "object",
        "_http": {"url": "${DAGLOOP_T12_NEVER_SET}/x"}}),
    );
    let e = Registry::new()
        .run(&t, Arc::new(Call::new("who")), Map::new())
        .await
        .unwrap_err();
    assert_eq!(e.code(), "activity.config");
    assert!(e.to_string().contains("DAGLOOP_T12_NEVER_SET"), "{e}");
}

#[tokio::test]
async fn transport_errors_name_their_cause() {
    // A port that was just free: nothing listens there.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let t = tool(
        json!({"_tool": "down", "_activity": "http", "type": "object",
        "_http": {"url": format!("http://127.0.0.1:{port}/x")}}),
    );
    let e = Registry::new()
        .run(&t, Arc::new(Call::new("down")), Map::new())
        .await
        .unwrap_err();
    let v = e.to_value();
    assert_eq!(v["details"]["code"], "http.transport", "{v}");
    let msg = e.to_string().to_lowercase();
    assert!(msg.contains("connection refused"), "{msg}");

    let t = tool(
        json!({"_tool": "dns", "_activity": "http", "type": "object",
        "_http": {"url": "http://no-such-host.invalid/x"}}),
    );
    let e = Registry::new()
        .run(&t, Arc::new(Call::new("dns")), Map::new())
        .await
        .unwrap_err();
    let msg = e.to_string().to_lowercase();
    assert!(
        msg.contains("dns")
            || msg.contains("resolve")
            || msg.contains("lookup")
            || msg.contains("name"),
        "{msg}"
    );
}
