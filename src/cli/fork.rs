//! `dagloop fork RUN --at-step N [--model SPEC] [--input JSON]`: a new run from a stored run's
//! state, plan and context after step N (`runs::fork` says what that means), recorded as its
//! fork and then continued like `dagloop resume` continues a run; with `--engine temporal`, a
//! fork of a Temporal run started as a new workflow (`temporal_cmd`), planned by the same
//! [`plan`].

use std::sync::Arc;

use serde_json::Value;

use super::{CliError, Store, run};
use crate::grants::Grants;
use crate::runs::Fork;

/// What the fork changes.
pub(super) struct Over {
    pub at_step: u32,
    pub model: Option<String>,
    pub input: Option<String>,
    pub allow_shell: bool,
}

/// The fork of `stored` as `over` asks, checked against this command's grants: nothing is
/// recorded or started yet. The same for both engines.
pub(super) fn plan(
    stored: &crate::store::StoredRun,
    over: &Over,
    config: Option<&crate::config::Config>,
) -> Result<(Fork, crate::runs::RunDef, Arc<Grants>), CliError> {
    let err = |e: crate::runs::RunsError| CliError::new(e.code(), &e);
    let input = over
        .input
        .as_deref()
        .map(|t| {
            serde_json::from_str::<Value>(t)
                .map_err(|e| CliError::new("cli.bad_input", format!("--input is not JSON: {e}")))
        })
        .transpose()?;
    // The original's policy and mode go on; what it may touch is this command's grants.
    let base = run::RunOptions::from_stored(&stored.record.options).map_err(err)?;
    let opts = run::RunOptions {
        model: base.model,
        approve: base.approve,
        mode: base.mode,
        allow_shell: over.allow_shell,
        // The operator's floor the run was submitted under goes on (docs/approval.md).
        floor: base.floor,
        agent: base.agent,
        ..Default::default()
    };
    let fork = crate::runs::fork(
        stored,
        over.at_step,
        over.model.clone(),
        input,
        opts,
        crate::runs::now_ms(),
    )
    .map_err(err)?;
    let grants = super::grants_for(config, over.allow_shell, false)?;
    // Refused before anything is recorded: a fork the grants do not allow leaves no run.
    let def = crate::runs::define(fork.goal.clone(), fork.options.clone(), grants.clone())
        .map_err(err)?;
    Ok((fork, def, grants))
}

pub(super) async fn fork(
    store: Store,
    id: &str,
    over: Over,
    config: Option<&crate::config::Config>,
    display: run::Display,
) -> Result<i32, CliError> {
    let err = |e: crate::runs::RunsError| CliError::new(e.code(), &e);
    let stored = store.load(id).map_err(|e| CliError::new(e.code(), e))?;
    let (fork, _, grants) = plan(&stored, &over, config)?;
    let seeded = crate::runs::seed(&*store.shared(), &fork)
        .await
        .map_err(err)?;
    let new_id = fork.record.id.clone();
    let ran = run::run(
        run::Start::Resume(Box::new(seeded)),
        fork.options,
        grants,
        display,
        || Ok(Some(store.clone())),
    )
    .await;
    if ran.is_err() {
        let _ = store.release(&new_id);
    }
    ran
}
