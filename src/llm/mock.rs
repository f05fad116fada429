//! A mock OpenAI-compatible server (feature `server`): serves a [`Script`]'s turns at
//! `POST /v1/chat/completions` as SSE, one turn per request, so the real HTTP providers can be
//! tested end to end (`dagloop mock-llm --script FILE --port N`).
//!
//! Solution and text turns stream as content deltas; when the request offers `tools`, a Solution
//! turn streams as tool calls instead (one per call, arguments in chunks, plus `final_output`).
//! Error turns answer with their HTTP status and a `Retry-After` header. Only `stream: true` is
//! served; the request is recorded but otherwise not checked.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::serve::ListenerExt;
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use super::Script;
use super::script::{Rendered, TurnUsage};

struct MockState {
    script: Script,
    next: AtomicUsize,
    requests: Mutex<Vec<Value>>,
}

/// A running mock server. Dropping it stops the server.
pub struct MockServer {
    addr: SocketAddr,
    state: Arc<MockState>,
    task: Option<JoinHandle<std::io::Result<()>>>,
}

impl std::fmt::Debug for MockServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MockServer")
            .field("addr", &self.addr)
            .field("turns", &self.state.script.turns.len())
            .field("turns_used", &self.turns_used())
            .finish()
    }
}

/// Starts serving `script` on `listener` and returns at once.
pub async fn serve_mock(script: Script, listener: TcpListener) -> std::io::Result<MockServer> {
    let addr = listener.local_addr()?;
    let state = Arc::new(MockState {
        script,
        next: AtomicUsize::new(0),
        requests: Mutex::new(Vec::new()),
    });
    let router = Router::new()
        .route("/v1/chat/completions", post(complete))
        .route("/chat/completions", post(complete))
        .with_state(state.clone());
    // SSE chunks are small writes: without TCP_NODELAY, Nagle's algorithm holds each one back
    // until the previous one is acknowledged (up to the peer's delayed-ACK time).
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!("mock LLM server: cannot set TCP_NODELAY: {e}");
        }
    });
    let task = tokio::spawn(async move { axum::serve(listener, router).await });
    Ok(MockServer {
        addr,
        state,
        task: Some(task),
    })
}

impl MockServer {
    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The base URL to give an OpenAI-compatible client (`http://ADDR/v1`).
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// The JSON bodies received so far, in order.
    pub fn requests(&self) -> Vec<Value> {
        self.state
            .requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Turns consumed so far.
    pub fn turns_used(&self) -> usize {
        self.state.next.load(Ordering::SeqCst)
    }

    /// Serves until the server fails (it does not stop by itself).
    pub async fn wait(mut self) -> std::io::Result<()> {
        match self.task.take() {
            Some(task) => task.await.map_err(std::io::Error::other)?,
            None => Ok(()),
        }
    }
}

impl Drop for MockServer {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

fn error_response(status: StatusCode, kind: &str, message: &str) -> Response {
    let body = json!({"error": {"message": message, "type": kind, "code": status.as_u16()}});
    (status, axum::Json(body)).into_response()
}

async fn complete(State(st): State<Arc<MockState>>, body: Bytes) -> Response {
    let Ok(req) = serde_json::from_slice::<Value>(&body) else {
        return error_response(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "request body is not JSON",
        );
    };
    st.requests
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(req.clone());
    if req.get("stream") != Some(&Value::Bool(true)) {
        return error_response(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "the mock server only serves `stream: true`",
        );
    }
    let n = st.next.fetch_add(1, Ordering::SeqCst);
    let Some(turn) = st.script.turns.get(n) else {
        let msg = format!(
            "scripted model has no turn left (the script has {} turns)",
            st.script.turns.len()
        );
        return error_response(StatusCode::BAD_REQUEST, "script_exhausted", &msg);
    };
    let tool_mode = req
        .get("tools")
        .and_then(Value::as_array)
        .is_some_and(|t| !t.is_empty());
    let rendered = turn.render(tool_mode, n);
    if let Rendered::Error {
        status,
        retry_after_s,
        message,
    } = &rendered
    {
        let code = StatusCode::from_u16(*status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut resp = error_response(code, "scripted_error", message);
        if let Some(s) = retry_after_s {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(*s));
        }
        return resp;
    }
    let frames = frames(&req, n, rendered, turn.usage);
    let delay = turn.chunk_delay;
    let body = futures::stream::iter(frames.into_iter().enumerate()).then(
        move |(i, (content, frame))| async move {
            if content && i > 0 && !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            Ok::<_, std::convert::Infallible>(frame)
        },
    );
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(body))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// The SSE frames of a rendered turn, each marked whether it carries content (delayed).
fn frames(req: &Value, n: usize, rendered: Rendered, usage: TurnUsage) -> Vec<(bool, String)> {
    let model = req.get("model").cloned().unwrap_or(Value::Null);
    let chunk = |delta: Value, finish: Value| {
        json!({
            "id": format!("chatcmpl-mock-{n}"), "object": "chat.completion.chunk",
            "created": 0, "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]
        })
    };
    let mut out: Vec<(bool, Value)> = Vec::new();
    let mut output_chars = 0usize;
    let finish = match rendered {
        Rendered::Text(chunks) => {
            for (i, c) in chunks.into_iter().enumerate() {
                output_chars += c.chars().count();
                let delta = if i == 0 {
                    json!({"role": "assistant", "content": c})
                } else {
                    json!({"content": c})
                };
                out.push((true, chunk(delta, Value::Null)));
            }
            "stop"
        }
        Rendered::ToolCalls(calls) => {
            let any = !calls.is_empty();
            for (index, call) in calls.into_iter().enumerate() {
                let mut pieces = call.argument_chunks;
                if pieces.is_empty() {
                    pieces.push(String::new());
                }
                for (i, piece) in pieces.into_iter().enumerate() {
                    output_chars += piece.chars().count();
                    let tc = if i == 0 {
                        json!({"index": index, "id": call.id, "type": "function",
                               "function": {"name": call.name, "arguments": piece}})
                    } else {
                        json!({"index": index, "function": {"arguments": piece}})
                    };
                    out.push((true, chunk(json!({"tool_calls": [tc]}), Value::Null)));
                }
            }
            if any { "tool_calls" } else { "stop" }
        }
        Rendered::Error { .. } => "stop",
    };
    out.push((false, chunk(json!({}), json!(finish))));
    if req.pointer("/stream_options/include_usage") == Some(&Value::Bool(true)) {
        let input_chars: usize = req
            .get("messages")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|m| m.get("content").and_then(Value::as_str))
            .map(|c| c.chars().count())
            .sum();
        let (prompt, completion) = usage.or_estimate(input_chars, output_chars);
        out.push((
            false,
            json!({
                "id": format!("chatcmpl-mock-{n}"), "object": "chat.completion.chunk",
                "created": 0, "model": model, "choices": [],
                "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                          "total_tokens": prompt + completion}
            }),
        ));
    }
    let mut frames: Vec<(bool, String)> = out
        .into_iter()
        .map(|(c, v)| (c, format!("data: {v}\n\n")))
        .collect();
    frames.push((false, "data: [DONE]\n\n".to_string()));
    frames
}
