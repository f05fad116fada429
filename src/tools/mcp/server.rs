//! One MCP server: connecting to it (stdio child in its own process group, or streamable
//! HTTP), the handshake, listing its tools, a call with progress and cancellation, restarting a
//! server that died, and shutting it down. The set of servers a goal starts is
//! [`McpServers`](super::McpServers) (`client.rs`), which also maps their tools; sharing servers
//! between runs is [`McpPool`](super::McpPool). It knows nothing of goals or runs.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use rmcp::ServiceExt;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CancelledNotification, CancelledNotificationParam,
    ClientRequest, ProgressNotificationParam, RequestId, ServerResult,
};
use rmcp::service::{NotificationContext, Peer, PeerRequestOptions, RoleClient, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use serde_json::{Map, Value, json};
use tokio::io::AsyncReadExt;

use crate::protocol::{Call, Tool};
use crate::tools::group::KillOnDrop;
use crate::tools::{
    Activity, ActivityContext, ActivityError, ActivityFuture, Progress, ProgressSink,
};

use super::mapping::{error_of, result_value};
use super::{McpError, McpServerConfig};

/// One progress notification of a running MCP call.
#[derive(Debug, Clone, PartialEq)]
pub struct ProgressUpdate {
    /// The server.
    pub server: String,
    /// The MCP tool name.
    pub tool: String,
    /// Progress so far.
    pub progress: f64,
    /// The total, when the server knows it.
    pub total: Option<f64>,
    /// The server's message.
    pub message: Option<String>,
}

/// Receives every progress notification of a set of servers (besides the calling activity's own
/// [`ProgressSink`], through which a run turns them into `call_progress` events).
pub type ProgressFn = Arc<dyn Fn(ProgressUpdate) + Send + Sync>;

/// A call in flight, by progress token: its MCP tool name and where its progress goes.
type InFlight = HashMap<String, (String, ProgressSink)>;

/// Routes progress notifications to the call that asked for them, by progress token. A
/// notification that arrives after its call's answer finds no entry and is dropped.
#[derive(Clone, Default)]
struct Handler {
    server: String,
    sink: Option<ProgressFn>,
    calls: Arc<StdMutex<InFlight>>,
}

impl rmcp::ClientHandler for Handler {
    fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) -> impl Future<Output = ()> + Send + '_ {
        let key = serde_json::to_string(&params.progress_token).unwrap_or_default();
        let call = self.calls.lock().ok().and_then(|c| c.get(&key).cloned());
        if let Some((tool, progress)) = call {
            progress.report(Progress {
                progress: params.progress,
                total: params.total,
                message: params.message.clone(),
            });
            if let Some(sink) = &self.sink {
                sink(ProgressUpdate {
                    server: self.server.clone(),
                    tool,
                    progress: params.progress,
                    total: params.total,
                    message: params.message,
                });
            }
        }
        std::future::ready(())
    }
}

type Service = RunningService<RoleClient, Handler>;

/// Tells the server to stop a request whose caller went away (the engine dropped the call's
/// future: run cancelled, run timeout). Disarmed once the answer arrived.
struct CancelOnDrop {
    peer: Peer<RoleClient>,
    id: Option<RequestId>,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let Some(id) = self.id.take() else { return };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let peer = self.peer.clone();
        rt.spawn(async move {
            let n = CancelledNotification::new(CancelledNotificationParam::new(
                Some(id),
                Some("the dagloop call was cancelled".into()),
            ));
            let _ = peer.send_notification(n.into()).await;
        });
    }
}

/// One configured server and its current connection (None after it died).
pub(super) struct Server {
    pub(super) config: McpServerConfig,
    handler: Handler,
    live: tokio::sync::Mutex<Option<Arc<Service>>>,
    /// The process group of the current connection's stdio server: killed when the connection
    /// is replaced or forgotten, when the server is shut down, and when this is dropped.
    group: StdMutex<Option<KillOnDrop>>,
}

/// How long a stdio server (and what it started) has between SIGTERM and SIGKILL once it is
/// to stop without a clean shutdown.
const KILL_GRACE: Duration = Duration::from_millis(500);

