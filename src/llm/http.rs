//! HTTP + SSE transport shared by the HTTP providers: sends one POST, turns a non-success status
//! into a typed error (with `Retry-After`), frames the body as SSE events and hands each event to
//! a provider decoder, enforcing the idle timeout (between body bytes) and the request deadline.
//!
//! It does not know any provider's JSON and does not retry: one call is one attempt.

use std::collections::VecDeque;
use std::pin::Pin;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use eventsource_stream::{Event, EventStreamError, Eventsource};
use futures::StreamExt;
use futures::stream::BoxStream;
use reqwest::header::{CONTENT_TYPE, HeaderMap, RETRY_AFTER};
use serde_json::Value;
use tokio::time::{Instant, Sleep};

use super::secret::Redactor;
use super::{EventStream, LlmError, StreamEvent};

/// How much of an error body is kept (bytes read) and shown (chars).
const ERROR_BODY_READ: usize = 16 * 1024;
const ERROR_MESSAGE_CHARS: usize = 500;

/// Turns a provider's SSE events into normalised stream events.
pub(crate) trait Decoder: Send + 'static {
    /// Handles one SSE event, pushing the stream events it yields.
    fn event(&mut self, ev: &Event, out: &mut Vec<StreamEvent>) -> Result<(), LlmError>;
    /// True once the provider's end-of-stream marker has been seen; reading stops there.
    fn is_done(&self) -> bool;
    /// Called once at the end (marker seen or body ended): flushes pending tool calls, usage and
    /// the finish event, or reports an incomplete stream.
    fn finish(&mut self, out: &mut Vec<StreamEvent>) -> Result<(), LlmError>;
}

/// One HTTP attempt, ready to send.
pub(crate) struct HttpCall {
    pub client: reqwest::Client,
    pub url: String,
    pub headers: HeaderMap,
    pub body: Value,
    pub request_timeout: Duration,
    pub idle_timeout: Duration,
    pub redactor: Redactor,
}

type SseStream = BoxStream<'static, Result<Event, EventStreamError<LlmError>>>;

enum Phase {
    Connect(Box<HttpCall>),
    Reading(SseStream),
    Finished,
}

struct Driver<D> {
    phase: Phase,
    decoder: D,
    pending: VecDeque<Result<StreamEvent, LlmError>>,
    deadline: Instant,
    /// Fires at `deadline`. One timer for the whole attempt: creating a timer per SSE event
    /// costs timer-wheel work on the hot path (see `IdleTimer`).
    deadline_timer: Pin<Box<Sleep>>,
    request_timeout: Duration,
}

/// Sends the request and streams the decoded events. The first error ends the stream.
pub(crate) fn sse_stream<D: Decoder>(call: HttpCall, decoder: D) -> EventStream {
    let deadline = Instant::now() + call.request_timeout;
    let driver = Driver {
        deadline,
        deadline_timer: Box::pin(tokio::time::sleep_until(deadline)),
        request_timeout: call.request_timeout,
        phase: Phase::Connect(Box::new(call)),
        decoder,
        pending: VecDeque::new(),
    };
    futures::stream::unfold(driver, |mut d| async move {
        loop {
            if let Some(item) = d.pending.pop_front() {
                return Some((item, d));
            }
            match std::mem::replace(&mut d.phase, Phase::Finished) {
                Phase::Finished => return None,
                Phase::Connect(call) => match connect(*call, d.deadline).await {
                    Ok(sse) => d.phase = Phase::Reading(sse),
                    Err(e) => return Some((Err(e), d)),
                },
                Phase::Reading(mut sse) => {
                    let next = tokio::select! {
                        biased;
                        next = sse.next() => Ok(next),
                        () = d.deadline_timer.as_mut() => Err(()),
                    };
                    let mut out = Vec::new();
                    let result = match next {
                        Err(()) => Err(LlmError::Timeout {
                            after: d.request_timeout,
                        }),
                        Ok(None) => d.decoder.finish(&mut out),
                        Ok(Some(Err(e))) => Err(sse_error(e)),
                        Ok(Some(Ok(ev))) => match d.decoder.event(&ev, &mut out) {
                            Ok(()) if d.decoder.is_done() => d.decoder.finish(&mut out),
                            Ok(()) => {
                                d.phase = Phase::Reading(sse);
                                Ok(())
                            }
                            Err(e) => Err(e),
                        },
                    };
                    d.pending.extend(out.into_iter().map(Ok));
                    if let Err(e) = result {
                        d.phase = Phase::Finished;
                        d.pending.push_back(Err(e));
                    }
                }
            }
        }
    })
    .boxed()
}

