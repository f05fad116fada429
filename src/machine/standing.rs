//! Standing approvals in the run machine: a reviewer's standing approval is journaled as an input, approves the calls
//! awaiting a decision that it covers at once, and every covered call presented later, until it
//! is revoked or the run ends. Replaying the journal gives the same approvals.
//!
//! Deliberately not here: what a standing approval covers (`crate::approval::standing`) or who may give one.

use super::{Action, RunMachine, Timer, Work};
use crate::approval::standing::ActiveStanding;
use crate::protocol::{Actor, Call, CallId, Decision, EventKind, StandingSpec, Millis, Tool};
use crate::scheduler;

/// Who a decision about to be applied came from, put on its `decision` event.
#[derive(Debug, Clone, Default)]
pub(super) struct Attribution {
    pub by: Option<Actor>,
    pub standing: Option<String>,
}

impl RunMachine {
    /// Records a standing approval and approves the awaiting calls it covers.
    pub(super) fn allow(
        &mut self,
        spec: StandingSpec,
        by: Option<Actor>,
        now: Millis,
        work: &mut Vec<Work>,
        out: &mut Vec<Action>,
    ) {
        let g = ActiveStanding::new(self.standing.len() + 1, spec.clone(), by.clone());
        let kind = EventKind::StandingApprovalAdded {
            id: g.id.clone(),
            standing: spec,
            by,
        };
        self.emit(None, None, kind, now, out);
        self.standing.push(g);
        let ix = self.standing.len() - 1;
        for (id, presented) in self.awaiting() {
            let Some(key) = self.owner(id) else { continue };
            if self.covered_by(ix, key, id, &presented) {
                self.pending.clear(Timer::Approval { call: id });
                self.approve_by_standing(key, id, ix, work);
            }
        }
    }

    /// Revokes a standing approval (it covers no call presented from now on).
    pub(super) fn revoke(
        &mut self,
        id: &str,
        by: Option<Actor>,
        now: Millis,
        out: &mut Vec<Action>,
    ) {
        if let Some(g) = self.standing.iter_mut().find(|g| g.id == id && !g.revoked) {
            g.revoked = true;
            let kind = EventKind::StandingApprovalRevoked {
                id: id.to_string(),
                by,
            };
            self.emit(None, None, kind, now, out);
        }
    }

    /// The first standing approval in force covering call `id` of frame `key`, presented as `presented`.
    pub(super) fn covering_standing(
        &self,
        key: super::FrameKey,
        id: CallId,
        presented: &Call,
    ) -> Option<usize> {
        (0..self.standing.len()).find(|&ix| self.covered_by(ix, key, id, presented))
    }

    fn covered_by(&self, ix: usize, key: super::FrameKey, id: CallId, presented: &Call) -> bool {
        let Some(g) = self.standing.get(ix) else {
            return false;
        };
        let Some(f) = self.frames.get(&key) else {
            return false;
        };
        let Some(sched) = f.sched.as_ref() else {
            return false;
        };
        let fallback;
        let tool = match f.cfg.tools.iter().find(|t| t.name == presented.tool) {
            Some(t) => t,
            None => {
                fallback = Tool::new(presented.tool.clone());
                &fallback
            }
        };
        g.covers(
            id,
            presented,
            sched.call_of(id),
            tool,
            sched.is_interrupted(id),
        )
    }

    /// Queues the approval of call `id` by standing approval `ix`, attributed to its author.
    pub(super) fn approve_by_standing(
        &mut self,
        key: super::FrameKey,
        id: CallId,
        ix: usize,
        work: &mut Vec<Work>,
    ) {
        let Some(g) = self.standing.get(ix) else { return };
        self.attribution.insert(
            id,
            Attribution {
                by: g.by.clone(),
                standing: Some(g.id.clone()),
            },
        );
        work.push((
            key,
            scheduler::Input::Decided {
                id,
                decision: Decision::Approve,
            },
        ));
    }

    /// The standing approvals given in this run, in order (revoked ones included).
    pub fn standing_approvals(&self) -> &[ActiveStanding] {
        &self.standing
    }

    /// The calls that wait, directly or through others, on call `id` (blocked calls reading what
    /// it writes), each as it stands (written, references unresolved), sorted by id.
    pub fn downstream(&self, id: CallId) -> Vec<(CallId, Call)> {
        let Some(f) = self.owner(id).and_then(|k| self.frames.get(&k)) else {
            return Vec::new();
        };
        let Some(s) = f.sched.as_ref() else {
            return Vec::new();
        };
        s.downstream(id)
            .into_iter()
            .filter_map(|c| s.call_of(c).map(|call| (c, call.clone())))
            .collect()
    }
}
