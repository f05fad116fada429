//! The terminal's card of a call awaiting a decision: what the page's card shows, as lines of
//! text. It is drawn from the same description the page reads (`runs::AwaitingCall`, built by
//! `runs::describe_view` from the run's record and journal): the tool's description, the action
//! (method and URL, command line, MCP server and tool, delegate goal), each param with where its
//! value came from, the rule that asked, and the reviewer's deadline with what happens at it.
//!
//! Deliberately not here: reading answers (`review`) or deciding what a card holds (the view's).

use serde_json::Value;

use crate::runs::AwaitingCall;

/// The card's lines (each starts with two spaces and ends with a newline). `now` is the wall
/// clock in ms since the epoch, for the time left.
pub(super) fn lines(a: &AwaitingCall, now: u64) -> String {
    let mut out = String::new();
    if let Some(d) = a.description.as_str().filter(|d| !d.is_empty()) {
        out.push_str(&format!("    {}\n", one_line(d, 160)));
    }
    if let Some(action) = action(&a.action) {
        out.push_str(&format!("    action: {action}\n"));
    }
    for s in &a.sources {
        let (Some(param), Some(value)) = (s["param"].as_str(), s.get("value")) else {
            continue;
        };
        let from = match (s["from"].as_str(), s.get("wrote")) {
            (Some("reference"), Some(w)) => {
                format!(
                    "from {}",
                    w.as_str().map_or_else(|| w.to_string(), String::from)
                )
            }
            _ => "as the model wrote it".into(),
        };
        out.push_str(&format!(
            "    {param} = {}   ({from})\n",
            one_line(&value.to_string(), 100)
        ));
    }
    if let Some(rule) = &a.rule {
        out.push_str(&format!("    asked by: {rule}\n"));
    }
    out.push_str(&format!("    {}\n", deadline(a, now)));
    out
}

/// The deadline in words: `approve at 12:00:04 UTC (in 2 s) unless you decide`, or that
/// nothing happens without a decision.
pub(super) fn deadline(a: &AwaitingCall, now: u64) -> String {
    let default = a.default_decision.as_str().unwrap_or("reject");
    match (a.deadline_at, a.timeout_ms) {
        (Some(at), _) => format!(
            "deadline: {default} at {} ({}) unless you decide",
            clock(at),
            left(at.saturating_sub(now))
        ),
        (None, Some(ms)) => format!(
            "deadline: {default} {} after you are shown it",
            left(ms).trim_start_matches("in ")
        ),
        (None, None) => "no deadline: the call waits for a decision".into(),
    }
}

fn left(ms: u64) -> String {
    let s = ms.div_ceil(1000);
    if s < 120 {
        format!("in {s} s")
    } else {
        format!("in {} min", s.div_ceil(60))
    }
}

/// `HH:MM:SS UTC` of an epoch time in ms.
fn clock(ms: u64) -> String {
    let s = (ms / 1000) % 86_400;
    format!("{:02}:{:02}:{:02} UTC", s / 3600, (s / 60) % 60, s % 60)
}

/// The action in one line: `POST https://...`, `$ cmd args`, `MCP server/tool`, `delegate
/// goal.json`; None when the call does nothing that can be described (a latent tool...).
fn action(v: &Value) -> Option<String> {
    let text = |k: &str| v[k].as_str().unwrap_or_default().to_string();
    match v["kind"].as_str()? {
        "http" => {
            let body = v
                .get("body")
                .map(|b| format!(" body {}", one_line(&b.to_string(), 80)))
                .unwrap_or_default();
            Some(format!("{} {}{body}", text("method"), text("url")))
        }
        "shell" => Some(format!("$ {}", text("line"))),
        "mcp" => Some(format!(
            "MCP {}/{}",
            v["server"].as_str().unwrap_or("?"),
            text("tool")
        )),
        "delegate" => Some(format!(
            "delegate to the goal {}",
            v["goal"].as_str().unwrap_or("(inline)")
        )),
        "latent" => None,
        _ => Some(format!("{} activity", text("activity"))),
    }
}

fn one_line(s: &str, max: usize) -> String {
    let flat: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if flat.chars().count() > max {
        format!("{}…", flat.chars().take(max).collect::<String>())
    } else {
        flat
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_in_words() {
        let mut a: AwaitingCall = serde_json::from_value(serde_json::json!({
            "call_id": 2, "params_hash": "h", "presentation": 5, "interrupted": false,
            "rule": "policy:ask", "timeout_ms": 2000, "deadline_at": null,
            "default_decision": "approve", "downstream": [], "tool_schema": null,
            "description": "Translate", "action": {"kind": "http", "method": "POST",
            "url": "https://x/t", "headers": []}, "sources": [
                {"param": "text", "from": "reference", "wrote": "†state.reply", "value": "hola"}],
            "path": [2], "call": {"_tool": "translate", "text": "hola"}}))
        .expect("card");
        assert_eq!(
            deadline(&a, 0),
            "deadline: approve 2 s after you are shown it"
        );
        a.deadline_at = Some(3_723_000);
        assert_eq!(
            deadline(&a, 3_721_500),
            "deadline: approve at 01:02:03 UTC (in 2 s) unless you decide"
        );
        let text = lines(&a, 3_721_500);
        assert!(text.contains("action: POST https://x/t"), "{text}");
        assert!(
            text.contains("text = \"hola\"   (from †state.reply)"),
            "{text}"
        );
        assert!(text.contains("asked by: policy:ask"), "{text}");
    }
}
