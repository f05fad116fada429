//! Test helpers: an in-process axum server on 127.0.0.1 that answers each request with the next
//! canned response (status, headers, body pieces with pauses, drops and hangs), and helpers to
//! build provider chunks and collect a model's stream.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Uri};
use axum::response::Response;
use axum::serve::ListenerExt;
use dagloop::llm::{EventStream, LlmError, Mode, Request, Settings, StreamEvent};
use dagloop::protocol::{Message, Role};
use futures::StreamExt;
use serde_json::{Value, json};

/// One step of a response body.
#[derive(Clone, Debug)]
pub enum Piece {
    /// Bytes written (and flushed) as one chunk.
    Bytes(Vec<u8>),
    /// A pause before the next piece.
    Sleep(Duration),
    /// The connection is dropped (the body errors, so the chunked encoding never terminates).
    Break,
    /// Nothing more is ever sent, and the connection stays open.
    Hang,
    /// These bytes, every interval, forever.
    Every(Duration, Vec<u8>),
}

/// A canned response.
#[derive(Clone, Debug)]
pub struct Canned {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub pieces: Vec<Piece>,
    /// A pause before the headers are sent.
    pub head_delay: Option<Duration>,
}

impl Canned {
    /// A 200 SSE response with one piece per frame.
    pub fn sse<S: AsRef<str>>(frames: &[S]) -> Canned {
        Canned {
            status: 200,
            headers: vec![("content-type".into(), "text/event-stream".into())],
            pieces: frames
                .iter()
                .map(|f| Piece::Bytes(f.as_ref().as_bytes().to_vec()))
                .collect(),
            head_delay: None,
        }
    }

    /// A 200 SSE response made of these pieces.
    pub fn pieces(pieces: Vec<Piece>) -> Canned {
        Canned {
            pieces,
            ..Canned::sse::<&str>(&[])
        }
    }

    /// An error status with a body.
    pub fn status(status: u16, body: &str) -> Canned {
        Canned {
            status,
            headers: vec![("content-type".into(), "application/json".into())],
            pieces: vec![Piece::Bytes(body.as_bytes().to_vec())],
            head_delay: None,
        }
    }

    pub fn header(mut self, k: &str, v: &str) -> Canned {
        self.headers.push((k.into(), v.into()));
        self
    }
}

/// What the server received.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub path: String,
    pub headers: HeaderMap,
    pub body: Value,
}

struct ServerState {
    responses: Vec<Canned>,
    hits: AtomicUsize,
    /// Canned responses given so far (requests refused by `limit` take none).
    served: AtomicUsize,
    /// Requests whose `messages` (as JSON) are longer than this many bytes get this answer
    /// instead of the next canned response (a model's window, for context-overflow tests).
    limit: Option<(usize, Canned)>,
    requests: Mutex<Vec<Recorded>>,
}

/// A running canned server.
pub struct TestServer {
    pub addr: std::net::SocketAddr,
    state: Arc<ServerState>,
}

impl TestServer {
    /// `http://ADDR/v1`, for OpenAI-style clients.
    pub fn openai_base(&self) -> String {
        format!("http://{}/v1", self.addr)
    }
    /// `http://ADDR`, for Anthropic-style clients.
    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }
    pub fn hits(&self) -> usize {
        self.state.hits.load(Ordering::SeqCst)
    }
    pub fn requests(&self) -> Vec<Recorded> {
        self.state.requests.lock().unwrap().clone()
    }
}

