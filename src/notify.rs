//! Notifications to the operator's webhook (`notify.webhook` in the operator's config, never a
//! goal's): each `approval_requested` of a run becomes one POST of a Slack-compatible body
//! (`{"text": ..., "blocks": [...]}`, plus the plain fields `event`, `run_id`, `call_id`,
//! `tool`, `link`), retried with a doubling wait until it is answered with a 2xx.
//!
//! Never in the way of a run: a run's watcher only reads its events and hands notifications to
//! one delivery task through a queue kept per principal (who submitted the run; the operator's
//! own runs, with none, are one more), each bounded (full: that principal's newest notification
//! is dropped and logged), delivered in turn, so one client's flood of asked calls never delays
//! or drops another's notification, the operator's included.
//! Deliberately not here: who configures the URL (the config) or what the page shows.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::Notify;

use crate::engine::RunHandle;
use crate::protocol::EventKind;

/// `notify` in the operator's config.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NotifyConfig {
    /// Where `approval_requested` notifications are posted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook: Option<WebhookConfig>,
}

/// `notify.webhook`: `{url, page_url?, attempts?, backoff_ms?, timeout_s?}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookConfig {
    /// The receiver (http or https), e.g. a Slack incoming webhook.
    pub url: String,
    /// The page's address as reviewers reach it (default: the server's listening address).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_url: Option<String>,
    /// How many times one notification is tried (default 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u32>,
    /// The wait before the second try, doubled for each next one (default 500 ms, at most 60 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff_ms: Option<u64>,
    /// How long one try may take, in seconds (default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<f64>,
}

/// A webhook that cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum NotifyError {
    /// The URL is not an absolute http(s) URL.
    #[error("notify.webhook.url must be an http or https URL, found `{url}`")]
    BadUrl {
        /// The URL as given.
        url: String,
    },
    /// `timeout_s` out of range.
    #[error("notify.webhook.timeout_s: {reason}")]
    BadTimeout {
        /// Why.
        reason: String,
    },
}

crate::codes::has_code!(NotifyError);

impl NotifyError {
    /// A stable code.
    pub fn code(&self) -> &'static str {
        match self {
            NotifyError::BadUrl { .. } => "notify.bad_url",
            NotifyError::BadTimeout { .. } => "notify.bad_timeout",
        }
    }
}

/// Queued notifications of one principal at most; past that its new ones are dropped (and
/// logged).
const QUEUE: usize = 256;
/// The longest wait between two tries.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// A webhook ready to post to: one delivery task, fed through [`Fair`] queues.
#[derive(Debug, Clone)]
pub struct Notifier {
    tx: Arc<Sender>,
    page: Option<String>,
}

/// The notifications waiting, one queue per principal, taken in turn.
#[derive(Debug, Default)]
struct Fair {
    queues: Mutex<FairState>,
    ready: Notify,
}

#[derive(Debug, Default)]
struct FairState {
    /// By principal (`""`: runs nobody submitted, the operator's).
    waiting: BTreeMap<String, VecDeque<Value>>,
    /// Whose turn is next, in order.
    turns: VecDeque<String>,
    /// Every sender is gone: deliver what is left, then end.
    closed: bool,
}

impl Fair {
    fn lock(&self) -> std::sync::MutexGuard<'_, FairState> {
        match self.queues.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// Queues `body` for `principal`; false when that principal's queue is full.
    fn push(&self, principal: &str, body: Value) -> bool {
        let mut st = self.lock();
        let q = st.waiting.entry(principal.to_string()).or_default();
        if q.len() >= QUEUE {
            return false;
        }
        q.push_back(body);
        if q.len() == 1 {
            st.turns.push_back(principal.to_string());
        }
        drop(st);
        self.ready.notify_one();
        true
    }

    /// The next notification, principals in turn; None once closed and empty.
    async fn pop(&self) -> Option<Value> {
        loop {
            let notified = self.ready.notified();
            {
                let mut st = self.lock();
                while let Some(who) = st.turns.pop_front() {
                    let Some(q) = st.waiting.get_mut(&who) else {
                        continue;
                    };
                    let Some(body) = q.pop_front() else {
                        st.waiting.remove(&who);
                        continue;
                    };
                    if q.is_empty() {
                        st.waiting.remove(&who);
                    } else {
                        st.turns.push_back(who);
                    }
                    return Some(body);
                }
                if st.closed {
                    return None;
                }
            }
            notified.await;
        }
    }
}

/// The senders' share of the queues: when the last [`Notifier`] clone (and watcher) is gone,
/// the queues close and the delivery task ends once they are empty.
#[derive(Debug)]
struct Sender(Arc<Fair>);

