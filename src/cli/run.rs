//! `dagloop run` and `dagloop resume`: build the agent, attach the store, the reviewer, the
//! progress view and the events file, run (or continue) it, print the result.

use std::io::{IsTerminal, Write};
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::{ApproveArg, CliError, pretty, progress, review};
use crate::approval::ModeName;
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
    /// Answer calls from a tools recording (`--tools-from`), with passthrough or not.
    pub tools_from: Option<(Arc<crate::runs::Cassette>, bool)>,
    /// The operator's webhook (`notify.webhook` in `--config`): told of each call presented.
    pub webhook: Option<crate::notify::WebhookConfig>,
}

/// True when the stored run, continued now, presents calls to a reviewer at once: calls that
/// were waiting for a decision, and calls cut off mid-call whose tool is not idempotent.
/// Decisions recorded meanwhile (`queued`: `dagloop decide`, the page) apply first: a run whose
/// every waiting call was decided asks nothing at once.
fn presents_on_resume(stored: &crate::store::StoredRun, queued: Vec<crate::protocol::Op>) -> bool {
    let Ok(mut machine) = crate::runs::rebuild_machine(&stored.record, &stored.journal) else {
        return false;
    };
    let now = now_ms();
    // In the order a resume applies them: the run resumes (calls cut off mid-call go back
    // through the gate), then the queued decisions apply (a call they approve is dispatched,
    // not cut off).
    machine.handle(crate::machine::RunInput::Resumed, now);
    for op in queued {
        if let Ok(op) = machine.bind_op(op) {
            machine.handle(crate::machine::RunInput::from_op(op), now);
        }
    }
    !machine.awaiting().is_empty()
}

/// The scripted-model file a run uses, when it names one (`--model scripted:PATH`, else the
/// goal's `model`), if that file carries a `decisions` list.
fn scripted_decisions(goal: &Goal, model: Option<&str>) -> Option<PathBuf> {
    // With fallback models, the first scripted one.
    let scripted = |specs: &str| -> Option<String> {
        specs
            .split(',')
            .find_map(|one| one.trim().strip_prefix("scripted:").map(str::to_string))
    };
    let path = match model {
        Some(m) => PathBuf::from(scripted(m)?),
        None => goal.resolve_path(&scripted(goal.model.as_deref()?)?),
    };
    let text = std::fs::read_to_string(&path).ok()?;
    let v: Value = serde_json::from_str(&text).ok()?;
    v.get("decisions").is_some().then_some(path)
}

/// Standing approvals a decisions file gives (its `{"allow": {...}}` entries; `grant`, their
/// name before the rename, still reads), journaled at the run's start.
type FileStanding = Vec<(
    crate::protocol::StandingSpec,
    Option<crate::protocol::Actor>,
)>;

