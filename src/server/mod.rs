//! `dagloop serve`: the ops/events API over HTTP (axum), live events over SSE, the reviewer
//! page, and an OpenAPI document generated from the routes.
//!
//! Runs submitted here are started through [`crate::runs`], the code `dagloop run` uses, with
//! the store as their journal; they keep going when clients disconnect and are continued from
//! the store when the server starts again. Decisions go through the run's `RunHandle`, so the
//! machine refuses those that do not apply (rule 21) exactly as it does for every other
//! reviewer.
//!
//! Who may do what: every API request is made by a principal (`principals`, `auth`), and the
//! page and the API answer only under an allowed `Host` and take state changes only as JSON
//! (`guard`). docs/server.md says what a client can and cannot do.
//!
//! Deliberately not here: any rule about runs (the machine and `runs` hold them) or how the
//! command line prints (the `cli` module; neither front-end depends on the other).

pub use crate::notify::{NotifyError, WebhookConfig};
pub use crate::runs::{DefRecord, ForkedFrom, RunOptions, RunsError, SessionOf};

mod api;
mod auth;
mod cassette;
mod conns;
mod desk;
mod error;
mod floor;
mod fork;
mod guard;
mod limits;
mod list;
#[cfg(feature = "temporal")]
mod on_temporal;
mod openapi;
mod page;
mod park;
mod preview;
pub mod principals;
mod result;
mod retain;
mod session;
mod shown;
mod sse;
mod state;
mod tickets;
mod watch;
mod wire;

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;

pub use error::ServerError;
pub use limits::DEFAULT_ACTIVE_RUNS;
#[cfg(feature = "temporal")]
pub use on_temporal::TemporalServe;
pub use principals::{PrincipalConfig, PrincipalError, Role, token_sha256};
use state::AppState;

/// Largest request body accepted (goals and decisions), in bytes.
pub const MAX_BODY_BYTES: usize = 1 << 20;

/// How the server is started.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Where to listen.
    pub addr: SocketAddr,
    /// The run store file.
    pub store: PathBuf,
    /// The single bearer token of the principal `admin` (`DAGLOOP_TOKEN`). Off loopback, this
    /// or `principals` is required.
    pub token: Option<String>,
    /// Named principals with their roles (from the operator's configuration). With neither
    /// these nor `token`, every caller is the principal `local` with every role (loopback only).
    pub principals: Vec<PrincipalConfig>,
    /// Names the page and the API answer to besides `localhost`, `127.0.0.1`, `[::1]` (any
    /// port) and the listening address: `NAME` (any port) or `NAME:PORT`.
    pub allowed_hosts: Vec<String>,
    /// What submitted goals may touch (`crate::grants`).
    pub grants: Arc<crate::grants::Grants>,
    /// Goal files the operator publishes by name (`{"agent": NAME, "input": ...}`).
    pub agents: std::collections::BTreeMap<String, PathBuf>,
    /// The model specs a client may ask for, by published agent (besides the goal's own).
    pub agent_models: std::collections::BTreeMap<String, Vec<String>>,
    /// The operator's approval floor (`[approval]` of the config, [`crate::approval::floor`]).
    pub floor: crate::approval::OperatorFloor,
    /// A principal may not decide (nor approve ahead) calls of runs it submitted (`approval.own_run`).
    pub separate_duties: bool,
    /// Where relative paths in submitted goals (scripted-model files) resolve.
    pub base_dir: PathBuf,
    /// The operator's webhook for `approval_requested` notifications (`notify.webhook`).
    pub webhook: Option<crate::notify::WebhookConfig>,
    /// How long finished runs are kept (`[store]` of the config), applied at start and every
    /// [`RETENTION_EVERY`].
    pub retention: crate::store::Retention,
    /// The most active (not ended) runs one principal may have (`[limits] active_runs`;
    /// [`DEFAULT_ACTIVE_RUNS`] unless the operator says).
    pub active_runs: usize,
    /// Serve runs on Temporal (`--engine temporal`): every run is a workflow, nothing of a
    /// run is kept or driven here.
    #[cfg(feature = "temporal")]
    pub temporal: Option<TemporalServe>,
}

/// How often `dagloop serve` applies its retention policy (besides once at start).
pub const RETENTION_EVERY: std::time::Duration = std::time::Duration::from_secs(3600);

/// The API's routes and the OpenAPI document they describe. A route is added here, with
/// `#[utoipa::path]` on its handler (docs/server.md, "Adding a route").
fn api_routes() -> (Router<Arc<AppState>>, utoipa::openapi::OpenApi) {
    OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .routes(utoipa_axum::routes!(list::list_runs, api::create_run))
        .routes(utoipa_axum::routes!(api::get_run))
        .routes(utoipa_axum::routes!(result::result))
        .routes(utoipa_axum::routes!(sse::events))
        .routes(utoipa_axum::routes!(api::approvals))
        .routes(utoipa_axum::routes!(api::decide))
        .routes(utoipa_axum::routes!(preview::preview))
        .routes(utoipa_axum::routes!(api::cancel))
        .routes(utoipa_axum::routes!(
            desk::list_standing,
            desk::create_standing
        ))
        .routes(utoipa_axum::routes!(desk::revoke_standing))
        // The standing-approval routes' names before the rename, still answering.
        .route(
            "/runs/{id}/grants",
            axum::routing::get(desk::list_standing).post(desk::create_standing),
        )
        .route(
            "/runs/{id}/grants/{grant}",
            axum::routing::delete(desk::revoke_standing),
        )
        .routes(utoipa_axum::routes!(desk::audit))
        .routes(utoipa_axum::routes!(cassette::cassette))
        .routes(utoipa_axum::routes!(fork::fork))
        .routes(utoipa_axum::routes!(session::continue_run))
        .routes(utoipa_axum::routes!(auth::ticket))
        .split_for_parts()
}