impl Drop for Sender {
    fn drop(&mut self) {
        self.0.lock().closed = true;
        self.0.ready.notify_one();
    }
}

/// The delivery task of a [`Notifier`] started by [`Notifier::start_owned`]: a process that
/// ends with its run waits on it so that the notifications already queued go out.
#[derive(Debug)]
pub struct Deliveries(tokio::task::JoinHandle<()>);

impl Deliveries {
    /// Waits (at most `within`) until every queued notification was delivered or given up;
    /// every [`Notifier`] clone and watcher must be gone for it to end. False when cut short.
    pub async fn finish(mut self, within: Duration) -> bool {
        match tokio::time::timeout(within, &mut self.0).await {
            Ok(_) => true,
            Err(_) => {
                self.0.abort();
                false
            }
        }
    }
}

impl WebhookConfig {
    /// Checks the settings (the URL's scheme, the timeout).
    pub fn check(&self) -> Result<(), NotifyError> {
        let ok = self
            .url
            .parse::<reqwest::Url>()
            .is_ok_and(|u| matches!(u.scheme(), "http" | "https"));
        if !ok {
            return Err(NotifyError::BadUrl {
                url: self.url.clone(),
            });
        }
        if let Some(t) = self.timeout_s {
            crate::duration::seconds("notify.webhook.timeout_s", t).map_err(|e| {
                NotifyError::BadTimeout {
                    reason: e.to_string(),
                }
            })?;
        }
        Ok(())
    }
}

impl WebhookConfig {
    /// Posts `body` once (a Temporal worker's `notify` activity; Temporal retries it): Err with
    /// why when the receiver was not reached or did not answer with a 2xx.
    pub async fn post_once(&self, body: &Value) -> Result<(), String> {
        self.check().map_err(|e| e.to_string())?;
        let timeout = self
            .timeout_s
            .and_then(|t| crate::duration::seconds("timeout_s", t).ok())
            .unwrap_or(Duration::from_secs(10));
        let client = crate::net::builder()
            .timeout(timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| e.to_string())?;
        match client.post(&self.url).json(body).send().await {
            Ok(r) if r.status().is_success() => Ok(()),
            Ok(r) => Err(format!("the webhook answered {}", r.status().as_u16())),
            Err(e) => Err(format!("the webhook is unreachable: {e}")),
        }
    }
}

impl Notifier {
    /// Starts the delivery task (needs a tokio runtime).
    pub fn start(cfg: &WebhookConfig) -> Result<Notifier, NotifyError> {
        Notifier::start_owned(cfg).map(|(n, _)| n)
    }

    /// Starts the delivery task and returns it too, for a process that waits for it to end.
    pub fn start_owned(cfg: &WebhookConfig) -> Result<(Notifier, Deliveries), NotifyError> {
        cfg.check()?;
        let timeout = cfg
            .timeout_s
            .and_then(|t| crate::duration::seconds("timeout_s", t).ok())
            .unwrap_or(Duration::from_secs(10));
        let client = crate::net::builder()
            .timeout(timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| NotifyError::BadUrl {
                url: format!("{} ({e})", cfg.url),
            })?;
        let fair = Arc::new(Fair::default());
        let attempts = cfg.attempts.unwrap_or(5).max(1);
        let backoff = Duration::from_millis(cfg.backoff_ms.unwrap_or(500));
        let task = tokio::spawn(deliver(
            client,
            cfg.url.clone(),
            fair.clone(),
            attempts,
            backoff,
        ));
        Ok((
            Notifier {
                tx: Arc::new(Sender(fair)),
                page: cfg.page_url.clone(),
            },
            Deliveries(task),
        ))
    }

    /// The page's address: the configured `page_url`, else `default` (empty: no page, so the
    /// notifications carry no link).
    pub fn page<'a>(&'a self, default: &'a str) -> &'a str {
        self.page.as_deref().unwrap_or(default)
    }

    /// Watches a run: every `approval_requested` published after `since` (milliseconds since
    /// the epoch; 0 for a new run) is posted. Ends with the run's events.
    pub fn watch(&self, handle: &RunHandle, page: &str, since: u64) -> tokio::task::JoinHandle<()> {
        self.watch_for(handle, page, since, None)
    }

