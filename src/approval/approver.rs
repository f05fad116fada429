//! Who answers an approval request: the [`Approver`] trait and two implementations.
//!
//! [`ScriptedApprover`] answers from data (by tool name or by call order, with optional delays)
//! for tests and scripted runs; [`ChannelApprover`] forwards each request on an mpsc channel
//! with a oneshot for the reply, for the CLI prompt and the HTTP server to plug into.
//!
//! Deliberately not here: timeouts (the engine races each decision against the policy's timer)
//! and deciding which calls are asked about ([`super::assess`]).

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};

use crate::protocol::{Call, CallId, Decision, Tool};

/// One call presented to a reviewer.
#[derive(Debug, Clone, PartialEq)]
pub struct ApprovalRequest {
    /// The call's id (unique within the run, nested agents included).
    pub id: CallId,
    /// The call with its references already resolved to values.
    pub call: Call,
    /// The tool the call targets.
    pub tool: Arc<Tool>,
    /// The run the call belongs to.
    pub run_id: String,
    /// The call's path through nested agents (delegate calls above it, then the call).
    pub path: Vec<CallId>,
    /// The fingerprint of the call as presented; decisions quote it (rule 21).
    pub params_hash: String,
}

impl ApprovalRequest {
    /// A request for `call` to `tool` (outside any run; tests and custom drivers).
    pub fn new(id: CallId, call: Call, tool: Arc<Tool>) -> Self {
        let params_hash = crate::protocol::params_hash(&call);
        ApprovalRequest {
            id,
            call,
            tool,
            run_id: String::new(),
            path: vec![id],
            params_hash,
        }
    }

    /// The request as JSON: `{"id": 3, "run_id": .., "path": [..], "call": {...}, "tool": {...}}`.
    pub fn to_value(&self) -> Value {
        json!({
            "id": self.id,
            "run_id": self.run_id,
            "path": self.path,
            "params_hash": self.params_hash,
            "call": self.call.to_value(),
            "tool": serde_json::to_value(&*self.tool).unwrap_or(Value::Null),
        })
    }
}

/// Decides about calls presented for approval. Decisions for different calls are awaited
/// concurrently by the engine, so one slow answer never holds up another.
pub trait Approver: Send + Sync {
    /// Answers one request. The future may take as long as the reviewer takes; the engine applies
    /// the policy's timeout around it.
    fn decide(&self, req: ApprovalRequest) -> BoxFuture<'static, Decision>;

    /// Who its decisions are journaled as (None: nobody in particular).
    fn actor(&self) -> Option<crate::protocol::Actor> {
        None
    }
}

/// A scripted answer: a decision, given after an optional delay.
#[derive(Debug, Clone, PartialEq)]
pub struct Scripted {
    /// What to answer.
    pub decision: Decision,
    /// How long to wait before answering (tokio time, so paused clocks apply).
    pub delay: Option<Duration>,
}

impl From<Decision> for Scripted {
    fn from(decision: Decision) -> Self {
        Scripted {
            decision,
            delay: None,
        }
    }
}

/// Answers from data: a per-tool answer if one is set, else the next answer in call order,
/// else the fallback (approve unless changed). Records every request it saw.
#[derive(Debug)]
pub struct ScriptedApprover {
    by_call: BTreeMap<CallId, Scripted>,
    by_tool: BTreeMap<String, Scripted>,
    in_order: Mutex<VecDeque<Scripted>>,
    fallback: Scripted,
    seen: Mutex<Vec<ApprovalRequest>>,
    actor: Option<crate::protocol::Actor>,
}

impl Default for ScriptedApprover {
    fn default() -> Self {
        ScriptedApprover {
            by_call: BTreeMap::new(),
            by_tool: BTreeMap::new(),
            in_order: Mutex::new(VecDeque::new()),
            fallback: Decision::Approve.into(),
            seen: Mutex::new(Vec::new()),
            actor: None,
        }
    }
}

impl ScriptedApprover {
    /// An approver that approves everything until told otherwise.
    pub fn new() -> Self {
        ScriptedApprover::default()
    }

    /// The call with this id gets `answer` (builder style); it wins over a per-tool answer.
    pub fn for_call(mut self, id: CallId, answer: impl Into<Scripted>) -> Self {
        self.by_call.insert(id, answer.into());
        self
    }

    /// Every call to `tool` gets `answer` (builder style).
    pub fn for_tool(mut self, tool: impl Into<String>, answer: impl Into<Scripted>) -> Self {
        self.by_tool.insert(tool.into(), answer.into());
        self
    }

    /// The next request not covered by a per-tool answer gets `answer` (builder style).
    pub fn then(self, answer: impl Into<Scripted>) -> Self {
        if let Ok(mut q) = self.in_order.lock() {
            q.push_back(answer.into());
        }
        self
    }

    /// What to answer once the scripted answers run out (builder style).
    pub fn otherwise(mut self, answer: impl Into<Scripted>) -> Self {
        self.fallback = answer.into();
        self
    }

