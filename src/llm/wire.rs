//! Pieces shared by the providers: context messages as role + text, tools as native function
//! definitions (plus the `final_output` tool), the merging of streamed tool-call fragments, and
//! the mapping of a finished native tool call to a protocol Call.
//!
//! Nothing here does IO. The Solution text is not parsed here (that is the `plan` module).

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use super::{LlmError, StreamEvent};
use crate::protocol::{Call, Message, Role, Tool};

/// Name of the native tool through which the model returns the final output in tool-call mode.
/// Its arguments are `{"output": <value>}`.
pub const FINAL_OUTPUT_TOOL: &str = "final_output";

/// Name of the forced tool that carries the whole Solution in Anthropic structured-output mode.
pub const SOLUTION_TOOL: &str = "solution";

/// A context message as the chat APIs see it: plain text messages keep their role; every other
/// message is sent by the user as its protocol JSON.
pub(crate) fn role_and_text(m: &Message) -> (Role, String) {
    match m {
        Message::Text { role, text, .. } => (*role, text.clone()),
        other => (
            Role::User,
            serde_json::to_string(other).unwrap_or_else(|_| String::from("null")),
        ),
    }
}

/// The OpenAI / Anthropic role name.
pub(crate) fn role_name(r: Role) -> &'static str {
    match r {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
    }
}

/// A tool as a native function definition.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct FunctionDef {
    pub name: String,
    pub description: Option<String>,
    pub parameters: Value,
}

/// The function definitions for tool-call mode: one per tool, then `final_output`.
///
/// Parameters are the tool's schema without `description`, `title` and `_`-prefixed fields, plus
/// optional `_outputPath` and `_outputMethod` properties (and `_output` for latent tools that
/// declare an output schema), so a native call carries everything a Solution call would.
pub(crate) fn functions(tools: &[Tool], solution_schema: &Value) -> Vec<FunctionDef> {
    let mut out: Vec<FunctionDef> = tools.iter().map(function_of).collect();
    let output_schema = solution_schema
        .pointer("/properties/output")
        .cloned()
        .unwrap_or_else(|| json!({}));
    out.push(FunctionDef {
        name: FINAL_OUTPUT_TOOL.to_string(),
        description: Some("Return the final output when the goal is reached.".to_string()),
        parameters: json!({
            "type": "object",
            "properties": {"output": output_schema},
            "required": ["output"]
        }),
    });
    out
}

fn function_of(tool: &Tool) -> FunctionDef {
    let mut params: Map<String, Value> = tool
        .schema
        .iter()
        .filter(|(k, _)| !k.starts_with('_') && *k != "description" && *k != "title")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    params.insert("type".into(), json!("object"));
    let props = params
        .entry("properties")
        .or_insert_with(|| Value::Object(Map::new()));
    if let Value::Object(props) = props {
        props.insert(
            "_outputPath".into(),
            json!({"type": "string", "description": "Where to write the result, e.g. †state.x"}),
        );
        props.insert(
            "_outputMethod".into(),
            json!({"type": "string", "enum": ["set", "merge", "assign", "push", "concat"]}),
        );
        if let (true, Some(output)) = (tool.is_latent(), &tool.output) {
            props.insert("_output".into(), output.clone());
        }
    }
    FunctionDef {
        name: tool.name.clone(),
        description: tool
            .schema
            .get("description")
            .and_then(Value::as_str)
            .map(str::to_string),
        parameters: Value::Object(params),
    }
}

/// What a finished native tool call means for the run.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ToolCallOutcome {
    /// A call of a tool.
    Call(Call),
    /// The final output (the `final_output` tool).
    Output(Value),
}

/// Maps a finished native tool call (name + JSON arguments text) to a protocol Call, or to the
/// final output when the tool is [`FINAL_OUTPUT_TOOL`]. Empty arguments mean `{}`.
pub fn call_from_tool_call(name: &str, arguments: &str) -> Result<ToolCallOutcome, LlmError> {
    let bad = |reason: String| LlmError::BadToolCall {
        name: name.to_string(),
        reason,
    };
    let args: Value = if arguments.trim().is_empty() {
        Value::Object(Map::new())
    } else {
        serde_json::from_str(arguments)
            .map_err(|e| bad(format!("arguments are not valid JSON: {e}")))?
    };
    let Value::Object(mut args) = args else {
        return Err(bad("arguments must be a JSON object".into()));
    };
    if name == FINAL_OUTPUT_TOOL {
        return Ok(ToolCallOutcome::Output(
            args.remove("output").unwrap_or(Value::Null),
        ));
    }
    args.insert("_tool".into(), Value::String(name.to_string()));
    Call::try_from(Value::Object(args))
        .map(ToolCallOutcome::Call)
        .map_err(|e| bad(e.to_string()))
}

