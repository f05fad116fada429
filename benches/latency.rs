//! Latency benchmark: from the SSE event that closes a call to the parsed `Call` being handed to
//! the scheduler, through the real HTTP path.
//!
//! An axum server on 127.0.0.1 (its own runtime, on its own thread) streams one
//! OpenAI-compatible chat completion whose content is a Solution of many calls, cut into small
//! content deltas. The delta holding a call's closing `}` is sent alone, after a pause and
//! followed by a pause, so each measurement is isolated; the server stamps it (on an `Instant`
//! shared with the client) right before handing the frame to hyper, so hyper's write and flush
//! are inside the figure. The client is the real `dagloop::llm::OpenAi` provider (reqwest,
//! eventsource-stream, the chunk decoder); its text deltas go through the `SolutionParser` and
//! onto an unbounded channel, in a task of a multi-thread runtime. The sample is the time from
//! the server's stamp to the moment `send` on that channel returned.
//!
//! Run with `cargo bench --bench latency`. Prints one JSON line on stdout. A breakdown goes to
//! stderr, one JSON line per stage: the provider (server stamp → text delta out of `OpenAi`),
//! the parser, the `send`, the channel's receiving side (a task standing in for the
//! scheduler), the floor (the same stream read as raw body chunks by a bare reqwest client from
//! a second server, no SSE framing or decoding) and the parser alone, offline.
//!
//! A second stdout line, `sse_to_activity`, measures the whole engine on the same stream: an
//! `Agent` (the run driver `dagloop run` uses: journal, machine, scheduler, parameter
//! validation, one event subscriber) on the same `OpenAi` provider, from the server's stamp to
//! the first instruction of the call's activity (a registered Rust function).
//!
//! It is not a timed test: nothing fails when the target (≤ 200 µs median) is missed.

/// The binary's allocator (mimalloc), counting nothing here: the latency is the path users run.
#[path = "support/alloc.rs"]
mod alloc;

use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::header;
use axum::response::Response;
use axum::routing::post;
use axum::serve::ListenerExt;
use dagloop::llm::{Model, OpenAi, Request, Settings, StreamEvent};
use dagloop::plan::{ParseEvent, SolutionParser};
use dagloop::protocol::Call;
use dagloop::{AgentBuilder, Goal};
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::sync::mpsc;

/// Calls streamed before measuring (connection set-up, allocator and cache warm-up).
const WARMUP: usize = 200;
/// Calls measured.
const SAMPLES: usize = 2_000;
/// Bytes of Solution text per content delta (a few tokens' worth).
const PIECE: usize = 16;
/// Quiet time before and after each call-closing delta.
const PAUSE: Duration = Duration::from_millis(1);

/// One content delta of the Solution text, and the call it closes, if any.
struct Piece {
    text: String,
    closes: Option<usize>,
}

/// The Solution text cut into deltas; a delta that closes a call holds that call's `}` (with
/// the start of what follows it, as a model's token would) and nothing that closes another one.
fn solution_pieces(calls: usize) -> Vec<Piece> {
    const NEXT_HEAD: &str = "{\"_to";
    let mut pieces = Vec::new();
    let push_plain = |text: &str, pieces: &mut Vec<Piece>| {
        for chunk in text.as_bytes().chunks(PIECE) {
            pieces.push(Piece {
                text: String::from_utf8_lossy(chunk).into_owned(),
                closes: None,
            });
        }
    };
    push_plain("{\"calls\": [", &mut pieces);
    for i in 0..calls {
        let call = json!({
            "_tool": "fetchRecord",
            "id": i,
            "query": format!("customer {i} last order"),
            "limit": 5,
            "_outputPath": format!("$ref:state.records.r{i}"),
        })
        .to_string();
        let body = &call[..call.len() - 1];
        // The previous closing delta already carried the start of this call.
        let body = if i == 0 {
            body
        } else {
            body.strip_prefix(NEXT_HEAD).unwrap_or(body)
        };
        push_plain(body, &mut pieces);
        let tail = if i + 1 == calls {
            "]".to_string()
        } else {
            format!(", {NEXT_HEAD}")
        };
        pieces.push(Piece {
            text: format!("}}{tail}"),
            closes: Some(i),
        });
    }
    push_plain(", \"output\": {\"done\": true}}", &mut pieces);
    pieces
}