/// `{"decisions": [{"tool": NAME} or {"call": ID}, plus a protocol Decision, or {"allow":
/// STANDING}]}`.
fn load_decisions(
    path: &FsPath,
) -> Result<(crate::approval::ScriptedApprover, FileStanding), CliError> {
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
    let mut standing = Vec::new();
    for (i, mut d) in file.decisions.into_iter().enumerate() {
        let key = ["allow", "grant"].into_iter().find(|k| d.get(k).is_some());
        if let Some(key) = key {
            let spec: crate::protocol::StandingSpec = serde_json::from_value(d[key].clone())
                .map_err(|e| bad(format!("decisions[{i}].{key}: {e}")))?;
            crate::approval::standing::check(&spec, |_| true)
                .map_err(|e| bad(format!("decisions[{i}].{key}: {e}")))?;
            standing.push((
                spec,
                Some(super::me(crate::protocol::Actor::DECISIONS_FILE)),
            ));
            continue;
        }
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
    Ok((a, standing))
}

pub(super) fn approve_name(a: Option<ApproveArg>) -> Option<ModeName> {
    a.map(|a| match a {
        ApproveArg::Auto => ModeName::Auto,
        ApproveArg::Allowlist => ModeName::Allowlist,
        ApproveArg::Ask => ModeName::Ask,
    })
}

/// A run to start, or one to continue.
pub(super) enum Start {
    /// A goal file, with the input that replaces its own (`--input`).
    New(PathBuf, Option<Value>),
    Resume(Box<crate::store::StoredRun>),
}

pub(super) async fn run(
    start: Start,
    opts: RunOptions,
    grants: Arc<crate::grants::Grants>,
    display: Display,
    store: impl FnOnce() -> Result<Option<super::Store>, CliError>,
) -> Result<i32, CliError> {
    let mut resumed_asks = false;
    // A new run opens the store only once its goal has loaded and its definition holds: a goal
    // that is refused never touches (or creates) the store. A resumed run needs it at once.
    let mut open = Some(store);
    let mut store: Option<super::Store> = None;
    // Listening from here on: a SIGTERM while the run is being set up stops it once it starts.
    let mut term = crate::signals::terminate();
    // Ctrl-C likewise: caught from here on, not from when the task that cancels the run is first
    // polled (a Ctrl-C in between, on a busy machine, killed the process without a result).
    let mut interrupt = crate::signals::interrupt();
    let (goal, run_id, journal) = match start {
        Start::New(path, input) => {
            // A run whose every call is answered from a recording needs no placeholder's value.
            let offline = matches!(&display.tools_from, Some((_, false)));
            let load = if offline {
                Goal::load_offline
            } else {
                Goal::load
            };
            let mut goal = load(&path).map_err(|e| CliError::new(e.code(), &e))?;
            if input.is_some() {
                let doc = serde_json::to_value(&goal).unwrap_or(Value::Null);
                goal = crate::runs::goal_with_input(&doc, input, &path, goal.base_dir.clone())
                    .map_err(|e| CliError::new(e.code(), &e))?;
            }
            (goal, None, None)
        }
        Start::Resume(stored) => {
            store = open.take().map(|f| f()).transpose()?.flatten();
            let queued = store
                .as_ref()
                .and_then(|s| s.shared().queued_ops(&stored.record.id).ok())
                .unwrap_or_default();
            resumed_asks = presents_on_resume(&stored, queued);
            let doc = stored.record.goal.to_string();
            let base = PathBuf::from(&stored.record.base_dir);
            let goal = Goal::from_json(&doc, FsPath::new(&stored.record.id), base)
                .map_err(|e| CliError::new(e.code(), &e))?;
            (goal, Some(stored.record.id.clone()), Some(stored.journal))
        }
    };
    let def =
        crate::runs::define(goal, opts.clone(), grants).map_err(|e| CliError::new(e.code(), &e))?;
    if let Some(f) = open.take() {
        store = f()?;
    }
    // The webhook is checked before anything is recorded. A resumed run notifies only what it
    // presents from now on (as `serve` does).
    let notify_since = if journal.is_some() { now_ms() } else { 0 };
    let notifier = match &display.webhook {
        Some(w) => {
            Some(crate::notify::Notifier::start_owned(w).map_err(|e| CliError::new(e.code(), &e))?)
        }
        None => None,
    };
    let goal = def.effective_goal();
    let cancel = CancellationToken::new();
    let interactive = std::io::stdin().is_terminal() && !display.detach;
    let tools: std::collections::BTreeMap<String, crate::protocol::Tool> = goal
        .tools
        .iter()
        .map(|t| (t.name.clone(), t.clone()))
        .collect();
    let decisions = match &display.decisions {
        Some(p) => Some(p.clone()),
        None if !interactive => scripted_decisions(goal, opts.model.as_deref()),
        None => None,
    };
    let mut file_standing = Vec::new();
    // A resumed run with nothing to ask at once (every waiting call decided meanwhile) goes on
    // without a terminal, as if detached: should it come to ask again, it waits for a decision
    // and the process says how to give one.
    let detach = display.detach
        || (journal.is_some()
            && !interactive
            && decisions.is_none()
            && !display.reject_without_reviewer
            && !resumed_asks);
    let review = if let Some(path) = &decisions {
        let (approver, standing) = load_decisions(path)?;
        // A resumed run has its standing approvals in its journal already.
        if journal.is_none() {
            file_standing = standing;
        }
        Review::Approver(Arc::new(approver))
    } else if detach || interactive {
        Review::External
    } else if display.reject_without_reviewer {
        Review::Approver(Arc::new(
            crate::approval::ScriptedApprover::new()
                .otherwise(crate::protocol::Decision::Reject {
                    reason:
                        "approval required but no reviewer is attached (no terminal, no --decisions)"
                            .into(),
                })
                .by(super::me(crate::protocol::Actor::POLICY)),
        ))
    } else if resumed_asks {
        // A resumed run may present calls whatever its policy (those cut off mid-call go back
        // through the gate): it needs a reviewer as much as a policy that asks.
        return Err(CliError::new(
            "approval.no_reviewer",
            "this run presents calls to a reviewer as it goes on, but stdin is not a terminal: give --decisions FILE, --detach (decide later with `dagloop decide`), or --on-no-reviewer reject",
        ));
    } else {
        // Whether the run can ask is known once its tools are: the builder answers, with the
        // tools of the goal's MCP servers and delegates.
        Review::Nobody {
            how: "stdin is not a terminal: give --decisions FILE, --detach (decide later with `dagloop decide`), or --on-no-reviewer reject".into(),
        }
    };
    let resume = run_id.zip(journal);
    let sink = store.as_ref().map(|s| crash_hook(s.shared()));
    // SIGTERM (what service managers send) stops the process and leaves the run resumable;
    // Ctrl-C cancels the run.
    let sigterm = async {
        match term.as_mut() {
            Some(s) => {
                s.recv().await;
            }
            None => std::future::pending::<()>().await,
        }
    };
    tokio::pin!(sigterm);
    let preparing = crate::runs::prepare(
        crate::tools::Registry::new(),
        &def,
        resume,
        review,
        cancel.clone(),
        crate::runs::Host {
            store: store.as_ref().map(super::Store::shared),
            sink,
            mcp: None,
            tools_from: display.tools_from.clone(),
            standing: file_standing,
        },
    );
    // Setting up can take long (MCP servers starting): SIGTERM stops it too (the servers
    // started so far are killed). A run already recorded is left as it is, resumable.
    let prepared = tokio::select! {
        biased;
        p = preparing => p.map_err(|e| CliError::new(e.code(), &e))?,
        () = &mut sigterm => {
            errln!("dagloop: stopped by SIGTERM while the run was being set up");
            outln!(
                "{}",
                pretty(&json!({"status": "stopped", "reason": "SIGTERM"}))
            );
            return Ok(STOPPED_EXIT);
        }
    };
    let id = prepared.run_id().to_string();
    let asks = prepared.who_asks().is_some() || resumed_asks;
    // What the terminal's card of a call is rebuilt from (with the live journal): no store needed.
    let record = prepared.record(&def);
    if let Some(s) = &store {
        if display.json_only {
            errln!("{}", json!({"run_id": id}));
        } else {
            errln!("dagloop: run {id} (store {})", s.path().display());
        }
    }
    // Refused before it was driven: the run is left to the next process at once.
    let let_go = |e: CliError| {
        if let Some(s) = &store {
            let _ = s.release(&id);
        }
        e
    };
    // The events file is created only once the agent is built, so bad input leaves no file.
    let events_out = match &display.events {
        Some(path) => Some(std::fs::File::create(path).map_err(|e| {
            let_go(CliError::new(
                "cli.events_file",
                format!("cannot create {}: {e}", path.display()),
            ))
        })?),
        None => None,
    };
    let launched = prepared
        .start()
        .await
        .map_err(|e| let_go(CliError::new(e.code(), &e)))?;
    for e in &launched.refused {
        errln!(
            "dagloop: a recorded decision does not apply: {e} [{}]",
            e.code()
        );
    }
    let servers = launched.servers;
    let handle = launched.handle;
    // No page here: links only when the config names one (`page_url`).
    let notifications = notifier.map(|(n, d)| {
        let watcher = n.watch(&handle, "", notify_since);
        Notifications(n, d, watcher)
    });
    // Tells the events writer to write what it has been sent and stop.
    let stop_writer = CancellationToken::new();
    let writer = events_out.map(|file| spawn_writer(&handle, file, stop_writer.clone()));
    let ops = store.as_ref().map(|s| {
        crate::runs::spawn_op_poller(&handle, s.shared(), |e| {
            errln!(
                "dagloop: a recorded decision does not apply: {e} [{}]",
                e.code()
            )
        })
    });
    let screen = Arc::new(review::Screen::default());
    let reviewer = (interactive && decisions.is_none() && asks)
        .then(|| tokio::spawn(review::serve(handle.clone(), tools, screen.clone(), record)));
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
            let Some(interrupt) = interrupt.as_mut() else {
                return;
            };
            if interrupt.recv().await.is_some() {
                cancel.cancel();
            }
            // A second Ctrl-C leaves at once.
            if interrupt.recv().await.is_some() {
                errln!("\ndagloop: interrupted twice, leaving now");
                crate::tools::kill_process_groups();
                std::process::exit(130);
            }
        })
    };
    let ended = async {
        if detach {
            return handle.wait_or_idle().await;
        }
        tokio::select! {
            r = handle.wait() => Some(r),
            // The reviewer's `d`: the calls stay waiting, the run is detached once idle.
            () = screen.detach.notified() => handle.wait_or_idle().await,
        }
    };
    let result = tokio::select! {
        r = ended => Some(r),
        () = &mut sigterm => None,
    };
    ctrl_c.abort();
    let helpers = [reviewer, ops];
    let Some(result) = result else {
        // SIGTERM: stop driving the run and leave it as the store has it, resumable.
        stop_writer.cancel();
        for t in helpers.into_iter().flatten() {
            t.abort();
            let _ = tokio::time::timeout(STOP_WAIT, t).await;
        }
        if let Some(t) = progress {
            t.abort();
        }
        // The last handle: the driver stops, and with it every call in flight (a shell tool's
        // process group is killed; a call is marked interrupted when the run is resumed).
        drop(handle);
        // (A block, not `drop`: without the `mcp` feature there are no servers to stop.)
        {
            let _stopped = servers;
        }
        if let Some(t) = writer {
            let _ = tokio::time::timeout(STOP_WAIT, t).await;
        }
        flush(notifications).await;
        // The lease goes with the process: `dagloop resume` may take the run at once.
        if let Some(s) = &store
            && let Err(e) = s.release(&id)
        {
            errln!("dagloop: could not release the run's lease: {e}");
        }
        errln!(
            "dagloop: stopped by SIGTERM; the run is kept: continue it with `dagloop resume {id}`"
        );
        outln!(
            "{}",
            pretty(&json!({"status": "stopped", "run_id": id, "reason": "SIGTERM"}))
        );
        return Ok(STOPPED_EXIT);
    };
    for t in helpers.into_iter().flatten() {
        t.abort();
    }
    {
        let _stopped = servers;
    }
    let Some(result) = result else {
        // Detached: the run waits for decisions (`dagloop decide`, then `dagloop resume`).
        let awaiting: Vec<Value> = handle
            .awaiting()
            .into_iter()
            .map(|(id, call, hash)| json!({"call_id": id, "call": call, "params_hash": hash}))
            .collect();
        if let Some(t) = progress {
            t.abort();
        }
        stop_writer.cancel();
        if let Some(t) = writer {
            let _ = tokio::time::timeout(STOP_WAIT, t).await;
        }
        drop(handle);
        flush(notifications).await;
        // Parked: the next process to continue it takes the lease at once.
        if let Some(s) = &store
            && let Err(e) = s.park(&id)
        {
            errln!("dagloop: could not release the run's lease: {e}");
        }
        // What to do next, with this run's id and its first waiting call filled in.
        let first = awaiting
            .first()
            .and_then(|a| a["call_id"].as_u64())
            .map_or_else(|| "CALL".to_string(), |c| c.to_string());
        let next = [
            format!("dagloop show {id}"),
            format!("dagloop decide {id} {first} approve"),
            format!("dagloop resume {id}"),
        ];
        outln!(
            "{}",
            pretty(&json!({"status": "waiting", "run_id": id, "awaiting": awaiting, "next": next}))
        );
        return Ok(0);
    };
    // Only an ending the run decided is recorded; a run that stopped (its journal could not
    // be written, its lease was lost) is left as its journal has it, to be resumed.
    if let Some(s) = &store {
        let recorded = if result.status.is_final() {
            s.finish(&id, &result)
        } else {
            s.release(&id)
        };
        if let Err(e) = recorded {
            errln!("dagloop: could not record the run's end: {e}");
            // The journal holds the ending (the next process to resume the run finds it);
            // the lease, at least, goes back.
            if result.status.is_final() {
                let _ = s.release(&id);
            }
        }
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
    flush(notifications).await;
    let mut value = serde_json::to_value(&result).unwrap_or(Value::Null);
    if store.is_some() {
        value["run_id"] = json!(id);
    }
    outln!("{}", pretty(&value));
    Ok(if result.succeeded() { 0 } else { 1 })
}

