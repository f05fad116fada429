//! Goal files: what a program submits (DESIGN.md section 4), read with clear, coded errors.
//!
//! This module only reads and checks a goal; it runs nothing. The JSON Schema in
//! `schemas/goal.schema.json` describes the same format for other programs.

use std::collections::BTreeSet;
use std::path::{Path as FsPath, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use crate::context::memory::{
    Chunk as MemoryChunk, Found as MemoryFound, Index as MemoryIndex, MemorySource,
    Recall as MemoryRecall,
};
pub use crate::duration::DurationError;
use crate::protocol::{Call, Message, Tool};
use crate::schema::published::Document;
pub use crate::schema::{
    OutputValidator, ParamsValidator, SchemaError, Subject, ToolValidators, Violation,
};

/// Most schema violations listed in one error message.
const MAX_LISTED: usize = 5;

/// Checks a goal document against the published `schemas/goal.schema.json`; the error lists the
/// violations with their JSON pointers ("at the root" for the document itself).
pub fn check_published(doc: &Value) -> Result<(), String> {
    let violations = Document::Goal.validate(doc).map_err(|e| e.to_string())?;
    if violations.is_empty() {
        return Ok(());
    }
    let mut parts: Vec<String> = violations
        .iter()
        .take(MAX_LISTED)
        .map(|v| {
            let mut text = v.to_string();
            if v.keyword == "additionalProperties" {
                text.push_str(&suggest_unexpected(&v.message));
            }
            text
        })
        .collect();
    if violations.len() > MAX_LISTED {
        parts.push(format!("and {} more", violations.len() - MAX_LISTED));
    }
    Err(format!(
        "does not match schemas/goal.schema.json: {}",
        parts.join("; ")
    ))
}

/// ` (did you mean `timeout_s`?)` for the first property a schema violation calls unexpected
/// (`('timout_s' was unexpected)`) that is a typo of a property the goal schema names somewhere;
/// empty otherwise. The candidates are every property name in `schemas/goal.schema.json`: a
/// typo is within a few edits of the one meant, which is rarely another place's key.
fn suggest_unexpected(message: &str) -> String {
    static NAMES: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    let names = NAMES.get_or_init(|| {
        fn walk(v: &Value, out: &mut Vec<String>) {
            match v {
                Value::Object(m) => {
                    if let Some(Value::Object(props)) = m.get("properties") {
                        out.extend(props.keys().cloned());
                    }
                    m.values().for_each(|v| walk(v, out));
                }
                Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
                _ => {}
            }
        }
        let mut out = Vec::new();
        if let Ok(schema) = Document::Goal.schema() {
            walk(&schema, &mut out);
        }
        out.sort();
        out.dedup();
        out
    });
    let Some(start) = message.find('(') else {
        return String::new();
    };
    let listed = message[start + 1..]
        .split(" was unexpected")
        .next()
        .unwrap_or_default()
        .split(" were unexpected")
        .next()
        .unwrap_or_default();
    listed
        .split(", ")
        .map(|k| k.trim_matches('\''))
        .find_map(|k| {
            crate::protocol::meta::closest(k, names.iter().map(String::as_str))
                .filter(|s| *s != k)
                .map(|s| format!(" (did you mean `{s}`?)"))
        })
        .unwrap_or_default()
}

/// ` (did you mean `tools`?)` for serde's "unknown field `tool`, expected one of `goal`, ..."
/// when the field is a typo of one it expected; empty otherwise.
pub(crate) fn suggest_field(message: &str) -> String {
    let Some(rest) = message.split("unknown field `").nth(1) else {
        return String::new();
    };
    let Some((field, expected)) = rest.split_once('`') else {
        return String::new();
    };
    let candidates: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
    crate::protocol::meta::closest(field, candidates)
        .map(|s| format!(" (did you mean `{s}`?)"))
        .unwrap_or_default()
}

/// The goal document's keys a goal may have (its fields, as written).
const GOAL_KEYS: &[&str] = &[
    "$schema",
    "description",
    "goal",
    "model",
    "input",
    "input_schema",
    "output_schema",
    "state",
    "state_schema",
    "tools",
    "context",
    "plan",
    "limits",
    "mode",
    "mcp_servers",
    "approval",
    "env",
];

/// A meta key dagloop does not define in a goal document, with where it is: (words, JSON
/// pointer to the key, the key and the closest known one).
type Misplaced = (String, String, crate::protocol::UnknownMetaKey);

/// `key` as one JSON-pointer token (`~` as `~0`, `/` as `~1`).
fn pointer_token(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// Finds a meta key dagloop does not define: on the goal itself (a goal defines no meta key: the
/// closest field is suggested), on a tool (`tools[0] (Refund)`, its `properties` too) or a plan
/// call (`plan[1]`). The rules are [`crate::protocol::meta`]'s, the ones the plan parser applies
/// to the model's calls.
fn find_unknown_meta_key(doc: &Value) -> Option<Misplaced> {
    use crate::protocol::meta;
    let top = doc.as_object()?;
    if let Some(key) = top.keys().find(|k| meta::is_meta_key(k)) {
        let unknown = crate::protocol::UnknownMetaKey {
            key: key.clone(),
            suggestion: meta::closest(key, GOAL_KEYS.iter().copied()).map(str::to_string),
        };
        return Some((
            "the goal".into(),
            format!("/{}", pointer_token(key)),
            unknown,
        ));
    }
    let items = |field: &str| {
        top.get(field)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
    };
    for (i, t) in items("tools") {
        // A tool that does not parse is reported by the loader, with its own error.
        let Ok(tool) = serde_json::from_value::<Tool>(t.clone()) else {
            continue;
        };
        if let Some((part, unknown)) = tool.unknown_meta_key() {
            let (at, pointer) = match part {
                Some(p) => (
                    format!("tools[{i}] ({}).{p}", tool.name),
                    format!("/tools/{i}/{p}/{}", pointer_token(&unknown.key)),
                ),
                None => (
                    format!("tools[{i}] ({})", tool.name),
                    format!("/tools/{i}/{}", pointer_token(&unknown.key)),
                ),
            };
            return Some((at, pointer, unknown));
        }
    }
    for (i, c) in items("plan") {
        if let Ok(call) = Call::try_from(c.clone())
            && let Some(unknown) = call.unknown_meta_key()
        {
            let pointer = format!("/plan/{i}/{}", pointer_token(&unknown.key));
            return Some((format!("plan[{i}]"), pointer, unknown));
        }
    }
    None
}

/// The goal's approval timeout, checked before the policy is read (which holds it as a
/// duration), so that it is refused the way the limits' are (`approval.timeout_s must be ...`).
fn check_policy(v: &Value) -> Result<(), String> {
    if let Some(s) = v.get("timeout_s").and_then(Value::as_f64) {
        crate::duration::seconds("approval.timeout_s", s).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// The reason an embedded schema is invalid, without repeating which schema (the caller names it).
fn schema_reason(e: &SchemaError) -> String {
    match e {
        SchemaError::InvalidSchema {
            pointer, message, ..
        } if pointer.is_empty() => format!("at the root: {message}"),
        SchemaError::InvalidSchema {
            pointer, message, ..
        } => format!("at {pointer}: {message}"),
        other => other.to_string(),
    }
}

pub use crate::protocol::Limits;

/// A goal: prompt, data, tools, output schema and options.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Goal {
    /// The JSON Schema the file declares itself against (ignored).
    #[serde(rename = "$schema", default, skip_serializing_if = "Option::is_none")]
    pub json_schema: Option<String>,
    /// A note for people reading the file (not shown to the model).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// What to achieve, in words.
    pub goal: String,
    /// Default model spec (`scripted:PATH`, `openai:MODEL`, `anthropic:MODEL`), or several,
    /// comma-separated: fallback models tried in order within a turn (in the file, a string or
    /// an array of strings; an array is kept here joined with commas).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "model_list"
    )]
    pub model: Option<String>,
    /// The run's input (`†input.*`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
    /// JSON Schema of the input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_schema: Option<Value>,
    /// JSON Schema the final output must satisfy.
    pub output_schema: Value,
    /// Initial state (`†state.*`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<Value>,
    /// JSON Schema of the state, shown to the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_schema: Option<Value>,
    /// Tools the model may call.
    #[serde(default)]
    pub tools: Vec<Tool>,
    /// Extra context messages.
    #[serde(default)]
    pub context: Vec<Message>,
    /// Calls to run before the first Request.
    #[serde(default)]
    pub plan: Vec<Call>,
    /// Run limits.
    #[serde(default)]
    pub limits: Limits,
    /// How the model returns its Solution: `structured` (constrained JSON text, the default) or
    /// `tools` (native tool calls). `dagloop run --mode` overrides it for the run's own agent;
    /// a delegate goal's `mode` is its nested agent's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<crate::llm::Mode>,
    /// MCP servers whose tools join `tools` (see `tools::mcp`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mcp_servers: Vec<crate::protocol::McpServerConfig>,
    /// Approval policy; absent means run everything. Read once, here: the builder, the run's
    /// options and the command line take it typed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<crate::approval::Policy>,
    /// Environment variables the goal may read (`${VAR}` in an http tool's `url` and headers).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Workspace memory: a folder of notes whose passages most relevant to the goal join its
    /// context (`context::memory`, `runs::memory`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<crate::context::memory::MemorySource>,
    /// The folder the goal was read from (relative paths resolve against it).
    #[serde(skip)]
    pub base_dir: PathBuf,
}

/// A goal that cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GoalError {
    /// The file could not be read.
    #[error("cannot read goal file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not a valid goal document.
    #[error("goal file {path} is invalid: {reason}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong (with line and column for JSON syntax errors).
        reason: String,
    },
    /// A schema inside the goal is not a valid JSON Schema.
    #[error("goal file {path}: `{field}` is not a valid JSON Schema: {reason}")]
    BadSchema {
        /// The file.
        path: PathBuf,
        /// Which schema (`output_schema`, `tools[2]`...).
        field: String,
        /// The validator's explanation.
        reason: String,
    },
    /// A `_`-prefixed key dagloop does not define, on the goal, a tool or a plan call.
    #[error("goal file {path}: {at}: {unknown}")]
    UnknownMetaKey {
        /// The file.
        path: PathBuf,
        /// Where (`tools[0] (Refund)`, `plan[2]`, `the goal`).
        at: String,
        /// The key's JSON pointer in the document (`/tools/0/_aproval`).
        pointer: String,
        /// The key, and the closest defined one.
        unknown: crate::protocol::UnknownMetaKey,
    },
    /// The approval policy's rules cannot be used (a bad rule, an example that does not come
    /// out as written): the approval module's code (`approval.rule_example`...).
    #[error("goal file {path}: {source}")]
    Approval {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        source: crate::approval::ApprovalError,
    },
    /// Two tools in one goal file share a name.
    #[error(
        "goal file {path}: tool `{name}` is defined twice (tools[{first}] and tools[{second}])"
    )]
    ToolClash {
        /// The file.
        path: PathBuf,
        /// The repeated name.
        name: String,
        /// Index of the first definition.
        first: usize,
        /// Index of the second definition.
        second: usize,
    },
}