/// The SSE frame of one chat-completion chunk.
fn frame(delta: Value, finish: Value) -> Bytes {
    let chunk = json!({
        "id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 0,
        "model": "bench", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]
    });
    Bytes::from(format!("data: {chunk}\n\n"))
}

struct Server {
    base: Instant,
    calls: usize,
    /// Nanoseconds since `base` at which each call's closing frame was handed to hyper.
    written: Arc<Vec<AtomicU64>>,
}

async fn complete(State(st): State<Arc<Server>>, _body: Bytes) -> Response {
    let pieces = solution_pieces(st.calls);
    let frames: Vec<(Option<usize>, Bytes)> = pieces
        .into_iter()
        .enumerate()
        .map(|(i, p)| {
            let delta = if i == 0 {
                json!({"role": "assistant", "content": p.text})
            } else {
                json!({"content": p.text})
            };
            (p.closes, frame(delta, Value::Null))
        })
        .chain([
            (None, frame(json!({}), json!("stop"))),
            (None, Bytes::from_static(b"data: [DONE]\n\n")),
        ])
        .collect();
    // A closing frame is produced after a pause and stamped just before hyper gets it; the
    // next frame is produced only after another pause, so hyper writes and flushes the closing
    // frame alone and the client has nothing else to read meanwhile.
    let body = futures::stream::unfold(
        (frames.into_iter(), st, false),
        |(mut frames, st, pause_first)| async move {
            let (closes, bytes) = frames.next()?;
            if pause_first || closes.is_some() {
                tokio::time::sleep(PAUSE).await;
            }
            if let Some(k) = closes {
                let at = st.base.elapsed().as_nanos() as u64;
                st.written[k].store(at, Ordering::Release);
            }
            Some((Ok::<_, Infallible>(bytes), (frames, st, closes.is_some())))
        },
    );
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(body))
        .unwrap_or_else(|_| Response::new(Body::empty()))
}

/// Starts the server on its own thread and runtime; returns its base URL.
fn start_server(st: Arc<Server>) -> String {
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("server runtime");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind 127.0.0.1");
            addr_tx
                .send(listener.local_addr().expect("local addr"))
                .expect("send addr");
            let listener = listener.tap_io(|tcp| {
                let _ = tcp.set_nodelay(true);
            });
            let app = Router::new()
                .route("/v1/chat/completions", post(complete))
                .with_state(st);
            axum::serve(listener, app).await.expect("serve");
        });
    });
    let addr = addr_rx.recv().expect("server address");
    format!("http://{addr}/v1")
}

/// When one call passed each stage, in ns since the shared base.
#[derive(Clone, Copy)]
struct Stamps {
    /// Parse index of the call.
    index: usize,
    /// The text delta that closed it came out of the provider.
    delta: u64,
    /// The parser had returned the call.
    parsed: u64,
    /// `send` on the scheduler's channel had returned.
    sent: u64,
}

/// Model stream → parser → channel. Returns the stamps of every call, in parse order.
async fn stream_calls(
    model: Arc<dyn Model>,
    req: Request,
    tx: mpsc::UnboundedSender<Result<Call, String>>,
    base: Instant,
) -> Vec<Stamps> {
    let now = move || base.elapsed().as_nanos() as u64;
    let mut stamps = Vec::with_capacity(WARMUP + SAMPLES);
    let mut parser = SolutionParser::new();
    let mut stream = model.stream(&req);
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(StreamEvent::TextDelta(t)) => {
                let delta = now();
                let events = parser.feed(&t);
                let parsed = now();
                for pe in events {
                    if let ParseEvent::Call { index, call, raw } = pe {
                        let _ = tx.send(call.map_err(|e| format!("{e} (in {raw})")));
                        stamps.push(Stamps {
                            index,
                            delta,
                            parsed,
                            sent: now(),
                        });
                    }
                }
            }
            Ok(StreamEvent::Finish { .. }) => break,
            Ok(_) => {}
            Err(e) => panic!("model stream failed: {e}"),
        }
    }
    if let Err(e) = parser.finish() {
        panic!("solution did not parse: {e}");
    }
    stamps
}

#[derive(serde::Deserialize)]
struct Record {
    id: usize,
}

