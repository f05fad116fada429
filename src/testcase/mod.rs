//! Test cases for `dagloop test`: a `test.json` file (schemas/test-case.schema.json) names a
//! goal, how it runs offline (a scripted model, a cassette, a tools recording, an input,
//! decisions) and what its run must show (status, output, a schema the output must match,
//! JSON-pointer assertions on the result, tools called or never called, most steps).
//!
//! This module reads and checks cases and judges results ([`check`]), and judges a run killed
//! and resumed against the uninterrupted one ([`crash::judge`]); it runs nothing. The command
//! line drives the runs (`cli::test_cmd`).
//!
//! Deliberately not here: processes, stores, printing (the command line), JUnit XML ([`junit`]).

pub mod crash;
pub mod junit;

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::{Map, Value};

/// A test case could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CaseError {
    /// The file cannot be read.
    #[error("cannot read {path}: {reason}")]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The file is not JSON, or not a test case (every schema violation, by pointer).
    #[error("{path} is not a test case: {reason}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A path given to `dagloop test` holds no test case.
    #[error("{path} is neither a test file nor a folder holding `test.json` files")]
    NotFound {
        /// The path.
        path: PathBuf,
    },
}

crate::codes::has_code!(CaseError);

impl CaseError {
    /// A stable code.
    pub fn code(&self) -> &'static str {
        match self {
            CaseError::Unreadable { .. } => "test.unreadable",
            CaseError::Invalid { .. } => "test.invalid",
            CaseError::NotFound { .. } => "test.not_found",
        }
    }
}

/// What a case's run must show.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    /// The final status (`succeeded`, `max_steps`...).
    #[serde(default)]
    pub status: Option<String>,
    /// The output, exactly.
    #[serde(default)]
    pub output: Option<Value>,
    /// A JSON Schema the output must match.
    #[serde(default)]
    pub output_schema: Option<Value>,
    /// JSON pointer into the result (`/output/status`, `/state/receipt/amount`) → value.
    #[serde(default)]
    pub pointers: Map<String, Value>,
    /// Tools the run's own agent called at least once with success (a call that failed, was
    /// refused or never ran does not count).
    #[serde(default)]
    pub called: Vec<String>,
    /// Tools expected to have a call that failed (failed, refused or unresolved). Without it, any
    /// such call fails the case: a run that "succeeds" past a broken call is not a pass.
    #[serde(default)]
    pub failed: Vec<String>,
    /// Tools it never called.
    #[serde(default)]
    pub not_called: Vec<String>,
    /// Most steps (model turns) the run may take.
    #[serde(default)]
    pub max_steps: Option<u32>,
}

/// A test case, with its paths made absolute (relative ones are read from the test file's
/// folder).
#[derive(Debug, Clone)]
pub struct Case {
    /// What the summary calls it: `name`, else the test file's folder (or the file).
    pub name: String,
    /// The goal file.
    pub goal: PathBuf,
    /// The model spec (`scripted:ABSOLUTE`, or another spec as written).
    pub model: Option<String>,
    /// The tools recording.
    pub tools_from: Option<PathBuf>,
    /// The input in place of the goal's.
    pub input: Option<Value>,
    /// A decisions file.
    pub decisions: Option<PathBuf>,
    /// Whether the goal's shell tools may run.
    pub allow_shell: bool,
    /// The expectations.
    pub expect: Expect,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default, rename = "$schema")]
    _schema: Option<String>,
    #[serde(default)]
    name: Option<String>,
    goal: String,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    cassette: Option<String>,
    #[serde(default)]
    tools_from: Option<String>,
    #[serde(default)]
    input: Option<Value>,
    #[serde(default)]
    decisions: Option<String>,
    #[serde(default)]
    allow_shell: bool,
    #[serde(default)]
    expect: Expect,
}

