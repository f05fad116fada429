//! The terminal reviewer for `--approve ask` (and any policy that asks): a consumer of the run's
//! `approval_requested` events and a producer of `Decide` ops.
//!
//! One call is prompted at a time: a line with its id, tool, resolved params (compact) and,
//! when it had started before a restart, that it was interrupted, then its card. Answers: `a`
//! approve, `A` approve every call of this tool for the rest of the run (a journaled standing
//! approval, revocable through the API), `s` send it back to the model with feedback (it is told to do it differently, not
//! vetoed), `d` leave it waiting and detach the run (decide later on the page or with
//! `dagloop decide`, continue with `dagloop resume`), `e` edit the params in `$EDITOR` (run on the terminal, `/dev/tty`, never on stdout,
//! which may be the run's result redirected to a file; checked against the tool's schema, the changes
//! shown before they are sent), `r` reject with a reason, `m` (an interrupted call only) mark it
//! done with a result given as JSON, `?` show the whole call. Each prompt starts with the call's
//! card (the page's: description, action, each param's source, the rule that asked, the
//! deadline), and its showing is journaled: the call's reviewer deadline starts then. The card
//! is rebuilt from the run's record and live journal, so it needs no store. With a deadline the
//! answer is typed on a line that counts the seconds down, redrawn in place each second (on a
//! terminal only). While a prompt is open the progress view does not redraw.
//! A prompt is withdrawn when the call is decided another way (the policy's timeout, another
//! reviewer, cancel). Only call params are shown: tool definitions (and so header values) never.
//!
//! Stdin is read by a plain thread, line by line and only when a prompt asks for a line, so an
//! unanswered prompt never keeps the process alive and never competes with `$EDITOR`.

