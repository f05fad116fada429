//! What a resolved call will do, described without doing it: the HTTP method and URL, the
//! command line, the MCP server and tool, the nested agent. The reviewer's page shows it on
//! each card awaiting a decision, so that a reviewer approves an action, not a bag of params.
//!
//! The description is built from the same configuration and the same template filling the
//! activities use (`fill_template`). Deliberately not here: secrets. Header values are never
//! included (only the headers' names), and `${VAR}` placeholders of the operator's environment
//! are left as written rather than resolved.

use serde::Serialize;
use serde_json::{Map, Value};

use super::{HttpConfig, ShellConfig, fill_template, kind_of};
use crate::protocol::Tool;

/// What a call of a tool will do once approved.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Action {
    /// One HTTP request.
    Http {
        /// The method, upper case.
        method: String,
        /// The URL with the params filled in (and, for a query-string body, the query);
        /// `${VAR}` placeholders kept as written.
        url: String,
        /// The names of the headers sent (their values are hidden).
        headers: Vec<String>,
        /// The JSON body, when the params are sent as one.
        #[serde(skip_serializing_if = "Option::is_none")]
        body: Option<Value>,
    },
    /// A program run without a shell.
    Shell {
        /// The program and its arguments, filled in.
        command: Vec<String>,
        /// The same as one line, quoted the way a POSIX shell would read it.
        line: String,
    },
    /// A tool of an MCP server.
    Mcp {
        /// The server's name (None when the tool's server is not known here).
        #[serde(skip_serializing_if = "Option::is_none")]
        server: Option<String>,
        /// The tool's name on that server.
        tool: String,
    },
    /// A nested agent.
    Delegate {
        /// The goal file it runs, as the tool names it.
        #[serde(skip_serializing_if = "Option::is_none")]
        goal: Option<String>,
    },
    /// Nothing runs: the model writes the result itself.
    Latent,
    /// Another activity kind (a Rust function, a kind a program registered).
    Other {
        /// The kind.
        activity: String,
    },
    /// The tool's configuration could not be read (the run would fail the call).
    Misconfigured {
        /// Why.
        reason: String,
    },
}

/// What a call of `tool` with these (resolved) params will do.
pub fn describe_action(tool: &Tool, params: &Map<String, Value>) -> Action {
    match kind_of(tool) {
        None => Action::Latent,
        Some("http") => match HttpConfig::from_tool(tool) {
            Ok(cfg) => http(&cfg, params),
            Err(e) => Action::Misconfigured {
                reason: e.to_string(),
            },
        },
        Some("shell") => match ShellConfig::from_tool(tool) {
            Ok(cfg) => {
                let command: Vec<String> = cfg
                    .command
                    .iter()
                    .map(|a| fill_template(a, params, false))
                    .collect();
                let line = command
                    .iter()
                    .map(|a| shell_quote(a))
                    .collect::<Vec<_>>()
                    .join(" ");
                Action::Shell { command, line }
            }
            Err(e) => Action::Misconfigured {
                reason: e.to_string(),
            },
        },
        Some("mcp") => {
            let mcp = tool.schema.get("_mcp");
            let text = |k: &str| mcp.and_then(|m| m.get(k)).and_then(Value::as_str);
            Action::Mcp {
                server: text("server").map(str::to_string),
                tool: text("tool").unwrap_or(&tool.name).to_string(),
            }
        }
        Some("delegate") => Action::Delegate {
            goal: tool
                .schema
                .get("_delegate")
                .and_then(Value::as_str)
                .map(str::to_string),
        },
        Some(other) => Action::Other {
            activity: other.to_string(),
        },
    }
}

