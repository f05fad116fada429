//! Live progress of a run on stderr: one updating line on a terminal, plain lines otherwise.

use std::io::Write;

use std::collections::BTreeMap;

use crate::engine::Subscription;
use crate::protocol::{CallId, EventKind};

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Pending,
    Running,
    Done,
    Failed,
}

/// Each call's phase (keyed by call id, so any event order keeps the counts right).
#[derive(Default)]
struct Counts {
    step: u32,
    calls: BTreeMap<CallId, Phase>,
    asking: usize,
}

impl Counts {
    fn set(&mut self, id: Option<CallId>, phase: Phase) {
        if let Some(id) = id {
            self.calls.insert(id, phase);
        }
    }

    fn line(&self) -> String {
        let n = |p: Phase| self.calls.values().filter(|x| **x == p).count();
        format!(
            "step {} · calls: {} pending, {} running, {} done, {} failed · approvals awaited: {}",
            self.step,
            n(Phase::Pending),
            n(Phase::Running),
            n(Phase::Done),
            n(Phase::Failed),
            self.asking
        )
    }
}

/// Prints progress until the run ends; on a terminal, never over an open reviewer prompt.
pub(super) async fn show(
    mut events: Subscription,
    tty: bool,
    screen: std::sync::Arc<super::review::Screen>,
) {
    let mut c = Counts::default();
    while let Some(ev) = events.recv().await {
        c.step = c.step.max(ev.step);
        let id = ev.call.map(|i| i.to_string()).unwrap_or_default();
        let plain: Option<String> = match &ev.kind {
            EventKind::CallReceived { call } => {
                c.set(ev.call, Phase::Pending);
                Some(format!("{id} received: {}", call.tool))
            }
            EventKind::ApprovalRequested { .. } => {
                c.asking += 1;
                Some(format!("{id} awaits approval"))
            }
            EventKind::Decision { decision, .. } => {
                c.asking = c.asking.saturating_sub(1);
                Some(format!(
                    "{id} decision: {}",
                    serde_json::to_value(decision)
                        .map(|v| v["decision"].to_string())
                        .unwrap_or_default()
                ))
            }
            EventKind::Started { tool, .. } => {
                c.set(ev.call, Phase::Running);
                Some(format!("{id} started: {tool}"))
            }
            EventKind::Finished { .. } => {
                c.set(ev.call, Phase::Done);
                Some(format!("{id} done"))
            }
            EventKind::Failed { kind, .. } => {
                c.set(ev.call, Phase::Failed);
                Some(format!("{id} failed ({})", kind.as_str()))
            }
            EventKind::Unresolved { missing } => {
                c.set(ev.call, Phase::Failed);
                Some(format!("{id} unresolved: {}", missing.join(", ")))
            }
            EventKind::CallRefused { reason, .. } => {
                c.set(ev.call, Phase::Failed);
                Some(format!("{id} refused: {reason}"))
            }
            EventKind::Cancelled => {
                c.set(ev.call, Phase::Failed);
                Some(format!("{id} cancelled"))
            }
            EventKind::RequestStarted { .. } => Some(format!("step {}: asking the model", ev.step)),
            EventKind::RunFinished { status } if ev.parent.is_none() => {
                Some(format!("run finished: {status}"))
            }
            _ => None,
        };
        let mut err = std::io::stderr().lock();
        if tty {
            // While a reviewer prompt is on screen, redrawing would erase it: the line is left
            // on its own row when the request arrives, and redraws resume after the decision.
            if screen.prompt_open.load(std::sync::atomic::Ordering::SeqCst) {
                continue;
            }
            let _ = write!(err, "\r\x1b[2K{}", c.line());
            if matches!(ev.kind, EventKind::RunFinished { .. }) {
                let _ = writeln!(err);
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
    fn counts_follow_each_call_whatever_the_event_order() {
        let mut c = Counts::default();
        c.set(Some(CallId(1)), Phase::Pending);
        c.set(Some(CallId(2)), Phase::Pending);
        c.set(Some(CallId(3)), Phase::Pending);
        c.set(Some(CallId(1)), Phase::Running);
        c.set(Some(CallId(2)), Phase::Done); // a latent call: done without running
        c.set(Some(CallId(3)), Phase::Failed); // refused or rejected before running
        c.set(None, Phase::Done); // run-level events change nothing
        assert_eq!(
            c.line(),
            "step 0 · calls: 0 pending, 1 running, 1 done, 1 failed · approvals awaited: 0"
        );
    }
}