/// Seconds from a server's configuration (checked when the goal loads; a value that still cannot
/// be a duration falls back to the five-minute default rather than panic).
fn secs(s: f64) -> Duration {
    crate::duration::seconds("mcp_servers.timeout_s", s).unwrap_or(Duration::from_secs(300))
}

/// Starts the server and performs the initialize handshake. A stdio server runs in a process
/// group of its own, returned with the connection; when the handshake fails or hangs the group
/// is killed before this returns.
async fn connect(
    config: &McpServerConfig,
    handler: Handler,
) -> Result<(Service, Option<KillOnDrop>), McpError> {
    config.check()?;
    let server = config.name().to_string();
    let limit = config.startup_timeout_s();
    let timeout = |during: &str| McpError::Timeout {
        server: server.clone(),
        seconds: limit,
        during: during.to_string(),
    };
    match config {
        McpServerConfig::Stdio(s) => {
            let command = super::expand_env(config, &s.command)?;
            let mut cmd = tokio::process::Command::new(&command);
            for a in &s.args {
                cmd.arg(super::expand_env(config, a)?);
            }
            for (k, v) in &s.env {
                cmd.env(k, super::expand_env(config, v)?);
            }
            crate::tools::group::prepare(&mut cmd);
            crate::tools::group::arm();
            let (transport, stderr) = TokioChildProcess::builder(cmd)
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|e| McpError::SpawnFailed {
                    server: server.clone(),
                    command: command.clone(),
                    reason: e.to_string(),
                })?;
            let group = KillOnDrop::with_grace(transport.id(), KILL_GRACE);
            // Keep the last 2 KiB of the server's stderr for error messages (and never let the
            // pipe fill up and block the server).
            let tail = Arc::new(StdMutex::new(Vec::<u8>::new()));
            if let Some(mut err) = stderr {
                let tail = tail.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = err.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        if let Ok(mut t) = tail.lock() {
                            t.extend_from_slice(&buf[..n]);
                            let excess = t.len().saturating_sub(2048);
                            t.drain(..excess);
                        }
                    }
                });
            }
            match tokio::time::timeout(secs(limit), handler.serve(transport)).await {
                Err(_) => Err(timeout("initialize handshake")),
                Ok(Err(e)) => {
                    // Give the stderr reader a moment to collect the process's last words.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    let said = tail
                        .lock()
                        .map(|t| String::from_utf8_lossy(&t).trim().to_string())
                        .unwrap_or_default();
                    let reason = if said.is_empty() {
                        e.to_string()
                    } else {
                        format!("{e}; stderr: {said}")
                    };
                    Err(McpError::Handshake { server, reason })
                }
                Ok(Ok(service)) => Ok((service, Some(group))),
            }
        }
        McpServerConfig::Http(h) => {
            let mut headers = HashMap::new();
            for (k, v) in &h.headers {
                let bad = |reason: String| McpError::Config {
                    server: server.clone(),
                    reason,
                };
                let name = reqwest::header::HeaderName::try_from(k.as_str())
                    .map_err(|e| bad(format!("header `{k}`: {e}")))?;
                let value = reqwest::header::HeaderValue::try_from(super::expand_env(config, v)?)
                    .map_err(|e| bad(format!("header `{k}`: {e}")))?;
                headers.insert(name, value);
            }
            let cfg = StreamableHttpClientTransportConfig::with_uri(h.url.clone())
                .custom_headers(headers);
            let client = http_client().map_err(|e| McpError::Config {
                server: server.clone(),
                reason: format!("the HTTP client could not be built: {e}"),
            })?;
            let transport = StreamableHttpClientTransport::with_client(client, cfg);
            match tokio::time::timeout(secs(limit), handler.serve(transport)).await {
                Err(_) => Err(timeout("initialize handshake")),
                Ok(Err(e)) => Err(McpError::Handshake {
                    server,
                    reason: e.to_string(),
                }),
                Ok(Ok(service)) => Ok((service, None)),
            }
        }
        McpServerConfig::Named(n) => Err(McpError::Config {
            server,
            reason: format!(
                "refers to the operator's MCP server `{}`, which this process does not configure",
                n.name
            ),
        }),
    }
}

