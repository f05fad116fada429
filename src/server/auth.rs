//! Who is calling: the bearer token (or, for the browser's EventSource, which cannot send
//! headers, a short-lived ticket) resolved to a [`Principal`], put in the request's extensions
//! for the handlers. A ticket is bound to one run and one principal: it opens
//! `GET /runs/{that run}/events` and nothing else.
//!
//! Deliberately not here: which role a route needs (the handlers check it) or how tokens are
//! configured (`principals`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::rejection::JsonRejection;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::Value;

use super::error::ApiError;
use super::principals::Principal;
use super::state::AppState;

/// How long a ticket may be used.
pub const TICKET_TTL: Duration = Duration::from_secs(60);

/// What a ticket opens: one run's events, as one principal.
struct Ticket {
    run: String,
    principal: Principal,
    expires: Instant,
}

/// Tickets handed out.
#[derive(Default)]
pub(super) struct Tickets(Mutex<BTreeMap<String, Ticket>>);

impl Tickets {
    fn issue(&self, run: &str, principal: Principal) -> Option<String> {
        let ticket = random_hex()?;
        let now = Instant::now();
        let mut m = match self.0.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        m.retain(|_, t| t.expires > now);
        m.insert(
            ticket.clone(),
            Ticket {
                run: run.to_string(),
                principal,
                expires: now + TICKET_TTL,
            },
        );
        Some(ticket)
    }

    /// The principal a ticket stands for, when it is current and bound to `run`.
    fn redeem(&self, ticket: &str, run: &str) -> Option<Principal> {
        let m = match self.0.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        m.get(ticket)
            .filter(|t| t.expires > Instant::now() && t.run == run)
            .map(|t| t.principal.clone())
    }
}

/// 128 bits from the operating system's randomness, as hex.
fn random_hex() -> Option<String> {
    use ring::rand::SecureRandom;
    let mut b = [0u8; 16];
    ring::rand::SystemRandom::new().fill(&mut b).ok()?;
    Some(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// The run whose events a path asks for (`/runs/{id}/events`), as written in the path.
fn events_run(path: &str) -> Option<&str> {
    path.strip_prefix("/runs/")?
        .strip_suffix("/events")
        .filter(|id| !id.is_empty() && !id.contains('/'))
}

/// Resolves the caller to a [`Principal`] (into the request's extensions) or refuses: 401
/// `auth.missing`, `auth.invalid` or `auth.ticket`. A server without tokens makes every caller
/// [`Principal::local`].
pub(super) async fn authenticate(
    State(st): State<Arc<AppState>>,
    mut req: Request,
    next: Next,
) -> Response {
    if st.principals.open() {
        req.extensions_mut().insert(Principal::local());
        return next.run(req).await;
    }
    let header = req
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .map(|v| v.to_str().ok());
    match header {
        Some(Some(h)) => {
            let who = h
                .split_once(' ')
                .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
                .and_then(|(_, t)| st.principals.identify(t.trim()));
            return match who {
                Some(p) => {
                    req.extensions_mut().insert(p);
                    next.run(req).await
                }
                None => ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "auth.invalid",
                    "the token is wrong",
                )
                .into_response(),
            };
        }
        Some(None) => {
            return ApiError::new(
                StatusCode::UNAUTHORIZED,
                "auth.invalid",
                "the token is wrong",
            )
            .into_response();
        }
        None => {}
    }
    let ticket = req.uri().query().and_then(|q| {
        q.split('&')
            .find_map(|kv| kv.strip_prefix("ticket="))
            .map(str::to_string)
    });
    let run = events_run(req.uri().path()).map(str::to_string);
    match (ticket, run) {
        (Some(t), Some(run)) => match st.tickets.redeem(&t, &run) {
            Some(p) => {
                req.extensions_mut().insert(p);
                next.run(req).await
            }
            None => ApiError::new(
                StatusCode::UNAUTHORIZED,
                "auth.ticket",
                "the ticket is unknown, expired, or for another run; get a new one from POST /tickets",
            )
            .into_response(),
        },
        _ => ApiError::new(
            StatusCode::UNAUTHORIZED,
            "auth.missing",
            "this server needs `Authorization: Bearer TOKEN`",
        )
        .into_response(),
    }
}

/// `POST /tickets`'s body.
#[derive(serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct TicketRequest {
    /// The run whose events the ticket opens.
    run: String,
}

/// A ticket for `GET /runs/{run}/events?ticket=...` of one run, valid for 60 seconds, for the
/// caller (who must be allowed to read that run).
#[utoipa::path(post, path = "/tickets", tag = "auth",
    request_body(content = TicketRequest, description = "{run}: the run whose events the ticket opens"),
    responses((status = 200, description = "{ticket, run, expires_in_s}", body = super::wire::Ticket),
              (status = 400, description = "Not {run}", body = ApiError),
              (status = 401, description = "No or wrong token", body = ApiError),
              (status = 404, description = "No such run (or not one the caller may read)", body = ApiError),
              (status = 415, description = "Not application/json", body = ApiError)))]
pub(super) async fn ticket(
    State(st): State<Arc<AppState>>,
    Extension(who): Extension<Principal>,
    b: Result<Json<Value>, JsonRejection>,
) -> Result<Json<super::wire::Ticket>, ApiError> {
    let v = super::api::body(b)?;
    let req: TicketRequest = serde_json::from_value(v).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "http.bad_body",
            format!("expected {{\"run\": \"ID\"}}: {e}"),
        )
    })?;
    st.readable(&who, &req.run).await?;
    let ticket = st.tickets.issue(&req.run, who).ok_or_else(|| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server.internal",
            "no randomness for a ticket",
        )
    })?;
    Ok(Json(super::wire::Ticket {
        ticket,
        run: req.run,
        expires_in_s: TICKET_TTL.as_secs(),
    }))
}

/// Declares the bearer scheme in the OpenAPI document.
pub(super) struct BearerScheme;

impl utoipa::Modify for BearerScheme {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}
