//! Static checks without running anything: a plan's calls (`dagloop validate`, `dagloop graph`),
//! a goal's tools and model, and a scripted-model file.
//!
//! The rules are the run's own: dependency edges and cycles come from the run's scheduler itself
//! (the plan handed to a step-0 scheduler made the way a run makes it, in plan order, so a call
//! ready on arrival stops reading exactly as in a run; `validate` cannot call a cycle what a run
//! runs), params are checked by [`crate::schema::ParamsValidator`], activities by
//! [`crate::tools::check_tool`], scripted-model files by [`crate::llm::Script::parse`].
//! Deliberately not here: resolving references against state (only literal params are checked;
//! references are checked once resolved at run time) or printing.

use std::path::Path as FsPath;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::approval::Policy;
use crate::goal::Goal;
use crate::llm::{ModelSpec, Script, TurnBody};
use crate::machine::AgentConfig;
use crate::protocol::{Call, CallId, Path, Solution, Tool};
use crate::scheduler::{CallStatus, Input, Scheduler, SchedulerOptions};
use crate::schema::ParamsValidator;
use crate::state::State;

/// One problem found by a check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// Stable code (`plan.unknown_tool`, `plan.invalid_params`, `plan.cycle`,
    /// `plan.dangling_reference`, `plan.bad_reference`, `tool.activity`, `model.script`,
    /// `script.invalid_solution`, `script.unknown_tool`).
    pub code: &'static str,
    /// The call's number in the plan, from 1 (as `run` and events number calls).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub call: Option<usize>,
    /// The tool concerned, for tool checks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// The turn's number in a scripted-model file, from 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub turn: Option<usize>,
    /// What is wrong.
    pub message: String,
}

impl Finding {
    fn call(code: &'static str, index: usize, message: impl ToString) -> Finding {
        Finding {
            code,
            call: Some(index + 1),
            tool: None,
            turn: None,
            message: message.to_string(),
        }
    }
}

pub(crate) fn write_paths(c: &Call) -> Vec<Path> {
    match c.output_target() {
        Ok(Some(e)) => e.refs.into_iter().map(|r| r.path).collect(),
        _ => Vec::new(),
    }
}

/// What a call writes, its tool's fixed `_outputPath` (a string) standing in when the call
/// gives none.
fn write_paths_with(c: &Call, tools: Option<&[Tool]>) -> Vec<Path> {
    let fixed = || {
        let t = tools?.iter().find(|t| t.name == c.tool)?;
        let text = t.schema.get("_outputPath")?.as_str()?;
        Some(Call::new(c.tool.clone()).output(text))
    };
    match (&c.output_path, fixed()) {
        (None, Some(with_tools)) => write_paths(&with_tools),
        _ => write_paths(c),
    }
}

/// The paths a reference could be meant to name: `writes`, and the initial data's keys (a few
/// levels deep), as written in references (`state.weather`).
fn known_paths(writes: &[Vec<Path>], initial: &Map<String, Value>) -> Vec<String> {
    fn walk(prefix: &str, v: &Value, depth: usize, out: &mut Vec<String>) {
        out.push(prefix.to_string());
        if depth == 0 {
            return;
        }
        if let Value::Object(m) = v {
            for (k, v) in m {
                walk(&format!("{prefix}.{k}"), v, depth - 1, out);
            }
        }
    }
    let mut out: Vec<String> = writes.iter().flatten().map(ToString::to_string).collect();
    for (kind, v) in initial {
        walk(kind, v, 4, &mut out);
    }
    out.sort();
    out.dedup();
    out
}

/// The message for a reference to `p` that nothing writes, with the closest path something
/// does write, or the data holds, when one is close enough to be a typo.
fn dangling_message(p: &Path, known: &[String]) -> String {
    let text = p.to_string();
    let mut m = format!("nothing writes `{text}` and it is not in the initial data");
    if let Some(s) = crate::protocol::meta::closest(&text, known.iter().map(String::as_str)) {
        m.push_str(&format!(" (did you mean `{s}`?)"));
    }
    m
}

