//! Context assembly for each Request of the outer loop (protocol chapters 001, 010, 012), and
//! the outer loop's bookkeeping (doom loops, empty turns).
//!
//! Pure functions over the goal, the state and the previous step's report: no IO, no clock.
//! What a model provider does with these messages (how it renders them) is the provider's job.

pub mod compact;
pub mod correction;
pub mod fit;
pub mod memory;
pub mod sanitize;
mod signature;

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::protocol::{Call, CallId, Message, PlanItem, Role, Tool};
pub use sanitize::{SanitizeLimits, sanitize, sanitize_owned};

/// What became of one call of the previous step, as the next Request shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanEntry {
    /// The call's id.
    pub id: CallId,
    /// The call as the model wrote it (or as a reviewer revised it); None when it could not be
    /// read (shown as `null`).
    pub call: Option<Arc<Call>>,
    /// done, failed, rejected, unresolved, cancelled or refused.
    pub status: std::borrow::Cow<'static, str>,
    /// The result (calls without an output path show it here; others wrote it to state).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// The error, for anything but done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Value>,
    /// References that nothing wrote (unresolved calls).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missing: Vec<String>,
}

/// Everything the next Request needs to know.
#[derive(Debug, Clone, Default)]
pub struct ContextInput<'a> {
    /// The goal text.
    pub goal: &'a str,
    /// Tools offered to the model.
    pub tools: &'a [Tool],
    /// Extra messages from the goal file.
    pub extra: &'a [Message],
    /// The run's input, if any, with its schema.
    pub input: Option<(&'a Value, Option<&'a Value>)>,
    /// The merged current state and its schema (the state is sanitised in place).
    pub state: Option<(Value, Option<&'a Value>)>,
    /// The previous step's calls and what became of them (moved into the plan message, not
    /// copied).
    pub plan: Vec<PlanEntry>,
    /// Validation errors of the previous output, if it was invalid.
    pub output_errors: &'a [String],
    /// What the model is told about its previous response itself (it was not a Solution:
    /// [`correction::render`]), one message each, as written.
    pub model_errors: &'a [String],
    /// What is shown of results.
    pub limits: SanitizeLimits,
}

/// The instructions that explain the protocol to the model.
pub fn system_prompt(tools: &[Tool]) -> String {
    let mut s = String::from(
        "You are an agent that works by calling tools. Answer every turn with one JSON object:\n\
         {\"calls\": [...], \"output\": null | <final output>}.\n\
         - Each call is {\"_tool\": \"<name>\", <params>..., \"_outputPath\": \"†state.<path>\"}.\n\
         - A param may be a reference instead of a value: \"†input.x\", \"†state.users[0].id\". \
         It is replaced by the referenced value when the call runs, so you never copy data.\n\
         - Calls that read what another call writes wait for it; all other calls run at once, in parallel.\n\
         - \"_outputPath\": \"†state.a || †state.b\" writes success to the first path and a failure to the last; \
         \"†state.a && †state.b\" writes the result to both. Without _outputPath the result is shown to you next turn.\n\
         - \"_outputMethod\" may be set (default), merge, assign, push or concat.\n\
         - Keep \"output\" null while work remains. When done, put the final answer in \"output\"; \
         it must match the output schema. Calls in the same turn run before the output is accepted.\n\
         - A call that was rejected by a reviewer must not be retried.\n",
    );
    if !tools.is_empty() {
        s.push_str("\nTools:\n");
        for t in tools {
            let desc = t
                .schema
                .get("description")
                .and_then(Value::as_str)
                .unwrap_or("");
            let latent = if t.is_latent() {
                " (you fill in `_output` yourself)"
            } else {
                ""
            };
            s.push_str(&format!("- {}: {desc}{latent}\n", t.name));
        }
    }
    s
}

/// Builds the messages of one Request.
pub fn assemble(input: ContextInput<'_>) -> Vec<Message> {
    let mut out = vec![
        text(Role::System, system_prompt(input.tools)),
        text(Role::User, input.goal.to_string()),
    ];
    out.extend(input.extra.iter().cloned());
    if let Some((data, schema)) = input.input {
        out.push(Message::Input {
            data: data.clone(),
            schema: schema.cloned(),
            extra: Map::new(),
        });
    }
    if let Some((data, schema)) = input.state {
        out.push(Message::State {
            data: sanitize_owned(data, &input.limits),
            schema: schema.cloned(),
            extra: Map::new(),
        });
    }
    if !input.plan.is_empty() {
        // The error messages first: they copy the (few) calls that did not succeed, and the
        // plan message then takes every call as it is.
        let mut errors = Vec::new();
        for e in input.plan.iter().filter(|e| e.status != "done") {
            // The call's own error object (`protocol::error_object`: code, message, details).
            let error = match (&e.error, e.missing.is_empty()) {
                (Some(err), _) => err.clone(),
                (None, false) => crate::protocol::error_object(
                    "scheduler.unresolved",
                    "unresolved: nothing wrote these references",
                    Some(json!({"missing": e.missing})),
                ),
                (None, true) => json!(e.status),
            };
            errors.push(Message::Error {
                call: e.call.as_deref().map_or(Value::Null, Call::to_value),
                error: sanitize(&error, &input.limits),
                extra: Map::new(),
            });
        }
        let plan = input
            .plan
            .into_iter()
            .map(|e| match e.call {
                Some(call) => {
                    let result = e.result.map(|r| sanitize_owned(r, &input.limits));
                    PlanItem::new(call, e.status, result)
                }
                None => PlanItem::Json(Value::Null),
            })
            .collect();
        out.push(Message::Plan {
            plan,
            extra: Map::new(),
        });
        out.extend(errors);
    }
    for err in input.model_errors {
        out.push(text(Role::User, err.clone()));
    }
    if !input.output_errors.is_empty() {
        out.push(text(
            Role::User,
            format!(
                "Your output did not match the output schema; fix it:\n- {}",
                input.output_errors.join("\n- ")
            ),
        ));
    }
    out
}

