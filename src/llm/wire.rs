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

/// How many characters `value` takes as JSON, counted as it serialises (the messages of a large
/// step's Request run to megabytes; nothing is kept).
pub(crate) fn json_chars(value: &impl serde::Serialize) -> usize {
    struct Chars(usize);
    impl std::io::Write for Chars {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            // Every byte that does not continue a UTF-8 sequence starts a character.
            self.0 += buf.iter().filter(|&&b| b & 0xc0 != 0x80).count();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut n = Chars(0);
    match serde_json::to_writer(&mut n, value) {
        Ok(()) => n.0,
        Err(_) => 0,
    }
}

/// How many characters [`role_and_text`] gives for `m`, without building the text.
pub(crate) fn text_chars(m: &Message) -> usize {
    match m {
        Message::Text { text, .. } => text.chars().count(),
        other => json_chars(other),
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
/// Each tool's parameters are its branch of the composed Solution schema (`calls.items.anyOf`)
/// without `_tool`: the params in the tool's order, each also accepting a reference string (as
/// in structured mode, rule C7), then `_outputPath`, `_outputMethod` and, for latent tools, the
/// required `_output`. `final_output` takes `{"output": <the goal's output schema>}`. The
/// composed schema's `$defs` travel with every definition that refers to them, so local `$ref`s
/// keep resolving. A tool with no branch in the schema (a schema not made by `compose`) falls
/// back to its own params schema plus the meta fields.
pub(crate) fn functions(tools: &[Tool], solution_schema: &Value) -> Vec<FunctionDef> {
    let defs = solution_schema.get("$defs").cloned();
    let with_defs = |mut params: Value| {
        if let (Some(d), Value::Object(m)) = (&defs, &mut params)
            && serde_json::to_string(m).is_ok_and(|t| t.contains("#/$defs/"))
        {
            m.insert("$defs".into(), d.clone());
        }
        params
    };
    let mut seen = std::collections::BTreeSet::new();
    let mut out: Vec<FunctionDef> = Vec::with_capacity(tools.len() + 1);
    // The last definition of a name wins, in the position of that definition (rule C6).
    for (i, tool) in tools.iter().enumerate() {
        if tools[i + 1..].iter().any(|t| t.name == tool.name) || !seen.insert(&tool.name) {
            continue;
        }
        let mut f = branch_of(solution_schema, &tool.name).unwrap_or_else(|| function_of(tool));
        f.parameters = with_defs(f.parameters);
        out.push(f);
    }
    let output_schema = solution_schema
        .pointer("/properties/output/anyOf/0")
        .or_else(|| solution_schema.pointer("/properties/output"))
        .cloned()
        .unwrap_or_else(|| json!({}));
    out.push(FunctionDef {
        name: FINAL_OUTPUT_TOOL.to_string(),
        description: Some("Return the final output when the goal is reached.".to_string()),
        parameters: with_defs(json!({
            "type": "object",
            "properties": {"output": output_schema},
            "required": ["output"],
            "additionalProperties": false
        })),
    });
    out
}

/// The native function definitions tool-call mode sends for these tools and this composed
/// Solution schema, as `{"name", "description", "parameters"}` objects (`final_output` last).
/// `dagloop schema GOAL --mode tools` prints them.
pub fn function_definitions(tools: &[Tool], solution_schema: &Value) -> Vec<Value> {
    functions(tools, solution_schema)
        .into_iter()
        .map(|f| {
            let mut v = json!({"name": f.name});
            if let Some(d) = f.description {
                v["description"] = json!(d);
            }
            v["parameters"] = f.parameters;
            v
        })
        .collect()
}

/// The composed schema's branch for `name`, as a function definition (without `_tool`).
fn branch_of(solution_schema: &Value, name: &str) -> Option<FunctionDef> {
    let branches = solution_schema
        .pointer("/properties/calls/items/anyOf")?
        .as_array()?;
    let branch = branches
        .iter()
        .find(|b| b.pointer("/properties/_tool/const").and_then(Value::as_str) == Some(name))?;
    let mut params = branch.as_object()?.clone();
    let description = params
        .shift_remove("description")
        .and_then(|d| d.as_str().map(str::to_string));
    params.shift_remove("title");
    if let Some(Value::Object(props)) = params.get_mut("properties") {
        props.shift_remove("_tool");
    }
    if let Some(Value::Array(req)) = params.get_mut("required") {
        req.retain(|r| r != "_tool");
    }
    Some(FunctionDef {
        name: name.to_string(),
        description,
        parameters: Value::Object(params),
    })
}

/// A tool's own params schema plus the meta fields, for a schema without the tool's branch.
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
        if tool.is_latent() {
            props.insert("_output".into(), tool.output.clone().unwrap_or(json!({})));
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
    Call::parse(Value::Object(args))
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
    fn characters_are_counted_as_the_text_would_have_them() {
        let messages = [
            Message::Text {
                role: Role::User,
                text: "héllo → wörld".into(),
                extra: serde_json::Map::new(),
            },
            Message::Plan {
                plan: vec![serde_json::json!({"_tool": "t", "q": "ünïcode ✓", "n": 1.5}).into()],
                extra: serde_json::Map::new(),
            },
        ];
        for m in &messages {
            assert_eq!(text_chars(m), role_and_text(m).1.chars().count(), "{m:?}");
        }
        let whole = serde_json::to_string(&messages).expect("json");
        assert_eq!(json_chars(&messages), whole.chars().count());
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