pub(crate) fn read_paths(c: &Call) -> Vec<Path> {
    c.references()
        .map(|refs| {
            refs.into_iter()
                .flat_map(|(_, e)| e.refs.into_iter().map(|r| r.path))
                .collect()
        })
        .unwrap_or_default()
}

/// The plan as a run takes it (`RunMachine` starting an agent): a step-0 scheduler made by
/// [`AgentConfig::scheduler`] over the initial data, every call handed to it in plan order with
/// the ids a run gives them (from 1), nothing finished yet. The `auto` policy: a reviewer only
/// decides *whether* a call runs, and an unblocked call stops reading whether it waits for one
/// or runs. With no tools given, every name the plan uses is a tool with an activity and no
/// params schema.
fn dry_run(calls: &[Call], tools: Option<&[Tool]>, initial: &Map<String, Value>) -> Scheduler {
    let tools: Vec<Tool> = match tools {
        Some(t) => t.to_vec(),
        None => {
            let mut names: Vec<&str> = calls.iter().map(|c| c.tool.as_str()).collect();
            names.sort_unstable();
            names.dedup();
            names
                .into_iter()
                .map(|n| {
                    let mut t = Tool::new(n);
                    t.activity = Some("rust".into());
                    t
                })
                .collect()
        }
    };
    let mut doc = Map::new();
    doc.insert("goal".into(), Value::String("validate".into()));
    doc.insert("output_schema".into(), Value::Bool(true));
    for (kind, value) in initial {
        doc.insert(kind.clone(), value.clone());
    }
    let config = serde_json::from_value::<Goal>(Value::Object(doc))
        .map_err(|e| e.to_string())
        .and_then(|mut goal| {
            goal.tools = tools.clone();
            goal.agent_config(Default::default())
                .map_err(|e| e.to_string())
        });
    let mut sched = match config {
        Ok(cfg) => {
            let cfg = std::sync::Arc::new(cfg);
            let state = cfg.initial_state(initial.get("input"), 0);
            AgentConfig::scheduler(&cfg, state, Policy::auto(), 0, false)
        }
        // Schemas the run could not compile either (reported by the goal's own checks): the
        // graph's verdicts do not depend on them.
        Err(_) => {
            let mut state = State::new();
            for (kind, value) in initial {
                state.write(Path::root(kind), value.clone(), Default::default(), None, 0);
            }
            Scheduler::new(state, tools, Policy::auto(), SchedulerOptions::default())
        }
    };
    for (i, c) in calls.iter().enumerate() {
        let input = Input::CallArrived {
            id: CallId(i as u64 + 1),
            call: Ok(std::sync::Arc::new(c.clone())),
            parsed: Default::default(),
        };
        sched.handle(input, 0);
    }
    sched
}

/// The calls the run refuses because they would close a cycle: (index from 0, the error).
fn cycles(sched: &Scheduler) -> Vec<(usize, String)> {
    sched
        .report()
        .calls
        .into_iter()
        .filter(|c| c.status == CallStatus::Refused)
        .filter_map(|c| {
            let e = c.error?;
            (e.get("code")? == "graph.cycle").then(|| {
                let message = e.get("message").and_then(Value::as_str).unwrap_or_default();
                ((c.id.0 as usize).saturating_sub(1), message.to_string())
            })
        })
        .collect()
}

