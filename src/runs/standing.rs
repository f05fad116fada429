//! A reviewer's request for a standing approval, turned into the op that gives it: the one
//! conversion the server (`POST /runs/{id}/standing`) and the command line (`dagloop allow`) both
//! call, so a standing approval asked for through either means the same thing.
//!
//! A request is a standing approval as the protocol journals it (`scope: tool` or `scope: calls`), or
//! `scope: subgraph`: "this call and the calls waiting on it", read off the run as it stands
//! when the request is taken (the call's params hash as presented, each waiting call's as
//! written) and journaled as the `calls` approval it amounts to, so that a call the model adds
//! later is not covered.
//!
//! Deliberately not here: what a standing approval covers once given (`crate::approval::standing`), who may
//! give one (the front-ends), or applying it (the run machine).

use serde::Deserialize;
use serde_json::Value;

use crate::machine::RunMachine;
use crate::protocol::{Actor, CallId, Decision, StandingSpec, StandingCall, Op, OpError, params_hash};

/// A standing approval as a reviewer asks for it.
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "scope", rename_all = "snake_case", deny_unknown_fields)]
pub enum StandingRequest {
    /// Every call of `tool` (whose params satisfy `when`), those awaiting included.
    Tool {
        /// The tool's name.
        tool: String,
        /// A JSON Schema the call must satisfy.
        #[serde(default)]
        when: Option<Value>,
    },
    /// Exactly these calls, each while its params hash is the one listed.
    Calls {
        /// The calls and their hashes as presented.
        calls: Vec<StandingCall>,
    },
    /// A call awaiting a decision and every call waiting on it (directly or through others),
    /// as they stand now.
    Subgraph {
        /// The awaiting call.
        call: CallId,
        /// The call's params hash as the reviewer saw it (refused as stale when it changed).
        #[serde(default)]
        presented: Option<String>,
    },
}

/// The `allow` op for `req` in the run `machine` drives, by `by`, checked as any op is
/// ([`RunMachine::check_op`]).
pub fn standing_op(machine: &RunMachine, req: StandingRequest, by: Option<Actor>) -> Result<Op, OpError> {
    let standing = match req {
        StandingRequest::Tool { tool, when } => StandingSpec::Tool { tool, when },
        StandingRequest::Calls { calls } => StandingSpec::Calls { calls },
        StandingRequest::Subgraph { call, presented } => subgraph(machine, call, presented)?,
    };
    let op = Op::Allow { standing, by };
    machine.check_op(&op)?;
    Ok(op)
}

/// The calls approval "call `id` and the calls waiting on it" amounts to now.
fn subgraph(
    machine: &RunMachine,
    id: CallId,
    presented: Option<String>,
) -> Result<StandingSpec, OpError> {
    // Refused as a decision about the call would be: unknown, not awaiting, already decided,
    // or presented with other params than the reviewer saw.
    machine.check_op(&Op::Decide {
        call: id,
        decision: Decision::Approve,
        presented,
        presentation: None,
        by: None,
    })?;
    let Some((_, shown)) = machine.awaiting().into_iter().find(|(c, _)| *c == id) else {
        return Err(OpError::NotAwaiting {
            call: id,
            status: "not presented".into(),
        });
    };
    let current = params_hash(&shown);
    let mut calls = vec![StandingCall {
        call: id,
        params_hash: current,
    }];
    calls.extend(
        machine
            .downstream(id)
            .into_iter()
            .map(|(call, written)| StandingCall {
                call,
                params_hash: params_hash(&written),
            }),
    );
    Ok(StandingSpec::Calls { calls })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn requests_parse_by_scope_and_refuse_unknown_fields() {
        let r: StandingRequest =
            serde_json::from_value(json!({"scope": "subgraph", "call": 3})).expect("subgraph");
        assert_eq!(
            r,
            StandingRequest::Subgraph {
                call: CallId(3),
                presented: None
            }
        );
        let r: StandingRequest =
            serde_json::from_value(json!({"scope": "tool", "tool": "t"})).expect("tool");
        assert_eq!(
            r,
            StandingRequest::Tool {
                tool: "t".into(),
                when: None
            }
        );
        assert!(
            serde_json::from_value::<StandingRequest>(json!({"scope": "tool", "tool": "t", "x": 1}))
                .is_err()
        );
        assert!(serde_json::from_value::<StandingRequest>(json!({"scope": "all"})).is_err());
    }
}
