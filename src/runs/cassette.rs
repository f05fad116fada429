//! Cassettes: a stored run turned into an offline test (`dagloop export RUN --cassette DIR`,
//! `dagloop run GOAL --model scripted:DIR/model.json --tools-from DIR/tools.json`).
//!
//! [`export`] replays the run's journal through a fresh machine and writes down what came from
//! outside: the run's own agent's model turns, as a scripted-model file
//! (schemas/scripted-model.schema.json, with the reviewers' decisions), and every tool result,
//! keyed by the tool and its resolved params (what the machine launched, references resolved,
//! keys sorted, `_` meta fields left out). [`CassetteExecutor`] answers a run's calls from such
//! a recording: the same key gives the recorded outcome (a key recorded several times gives its
//! outcomes in order, then the last again); a key the recording does not hold fails the call
//! with `cassette.miss` naming the tool and params (the model sees it, rule 12), or runs the
//! call for real with passthrough.
//!
//! Deliberately not here: nested agents' model turns (a delegate's goal names its own model),
//! and reading or writing files (the command line does).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use futures::FutureExt;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::RunsError;
use crate::engine::Executor;
use crate::machine::{Action, JournalEntry, RunInput};
use crate::protocol::{Call, CallId, Tool};
use crate::scheduler::{Outcome, OutcomeKind};
use crate::tools::ProgressSink;

/// A tools recording that cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum CassetteError {
    /// The file is not a tools recording.
    #[error("{path} is not a tools recording: {reason}")]
    Invalid {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
}

crate::codes::has_code!(CassetteError);

impl CassetteError {
    /// A stable code.
    pub fn code(&self) -> &'static str {
        match self {
            CassetteError::Invalid { .. } => "cassette.invalid",
        }
    }
}

/// One recorded tool call: `DIR/tools.json` holds `{"calls": [Recorded...]}`.
///
/// In the file a call is `{"tool", "params", "result": VALUE}` when it succeeded, or
/// `{"tool", "params", "error": {"code", "message", ...}}` when it failed, with `"kind":
/// "timeout" | "panic" | "cancelled"` for a failure that was not the tool's own error and
/// `"branch": N` when the activity chose the alternative of a `†a || †b` output path
/// (docs/goal-files.md#cassettes). The form older dagloop wrote, `"outcome": {"result": {"Ok":
/// VALUE}, "kind": "ok"}`, still loads.
#[derive(Debug, Clone, PartialEq)]
pub struct Recorded {
    /// The tool.
    pub tool: String,
    /// Its resolved params, keys sorted (meta fields left out).
    pub params: Value,
    /// How it ended.
    pub outcome: Outcome,
}

impl Serialize for Recorded {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = Map::new();
        m.insert("tool".into(), Value::String(self.tool.clone()));
        m.insert("params".into(), self.params.clone());
        match &self.outcome.result {
            Ok(v) => m.insert("result".into(), (**v).clone()),
            Err(e) => m.insert("error".into(), (**e).clone()),
        };
        let plain = match self.outcome.result {
            Ok(_) => OutcomeKind::Ok,
            Err(_) => OutcomeKind::Error,
        };
        if self.outcome.kind != plain {
            m.insert(
                "kind".into(),
                serde_json::to_value(self.outcome.kind).unwrap_or(Value::Null),
            );
        }
        if let Some(b) = self.outcome.branch {
            m.insert("branch".into(), json!(b));
        }
        Value::Object(m).serialize(s)
    }
}