/// The whole engine on the stream at `url`: an `Agent` whose `fetchRecord` activity stamps its
/// first instruction. Returns (call id param, ns since `base`) for every call.
async fn engine_to_activity(url: String, base: Instant, calls: usize) -> Vec<(usize, u64)> {
    let goal = json!({
        "goal": "bench",
        "output_schema": {"type": "object"},
        "tools": [{"_tool": "fetchRecord", "_activity": "rust", "type": "object",
            "properties": {"id": {"type": "integer"}, "query": {"type": "string"},
                "limit": {"type": "integer"}},
            "required": ["id"]}],
        "limits": {"max_steps": 3}
    });
    let goal =
        Goal::from_json(&goal.to_string(), "bench.json".as_ref(), PathBuf::new()).expect("goal");
    let started = Arc::new(std::sync::Mutex::new(Vec::with_capacity(calls)));
    let s = started.clone();
    let model = OpenAi::new(url, None, "bench").expect("provider");
    let mut b = AgentBuilder::new(dagloop::RunDef::from_goal(goal).expect("defined"))
        .model(Arc::new(model));
    b.registry_mut()
        .register_fn("fetchRecord", move |r: Record| {
            let at = base.elapsed().as_nanos() as u64;
            if let Ok(mut v) = s.lock() {
                v.push((r.id, at));
            }
            async move { Ok::<_, String>(1) }
        });
    let run = b.build().expect("agent").start();
    let mut events = run.subscribe_from(0);
    let watcher = tokio::spawn(async move { while events.recv().await.is_some() {} });
    let result = run.wait().await;
    assert!(result.succeeded(), "{:?}", result.error);
    drop(run);
    let _ = watcher.await;
    started.lock().map(|v| v.clone()).unwrap_or_default()
}

/// The floor under the provider: the same stream read as raw body chunks with a bare reqwest
/// client (no SSE framing, no decoding, no parsing). Returns, for each call in order, when the
/// chunk holding its closing frame arrived, in ns since `base`.
async fn raw_chunks(url: String, base: Instant) -> Vec<(usize, u64)> {
    let resp = dagloop::net::client()
        .expect("an HTTP client")
        .post(format!("{url}/chat/completions"))
        .json(&json!({"model": "bench", "stream": true}))
        .send()
        .await
        .expect("raw request");
    let mut body = resp.bytes_stream();
    let mut seen = Vec::with_capacity(WARMUP + SAMPLES);
    while let Some(chunk) = body.next().await {
        let at = base.elapsed().as_nanos() as u64;
        let chunk = chunk.expect("raw body chunk");
        // Closing deltas are the only ones whose content starts with the brace.
        const CLOSING: &[u8] = br#""content":"}"#;
        let closing = chunk
            .windows(CLOSING.len())
            .filter(|w| *w == CLOSING)
            .count();
        for _ in 0..closing {
            seen.push((seen.len(), at));
        }
    }
    seen
}

/// The parser alone, offline: how long feeding each call-closing delta takes (µs), with the
/// deltas the server streams.
fn parser_only(calls: usize) -> Vec<f64> {
    let mut parser = SolutionParser::new();
    let mut us = Vec::with_capacity(calls);
    for p in solution_pieces(calls) {
        let t = Instant::now();
        let events = parser.feed(&p.text);
        let took = t.elapsed();
        std::hint::black_box(&events);
        if p.closes.is_some_and(|k| k >= WARMUP) {
            us.push(took.as_nanos() as f64 / 1000.0);
        }
    }
    us
}