use std::collections::{BTreeMap, VecDeque};
use std::io::{BufRead, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::{Map, Value};
use tokio::sync::mpsc;

use crate::engine::RunHandle;
use crate::protocol::{Call, CallId, Decision, EventKind, Op, Tool};

/// What the reviewer, the progress view and the run command share: whether a prompt is on
/// screen, and the reviewer's `d` (leave the calls waiting and detach the run).
#[derive(Debug, Default)]
pub(super) struct Screen {
    pub prompt_open: AtomicBool,
    pub detach: tokio::sync::Notify,
}

/// A call's deadline on screen: when the reviewer's time runs out (ms since the epoch), what
/// happens then, and how wide the seconds left were first drawn (so a redraw covers them).
struct Deadline {
    at: u64,
    default: String,
    width: usize,
}

struct Pending {
    id: CallId,
    call: Call,
    hash: String,
    /// The presentation this prompt answers (the `approval_requested` event's seq).
    presentation: u64,
    interrupted: bool,
    /// Its deadline, once it is shown and when the policy sets one.
    deadline: Option<Deadline>,
}

enum Waiting {
    Answer,
    Reason,
    Feedback,
    Result,
    Confirm(Map<String, Value>),
}

/// Asks for one line at a time on a thread of its own.
struct Lines {
    ask: std::sync::mpsc::Sender<()>,
    lines: mpsc::UnboundedReceiver<Option<String>>,
    outstanding: bool,
}

impl Lines {
    fn new() -> Lines {
        let (ask, asked) = std::sync::mpsc::channel::<()>();
        let (tx, lines) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            while asked.recv().is_ok() {
                let mut s = String::new();
                let line = match std::io::stdin().lock().read_line(&mut s) {
                    Ok(0) | Err(_) => None,
                    Ok(_) => Some(s),
                };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Lines {
            ask,
            lines,
            outstanding: false,
        }
    }

    fn request(&mut self) {
        if !self.outstanding {
            self.outstanding = self.ask.send(()).is_ok();
        }
    }

    async fn next(&mut self) -> Option<String> {
        let l = self.lines.recv().await.flatten();
        self.outstanding = false;
        l
    }
}

fn say(text: &str) {
    let mut err = std::io::stderr().lock();
    let _ = write!(err, "{text}");
    let _ = err.flush();
}

fn compact(params: &Map<String, Value>, max: usize) -> String {
    let shown: Map<String, Value> = crate::protocol::without_meta(params);
    let s = Value::Object(shown).to_string();
    if s.chars().count() > max {
        format!("{}…", s.chars().take(max).collect::<String>())
    } else {
        s
    }
}

/// Answers the run's approval requests on the terminal until the run ends.
pub(super) async fn serve(
    handle: RunHandle,
    tools: BTreeMap<String, Tool>,
    screen: Arc<Screen>,
    record: crate::store::RunRecord,
) {
    let record = Arc::new(record);
    // The countdown is redrawn in place only on a terminal (never into a log file).
    let ticking = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut events = handle.subscribe_from(0);
    let mut queue: VecDeque<Pending> = VecDeque::new();
    let mut current: Option<Pending> = None;
    let mut waiting = Waiting::Answer;
    // Tool-wide standing approvals in force (id → tool) whose calls are approved without a prompt.
    let mut tool_standing: BTreeMap<String, String> = BTreeMap::new();
    let mut lines = Lines::new();
    loop {
        if current.is_some() {
            lines.request();
        }
        // Events first: the next call is prompted only once the events already out are read
        // (a standing approval or a decision they carry may have settled it).
        tokio::select! {
            biased;
            ev = events.recv() => {
                let Some(ev) = ev else { break };
                match (&ev.kind, ev.call) {
                    (EventKind::ApprovalRequested { call, params_hash, interrupted, .. }, Some(id)) => {
                        // A call a tool's standing approval covers is decided with it (its decision event
                        // follows at once): it is not prompted.
                        if !*interrupted && tool_standing.values().any(|t| *t == call.tool) {
                            continue;
                        }
                        queue.push_back(Pending { id, call: Call::clone(call), hash: params_hash.clone(), presentation: ev.seq, interrupted: *interrupted, deadline: None });
                    }
                    (EventKind::Decision { decision, timed_out, standing, .. }, Some(id)) => {
                        if let Some(g) = standing {
                            match tool_standing.get(g) {
                                Some(tool) => say(&format!("\r\x1b[2K  {id} {tool} approved (every call of this tool) by standing approval {g}\n")),
                                None => say(&format!("\r\x1b[2K  {id} approved (as presented) by standing approval {g}\n")),
                            }
                        }
                        queue.retain(|p| p.id != id);
                        if current.as_ref().is_some_and(|p| p.id == id) {
                            let why = if *timed_out { " (the reviewer's time ran out)" } else { "" };
                            say(&format!("\n  {id} was decided: {}{why}\n", words(decision)));
                            current = None;
                            screen.prompt_open.store(false, Ordering::SeqCst);
                        }
                    }
                    (EventKind::StandingApprovalAdded { id, standing: crate::protocol::StandingSpec::Tool { tool, when: None }, .. }, _) => {
                        tool_standing.insert(id.clone(), tool.clone());
                    }
                    (EventKind::StandingApprovalRevoked { id, .. }, _) => {
                        tool_standing.remove(id);
                    }
                    (EventKind::RunFinished { .. }, _) if ev.parent.is_none() => break,
                    _ => {}
                }
            }
            () = std::future::ready(()), if current.is_none() && !queue.is_empty() => {
                let Some(mut p) = queue.pop_front() else { continue };
                screen.prompt_open.store(true, Ordering::SeqCst);
                present(&handle, &mut p, &record).await;
                prompt(&p);
                tick.reset();
                waiting = Waiting::Answer;
                current = Some(p);
            }
            _ = tick.tick(), if ticking && matches!(waiting, Waiting::Answer) && current.as_ref().is_some_and(|p| p.deadline.is_some()) => {
                if let Some(d) = current.as_ref().and_then(|p| p.deadline.as_ref()) {
                    say(&format!("\x1b7\r{}\x1b8", countdown(d, super::run::now_ms())));
                }
            }
            line = lines.next(), if current.is_some() => {
                let Some(p) = current.take() else { continue };
                let Some(line) = line else {
                    // The terminal closed: nobody can answer any more.
                    decide(&handle, &p, Decision::Reject { reason: "the reviewer closed the terminal".into() }).await;
                    screen.prompt_open.store(false, Ordering::SeqCst);
                    continue;
                };
                let tool = tools.get(&p.call.tool);
                match answer(&handle, &p, tool, &mut waiting, line.trim()).await {
                    Some(Answered::Decided) => screen.prompt_open.store(false, Ordering::SeqCst),
                    Some(Answered::Detach) => {
                        say(&format!("  {} left waiting; the run is detached\n", p.id));
                        screen.prompt_open.store(false, Ordering::SeqCst);
                        screen.detach.notify_one();
                        return;
                    }
                    None => current = Some(p),
                }
            }
        }
    }
    if current.is_some() {
        say("\n");
    }
    screen.prompt_open.store(false, Ordering::SeqCst);
}

/// Puts the call in front of the reviewer: its showing is journaled (its deadline, if the
/// policy sets one, starts now) and its card drawn: what the page's card shows, rebuilt from the
/// run's record and its live journal (the same description the page reads; no store needed).
async fn present(handle: &RunHandle, p: &mut Pending, record: &Arc<crate::store::RunRecord>) {
    let shown = Op::Shown {
        call: p.id,
        presentation: p.presentation,
    };
    if let Err(e) = handle.submit(shown).await {
        tracing::trace!(call = %p.id, code = e.code(), "showing not recorded: {e}");
    }
    let flag = if p.interrupted {
        " (interrupted: it had started when the run stopped)"
    } else {
        ""
    };
    let (record, journal, call) = (record.clone(), handle.journal(), p.id.0);
    let card = tokio::task::spawn_blocking(move || card_of(&record, &journal, call))
        .await
        .ok()
        .flatten();
    let now = super::run::now_ms();
    let text = card.as_ref().map(|a| super::card::lines(a, now));
    p.deadline = card.and_then(|a| {
        let at = a.deadline_at?;
        let default = a.default_decision.as_str().unwrap_or("reject").to_string();
        let width = at.saturating_sub(now).div_ceil(1000).to_string().len();
        Some(Deadline { at, default, width })
    });
    say(&format!(
        "\r\x1b[2K\n  {} {} {}{flag}\n{}",
        p.id,
        p.call.tool,
        compact(&p.call.params, 120),
        text.unwrap_or_default()
    ));
}

/// The card of call `call` of the run `record` describes, after `journal`.
fn card_of(
    record: &crate::store::RunRecord,
    journal: &[crate::machine::JournalEntry],
    call: u64,
) -> Option<crate::runs::AwaitingCall> {
    let rb = crate::runs::rebuild(record, journal).ok()?;
    let view = crate::runs::describe_view(&record.id, &rb, journal.len(), None, true);
    view.awaiting.into_iter().find(|a| a.call_id == call)
}

/// The line the answer is typed on while a deadline runs: `  approve in 12 s > `, the seconds
/// padded to the width first drawn so that a redraw (from the line's start, the cursor kept
/// where the reviewer types) covers the last one.
fn countdown(d: &Deadline, now: u64) -> String {
    let s = d.at.saturating_sub(now).div_ceil(1000);
    format!("  {} in {s:>w$} s > ", d.default, w = d.width)
}

fn prompt(p: &Pending) {
    let done = if p.interrupted { " [m]ark done" } else { "" };
    let answers = format!(
        "  [a]pprove [A]pprove all {} [e]dit [r]eject [s]end back{done} [d]etach [?]show",
        p.call.tool
    );
    // With a deadline the answer is typed on a line of its own that counts down.
    match &p.deadline {
        Some(d) => say(&format!(
            "{answers}\n{}",
            countdown(d, super::run::now_ms())
        )),
        None => say(&format!("{answers} > ")),
    }
}

fn words(d: &Decision) -> String {
    match d {
        Decision::Approve => "approved".into(),
        Decision::Edit { .. } => "approved with edited params".into(),
        Decision::Replace { call } => format!("replaced by a call to {}", call.tool),
        Decision::Reject { reason } => format!("rejected ({reason})"),
        Decision::SendBack { feedback } => format!("sent back to the model ({feedback})"),
        Decision::Done { .. } => "marked done with a supplied result".into(),
    }
}

async fn decide(handle: &RunHandle, p: &Pending, decision: Decision) {
    let op = Op::Decide {
        call: p.id,
        decision,
        presented: Some(p.hash.clone()),
        presentation: Some(p.presentation),
        by: Some(super::me(crate::protocol::Actor::TERMINAL)),
    };
    if let Err(e) = handle.submit(op).await {
        say(&format!("  {}: not applied: {e} [{}]\n", p.id, e.code()));
    }
}

/// What a line did with the call on screen.
enum Answered {
    /// It was decided.
    Decided,
    /// It is left waiting and the run detached (`d`).
    Detach,
}

/// Handles one line; `Some` when the prompt is done with, `None` to keep prompting.
async fn answer(
    handle: &RunHandle,
    p: &Pending,
    tool: Option<&Tool>,
    waiting: &mut Waiting,
    line: &str,
) -> Option<Answered> {
    if matches!(waiting, Waiting::Answer) && matches!(line, "d" | "detach") {
        return Some(Answered::Detach);
    }
    answer_line(handle, p, tool, waiting, line)
        .await
        .map(|()| Answered::Decided)
}

async fn answer_line(
    handle: &RunHandle,
    p: &Pending,
    tool: Option<&Tool>,
    waiting: &mut Waiting,
    line: &str,
) -> Option<()> {
    match std::mem::replace(waiting, Waiting::Answer) {
        Waiting::Reason => {
            let reason = if line.is_empty() {
                "rejected by the reviewer".to_string()
            } else {
                line.to_string()
            };
            decide(handle, p, Decision::Reject { reason }).await;
            return Some(());
        }
        Waiting::Feedback => {
            if line.is_empty() {
                say("  feedback is what the model is told to do differently; nothing sent\n");
                prompt(p);
                return None;
            }
            let feedback = line.to_string();
            decide(handle, p, Decision::SendBack { feedback }).await;
            return Some(());
        }
        Waiting::Result => match serde_json::from_str::<Value>(line) {
            Ok(result) => {
                decide(handle, p, Decision::Done { result }).await;
                return Some(());
            }
            Err(e) => {
                say(&format!("  not JSON ({e})\n"));
                prompt(p);
                return None;
            }
        },
        Waiting::Confirm(params) => {
            if matches!(line, "y" | "yes") {
                decide(handle, p, Decision::Edit { params }).await;
                return Some(());
            }
            say("  edit dropped\n");
            prompt(p);
            return None;
        }
        Waiting::Answer => {}
    }
    match line {
        "a" | "approve" | "y" | "yes" => {
            decide(handle, p, Decision::Approve).await;
            Some(())
        }
        "A" => {
            // A standing approval: journaled, applied to this call and every later one of the tool (an
            // interrupted call is not covered, so it is approved on its own).
            let op = Op::Allow {
                standing: crate::protocol::StandingSpec::Tool {
                    tool: p.call.tool.clone(),
                    when: None,
                },
                by: Some(super::me(crate::protocol::Actor::TERMINAL)),
            };
            if let Err(e) = handle.submit(op).await {
                say(&format!(
                    "  standing approval not applied: {e} [{}]\n",
                    e.code()
                ));
            }
            if p.interrupted {
                decide(handle, p, Decision::Approve).await;
            }
            Some(())
        }
        "s" | "send back" => {
            *waiting = Waiting::Feedback;
            say("  what should the model do differently? > ");
            None
        }
        "m" | "done" if p.interrupted => {
            *waiting = Waiting::Result;
            say("  the call's result (JSON) > ");
            None
        }
        "r" | "reject" | "n" | "no" => {
            *waiting = Waiting::Reason;
            say("  reason > ");
            None
        }
        "?" | "show" => {
            say(&format!(
                "\n{}\n",
                serde_json::to_string_pretty(&p.call.to_value()).unwrap_or_default()
            ));
            prompt(p);
            None
        }
        "e" | "edit" => {
            let call = p.call.clone();
            let edited = tokio::task::spawn_blocking(move || edit(&call))
                .await
                .unwrap_or_else(|e| Err(e.to_string()));
            match edited.and_then(|params| check(tool, &p.call, params)) {
                Ok((params, diff)) => {
                    say(&format!("{diff}  send this edit? [y/n] > "));
                    *waiting = Waiting::Confirm(params);
                }
                Err(e) => {
                    say(&format!("  edit failed: {e}\n"));
                    prompt(p);
                }
            }
            None
        }
        _ => {
            prompt(p);
            None
        }
    }
}

/// Checks edited params against the tool's schema; returns them with the changes in words.
fn check(
    tool: Option<&Tool>,
    call: &Call,
    params: Map<String, Value>,
) -> Result<(Map<String, Value>, String), String> {
    let params = crate::protocol::Params::from(params);
    if let Some(t) = tool {
        let v = crate::schema::ParamsValidator::new(t).map_err(|e| e.to_string())?;
        let errors = v.validate_written(&params).map_err(|e| e.to_string())?;
        if !errors.is_empty() {
            return Err(errors
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; "));
        }
    }
    let mut diff = String::new();
    let old: Map<String, Value> = call.plain_params();
    for (k, v) in &old {
        match params.get(k) {
            None => diff.push_str(&format!("  - {k}: {v}\n")),
            Some(n) if n != v => diff.push_str(&format!("  - {k}: {v}\n  + {k}: {n}\n")),
            _ => {}
        }
    }
    for (k, v) in &params {
        if !old.contains_key(k) {
            diff.push_str(&format!("  + {k}: {v}\n"));
        }
    }
    if diff.is_empty() {
        diff.push_str("  (no change)\n");
    }
    Ok((params.into_map(), diff))
}

fn edit(call: &Call) -> Result<Map<String, Value>, String> {
    let params: Map<String, Value> = call.plain_params();
    let dir = tempfile_dir()?;
    let file = dir.join("params.json");
    let text = serde_json::to_string_pretty(&Value::Object(params)).map_err(|e| e.to_string())?;
    std::fs::write(&file, text).map_err(|e| e.to_string())?;
    let editor = std::env::var("VISUAL")
        .or_else(|_| std::env::var("EDITOR"))
        .unwrap_or_else(|_| "vi".into());
    let mut parts = editor.split_whitespace();
    let program = parts.next().unwrap_or("vi");
    let mut cmd = std::process::Command::new(program);
    cmd.args(parts).arg(&file);
    // The reviewer's program, like a tool's: transparent huge pages as the system has them.
    crate::tools::huge_pages_back(&mut cmd);
    // The editor is the reviewer's, on the terminal: never on stdout, which may be the run's
    // result redirected to a file (`dagloop run goal.json > result.json`).
    match terminal() {
        Some((input, output, errors)) => {
            cmd.stdin(input).stdout(output).stderr(errors);
        }
        None => {
            // Our stderr, duplicated (std does so on every platform).
            cmd.stdout(std::io::stderr());
        }
    }
    let status = cmd
        .status()
        .map_err(|e| format!("cannot start {editor}: {e}"))?;
    if !status.success() {
        return Err(format!("{editor} exited with {status}"));
    }
    let edited = std::fs::read_to_string(&file).map_err(|e| e.to_string())?;
    let _ = std::fs::remove_dir_all(&dir);
    serde_json::from_str(&edited)
        .map_err(|e| format!("the edited params are not a JSON object: {e}"))
}

/// The controlling terminal (`/dev/tty`) as an editor's stdin, stdout and stderr; None when the
/// process has none.
fn terminal() -> Option<(
    std::process::Stdio,
    std::process::Stdio,
    std::process::Stdio,
)> {
    let tty = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/tty")
        .ok()?;
    let output = tty.try_clone().ok()?;
    let errors = tty.try_clone().ok()?;
    Some((tty.into(), output.into(), errors.into()))
}

fn tempfile_dir() -> Result<std::path::PathBuf, String> {
    let dir = std::env::temp_dir().join(format!(
        "dagloop-edit-{}-{}",
        std::process::id(),
        super::run::now_ms()
    ));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    Ok(dir)
}
