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

mod api;
mod auth;
mod error;
mod guard;
mod page;
pub mod principals;
mod sse;
mod state;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;

use auth::BearerScheme;
pub use error::ServerError;
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
    /// The operator allows goals with `shell` tools.
    pub allow_shell: bool,
    /// Where relative paths in submitted goals (scripted-model files) resolve.
    pub base_dir: PathBuf,
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "dagloop",
        description = "Submit goals, follow runs as they happen, and decide the calls that wait for a reviewer."
    ),
    modifiers(&BearerScheme),
    security(("bearer" = []))
)]
struct ApiDoc;

/// The API's routes and the OpenAPI document they describe.
fn api_routes() -> (Router<Arc<AppState>>, utoipa::openapi::OpenApi) {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(utoipa_axum::routes!(api::list_runs, api::create_run))
        .routes(utoipa_axum::routes!(api::get_run))
        .routes(utoipa_axum::routes!(sse::events))
        .routes(utoipa_axum::routes!(api::approvals))
        .routes(utoipa_axum::routes!(api::decide))
        .routes(utoipa_axum::routes!(api::cancel))
        .routes(utoipa_axum::routes!(auth::ticket))
        .split_for_parts()
}

/// The OpenAPI document of the API, as served at `/openapi.json` (pretty-printed).
pub fn openapi_json() -> String {
    let (_, doc) = api_routes();
    doc.to_pretty_json().unwrap_or_default()
}

/// Opens the store, continues the runs the server owned, and serves until Ctrl-C.
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
    let state = AppState::open(&opts, local)?;
    let resumed = state.resume_stored().await;
    println!(
        "{}",
        serde_json::json!({
            "status": "listening",
            "url": format!("http://{local}/"),
            "store": opts.store.display().to_string(),
            "resumed": resumed,
        })
    );
    // Events are small writes that must leave at once (no Nagle delay behind a delayed ACK).
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let served = axum::serve(listener, router(state.clone()))
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .map_err(|e| ServerError::Serve {
            reason: e.to_string(),
        });
    #[cfg(feature = "mcp")]
    state.mcp.shutdown().await;
    served
}

fn router(state: Arc<AppState>) -> Router {
    let (api, doc) = api_routes();
    let doc = Arc::new(doc.to_pretty_json().unwrap_or_default());
    let api = api
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
        .with_state(state)
}