/// Median, p90, p99 and max of the samples, in µs.
fn summary(mut us: Vec<f64>) -> (f64, f64, f64, f64) {
    us.sort_by(f64::total_cmp);
    let at = |q: f64| us[((us.len() as f64 * q).ceil() as usize).clamp(1, us.len()) - 1];
    (at(0.5), at(0.9), at(0.99), us[us.len() - 1])
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// The JSON line of one workload's samples (µs).
fn line(workload: &str, us: Vec<f64>) -> Value {
    let n = us.len();
    let (med, p90, p99, max) = summary(us);
    json!({"workload": workload, "samples": n, "median_us": round1(med), "p90_us": round1(p90),
           "p99_us": round1(p99), "max_us": round1(max)})
}

/// Microseconds from `from[i]` to `to`, for each measured (non-warm-up) call.
fn spans(from: impl Fn(usize) -> u64, pairs: impl Iterator<Item = (usize, u64)>) -> Vec<f64> {
    pairs
        .filter(|(i, _)| *i >= WARMUP)
        .map(|(i, to)| {
            let f = from(i);
            assert!(f > 0 && to >= f, "call {i}: seen before it was written");
            (to - f) as f64 / 1000.0
        })
        .collect()
}

fn server(base: Instant, calls: usize) -> (String, Arc<Vec<AtomicU64>>) {
    let written: Arc<Vec<AtomicU64>> = Arc::new((0..calls).map(|_| AtomicU64::new(0)).collect());
    let url = start_server(Arc::new(Server {
        base,
        calls,
        written: written.clone(),
    }));
    (url, written)
}

fn main() {
    alloc::counting(false);
    // The allocator's options the `dagloop` binary runs with (src/cli/alloc.rs).
    dagloop::cli::tune_allocator();
    let calls = WARMUP + SAMPLES;
    let base = Instant::now();
    let (url, written) = server(base, calls);
    let (raw_url, raw_written) = server(base, calls);
    let (engine_url, engine_written) = server(base, calls);

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("client runtime");
    let (handed, received, raw, engine) = rt.block_on(async move {
        let model: Arc<dyn Model> = Arc::new(OpenAi::new(url, None, "bench").expect("provider"));
        let req = Request {
            messages: Vec::new(),
            schema: json!({"type": "object"}),
            tools: Vec::new(),
            settings: Settings::default(),
        };
        let (tx, mut rx) = mpsc::unbounded_channel::<Result<Call, String>>();
        // Stands in for the scheduler: stamps each call as it comes off the channel.
        let scheduler = tokio::spawn(async move {
            let mut got = Vec::with_capacity(calls);
            while let Some(c) = rx.recv().await {
                let at = base.elapsed().as_nanos() as u64;
                let c: Call = c.expect("every streamed call is valid");
                let id = c.params.get("id").and_then(Value::as_u64).expect("id") as usize;
                got.push((id, at));
            }
            got
        });
        let handed = tokio::spawn(stream_calls(model, req, tx, base))
            .await
            .expect("stream task");
        let received = scheduler.await.expect("scheduler task");
        let raw = tokio::spawn(raw_chunks(raw_url, base))
            .await
            .expect("raw task");
        let engine = tokio::spawn(engine_to_activity(engine_url, base, calls))
            .await
            .expect("engine task");
        (handed, received, raw, engine)
    });

    assert_eq!(handed.len(), calls, "every call was handed over");
    assert_eq!(received.len(), calls, "every call was received");
    assert_eq!(raw.len(), calls, "every closing frame was read raw");
    let w = |i: usize| written[i].load(Ordering::Acquire);
    let sent = spans(w, handed.iter().map(|s| (s.index, s.sent)));
    println!("{}", line("sse_call_latency", sent));
    assert_eq!(engine.len(), calls, "every call's activity started");
    let to_activity = spans(
        |i| engine_written[i].load(Ordering::Acquire),
        engine.into_iter(),
    );
    println!("{}", line("sse_to_activity", to_activity));
    // Where the time goes, on stderr: the provider (HTTP, SSE framing, chunk decoding); the
    // parser; the send; the channel's receiving side; the bare-reqwest floor; the
    // parser alone, offline.
    let measured = || handed.iter().filter(|s| s.index >= WARMUP);
    let us = |from: u64, to: u64| (to - from) as f64 / 1000.0;
    let parts = [
        (
            "sse_call_latency.provider",
            spans(w, handed.iter().map(|s| (s.index, s.delta))),
        ),
        (
            "sse_call_latency.parser",
            measured().map(|s| us(s.delta, s.parsed)).collect(),
        ),
        (
            "sse_call_latency.send",
            measured().map(|s| us(s.parsed, s.sent)).collect(),
        ),
        (
            "sse_call_latency.received",
            spans(w, received.iter().copied()),
        ),
        (
            "sse_bytes_floor",
            spans(|i| raw_written[i].load(Ordering::Acquire), raw.into_iter()),
        ),
        ("parser_only", parser_only(calls)),
    ];
    for (name, us) in parts {
        eprintln!("{}", line(name, us));
    }
}
