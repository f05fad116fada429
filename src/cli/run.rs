//! `dagloop run` and `dagloop resume`: build the agent, attach the store, the reviewer, the
//! progress view and the events file, run (or continue) it, print the result.

use std::io::{IsTerminal, Write};
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::{ApproveArg, CliError, pretty, progress, review};
use crate::approval::{Mode, Policy};
use crate::engine::RunHandle;
use crate::goal::Goal;
use crate::runs::Review;
use crate::store::RunStore;

pub(super) use crate::runs::RunOptions;

pub(super) fn mode_name(m: super::ModeArg) -> String {
    match m {
        super::ModeArg::Structured => "structured",
        super::ModeArg::Tools => "tools",
    }
    .to_string()
}

/// What the front-end does around the run (not recorded).
pub(super) struct Display {
    pub json_only: bool,
    /// No progress lines (the result and errors still print).
    pub quiet: bool,
    pub events: Option<PathBuf>,
    pub detach: bool,
    /// Decisions given up front (`--decisions FILE`).
    pub decisions: Option<PathBuf>,
    /// Without a terminal and without decisions: reject what needs a reviewer instead of
    /// refusing to start.
    pub reject_without_reviewer: bool,
}

/// True when some call of the run may have to be presented to somebody.
fn may_ask(policy: &Policy, goal: &Goal) -> bool {
    policy.mode != Mode::Auto
        || goal
            .tools
            .iter()
            .any(|t| t.approval == Some(crate::protocol::ToolApproval::Always))
}

/// The scripted-model file a run uses, when it names one (`--model scripted:PATH`, else the
/// goal's `model`), if that file carries a `decisions` list.
fn scripted_decisions(goal: &Goal, model: Option<&str>) -> Option<PathBuf> {
    let path = match model {
        Some(m) => PathBuf::from(m.strip_prefix("scripted:")?),
        None => goal.resolve_path(goal.model.as_deref()?.strip_prefix("scripted:")?),
    };
    let text = std::fs::read_to_string(&path).ok()?;
    let v: Value = serde_json::from_str(&text).ok()?;
    v.get("decisions").is_some().then_some(path)
}

/// `{"decisions": [{"tool": NAME} or {"call": ID}, plus a protocol Decision]}`.
fn load_decisions(path: &FsPath) -> Result<crate::approval::ScriptedApprover, CliError> {
    // A decisions file, or a scripted-model file carrying the same list beside its turns.
    #[derive(serde::Deserialize)]
    struct File {
        decisions: Vec<Value>,
    }
    let bad = |reason: String| {
        CliError::new("cli.bad_decisions", format!("{}: {reason}", path.display()))
    };
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let file: File = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let mut a = crate::approval::ScriptedApprover::new()
        .otherwise(crate::protocol::Decision::Reject {
            reason: "no decision was given for this call (--decisions)".into(),
        })
        .by(super::me(crate::protocol::Actor::DECISIONS_FILE));
    for (i, mut d) in file.decisions.into_iter().enumerate() {
        // `call` selects by id when it is a number; a replace carries its new call there.
        let (tool, call) = match d.as_object_mut() {
            Some(m) => {
                let by_id = m.get("call").is_some_and(Value::is_u64);
                (
                    m.remove("tool"),
                    if by_id { m.remove("call") } else { None },
                )
            }
            None => (None, None),
        };
        let decision: crate::protocol::Decision =
            serde_json::from_value(d).map_err(|e| bad(format!("decisions[{i}]: {e}")))?;
        a = match (
            tool.as_ref().and_then(Value::as_str),
            call.as_ref().and_then(Value::as_u64),
        ) {
            (Some(t), None) => a.for_tool(t, decision),
            (None, Some(c)) => a.for_call(crate::protocol::CallId(c), decision),
            _ => {
                return Err(bad(format!(
                    "decisions[{i}]: give exactly one of `tool` or `call`"
                )));
            }
        };
    }
    Ok(a)
}

/// The run's policy: the goal's, with the command line's `--approve` over it.
pub(super) fn policy_for(goal: &Goal, approve: Option<&str>) -> Result<Policy, CliError> {
    crate::runs::policy_for(goal, approve).map_err(|e| CliError::new(e.code(), e))
}

