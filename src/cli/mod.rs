//! The `dagloop` command line: `run`, `resume`, `runs`, `show`, `decide`, `allow`, `revoke`,
//! `validate`, `graph`, `mock-llm`.
//!
//! A front-end over `engine`, `goal` and `llm`: it parses arguments, prints results and errors
//! (always JSON with a stable `code` on failure), shows progress, and turns Ctrl-C into
//! cancellation. It takes no decisions about runs.

#[macro_use]
mod out;
mod allow_cmd;
mod args;
mod cassette;
mod codes_cmd;
mod fork;
mod init_cmd;
mod memory_cmd;
mod session_cmd;
pub use allow_cmd::{AllowArgs, RevokeArgs};
pub use memory_cmd::MemoryArg;
mod alloc;
mod card;
mod policy_cmd;
mod progress;
mod replay;
mod review;
mod run;
mod runs;
mod schema_cmd;
mod serve_cmd;
mod store;
mod temporal_cmd;
mod test_cmd;
mod validate_cmd;

pub use alloc::{max_blocking_threads, purge_delay_ms, release_idle, tune_allocator};

pub use args::*;
use serve_cmd::*;
use store::*;
use validate_cmd::*;

use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;

use clap::{Parser, Subcommand, ValueEnum};
use serde_json::{Value, json};

use crate::check;
use crate::goal::Goal;
use crate::protocol::{Call, Solution};

/// The operator's configuration, when `--config` names one.
fn load_config(path: Option<&FsPath>) -> Result<Option<crate::config::Config>, CliError> {
    path.map(|p| crate::config::Config::load(p).map_err(|e| CliError::new(e.code(), e)))
        .transpose()
}

/// What this command's runs may touch: the configuration's grants, else the command line's
/// default (everything but the shell) or, for a server or worker (`closed`), the closed default;
/// `--allow-shell` adds the shell either way.
fn grants_for(
    config: Option<&crate::config::Config>,
    allow_shell: bool,
    closed: bool,
) -> Result<Arc<crate::grants::Grants>, CliError> {
    let cwd = std::env::current_dir().unwrap_or_default();
    let mut grants = match config {
        Some(c) => {
            let mut g = c.grants(&cwd).map_err(|e| CliError::new(e.code(), e))?;
            // At the terminal the user is the operator: a variable granted by name alone may
            // be sent anywhere the egress reaches (a server sends it nowhere).
            if !closed {
                g.secrets = g.secrets.with_unbound_anywhere();
            }
            g
        }
        None if closed => crate::grants::Grants::closed(&cwd),
        None => crate::grants::Grants::cli(allow_shell),
    };
    if allow_shell && let Some(k) = grants.kinds.as_mut() {
        k.insert("shell".into());
    }
    Ok(Arc::new(grants))
}

/// A command failed before or instead of producing a result.
#[derive(Debug)]
pub struct CliError {
    /// Stable error code.
    pub code: String,
    /// What went wrong.
    pub message: String,
    /// Extra structured details.
    pub details: Value,
}

impl CliError {
    pub(crate) fn new(code: impl Into<String>, message: impl ToString) -> Self {
        CliError {
            code: code.into(),
            message: message.to_string(),
            details: Value::Null,
        }
    }

    /// The JSON printed for this error.
    pub fn to_json(&self) -> Value {
        let mut e = json!({"code": self.code, "message": self.message});
        if !self.details.is_null() {
            e["details"] = self.details.clone();
        }
        json!({"status": "error", "error": e})
    }
}