    /// [`watch`](Self::watch) for a run `principal` submitted: its notifications wait in that
    /// principal's queue (None: the operator's).
    pub fn watch_for(
        &self,
        handle: &RunHandle,
        page: &str,
        since: u64,
        principal: Option<&str>,
    ) -> tokio::task::JoinHandle<()> {
        let tx = self.tx.clone();
        let principal = principal.unwrap_or_default().to_string();
        let page = self.page(page).trim_end_matches('/').to_string();
        let mut events = handle.subscribe_from(0);
        tokio::spawn(async move {
            while let Some(ev) = events.recv().await {
                let (
                    EventKind::ApprovalRequested {
                        call,
                        interrupted,
                        rule,
                        ..
                    },
                    Some(id),
                ) = (&ev.kind, ev.call)
                else {
                    continue;
                };
                if ev.at < since {
                    continue;
                }
                let body = approval_body(
                    &ev.run_id,
                    id.0,
                    &call.tool,
                    *interrupted,
                    rule.as_deref(),
                    &page,
                );
                if !tx.0.push(&principal, body) {
                    tracing::warn!(run = %ev.run_id, call = %id, principal = %principal,
                        "this principal's webhook queue is full: notification dropped");
                }
            }
        })
    }
}

/// The Slack-compatible body of one `approval_requested` notification; `page` empty: no link
/// (a run driven by `dagloop run` with no `page_url` configured).
pub fn approval_body(
    run: &str,
    call: u64,
    tool: &str,
    interrupted: bool,
    rule: Option<&str>,
    page: &str,
) -> Value {
    let link = (!page.is_empty()).then(|| format!("{page}/?run={run}&call={call}"));
    // Slack reads `text` and the section as mrkdwn: names a goal chose are escaped so they
    // cannot make a link (`<https://x|label>`) or a mention (`<!channel>`).
    let (tool_m, run_m) = (mrkdwn_escape(tool), mrkdwn_escape(run));
    let mut text = format!("dagloop: call c{call} (`{tool_m}`) of run {run_m} awaits approval");
    if interrupted {
        text.push_str(" (interrupted by a restart)");
    }
    if let Some(r) = rule {
        text.push_str(&format!(", asked by {}", mrkdwn_escape(r)));
    }
    let (plain, mrkdwn) = match link.as_deref().map(mrkdwn_escape) {
        Some(l) => (
            format!("{text}: {l}"),
            format!("{text}\n<{l}|Open the reviewer's page>"),
        ),
        None => (
            format!("{text} (decide with `dagloop decide {run_m} {call} ...`)"),
            format!("{text}\n`dagloop decide {run_m} {call} approve`"),
        ),
    };
    json!({
        "text": plain,
        "blocks": [{
            "type": "section",
            "text": {"type": "mrkdwn", "text": mrkdwn}
        }],
        "event": "approval_requested",
        "run_id": run,
        "call_id": call,
        "tool": tool,
        "link": link,
    })
}

/// `text` with Slack's control characters escaped (`&`, `<`, `>`), as Slack's mrkdwn wants.
pub fn mrkdwn_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

async fn deliver(
    client: reqwest::Client,
    url: String,
    queue: Arc<Fair>,
    attempts: u32,
    backoff: Duration,
) {
    let client = Arc::new(client);
    while let Some(body) = queue.pop().await {
        let mut wait = backoff;
        for attempt in 1..=attempts {
            let sent = client.post(&url).json(&body).send().await;
            match sent {
                Ok(r) if r.status().is_success() => break,
                Ok(r) => tracing::warn!(
                    attempt,
                    status = r.status().as_u16(),
                    "webhook refused the notification"
                ),
                Err(e) => tracing::warn!(attempt, "webhook unreachable: {e}"),
            }
            if attempt < attempts {
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(MAX_BACKOFF);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[tokio::test]
    async fn principals_take_turns_and_the_queue_ends_with_its_senders() {
        let fair = Arc::new(Fair::default());
        let tx = Sender(fair.clone());
        for i in 0..3 {
            assert!(tx.0.push("flood", json!(i)));
        }
        assert!(tx.0.push("", json!("own")));
        for i in 3..QUEUE {
            assert!(tx.0.push("flood", json!(i)));
        }
        assert!(!tx.0.push("flood", json!("over")), "a full queue refuses");
        assert!(tx.0.push("", json!("own 2")), "another principal's is not full");
        let first: Vec<Value> = [fair.pop().await, fair.pop().await, fair.pop().await]
            .into_iter()
            .flatten()
            .collect();
        assert_eq!(first, vec![json!(0), json!("own"), json!(1)]);
        drop(tx);
        let mut rest = 0;
        while fair.pop().await.is_some() {
            rest += 1;
        }
        assert_eq!(rest, QUEUE - 2 + 1, "what was queued is delivered, then it ends");
    }

    #[test]
    fn mrkdwn_control_characters_are_escaped() {
        assert_eq!(
            mrkdwn_escape("<!channel> <https://x|y> & z"),
            "&lt;!channel&gt; &lt;https://x|y&gt; &amp; z"
        );
    }
}
