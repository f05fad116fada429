//! In-process reviewers as adapters: an [`Approver`] reads the run's `approval_requested`
//! events and answers with `Decide` ops, quoting the params hash it was shown (rule 21).
//!
//! Each request is answered concurrently (one slow answer never holds up another, rule 14). A
//! decision that no longer applies (the policy's timeout decided first, the run ended) is
//! refused by the run and dropped here. A panicking approver rejects the call, and so does one
//! whose answer the run refuses as invalid (`op.invalid_decision`): it would not answer again.

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};

use super::activities::panic_message;
use super::handle::Shared;
use crate::approval::{ApprovalRequest, Approver};
use crate::protocol::{Call, CallId, Decision, EventKind, Op, OpError, Tool};

/// Answers the run's approval requests with `approver` until the run ends.
pub(super) async fn serve(
    shared: Arc<Shared>,
    approver: Arc<dyn Approver>,
    tools: BTreeMap<String, Arc<Tool>>,
) {
    let by = approver.actor();
    let mut events = shared.subscribe_from(0);
    let mut pending = FuturesUnordered::new();
    loop {
        tokio::select! {
            ev = events.recv() => {
                let Some(ev) = ev else { break };
                let (EventKind::ApprovalRequested { call, params_hash, path, .. }, Some(id)) =
                    (&ev.kind, ev.call)
                else {
                    continue;
                };
                let tool = tools
                    .get(&call.tool)
                    .cloned()
                    .unwrap_or_else(|| Arc::new(Tool::new(call.tool.clone())));
                let req = ApprovalRequest {
                    id,
                    call: Call::clone(call),
                    tool,
                    run_id: shared.run_id.to_string(),
                    path: path.clone(),
                    params_hash: params_hash.clone(),
                };
                // The presentation the answer is for (DESIGN.md 3.6).
                let seq = ev.seq;
                // Handed to the approver: shown, so its reviewer deadline (if any) starts now.
                let shown = Op::Shown { call: id, presentation: seq };
                if let Err(e) = shared.submit(shown, false).await {
                    tracing::trace!(call = %id, code = e.code(), "showing not recorded: {e}");
                }
                let answer = decide(approver.clone(), req);
                pending.push(async move {
                    let (id, hash, decision) = answer.await;
                    (id, hash, decision, seq)
                });
            }
            Some((id, hash, decision, seq)) = pending.next(), if !pending.is_empty() => {
                let op = Op::Decide {
                    call: id,
                    decision,
                    presented: Some(hash.clone()),
                    presentation: Some(seq),
                    by: by.clone(),
                };
                match shared.submit(op, false).await {
                    Ok(()) => {}
                    // The answer itself is invalid (an edit that forms no valid call): a remote
                    // reviewer may answer again, this one will not, so the call is rejected
                    // with the reason rather than left waiting for a decision forever.
                    Err(e @ OpError::InvalidDecision { .. }) => {
                        let reason = format!("the reviewer's decision could not be applied: {e}");
                        let decision = Decision::Reject { reason };
                        let op =
                            Op::Decide { call: id, decision, presented: Some(hash), presentation: Some(seq), by: by.clone() };
                        if let Err(e) = shared.submit(op, false).await {
                            tracing::debug!(call = %id, code = e.code(), "rejection not applied: {e}");
                        }
                    }
                    Err(e) => {
                        tracing::debug!(call = %id, code = e.code(), "decision not applied: {e}");
                    }
                }
            }
        }
    }
}

async fn decide(approver: Arc<dyn Approver>, req: ApprovalRequest) -> (CallId, String, Decision) {
    let (id, hash) = (req.id, req.params_hash.clone());
    let fut = match std::panic::catch_unwind(AssertUnwindSafe(|| approver.decide(req))) {
        Ok(f) => f,
        Err(p) => return (id, hash, failed(p)),
    };
    match AssertUnwindSafe(fut).catch_unwind().await {
        Ok(d) => (id, hash, d),
        Err(p) => (id, hash, failed(p)),
    }
}

fn failed(p: Box<dyn std::any::Any + Send>) -> Decision {
    Decision::Reject {
        reason: format!("the approver failed: {}", panic_message(p)),
    }
}