/// The OpenAPI document of the API, as served at `/openapi.json` and committed as
/// schemas/openapi.json (pretty-printed, with a final newline).
pub fn openapi_json() -> String {
    let (_, doc) = api_routes();
    let mut text = serde_json::to_string_pretty(&openapi::finish(doc)).unwrap_or_default();
    text.push('\n');
    text
}

/// Opens the store, continues the runs the server owned, and serves until Ctrl-C or SIGTERM:
/// then the listener closes, open requests get two seconds, the runs stop being driven (the
/// store keeps them, resumed at the next start) and the MCP servers stop.
pub async fn serve(opts: ServeOptions) -> Result<(), ServerError> {
    if opts.token.is_none() && opts.principals.is_empty() && !opts.addr.ip().is_loopback() {
        return Err(ServerError::TokenRequired { addr: opts.addr });
    }
    let listener = tokio::net::TcpListener::bind(opts.addr)
        .await
        .map_err(|e| ServerError::Bind {
            addr: opts.addr,
            reason: e.to_string(),
        })?;
    let local = listener.local_addr().map_err(|e| ServerError::Bind {
        addr: opts.addr,
        reason: e.to_string(),
    })?;
    // `/metrics` counts what the runs driven from now on do.
    crate::telemetry::metrics::enable();
    let state = AppState::open(&opts, local)?;
    #[cfg(feature = "temporal")]
    let on_temporal = match &opts.temporal {
        Some(t) => {
            let _ = state
                .temporal
                .set(Arc::new(on_temporal::Engine::connect(t).await?));
            true
        }
        None => false,
    };
    #[cfg(not(feature = "temporal"))]
    let on_temporal = false;
    // Listening for SIGTERM before anybody can be told the server is up.
    let term = crate::signals::terminate();
    let stop = tokio_util::sync::CancellationToken::new();
    let signalled = stop.clone();
    let signals = tokio::spawn(async move {
        stop_signal(term).await;
        signalled.cancel();
    });
    // The runs to continue are found by one indexed read; they are continued in the
    // background, so the listener answers at once.
    // On Temporal nothing is continued, taken over or retained here: the cluster holds it all.
    let (resumed, takeover, retention) = if on_temporal {
        (Vec::new(), None, None)
    } else {
        let resumed = state.wakeable().await;
        let takeover = state.spawn_watcher(resumed.clone());
        (
            resumed,
            Some(takeover),
            state.spawn_retention(opts.retention),
        )
    };
    // A closed stdout must not stop the server (`println!` would panic).
    let _ = writeln!(
        std::io::stdout(),
        "{}",
        serde_json::json!({
            "status": "listening",
            "url": format!("http://{local}/"),
            "store": opts.store.display().to_string(),
            "resumed": resumed,
        })
    );
    // Connections bounded (header-read deadline, a cap that closes the quietest) and without
    // Nagle delay: events are small writes that must leave at once.
    let listener = conns::Bounded::new(listener);
    let graceful = stop.clone();
    // Accepting runs on the runtime's workers, not on the thread that called `serve`: each
    // connection's task is allocated by the acceptor and freed by a worker, and a thread that
    // only waits never hands such memory back to the allocator (`crate::idle`).
    let mut serving = tokio::spawn(
        axum::serve(listener, router(state.clone()))
            .with_graceful_shutdown(async move { graceful.cancelled().await })
            .into_future(),
    );
    // The listener closes at the signal; open requests get `SHUTDOWN_GRACE` to finish (an
    // event stream never does on its own).
    let served = tokio::select! {
        r = &mut serving => match r {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        },
        () = async {
            stop.cancelled().await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        } => Ok(()),
    }
    .map_err(|reason| ServerError::Serve { reason });
    serving.abort();
    signals.abort();
    if let Some(t) = takeover {
        t.abort();
    }
    if let Some(r) = retention {
        r.abort();
    }
    state.stop_runs();
    // The tasks that held the runs' handles end at once when next scheduled; give them that
    // moment, so the runs' drivers are stopped (their calls in flight dropped, nothing more
    // journaled) before the MCP servers those calls use are stopped.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    // Each server gets the MCP stdio shutdown (stdin closed, then SIGTERM, then SIGKILL), within
    // a bound: whatever is left is killed with the process's other groups on the way out.
    #[cfg(feature = "mcp")]
    let _ = tokio::time::timeout(MCP_SHUTDOWN, state.mcp.shutdown()).await;
    served
}

/// How long the shared MCP servers have to stop cleanly once the server stops.
#[cfg(feature = "mcp")]
const MCP_SHUTDOWN: std::time::Duration = std::time::Duration::from_secs(5);

/// How long open requests have to finish once the server is told to stop.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Resolves at Ctrl-C (SIGINT) or SIGTERM.
async fn stop_signal(term: Option<crate::signals::Signal>) {
    let term = async {
        match term {
            Some(mut s) => {
                s.recv().await;
            }
            None => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
}

fn router(state: Arc<AppState>) -> Router {
    let (api, _) = api_routes();
    let doc = Arc::new(openapi_json());
    let api = api
        .route("/metrics", axum::routing::get(api::metrics))
        .route(
            "/openapi.json",
            axum::routing::get(move || {
                let doc = doc.clone();
                async move { ([("content-type", "application/json")], doc.to_string()) }
            }),
        )
        // Layers run last-added first: JSON-only state changes, then who is calling.
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::authenticate,
        ))
        .layer(axum::middleware::from_fn(guard::require_json));
    Router::new()
        .merge(page::routes())
        .merge(api)
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            guard::require_host,
        ))
        .layer(axum::middleware::from_fn(guard::no_framing))
        .with_state(state)
}
