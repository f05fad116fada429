//! Live progress of a run on stderr: one updating line on a terminal (never over an open
//! reviewer prompt), plain lines otherwise; a summary line at the end.
//!
//! Calls are shown by id and tool (running ones with their last progress report); failures with
//! their code and message; decisions in words; done, failed, rejected, unresolved, refused and
//! cancelled are counted apart.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use serde_json::Value;

use super::review::Screen;
use crate::engine::Subscription;
use crate::protocol::{CallId, Decision, EventKind};

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Phase {
    Pending,
    Asking,
    Running,
    Done,
    Failed,
    Rejected,
    Unresolved,
    Refused,
    Cancelled,
}

impl Phase {
    fn word(self) -> &'static str {
        match self {
            Phase::Pending => "pending",
            Phase::Asking => "awaiting approval",
            Phase::Running => "running",
            Phase::Done => "done",
            Phase::Failed => "failed",
            Phase::Rejected => "rejected",
            Phase::Unresolved => "unresolved",
            Phase::Refused => "refused",
            Phase::Cancelled => "cancelled",
        }
    }
}

struct CallView {
    tool: String,
    phase: Phase,
    started: Option<u64>,
    /// The last progress report: progress and total.
    progress: Option<(f64, Option<f64>)>,
}

/// Each call's phase (keyed by call id, so any event order keeps the counts right).
#[derive(Default)]
struct Counts {
    step: u32,
    calls: BTreeMap<CallId, CallView>,
}

impl Counts {
    fn set(&mut self, id: Option<CallId>, tool: Option<&str>, phase: Phase) {
        let Some(id) = id else { return };
        let v = self.calls.entry(id).or_insert_with(|| CallView {
            tool: String::new(),
            phase,
            started: None,
            progress: None,
        });
        if let Some(t) = tool {
            v.tool = t.to_string();
        }
        v.phase = phase;
    }

    fn tool(&self, id: Option<CallId>) -> String {
        id.and_then(|i| self.calls.get(&i))
            .map(|c| c.tool.clone())
            .unwrap_or_default()
    }

    fn counts(&self) -> String {
        let mut by: BTreeMap<Phase, usize> = BTreeMap::new();
        for c in self.calls.values() {
            *by.entry(c.phase).or_default() += 1;
        }
        let parts: Vec<String> = by
            .iter()
            .filter(|(p, _)| !matches!(p, Phase::Running))
            .map(|(p, n)| format!("{n} {}", p.word()))
            .collect();
        parts.join(", ")
    }

    fn line(&self, now: u64) -> String {
        let running: Vec<String> = self
            .calls
            .iter()
            .filter(|(_, c)| c.phase == Phase::Running)
            .take(3)
            .map(|(id, c)| {
                let secs = c
                    .started
                    .map_or(0.0, |s| now.saturating_sub(s) as f64 / 1000.0);
                let done = c
                    .progress
                    .map(|(p, t)| format!(" {}", progress_words(p, t)))
                    .unwrap_or_default();
                format!("{id} {} {secs:.1}s{done}", c.tool)
            })
            .collect();
        let n_running = self
            .calls
            .values()
            .filter(|c| c.phase == Phase::Running)
            .count();
        let more = if n_running > running.len() {
            format!(" +{}", n_running - running.len())
        } else {
            String::new()
        };
        format!(
            "step {} · running: {}{more} · {}",
            self.step,
            if running.is_empty() {
                "none".to_string()
            } else {
                running.join(", ")
            },
            self.counts()
        )
    }
}

fn decision_words(d: &Decision, timed_out: bool) -> String {
    let w = match d {
        Decision::Approve => "approved".to_string(),
        Decision::Edit { .. } => "approved with edited params".to_string(),
        Decision::Replace { call } => format!("replaced by a call to {}", call.tool),
        Decision::Reject { reason } => format!("rejected ({reason})"),
        Decision::SendBack { feedback } => format!("sent back to the model ({feedback})"),
        Decision::Done { .. } => "marked done with a supplied result".into(),
    };
    if timed_out {
        format!("{w}, by the policy after the reviewer's time ran out")
    } else {
        w
    }
}

/// `3/5`, or `3` without a total (whole numbers without decimals).
fn progress_words(progress: f64, total: Option<f64>) -> String {
    let n = |x: f64| {
        if x.fract() == 0.0 && x.abs() < 1e15 {
            format!("{x:.0}")
        } else {
            format!("{x}")
        }
    };
    match total {
        Some(t) => format!("{}/{}", n(progress), n(t)),
        None => n(progress),
    }
}

fn error_words(e: &Value) -> String {
    let code = e["code"].as_str().unwrap_or("error");
    let msg = e["message"]
        .as_str()
        .or_else(|| e["error"].as_str())
        .unwrap_or("");
    let msg: String = msg.chars().take(160).collect();
    format!("{code}: {msg}")
}