crate::codes::has_code!(GoalError);

impl GoalError {
    /// A stable code for programs that react to failures.
    pub fn code(&self) -> &'static str {
        match self {
            GoalError::Read { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                "goal.not_found"
            }
            GoalError::Read { .. } => "goal.unreadable",
            GoalError::Invalid { .. } => "goal.invalid",
            GoalError::BadSchema { .. } => "goal.invalid_schema",
            GoalError::ToolClash { .. } => "goal.tool_clash",
            GoalError::UnknownMetaKey { .. } => "goal.unknown_meta_key",
            GoalError::Approval { source, .. } => source.code(),
        }
    }
}

impl Goal {
    /// Reads and checks a goal file (JSON).
    pub fn load(path: &FsPath) -> Result<Goal, GoalError> {
        let text = std::fs::read_to_string(path).map_err(|source| GoalError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let base = path.parent().map(FsPath::to_path_buf).unwrap_or_default();
        Goal::from_json(&text, path, base)
    }

    /// Reads a goal file whose tools will not run (every call answered from a recording:
    /// `--tools-from`): checked like [`Goal::load`], except that its `${VAR}` placeholders need
    /// not be set.
    pub fn load_offline(path: &FsPath) -> Result<Goal, GoalError> {
        let text = std::fs::read_to_string(path).map_err(|source| GoalError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let base = path.parent().map(FsPath::to_path_buf).unwrap_or_default();
        Goal::parse(&text, path, base)
    }

    /// Refuses a goal document holding a meta key dagloop does not define (on the goal, a tool,
    /// a tool's `properties` or a plan call), naming where, with the closest known key
    /// (`goal.unknown_meta_key`). [`Goal::from_json`] checks this first; a front-end that checks
    /// the published schema before loading (the server) calls it before, so the suggestion is
    /// what the user sees.
    pub fn check_meta_keys(doc: &Value, origin: &FsPath) -> Result<(), GoalError> {
        match find_unknown_meta_key(doc) {
            None => Ok(()),
            Some((at, pointer, unknown)) => Err(GoalError::UnknownMetaKey {
                path: origin.to_path_buf(),
                at,
                pointer,
                unknown,
            }),
        }
    }

    /// Parses and checks goal JSON; `origin` names it in errors, `base_dir` anchors relative paths.
    /// Every `${VAR}` placeholder must be set in this process's environment ([`Goal::check_env`]):
    /// this is the goal of a run about to be driven.
    pub fn from_json(text: &str, origin: &FsPath, base_dir: PathBuf) -> Result<Goal, GoalError> {
        let goal = Goal::parse(text, origin, base_dir)?;
        goal.check_env().map_err(|reason| GoalError::Invalid {
            path: origin.to_path_buf(),
            reason,
        })?;
        Ok(goal)
    }

    /// The goal of a stored run, read back from its record: checked like [`Goal::from_json`]
    /// except that `${VAR}` placeholders are kept by name and need not be set here (a reader of a
    /// stored run never needs their values; the process that drives the run checks them again).
    pub fn from_record(doc: &Value, origin: &FsPath, base_dir: PathBuf) -> Result<Goal, GoalError> {
        Goal::parse(&doc.to_string(), origin, base_dir)
    }

    fn parse(text: &str, origin: &FsPath, base_dir: PathBuf) -> Result<Goal, GoalError> {
        let invalid = |reason: String| GoalError::Invalid {
            path: origin.to_path_buf(),
            reason: format!("{reason}{}", suggest_field(&reason)),
        };
        let value: Value = serde_json::from_str(text).map_err(|e| invalid(e.to_string()))?;
        Goal::check_meta_keys(&value, origin)?;
        if let Some(tools) = value.get("tools").and_then(Value::as_array) {
            for (i, t) in tools.iter().enumerate() {
                Tool::from_value(t.clone()).map_err(|e| invalid(format!("tools[{i}]: {e}")))?;
            }
        }
        if let Some(a) = value.get("approval") {
            check_policy(a).map_err(invalid)?;
            if let Err(
                source @ (crate::approval::ApprovalError::BadRule { .. }
                | crate::approval::ApprovalError::RuleExample { .. }),
            ) = crate::approval::Policy::from_value(a)
            {
                return Err(GoalError::Approval {
                    path: origin.to_path_buf(),
                    source,
                });
            }
            if let Err(e) = serde_json::from_value::<crate::approval::Policy>(a.clone()) {
                // The published schema's message names the pointer (`at /approval/policy`).
                check_published(&value).map_err(invalid)?;
                return Err(invalid(format!("approval: {e}")));
            }
        }
        if let Some(servers) = value.get("mcp_servers").and_then(Value::as_array) {
            let mut names = BTreeSet::new();
            for (i, s) in servers.iter().enumerate() {
                let c = crate::protocol::McpServerConfig::from_value(s.clone())
                    .map_err(|e| invalid(format!("mcp_servers[{i}]: {e}")))?;
                if !names.insert(c.name().to_string()) {
                    return Err(invalid(format!(
                        "mcp_servers[{i}]: two MCP servers are named `{}`",
                        c.name()
                    )));
                }
            }
        }
        let mut goal: Goal =
            serde_json::from_value(value.clone()).map_err(|e| invalid(e.to_string()))?;
        goal.base_dir = base_dir;
        goal.check(origin)?;
        // Last, so the specific errors above (with their own codes) come first.
        check_published(&value).map_err(invalid)?;
        Ok(goal)
    }

    fn check(&self, origin: &FsPath) -> Result<(), GoalError> {
        self.check_durations().map_err(|e| GoalError::Invalid {
            path: origin.to_path_buf(),
            reason: e.to_string(),
        })?;
        self.check_env_listed()
            .map_err(|reason| GoalError::Invalid {
                path: origin.to_path_buf(),
                reason,
            })?;
        let bad = |field: String, reason: String| GoalError::BadSchema {
            path: origin.to_path_buf(),
            field,
            reason,
        };
        let mut schemas = vec![("output_schema".to_string(), &self.output_schema)];
        if let Some(s) = &self.input_schema {
            schemas.push(("input_schema".into(), s));
        }
        if let Some(s) = &self.state_schema {
            schemas.push(("state_schema".into(), s));
        }
        for (field, schema) in schemas {
            OutputValidator::new(schema).map_err(|e| bad(field, schema_reason(&e)))?;
        }
        let mut seen: Vec<(&str, usize)> = Vec::new();
        let mut names = BTreeSet::new();
        for (i, t) in self.tools.iter().enumerate() {
            if !names.insert(t.name.as_str()) {
                let first = seen
                    .iter()
                    .find(|(n, _)| *n == t.name)
                    .map_or(0, |(_, j)| *j);
                return Err(GoalError::ToolClash {
                    path: origin.to_path_buf(),
                    name: t.name.clone(),
                    first,
                    second: i,
                });
            }
            seen.push((&t.name, i));
            let params = Value::Object(t.schema.clone());
            OutputValidator::new(&params)
                .map_err(|e| bad(format!("tools[{i}] ({})", t.name), schema_reason(&e)))?;
        }
        if let (Some(schema), Some(input)) = (&self.input_schema, &self.input)
            && let Ok(v) = OutputValidator::new(schema)
        {
            let errors: Vec<String> = v.validate(input).iter().map(|e| e.to_string()).collect();
            if !errors.is_empty() {
                return Err(GoalError::Invalid {
                    path: origin.to_path_buf(),
                    reason: format!("input does not match input_schema: {}", errors.join("; ")),
                });
            }
        }
        Ok(())
    }

    /// Checks every number of seconds in the goal's limits with [`crate::duration::seconds`], so
    /// no later conversion can panic (the approval timeout is checked when the goal is read:
    /// [`crate::approval::Policy`] holds it as a duration).
    pub fn check_durations(&self) -> Result<(), crate::duration::DurationError> {
        use crate::duration::seconds;
        if let Some(s) = self.limits.timeout_s {
            seconds("limits.timeout_s", s)?;
        }
        if let Some(s) = self.limits.call_timeout_s {
            seconds("limits.call_timeout_s", s)?;
        }
        Ok(())
    }

    /// Checks every `${VAR}` placeholder in the tools' `_http` (`url` and header values): VAR
    /// must be listed in `env` and set in the environment. The message names the tool and field,
    /// never a value.
    pub fn check_env(&self) -> Result<(), String> {
        self.check_placeholders(true)
    }

    /// Checks every `${VAR}` placeholder names a variable listed in the goal's `env` (what a
    /// stored goal is held to: whether it is set is the driving process's to check).
    pub fn check_env_listed(&self) -> Result<(), String> {
        self.check_placeholders(false)
    }

    fn check_placeholders(&self, set: bool) -> Result<(), String> {
        for (i, t) in self.tools.iter().enumerate() {
            let Some(http) = t.schema.get("_http") else {
                continue;
            };
            let mut fields: Vec<(String, &str)> = Vec::new();
            if let Some(u) = http.get("url").and_then(Value::as_str) {
                fields.push(("url".into(), u));
            }
            if let Some(h) = http.get("headers").and_then(Value::as_object) {
                for (k, v) in h {
                    if let Some(v) = v.as_str() {
                        fields.push((format!("headers.{k}"), v));
                    }
                }
            }
            for (field, text) in fields {
                for var in crate::protocol::env_placeholders(text) {
                    let at = format!("tools[{i}] ({})._http.{field}", t.name);
                    if !self.env.iter().any(|e| e == var) {
                        return Err(format!(
                            "{at} uses `${{{var}}}` but `{var}` is not listed in the goal's `env` (add \"env\": [\"{var}\"])"
                        ));
                    }
                    if set && std::env::var_os(var).is_none() {
                        return Err(format!(
                            "{at} uses `${{{var}}}` but the environment variable `{var}` is not set"
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// The run's wall-clock limit, checked (`None`: no limit).
    pub fn run_timeout(
        &self,
    ) -> Result<Option<std::time::Duration>, crate::duration::DurationError> {
        self.limits
            .timeout_s
            .map(|s| crate::duration::seconds("limits.timeout_s", s))
            .transpose()
    }

    /// The per-call time limit, checked (`None`: no limit).
    pub fn call_timeout(
        &self,
    ) -> Result<Option<std::time::Duration>, crate::duration::DurationError> {
        self.limits
            .call_timeout_s
            .map(|s| crate::duration::seconds("limits.call_timeout_s", s))
            .transpose()
    }

    /// The goal file a delegate tool of this goal names (`_delegate`, relative to the goal's
    /// folder); None for an `anonymous` delegate and for a tool that is not one (or whose
    /// `_delegate` is not a string: the tool check refuses that). Delegate goal files are read
    /// only by their loaders (the builder, the grants, `validate`) through this and
    /// [`Goal::load`]; the activity kinds never read goal files.
    pub fn delegate_file(&self, tool: &Tool) -> Option<PathBuf> {
        if crate::protocol::kind_of(tool) != Some("delegate") {
            return None;
        }
        match tool.schema.get("_delegate").and_then(Value::as_str) {
            Some("anonymous") | None => None,
            Some(target) => Some(self.resolve_path(target)),
        }
    }

    /// Resolves a path written in the goal file against the goal's folder.
    pub fn resolve_path(&self, p: &str) -> PathBuf {
        let path = FsPath::new(p);
        if path.is_absolute() {
            path.to_path_buf()
        } else {
            self.base_dir.join(path)
        }
    }
}

/// A goal's `model`: one spec, or an array of specs joined with commas (an entry holding a comma
/// or nothing would be read back as several, or none, so it is refused).
fn model_list<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    let v = match Option::<OneOrMany>::deserialize(d) {
        Ok(v) => v,
        Err(_) => {
            return Err(serde::de::Error::custom(
                "`model` must be a model spec or an array of model specs",
            ));
        }
    };
    match v {
        None => Ok(None),
        Some(OneOrMany::One(s)) => Ok(Some(s)),
        Some(OneOrMany::Many(list)) => {
            if list.is_empty() {
                return Err(serde::de::Error::custom(
                    "`model` lists no model (give at least one spec)",
                ));
            }
            if let Some(bad) = list.iter().find(|s| s.contains(',') || s.trim().is_empty()) {
                return Err(serde::de::Error::custom(format!(
                    "`model` entry `{bad}` is empty or holds a comma (each entry is one spec)"
                )));
            }
            Ok(Some(list.join(",")))
        }
    }
}

impl Goal {
    /// What the goal says of its agent, for [`crate::machine::AgentConfig::new`].
    pub fn agent_spec(&self) -> crate::machine::AgentSpec<'_> {
        crate::machine::AgentSpec {
            goal: &self.goal,
            input: self.input.as_ref(),
            input_schema: self.input_schema.as_ref(),
            state: self.state.as_ref(),
            state_schema: self.state_schema.as_ref(),
            context: &self.context,
            plan: &self.plan,
            tools: &self.tools,
            limits: &self.limits,
            output_schema: &self.output_schema,
            model: self.model.as_deref(),
            mode: self.mode,
        }
    }

    /// The configuration of the goal's agent; `delegates` are the nested agents of its delegate
    /// tools, already built.
    pub fn agent_config(
        &self,
        delegates: std::collections::BTreeMap<String, std::sync::Arc<crate::machine::AgentConfig>>,
    ) -> Result<crate::machine::AgentConfig, crate::machine::ConfigError> {
        crate::machine::AgentConfig::new(self.agent_spec(), delegates)
    }
}

/// A delegate goal as a run recorded it when it was defined: the document and the folder its
/// relative paths start from. A stored run's agent tree is rebuilt from these, never from the
/// files they came from (which may have moved or changed since).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedGoal {
    /// The goal document, as [`Goal`] serialises it.
    pub goal: Value,
    /// The folder its relative paths start from (absolute).
    pub base_dir: String,
}

impl RecordedGoal {
    /// Records `goal` (its folder made absolute against the current directory).
    pub fn of(goal: &Goal) -> RecordedGoal {
        let dir = if goal.base_dir.as_os_str().is_empty() {
            FsPath::new(".")
        } else {
            goal.base_dir.as_path()
        };
        let base = std::fs::canonicalize(dir)
            .or_else(|_| std::path::absolute(dir))
            .unwrap_or_else(|_| dir.to_path_buf());
        RecordedGoal {
            goal: serde_json::to_value(goal).unwrap_or(Value::Null),
            base_dir: base.display().to_string(),
        }
    }

    /// The goal again (placeholders by name: [`Goal::from_record`]).
    pub fn load(&self, origin: &FsPath) -> Result<Goal, GoalError> {
        Goal::from_record(&self.goal, origin, PathBuf::from(&self.base_dir))
    }
}

/// Where the delegate goals of an agent tree come from, each named by the JSON pointer of the
/// `_delegate` that names it (`/tools/0/_delegate`, nested `/tools/0/_delegate/tools/1/_delegate`).
#[derive(Debug, Clone, Copy)]
pub enum DelegateGoals<'a> {
    /// Their files (a run being defined).
    Files,
    /// A run's record; a pointer it lacks (a run recorded by an older dagloop) is read from its
    /// file.
    Recorded(&'a std::collections::BTreeMap<String, RecordedGoal>),
}

impl DelegateGoals<'_> {
    /// The delegate goal named at `pointer`, whose file is `path`.
    pub fn load(&self, pointer: &str, path: &FsPath) -> Result<Goal, GoalError> {
        match self {
            DelegateGoals::Recorded(map) => match map.get(pointer) {
                Some(r) => r.load(path),
                None => Goal::load(path),
            },
            DelegateGoals::Files => Goal::load(path),
        }
    }
}
