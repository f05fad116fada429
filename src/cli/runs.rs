//! Stored runs on the command line: `dagloop runs`, `runs prune`, `show`, `decide`.
//!
//! Everything shown is rebuilt by replaying the run's journal through the same machine that ran
//! it; a decision is checked the same way (rule 21) before it is recorded.

use serde_json::{Value, json};

use super::Store;
use super::{CliError, pretty};
use crate::codes::HasCode;
use crate::protocol::Op;
use crate::store::StoredRun;

fn err(e: impl std::fmt::Display + HasCode) -> CliError {
    CliError::new(e.code(), e.to_string())
}

/// What a compacted run kept (None: it is not compacted; its journal is read as usual).
fn compacted(store: &Store, run: &str) -> Result<Option<crate::store::Compacted>, CliError> {
    store.compacted(run).map_err(err)
}

fn rebuild(stored: &StoredRun) -> Result<crate::runs::Rebuilt, CliError> {
    crate::runs::rebuild(&stored.record, &stored.journal)
        .map_err(|e| CliError::new(e.code(), e.to_string()))
}

/// `dagloop runs`: one page of runs from the store's rows (the query `GET /runs` answers),
/// waiting first, then newest.
pub(super) fn list(
    store: &Store,
    params: &[(&str, String)],
    json_out: bool,
) -> Result<i32, CliError> {
    let q = crate::store::RunQuery::from_params(params.iter().map(|(k, v)| (*k, v.as_str())))
        .map_err(|e| CliError::new(e.code(), e.to_string()))?;
    let page =
        crate::runs::list_runs(&**store, &q).map_err(|e| CliError::new(e.code(), e.to_string()))?;
    let now = super::run::now_ms();
    let mut out = Vec::new();
    for r in &page.runs {
        let mut v = serde_json::to_value(r).unwrap_or(Value::Null);
        // The name this list used before `awaiting`.
        v["waiting_approvals"] = json!(r.awaiting);
        v["age_s"] = json!(now.saturating_sub(r.updated_at) / 1000);
        v["step"] = json!(step_of(store, &r.id));
        out.push(v);
    }
    if json_out {
        outln!("{}", pretty(&Value::Array(out)));
    } else if out.is_empty() {
        outln!("no runs in {}", store.path().display());
    } else {
        // Each column as wide as its widest cell (a JSON value is printed through `as_*`: its
        // own Display ignores widths).
        let rows: Vec<[String; 5]> = out
            .iter()
            .map(|v| {
                [
                    v["id"].as_str().unwrap_or("").to_string(),
                    v["status"].as_str().unwrap_or("").to_string(),
                    v["step"]
                        .as_u64()
                        .map_or_else(|| "-".into(), |s| s.to_string()),
                    age(v["age_s"].as_u64().unwrap_or(0)),
                    v["awaiting"].as_u64().unwrap_or(0).to_string(),
                ]
            })
            .collect();
        let head = ["RUN", "STATUS", "STEP", "AGE", "WAITING"];
        let width = |i: usize| {
            rows.iter()
                .map(|r| r[i].chars().count())
                .chain([head[i].len()])
                .max()
                .unwrap_or(0)
        };
        let (w0, w1, w2, w3, w4) = (width(0), width(1), width(2), width(3), width(4));
        outln!(
            "{:<w0$}  {:<w1$}  {:>w2$}  {:>w3$}  {:>w4$}  TITLE",
            head[0],
            head[1],
            head[2],
            head[3],
            head[4]
        );
        for (r, v) in rows.iter().zip(&out) {
            outln!(
                "{:<w0$}  {:<w1$}  {:>w2$}  {:>w3$}  {:>w4$}  {}",
                r[0],
                r[1],
                r[2],
                r[3],
                r[4],
                v["title"].as_str().unwrap_or(""),
            );
        }
    }
    if page.next.is_some() && !json_out {
        outln!(
            "({} shown; more runs match: raise --limit (up to {}) or narrow with --status)",
            page.runs.len(),
            crate::store::MAX_LIMIT
        );
    }
    Ok(0)
}

/// The step a run is at: the model requests it made (its result's `steps` once it finished;
/// before, the turns of its own agent its journal closed); None when the run cannot be read.
fn step_of(store: &Store, id: &str) -> Option<u32> {
    let stored = store.load(id).ok()?;
    if let Some(r) = &stored.result {
        return Some(r.steps);
    }
    let closed = stored
        .journal
        .iter()
        .filter(|e| {
            matches!(
                &e.input,
                crate::machine::RunInput::StreamClosed { frame: None, .. }
            )
        })
        .count();
    Some(u32::try_from(closed).unwrap_or(u32::MAX))
}