pub(super) fn approve_name(a: Option<ApproveArg>) -> Option<String> {
    a.map(|a| {
        match a {
            ApproveArg::Auto => "auto",
            ApproveArg::Allowlist => "allowlist",
            ApproveArg::Ask => "ask",
        }
        .to_string()
    })
}

/// A run to start, or one to continue.
pub(super) enum Start {
    New(PathBuf),
    Resume(Box<crate::store::StoredRun>),
}

pub(super) async fn run(
    start: Start,
    opts: RunOptions,
    display: Display,
    store: Option<Arc<crate::store::SqliteStore>>,
) -> Result<i32, CliError> {
    let (goal, run_id, journal) = match start {
        Start::New(path) => {
            let goal = Goal::load(&path).map_err(|e| CliError::new(e.code(), &e))?;
            (goal, None, None)
        }
        Start::Resume(stored) => {
            let doc = stored.record.goal.to_string();
            let base = PathBuf::from(&stored.record.base_dir);
            let goal = Goal::from_json(&doc, FsPath::new(&stored.record.id), base)
                .map_err(|e| CliError::new(e.code(), &e))?;
            (goal, Some(stored.record.id.clone()), Some(stored.journal))
        }
    };
    let policy = policy_for(&goal, opts.approve.as_deref())?;
    let cancel = CancellationToken::new();
    let interactive = std::io::stdin().is_terminal() && !display.detach;
    let tools: std::collections::BTreeMap<String, crate::protocol::Tool> = goal
        .tools
        .iter()
        .map(|t| (t.name.clone(), t.clone()))
        .collect();
    let asks = may_ask(&policy, &goal);
    let decisions = match &display.decisions {
        Some(p) => Some(p.clone()),
        None if !interactive => scripted_decisions(&goal, opts.model.as_deref()),
        None => None,
    };
    let review = if let Some(path) = &decisions {
        Review::Approver(Arc::new(load_decisions(path)?))
    } else if display.detach || interactive || !asks {
        Review::External
    } else if display.reject_without_reviewer {
        Review::Approver(Arc::new(
            crate::approval::ScriptedApprover::new().otherwise(crate::protocol::Decision::Reject {
                reason:
                    "approval required but no reviewer is attached (no terminal, no --decisions)"
                        .into(),
            }),
        ))
    } else {
        return Err(CliError::new(
            "approval.no_reviewer",
            "the approval policy can ask a reviewer, but stdin is not a terminal: give --decisions FILE, --detach (decide later with `dagloop decide`), or --on-no-reviewer reject",
        ));
    };
    let resume = run_id.zip(journal);
    let sink = store.as_ref().map(|s| crash_hook(s.clone()));
    let prepared = crate::runs::prepare(
        crate::tools::Registry::new(),
        goal,
        &opts,
        resume,
        review,
        cancel.clone(),
        crate::runs::Host {
            store: store.clone(),
            sink,
            owner_pid: std::process::id(),
            mcp: None,
        },
    )
    .await
    .map_err(|e| CliError::new(e.code(), &e))?;
    let id = prepared.run_id().to_string();
    if let Some(s) = &store {
        if display.json_only {
            eprintln!("{}", json!({"run_id": id}));
        } else {
            eprintln!("dagloop: run {id} (store {})", s.path().display());
        }
    }
    // The events file is created only once the agent is built, so bad input leaves no file.
    let events_out = match &display.events {
        Some(path) => Some(std::fs::File::create(path).map_err(|e| {
            CliError::new(
                "cli.events_file",
                format!("cannot create {}: {e}", path.display()),
            )
        })?),
        None => None,
    };
    let launched = prepared
        .start()
        .await
        .map_err(|e| CliError::new(e.code(), &e))?;
    for e in &launched.refused {
        eprintln!(
            "dagloop: a recorded decision does not apply: {e} [{}]",
            e.code()
        );
    }
    let _servers = launched.servers;
    let handle = launched.handle;
    let writer = events_out.map(|file| spawn_writer(&handle, file));
    let ops = store.clone().map(|s| {
        crate::runs::spawn_op_poller(&handle, s, |e| {
            eprintln!(
                "dagloop: a recorded decision does not apply: {e} [{}]",
                e.code()
            )
        })
    });
    let screen = Arc::new(review::Screen::default());
    let reviewer = (interactive && decisions.is_none() && asks)
        .then(|| tokio::spawn(review::serve(handle.clone(), tools, screen.clone())));
    let progress = (!display.json_only && !display.quiet).then(|| {
        tokio::spawn(progress::show(
            handle.subscribe_from(0),
            std::io::stderr().is_terminal(),
            screen.clone(),
        ))
    });
    let ctrl_c = {
        let cancel = cancel.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                cancel.cancel();
            }
            // A second Ctrl-C leaves at once.
            if tokio::signal::ctrl_c().await.is_ok() {
                eprintln!("\ndagloop: interrupted twice, leaving now");
                std::process::exit(130);
            }
        })
    };
    let result = if display.detach {
        handle.wait_or_idle().await
    } else {
        Some(handle.wait().await)
    };
    ctrl_c.abort();
    if let Some(r) = reviewer {
        r.abort();
    }
    if let Some(t) = ops {
        t.abort();
    }
    let Some(result) = result else {
        // Detached: the run waits for decisions (`dagloop decide`, then `dagloop resume`).
        let awaiting: Vec<Value> = handle
            .awaiting()
            .into_iter()
            .map(|(id, call, hash)| json!({"call_id": id, "call": call, "params_hash": hash}))
            .collect();
        for t in [writer, progress].into_iter().flatten() {
            t.abort();
        }
        drop(handle);
        println!(
            "{}",
            pretty(&json!({"status": "waiting", "run_id": id, "awaiting": awaiting}))
        );
        return Ok(0);
    };
    if let Some(s) = &store
        && let Err(e) = s.finish(&id, &result)
    {
        eprintln!("dagloop: could not record the run's end: {e}");
    }
    for task in [writer, progress].into_iter().flatten() {
        // Both end once they have seen `run_finished`; the wait is bounded all the same (generously:
        // on a loaded machine a 2 s bound once cut an events file short).
        let mut task = task;
        if tokio::time::timeout(std::time::Duration::from_secs(10), &mut task)
            .await
            .is_err()
        {
            task.abort();
        }
    }
    drop(handle);
    let mut value = serde_json::to_value(&result).unwrap_or(Value::Null);
    if store.is_some() {
        value["run_id"] = json!(id);
    }
    println!("{}", pretty(&value));
    Ok(if result.succeeded() { 0 } else { 1 })
}

