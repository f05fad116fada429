//! Retries of failed model attempts (protocol rule 17): exponential backoff with jitter,
//! honouring `Retry-After`, bounded attempts, and only for retryable errors that happen before
//! the attempt delivered any content (text or tool-call pieces). Once content has reached the
//! caller a failure is final, because the caller may already have acted on it.
//!
//! Waiting uses tokio time, so tests run under a paused clock. Jitter is injectable: a seeded
//! hash (deterministic) or none. It does not decide what a malformed Solution means.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;

use super::{EventStream, LlmError, Model, Request, StreamEvent};

/// How the backoff delay is randomised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Jitter {
    /// The exact exponential delay.
    None,
    /// "Equal jitter": half the delay plus a pseudo-random part of the other half, from a hash
    /// of this seed and the attempt number (deterministic for a given seed).
    Seeded(u64),
}

impl Jitter {
    /// Seeded from the wall clock and the process id, for production use.
    pub fn from_entropy() -> Jitter {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Jitter::Seeded(splitmix64(
            nanos ^ u64::from(std::process::id()).rotate_left(32),
        ))
    }

    /// Applies the jitter to a delay; `salt` varies it between attempts.
    pub fn apply(&self, delay: Duration, salt: u64) -> Duration {
        match self {
            Jitter::None => delay,
            Jitter::Seeded(seed) => {
                let frac = (splitmix64(seed ^ splitmix64(salt)) >> 11) as f64 / (1u64 << 53) as f64;
                delay / 2 + (delay / 2).mul_f64(frac)
            }
        }
    }
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// When and how often to retry.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Attempts in total, the first included (default 4).
    pub max_attempts: u32,
    /// Delay after the first failed attempt, doubled after each further one (default 500 ms).
    pub base_delay: Duration,
    /// Cap on the exponential delay (default 20 s).
    pub max_delay: Duration,
    /// A `Retry-After` longer than this is not waited for: the error is returned (default 60 s).
    pub max_retry_after: Duration,
    /// Randomisation of the exponential delay (not of `Retry-After`).
    pub jitter: Jitter,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 4,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(20),
            max_retry_after: Duration::from_secs(60),
            jitter: Jitter::from_entropy(),
        }
    }
}

impl RetryPolicy {
    /// The delay before retrying after failed attempt number `attempt` (1-based) with `err`, or
    /// None when it must not be retried.
    pub fn delay_for(&self, err: &LlmError, attempt: u32, salt: u64) -> Option<Duration> {
        if !err.is_retryable() || attempt >= self.max_attempts {
            return None;
        }
        if let Some(after) = err.retry_after() {
            return (after <= self.max_retry_after).then_some(after);
        }
        let factor = 2u32.saturating_pow(attempt.saturating_sub(1));
        let exp = self.base_delay.saturating_mul(factor).min(self.max_delay);
        Some(self.jitter.apply(exp, salt))
    }
}

/// What a retry reports before it waits.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryNotice {
    /// The model's display name.
    pub model: String,
    /// The attempt that failed (1-based).
    pub attempt: u32,
    /// How long it waits before the next attempt.
    pub delay: Duration,
    /// Why the attempt failed.
    pub error: LlmError,
}

type Notify = Arc<dyn Fn(&RetryNotice) + Send + Sync>;

/// Wraps a model with the retry policy.
pub struct Retrying<M: ?Sized> {
    inner: Arc<M>,
    policy: RetryPolicy,
    attempts: Arc<AtomicU64>,
    notify: Option<Notify>,
}

impl<M: ?Sized> Clone for Retrying<M> {
    fn clone(&self) -> Self {
        Retrying {
            inner: self.inner.clone(),
            policy: self.policy.clone(),
            attempts: self.attempts.clone(),
            notify: self.notify.clone(),
        }
    }
}

impl<M: Model + ?Sized> fmt::Debug for Retrying<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Retrying")
            .field("model", &self.inner.name())
            .field("policy", &self.policy)
            .field("attempts", &self.attempts.load(Ordering::SeqCst))
            .finish()
    }
}

impl<M: Model + ?Sized + 'static> Retrying<M> {
    /// Wraps `inner` with `policy`.
    pub fn new(inner: Arc<M>, policy: RetryPolicy) -> Retrying<M> {
        Retrying {
            inner,
            policy,
            attempts: Arc::new(AtomicU64::new(0)),
            notify: None,
        }
    }

    /// Calls `f` before each retry (the engine turns it into an event; tests count with it).
    pub fn on_retry(mut self, f: impl Fn(&RetryNotice) + Send + Sync + 'static) -> Retrying<M> {
        self.notify = Some(Arc::new(f));
        self
    }

    /// Attempts started so far, over all requests.
    pub fn attempts(&self) -> u64 {
        self.attempts.load(Ordering::SeqCst)
    }

    /// The policy in use.
    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }
}

struct State<M: ?Sized> {
    inner: Arc<M>,
    /// Each attempt is asked without streaming ([`Model::stream_whole`]).
    whole: bool,
    req: Arc<Request>,
    policy: RetryPolicy,
    attempts: Arc<AtomicU64>,
    notify: Option<Notify>,
    attempt: u32,
    current: Option<EventStream>,
    content_seen: bool,
    finished: bool,
    wait: Option<Duration>,
}

