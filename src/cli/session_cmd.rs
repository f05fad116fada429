//! `dagloop run --continue RUN GOAL_OR_TEXT`: a follow-up of a finished run in its session
//! (`runs::session` says what carries over), recorded as the run's child and then driven like
//! `dagloop resume` drives a run.
//!
//! Deliberately not here: what a follow-up is made of (`runs::session`), and the listing of a
//! session's runs (`dagloop runs --session`, `show`).

use std::path::PathBuf;

use super::{CarryArg, CliError, Store, run};
use crate::runs::{Carry, Continue, Next};

/// What the follow-up is and changes.
pub(super) struct Over {
    /// A goal file, or the instruction in words.
    pub goal_or_text: PathBuf,
    pub carry: CarryArg,
    pub wait: bool,
    pub model: Option<String>,
    pub approve: Option<crate::approval::ModeName>,
    pub mode: Option<String>,
    pub allow_shell: bool,
}

/// What `GOAL_OR_TEXT` names: an existing file is a goal file; anything else is words.
fn next_of(given: &std::path::Path, offline: bool) -> Result<Next, CliError> {
    if given.is_file() {
        let load = if offline {
            crate::goal::Goal::load_offline
        } else {
            crate::goal::Goal::load
        };
        let goal = load(given).map_err(|e| CliError::new(e.code(), &e))?;
        return Ok(Next::Goal(Box::new(goal)));
    }
    let text = given.to_string_lossy().trim().to_string();
    if text.is_empty() {
        return Err(CliError::new(
            "session.no_goal",
            "--continue RUN needs a goal file or the follow-up's instruction after the run id",
        ));
    }
    Ok(Next::Text(text))
}

pub(super) async fn continue_run(
    store: Store,
    parent: &str,
    over: Over,
    config: Option<&crate::config::Config>,
    display: run::Display,
) -> Result<i32, CliError> {
    let err = |e: crate::runs::RunsError| CliError::new(e.code(), &e);
    let offline = matches!(&display.tools_from, Some((_, false)));
    let how = Continue {
        next: next_of(&over.goal_or_text, offline)?,
        carry: match over.carry {
            CarryArg::State => Carry::State,
            CarryArg::History => Carry::History,
            CarryArg::Both => Carry::Both,
        },
        wait: over.wait,
    };
    // A compacted parent is followed too (its result and kept description).
    let stored = crate::runs::Parent::load(&*store.shared(), parent).map_err(err)?;
    // The parent's model, policy, mode and floor go on unless this command says otherwise;
    // what the follow-up may touch is this command's grants.
    let base = run::RunOptions::from_stored(&stored.record().options).map_err(err)?;
    let opts = run::RunOptions {
        model: over.model.or(base.model),
        approve: over.approve.or(base.approve),
        mode: over.mode.or(base.mode),
        allow_shell: over.allow_shell,
        floor: base.floor,
        agent: base.agent,
        ..Default::default()
    };
    let grants = super::grants_for(config, over.allow_shell, false)?;
    // Refused before anything is recorded: a follow-up the grants do not allow leaves no run.
    let mut check = |f: &crate::runs::Fork| {
        crate::runs::define(f.goal.clone(), f.options.clone(), grants.clone()).map(|_| ())
    };
    let (fork, seeded) =
        crate::runs::continue_run(&*store.shared(), parent, &how, opts, &mut check)
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