/// A plan's dependency edges as a run has them once every call arrived ([`dry_run`]):
/// `(writer index, reader index, path)`, indexes from 0 into `calls`; a call that was ready
/// when it arrived reads nothing any more. A call the run refuses (it would close a cycle) is
/// drawn with the edges it would have had, so the cycle shows.
/// With a goal, its tools and initial data are the run's; without, see [`dry_run`].
pub fn edges(calls: &[Call], goal: Option<&Goal>) -> Vec<(usize, usize, String)> {
    let initial = goal.map(initial_data).unwrap_or_default();
    let sched = dry_run(calls, goal.map(|g| &g.tools[..]), &initial);
    let g = sched.graph();
    let refused = cycles(&sched);
    let reads: Vec<Vec<Path>> = calls.iter().map(read_paths).collect();
    let writes: Vec<Vec<Path>> = calls.iter().map(write_paths).collect();
    let overlap = |w: usize, r: usize| {
        reads[r]
            .iter()
            .find(|p| writes[w].iter().any(|q| q.overlaps(p)))
            .map(ToString::to_string)
    };
    let mut out = Vec::new();
    for r in 0..calls.len() {
        for CallId(w) in g.producers(CallId(r as u64 + 1)) {
            let w = w as usize - 1;
            if let Some(p) = overlap(w, r) {
                out.push((w, r, p));
            }
        }
    }
    for (i, _) in &refused {
        for j in (0..calls.len()).filter(|j| j != i) {
            if let Some(p) = overlap(j, *i) {
                out.push((j, *i, p));
            }
            if let Some(p) = overlap(*i, j) {
                out.push((*i, j, p));
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Checks a plan against tools and the data available before it runs (`initial`: kind → value).
pub fn check_plan(
    calls: &[Call],
    tools: Option<&[Tool]>,
    initial: &Map<String, Value>,
) -> Vec<Finding> {
    plan_findings(calls, tools, tools, initial)
}

/// [`check_plan`], the graph's verdicts taken with `run_tools` (the tools the run will have).
fn plan_findings(
    calls: &[Call],
    tools: Option<&[Tool]>,
    run_tools: Option<&[Tool]>,
    initial: &Map<String, Value>,
) -> Vec<Finding> {
    let mut out = Vec::new();
    for (i, c) in calls.iter().enumerate() {
        if let Err(e) = c.references() {
            out.push(Finding::call("plan.bad_reference", i, e));
        }
        if let Err(e) = c.output_target() {
            out.push(Finding::call("plan.bad_reference", i, e));
        }
        if let Some(tools) = tools {
            match tools.iter().find(|t| t.name == c.tool) {
                None => out.push(Finding::call(
                    "plan.unknown_tool",
                    i,
                    format!("no tool named `{}`", c.tool),
                )),
                Some(t) => check_literal_params(c, t, i, &mut out),
            }
        }
    }
    let writes: Vec<Vec<Path>> = calls.iter().map(|c| write_paths_with(c, tools)).collect();
    let known = known_paths(&writes, initial);
    for (i, c) in calls.iter().enumerate() {
        for p in read_paths(c) {
            if !written_or_present(&p, i, &writes, initial) {
                out.push(Finding::call(
                    "plan.dangling_reference",
                    i,
                    dangling_message(&p, &known),
                ));
            }
        }
    }
    for (i, e) in cycles(&dry_run(calls, run_tools, initial)) {
        out.push(Finding::call(
            "plan.cycle",
            i,
            format!("{e} (the run refuses this call)"),
        ));
    }
    out.sort_by(|a, b| (a.call, a.code).cmp(&(b.call, b.code)));
    out
}

/// True when a call other than the `i`th writes a path overlapping `p`, or the initial data
/// holds it.
fn written_or_present(
    p: &Path,
    i: usize,
    writes: &[Vec<Path>],
    initial: &Map<String, Value>,
) -> bool {
    let written = writes
        .iter()
        .enumerate()
        .any(|(j, w)| j != i && w.iter().any(|q| q.overlaps(p)));
    written
        || initial
            .get(p.kind())
            .is_some_and(|v| crate::state::apply::get(v, p.rest()).is_some())
}

/// The call's params as written, checked by the tool's own [`ParamsValidator`]: a param that
/// holds a reference is not required to be present or valid yet
/// ([`ParamsValidator::validate_written`], the machine's check of a reviewer's call too).
fn check_literal_params(c: &Call, t: &Tool, i: usize, out: &mut Vec<Finding>) {
    match ParamsValidator::new(t).and_then(|v| v.validate_written(&c.params)) {
        Ok(errors) => {
            for e in errors {
                out.push(Finding::call("plan.invalid_params", i, e));
            }
        }
        Err(e) => out.push(Finding::call("plan.invalid_params", i, e)),
    }
}

/// Checks what a goal needs before a run starts, by the run's own rules: every tool's activity
/// ([`crate::tools::check_tool`]), the scripted-model file the goal names (exists, parses, its
/// calls name the goal's tools), and the goal's plan.
pub fn check_goal(goal: &Goal) -> Vec<Finding> {
    let mut out = Vec::new();
    for t in &goal.tools {
        let problem = match crate::tools::check_tool(t, &goal.base_dir) {
            Err(e) => Some(e.to_string()),
            // The goal file a delegate names must load (the builder reads it the same way).
            Ok(()) => goal.delegate_file(t).and_then(|path| {
                Goal::load(&path)
                    .err()
                    .map(|e| format!("tool `{}` is misconfigured: `_delegate`: {e}", t.name))
            }),
        };
        if let Some(message) = problem {
            out.push(Finding {
                code: "tool.activity",
                call: None,
                tool: Some(t.name.clone()),
                turn: None,
                message,
            });
        }
    }
    if let Some(specs) = &goal.model {
        match ModelSpec::parse_list(specs) {
            Ok(list) => {
                for spec in list {
                    if let ModelSpec::Scripted(p) = spec {
                        let path = goal.resolve_path(&p.to_string_lossy());
                        out.extend(check_script_file(&path, Some(goal)));
                    }
                }
            }
            Err(e) => out.push(model_finding(e.to_string())),
        }
    }
    out.extend(rule_findings(goal));
    // The run also has the tools of the goal's MCP servers, known once they run: a plan call
    // to a tool the goal does not define may be one of them, so for the graph's verdicts it is
    // taken as a call to a tool with an activity (`plan.unknown_tool` still names it).
    let mut run_tools = goal.tools.clone();
    if !goal.mcp_servers.is_empty() {
        for c in &goal.plan {
            if !run_tools.iter().any(|t| t.name == c.tool) {
                let mut t = Tool::new(c.tool.clone());
                t.activity = Some("mcp".into());
                run_tools.push(t);
            }
        }
    }
    out.extend(plan_findings(
        &goal.plan,
        Some(&goal.tools),
        Some(&run_tools),
        &initial_data(goal),
    ));
    out
}

/// Approval rules whose `tool` pattern matches none of the goal's tools (when the goal has no
/// MCP servers, whose tools are known only once they run), and patterns that use a wildcard
/// the glob does not have (`[`, `]`, `{`, `}`: only `*` and `?` are wildcards, anything else
/// matches itself).
fn rule_findings(goal: &Goal) -> Vec<Finding> {
    let Some(policy) = &goal.approval else {
        return Vec::new();
    };
    let names: Vec<&str> = goal.tools.iter().map(|t| t.name.as_str()).collect();
    let mut out = Vec::new();
    for rule in &policy.rules {
        let pattern = &rule.spec.tool;
        let matches_one = names
            .iter()
            .any(|n| crate::approval::rules::glob(pattern, n));
        let foreign = pattern.contains(['[', ']', '{', '}']);
        if !foreign && (matches_one || !goal.mcp_servers.is_empty()) {
            continue;
        }
        let mut message = format!("approval rule {}: tool pattern `{pattern}`", rule.label);
        if matches_one {
            message.push_str(" uses `[`, `]`, `{` or `}`, which match themselves");
        } else {
            message.push_str(&format!(
                " matches none of the goal's tools ({})",
                names.join(", ")
            ));
            if let Some(s) = crate::protocol::meta::closest(pattern, names.iter().copied()) {
                message.push_str(&format!(" (did you mean `{s}`?)"));
            }
        }
        if foreign {
            message.push_str(
                "; only `*` (any run of characters) and `?` (one character) are wildcards",
            );
        }
        out.push(Finding {
            code: "approval.rule_matches_nothing",
            call: None,
            tool: None,
            turn: None,
            message,
        });
    }
    out
}

/// The data a goal's run starts with, by kind: `input` (when given) and `state`.
pub fn initial_data(goal: &Goal) -> Map<String, Value> {
    let mut initial = Map::new();
    if let Some(i) = &goal.input {
        initial.insert("input".into(), i.clone());
    }
    let state = goal
        .state
        .clone()
        .unwrap_or_else(|| Value::Object(Map::new()));
    initial.insert("state".into(), state);
    initial
}

fn model_finding(message: String) -> Finding {
    Finding {
        code: "model.script",
        call: None,
        tool: None,
        turn: None,
        message,
    }
}

/// Loads and checks a scripted-model file (see [`check_script`]).
pub fn check_script_file(path: &FsPath, goal: Option<&Goal>) -> Vec<Finding> {
    match Script::load(path) {
        Ok(s) => check_script(&s, goal),
        Err(e) => vec![model_finding(e.to_string())],
    }
}

/// Checks a parsed scripted-model file: each turn's solution parses as a Solution and, when
/// the goal is given, every call names one of its tools, its literal params fit the tool's
/// schema, and every reference names something the goal's input or state holds or some call
/// of the script writes (a call of a later turn counts: the check does not follow the turns'
/// order).
pub fn check_script(script: &Script, goal: Option<&Goal>) -> Vec<Finding> {
    let mut out = Vec::new();
    // (turn, call within the turn, the call), from 0.
    let mut calls: Vec<(usize, usize, Call)> = Vec::new();
    for (i, turn) in script.turns.iter().enumerate() {
        let TurnBody::Solution(v) = &turn.body else {
            continue;
        };
        match Solution::from_value(v.clone()) {
            Err(e) => out.push(Finding {
                code: "script.invalid_solution",
                call: None,
                tool: None,
                turn: Some(i + 1),
                message: e.to_string(),
            }),
            Ok(s) => calls.extend(s.calls.into_iter().enumerate().map(|(j, c)| (i, j, c))),
        }
    }
    let Some(goal) = goal else { return out };
    let tools = &goal.tools[..];
    let at = |turn: usize, call: usize, f: Finding| Finding {
        turn: Some(turn + 1),
        call: Some(call + 1),
        ..f
    };
    let writes: Vec<Vec<Path>> = calls
        .iter()
        .map(|(_, _, c)| write_paths_with(c, Some(tools)))
        .collect();
    let initial = initial_data(goal);
    let known = known_paths(&writes, &initial);
    for (k, (turn, j, c)) in calls.iter().enumerate() {
        let mut found = Vec::new();
        match tools.iter().find(|t| t.name == c.tool) {
            None => found.push(Finding::call(
                "script.unknown_tool",
                *j,
                format!("no tool named `{}` in the goal", c.tool),
            )),
            Some(t) => check_literal_params(c, t, *j, &mut found),
        }
        if let Err(e) = c.references() {
            found.push(Finding::call("plan.bad_reference", *j, e));
        }
        for p in read_paths(c) {
            if !written_or_present(&p, k, &writes, &initial) {
                found.push(Finding::call(
                    "plan.dangling_reference",
                    *j,
                    dangling_message(&p, &known),
                ));
            }
        }
        out.extend(found.into_iter().map(|f| at(*turn, *j, f)));
    }
    out
}

/// What a run's calls did, for `dagloop graph RUN`: each call's id, tool and final status, and
/// the data that flowed between them.
pub struct RunCall {
    /// The call id.
    pub id: u64,
    /// The call as it arrived (its references and output path).
    pub call: Call,
    /// What became of it (`done`, `error`, `unresolved`, ...).
    pub status: String,
}

/// The data flow of a run: `(writer, reader, path)` (indexes into `calls`) when the reader,
/// which arrived after the writer, reads a path the writer's output path writes (either
/// alternative of a branch).
pub fn run_edges(calls: &[RunCall]) -> Vec<(usize, usize, String)> {
    let reads: Vec<Vec<Path>> = calls.iter().map(|c| read_paths(&c.call)).collect();
    let writes: Vec<Vec<Path>> = calls.iter().map(|c| write_paths(&c.call)).collect();
    let mut out = Vec::new();
    for (r, read) in reads.iter().enumerate() {
        for (w, written) in writes.iter().enumerate().take(r) {
            if let Some(p) = read.iter().find(|p| written.iter().any(|q| q.overlaps(p))) {
                out.push((w, r, p.to_string()));
            }
        }
    }
    out
}

/// A failed status, drawn in red.
fn failed_status(status: &str) -> bool {
    matches!(
        status,
        "error"
            | "failed"
            | "timeout"
            | "panic"
            | "refused"
            | "unresolved"
            | "rejected"
            | "cancelled"
            | "interrupted"
    )
}

/// A run's calls and data flow as Mermaid ([`run_edges`]); failed calls in red.
pub fn run_mermaid(calls: &[RunCall]) -> String {
    let mut s = String::from("graph TD\n    classDef failed fill:#fdd,stroke:#c00\n");
    for c in calls {
        let class = if failed_status(&c.status) {
            ":::failed"
        } else {
            ""
        };
        s.push_str(&format!(
            "    c{}[\"#{} {} · {}\"]{class}\n",
            c.id,
            c.id,
            escape(&c.call.tool),
            escape(&c.status)
        ));
    }
    for (w, r, p) in run_edges(calls) {
        s.push_str(&format!(
            "    c{} -- \"{}\" --> c{}\n",
            calls[w].id,
            escape(&p),
            calls[r].id
        ));
    }
    s
}

/// A run's calls and data flow as Graphviz dot ([`run_edges`]); failed calls in red.
pub fn run_dot(calls: &[RunCall]) -> String {
    let mut s = String::from("digraph run {\n");
    for c in calls {
        let color = if failed_status(&c.status) {
            ", color=red"
        } else {
            ""
        };
        s.push_str(&format!(
            "    c{} [label=\"#{} {} · {}\"{color}];\n",
            c.id,
            c.id,
            escape(&c.call.tool),
            escape(&c.status)
        ));
    }
    for (w, r, p) in run_edges(calls) {
        s.push_str(&format!(
            "    c{} -> c{} [label=\"{}\"];\n",
            calls[w].id,
            calls[r].id,
            escape(&p)
        ));
    }
    s.push_str("}\n");
    s
}

/// The dependency graph as Mermaid (calls numbered from 1; see [`edges`]).
pub fn mermaid(calls: &[Call], goal: Option<&Goal>) -> String {
    let mut s = String::from("graph TD\n");
    for (i, c) in calls.iter().enumerate() {
        let n = i + 1;
        s.push_str(&format!("    c{n}[\"#{n} {}\"]\n", escape(&c.tool)));
    }
    for (w, r, p) in edges(calls, goal) {
        s.push_str(&format!(
            "    c{} -- \"{}\" --> c{}\n",
            w + 1,
            escape(&p),
            r + 1
        ));
    }
    s
}

/// The dependency graph as Graphviz dot (calls numbered from 1; see [`edges`]).
pub fn dot(calls: &[Call], goal: Option<&Goal>) -> String {
    let mut s = String::from("digraph plan {\n");
    for (i, c) in calls.iter().enumerate() {
        let n = i + 1;
        s.push_str(&format!("    c{n} [label=\"#{n} {}\"];\n", escape(&c.tool)));
    }
    for (w, r, p) in edges(calls, goal) {
        s.push_str(&format!(
            "    c{} -> c{} [label=\"{}\"];\n",
            w + 1,
            r + 1,
            escape(&p)
        ));
    }
    s.push_str("}\n");
    s
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "'")
}