fn text(role: Role, text: String) -> Message {
    Message::Text {
        role,
        text,
        extra: Map::new(),
    }
}

/// Tracks the outer loop's stop conditions that depend on history (rule 16).
#[derive(Debug, Clone, Default)]
pub struct TurnTracker {
    /// The last step that made calls: its calls, and their signature once it was needed.
    last: Option<LastStep>,
    repeats: u32,
    empty: u32,
}

#[derive(Debug, Clone)]
struct LastStep {
    calls: Vec<Arc<Call>>,
    signature: Option<Vec<u64>>,
}

/// Why the tracker says to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Stop {
    /// The same calls were made in too many consecutive steps.
    DoomLoop,
    /// Too many consecutive steps with no calls and no output.
    EmptyTurns,
}

impl TurnTracker {
    /// Records one step's calls (as written) and whether it had an output; says whether to stop.
    /// Two steps can only be alike when they made as many calls: only then are their
    /// signatures worked out (a fan-out step followed by an answer hashes nothing).
    pub fn record(
        &mut self,
        calls: &[Arc<Call>],
        has_output: bool,
        doom_after: u32,
        empty_after: u32,
    ) -> Option<Stop> {
        if calls.is_empty() && !has_output {
            self.empty += 1;
            self.last = None;
            self.repeats = 0;
            return (self.empty >= empty_after).then_some(Stop::EmptyTurns);
        }
        self.empty = 0;
        if calls.is_empty() {
            return None;
        }
        let mut mine = None;
        let same = match &mut self.last {
            Some(last) if last.calls.len() == calls.len() => {
                let theirs = last
                    .signature
                    .get_or_insert_with(|| signature::of_step(&last.calls));
                let sig = signature::of_step(calls);
                let same = *theirs == sig;
                mine = Some(sig);
                same
            }
            _ => false,
        };
        if same {
            self.repeats += 1;
        } else {
            self.last = Some(LastStep {
                calls: calls.to_vec(),
                signature: mine,
            });
            self.repeats = 1;
        }
        (doom_after > 0 && self.repeats >= doom_after).then_some(Stop::DoomLoop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doom_loop_needs_consecutive_identical_steps() {
        let mut t = TurnTracker::default();
        let call = |v: Value| Call::try_from(v).expect("call");
        let (a, a_reordered, b) = (
            call(json!({"_tool": "x", "q": 1})),
            call(json!({"q": 1, "_tool": "x"})),
            call(json!({"_tool": "x", "q": 2})),
        );
        let (a, a_reordered, b) = ([a.into()], [a_reordered.into()], [b.into()]);
        assert_eq!(t.record(&a, false, 3, 2), None);
        assert_eq!(t.record(&b, false, 3, 2), None);
        assert_eq!(t.record(&a, false, 3, 2), None);
        assert_eq!(t.record(&a_reordered, false, 3, 2), None);
        assert_eq!(t.record(&a, false, 3, 2), Some(Stop::DoomLoop));
    }

    /// Steps are hashed only when they made as many calls as the step before: a step of another
    /// size never matches, and one of the same size is compared with the step before it even
    /// when that step was not hashed when it was recorded.
    #[test]
    fn steps_of_another_size_never_match_and_same_sized_ones_are_compared() {
        let mut t = TurnTracker::default();
        let call = |v: Value| -> Arc<Call> { Arc::new(Call::try_from(v).expect("call")) };
        let (a, b) = (call(json!({"_tool": "x", "q": 1})), call(json!({"_tool": "x", "q": 2})));
        let one = [a.clone()];
        let two = [a.clone(), b.clone()];
        let two_reordered = [b.clone(), a.clone()];
        let other_two = [b.clone(), b.clone()];
        assert_eq!(t.record(&one, false, 2, 9), None);
        assert_eq!(t.record(&two, false, 2, 9), None, "another size is another step");
        assert_eq!(t.record(&other_two, false, 2, 9), None, "same size, other calls");
        assert_eq!(t.record(&two, false, 2, 9), None);
        assert_eq!(
            t.record(&two_reordered, false, 2, 9),
            Some(Stop::DoomLoop),
            "the same calls twice running, whatever their order"
        );
    }

    #[test]
    fn empty_turns_must_be_consecutive() {
        let mut t = TurnTracker::default();
        assert_eq!(t.record(&[], false, 3, 2), None);
        let x = Call::try_from(json!({"_tool": "x"})).expect("call");
        assert_eq!(t.record(&[x.into()], false, 3, 2), None);
        assert_eq!(t.record(&[], false, 3, 2), None);
        assert_eq!(t.record(&[], false, 3, 2), Some(Stop::EmptyTurns));
    }
}