fn sse_error(e: EventStreamError<LlmError>) -> LlmError {
    match e {
        EventStreamError::Transport(e) => e,
        EventStreamError::Utf8(e) => LlmError::BadSse {
            reason: format!("body is not UTF-8: {e}"),
        },
        EventStreamError::Parser(e) => LlmError::BadSse {
            reason: format!("unparsable SSE line: {e}"),
        },
    }
}

/// Waits for `fut`, bounded by the idle timeout and the attempt deadline.
async fn bounded<F: Future>(
    fut: F,
    idle: Duration,
    deadline: Instant,
    request_timeout: Duration,
) -> Result<F::Output, LlmError> {
    let idle_at = Instant::now() + idle;
    if idle_at < deadline {
        tokio::time::timeout_at(idle_at, fut)
            .await
            .map_err(|_| LlmError::IdleTimeout { after: idle })
    } else {
        tokio::time::timeout_at(deadline, fut)
            .await
            .map_err(|_| LlmError::Timeout {
                after: request_timeout,
            })
    }
}

/// The message of a reqwest error and its sources, redacted.
pub(crate) fn transport_error(e: &reqwest::Error, redactor: &Redactor) -> LlmError {
    let mut message = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        message.push_str(": ");
        message.push_str(&s.to_string());
        source = s.source();
    }
    LlmError::Transport {
        message: redactor.apply(&message),
    }
}

async fn connect(call: HttpCall, deadline: Instant) -> Result<SseStream, LlmError> {
    let HttpCall {
        client,
        url,
        headers,
        body,
        request_timeout,
        idle_timeout,
        redactor,
    } = call;
    let send = client.post(&url).headers(headers).json(&body).send();
    let resp = bounded(send, idle_timeout, deadline, request_timeout)
        .await?
        .map_err(|e| transport_error(&e, &redactor))?;
    let status = resp.status();
    if !status.is_success() {
        let retry_after = retry_after_of(resp.headers(), SystemTime::now());
        let body = read_error_body(resp, idle_timeout, deadline, request_timeout).await;
        return Err(status_error(status.as_u16(), retry_after, &body, &redactor));
    }
    if let Some(ct) = resp
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        && ct.starts_with("application/json")
    {
        return Err(LlmError::BadSse {
            reason: format!("expected text/event-stream, the server sent {ct}"),
        });
    }
    let bytes = Box::pin(resp.bytes_stream());
    let idle = IdleTimer::new(idle_timeout);
    // `line`: the length of the SSE line not yet ended (the framer buffers it whole).
    let timed = futures::stream::unfold(
        (bytes, idle, false, 0usize),
        move |(mut bytes, mut idle, failed, line)| {
            let redactor = redactor.clone();
            async move {
                if failed {
                    return None;
                }
                let next = tokio::select! {
                    biased;
                    next = bytes.next() => Some(next),
                    () = idle.expired() => None,
                };
                match next {
                    Some(Some(Ok(chunk))) => {
                        idle.activity();
                        let (longest, line) = line_lengths(line, &chunk);
                        if longest > MAX_SSE_LINE {
                            return Some((
                                Err(LlmError::LineTooLong {
                                    limit: MAX_SSE_LINE,
                                }),
                                (bytes, idle, true, line),
                            ));
                        }
                        Some((Ok(chunk), (bytes, idle, false, line)))
                    }
                    Some(Some(Err(e))) => Some((
                        Err(transport_error(&e, &redactor)),
                        (bytes, idle, true, line),
                    )),
                    Some(None) => None,
                    None => Some((
                        Err(LlmError::IdleTimeout {
                            after: idle_timeout,
                        }),
                        (bytes, idle, true, line),
                    )),
                }
            }
        },
    );
    Ok(timed.eventsource().boxed())
}