/// Prints progress until the run ends; on a terminal, never over an open reviewer prompt.
pub(super) async fn show(mut events: Subscription, tty: bool, screen: Arc<Screen>) {
    let mut c = Counts::default();
    let mut last_at = 0;
    while let Some(ev) = events.recv().await {
        if ev.parent.is_none() {
            c.step = c.step.max(ev.step);
        }
        last_at = last_at.max(ev.at);
        let id = ev.call;
        let name = id.map(|i| i.to_string()).unwrap_or_default();
        let plain: Option<String> = match &ev.kind {
            EventKind::CallReceived { call } => {
                c.set(id, Some(&call.tool), Phase::Pending);
                Some(format!("{name} {} received", call.tool))
            }
            EventKind::ApprovalRequested { .. } => {
                c.set(id, None, Phase::Asking);
                Some(format!("{name} {} awaits approval", c.tool(id)))
            }
            EventKind::Decision {
                decision,
                timed_out,
                ..
            } => Some(format!(
                "{name} {}: {}",
                c.tool(id),
                decision_words(decision, *timed_out)
            )),
            EventKind::Started { tool, .. } => {
                c.set(id, Some(tool.as_str()), Phase::Running);
                if let Some(v) = id.and_then(|i| c.calls.get_mut(&i)) {
                    v.started = Some(ev.at);
                }
                Some(format!("{name} {tool} started"))
            }
            EventKind::CallProgress {
                progress,
                total,
                message,
            } => {
                if let Some(v) = id.and_then(|i| c.calls.get_mut(&i)) {
                    v.progress = Some((*progress, *total));
                }
                Some(format!(
                    "{name} {} progress {}{}",
                    c.tool(id),
                    progress_words(*progress, *total),
                    message
                        .as_deref()
                        .map(|m| format!(": {m}"))
                        .unwrap_or_default()
                ))
            }
            EventKind::Finished { .. } => {
                let took = id
                    .and_then(|i| c.calls.get(&i))
                    .and_then(|v| v.started)
                    .map(|s| format!(" in {} ms", ev.at.saturating_sub(s)))
                    .unwrap_or_default();
                c.set(id, None, Phase::Done);
                Some(format!("{name} {} done{took}", c.tool(id)))
            }
            EventKind::Failed { error, kind } => {
                let phase = if kind.as_str() == "rejected" {
                    Phase::Rejected
                } else {
                    Phase::Failed
                };
                c.set(id, None, phase);
                Some(format!(
                    "{name} {} {} — {}",
                    c.tool(id),
                    phase.word(),
                    error_words(error)
                ))
            }
            EventKind::Unresolved { missing } => {
                c.set(id, None, Phase::Unresolved);
                Some(format!(
                    "{name} {} unresolved: nothing wrote {}",
                    c.tool(id),
                    missing.join(", ")
                ))
            }
            EventKind::CallRefused { reason, .. } => {
                c.set(id, None, Phase::Refused);
                Some(format!("{name} refused: {reason}"))
            }
            EventKind::Cancelled => {
                c.set(id, None, Phase::Cancelled);
                Some(format!("{name} {} cancelled", c.tool(id)))
            }
            EventKind::RequestStarted { attempt } if ev.parent.is_none() => Some(if *attempt > 1 {
                format!(
                    "step {}: asking the model again (attempt {attempt})",
                    ev.step
                )
            } else {
                format!("step {}: asking the model", ev.step)
            }),
            EventKind::ModelRetry {
                attempt,
                status,
                wait_ms,
                error,
            } => Some(format!(
                "model attempt {attempt} failed{}: {error}; retrying in {wait_ms} ms",
                status.map(|s| format!(" (HTTP {s})")).unwrap_or_default()
            )),
            EventKind::ModelFallback {
                from, to, error, ..
            } => Some(format!(
                "step {}: {from} failed after its retries ({error}); asking {to}",
                ev.step
            )),
            EventKind::StreamReasked { model, error, .. } => Some(format!(
                "step {}: {model}'s stream broke after its answer had started ({error}); asking \
                 it again without streaming",
                ev.step
            )),
            EventKind::ContextCompacted { chars, level, .. } => Some(format!(
                "step {}: the context was too long for the model; asking again compacted (level \
                 {level}, {chars} characters)",
                ev.step
            )),
            EventKind::OutputInvalid { errors } => Some(format!(
                "step {}: the output did not validate ({})",
                ev.step,
                errors.join("; ")
            )),
            EventKind::RunFinished { status, .. } if ev.parent.is_none() => Some(format!(
                "run finished: {status} after {} step(s) · {}",
                c.step,
                c.counts()
            )),
            _ => None,
        };
        let finished = matches!(ev.kind, EventKind::RunFinished { .. }) && ev.parent.is_none();
        let mut err = std::io::stderr().lock();
        if tty {
            if screen.prompt_open.load(Ordering::SeqCst) {
                continue;
            }
            if finished {
                let _ = writeln!(err, "\r\x1b[2K{}", plain.unwrap_or_default());
            } else {
                let _ = write!(err, "\r\x1b[2K{}", c.line(last_at));
            }
        } else if let Some(line) = plain {
            let _ = writeln!(err, "[dagloop] {line}");
        }
        let _ = err.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_keep_every_ending_apart_whatever_the_event_order() {
        let mut c = Counts::default();
        for (i, t) in ["a", "b", "c", "d", "e"].iter().enumerate() {
            c.set(Some(CallId(i as u64 + 1)), Some(t), Phase::Pending);
        }
        c.set(Some(CallId(1)), None, Phase::Running);
        c.set(Some(CallId(2)), None, Phase::Done);
        c.set(Some(CallId(3)), None, Phase::Rejected);
        c.set(Some(CallId(4)), None, Phase::Unresolved);
        c.set(Some(CallId(5)), None, Phase::Failed);
        c.set(None, None, Phase::Done); // run-level events change nothing
        assert_eq!(c.counts(), "1 done, 1 failed, 1 rejected, 1 unresolved");
        assert_eq!(c.tool(Some(CallId(1))), "a");
        assert!(c.line(0).contains("running: c1 a"), "{}", c.line(0));
        if let Some(v) = c.calls.get_mut(&CallId(1)) {
            v.progress = Some((2.0, Some(5.0)));
        }
        assert!(c.line(0).contains("c1 a 0.0s 2/5"), "{}", c.line(0));
        assert_eq!(progress_words(0.5, None), "0.5");
    }
}