impl Server {
    /// Connects if needed and lists the server's tools, within its start-up timeout.
    pub(super) async fn list_tools(&self) -> Result<Vec<rmcp::model::Tool>, McpError> {
        let service = self.live().await?;
        let limit = self.config.startup_timeout_s();
        match tokio::time::timeout(secs(limit), service.peer().list_all_tools()).await {
            Err(_) => Err(McpError::Timeout {
                server: self.config.name().to_string(),
                seconds: limit,
                during: "tools/list".into(),
            }),
            Ok(Err(e)) => Err(McpError::ListTools {
                server: self.config.name().to_string(),
                reason: e.to_string(),
            }),
            Ok(Ok(tools)) => Ok(tools),
        }
    }

    /// A server not yet connected (the first call or listing connects); its progress
    /// notifications go to `sink` besides each call's own.
    pub(super) fn new(config: &McpServerConfig, sink: Option<ProgressFn>) -> Arc<Server> {
        Arc::new(Server {
            config: config.clone(),
            handler: Handler {
                server: config.name().to_string(),
                sink,
                calls: Arc::default(),
            },
            live: tokio::sync::Mutex::new(None),
            group: StdMutex::new(None),
        })
    }

    /// The live connection, (re)starting the server when it is not running.
    async fn live(&self) -> Result<Arc<Service>, McpError> {
        let mut guard = self.live.lock().await;
        if let Some(s) = guard.as_ref()
            && !s.is_closed()
        {
            return Ok(s.clone());
        }
        *guard = None;
        self.set_group(None);
        let (s, group) = connect(&self.config, self.handler.clone()).await?;
        let s = Arc::new(s);
        *guard = Some(s.clone());
        self.set_group(group);
        Ok(s)
    }

    /// Replaces the guarded process group (the old one, if any, is killed).
    fn set_group(&self, group: Option<KillOnDrop>) {
        let old = match self.group.lock() {
            Ok(mut g) => std::mem::replace(&mut *g, group),
            Err(p) => std::mem::replace(&mut *p.into_inner(), group),
        };
        drop(old);
    }

    /// Forgets a connection that failed (the next call restarts the server).
    async fn forget(&self, dead: &Arc<Service>) {
        let mut guard = self.live.lock().await;
        if guard.as_ref().is_some_and(|s| Arc::ptr_eq(s, dead)) {
            *guard = None;
            self.set_group(None);
        }
        dead.cancellation_token().cancel();
    }

