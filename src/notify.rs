//! Notifications to the operator's webhook (`notify.webhook` in the operator's config, never a
//! goal's): each `approval_requested` of a run becomes one POST of a Slack-compatible body
//! (`{"text": ..., "blocks": [...]}`, plus the plain fields `event`, `run_id`, `call_id`,
//! `tool`, `link`), retried with a doubling wait until it is answered with a 2xx.
//!
//! Never in the way of a run: a run's watcher only reads its events and hands notifications to
//! one delivery task through a bounded queue (full: the notification is dropped and logged).
//! Deliberately not here: who configures the URL (the config) or what the page shows.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::mpsc;

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

/// Queued notifications at most; past that new ones are dropped (and logged).
const QUEUE: usize = 1024;
/// The longest wait between two tries.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// A webhook ready to post to: one delivery task, fed through a bounded queue.
#[derive(Debug, Clone)]
pub struct Notifier {
    tx: mpsc::Sender<Value>,
    page: Option<String>,
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
        let (tx, rx) = mpsc::channel(QUEUE);
        let attempts = cfg.attempts.unwrap_or(5).max(1);
        let backoff = Duration::from_millis(cfg.backoff_ms.unwrap_or(500));
        let task = tokio::spawn(deliver(client, cfg.url.clone(), rx, attempts, backoff));
        Ok((
            Notifier {
                tx,
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
        let tx = self.tx.clone();
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
                if tx.try_send(body).is_err() {
                    tracing::warn!(run = %ev.run_id, call = %id, "webhook queue full: notification dropped");
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
    mut rx: mpsc::Receiver<Value>,
    attempts: u32,
    backoff: Duration,
) {
    let client = Arc::new(client);
    while let Some(body) = rx.recv().await {
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