/// The longest SSE line (in bytes, without its end) a stream may send: the framer keeps a line
/// whole until it ends, so a longer one fails the attempt (`llm.line_too_long`) instead of
/// growing a buffer without bound.
pub const MAX_SSE_LINE: usize = 1 << 20;

/// For a chunk of the body, given the length of the line it continues (`carry`): the longest
/// line it ends or continues, and the length of the line still open at its end.
fn line_lengths(carry: usize, chunk: &[u8]) -> (usize, usize) {
    let mut longest = 0;
    let mut open = carry;
    for segment in chunk.split(|b| *b == b'\n' || *b == b'\r') {
        open = open.saturating_add(segment.len());
        longest = longest.max(open);
        open = 0;
    }
    // The last segment is the line still open (split always yields at least one).
    let last = chunk
        .iter()
        .rposition(|b| *b == b'\n' || *b == b'\r')
        .map_or(carry.saturating_add(chunk.len()), |i| chunk.len() - i - 1);
    (longest, last)
}

/// The idle timeout of a body, re-armed lazily.
///
/// A fresh timer per body chunk would add and remove a timer-wheel entry for every chunk, and
/// on a multi-thread runtime registering a timer while the driver sleeps with no timer pending
/// wakes the driver's thread: measurable on the path from an SSE event to its parsed call
/// (`benches/latency.rs`). Instead one timer stays armed; a chunk only records the time, and
/// when the timer fires early (there was activity since it was armed) it is moved to
/// `last activity + idle` and waited for again.
struct IdleTimer {
    idle: Duration,
    last: Instant,
    timer: Pin<Box<Sleep>>,
}

impl IdleTimer {
    fn new(idle: Duration) -> IdleTimer {
        let last = Instant::now();
        IdleTimer {
            idle,
            last,
            timer: Box::pin(tokio::time::sleep_until(last + idle)),
        }
    }

    /// Records a chunk: the silence is measured from now.
    fn activity(&mut self) {
        self.last = Instant::now();
    }

    /// Completes once `idle` has passed without activity.
    async fn expired(&mut self) {
        loop {
            self.timer.as_mut().await;
            let due = self.last + self.idle;
            if Instant::now() >= due {
                return;
            }
            self.timer.as_mut().reset(due);
        }
    }
}

async fn read_error_body(
    resp: reqwest::Response,
    idle: Duration,
    deadline: Instant,
    request_timeout: Duration,
) -> String {
    let mut buf = Vec::new();
    let mut bytes = Box::pin(resp.bytes_stream());
    while buf.len() < ERROR_BODY_READ {
        match bounded(bytes.next(), idle, deadline, request_timeout).await {
            Ok(Some(Ok(chunk))) => buf.extend_from_slice(&chunk),
            _ => break,
        }
    }
    buf.truncate(ERROR_BODY_READ);
    String::from_utf8_lossy(&buf).into_owned()
}

/// The message of an error body: `error.message` of a JSON body, else the raw text; redacted and
/// truncated.
/// The error of a non-success answer: [`LlmError::ContextOverflow`] when the body says the
/// context does not fit the model's window, else [`LlmError::HttpStatus`].
fn status_error(
    status: u16,
    retry_after: Option<Duration>,
    body: &str,
    redactor: &Redactor,
) -> LlmError {
    let message = error_message(body, redactor);
    if context_overflow(status, body) {
        return LlmError::ContextOverflow { status, message };
    }
    LlmError::HttpStatus {
        status,
        retry_after,
        message,
    }
}

/// Whether an error answer says the request's context is longer than the model's window:
/// OpenAI's `code: "context_length_exceeded"` ("This model's maximum context length is …"),
/// llama.cpp's server `type: "exceed_context_size_error"` ("the request exceeds the available
/// context size"), Anthropic's "prompt is too long: N tokens > M maximum".
fn context_overflow(status: u16, body: &str) -> bool {
    if !matches!(status, 400 | 413) {
        return false;
    }
    let v: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    let e = v.get("error").unwrap_or(&Value::Null);
    let field = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or_default();
    if field("code") == "context_length_exceeded" || field("type") == "exceed_context_size_error" {
        return true;
    }
    let text = match e {
        Value::String(s) => s.to_lowercase(),
        Value::Object(_) => field("message").to_lowercase(),
        _ => body.to_lowercase(),
    };
    [
        "context_length_exceeded",
        "maximum context length",
        "prompt is too long",
        "exceeds the available context size",
        "context length exceeded",
    ]
    .iter()
    .any(|needle| text.contains(needle))
}