/// Tracks whether a JSON text has closed its top-level object or array, character by character.
#[derive(Debug, Default, Clone)]
struct JsonScan {
    depth: usize,
    in_string: bool,
    escape: bool,
    opened: bool,
    closed: bool,
}

impl JsonScan {
    fn feed(&mut self, text: &str) {
        for c in text.chars() {
            if self.closed {
                return;
            }
            if self.in_string {
                match (self.escape, c) {
                    (true, _) => self.escape = false,
                    (false, '\\') => self.escape = true,
                    (false, '"') => self.in_string = false,
                    _ => {}
                }
                continue;
            }
            match c {
                '"' => self.in_string = true,
                '{' | '[' => {
                    self.depth += 1;
                    self.opened = true;
                }
                '}' | ']' if self.depth > 0 => {
                    self.depth -= 1;
                    if self.depth == 0 {
                        self.closed = true;
                    }
                }
                _ => {}
            }
        }
    }
}

#[derive(Debug, Default)]
struct Partial {
    id: Option<String>,
    name: Option<String>,
    arguments: String,
    scan: JsonScan,
    done: bool,
}

/// Merges streamed tool-call fragments by index.
///
/// A call is done as soon as its arguments close their top-level JSON object (so a call can start
/// while later calls still stream, and fragments of parallel calls may interleave); calls whose
/// arguments never close are flushed, in index order, when the stream ends. A repeated `id` or
/// `name` is ignored.
#[derive(Debug, Default)]
pub(crate) struct ToolCallMerger {
    calls: BTreeMap<usize, Partial>,
}

impl ToolCallMerger {
    /// Adds one fragment, pushing a delta and, when the call just completed, its done event.
    pub(crate) fn fragment(
        &mut self,
        index: usize,
        id: Option<&str>,
        name: Option<&str>,
        arguments: &str,
        out: &mut Vec<StreamEvent>,
    ) -> Result<(), LlmError> {
        let call = self.calls.entry(index).or_default();
        let new_id = learn(&mut call.id, id);
        let new_name = learn(&mut call.name, name);
        if call.done {
            if arguments.trim().is_empty() {
                return Ok(());
            }
            return Err(LlmError::BadSse {
                reason: format!(
                    "tool call {index} received more arguments after its JSON object closed"
                ),
            });
        }
        if new_id.is_none() && new_name.is_none() && arguments.is_empty() {
            return Ok(());
        }
        call.arguments.push_str(arguments);
        call.scan.feed(arguments);
        out.push(StreamEvent::ToolCallDelta {
            index,
            id: new_id,
            name: new_name,
            arguments: arguments.to_string(),
        });
        if call.scan.opened && call.scan.closed {
            out.push(done_event(index, call));
        }
        Ok(())
    }

    /// Emits a done event for every call not yet done, in index order.
    pub(crate) fn flush(&mut self, out: &mut Vec<StreamEvent>) {
        for (index, call) in self.calls.iter_mut() {
            if !call.done {
                out.push(done_event(*index, call));
            }
        }
    }
}

fn learn(slot: &mut Option<String>, seen: Option<&str>) -> Option<String> {
    match seen {
        Some(s) if !s.is_empty() && slot.is_none() => {
            *slot = Some(s.to_string());
            Some(s.to_string())
        }
        _ => None,
    }
}

