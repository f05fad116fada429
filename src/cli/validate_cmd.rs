//! `dagloop validate` and `dagloop graph`: a plan, a goal or a scripted-model file checked by
//! the run's own rules (`crate::check`), and a plan's call graph drawn.
//!
//! Deliberately not here: the rules themselves (`crate::check`).

use super::*;

/// Reads a plan file: a Solution object, an array of calls, or a goal's `plan`.
pub(super) fn load_plan(file: &FsPath) -> Result<(Vec<Call>, Option<Goal>), CliError> {
    let text = std::fs::read_to_string(file).map_err(|e| {
        let code = if e.kind() == std::io::ErrorKind::NotFound {
            "cli.not_found"
        } else {
            "cli.unreadable"
        };
        CliError::new(code, format!("cannot read {}: {e}", file.display()))
    })?;
    let v: Value = serde_json::from_str(&text)
        .map_err(|e| CliError::new("plan.invalid_json", format!("{}: {e}", file.display())))?;
    if v.get("output_schema").is_some() {
        let goal = Goal::load(file).map_err(|e| CliError::new(e.code(), &e))?;
        return Ok((goal.plan.clone(), Some(goal)));
    }
    if !(v.is_array() || v.get("calls").is_some()) {
        return Err(CliError::new(
            "plan.not_a_plan",
            format!(
                "{} is not a plan: expected a goal file, a Solution with `calls`, or an array of calls",
                file.display()
            ),
        ));
    }
    let calls = match v {
        Value::Array(items) => Solution::from_value(json!({"calls": items})),
        other => Solution::from_value(other),
    }
    .map_err(|e| CliError::new(e.code(), format!("{}: {e}", file.display())))?
    .calls;
    Ok((calls, None))
}

pub(super) fn validate(
    file: &FsPath,
    goal: Option<&FsPath>,
    grants: Arc<crate::grants::Grants>,
) -> Result<i32, CliError> {
    let other_goal = goal
        .map(|p| Goal::load(p).map_err(|e| CliError::new(e.code(), &e)))
        .transpose()?;
    if is_script_file(file) {
        let findings = check::check_script_file(file, other_goal.as_ref());
        return Ok(report(json!({"kind": "scripted-model"}), findings));
    }
    let (calls, own_goal) = load_plan(file)?;
    let (kind, findings) = match (own_goal, other_goal) {
        (Some(g), _) => {
            // The grants first, as `run` checks them: nothing the goal names outside them is
            // opened.
            if let Err(e) = crate::runs::define(g.clone(), run::RunOptions::default(), grants) {
                let finding = check::Finding {
                    code: e.code(),
                    call: None,
                    tool: None,
                    turn: None,
                    message: e.to_string(),
                };
                return Ok(report(
                    json!({"kind": "goal", "calls": calls.len()}),
                    vec![finding],
                ));
            }
            ("goal", check::check_goal(&g))
        }
        (None, Some(g)) => (
            "plan",
            check::check_plan(&calls, Some(&g.tools), &check::initial_data(&g)),
        ),
        (None, None) => {
            let findings = check::check_plan(&calls, None, &serde_json::Map::new());
            // Without a goal there is no input: say so rather than leave only "nothing writes
            // `input.x`" for each reference.
            let reads_input = findings.iter().any(|f| {
                f.code == "plan.dangling_reference" && f.message.contains("writes `input")
            });
            let mut head = json!({"kind": "plan", "calls": calls.len()});
            if reads_input {
                head["hint"] = json!(format!(
                    "the plan reads `input`, which only a goal gives: dagloop validate {} --goal GOAL",
                    file.display()
                ));
            }
            return Ok(report(head, findings));
        }
    };
    Ok(report(
        json!({"kind": kind, "calls": calls.len()}),
        findings,
    ))
}

/// True when `file` is a JSON object with a `turns` key (a scripted-model file).
pub(super) fn is_script_file(file: &FsPath) -> bool {
    std::fs::read_to_string(file)
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        .is_some_and(|v| v.get("turns").is_some())
}

/// Prints a validation report (`head` plus status and findings); exit 0 when there are none.
pub(super) fn report(mut head: Value, findings: Vec<check::Finding>) -> i32 {
    let ok = findings.is_empty();
    head["status"] = json!(if ok { "valid" } else { "invalid" });
    head["findings"] = json!(findings);
    // The hint last, after what it explains.
    if let Some(hint) = head.as_object_mut().and_then(|m| m.shift_remove("hint")) {
        head["hint"] = hint;
    }
    outln!("{}", pretty(&head));
    if ok { 0 } else { 1 }
}

pub(super) fn graph(
    file: &FsPath,
    format: GraphFormat,
    store: impl FnOnce() -> Result<Store, CliError>,
) -> Result<i32, CliError> {
    // Not a file: a stored run's id (`dagloop graph RUN`).
    if !file.exists() && !file.to_string_lossy().ends_with(".json") {
        return graph_run(&store()?, &file.to_string_lossy(), format);
    }
    let (calls, goal) = load_plan(file)?;
    if calls.is_empty() && goal.is_some() {
        return Err(CliError::new(
            "graph.no_plan",
            format!(
                "{} has no `plan`: its calls come from the model as it runs, so there is no graph to draw before a run; run it, then draw what the run did: dagloop graph RUN",
                file.display()
            ),
        ));
    }
    let text = match format {
        GraphFormat::Mermaid => check::mermaid(&calls, goal.as_ref()),
        GraphFormat::Dot => check::dot(&calls, goal.as_ref()),
    };
    out!("{text}");
    Ok(0)
}

/// `dagloop graph RUN`: the calls of a stored run's own agent as they arrived, each with what
/// became of it, and the data that flowed between them (`check::run_edges`).
fn graph_run(store: &Store, run: &str, format: GraphFormat) -> Result<i32, CliError> {
    let stored = store
        .load(run)
        .map_err(|e| CliError::new(crate::codes::HasCode::code(&e), e.to_string()))?;
    let rb = crate::runs::rebuild(&stored.record, &stored.journal)
        .map_err(|e| CliError::new(e.code(), e.to_string()))?;
    let view = crate::runs::describe_view(
        &stored.record.id,
        &rb,
        stored.journal.len(),
        stored.result.as_ref(),
        stored.lease.is_some(),
    );
    let calls: Vec<check::RunCall> = rb
        .events
        .iter()
        .filter(|e| e.depth == 0)
        .filter_map(|e| match (&e.kind, e.call) {
            (crate::protocol::EventKind::CallReceived { call }, Some(id)) => Some(check::RunCall {
                id: id.0,
                call: (**call).clone(),
                status: view
                    .calls
                    .iter()
                    .find(|c| c.id == id.0)
                    .map_or_else(|| "pending".to_string(), |c| c.status.clone()),
            }),
            _ => None,
        })
        .collect();
    let text = match format {
        GraphFormat::Mermaid => check::run_mermaid(&calls),
        GraphFormat::Dot => check::run_dot(&calls),
    };
    out!("{text}");
    Ok(0)
}