fn age(s: u64) -> String {
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86400 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

/// `30d`, `12h`, `45m`, `10s` as milliseconds (`cli.bad_duration` otherwise).
pub(super) fn parse_age(s: &str) -> Result<u64, CliError> {
    crate::duration::age_ms(s).map_err(|e| CliError::new("cli.bad_duration", e))
}

/// `dagloop runs prune`: the retention policy (`--retain`, `--compact-after`, else the config's
/// `[store]`) applied once: finished runs older than `retain` are deleted, those older than
/// `compact_after` compacted. Runs that are not finished are never touched.
pub(super) fn prune(
    store: &Store,
    retain: Option<&str>,
    compact_after: Option<&str>,
    config: Option<&crate::config::Config>,
) -> Result<i32, CliError> {
    let from_config = config.map(|c| c.store.clone()).unwrap_or_default();
    let policy = crate::store::Retention {
        retain_ms: retain
            .or(from_config.retain.as_deref())
            .map(parse_age)
            .transpose()?,
        compact_after_ms: compact_after
            .or(from_config.compact_after.as_deref())
            .map(parse_age)
            .transpose()?,
    };
    if policy.is_empty() {
        return Err(CliError::new(
            "runs.no_retention",
            "nothing to prune by: give --retain AGE and/or --compact-after AGE, or set [store] retain / compact_after in the config",
        ));
    }
    let done = crate::runs::apply_retention(&**store, &policy, super::run::now_ms())
        .map_err(|e| CliError::new(e.code(), e.to_string()))?;
    let mut v = serde_json::to_value(&done).unwrap_or(Value::Null);
    v["status"] = json!("pruned");
    // The name this answer used for the deleted runs before compaction.
    v["runs"] = json!(done.deleted);
    outln!("{}", pretty(&v));
    Ok(0)
}

/// `dagloop runs compact RUN...`: compacts each named finished run now.
pub(super) fn compact(store: &Store, ids: &[String]) -> Result<i32, CliError> {
    let mut out = Vec::new();
    for id in ids {
        let c = crate::runs::compact(&**store, id)
            .map_err(|e| CliError::new(e.code(), e.to_string()))?;
        out.push(serde_json::to_value(&c).unwrap_or(Value::Null));
    }
    outln!("{}", pretty(&json!({"status": "compacted", "runs": out})));
    Ok(0)
}

pub(super) fn decide(store: &Store, run: &str, op: Op) -> Result<i32, CliError> {
    record(store, run, op, json!({}))
}

/// Records `op` for a stored run (checked against it first) and prints `{status: recorded,
/// run_id, next}` with the fields of `extra`.
pub(super) fn record(store: &Store, run: &str, op: Op, extra: Value) -> Result<i32, CliError> {
    let (op, live) = crate::runs::record_op(&**store, run, &op).map_err(|e| match e {
        crate::runs::Refused::Op(e) => CliError::new(e.code(), e.to_string()),
        crate::runs::Refused::Runs(e) => CliError::new(e.code(), e.to_string()),
    })?;
    let mut v = json!({
        "status": "recorded",
        "run_id": run,
        "next": if live { "the process running it applies the decision now" } else { "run `dagloop resume` to continue" },
    });
    if let (
        Some(m),
        Op::Decide {
            presentation: Some(p),
            ..
        },
    ) = (v.as_object_mut(), &op)
    {
        m.insert("presentation".into(), json!(p));
    }
    if let (Some(m), Value::Object(x)) = (v.as_object_mut(), extra) {
        m.extend(x);
    }
    outln!("{}", pretty(&v));
    Ok(0)
}

pub(super) fn show(store: &Store, run: &str, json_out: bool, trace: bool) -> Result<i32, CliError> {
    if let Some(c) = compacted(store, run)? {
        let out = &c.snapshot["view"];
        if trace {
            return print_trace(out, json_out);
        }
        return print_description(out, c.entries as usize, Some(&c.result), json_out);
    }
    let stored = store.load(run).map_err(err)?;
    let rb = rebuild(&stored)?;
    let mut out = crate::runs::describe(
        &stored.record.id,
        &rb,
        stored.journal.len(),
        stored.result.as_ref(),
        stored.lease.is_some(),
    );
    if trace {
        return print_trace(&out, json_out);
    }
    let session = session_runs(store, &stored.record)?;
    if !session.is_empty() {
        out["session_runs"] = Value::Array(session);
    }
    print_description(&out, stored.journal.len(), stored.result.as_ref(), json_out)
}

/// The runs of the session `record` belongs to, oldest first (`id`, `status`, `title`,
/// `parent`): empty when the run is alone in its session.
fn session_runs(store: &Store, record: &crate::store::RunRecord) -> Result<Vec<Value>, CliError> {
    let root = crate::runs::session_of(record).root;
    let page = store
        .query(&crate::store::RunQuery {
            session: Some(root),
            limit: crate::store::MAX_LIMIT,
            ..Default::default()
        })
        .map_err(err)?;
    if page.runs.len() < 2 {
        return Ok(Vec::new());
    }
    let mut runs = page.runs;
    runs.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
    Ok(runs
        .iter()
        .map(|r| json!({"id": r.id, "status": r.status, "title": r.title}))
        .collect())
}

/// `dagloop show RUN --audit`: the run's decisions and standing approvals (`runs::audit`), as
/// JSON or lines. The JSON repeats `standing` under `grants`, its name before the rename, for
/// one release.
pub(super) fn audit(store: &Store, run: &str, json_out: bool) -> Result<i32, CliError> {
    let (id, entries, standing) = match compacted(store, run)? {
        Some(c) => (
            c.record.id,
            c.snapshot["audit"].as_array().cloned().unwrap_or_default(),
            crate::runs::kept(&c.snapshot, "standing").clone(),
        ),
        None => {
            let stored = store.load(run).map_err(err)?;
            let rb = rebuild(&stored)?;
            (
                stored.record.id,
                crate::runs::audit::audit(&rb.events),
                json!(crate::runs::audit::standing(&rb.events)),
            )
        }
    };
    if json_out {
        outln!(
            "{}",
            pretty(&json!({
                "run_id": id,
                "audit": entries,
                "standing": standing,
                "grants": standing,
            }))
        );
        return Ok(0);
    }
    outln!("run {} · {} audit entries", id, entries.len());
    for l in crate::runs::audit::lines(&entries) {
        outln!("{l}");
    }
    Ok(0)
}

/// Prints a run's trace: the trace id its spans are exported under and its critical path (the
/// description's, one computation for the page, `show` and this), each piece named as the span
/// a trace viewer shows for it.
fn print_trace(out: &Value, json_out: bool) -> Result<i32, CliError> {
    let id = out["id"].as_str().unwrap_or("");
    let trace_id = crate::telemetry::trace_id(id).to_string();
    let path: Vec<Value> = out["critical_path"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            let mut s = s.clone();
            s["span"] = json!(crate::telemetry::spans::span_name_for(
                s["what"].as_str().unwrap_or("")
            ));
            s
        })
        .collect();
    if json_out {
        outln!(
            "{}",
            pretty(
                &json!({"run_id": id, "trace_id": trace_id, "duration_ms": out["duration_ms"], "critical_path": path})
            )
        );
        return Ok(0);
    }
    outln!("run {id} · trace {trace_id} · {} ms", out["duration_ms"]);
    outln!("critical path (what set the run's duration):");
    for s in &path {
        let call = s["call_id"]
            .as_u64()
            .map(|c| format!("  (call {c})"))
            .unwrap_or_default();
        outln!(
            "  {:>6} → {:>6}  {:>6} ms  {}{call}",
            s["start_ms"],
            s["end_ms"],
            s["end_ms"]
                .as_u64()
                .unwrap_or(0)
                .saturating_sub(s["start_ms"].as_u64().unwrap_or(0)),
            s["span"].as_str().unwrap_or("")
        );
    }
    Ok(0)
}