fn done_event(index: usize, call: &mut Partial) -> StreamEvent {
    call.done = true;
    StreamEvent::ToolCallDone {
        index,
        id: call.id.clone().unwrap_or_else(|| format!("call_{index}")),
        name: call.name.clone().unwrap_or_default(),
        arguments: call.arguments.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dones(out: &[StreamEvent]) -> Vec<(usize, String, String)> {
        out.iter()
            .filter_map(|e| match e {
                StreamEvent::ToolCallDone {
                    index,
                    name,
                    arguments,
                    ..
                } => Some((*index, name.clone(), arguments.clone())),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn interleaved_fragments_merge_by_index_and_finish_when_closed() {
        let mut m = ToolCallMerger::default();
        let mut out = Vec::new();
        m.fragment(0, Some("a"), Some("get"), "{\"x\":", &mut out)
            .unwrap();
        m.fragment(1, Some("b"), Some("put"), "{\"s\":\"}{\\\"", &mut out)
            .unwrap();
        m.fragment(0, Some("a"), Some("get"), "1}", &mut out)
            .unwrap();
        assert_eq!(dones(&out), vec![(0, "get".into(), "{\"x\":1}".into())]);
        m.fragment(1, None, None, "\"}", &mut out).unwrap();
        m.flush(&mut out);
        assert_eq!(
            dones(&out),
            vec![
                (0, "get".into(), "{\"x\":1}".into()),
                (1, "put".into(), "{\"s\":\"}{\\\"\"}".into())
            ]
        );
        // Repeated ids and names were not re-announced.
        let named = out
            .iter()
            .filter(|e| matches!(e, StreamEvent::ToolCallDelta { name: Some(_), .. }))
            .count();
        assert_eq!(named, 2);
    }

    #[test]
    fn unclosed_arguments_are_flushed_at_the_end() {
        let mut m = ToolCallMerger::default();
        let mut out = Vec::new();
        m.fragment(0, None, Some("t"), "{\"a\":", &mut out).unwrap();
        assert!(dones(&out).is_empty());
        m.flush(&mut out);
        assert_eq!(dones(&out), vec![(0, "t".into(), "{\"a\":".into())]);
    }

    #[test]
    fn arguments_after_close_are_a_typed_error() {
        let mut m = ToolCallMerger::default();
        let mut out = Vec::new();
        m.fragment(0, None, Some("t"), "{}", &mut out).unwrap();
        m.fragment(0, None, Some("t"), "", &mut out).unwrap();
        let e = m.fragment(0, None, None, "{}", &mut out).unwrap_err();
        assert_eq!(e.code(), "llm.bad_sse");
    }

    #[test]
    fn tool_calls_map_to_calls_and_output() {
        let c = call_from_tool_call("get", r#"{"id": 1, "_outputPath": "†state.x"}"#).unwrap();
        let ToolCallOutcome::Call(c) = c else {
            panic!("expected a call")
        };
        assert_eq!(c.tool, "get");
        assert_eq!(c.output_path.as_deref(), Some("†state.x"));
        assert_eq!(
            call_from_tool_call(FINAL_OUTPUT_TOOL, r#"{"output": {"ok": true}}"#).unwrap(),
            ToolCallOutcome::Output(json!({"ok": true}))
        );
        assert_eq!(
            call_from_tool_call("get", "[1]").unwrap_err().code(),
            "llm.bad_tool_call"
        );
        assert_eq!(
            call_from_tool_call("get", "{").unwrap_err().code(),
            "llm.bad_tool_call"
        );
        assert!(matches!(
            call_from_tool_call("noargs", "").unwrap(),
            ToolCallOutcome::Call(_)
        ));
    }

    #[test]
    fn functions_strip_private_fields_and_add_final_output() {
        let tool = Tool::from_value(json!({
            "_tool": "lookup", "_activity": "http", "_http": {"url": "x"},
            "description": "Looks up.", "type": "object",
            "properties": {"q": {"type": "string"}}, "required": ["q"]
        }))
        .unwrap();
        let schema = json!({"properties": {"output": {"type": "string"}}});
        let fs = functions(&[tool], &schema);
        assert_eq!(fs.len(), 2);
        assert_eq!(fs[0].description.as_deref(), Some("Looks up."));
        assert!(fs[0].parameters.get("_http").is_none());
        assert!(fs[0].parameters.get("description").is_none());
        assert!(
            fs[0]
                .parameters
                .pointer("/properties/_outputPath")
                .is_some()
        );
        assert_eq!(fs[1].name, FINAL_OUTPUT_TOOL);
        assert_eq!(
            fs[1].parameters.pointer("/properties/output"),
            Some(&json!({"type": "string"}))
        );
    }
}
