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
    let mut meta = json!({"server": server.name(), "tool": mcp.name});
    let renamed = escape_meta_params(&mut schema);
    if !renamed.is_empty() {
        meta["renamed"] = Value::Object(renamed);
    }
    schema.insert("_mcp".into(), meta);
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

/// Renames the params an MCP tool names with a leading `_` (dagloop's meta keys, which a call may
/// not carry as params) to `p_…` (another `p` in front while the name is taken), in
/// `properties` and `required`; returns the new names mapped to the server's.
fn escape_meta_params(schema: &mut Map<String, Value>) -> Map<String, Value> {
    let mut renamed = Map::new();
    let Some(Value::Object(props)) = schema.get_mut("properties") else {
        return renamed;
    };
    let meta: Vec<String> = props
        .keys()
        .filter(|k| crate::protocol::is_meta_key(k))
        .cloned()
        .collect();
    for key in meta {
        let mut name = format!("p{key}");
        while props.contains_key(&name) || renamed.contains_key(&name) {
            name.insert(0, 'p');
        }
        renamed.insert(name, Value::String(key));
    }
    // Rebuilt in order, so the params keep the place the server gave them.
    *props = std::mem::take(props)
        .into_iter()
        .map(|(k, v)| {
            let new = renamed.iter().find(|(_, old)| old.as_str() == Some(&k));
            (new.map_or(k, |(n, _)| n.clone()), v)
        })
        .collect();
    if let Some(Value::Array(required)) = schema.get_mut("required") {
        for r in required.iter_mut() {
            if let Some((new, _)) = renamed.iter().find(|(_, old)| *old == &*r) {
                *r = Value::String(new.clone());
            }
        }
    }
    renamed
}

/// A call's params as the MCP server names them: the names [`to_tool`] escaped are restored.
pub(crate) fn server_params(tool: &Tool, mut params: Map<String, Value>) -> Map<String, Value> {
    let renamed = tool
        .schema
        .get("_mcp")
        .and_then(|m| m.get("renamed"))
        .and_then(Value::as_object);
    for (new, old) in renamed.into_iter().flatten() {
        if let (Some(v), Some(old)) = (params.remove(new), old.as_str()) {
            params.insert(old.to_string(), v);
        }
    }
    params
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