/// Prints a run's description (`runs::describe`): JSON, or the timeline for people.
pub(super) fn print_description(
    out: &Value,
    entries: usize,
    result: Option<&crate::machine::RunResult>,
    json_out: bool,
) -> Result<i32, CliError> {
    if json_out {
        outln!("{}", pretty(out));
        return Ok(0);
    }
    outln!(
        "run {} · {} · {} ms · {} journal entries",
        out["id"].as_str().unwrap_or(""),
        out["status"].as_str().unwrap_or(""),
        out["duration_ms"],
        entries
    );
    if let (Some(run), Some(step)) = (
        out["forked_from"]["run"].as_str(),
        out["forked_from"]["step"].as_u64(),
    ) {
        outln!("forked from {run} after step {step}");
    }
    if let (Some(root), Some(parent)) = (
        out["session"]["root"].as_str(),
        out["session"]["parent"].as_str(),
    ) {
        outln!("session {root} · follows {parent}");
    }
    if let Some(runs) = out["session_runs"].as_array() {
        outln!("\nsession runs (oldest first):");
        for r in runs {
            outln!(
                "  {:<28} {:<10} {}",
                r["id"].as_str().unwrap_or(""),
                r["status"].as_str().unwrap_or(""),
                r["title"].as_str().unwrap_or("")
            );
        }
    }
    if let (Some(p), Some(ch)) = (
        out["cancelled_by"]["principal"].as_str(),
        out["cancelled_by"]["channel"].as_str(),
    ) {
        outln!("cancelled by {p} ({ch})");
    }
    outln!("\ncalls (ms from the run's start):");
    for c in out["calls"].as_array().into_iter().flatten() {
        let f = |k: &str| {
            c[k].as_u64()
                .map(|v| v.to_string())
                .unwrap_or_else(|| "-".into())
        };
        // A call nobody was asked about has no "decided" column (blank, so the columns line up).
        let decided = match c["decided_ms"].as_u64() {
            Some(ms) => format!("decided {ms:>6}"),
            None => " ".repeat("decided       ".len()),
        };
        outln!(
            "  {:<5} {:<24} {:<17} received {:>6}  {decided}  ran {:>6} → {:>6}  {}",
            format!("c{}", c["id"].as_u64().unwrap_or(0)),
            c["tool"].as_str().unwrap_or("?"),
            c["status"].as_str().unwrap_or("pending"),
            f("received_ms"),
            f("started_ms"),
            f("ended_ms"),
            c["decision"]
                .as_str()
                .map(|d| {
                    match (
                        c["decided_by"]["principal"].as_str(),
                        c["decided_by"]["channel"].as_str(),
                    ) {
                        (Some(p), Some(ch)) => format!("({d} by {p}, {ch})"),
                        _ => format!("({d})"),
                    }
                })
                .unwrap_or_default(),
        );
    }
    // A run that has not ended (waiting for a reviewer) has no critical path yet: no heading.
    let path = out["critical_path"].as_array().cloned().unwrap_or_default();
    if !path.is_empty() {
        outln!("\ncritical path (what set the run's duration):");
    }
    for s in &path {
        outln!(
            "  {:>6} → {:>6}  {}",
            s["start_ms"].as_u64().unwrap_or(0),
            s["end_ms"].as_u64().unwrap_or(0),
            s["what"].as_str().unwrap_or("")
        );
    }
    let fallbacks = out["model_fallbacks"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if !fallbacks.is_empty() {
        outln!("\nmodel fallbacks:");
        for f in &fallbacks {
            outln!(
                "  step {:<3} {:>6} ms  {} → {}  ({})",
                f["step"],
                f["at_ms"],
                f["from"].as_str().unwrap_or("?"),
                f["to"].as_str().unwrap_or("?"),
                f["code"].as_str().unwrap_or("")
            );
        }
    }
    let listed = |key: &str| out[key].as_array().cloned().unwrap_or_default();
    let reasks = listed("stream_reasks");
    if !reasks.is_empty() {
        outln!("\nstreams asked again without streaming:");
        for r in &reasks {
            outln!(
                "  step {:<3} {:>6} ms  {}  ({}; {} call(s) kept)",
                r["step"],
                r["at_ms"],
                r["model"].as_str().unwrap_or("?"),
                r["code"].as_str().unwrap_or(""),
                r["calls_kept"]
            );
        }
    }
    let compactions = listed("context_compactions");
    if !compactions.is_empty() {
        outln!("\ncontexts compacted (too long for the model):");
        for c in &compactions {
            outln!(
                "  step {:<3} {:>6} ms  level {}  {} → {} chars",
                c["step"],
                c["at_ms"],
                c["level"],
                c["refused_chars"],
                c["chars"]
            );
        }
    }
    if let Some(r) = result
        && !r.usage.models.is_empty()
    {
        outln!("\nusage by model:");
        for (model, u) in &r.usage.models {
            outln!(
                "  {:<32} {:>8} in  {:>8} out{}",
                model,
                u.input_tokens,
                u.output_tokens,
                if u.estimated { "  (estimated)" } else { "" }
            );
        }
    }
    if let Some(r) = result {
        outln!("\nstate: {}", r.state);
        outln!("output: {}", r.output);
    }
    Ok(0)
}