/// Reports an argument error and returns the exit code. With `--json` among the arguments, a
/// usage error is printed on stdout as the documented JSON error (`cli.usage`, exit 2); help and
/// version requests, and usage errors without `--json`, are printed by clap as usual.
pub fn usage_error(err: &clap::Error, args: &[std::ffi::OsString]) -> i32 {
    use clap::error::ErrorKind;
    let informational = matches!(
        err.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    );
    if informational || !args.iter().any(|a| a == "--json") {
        let _ = err.print();
        return err.exit_code();
    }
    let text = err.render().to_string();
    let message = text
        .lines()
        .map(|l| l.trim_start_matches("error: ").trim())
        .find(|l| !l.is_empty())
        .unwrap_or("invalid arguments")
        .to_string();
    let mut e = CliError::new("cli.usage", message);
    e.details = json!({"usage": text.trim()});
    outln!("{}", pretty(&e.to_json()));
    2
}

/// Runs a parsed command; returns the process exit code (0 success, 1 the run or check did not
/// succeed, 2 bad input, 141 stdout was closed before everything was printed).
pub async fn main(mut cli: Cli) -> i32 {
    let store = || open_store(cli.store.as_deref(), cli.no_store, false);
    // `show`, `runs`, `decide` and `resume` only read or continue runs: a store file that does
    // not exist is refused (`store.not_found`), not created empty at a mistyped path.
    let existing = || open_store(cli.store.as_deref(), cli.no_store, true);
    crate::telemetry::logs::init(match cli.log_format {
        LogFormatArg::Text => crate::telemetry::logs::LogFormat::Text,
        LogFormatArg::Json => crate::telemetry::logs::LogFormat::Json,
    });
    let config = match crate::telemetry::init_from_env()
        .map_err(|e| CliError::new(e.code(), e))
        .and_then(|_| load_config(cli.config.as_deref()))
    {
        Ok(c) => c,
        Err(e) => {
            outln!("{}", pretty(&e.to_json()));
            return if out::stdout_closed() {
                out::BROKEN_PIPE_EXIT
            } else {
                2
            };
        }
    };
    let config = config.as_ref();
    // A run may be named by a unique prefix of its id, as `dagloop runs` lists them.
    if let Some(run) = cli.command.run_mut()
        && let Ok(Some(s)) = existing()
    {
        match store::resolve_run(&s, run) {
            Ok(full) => *run = full,
            Err(e) => {
                outln!("{}", pretty(&e.to_json()));
                return if out::stdout_closed() {
                    out::BROKEN_PIPE_EXIT
                } else {
                    2
                };
            }
        }
    }
    let outcome = match cli.command {
        Command::Run {
            goal,
            continue_from: Some(parent),
            carry,
            no_wait,
            model,
            approve,
            json,
            quiet,
            events,
            allow_shell,
            detach,
            decisions,
            on_no_reviewer,
            mode,
            tools_from,
            tools_from_passthrough,
            input: _,
            temporal,
        } => 'cont: {
            if temporal.engine == EngineArg::Temporal {
                break 'cont Err(CliError::new(
                    "cli.usage",
                    "--continue works with the embedded engine only",
                ));
            }
            let tools_from =
                match cassette::load_tools(tools_from.as_deref(), tools_from_passthrough) {
                    Ok(t) => t,
                    Err(e) => break 'cont Err(e),
                };
            let display = run::Display {
                json_only: json,
                quiet,
                events,
                detach,
                decisions,
                reject_without_reviewer: on_no_reviewer == NoReviewer::Reject,
                tools_from,
                webhook: config.and_then(|c| c.notify.webhook.clone()),
            };
            let over = session_cmd::Over {
                goal_or_text: goal,
                carry,
                wait: !no_wait,
                model,
                approve: run::approve_name(approve),
                mode: mode.map(run::mode_name),
                allow_shell,
            };
            match required(existing()) {
                Ok(s) => session_cmd::continue_run(s, &parent, over, config, display).await,
                Err(e) => Err(e),
            }
        }
        Command::Run {
            goal,
            continue_from: None,
            carry: _,
            no_wait: _,
            model,
            approve,
            json,
            quiet,
            events,
            allow_shell,
            detach,
            decisions,
            on_no_reviewer,
            mode,
            tools_from,
            tools_from_passthrough,
            input,
            temporal,
        } => 'run: {
            let input = match input
                .as_deref()
                .map(serde_json::from_str::<Value>)
                .transpose()
            {
                Ok(i) => i,
                Err(e) => {
                    break 'run Err(CliError::new(
                        "cli.bad_input",
                        format!("--input is not JSON: {e}"),
                    ));
                }
            };
            let tools_from =
                match cassette::load_tools(tools_from.as_deref(), tools_from_passthrough) {
                    Ok(t) => t,
                    Err(e) => break 'run Err(e),
                };
            if tools_from.is_some() && temporal.engine == EngineArg::Temporal {
                break 'run Err(CliError::new(
                    "cli.usage",
                    "--tools-from answers calls in this process: it works with the embedded engine only",
                ));
            }
            // The config's approval floor holds here too (the command line's user is the
            // operator, and a Temporal worker takes the floor from the run's options).
            let floor = match config.map(crate::config::Config::floor).transpose() {
                Ok(f) => f.and_then(|f| f.for_run(None)),
                Err(e) => break 'run Err(CliError::new("config.invalid", e)),
            };
            let opts = run::RunOptions {
                server: false,
                model,
                approve: run::approve_name(approve),
                allow_shell,
                mode: mode.map(run::mode_name),
                floor,
                ..Default::default()
            };
            let display = run::Display {
                json_only: json,
                quiet,
                events,
                detach,
                decisions,
                reject_without_reviewer: on_no_reviewer == NoReviewer::Reject,
                tools_from,
                webhook: config.and_then(|c| c.notify.webhook.clone()),
            };
            if temporal.engine == EngineArg::Temporal {
                if input.is_some() {
                    break 'run Err(CliError::new(
                        "cli.usage",
                        "--input works with the embedded engine only",
                    ));
                }
                match grants_for(config, allow_shell, false) {
                    Ok(g) => temporal_cmd::run(&goal, opts, g, &display, &temporal).await,
                    Err(e) => Err(e),
                }
            } else {
                // The store is opened once the goal holds (`run::run`): an invalid goal never
                // touches it.
                match grants_for(config, allow_shell, false) {
                    Ok(g) => run::run(run::Start::New(goal, input), opts, g, display, store).await,
                    Err(e) => Err(e),
                }
            }
        }
        Command::Resume {
            run: id,
            model,
            approve,
            json,
            quiet,
            events,
            allow_shell,
            detach,
            decisions,
            accept_changes,
            no_wait,
            on_no_reviewer,
            mode,
            tools_from,
            tools_from_passthrough,
        } => 'resume: {
            let tools_from =
                match cassette::load_tools(tools_from.as_deref(), tools_from_passthrough) {
                    Ok(t) => t,
                    Err(e) => break 'resume Err(e),
                };
            let display = run::Display {
                json_only: json,
                quiet,
                events,
                detach,
                decisions,
                reject_without_reviewer: on_no_reviewer == NoReviewer::Reject,
                tools_from,
                webhook: config.and_then(|c| c.notify.webhook.clone()),
            };
            let over = run::RunOptions {
                server: false,
                model,
                approve: run::approve_name(approve),
                allow_shell,
                mode: mode.map(run::mode_name),
                ..Default::default()
            };
            let how = Resuming {
                accept_changes,
                wait: !no_wait,
            };
            resume(&id, existing(), over, how, config, display).await
        }
        Command::Fork {
            run: id,
            at_step,
            model,
            input,
            json,
            quiet,
            allow_shell,
            decisions,
            on_no_reviewer,
            tools_from,
            tools_from_passthrough,
            temporal,
        } => 'fork: {
            let tools_from =
                match cassette::load_tools(tools_from.as_deref(), tools_from_passthrough) {
                    Ok(t) => t,
                    Err(e) => break 'fork Err(e),
                };
            let display = run::Display {
                json_only: json,
                quiet,
                events: None,
                detach: false,
                decisions,
                reject_without_reviewer: on_no_reviewer == NoReviewer::Reject,
                tools_from,
                webhook: config.and_then(|c| c.notify.webhook.clone()),
            };
            let over = fork::Over {
                at_step,
                model,
                input,
                allow_shell,
            };
            if temporal.engine == EngineArg::Temporal {
                break 'fork temporal_cmd::fork(&id, over, config, &display, &temporal).await;
            }
            match required(existing()) {
                Ok(s) => fork::fork(s, &id, over, config, display).await,
                Err(e) => Err(e),
            }
        }
        Command::Test {
            paths,
            crash_each_point,
            junit,
        } => {
            test_cmd::test(
                &paths,
                crash_each_point,
                junit.as_deref(),
                cli.config.as_deref(),
            )
            .await
        }
        Command::Runs {
            action,
            json,
            status,
            query,
            limit,
            stats,
            session,
        } => match (required(existing()), action) {
            (Ok(s), None) if stats => s
                .stats()
                .map(|v| {
                    outln!("{}", pretty(&v));
                    0
                })
                .map_err(|e| CliError::new(e.code(), e)),
            (Ok(s), None) => {
                let mut params = Vec::new();
                for (k, v) in [
                    ("status", status),
                    ("q", query),
                    ("limit", limit),
                    ("session", session),
                ] {
                    if let Some(v) = v {
                        params.push((k, v));
                    }
                }
                runs::list(&s, &params, json)
            }
            (
                Ok(s),
                Some(RunsAction::Prune {
                    retain,
                    compact_after,
                }),
            ) => runs::prune(&s, retain.as_deref(), compact_after.as_deref(), config),
            (Ok(s), Some(RunsAction::Compact { runs: ids })) => runs::compact(&s, &ids),
            (Err(e), _) => Err(e),
        },
        Command::Show {
            run: id,
            json,
            temporal,
            ..
        } if temporal.engine == EngineArg::Temporal => {
            temporal_cmd::show(&id, json, &temporal).await
        }
        Command::Export { run: id, cassette } => {
            required(existing()).and_then(|s| cassette::export(&*s.shared(), &id, &cassette))
        }
        Command::Replay { run: id } => {
            required(existing()).and_then(|s| replay::replay(&*s.shared(), &id))
        }
        Command::Show {
            run: id,
            json,
            audit: true,
            ..
        } => required(existing()).and_then(|s| runs::audit(&s, &id, json)),
        Command::Show {
            run: id,
            json,
            trace,
            ..
        } => required(existing()).and_then(|s| runs::show(&s, &id, json, trace)),
        Command::Policy {
            what:
                PolicyArg::Explain {
                    goal,
                    call,
                    approve,
                    agent,
                    server,
                    json,
                },
        } => policy_cmd::explain(
            config,
            policy_cmd::ExplainArgs {
                goal: goal.as_deref(),
                call: &call,
                approve: run::approve_name(approve),
                agent: agent.as_deref(),
                server: server.as_deref(),
                json,
            },
        ),
        Command::Decide {
            run: id,
            call,
            decision,
            temporal,
            presentation,
        } if temporal.engine == EngineArg::Temporal => match decision_of(decision) {
            Ok(d) => {
                let op = crate::protocol::Op::Decide {
                    call: crate::protocol::CallId(call),
                    decision: d,
                    presented: None,
                    presentation,
                    by: Some(me(crate::protocol::Actor::CLI)),
                };
                temporal_cmd::decide(&id, op, &temporal).await
            }
            Err(e) => Err(e),
        },
        Command::Worker { temporal } => match grants_for(config, false, true) {
            Ok(g) => {
                let hook = config.and_then(|c| c.notify.webhook.clone());
                temporal_cmd::worker(&temporal, g, hook).await
            }
            Err(e) => Err(e),
        },
        Command::Decide {
            run: id,
            call,
            decision,
            presentation,
            ..
        } => match (required(existing()), decision_of(decision)) {
            (Ok(s), Ok(d)) => runs::decide(
                &s,
                &id,
                crate::protocol::Op::Decide {
                    call: crate::protocol::CallId(call),
                    decision: d,
                    presented: None,
                    presentation,
                    by: Some(me(crate::protocol::Actor::CLI)),
                },
            ),
            (Err(e), _) | (_, Err(e)) => Err(e),
        },
        Command::Allow(a) => allow_cmd::allow(a, existing()).await,
        Command::Revoke(a) => allow_cmd::revoke(a, existing()).await,
        Command::Schema { goal, mode } => schema_cmd::schema(&goal, mode),
        Command::Codes { code, json } => codes_cmd::codes(code.as_deref(), json),
        Command::Memory { action } => {
            grants_for(config, false, false).and_then(|g| memory_cmd::memory(action, &g))
        }
        Command::Validate {
            file,
            goal,
            allow_shell,
        } => {
            grants_for(config, allow_shell, false).and_then(|g| validate(&file, goal.as_deref(), g))
        }
        Command::Graph { file, format } => graph(&file, format, || required(existing())),
        Command::Init { dir } => init_cmd::init(dir.as_deref().unwrap_or(FsPath::new("."))),
        Command::MockLlm { script, port } => mock_llm(&script, port).await,
        Command::Serve {
            addr,
            allow_shell,
            allow_host,
            principals,
            temporal,
        } => match grants_for(config, allow_shell, true) {
            Ok(g) => {
                serve(
                    addr,
                    g,
                    config,
                    allow_host,
                    principals.as_deref(),
                    (cli.store.as_deref(), cli.no_store),
                    &temporal,
                )
                .await
            }
            Err(e) => Err(e),
        },
    };
    let code = match outcome {
        Ok(code) => code,
        Err(e) => {
            outln!("{}", pretty(&e.to_json()));
            if e.code.starts_with("op.") { 1 } else { 2 }
        }
    };
    if out::stdout_closed() {
        out::BROKEN_PIPE_EXIT
    } else {
        code
    }
}