    pub(super) async fn call(
        &self,
        tool: &str,
        args: Map<String, Value>,
        progress: ProgressSink,
    ) -> Result<Value, ActivityError> {
        let name = self.config.name().to_string();
        let failed = |code: &str, message: String| ActivityError::Failed {
            message,
            details: json!({"code": code, "server": name, "tool": tool}),
        };
        let service = self
            .live()
            .await
            .map_err(|e| failed(e.code(), format!("cannot (re)start: {e}")))?;
        let mut params = CallToolRequestParams::new(tool.to_string());
        params.arguments = Some(args);
        let limit = self.config.call_timeout_s();
        let mut options = PeerRequestOptions::default();
        options.timeout = Some(secs(limit));
        let sent = service
            .peer()
            .send_cancellable_request(
                ClientRequest::CallToolRequest(CallToolRequest::new(params)),
                options,
            )
            .await;
        let handle = match sent {
            Ok(h) => h,
            Err(e) => {
                self.forget(&service).await;
                return Err(failed(
                    "mcp.server_died",
                    format!("MCP server `{name}` is not running ({e}); the next call restarts it"),
                ));
            }
        };
        let key = serde_json::to_string(&handle.progress_token).unwrap_or_default();
        if let Ok(mut c) = self.handler.calls.lock() {
            c.insert(key.clone(), (tool.to_string(), progress));
        }
        let mut guard = CancelOnDrop {
            peer: handle.peer.clone(),
            id: Some(handle.id.clone()),
        };
        let answer = handle.await_response().await;
        guard.id = None;
        // The SDK handles each notification on a task of its own: let one sent just before the
        // answer reach the call's sink before the call stops listening (best effort).
        tokio::task::yield_now().await;
        if let Ok(mut c) = self.handler.calls.lock() {
            c.remove(&key);
        }
        use rmcp::service::ServiceError as E;
        match answer {
            Ok(ServerResult::CallToolResult(r)) => {
                let value = result_value(&r);
                if r.is_error == Some(true) {
                    Err(error_of(&name, tool, value))
                } else {
                    Ok(value)
                }
            }
            Ok(other) => Err(failed(
                "mcp.unexpected_response",
                format!("MCP server `{name}` answered tools/call with {other:?}"),
            )),
            Err(E::Timeout { .. }) => Err(ActivityError::Timeout { seconds: limit }),
            Err(E::McpError(e)) => Err(ActivityError::Failed {
                message: format!("MCP tool `{tool}` on `{name}` failed: {}", e.message),
                details: json!({"code": "mcp.protocol_error", "server": name, "tool": tool,
                    "error": serde_json::to_value(&e).unwrap_or(Value::Null)}),
            }),
            Err(e @ (E::TransportClosed | E::TransportSend(_))) => {
                self.forget(&service).await;
                Err(failed(
                    "mcp.server_died",
                    format!(
                        "MCP server `{name}` stopped during the call ({e}); the next call restarts it"
                    ),
                ))
            }
            Err(e) => Err(failed(
                "mcp.call_failed",
                format!("MCP server `{name}`: {e}"),
            )),
        }
    }

    pub(super) async fn shutdown(&self) {
        if let Some(s) = self.live.lock().await.take() {
            match Arc::try_unwrap(s) {
                Ok(service) => {
                    let _ = service.cancel().await;
                }
                Err(shared) => shared.cancellation_token().cancel(),
            }
        }
        // Whatever the server left behind in its group goes too.
        self.set_group(None);
    }
}

/// Calls one MCP tool.
pub(super) struct McpActivity {
    pub(super) server: Arc<Server>,
    pub(super) tool: String,
}

impl Activity for McpActivity {
    fn run(&self, tool: &Tool, call: Arc<Call>) -> ActivityFuture {
        self.run_with(tool, call, ActivityContext::new())
    }

    /// Progress notifications of the call go to the context's progress sink.
    fn run_with(&self, tool: &Tool, call: Arc<Call>, cx: ActivityContext) -> ActivityFuture {
        let server = self.server.clone();
        // The request owns its arguments (renamed in place): the params are taken, copied only
        // when the call is shared (always, in a run: its `started` event holds it).
        let params =
            super::mapping::server_params(tool, Arc::unwrap_or_clone(call).params.into_map());
        let tool = self.tool.clone();
        Box::pin(async move {
            server
                .call(&tool, params, cx.progress)
                .await
                .map(Into::into)
        })
    }
}

/// The HTTP client of a streamable-HTTP server: dagloop's TLS set-up (`crate::net`, shared with
/// the model providers and the `http` activity), no idle connections kept (a reused connection
/// whose last body was not read to the end stalls on delayed ACKs), and only same-origin 307/308
/// redirects followed, which keep the method and body; any other redirect reaches the transport
/// as it came, so a session id or custom header never travels to another host.
fn http_client() -> Result<reqwest::Client, reqwest::Error> {
    let policy = reqwest::redirect::Policy::custom(|attempt| {
        let same_origin = attempt
            .previous()
            .first()
            .is_some_and(|first| first.origin() == attempt.url().origin());
        let keeps_body = matches!(attempt.status().as_u16(), 307 | 308);
        if same_origin && keeps_body && attempt.previous().len() <= 10 {
            attempt.follow()
        } else {
            attempt.stop()
        }
    });
    crate::net::builder()
        .pool_max_idle_per_host(0)
        .redirect(policy)
        .build()
}
