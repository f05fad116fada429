//! Whether an op applies to the run as it stands (rule 21). Pure: it reads the machine and
//! changes nothing, so a refused op leaves no trace in the journal.

use serde_json::{Map, Value};

use super::RunMachine;
use crate::protocol::{
    Call, CallId, Decision, StandingSpec, Op, OpError, ReferenceError, params_hash,
};
use crate::scheduler::ValidationError;
use crate::schema::{SchemaError, ToolValidators};

impl RunMachine {
    /// `Ok(())` when `op` applies now; otherwise why not. A decision applies to the exact call
    /// presented (its id, and its params when the op quotes their hash); an edit keeps the tool;
    /// a replacement names a known tool; params without references are checked against the
    /// tool's schema here (params with references are checked once resolved).
    pub fn check_op(&self, op: &Op) -> Result<(), OpError> {
        if let Some(status) = self.finished {
            return Err(OpError::RunFinished {
                status: status.as_str().into(),
            });
        }
        let (call, decision, presented, presentation) = match op {
            Op::Decide {
                call,
                decision,
                presented,
                presentation,
                ..
            } => (call, decision, presented, presentation),
            Op::Allow { standing, .. } => return self.check_standing(standing),
            Op::Revoke { standing: id, .. } => {
                return if self.standing.iter().any(|g| g.id == *id && !g.revoked) {
                    Ok(())
                } else {
                    Err(OpError::UnknownStanding { id: id.clone() })
                };
            }
            Op::Cancel { .. } => return Ok(()),
            Op::Shown { call, presentation } => return self.check_shown(*call, *presentation),
        };
        let call = *call;
        let frame_key = usize::try_from(call.0.wrapping_sub(1))
            .ok()
            .and_then(|i| self.owners.get(i))
            .ok_or(OpError::UnknownCall { call })?;
        let not_awaiting = |status: &str| OpError::NotAwaiting {
            call,
            status: status.into(),
        };
        let f = self
            .frames
            .get(frame_key)
            .ok_or_else(|| not_awaiting("finished"))?;
        let current = f.presented.get(&call).copied();
        // A decision for a presentation that is not the current one never answers it, even
        // when the call was decided since.
        if let Some(p) = *presentation
            && current.is_some_and(|c| c != p)
        {
            return Err(OpError::StalePresentation {
                call,
                presented: p,
                current: current.unwrap_or(0),
            });
        }
        if let Some(d) = f.decisions.get(&call) {
            return Err(OpError::AlreadyDecided {
                call,
                decision: d.name().into(),
                by: f.decided_by.get(&call).map(|b| b.principal.clone()),
            });
        }
        let sched = f.sched.as_ref().ok_or_else(|| not_awaiting("finished"))?;
        let Some(shown) = sched.awaiting(call) else {
            let status = sched.status_of(call).unwrap_or_else(|| "finished".into());
            return Err(not_awaiting(&status));
        };
        if let Some(p) = *presentation
            && current != Some(p)
        {
            return Err(OpError::StalePresentation {
                call,
                presented: p,
                current: current.unwrap_or(0),
            });
        }
        let hash = params_hash(shown);
        if let Some(p) = presented
            && *p != hash
        {
            return Err(OpError::Stale {
                call,
                presented: p.clone(),
                current: hash,
            });
        }
        let invalid = |reason: String| OpError::InvalidDecision { call, reason };
        match decision {
            Decision::Approve | Decision::Reject { .. } | Decision::SendBack { .. } => Ok(()),
            Decision::Done { .. } if sched.is_interrupted(call) => Ok(()),
            Decision::Done { .. } => Err(invalid(
                "only a call interrupted by a restart can be marked done".into(),
            )),
            Decision::Edit { params } => {
                if let Some(t) = params.get("_tool")
                    && t.as_str() != Some(shown.tool.as_str())
                {
                    return Err(OpError::EditChangesTool {
                        call,
                        tool: shown.tool.clone(),
                        requested: t.as_str().map_or_else(|| t.to_string(), String::from),
                    });
                }
                let mut obj = Map::new();
                obj.insert("_tool".into(), Value::String(shown.tool.clone()));
                for (k, v) in params {
                    obj.insert(k.clone(), v.clone());
                }
                let edited = Call::parse(Value::Object(obj)).map_err(|e| invalid(e.to_string()))?;
                check_params(&f.cfg.params, &edited).map_err(|e| invalid(e.to_string()))
            }
            Decision::Replace { call: replacement } => {
                if !f.cfg.tools.iter().any(|t| t.name == replacement.tool) {
                    return Err(invalid(format!(
                        "the replacement names the unknown tool `{}`",
                        replacement.tool
                    )));
                }
                if let Some(unknown) = replacement.unknown_meta_key() {
                    return Err(invalid(format!("the replacement has an {unknown}")));
                }
                check_params(&f.cfg.params, replacement).map_err(|e| invalid(e.to_string()))
            }
        }
    }

    /// [`RunMachine::check_op`], then the op bound to what the check saw: a decision that names
    /// no presentation (an older client's) names the call's current one, so that it never
    /// answers a later presentation of the call (DESIGN.md 3.6).
    pub fn bind_op(&self, mut op: Op) -> Result<Op, OpError> {
        self.check_op(&op)?;
        if let Op::Decide {
            call, presentation, ..
        } = &mut op
            && presentation.is_none()
        {
            *presentation = self.presentation(*call);
        }
        Ok(op)
    }