/// The request the `http` activity would send (see `http::Client::run`): params named in the
/// URL go into it, the rest into the query string or the JSON body.
fn http(cfg: &HttpConfig, params: &Map<String, Value>) -> Action {
    let method = cfg.method.to_uppercase();
    let mut url = fill_template(&cfg.url, params, true);
    let rest: Map<String, Value> = params
        .iter()
        .filter(|(k, _)| !cfg.url.contains(&format!("{{{k}}}")))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let as_query = cfg.body == "query" || (cfg.body == "json" && method == "GET");
    let mut body = None;
    if as_query {
        let query: Vec<String> = rest
            .iter()
            .map(|(k, v)| {
                let v = v.as_str().map_or_else(|| v.to_string(), str::to_string);
                format!("{}={}", super::percent_encode(k), super::percent_encode(&v))
            })
            .collect();
        if !query.is_empty() {
            url.push(if url.contains('?') { '&' } else { '?' });
            url.push_str(&query.join("&"));
        }
    } else if cfg.body == "json" {
        body = Some(Value::Object(rest));
    }
    Action::Http {
        method,
        url,
        headers: cfg.headers.keys().cloned().collect(),
        body,
    }
}

/// `arg` as a POSIX shell would read it back as one word.
fn shell_quote(arg: &str) -> String {
    let plain = !arg.is_empty()
        && arg
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%^".contains(c));
    if plain {
        arg.to_string()
    } else {
        format!("'{}'", arg.replace('\'', r#"'\''"#))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tool(v: Value) -> Tool {
        serde_json::from_value(v).expect("tool")
    }

    fn params(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => Map::new(),
        }
    }

    #[test]
    fn http_shows_method_url_and_header_names_but_never_header_values() {
        let t = tool(json!({"_tool": "get", "_activity": "http",
            "_http": {"method": "get", "url": "https://api.example/items/{id}?k=${API_KEY}",
                      "headers": {"Authorization": "Bearer ${SECRET}", "X-Trace": "{id}"}}}));
        let a = describe_action(&t, &params(json!({"id": "a b", "limit": 5})));
        let v = serde_json::to_value(&a).expect("json");
        assert_eq!(
            v,
            json!({"kind": "http", "method": "GET",
                   "url": "https://api.example/items/a%20b?k=${API_KEY}&limit=5",
                   "headers": ["Authorization", "X-Trace"]})
        );
        assert!(!v.to_string().contains("Bearer"), "{v}");
    }

    #[test]
    fn http_post_sends_the_params_not_in_the_url_as_its_body() {
        let t = tool(json!({"_tool": "s", "_activity": "http",
            "_http": {"url": "http://h/{kind}/step"}}));
        let a = describe_action(&t, &params(json!({"kind": "x", "n": 1})));
        assert_eq!(
            serde_json::to_value(&a).expect("json"),
            json!({"kind": "http", "method": "POST", "url": "http://h/x/step",
                   "headers": [], "body": {"n": 1}})
        );
    }

    #[test]
    fn shell_shows_the_command_line_quoted() {
        let t = tool(json!({"_tool": "ls", "_activity": "shell",
            "_shell": {"command": ["ls", "-l", "{path}"]}}));
        let a = describe_action(&t, &params(json!({"path": "my dir/it's"})));
        assert_eq!(
            a,
            Action::Shell {
                command: vec!["ls".into(), "-l".into(), "my dir/it's".into()],
                line: r#"ls -l 'my dir/it'\''s'"#.into(),
            }
        );
    }

    #[test]
    fn mcp_delegate_latent_and_other_kinds() {
        let mcp = tool(json!({"_tool": "files_read", "_activity": "mcp",
            "_mcp": {"server": "files", "tool": "read"}}));
        assert_eq!(
            describe_action(&mcp, &Map::new()),
            Action::Mcp {
                server: Some("files".into()),
                tool: "read".into()
            }
        );
        let d = tool(json!({"_tool": "ask", "_delegate": "helper.goal.json"}));
        assert_eq!(
            describe_action(&d, &Map::new()),
            Action::Delegate {
                goal: Some("helper.goal.json".into())
            }
        );
        assert_eq!(
            describe_action(&tool(json!({"_tool": "think"})), &Map::new()),
            Action::Latent
        );
        assert_eq!(
            describe_action(
                &tool(json!({"_tool": "f", "_activity": "rust"})),
                &Map::new()
            ),
            Action::Other {
                activity: "rust".into()
            }
        );
    }
}
