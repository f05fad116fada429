//! `dagloop serve`: the ops/events API over HTTP (axum), live events over SSE, the reviewer
//! page, and an OpenAPI document generated from the routes.
//!
//! Runs submitted here are started through [`crate::runs`], the code `dagloop run` uses, with
//! the store as their journal; they keep going when clients disconnect and are continued from
//! the store when the server starts again. Decisions go through the run's `RunHandle`, so the
//! machine refuses those that do not apply (rule 21) exactly as it does for every other
//! reviewer.
//!
//! Deliberately not here: any rule about runs (the machine and `runs` hold them) or how the
//! command line prints (the `cli` module; neither front-end depends on the other).

mod api;
mod auth;
mod error;
mod page;
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
    /// The bearer token every API call must carry (`DAGLOOP_TOKEN`); required off loopback.
    pub token: Option<String>,
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
    if opts.token.is_none() && !opts.addr.ip().is_loopback() {
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
    let state = AppState::open(&opts)?;
    let resumed = state.resume_stored().await;
    let takeover = state.spawn_takeover();
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
    takeover.abort();
    state.release_all();
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
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::require_token,
        ));
    Router::new()
        .merge(page::routes())
        .merge(api)
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}