    /// Its decisions are journaled as made by `actor` (builder style).
    pub fn by(mut self, actor: crate::protocol::Actor) -> Self {
        self.actor = Some(actor);
        self
    }

    /// The requests seen so far, in the order they were asked.
    pub fn requests(&self) -> Vec<ApprovalRequest> {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

/// Shorthand for a scripted answer given after `delay`.
pub fn after(delay: Duration, decision: Decision) -> Scripted {
    Scripted {
        decision,
        delay: Some(delay),
    }
}

impl Approver for ScriptedApprover {
    fn actor(&self) -> Option<crate::protocol::Actor> {
        self.actor.clone()
    }

    fn decide(&self, req: ApprovalRequest) -> BoxFuture<'static, Decision> {
        let answer = match self
            .by_call
            .get(&req.id)
            .or_else(|| self.by_tool.get(&req.tool.name))
        {
            Some(a) => a.clone(),
            None => self
                .in_order
                .lock()
                .ok()
                .and_then(|mut q| q.pop_front())
                .unwrap_or_else(|| self.fallback.clone()),
        };
        if let Ok(mut seen) = self.seen.lock() {
            seen.push(req);
        }
        async move {
            if let Some(d) = answer.delay {
                tokio::time::sleep(d).await;
            }
            answer.decision
        }
        .boxed()
    }
}

/// A request waiting for a reviewer on the other side of a [`ChannelApprover`].
#[derive(Debug)]
pub struct PendingApproval {
    /// What to decide about.
    pub request: ApprovalRequest,
    /// Where to send the decision. Dropping it applies the approver's `on_closed` answer.
    pub reply: oneshot::Sender<Decision>,
}

/// Sends every request on an mpsc channel and waits for the reply on a oneshot.
#[derive(Debug, Clone)]
pub struct ChannelApprover {
    tx: mpsc::Sender<PendingApproval>,
    on_closed: Decision,
}

impl ChannelApprover {
    /// An approver and the receiving end a front-end reads requests from. When the receiver or a
    /// reply sender is dropped, the call is rejected ("no reviewer").
    pub fn new(buffer: usize) -> (Self, mpsc::Receiver<PendingApproval>) {
        let (tx, rx) = mpsc::channel(buffer.max(1));
        let on_closed = Decision::Reject {
            reason: "no reviewer is connected to answer approval requests".into(),
        };
        (ChannelApprover { tx, on_closed }, rx)
    }

    /// What to answer when nobody can reply (builder style).
    pub fn on_closed(mut self, decision: Decision) -> Self {
        self.on_closed = decision;
        self
    }
}

impl Approver for ChannelApprover {
    fn decide(&self, request: ApprovalRequest) -> BoxFuture<'static, Decision> {
        let tx = self.tx.clone();
        let on_closed = self.on_closed.clone();
        async move {
            let (reply, answer) = oneshot::channel();
            if tx.send(PendingApproval { request, reply }).await.is_err() {
                return on_closed;
            }
            answer.await.unwrap_or(on_closed)
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(id: u64, tool: &str) -> ApprovalRequest {
        ApprovalRequest::new(CallId(id), Call::new(tool), Arc::new(Tool::new(tool)))
    }

    #[tokio::test(start_paused = true)]
    async fn scripted_answers_by_tool_then_order_then_fallback() {
        let a = ScriptedApprover::new()
            .for_tool(
                "wire",
                Decision::Reject {
                    reason: "no".into(),
                },
            )
            .then(after(Duration::from_secs(5), Decision::Approve))
            .otherwise(Decision::Reject {
                reason: "done".into(),
            });
        let start = tokio::time::Instant::now();
        assert_eq!(
            a.decide(req(1, "wire")).await,
            Decision::Reject {
                reason: "no".into()
            }
        );
        assert_eq!(a.decide(req(2, "read")).await, Decision::Approve);
        assert_eq!(start.elapsed(), Duration::from_secs(5));
        assert_eq!(
            a.decide(req(3, "read")).await,
            Decision::Reject {
                reason: "done".into()
            }
        );
        let ids: Vec<u64> = a.requests().iter().map(|r| r.id.0).collect();
        assert_eq!(ids, vec![1, 2, 3]);
    }

    #[tokio::test]
    async fn channel_approver_forwards_and_rejects_when_closed() {
        let (a, mut rx) = ChannelApprover::new(4);
        let pending = a.decide(req(7, "wire"));
        let reviewer = tokio::spawn(async move {
            let p = rx.recv().await.expect("request");
            assert_eq!(p.request.id, CallId(7));
            let _ = p.reply.send(Decision::Approve);
            // The next request's reply sender is dropped unanswered.
            let p = rx.recv().await.expect("request");
            drop(p.reply);
        });
        assert_eq!(pending.await, Decision::Approve);
        let d = a.decide(req(8, "wire")).await;
        assert!(matches!(d, Decision::Reject { .. }), "{d:?}");
        reviewer.await.expect("reviewer");
        let d = a.decide(req(9, "wire")).await;
        assert!(matches!(d, Decision::Reject { .. }), "receiver gone: {d:?}");
    }
}