impl<'de> Deserialize<'de> for Recorded {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let mut m = Map::<String, Value>::deserialize(d)?;
        let tool = match m.remove("tool") {
            Some(Value::String(t)) => t,
            _ => return Err(D::Error::custom("a recorded call needs a `tool` (a string)")),
        };
        let params = m.remove("params").unwrap_or_else(|| json!({}));
        let kind = |m: &mut Map<String, Value>, default| match m.remove("kind") {
            None => Ok(default),
            Some(k) => serde_json::from_value::<OutcomeKind>(k).map_err(D::Error::custom),
        };
        let branch = match m.remove("branch") {
            None | Some(Value::Null) => None,
            Some(b) => Some(serde_json::from_value::<usize>(b).map_err(D::Error::custom)?),
        };
        let outcome = match (m.remove("result"), m.remove("error"), m.remove("outcome")) {
            (Some(v), None, None) => Outcome {
                result: Ok(Arc::new(v)),
                branch,
                kind: kind(&mut m, OutcomeKind::Ok)?,
            },
            (None, Some(e), None) => Outcome {
                result: Err(Arc::new(e)),
                branch,
                kind: kind(&mut m, OutcomeKind::Error)?,
            },
            // The form written before: the scheduler's own serialisation.
            (None, None, Some(o)) => serde_json::from_value(o).map_err(D::Error::custom)?,
            _ => {
                return Err(D::Error::custom(format!(
                    "the recorded call of `{tool}` needs exactly one of `result` (it succeeded) and `error` (it failed)"
                )));
            }
        };
        if let Some(k) = m.keys().next() {
            return Err(D::Error::custom(format!(
                "unknown field `{k}` in the recorded call of `{tool}` (expected tool, params, result or error, kind, branch)"
            )));
        }
        Ok(Recorded {
            tool,
            params,
            outcome,
        })
    }
}

#[derive(Serialize, Deserialize)]
struct ToolsFile {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    description: Option<String>,
    calls: Vec<Recorded>,
}

/// `v` with every object's keys sorted (the canonical form recordings are keyed by).
pub fn canonical(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            Value::Object(
                keys.into_iter()
                    .filter_map(|k| Some((k.clone(), canonical(m.get(k)?))))
                    .collect(),
            )
        }
        Value::Array(a) => Value::Array(a.iter().map(canonical).collect()),
        other => other.clone(),
    }
}

/// A call's params as recordings key them: canonical, `_` meta fields left out.
pub fn params_key(params: &Map<String, Value>) -> Value {
    let kept: Map<String, Value> = crate::protocol::without_meta(params);
    canonical(&Value::Object(kept))
}

/// The model turn of the run's own agent being read from the journal.
#[derive(Default)]
struct TurnAcc {
    /// Each streamed element: a call as written, or the raw text of an unreadable one.
    elements: Vec<Result<Value, String>>,
    output: Value,
    /// The tokens the provider reported for the turn (not estimates), replayed as written.
    usage: Option<(u64, u64)>,
}

impl TurnAcc {
    fn into_turn(self) -> Value {
        let mut turn = self.body();
        if let Some((input, output)) = self.usage {
            turn["usage"] = json!({"input_tokens": input, "output_tokens": output});
        }
        turn
    }

    fn body(&self) -> Value {
        if self.elements.iter().all(Result::is_ok) {
            let calls: Vec<&Value> = self
                .elements
                .iter()
                .filter_map(|e| e.as_ref().ok())
                .collect();
            json!({"solution": {"calls": calls, "output": self.output}})
        } else {
            // An element the run could not read is streamed again as it was written.
            let parts: Vec<String> = self
                .elements
                .iter()
                .map(|e| match e {
                    Ok(v) => v.to_string(),
                    Err(raw) => raw.clone(),
                })
                .collect();
            json!({"text": format!("{{\"calls\":[{}],\"output\":{}}}", parts.join(","), self.output)})
        }
    }
}

/// The files of a cassette: `model.json` and `tools.json`.
pub struct Exported {
    /// The scripted-model file (the run's own agent's turns, and the decisions taken).
    pub model: Value,
    /// The tools recording.
    pub tools: Value,
}