impl Case {
    /// Reads and checks a test file (`test.unreadable`, `test.invalid` with every schema
    /// violation by pointer). `shown` is how the summary names it when the file has no `name`.
    pub fn load(path: &Path, shown: &str) -> Result<Case, CaseError> {
        let invalid = |reason: String| CaseError::Invalid {
            path: path.to_path_buf(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| CaseError::Unreadable {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        let doc: Value = serde_json::from_str(&text).map_err(|e| invalid(e.to_string()))?;
        let violations = crate::schema::published::Document::TestCase
            .validate(&doc)
            .map_err(|e| invalid(e.to_string()))?;
        if !violations.is_empty() {
            let list: Vec<String> = violations
                .iter()
                .map(|v| format!("at `{}`: {}", v.pointer, v.message))
                .collect();
            return Err(invalid(list.join("; ")));
        }
        let f: File = serde_json::from_value(doc).map_err(|e| invalid(e.to_string()))?;
        let dir = path.parent().unwrap_or(Path::new("."));
        let abs = |p: &str| crate::runs::absolute_dir(&dir.join(p));
        let cassette = f.cassette.as_deref().map(abs);
        let model = match (f.model, &cassette) {
            (Some(m), _) => Some(match m.strip_prefix("scripted:") {
                Some(p) => format!("scripted:{}", abs(p).display()),
                None => m,
            }),
            (None, Some(c)) => Some(format!("scripted:{}", c.join("model.json").display())),
            (None, None) => None,
        };
        let tools_from = match (f.tools_from.as_deref(), &cassette) {
            (Some(t), _) => Some(abs(t)),
            (None, Some(c)) => Some(c.join("tools.json")),
            (None, None) => None,
        };
        Ok(Case {
            name: f.name.unwrap_or_else(|| shown.to_string()),
            goal: abs(&f.goal),
            model,
            tools_from,
            input: f.input,
            decisions: f.decisions.as_deref().map(abs),
            allow_shell: f.allow_shell,
            expect: f.expect,
        })
    }
}

/// The test files `paths` name: a file as it is, a folder searched (recursively, in name
/// order) for `test.json`. Each with how the summary names it (its folder, or the file).
pub fn find(paths: &[PathBuf]) -> Result<Vec<(PathBuf, String)>, CaseError> {
    let mut out = Vec::new();
    for p in paths {
        if p.is_file() {
            out.push((p.clone(), p.display().to_string()));
        } else if p.is_dir() {
            let before = out.len();
            walk(p, &mut out);
            if out.len() == before {
                return Err(CaseError::NotFound { path: p.clone() });
            }
        } else {
            return Err(CaseError::NotFound { path: p.clone() });
        }
    }
    Ok(out)
}

fn walk(dir: &Path, out: &mut Vec<(PathBuf, String)>) {
    let file = dir.join("test.json");
    if file.is_file() {
        out.push((file, dir.display().to_string()));
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    for d in dirs {
        walk(&d, out);
    }
}

/// The call statuses that count as a failed call: it ran and failed, it was refused before
/// running, or it could never run (references to nothing).
const FAILED: [&str; 3] = ["failed", "refused", "unresolved"];

/// The run's calls as `tool status` pairs, for failure messages.
fn summary(result: &Value) -> String {
    let list: Vec<String> = result["calls"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            format!(
                "{} {}",
                c["tool"].as_str().unwrap_or("?"),
                c["status"].as_str().unwrap_or("?")
            )
        })
        .collect();
    format!("[{}]", list.join(", "))
}

/// What is wrong with `result` (a run's result JSON: status, output, state, steps, calls...)
/// against `expect`; empty when it meets every expectation.
pub fn check(expect: &Expect, result: &Value) -> Vec<String> {
    let mut failures = Vec::new();
    if let Some(s) = &expect.status
        && result["status"] != Value::String(s.clone())
    {
        failures.push(format!(
            "status: expected {s}, got {}{}",
            result["status"],
            result["error"]["code"]
                .as_str()
                .map(|c| format!(" ({c})"))
                .unwrap_or_default()
        ));
    }
    if let Some(o) = &expect.output
        && &result["output"] != o
    {
        failures.push(format!("output: expected {o}, got {}", result["output"]));
    }
    if let Some(schema) = &expect.output_schema {
        match crate::schema::OutputValidator::new(schema) {
            Ok(v) => {
                let errors = v.validate(&result["output"]);
                if !errors.is_empty() {
                    let list: Vec<String> = errors.iter().map(ToString::to_string).collect();
                    failures.push(format!(
                        "output does not match expect.output_schema: {}",
                        list.join("; ")
                    ));
                }
            }
            Err(e) => failures.push(format!("expect.output_schema is not a schema: {e}")),
        }
    }
    for (pointer, want) in &expect.pointers {
        match result.pointer(pointer) {
            Some(got) if got == want => {}
            Some(got) => failures.push(format!("{pointer}: expected {want}, got {got}")),
            None => failures.push(format!("{pointer}: expected {want}, the result has none")),
        }
    }
    let calls: Vec<(&str, &str)> = result["calls"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| Some((c["tool"].as_str()?, c["status"].as_str()?)))
        .collect();
    let made: Vec<&str> = calls.iter().map(|(t, _)| *t).collect();
    let succeeded = |t: &str| calls.iter().any(|(tool, st)| *tool == t && *st == "done");
    for t in &expect.called {
        if !succeeded(t) {
            let why = if made.contains(&t.as_str()) {
                "none of its calls succeeded"
            } else {
                "it was never called"
            };
            failures.push(format!(
                "expected a successful call of `{t}`: {why}; calls made: {}",
                summary(result)
            ));
        }
    }
    for t in &expect.not_called {
        if made.contains(&t.as_str()) {
            failures.push(format!("`{t}` was called; it must never be"));
        }
    }
    for t in &expect.failed {
        if !calls
            .iter()
            .any(|(tool, st)| *tool == t && FAILED.contains(st))
        {
            failures.push(format!(
                "expected a failed call of `{t}` (expect.failed); calls made: {}",
                summary(result)
            ));
        }
    }
    for c in result["calls"].as_array().into_iter().flatten() {
        let (Some(tool), Some(status)) = (c["tool"].as_str(), c["status"].as_str()) else {
            continue;
        };
        if FAILED.contains(&status) && !expect.failed.iter().any(|t| t == tool) {
            failures.push(format!(
                "call {} ({tool}) {status}{}; list `{tool}` in expect.failed if the case expects it",
                c["id"],
                c["error"]["code"]
                    .as_str()
                    .map(|code| format!(
                        ": {code} {}",
                        c["error"]["message"].as_str().unwrap_or_default()
                    ))
                    .unwrap_or_default()
            ));
        }
    }
    if let Some(max) = expect.max_steps {
        let steps = result["steps"].as_u64().unwrap_or(u64::MAX);
        if steps > u64::from(max) {
            failures.push(format!("steps: {steps}, at most {max} expected"));
        }
    }
    failures
}