fn decision_of(d: DecideArg) -> Result<crate::protocol::Decision, CliError> {
    use crate::protocol::Decision;
    let json = |what: &str, text: &str| -> Result<Value, CliError> {
        serde_json::from_str(text)
            .map_err(|e| CliError::new("cli.bad_decision", format!("--{what} is not JSON: {e}")))
    };
    Ok(match d {
        DecideArg::Approve => Decision::Approve,
        DecideArg::Reject { reason } => Decision::Reject { reason },
        DecideArg::SendBack { feedback } => Decision::SendBack { feedback },
        DecideArg::Edit { params } => match json("params", &params)? {
            Value::Object(params) => Decision::Edit { params },
            _ => {
                return Err(CliError::new(
                    "cli.bad_decision",
                    "--params must be a JSON object",
                ));
            }
        },
        DecideArg::Done { result } => Decision::Done {
            result: json("result", &result)?,
        },
        DecideArg::Replace { call } => Decision::Replace {
            call: Box::new(
                Call::parse(json("call", &call)?)
                    .map_err(|e| CliError::new("cli.bad_decision", format!("--call: {e}")))?,
            ),
        },
    })
}

/// How `resume` continues a run: with the definition as it is now (`--accept-changes`), and
/// whether it waits for another process that drives the run (not with `--no-wait`).
struct Resuming {
    accept_changes: bool,
    wait: bool,
}