/// The cassette of the run `record` describes, from its journal.
pub fn export(
    record: &crate::store::RunRecord,
    journal: &[JournalEntry],
) -> Result<Exported, RunsError> {
    let (_, mut machine) = super::replay::fresh_machine(record)?;
    let mut turns = Vec::new();
    let mut turn = TurnAcc::default();
    let mut launched: BTreeMap<CallId, (String, Value)> = BTreeMap::new();
    let mut calls = Vec::new();
    let mut decisions = Vec::new();
    let mut actions = Vec::new();
    for e in journal {
        match &e.input {
            RunInput::Call {
                frame: None, call, ..
            } => turn
                .elements
                .push(Ok(serde_json::to_value(&**call).unwrap_or(Value::Null))),
            RunInput::Unreadable {
                frame: None, raw, ..
            } => turn.elements.push(Err(raw.clone())),
            RunInput::Output {
                frame: None,
                output,
            } => turn.output = output.clone(),
            RunInput::Usage {
                frame: None,
                input_tokens,
                output_tokens,
                estimated: false,
                ..
            } => turn.usage = Some((*input_tokens, *output_tokens)),
            RunInput::Retry {
                frame: None,
                status,
                error,
                ..
            } => turns.push(json!({"error": {"status": status.unwrap_or(503), "message": error}})),
            RunInput::StreamClosed {
                frame: None, error, ..
            } => {
                let acc = std::mem::take(&mut turn);
                turns.push(match error {
                    Some(err) => json!({"error": {"status": 500, "message": err.message}}),
                    None => acc.into_turn(),
                });
            }
            RunInput::Outcome { call, outcome } => {
                if let Some((tool, params)) = launched.get(call) {
                    calls.push(Recorded {
                        tool: tool.clone(),
                        params: params.clone(),
                        outcome: outcome.clone(),
                    });
                }
            }
            RunInput::Decided { call, decision, .. } => {
                if let Ok(mut d) = serde_json::to_value(decision)
                    && d["decision"] != "replace"
                {
                    d["call"] = json!(call.0);
                    decisions.push(d);
                }
            }
            _ => {}
        }
        machine.handle_into(e.input.clone(), e.at, &mut actions);
        for a in actions.drain(..) {
            if let Action::Launch { id, call, .. } = a {
                launched.insert(id, (call.tool.clone(), params_key(&call.params)));
            }
        }
    }
    let mut model = json!({
        "description": format!("Model turns of run {}, exported by `dagloop export --cassette`.", record.id),
        "turns": turns,
    });
    if !decisions.is_empty() {
        model["decisions"] = Value::Array(decisions);
    }
    let tools = serde_json::to_value(ToolsFile {
        description: Some(format!(
            "Tool results of run {}, keyed by tool and resolved params (`dagloop run --tools-from`).",
            record.id
        )),
        calls,
    })
    .unwrap_or(Value::Null);
    Ok(Exported { model, tools })
}

/// A tools recording, ready to answer calls.
pub struct Cassette {
    recorded: BTreeMap<(String, String), Vec<Outcome>>,
    used: Mutex<BTreeMap<(String, String), usize>>,
}

impl Cassette {
    /// Reads a recording from the text of `DIR/tools.json` (`path` names it in errors).
    pub fn parse(text: &str, path: &str) -> Result<Cassette, CassetteError> {
        let file: ToolsFile = serde_json::from_str(text).map_err(|e| CassetteError::Invalid {
            path: path.into(),
            reason: e.to_string(),
        })?;
        let mut recorded: BTreeMap<(String, String), Vec<Outcome>> = BTreeMap::new();
        for c in file.calls {
            let key = (c.tool, canonical(&c.params).to_string());
            recorded.entry(key).or_default().push(c.outcome);
        }
        Ok(Cassette {
            recorded,
            used: Mutex::new(BTreeMap::new()),
        })
    }

    /// The recorded outcome of a call of `tool` with `params` (the next one, when the same call
    /// was recorded more than once; the last one again after that).
    pub fn answer(&self, tool: &str, params: &Map<String, Value>) -> Option<Outcome> {
        let key = (tool.to_string(), params_key(params).to_string());
        let outcomes = self.recorded.get(&key)?;
        let mut used = match self.used.lock() {
            Ok(u) => u,
            Err(p) => p.into_inner(),
        };
        let n = used.entry(key).or_insert(0);
        let o = outcomes.get(*n).or_else(|| outcomes.last())?.clone();
        *n = n.saturating_add(1);
        Some(o)
    }
}

/// Answers calls from a [`Cassette`]; a call it does not hold fails with `cassette.miss`, or
/// runs through `passthrough` when there is one.
pub struct CassetteExecutor {
    cassette: Arc<Cassette>,
    passthrough: Option<Arc<dyn Executor>>,
}

impl CassetteExecutor {
    /// Answers from `cassette`; misses go to `passthrough` when given.
    pub fn new(cassette: Arc<Cassette>, passthrough: Option<Arc<dyn Executor>>) -> Self {
        CassetteExecutor {
            cassette,
            passthrough,
        }
    }
}

