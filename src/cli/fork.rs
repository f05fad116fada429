//! `dagloop fork RUN --at-step N [--model SPEC] [--input JSON]`: a new run from a stored run's
//! state, plan and context after step N (`runs::fork` says what that means), recorded as its
//! fork and then continued like `dagloop resume` continues a run.

use serde_json::Value;

use super::{CliError, Store, run};

/// What the fork changes.
pub(super) struct Over {
    pub at_step: u32,
    pub model: Option<String>,
    pub input: Option<String>,
    pub allow_shell: bool,
}

pub(super) async fn fork(
    store: Store,
    id: &str,
    over: Over,
    config: Option<&crate::config::Config>,
    display: run::Display,
) -> Result<i32, CliError> {
    let err = |e: crate::runs::RunsError| CliError::new(e.code(), &e);
    let input = over
        .input
        .as_deref()
        .map(|t| {
            serde_json::from_str::<Value>(t)
                .map_err(|e| CliError::new("cli.bad_input", format!("--input is not JSON: {e}")))
        })
        .transpose()?;
    let stored = store.load(id).map_err(|e| CliError::new(e.code(), e))?;
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
        &stored,
        over.at_step,
        over.model,
        input,
        opts,
        crate::runs::now_ms(),
    )
    .map_err(err)?;
    let grants = super::grants_for(config, over.allow_shell, false)?;
    // Refused before anything is recorded: a fork the grants do not allow leaves no run.
    crate::runs::define(fork.goal.clone(), fork.options.clone(), grants.clone()).map_err(err)?;
    let seeded = crate::runs::seed(&*store.shared(), &fork)
        .await
        .map_err(err)?;
    let new_id = fork.record.id.clone();
    let ran = run::run(
        run::Start::Resume(Box::new(seeded)),
        fork.options,
        grants,
        display,
        Some(store.clone()),
    )
    .await;
    if ran.is_err() {
        let _ = store.release(&new_id);
    }
    ran
}