impl<M: Model + ?Sized + 'static> Model for Retrying<M> {
    fn stream(&self, req: &Request) -> EventStream {
        self.stream_shared(Arc::new(req.clone()))
    }

    fn stream_shared(&self, req: Arc<Request>) -> EventStream {
        self.retrying(req, false)
    }

    fn stream_whole(&self, req: Arc<Request>) -> EventStream {
        self.retrying(req, true)
    }

    fn name(&self) -> String {
        self.inner.name()
    }

    fn resume_after(&self, attempts: usize) {
        self.inner.resume_after(attempts);
    }
}

impl<M: Model + ?Sized + 'static> Retrying<M> {
    /// Attempts `req` under the policy, each attempt streamed or (`whole`) not.
    fn retrying(&self, req: Arc<Request>, whole: bool) -> EventStream {
        let state = State {
            whole,
            inner: self.inner.clone(),
            req,
            policy: self.policy.clone(),
            attempts: self.attempts.clone(),
            notify: self.notify.clone(),
            attempt: 0,
            current: None,
            content_seen: false,
            finished: false,
            wait: None,
        };
        futures::stream::unfold(state, |mut s| async move {
            {
                if s.finished {
                    return None;
                }
                if let Some(d) = s.wait.take() {
                    tokio::time::sleep(d).await;
                }
                let stream = match s.current.as_mut() {
                    Some(stream) => stream,
                    None => {
                        s.attempt += 1;
                        s.attempts.fetch_add(1, Ordering::SeqCst);
                        let attempt = if s.whole {
                            s.inner.stream_whole(s.req.clone())
                        } else {
                            s.inner.stream_shared(s.req.clone())
                        };
                        s.current.insert(attempt)
                    }
                };
                match stream.next().await {
                    None => None,
                    Some(Ok(ev)) => {
                        s.content_seen |= ev.is_content();
                        Some((Ok(ev), s))
                    }
                    Some(Err(e)) => {
                        let salt = s.attempts.load(Ordering::SeqCst);
                        let delay = (!s.content_seen)
                            .then(|| s.policy.delay_for(&e, s.attempt, salt))
                            .flatten();
                        let Some(delay) = delay else {
                            s.finished = true;
                            return Some((Err(e), s));
                        };
                        let notice = RetryNotice {
                            model: s.inner.name(),
                            attempt: s.attempt,
                            delay,
                            error: e,
                        };
                        tracing::warn!(
                            model = %notice.model,
                            attempt = notice.attempt,
                            delay_ms = notice.delay.as_millis() as u64,
                            code = notice.error.code(),
                            error = %notice.error,
                            "retrying model request"
                        );
                        if let Some(f) = &s.notify {
                            f(&notice);
                        }
                        s.current = None;
                        s.wait = Some(delay);
                        let status = match &notice.error {
                            LlmError::HttpStatus { status, .. } => Some(*status),
                            _ => None,
                        };
                        let ev = StreamEvent::Retry {
                            attempt: notice.attempt,
                            status,
                            wait: delay,
                            error: notice.error.to_string(),
                        };
                        Some((Ok(ev), s))
                    }
                }
            }
        })
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(s: u16) -> LlmError {
        LlmError::HttpStatus {
            status: s,
            retry_after: None,
            message: String::new(),
        }
    }

    #[test]
    fn only_transient_statuses_are_retried() {
        let p = RetryPolicy {
            jitter: Jitter::None,
            ..RetryPolicy::default()
        };
        for s in [408, 409, 429, 500, 502, 503, 529] {
            assert!(p.delay_for(&status(s), 1, 0).is_some(), "{s}");
        }
        for s in [400, 401, 403, 404, 422] {
            assert!(p.delay_for(&status(s), 1, 0).is_none(), "{s}");
        }
    }

    #[test]
    fn backoff_doubles_is_capped_and_bounded() {
        let p = RetryPolicy {
            max_attempts: 10,
            base_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(5),
            jitter: Jitter::None,
            ..RetryPolicy::default()
        };
        let e = status(500);
        let ds: Vec<_> = (1..=5).map(|a| p.delay_for(&e, a, 0).unwrap()).collect();
        let secs: Vec<u64> = ds.iter().map(Duration::as_secs).collect();
        assert_eq!(secs, vec![1, 2, 4, 5, 5]);
        assert!(p.delay_for(&e, 10, 0).is_none());
    }

    #[test]
    fn retry_after_is_honoured_up_to_the_cap() {
        let p = RetryPolicy::default();
        let e = |s| LlmError::HttpStatus {
            status: 429,
            retry_after: Some(Duration::from_secs(s)),
            message: String::new(),
        };
        assert_eq!(p.delay_for(&e(7), 1, 0), Some(Duration::from_secs(7)));
        assert_eq!(p.delay_for(&e(3600), 1, 0), None);
    }

    #[test]
    fn seeded_jitter_is_deterministic_and_within_half_to_full() {
        let j = Jitter::Seeded(42);
        let d = Duration::from_secs(10);
        let a: Vec<_> = (0..50).map(|s| j.apply(d, s)).collect();
        let b: Vec<_> = (0..50).map(|s| j.apply(d, s)).collect();
        assert_eq!(a, b);
        assert!(a.iter().all(|x| *x >= d / 2 && *x <= d));
        assert!(a.iter().any(|x| *x != a[0]), "jitter varies with the salt");
    }
}