impl Executor for CassetteExecutor {
    fn execute(&self, id: CallId, tool: &Tool, call: Arc<Call>) -> BoxFuture<'static, Outcome> {
        self.execute_reporting(id, tool, call, ProgressSink::none())
    }

    fn execute_reporting(
        &self,
        id: CallId,
        tool: &Tool,
        call: Arc<Call>,
        progress: ProgressSink,
    ) -> BoxFuture<'static, Outcome> {
        self.execute_within(id, tool, call, progress, None)
    }

    fn execute_within(
        &self,
        id: CallId,
        tool: &Tool,
        call: Arc<Call>,
        progress: ProgressSink,
        budget: Option<crate::tools::ResultBudget>,
    ) -> BoxFuture<'static, Outcome> {
        if let Some(o) = self.cassette.answer(&call.tool, &call.params) {
            return async move { o }.boxed();
        }
        if let Some(p) = &self.passthrough {
            return p.execute_within(id, tool, call, progress, budget);
        }
        let params = params_key(&call.params);
        let err = json!({
            "code": "cassette.miss",
            "message": format!(
                "the cassette holds no result for `{}` with params {params}",
                call.tool
            ),
            "tool": call.tool,
            "params": params,
        });
        async move { Outcome::error(err) }.boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_ignores_key_order_and_meta_fields_and_gives_its_outcomes_in_order_then_the_last() {
        let text = r#"{"calls": [
            {"tool": "a", "params": {"b": 1, "a": {"z": 1, "y": 2}}, "result": {"v": 1}},
            {"tool": "a", "params": {"a": {"y": 2, "z": 1}, "b": 1}, "error": {"code": "x"}}
        ]}"#;
        let c = Cassette::parse(text, "tools.json").expect("a recording");
        let params = json!({"_outputPath": "†state.x", "a": {"z": 1, "y": 2}, "b": 1});
        let params = params.as_object().expect("object");
        let first = c.answer("a", params).expect("recorded");
        assert_eq!(first, Outcome::ok(json!({"v": 1})));
        let second = c.answer("a", params).expect("recorded");
        assert_eq!(second, Outcome::error(json!({"code": "x"})));
        assert_eq!(c.answer("a", params), Some(second));
        assert_eq!(c.answer("b", params), None);
        let mut other = params.clone();
        other.insert("b".into(), json!(2));
        assert_eq!(c.answer("a", &other), None);
    }

    #[test]
    fn the_file_form_is_result_or_error_and_the_old_form_still_loads() {
        let cases = [
            (Outcome::ok(json!(1)), json!({"tool": "t", "params": {}, "result": 1})),
            (Outcome::ok(Value::Null), json!({"tool": "t", "params": {}, "result": null})),
            (
                Outcome::error(json!({"code": "x"})),
                json!({"tool": "t", "params": {}, "error": {"code": "x"}}),
            ),
            (
                Outcome::timeout(std::time::Duration::from_millis(5)),
                json!({"tool": "t", "params": {}, "kind": "timeout",
                       "error": {"code": "scheduler.timeout",
                                 "message": "the call did not finish within 5 ms"}}),
            ),
        ];
        for (outcome, form) in cases {
            let r = Recorded {
                tool: "t".into(),
                params: json!({}),
                outcome,
            };
            let written = serde_json::to_value(&r).expect("json");
            assert_eq!(written, form, "{written}");
            let back: Recorded = serde_json::from_value(form).expect("reads back");
            assert_eq!(back, r);
        }
        let old: Recorded = serde_json::from_value(json!({"tool": "t", "params": {"a": 1},
            "outcome": {"result": {"Err": {"code": "x"}}, "kind": "error", "branch": 1}}))
        .expect("the old form loads");
        assert_eq!(old.outcome.result, Err(Arc::new(json!({"code": "x"}))));
        assert_eq!(old.outcome.branch, Some(1));
        for bad in [
            json!({"tool": "t", "params": {}}),
            json!({"tool": "t", "params": {}, "result": 1, "error": {}}),
            json!({"tool": "t", "params": {}, "result": 1, "reslt": 2}),
        ] {
            assert!(serde_json::from_value::<Recorded>(bad.clone()).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_recording_that_is_not_one_is_refused_with_its_code() {
        let e = Cassette::parse(r#"{"calls": 3}"#, "t.json")
            .err()
            .expect("refused");
        assert_eq!(e.code(), "cassette.invalid");
        assert!(e.to_string().contains("t.json"), "{e}");
    }
}
