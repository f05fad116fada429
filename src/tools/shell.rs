//! The built-in `shell` activity: runs a program (no shell interpretation) with arguments filled
//! from params. Disabled unless the operator enables it; the tool must ask for it too.
//!
//! The program runs in a process group of its own. When the call ends, however it ends (done,
//! failed, timed out, or cancelled by dropping its future), the whole group is killed
//! (SIGKILL), so nothing the program started in the background outlives the call; when dagloop
//! itself is killed, the reaper kills it (see `group`).

use std::process::Stdio;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::{Map, Value, json};
use tokio::io::AsyncReadExt;

use super::{ActivityError, ActivityFuture, ActivityOutput, fill_template};
use crate::protocol::{Call, Tool};

/// `_shell` in a tool schema.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShellConfig {
    /// Program and arguments; `{param}` in an argument is replaced by the param.
    pub command: Vec<String>,
    /// Time limit in seconds (default 30).
    #[serde(default = "default_timeout")]
    pub timeout_s: f64,
    /// Most bytes kept of stdout and of stderr (default 64 KiB each).
    #[serde(default = "default_cap")]
    pub max_output_bytes: usize,
}

fn default_timeout() -> f64 {
    30.0
}
fn default_cap() -> usize {
    64 * 1024
}

impl ShellConfig {
    /// Reads `_shell` from a tool.
    pub fn from_tool(tool: &Tool) -> Result<ShellConfig, ActivityError> {
        let cfg: ShellConfig = tool
            .schema
            .get("_shell")
            .cloned()
            .ok_or_else(|| ActivityError::Config {
                tool: tool.name.clone(),
                reason: "a shell tool needs `_shell` with `command`".into(),
            })
            .and_then(|raw| {
                serde_json::from_value(raw).map_err(|e| ActivityError::Config {
                    tool: tool.name.clone(),
                    reason: format!("`_shell`: {e}"),
                })
            })?;
        crate::duration::seconds("_shell.timeout_s", cfg.timeout_s).map_err(|e| {
            ActivityError::Config {
                tool: tool.name.clone(),
                reason: e.to_string(),
            }
        })?;
        if cfg.command.is_empty() {
            return Err(ActivityError::Config {
                tool: tool.name.clone(),
                reason: "`_shell.command` is empty".into(),
            });
        }
        Ok(cfg)
    }
}

pub(super) fn run(cfg: ShellConfig, tool: String, call: Arc<Call>) -> ActivityFuture {
    Box::pin(async move {
        // Read in place from the shared call: only the filled-in arguments are owned.
        let params: &Map<String, Value> = &call.params;
        let args: Vec<String> = cfg
            .command
            .iter()
            .map(|a| fill_template(a, params, false))
            .collect();
        drop(call);
        crate::tools::group::arm();
        let mut cmd = tokio::process::Command::new(&args[0]);
        cmd.args(&args[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        // Its own process group, so that whatever it starts can be stopped with it.
        crate::tools::group::prepare(&mut cmd);
        let mut child = cmd.spawn().map_err(|e| ActivityError::Failed {
            message: format!("cannot start `{}` for tool `{tool}`: {e}", args[0]),
            details: Value::Null,
        })?;
        // Declared after `child`, so dropped before it: the group goes first, on every way out
        // (finished, failed, timed out, or this future dropped because the call was cancelled).
        let _group = crate::tools::group::KillOnDrop::new(child.id());
        let cap = cfg.max_output_bytes;
        let mut out = child.stdout.take();
        let mut err = child.stderr.take();
        let work = async {
            let (o, e) = tokio::join!(
                read_capped(out.as_mut(), cap),
                read_capped(err.as_mut(), cap)
            );
            let status = child.wait().await;
            (o, e, status)
        };
        let limit = crate::duration::seconds("_shell.timeout_s", cfg.timeout_s.max(0.001))
            .map_err(|e| ActivityError::Config {
                tool: tool.clone(),
                reason: e.to_string(),
            })?;
        let (stdout, stderr, status) =
            tokio::time::timeout(limit, work)
                .await
                .map_err(|_| ActivityError::Timeout {
                    seconds: cfg.timeout_s,
                })?;
        let status = status.map_err(|e| ActivityError::Failed {
            message: format!("waiting for `{}` failed: {e}", args[0]),
            details: Value::Null,
        })?;
        let code = status.code();
        let result = json!({"exit_code": code, "stdout": stdout, "stderr": stderr});
        if status.success() {
            Ok(ActivityOutput::from(result))
        } else {
            Err(ActivityError::Failed {
                message: format!(
                    "`{}` exited with {}",
                    args[0],
                    code.map_or("a signal".into(), |c| c.to_string())
                ),
                details: result,
            })
        }
    })
}

async fn read_capped<R: tokio::io::AsyncRead + Unpin>(r: Option<&mut R>, cap: usize) -> String {
    let Some(r) = r else { return String::new() };
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let mut dropped = 0usize;
    loop {
        match r.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = cap.saturating_sub(buf.len());
                buf.extend_from_slice(&chunk[..n.min(room)]);
                dropped += n.saturating_sub(room);
            }
        }
    }
    let mut s = String::from_utf8_lossy(&buf).into_owned();
    if dropped > 0 {
        s.push_str(&format!("…[truncated: {dropped} more bytes]"));
    }
    s
}
