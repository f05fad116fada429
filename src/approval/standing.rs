//! Standing approvals in force in a run: which presented calls a reviewer's standing approval
//! approves ahead of time. (Not grants: those are what the operator lets a goal touch,
//! `crate::grants`.)
//!
//! A [`StandingSpec::Tool`] approval covers every call of its tool (whose params satisfy its
//! `when`, seen as an approval rule's `when` sees them); a [`StandingSpec::Calls`] approval
//! covers exactly the listed calls while their params hash is the one listed (as presented, or
//! as written for a call the reviewer saw still blocked). None covers a call interrupted by a
//! restart.
//!
//! Pure: the run machine keeps them, journals them and applies what they cover.
//! Deliberately not here: who may give one (the server's roles) or when they are offered.

use std::sync::Arc;

use crate::protocol::{Actor, Call, CallId, StandingSpec, Tool, params_hash};

/// A standing approval given in a run, ready to match calls.
#[derive(Clone)]
pub struct ActiveStanding {
    /// Its id in the run (`g1`...).
    pub id: String,
    /// What it covers.
    pub spec: StandingSpec,
    /// Who gave it.
    pub by: Option<Actor>,
    /// Revoked: it covers nothing from then on.
    pub revoked: bool,
    when: Option<Arc<jsonschema::Validator>>,
}

impl std::fmt::Debug for ActiveStanding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ActiveStanding")
            .field("id", &self.id)
            .field("spec", &self.spec)
            .field("by", &self.by)
            .field("revoked", &self.revoked)
            .finish()
    }
}

/// Checks a standing approval before it is journaled: a tool approval names a known tool
/// (`known`), its `when` is a schema; a calls approval lists at least one call.
pub fn check(spec: &StandingSpec, known: impl Fn(&str) -> bool) -> Result<(), String> {
    match spec {
        StandingSpec::Tool { tool, when } => {
            if !known(tool) {
                return Err(format!("the run has no tool `{tool}`"));
            }
            if let Some(w) = when {
                super::rules::compile_schema(w)
                    .map_err(|e| format!("`when` is not a valid JSON Schema: {e}"))?;
            }
            Ok(())
        }
        StandingSpec::Calls { calls } if calls.is_empty() => {
            Err("a calls approval lists at least one call".into())
        }
        StandingSpec::Calls { .. } => Ok(()),
    }
}

impl ActiveStanding {
    /// The `n`th standing approval of a run (from 1). A `when` that does not compile covers nothing (it
    /// was checked before it was journaled).
    pub fn new(n: usize, spec: StandingSpec, by: Option<Actor>) -> ActiveStanding {
        let when = match &spec {
            StandingSpec::Tool { when: Some(w), .. } => super::rules::compile_schema(w).ok(),
            _ => None,
        };
        ActiveStanding {
            id: format!("g{n}"),
            spec,
            by,
            revoked: false,
            when,
        }
    }

    /// True when it approves call `id`, presented as `presented` (resolved), written as
    /// `written` (the call as the model or a reviewer wrote it), not interrupted.
    pub fn covers(
        &self,
        id: CallId,
        presented: &Call,
        written: Option<&Call>,
        tool: &Tool,
        interrupted: bool,
    ) -> bool {
        if self.revoked || interrupted {
            return false;
        }
        match &self.spec {
            StandingSpec::Tool { tool: name, when } => {
                *name == presented.tool
                    && match (when, &self.when) {
                        (None, _) => true,
                        (Some(_), Some(v)) => {
                            v.is_valid(&super::rules::call_subject(tool, presented))
                        }
                        (Some(_), None) => false,
                    }
            }
            StandingSpec::Calls { calls } => {
                let Some(listed) = calls.iter().find(|c| c.call == id) else {
                    return false;
                };
                listed.params_hash == params_hash(presented)
                    || written.is_some_and(|w| listed.params_hash == params_hash(w))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::StandingCall;
    use serde_json::json;

    fn call(v: serde_json::Value) -> Call {
        Call::try_from(v).expect("call")
    }

    #[test]
    fn tool_approvals_cover_their_tool_and_their_schema_only() {
        let t = Tool::new("refund");
        let small = call(json!({"_tool": "refund", "amount": 5}));
        let big = call(json!({"_tool": "refund", "amount": 500}));
        let g = ActiveStanding::new(
            1,
            StandingSpec::Tool {
                tool: "refund".into(),
                when: Some(json!({"properties": {"amount": {"maximum": 10}}})),
            },
            None,
        );
        assert!(g.covers(CallId(1), &small, None, &t, false));
        assert!(!g.covers(CallId(1), &big, None, &t, false));
        assert!(!g.covers(CallId(1), &small, None, &t, true), "interrupted");
        let other = call(json!({"_tool": "wire", "amount": 5}));
        assert!(!g.covers(CallId(1), &other, None, &Tool::new("wire"), false));
    }

    #[test]
    fn calls_approvals_cover_the_listed_calls_as_presented() {
        let t = Tool::new("refund");
        let shown = call(json!({"_tool": "refund", "amount": 5}));
        let written = call(json!({"_tool": "refund", "amount": "†state.amount"}));
        let g = ActiveStanding::new(
            2,
            StandingSpec::Calls {
                calls: vec![
                    StandingCall {
                        call: CallId(1),
                        params_hash: params_hash(&shown),
                    },
                    StandingCall {
                        call: CallId(2),
                        params_hash: params_hash(&written),
                    },
                ],
            },
            None,
        );
        assert_eq!(g.id, "g2");
        assert!(g.covers(CallId(1), &shown, None, &t, false));
        let changed = call(json!({"_tool": "refund", "amount": 6}));
        assert!(!g.covers(CallId(1), &changed, None, &t, false));
        // Seen blocked (as written), presented later with the values resolved.
        assert!(g.covers(CallId(2), &changed, Some(&written), &t, false));
        // A call that was not listed (added later) is not covered.
        assert!(!g.covers(CallId(3), &shown, Some(&shown), &t, false));
    }
}