/// How often `resume` tries again for a run another process drives: a holder on this host
/// that is gone is taken over at once, one elsewhere once its lease expires.
const CLAIM_EVERY: std::time::Duration = std::time::Duration::from_millis(250);

/// Takes the run's lease. While another live process holds it: `store.busy` without `wait`;
/// with it, one line on stderr saying who holds it and for how long (again when the holder
/// changes), then tries again every [`CLAIM_EVERY`] until the lease is free, expired, or its
/// holder is gone.
async fn claim(s: &Store, id: &str, wait: bool) -> Result<(), CliError> {
    let mut told: Option<String> = None;
    loop {
        match s.claim(id) {
            Ok(()) => return Ok(()),
            Err(crate::store::StoreError::Busy {
                owner, remaining_s, ..
            }) if wait => {
                if told.as_deref() != Some(owner.as_str()) {
                    errln!(
                        "dagloop: run {id} is being run by {owner}; its lease runs for another {remaining_s} s (renewed while that process drives the run): waiting for it to let go (--no-wait to refuse instead)"
                    );
                    told = Some(owner);
                }
                tokio::time::sleep(CLAIM_EVERY).await;
            }
            Err(e) => return Err(CliError::new(e.code(), e)),
        }
    }
}

async fn resume(
    id: &str,
    store: Result<Option<Store>, CliError>,
    over: run::RunOptions,
    how: Resuming,
    config: Option<&crate::config::Config>,
    display: run::Display,
) -> Result<i32, CliError> {
    let s = required(store)?;
    let finished = |r: &crate::machine::RunResult| {
        let mut v = serde_json::to_value(r).unwrap_or(Value::Null);
        v["run_id"] = json!(id);
        outln!("{}", pretty(&v));
        Ok(if r.succeeded() { 0 } else { 1 })
    };
    let stored = match s.load(id) {
        // A compacted run is finished: its result is kept.
        Err(crate::store::StoreError::Compacted { .. }) => {
            if let Some(c) = s.compacted(id).map_err(|e| CliError::new(e.code(), e))? {
                return finished(&c.result);
            }
            s.load(id)
        }
        other => other,
    }
    .map_err(|e| CliError::new(e.code(), e))?;
    if let Some(r) = &stored.result {
        return finished(r);
    }
    // The lease decides who drives the run (another process that holds it is waited for, or
    // `store.busy` with --no-wait); the journal is read again once it is ours, so that no
    // entry another process appended before it let go is missed.
    claim(&s, id, how.wait).await?;
    let stored = match s.load(id) {
        Ok(stored) => stored,
        Err(e) => {
            let _ = s.release(id);
            return Err(CliError::new(e.code(), e));
        }
    };
    if let Some(r) = &stored.result {
        let _ = s.release(id);
        return finished(r);
    }
    let mut opts = run::RunOptions::from_stored(&stored.record.options)
        .map_err(|e| CliError::new(e.code(), &e))?;
    if over.model.is_some() {
        opts.model = over.model;
    }
    if over.approve.is_some() {
        opts.approve = over.approve;
    }
    if over.mode.is_some() {
        opts.mode = over.mode;
    }
    opts.allow_shell |= over.allow_shell;
    if how.accept_changes {
        opts.definition.clear();
    }
    let grants = match grants_for(config, opts.allow_shell, false) {
        Ok(g) => g,
        Err(e) => {
            let _ = s.release(id);
            return Err(e);
        }
    };
    let ran = run::run(
        run::Start::Resume(Box::new(stored)),
        opts,
        grants,
        display,
        || Ok(Some(s.clone())),
    )
    .await;
    // However it went, the lease does not stay with this process: refused before it was driven
    // (no reviewer, a goal that no longer loads, a definition that changed), stopped while it
    // was being set up, or stopped by a failed write. (A finished or parked run, and one whose
    // lease another process took, hold none of this process's: nothing changes.)
    let _ = s.release(id);
    ran
}

fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
}

/// The user at this terminal (`$USER`, else `local`) as the author of a decision.
pub(crate) fn me(channel: &str) -> crate::protocol::Actor {
    let user = std::env::var("USER")
        .ok()
        .filter(|u| !u.trim().is_empty())
        .unwrap_or_else(|| "local".into());
    crate::protocol::Actor::new(user, channel)
}
