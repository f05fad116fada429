//! `dagloop allow` and `dagloop revoke`: a reviewer's standing approvals given from the command
//! line to a stored run (or, with `--engine temporal`, to a Temporal run's workflow), as
//! `dagloop decide` gives decisions (`dagloop grant`, its name before the rename, still works,
//! hidden). The request becomes an op through `runs::standing_op`, the conversion the server's
//! `POST /runs/{id}/standing` calls, checked against the run rebuilt from its journal; the op is
//! recorded for the process that drives the run (or the next `resume`), with channel `cli`.
//!
//! Deliberately not here: what a standing approval covers (`approval::standing`) or applying it (the machine).

use serde_json::{Value, json};

use super::{CliError, EngineArg, Store, TemporalArgs, me, required, runs};
use crate::protocol::{Actor, CallId, Op};
use crate::runs::StandingRequest;

/// `dagloop allow RUN --tool NAME [--when SCHEMA]` or `dagloop allow RUN --call ID
/// --with-dependents [--presented HASH]`.
#[derive(Debug, clap::Args)]
pub struct AllowArgs {
    /// The run id.
    pub run: String,
    /// Approve every call of this tool, those awaiting a decision now included.
    #[arg(long, conflicts_with = "call", required_unless_present = "call")]
    pub tool: Option<String>,
    /// Only calls whose params satisfy this JSON Schema (with `--tool`).
    #[arg(long, requires = "tool", value_name = "SCHEMA")]
    pub when: Option<String>,
    /// Approve this call, awaiting a decision, as it is presented now ...
    #[arg(long, requires = "with_dependents")]
    pub call: Option<u64>,
    /// ... and the calls waiting on it, as they are written now (not one added later).
    #[arg(long, requires = "call")]
    pub with_dependents: bool,
    /// The call's params hash as you saw it (`dagloop show RUN --json`): refused as stale
    /// (`op.stale`) when the call is now presented with other params.
    #[arg(long, requires = "call", value_name = "HASH")]
    pub presented: Option<String>,
    /// Where the run is driven (`--engine temporal`: an update to its workflow).
    #[command(flatten)]
    pub temporal: TemporalArgs,
}

/// `dagloop revoke RUN ID`.
#[derive(Debug, clap::Args)]
pub struct RevokeArgs {
    /// The run id.
    pub run: String,
    /// The standing approval's id (`g1`...; `dagloop show RUN --audit` lists them).
    pub id: String,
    /// Where the run is driven (`--engine temporal`: an update to its workflow).
    #[command(flatten)]
    pub temporal: TemporalArgs,
}

fn request(a: &AllowArgs) -> Result<StandingRequest, CliError> {
    let bad = |m: String| CliError::new("cli.bad_standing_approval", m);
    match (&a.tool, a.call) {
        (Some(tool), _) => {
            let when = match &a.when {
                Some(w) => Some(
                    serde_json::from_str::<Value>(w)
                        .map_err(|e| bad(format!("--when is not JSON: {e}")))?,
                ),
                None => None,
            };
            Ok(StandingRequest::Tool {
                tool: tool.clone(),
                when,
            })
        }
        (None, Some(call)) => Ok(StandingRequest::Subgraph {
            call: CallId(call),
            presented: a.presented.clone(),
        }),
        (None, None) => Err(bad("give --tool NAME or --call ID --with-dependents".into())),
    }
}

fn refused(e: &crate::protocol::OpError) -> CliError {
    CliError::new(e.code(), e.to_string())
}

/// Gives the standing approval; prints what it covers and its id.
pub(super) async fn allow(
    a: AllowArgs,
    store: Result<Option<Store>, CliError>,
) -> Result<i32, CliError> {
    let req = request(&a)?;
    let by = Some(me(Actor::CLI));
    if a.temporal.engine == EngineArg::Temporal {
        return super::temporal_cmd::allow(&a.run, req, by, &a.temporal).await;
    }
    let s = required(store)?;
    let stored = s
        .load(&a.run)
        .map_err(|e| CliError::new(e.code(), e.to_string()))?;
    if let Some(r) = &stored.result {
        return Err(refused(&crate::protocol::OpError::RunFinished {
            status: r.status.as_str().to_string(),
        }));
    }
    let rb = crate::runs::rebuild(&stored.record, &stored.journal)
        .map_err(|e| CliError::new(e.code(), e.to_string()))?;
    let op = crate::runs::standing_op(&rb.machine, req, by).map_err(|e| refused(&e))?;
    let covers = match &op {
        Op::Allow { standing, .. } => json!(standing),
        _ => Value::Null,
    };
    // Its id (`g1`...) is the run's to give when it takes the op: other ops may be queued
    // before it.
    runs::record(&s, &a.run, op, json!({"covers": covers}))
}

/// Revokes a grant.
pub(super) async fn revoke(
    a: RevokeArgs,
    store: Result<Option<Store>, CliError>,
) -> Result<i32, CliError> {
    let op = Op::Revoke {
        standing: a.id,
        by: Some(me(Actor::CLI)),
    };
    if a.temporal.engine == EngineArg::Temporal {
        return super::temporal_cmd::decide(&a.run, op, &a.temporal).await;
    }
    runs::record(&required(store)?, &a.run, op, json!({}))
}