fn spawn_writer(handle: &RunHandle, file: std::fs::File) -> tokio::task::JoinHandle<()> {
    let mut sub = handle.subscribe_from(0);
    tokio::spawn(async move {
        let mut out = std::io::BufWriter::new(file);
        while let Some(ev) = sub.recv().await {
            // Model deltas are too many to keep; call progress is kept (both are live only).
            if matches!(ev.kind, crate::protocol::EventKind::ModelDelta { .. }) {
                continue;
            }
            if let Ok(line) = serde_json::to_string(&*ev) {
                let _ = writeln!(out, "{line}");
            }
        }
        let _ = out.flush();
    })
}

/// For crash tests: with `DAGLOOP_CRASH_AFTER_ENTRIES=N`, the process kills itself (SIGKILL)
/// as soon as N journal entries of this process are committed, the way a crash would.
fn crash_hook(store: Arc<crate::store::SqliteStore>) -> Arc<dyn crate::engine::JournalSink> {
    let Some(limit) = std::env::var("DAGLOOP_CRASH_AFTER_ENTRIES")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    else {
        return store;
    };
    Arc::new(CrashAfter {
        store,
        limit,
        seen: std::sync::atomic::AtomicU64::new(0),
    })
}

struct CrashAfter {
    store: Arc<crate::store::SqliteStore>,
    limit: u64,
    seen: std::sync::atomic::AtomicU64,
}

impl crate::engine::JournalSink for CrashAfter {
    fn append<'a>(
        &'a self,
        run_id: &'a str,
        entries: &'a [crate::machine::JournalEntry],
    ) -> crate::engine::JournalFuture<'a> {
        Box::pin(async move {
            self.store.append(run_id, entries).await?;
            let n = entries.len() as u64;
            let seen = self.seen.fetch_add(n, std::sync::atomic::Ordering::SeqCst) + n;
            if seen >= self.limit {
                let pid = std::process::id().to_string();
                let _ = std::process::Command::new("kill")
                    .args(["-9", &pid])
                    .status();
                std::future::pending::<()>().await;
            }
            Ok(())
        })
    }
}

pub(super) fn now_ms() -> u64 {
    crate::runs::now_ms()
}