fn error_message(body: &str, redactor: &Redactor) -> String {
    let from_json = serde_json::from_str::<Value>(body).ok().and_then(|v| {
        let e = v.get("error")?;
        match e {
            Value::String(s) => Some(s.clone()),
            Value::Object(o) => o.get("message").and_then(Value::as_str).map(str::to_string),
            _ => None,
        }
    });
    let text = from_json.unwrap_or_else(|| body.trim().to_string());
    let text = redactor.apply(&text);
    if text.chars().count() > ERROR_MESSAGE_CHARS {
        let mut t: String = text.chars().take(ERROR_MESSAGE_CHARS).collect();
        t.push('…');
        t
    } else {
        text
    }
}

fn retry_after_of(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    if let Some(ms) = headers
        .get("retry-after-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<f64>().ok())
    {
        // Out of range (negative, NaN, `1e300`) means the header is ignored, never a panic.
        return crate::duration::seconds("retry-after-ms", ms / 1000.0).ok();
    }
    parse_retry_after(headers.get(RETRY_AFTER)?.to_str().ok()?, now)
}

/// Parses a `Retry-After` value: delay-seconds (`"120"`) or an HTTP date
/// (`"Sun, 06 Nov 1994 08:49:37 GMT"`, IMF-fixdate), relative to `now`. A date in the past gives
/// zero; anything else gives None.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        let secs = value.parse::<u64>().ok()?;
        return crate::duration::seconds("retry-after", secs as f64).ok();
    }
    let at = UNIX_EPOCH.checked_add(Duration::from_secs(parse_http_date(value)?))?;
    let wait = at.duration_since(now).unwrap_or(Duration::ZERO);
    crate::duration::seconds("retry-after", wait.as_secs_f64()).ok()
}

const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

