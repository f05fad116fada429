//! Who is calling: the bearer token (or, for the browser's EventSource, which cannot send
//! headers, a short-lived ticket) resolved to a [`Principal`], put in the request's extensions
//! for the handlers. A ticket is bound to one run and one principal, opens
//! `GET /runs/{that run}/events` once and nothing else, and travels in a cookie or a header,
//! never in the URL (where logs, history and `Referer` would keep it).
//!
//! Deliberately not here: which role a route needs (the handlers check it) or how tokens are
//! configured (`principals`).

use std::sync::Arc;

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

pub use super::tickets::TICKET_TTL;

/// The header a ticket may be sent in.
pub const TICKET_HEADER: &str = "x-dagloop-ticket";

/// The cookie `POST /tickets` sets (for the browser's `EventSource`).
pub const TICKET_COOKIE: &str = "dagloop_ticket";

/// The tickets a request presents: the `X-Dagloop-Ticket` header, then each `dagloop_ticket`
/// cookie.
fn presented_tickets(headers: &axum::http::HeaderMap) -> Vec<String> {
    let mut out: Vec<String> = headers
        .get_all(TICKET_HEADER)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(|v| v.trim().to_string())
        .collect();
    for cookies in headers.get_all(axum::http::header::COOKIE) {
        let Ok(text) = cookies.to_str() else {
            continue;
        };
        for kv in text.split(';') {
            if let Some((k, v)) = kv.trim().split_once('=')
                && k == TICKET_COOKIE
            {
                out.push(v.to_string());
            }
        }
    }
    out.retain(|t| !t.is_empty());
    out
}

/// The `Set-Cookie` value that hands a ticket to the page's `EventSource`: sent only to that
/// run's events (when its id is plain enough to be a cookie path), never to another site, never
/// readable by a script.
fn ticket_cookie(ticket: &str, run: &str) -> String {
    let plain = !run.is_empty()
        && run
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b));
    let path = if plain {
        format!("/runs/{run}/events")
    } else {
        "/runs/".to_string()
    };
    format!(
        "{TICKET_COOKIE}={ticket}; Path={path}; Max-Age={}; HttpOnly; SameSite=Strict",
        TICKET_TTL.as_secs()
    )
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
    let in_url = req.uri().query().is_some_and(|q| {
        q.split('&')
            .any(|kv| kv == "ticket" || kv.starts_with("ticket="))
    });
    if in_url {
        // A URL is logged, kept in history and sent on as a Referer: a ticket never goes there.
        return ApiError::new(
            StatusCode::UNAUTHORIZED,
            "auth.ticket",
            "a ticket is not read from the URL: send it in the `X-Dagloop-Ticket` header or the `dagloop_ticket` cookie POST /tickets sets",
        )
        .into_response();
    }
    let tickets = presented_tickets(req.headers());
    let run = events_run(req.uri().path()).map(str::to_string);
    match (tickets.is_empty(), run) {
        (false, Some(run)) => {
            match tickets
                .iter()
                .find_map(|t| st.tickets.redeem(t, &run, &st.principals)) {
                Some(p) => {
                    req.extensions_mut().insert(p);
                    next.run(req).await
                }
                None => ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "auth.ticket",
                    "the ticket is unknown, used, expired, or for another run; get a new one from POST /tickets",
                )
                .into_response(),
            }
        }
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

/// A single-use ticket for `GET /runs/{run}/events` of one run, valid for 60 seconds, for the
/// caller (who must be allowed to read that run): in the answer, for the `X-Dagloop-Ticket`
/// header, and as the `dagloop_ticket` cookie the browser's `EventSource` sends.
#[utoipa::path(post, path = "/tickets", tag = "auth",
    request_body(content = TicketRequest, description = "{run}: the run whose events the ticket opens"),
    responses((status = 200, description = "{ticket, run, expires_in_s}, and the ticket as the `dagloop_ticket` cookie (HttpOnly, SameSite=Strict, for that run's events only)", body = super::wire::Ticket),
              (status = 400, description = "Not {run}", body = ApiError),
              (status = 401, description = "No or wrong token", body = ApiError),
              (status = 404, description = "No such run (or not one the caller may read)", body = ApiError),
              (status = 415, description = "Not application/json", body = ApiError)))]
pub(super) async fn ticket(
    State(st): State<Arc<AppState>>,
    Extension(who): Extension<Principal>,
    b: Result<Json<Value>, JsonRejection>,
) -> Result<impl IntoResponse, ApiError> {
    let v = super::api::body(b)?;
    let req: TicketRequest = serde_json::from_value(v).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "http.bad_body",
            format!("expected {{\"run\": \"ID\"}}: {e}"),
        )
    })?;
    st.readable(&who, &req.run).await?;
    let ticket = st.tickets.issue(&req.run, &who).ok_or_else(|| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server.internal",
            "no randomness for a ticket",
        )
    })?;
    let cookie = ticket_cookie(&ticket, &req.run);
    Ok((
        [(axum::http::header::SET_COOKIE, cookie)],
        Json(super::wire::Ticket {
            ticket,
            run: req.run,
            expires_in_s: TICKET_TTL.as_secs(),
        }),
    ))
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