/// The webhook of a run this process drives: the notifier, its delivery task, the run's watcher.
struct Notifications(
    crate::notify::Notifier,
    crate::notify::Deliveries,
    tokio::task::JoinHandle<()>,
);

/// How long an ending process waits for the webhook to take the notifications queued.
const NOTIFY_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// The process is about to end: the watcher reads the run's last events (it ends with them;
/// a parked run's stream does not end, so the wait is short), then the queued notifications
/// go out (bounded: a receiver that keeps refusing does not hold the process for long).
async fn flush(n: Option<Notifications>) {
    let Some(Notifications(notifier, deliveries, mut watcher)) = n else {
        return;
    };
    if tokio::time::timeout(std::time::Duration::from_secs(1), &mut watcher)
        .await
        .is_err()
    {
        watcher.abort();
        let _ = watcher.await;
    }
    drop(notifier);
    if !deliveries.finish(NOTIFY_WAIT).await {
        errln!("dagloop: the webhook did not take every notification in time");
    }
}

/// The exit code of `run` and `resume` stopped by SIGTERM (128 + 15): the run is not over; the
/// store keeps it for `dagloop resume`.
pub(super) const STOPPED_EXIT: i32 = 143;

/// How long a stop waits for a helper task (the events writer, the decision poller).
const STOP_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Writes the run's events as JSON lines until the run ends, or until `stop`: then it writes
/// the events it has already been sent and ends. The file is flushed either way.
fn spawn_writer(
    handle: &RunHandle,
    file: std::fs::File,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let mut sub = handle.subscribe_from(0);
    tokio::spawn(async move {
        let mut out = std::io::BufWriter::new(file);
        loop {
            let ev = tokio::select! {
                biased;
                ev = sub.recv() => ev,
                () = stop.cancelled() => None,
            };
            let Some(ev) = ev else { break };
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
fn crash_hook(store: Arc<dyn RunStore>) -> Arc<dyn crate::engine::JournalSink> {
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
    store: Arc<dyn RunStore>,
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

    fn lease_every(&self) -> Option<std::time::Duration> {
        self.store.lease_every()
    }

    fn renew_lease<'a>(&'a self, run_id: &'a str) -> crate::engine::JournalFuture<'a> {
        self.store.renew_lease(run_id)
    }

    fn note(&self, run_id: &str, note: crate::engine::RunNote) {
        self.store.note(run_id, note);
    }

    fn claim_decision<'a>(
        &'a self,
        run_id: &'a str,
        presentation: u64,
        op: &'a crate::protocol::Op,
        queued: bool,
    ) -> crate::engine::ClaimFuture<'a> {
        self.store.claim_decision(run_id, presentation, op, queued)
    }
}

pub(super) fn now_ms() -> u64 {
    crate::runs::now_ms()
}

#[cfg(test)]
mod tests {
    use super::load_decisions;

    /// A decisions file's standing approval is an `allow` entry; `grant`, its name before a
    /// reviewer's standing approval stopped being called a grant, still reads the same.
    #[test]
    fn a_decisions_file_gives_standing_approvals_under_allow_and_the_old_grant() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("d.json");
        std::fs::write(
            &path,
            r#"{"decisions": [
                {"allow": {"scope": "tool", "tool": "step"}},
                {"grant": {"scope": "tool", "tool": "gate"}},
                {"tool": "other", "decision": "approve"}
            ]}"#,
        )
        .expect("write");
        let (_, standing) = load_decisions(&path).expect("loads");
        let tools: Vec<String> = standing
            .iter()
            .map(|(s, _)| serde_json::to_value(s).expect("spec")["tool"].to_string())
            .collect();
        assert_eq!(tools, ["\"step\"", "\"gate\""]);
        std::fs::write(
            &path,
            r#"{"decisions": [{"allow": {"scope": "calls", "calls": []}}]}"#,
        )
        .expect("write");
        let Err(e) = load_decisions(&path) else {
            panic!("an empty calls approval is refused")
        };
        assert_eq!(e.code, "cli.bad_decisions", "{e:?}");
        assert!(e.message.contains("decisions[0].allow"), "{e:?}");
    }
}