/// Seconds since the Unix epoch of an IMF-fixdate.
fn parse_http_date(s: &str) -> Option<u64> {
    let (_weekday, rest) = s.split_once(", ")?;
    let parts: Vec<&str> = rest.split_whitespace().collect();
    let [day, month, year, time, "GMT"] = parts.as_slice() else {
        return None;
    };
    let day: i64 = day.parse().ok().filter(|d| (1..=31).contains(d))?;
    let month = MONTHS.iter().position(|m| m == month)? as i64 + 1;
    let year: i64 = year.parse().ok().filter(|y| *y >= 1970)?;
    let hms: Vec<i64> = time
        .split(':')
        .map(|p| p.parse::<i64>().ok())
        .collect::<Option<_>>()?;
    let [h, m, sec] = hms.as_slice() else {
        return None;
    };
    if !(0..24).contains(h) || !(0..60).contains(m) || !(0..=60).contains(sec) {
        return None;
    }
    let days = days_from_civil(year, month, day);
    u64::try_from(days * 86_400 + h * 3600 + m * 60 + sec).ok()
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Sends one POST and reads the whole JSON answer (no streaming), bounded by the request
/// deadline. Statuses, timeouts and transport failures map to the same errors as
/// [`sse_stream`].
pub(crate) async fn post_json(call: HttpCall) -> Result<serde_json::Value, LlmError> {
    let HttpCall {
        client,
        url,
        headers,
        body,
        request_timeout,
        idle_timeout: _,
        redactor,
    } = call;
    let deadline = Instant::now() + request_timeout;
    let send = client.post(&url).headers(headers).json(&body).send();
    let resp = bounded(send, request_timeout, deadline, request_timeout)
        .await?
        .map_err(|e| transport_error(&e, &redactor))?;
    let status = resp.status();
    if !status.is_success() {
        let retry_after = retry_after_of(resp.headers(), SystemTime::now());
        let body = read_error_body(resp, request_timeout, deadline, request_timeout).await;
        return Err(status_error(status.as_u16(), retry_after, &body, &redactor));
    }
    let bytes = bounded(resp.bytes(), request_timeout, deadline, request_timeout)
        .await?
        .map_err(|e| transport_error(&e, &redactor))?;
    serde_json::from_slice(&bytes).map_err(|e| LlmError::BadSse {
        reason: format!(
            "the non-streaming answer is not JSON ({e}): {}",
            redactor.apply(&String::from_utf8_lossy(&bytes[..bytes.len().min(200)]))
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_lengths_count_across_chunks_and_both_line_ends() {
        assert_eq!(line_lengths(0, b"data: x\n\n"), (7, 0));
        assert_eq!(line_lengths(0, b"data: x"), (7, 7));
        // The open line goes on in the next chunk.
        assert_eq!(line_lengths(7, b"yz\ndata"), (9, 4));
        assert_eq!(line_lengths(3, b"ab\r\n"), (5, 0));
        assert_eq!(line_lengths(3, b"abcdef"), (9, 9));
        // A long line inside one chunk counts, even when the chunk ends a line.
        let mut chunk = vec![b'x'; 100];
        chunk.push(b'\n');
        assert_eq!(line_lengths(0, &chunk), (100, 0));
        assert_eq!(line_lengths(5, b""), (5, 5));
    }

    #[test]
    fn retry_after_seconds_and_dates() {
        let now = UNIX_EPOCH + Duration::from_secs(784_111_777); // Sun, 06 Nov 1994 08:49:37 GMT
        assert_eq!(parse_retry_after("7", now), Some(Duration::from_secs(7)));
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:47 GMT", now),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("-3", now), None);
        assert_eq!(
            parse_retry_after("Sun, 06 Foo 1994 08:49:47 GMT", now),
            None
        );
    }

    #[test]
    fn hostile_retry_after_values_are_ignored_not_panics() {
        let now = UNIX_EPOCH + Duration::from_secs(784_111_777);
        let mut h = HeaderMap::new();
        for ms in ["1e300", "-5", "NaN", "inf", "1e30"] {
            h.insert("retry-after-ms", ms.parse().unwrap());
            assert_eq!(retry_after_of(&h, now), None, "retry-after-ms: {ms}");
        }
        h.insert("retry-after-ms", "1500".parse().unwrap());
        assert_eq!(retry_after_of(&h, now), Some(Duration::from_millis(1500)));
        assert_eq!(parse_retry_after("99999999999999999999", now), None);
        assert_eq!(parse_retry_after("999999999999", now), None);
    }

    #[test]
    fn context_overflow_answers_are_recognised() {
        let r = Redactor::new(Vec::<&str>::new());
        let openai = r#"{"error":{"message":"This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#;
        let llama = r#"{"error":{"code":400,"message":"the request exceeds the available context size, try increasing it","type":"exceed_context_size_error","n_prompt_tokens":9000,"n_ctx":8192}}"#;
        let anthropic = r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 208310 tokens > 200000 maximum"}}"#;
        for body in [openai, llama, anthropic] {
            let e = status_error(400, None, body, &r);
            assert_eq!(e.code(), "llm.context_overflow", "{body}");
            assert!(!e.is_retryable() && !e.falls_back(), "{body}");
        }
        let other = r#"{"error":{"message":"invalid value for temperature"}}"#;
        assert_eq!(status_error(400, None, other, &r).code(), "llm.http_status");
        assert_eq!(
            status_error(503, None, anthropic, &r).code(),
            "llm.http_status"
        );
    }

    #[test]
    fn error_message_prefers_json_and_redacts() {
        let r = Redactor::new(["sk-123"]);
        assert_eq!(
            error_message(r#"{"error":{"message":"bad key sk-123"}}"#, &r),
            "bad key [REDACTED]"
        );
        assert_eq!(
            error_message("plain sk-123 text", &r),
            "plain [REDACTED] text"
        );
        let long = "x".repeat(2000);
        assert_eq!(error_message(&long, &r).chars().count(), 501);
    }
}
