//! Live progress of a run on stderr: one updating line on a terminal, plain lines otherwise.

use std::io::Write;

use tokio::sync::broadcast;

use crate::protocol::{Event, EventKind};

#[derive(Default)]
struct Counts {
    step: u32,
    pending: usize,
    running: usize,
    done: usize,
    failed: usize,
    asking: usize,
}

impl Counts {
    fn line(&self) -> String {
        format!(
            "step {} · calls: {} pending, {} running, {} done, {} failed · approvals awaited: {}",
            self.step, self.pending, self.running, self.done, self.failed, self.asking
        )
    }
}

/// Prints progress until the bus closes.
pub(super) async fn show(mut rx: broadcast::Receiver<Event>, tty: bool) {
    let mut c = Counts::default();
    loop {
        let ev = match rx.recv().await {
            Ok(ev) => ev,
            Err(broadcast::error::RecvError::Lagged(_)) => continue,
            Err(broadcast::error::RecvError::Closed) => break,
        };
        c.step = c.step.max(ev.step);
        let id = ev.call.map(|i| i.to_string()).unwrap_or_default();
        let plain: Option<String> = match &ev.kind {
            EventKind::CallReceived { call } => {
                c.pending += 1;
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
                c.pending = c.pending.saturating_sub(1);
                c.running += 1;
                Some(format!("{id} started: {tool}"))
            }
            EventKind::Finished { .. } => {
                c.running = c.running.saturating_sub(1);
                c.done += 1;
                Some(format!("{id} done"))
            }
            EventKind::Failed { kind, .. } => {
                c.running = c.running.saturating_sub(1);
                c.failed += 1;
                Some(format!("{id} failed ({})", kind.as_str()))
            }
            EventKind::Unresolved { missing } => {
                c.pending = c.pending.saturating_sub(1);
                Some(format!("{id} unresolved: {}", missing.join(", ")))
            }
            EventKind::RequestStarted { .. } => Some(format!("step {}: asking the model", ev.step)),
            EventKind::RunFinished { status } => Some(format!("run finished: {status}")),
            _ => None,
        };
        let mut err = std::io::stderr().lock();
        if tty {
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
