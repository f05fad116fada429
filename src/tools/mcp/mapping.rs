//! MCP tools and results to dagloop tools and activity outcomes (pure functions).

use serde_json::{Map, Value, json};

use crate::protocol::Tool;
use crate::tools::ActivityError;

use super::{McpServerConfig, default_approval};

/// A dagloop tool for an MCP tool: params schema from `inputSchema`, description, title and
/// annotations kept, `_activity: "mcp"`, approval from annotations and config overrides.
pub(crate) fn to_tool(name: &str, server: &McpServerConfig, mcp: &rmcp::model::Tool) -> Tool {
    let mut schema: Map<String, Value> = (*mcp.input_schema).clone();
    if !schema.contains_key("type") {
        schema.insert("type".into(), json!("object"));
    }
    if let Some(d) = &mcp.description {
        schema.insert("description".into(), json!(d));
    }
    if let Some(t) = &mcp.title {
        schema.entry("title").or_insert_with(|| json!(t));
    }
    let annotations = mcp
        .annotations
        .as_ref()
        .and_then(|a| serde_json::to_value(a).ok())
        .and_then(|v| match v {
            Value::Object(m) if !m.is_empty() => Some(m),
            _ => None,
        });
    let approval = default_approval(&mcp.name, annotations.as_ref(), server.approval_overrides());
    if let Some(a) = annotations {
        schema.insert("annotations".into(), Value::Object(a));
    }
    schema.insert(
        "_mcp".into(),
        json!({"server": server.name(), "tool": mcp.name}),
    );
    Tool {
        name: name.to_string(),
        output: mcp
            .output_schema
            .as_ref()
            .map(|s| Value::Object((**s).clone())),
        activity: Some("mcp".into()),
        approval,
        schema,
    }
}

/// The value a `tools/call` result stands for: `structuredContent`, else the text blocks joined
/// with `\n` (parsed when that is JSON), else the content array as JSON.
pub(crate) fn result_value(result: &rmcp::model::CallToolResult) -> Value {
    if let Some(s) = &result.structured_content {
        return s.clone();
    }
    let texts: Vec<&str> = result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.as_str()))
        .collect();
    if texts.is_empty() {
        return serde_json::to_value(&result.content).unwrap_or(Value::Null);
    }
    let joined = texts.join("\n");
    match serde_json::from_str::<Value>(&joined) {
        Ok(v) if v.is_object() || v.is_array() => v,
        _ => Value::String(joined),
    }
}

/// `isError: true` as a failed call; the message is the text content.
pub(crate) fn error_of(server: &str, tool: &str, value: Value) -> ActivityError {
    let message = match &value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    ActivityError::Failed {
        message: format!("MCP tool `{tool}` on `{server}` reported an error: {message}"),
        details: json!({"code": "mcp.tool_error", "server": server, "tool": tool, "result": value}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::{CallToolResult, ContentBlock};

    #[test]
    fn structured_content_wins_then_text_then_raw_content() {
        let structured = CallToolResult::structured(json!({"t": 21}));
        assert_eq!(result_value(&structured), json!({"t": 21}));
        let texts = CallToolResult::success(vec![ContentBlock::text("a"), ContentBlock::text("b")]);
        assert_eq!(result_value(&texts), json!("a\nb"));
        let json_text = CallToolResult::success(vec![ContentBlock::text("{\"ok\": true}")]);
        assert_eq!(result_value(&json_text), json!({"ok": true}));
        let number_text = CallToolResult::success(vec![ContentBlock::text("42")]);
        assert_eq!(
            result_value(&number_text),
            json!("42"),
            "only objects and arrays are parsed"
        );
        let image = CallToolResult::success(vec![ContentBlock::image("AAAA", "image/png")]);
        assert_eq!(result_value(&image)[0]["mimeType"], json!("image/png"));
        let e = error_of("s", "t", json!("boom"));
        assert_eq!(e.code(), "activity.failed");
        assert_eq!(e.to_value()["details"]["code"], json!("mcp.tool_error"));
    }
}