    /// A showing applies to the call's current presentation while its clock has not started.
    fn check_shown(&self, call: CallId, presentation: u64) -> Result<(), OpError> {
        let current = self.presentation(call);
        if current.is_none() {
            return Err(OpError::NotAwaiting {
                call,
                status: "not awaiting a decision".into(),
            });
        }
        if current != Some(presentation) {
            return Err(OpError::StalePresentation {
                call,
                presented: presentation,
                current: current.unwrap_or(0),
            });
        }
        match self.unshown_timeout(call) {
            Some(_) => Ok(()),
            None => Err(OpError::AlreadyShown { call }),
        }
    }

    /// The reviewer timeout (ms) of a call awaiting a decision whose clock has not started
    /// (nobody was shown it yet); None once it runs or when the policy sets none.
    pub fn unshown_timeout(&self, call: CallId) -> Option<u64> {
        let f = self.frames.get(&self.owner(call)?)?;
        f.unshown.get(&call).copied()
    }

    /// Whether the call awaits a decision as interrupted by a restart (a re-presentation).
    pub fn is_interrupted(&self, call: CallId) -> bool {
        self.owner(call)
            .and_then(|k| self.frames.get(&k))
            .and_then(|f| f.sched.as_ref())
            .is_some_and(|s| s.awaiting(call).is_some() && s.is_interrupted(call))
    }

    /// The presentation a call awaiting a decision answers to: the `seq` of its latest
    /// `approval_requested` event (None when it awaits no decision).
    pub fn presentation(&self, call: CallId) -> Option<u64> {
        let f = self.frames.get(&self.owner(call)?)?;
        f.sched.as_ref()?.awaiting(call)?;
        f.presented.get(&call).copied()
    }

    /// A standing approval applies when it names a tool of the run (with a `when` that is a schema) or lists
    /// calls of the run.
    fn check_standing(&self, spec: &StandingSpec) -> Result<(), OpError> {
        let known = |name: &str| {
            self.root.tools.iter().any(|t| t.name == name)
                || self
                    .frames
                    .values()
                    .any(|f| f.cfg.tools.iter().any(|t| t.name == name))
        };
        crate::approval::standing::check(spec, known)
            .map_err(|reason| OpError::InvalidStanding { reason })?;
        if let StandingSpec::Calls { calls } = spec {
            for c in calls {
                let i = usize::try_from(c.call.0.wrapping_sub(1)).ok();
                if i.and_then(|i| self.owners.get(i)).is_none() {
                    return Err(OpError::UnknownCall { call: c.call });
                }
            }
        }
        Ok(())
    }

    /// The calls awaiting a decision right now, across every agent of the run, by id, with
    /// whether each was interrupted by a restart.
    pub fn awaiting_interrupted(&self) -> Vec<(CallId, bool)> {
        self.awaiting()
            .into_iter()
            .map(|(id, _)| {
                let interrupted = self
                    .owner(id)
                    .and_then(|k| self.frames.get(&k))
                    .and_then(|f| f.sched.as_ref())
                    .is_some_and(|s| s.is_interrupted(id));
                (id, interrupted)
            })
            .collect()
    }

    /// The calls awaiting a decision right now, across every agent of the run, by id.
    pub fn awaiting(&self) -> Vec<(CallId, Call)> {
        let mut v = Vec::new();
        for (i, owner) in self.owners.iter().enumerate() {
            let id = CallId(i as u64 + 1);
            if let Some(c) = self
                .frames
                .get(owner)
                .and_then(|f| f.sched.as_ref())
                .and_then(|s| s.awaiting(id))
            {
                v.push((id, c.clone()));
            }
        }
        v
    }
}

/// Why a reviewer's params cannot apply (it becomes [`OpError::InvalidDecision`]'s reason, with
/// the op's own code, `op.invalid_decision`).
#[derive(Debug, thiserror::Error)]
enum ParamsCheckError {
    /// A reference or output path of the call does not parse.
    #[error(transparent)]
    Reference(#[from] ReferenceError),
    /// The params do not match the tool's schema.
    #[error("the params do not match `{tool}`'s schema: {reason}")]
    Mismatch {
        /// The tool.
        tool: String,
        /// The violations.
        #[source]
        reason: ValidationError,
    },
    /// The params could not be checked (the tool has no compiled schema).
    #[error(transparent)]
    Schema(#[from] SchemaError),
}

/// Checks a reviewer's call against its tool's schema as written: its references must parse,
/// and its params are checked with those holding references deferred (checked once resolved,
/// like any call's) — the same check `validate` and the terminal reviewer make.
fn check_params(validators: &ToolValidators, call: &Call) -> Result<(), ParamsCheckError> {
    call.references()?;
    ValidationError::check(validators.validate_written(&call.tool, &call.params)?).map_err(|reason| {
        ParamsCheckError::Mismatch {
            tool: call.tool.clone(),
            reason,
        }
    })
}

impl RunMachine {
    /// The run's own state (`†state`) as it stands now, before the run has ended too (None
    /// before the run started).
    pub fn state_view(&self) -> Option<serde_json::Value> {
        let f = self.frames.get(&None)?;
        // During a step the state lives in the step's scheduler.
        match (&f.sched, &f.state) {
            (Some(s), _) => s.state().view("state"),
            (None, Some(s)) => s.view("state"),
            (None, None) => None,
        }
    }
}