/// Keeps tokio's paused clock from jumping to a far timer while real IO is in flight.
///
/// With a paused clock, whenever every task waits, tokio advances time straight to the next
/// timer, even when loopback bytes are merely a moment late (the kernel may deliver them a bit
/// later under load). A 1 ms ticker makes the next timer always at most 1 ms away, so waiting for
/// IO costs only a few virtual milliseconds and timeouts fire only when the peer is really silent.
pub fn heartbeat() {
    tokio::spawn(async {
        loop {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    });
}

/// Serves the canned responses in order; requests past the end get the last one. Also starts
/// the [`heartbeat`].
pub async fn serve(responses: Vec<Canned>) -> TestServer {
    serve_with_limit(responses, None).await
}

/// Like [`serve`], but a request whose `messages` serialise to more than `limit.0` bytes gets
/// `limit.1` (a "context length exceeded" answer, `{request_tokens}` in it replaced by the
/// request's bytes / 3) and takes no canned response.
pub async fn serve_with_limit(
    responses: Vec<Canned>,
    limit: Option<(usize, Canned)>,
) -> TestServer {
    heartbeat();
    let state = Arc::new(ServerState {
        responses,
        served: AtomicUsize::new(0),
        limit,
        hits: AtomicUsize::new(0),
        requests: Mutex::new(Vec::new()),
    });
    let app = Router::new().fallback(handle).with_state(state.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // Small SSE writes must not wait for ACKs (Nagle), or pieces arrive late and merged.
    let listener = listener.tap_io(|tcp| tcp.set_nodelay(true).unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    TestServer { addr, state }
}

async fn handle(
    State(st): State<Arc<ServerState>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    st.hits.fetch_add(1, Ordering::SeqCst);
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let body_len = body["messages"].to_string().len();
    let too_long = st
        .limit
        .as_ref()
        .filter(|(max, _)| body["messages"].to_string().len() > *max);
    st.requests.lock().unwrap().push(Recorded {
        path: uri.path().to_string(),
        headers,
        body,
    });
    let canned = match too_long {
        // `{request_tokens}` in the refusal: the request's size at three bytes a token.
        Some((_, refusal)) => {
            let tokens = (body_len / 3).to_string();
            let mut refusal = refusal.clone();
            for p in &mut refusal.pieces {
                if let Piece::Bytes(b) = p {
                    *b = String::from_utf8_lossy(b)
                        .replace("{request_tokens}", &tokens)
                        .into_bytes();
                }
            }
            refusal
        }
        None => {
            let n = st.served.fetch_add(1, Ordering::SeqCst);
            st.responses[n.min(st.responses.len() - 1)].clone()
        }
    };
    if let Some(d) = canned.head_delay {
        tokio::time::sleep(d).await;
    }
    let mut b = Response::builder().status(canned.status);
    for (k, v) in &canned.headers {
        b = b.header(k.as_str(), v.as_str());
    }
    b.body(Body::from_stream(body_stream(canned.pieces)))
        .unwrap()
}

fn body_stream(
    pieces: Vec<Piece>,
) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> + Send {
    futures::stream::unfold(VecDeque::from(pieces), |mut q| async move {
        loop {
            match q.pop_front()? {
                Piece::Bytes(b) => return Some((Ok(Bytes::from(b)), q)),
                Piece::Sleep(d) => tokio::time::sleep(d).await,
                Piece::Break => {
                    return Some((Err(std::io::Error::other("connection dropped")), q));
                }
                Piece::Hang => {
                    tokio::time::sleep(Duration::from_secs(365 * 86_400)).await;
                    return None;
                }
                Piece::Every(d, bytes) => {
                    tokio::time::sleep(d).await;
                    q.push_front(Piece::Every(d, bytes.clone()));
                    return Some((Ok(Bytes::from(bytes)), q));
                }
            }
        }
    })
}

/// An SSE frame `data: <json>\n\n`.
pub fn data(v: Value) -> String {
    format!("data: {v}\n\n")
}

/// An SSE frame with an event name.
pub fn named(event: &str, v: Value) -> String {
    format!("event: {event}\ndata: {v}\n\n")
}

pub const DONE: &str = "data: [DONE]\n\n";

/// An OpenAI chunk with this delta.
pub fn oa_delta(delta: Value) -> String {
    data(
        json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                "choices": [{"index": 0, "delta": delta, "finish_reason": null}]}),
    )
}

/// An OpenAI content chunk.
pub fn oa_text(t: &str) -> String {
    oa_delta(json!({"content": t}))
}

/// An OpenAI finish chunk.
pub fn oa_finish(reason: &str) -> String {
    data(
        json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                "choices": [{"index": 0, "delta": {}, "finish_reason": reason}]}),
    )
}

/// An OpenAI usage chunk.
pub fn oa_usage(prompt: u64, completion: u64) -> String {
    data(
        json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                "choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                                         "total_tokens": prompt + completion}}),
    )
}

/// A well-formed OpenAI stream answering `text`.
pub fn oa_stream(text: &str) -> Vec<String> {
    vec![
        oa_delta(json!({"role": "assistant", "content": ""})),
        oa_text(text),
        oa_finish("stop"),
        oa_usage(10, 3),
        DONE.to_string(),
    ]
}

/// A small composed-style Solution schema.
pub fn solution_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "calls": {"type": "array", "items": {"type": "object"}},
            "output": {"anyOf": [{"type": "null"}, {"type": "object",
                       "properties": {"answer": {"type": "string"}}, "required": ["answer"]}]}
        },
        "required": ["calls", "output"]
    })
}

/// A request in this mode with short timeouts.
pub fn request(mode: Mode) -> Request {
    Request {
        messages: vec![
            Message::Text {
                role: Role::System,
                text: "You plan tool calls.".into(),
                extra: Default::default(),
            },
            Message::Text {
                role: Role::User,
                text: "Look up the weather.".into(),
                extra: Default::default(),
            },
        ],
        schema: solution_schema(),
        tools: vec![],
        settings: Settings {
            model: "test-model".into(),
            mode,
            request_timeout: Duration::from_secs(120),
            idle_timeout: Duration::from_secs(10),
            ..Settings::default()
        },
    }
}

/// Every event of a stream, and the error that ended it, if any.
pub async fn collect(mut s: EventStream) -> (Vec<StreamEvent>, Option<LlmError>) {
    let mut events = Vec::new();
    while let Some(item) = s.next().await {
        match item {
            Ok(e) => events.push(e),
            Err(e) => {
                assert!(s.next().await.is_none(), "an error must end the stream");
                return (events, Some(e));
            }
        }
    }
    (events, None)
}

/// The concatenated text deltas.
pub fn text_of(events: &[StreamEvent]) -> String {
    events
        .iter()
        .filter_map(|e| match e {
            StreamEvent::TextDelta(t) => Some(t.as_str()),
            _ => None,
        })
        .collect()
}

/// (index, id, name, arguments) of every ToolCallDone, in emission order.
pub fn dones(events: &[StreamEvent]) -> Vec<(usize, String, String, String)> {
    events
        .iter()
        .filter_map(|e| match e {
            StreamEvent::ToolCallDone {
                index,
                id,
                name,
                arguments,
            } => Some((*index, id.clone(), name.clone(), arguments.clone())),
            _ => None,
        })
        .collect()
}
