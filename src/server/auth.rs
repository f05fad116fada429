//! Bearer-token auth for the API, and short-lived tickets for the browser's EventSource (which
//! cannot send headers).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::error::ApiError;
use super::state::AppState;

/// How long a ticket may be used.
pub const TICKET_TTL: Duration = Duration::from_secs(60);

/// Tickets handed out, with when they expire.
#[derive(Default)]
pub(super) struct Tickets(Mutex<BTreeMap<String, Instant>>);

impl Tickets {
    fn issue(&self) -> String {
        let ticket = random_hex();
        let now = Instant::now();
        let mut m = match self.0.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        m.retain(|_, exp| *exp > now);
        m.insert(ticket.clone(), now + TICKET_TTL);
        ticket
    }

    fn valid(&self, ticket: &str) -> bool {
        let m = match self.0.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        m.get(ticket).is_some_and(|exp| *exp > Instant::now())
    }
}

/// 128 bits from the operating system's randomness (through the standard library's hasher
/// seeds), as hex.
fn random_hex() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut out = String::with_capacity(32);
    for _ in 0..2 {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(Instant::now().elapsed().as_nanos());
        out.push_str(&format!("{:016x}", h.finish()));
    }
    out
}

/// Equal in time independent of where the strings differ.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// Refuses API calls without the server's token (when it has one). The events stream also
/// takes `?ticket=`.
pub(super) async fn require_token(
    State(st): State<Arc<AppState>>,
    req: Request,
    next: Next,
) -> Response {
    let Some(token) = st.token.as_deref() else {
        return next.run(req).await;
    };
    let header = req
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    match header.and_then(|h| h.strip_prefix("Bearer ")) {
        Some(given) if same(given.trim(), token) => return next.run(req).await,
        Some(_) => {
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
    let events = req.uri().path().ends_with("/events");
    match ticket {
        Some(t) if events && st.tickets.valid(&t) => next.run(req).await,
        Some(_) if events => ApiError::new(
            StatusCode::UNAUTHORIZED,
            "auth.ticket",
            "the ticket is unknown or expired; get a new one from POST /tickets",
        )
        .into_response(),
        _ => ApiError::new(
            StatusCode::UNAUTHORIZED,
            "auth.missing",
            "this server needs `Authorization: Bearer TOKEN`",
        )
        .into_response(),
    }
}

/// A ticket for `GET /runs/{id}/events?ticket=...`, valid for 60 seconds.
#[utoipa::path(post, path = "/tickets", tag = "auth",
    responses((status = 200, description = "{ticket, expires_in_s}", body = Object),
              (status = 401, description = "No or wrong token", body = ApiError)))]
pub(super) async fn ticket(State(st): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({"ticket": st.tickets.issue(), "expires_in_s": TICKET_TTL.as_secs()}))
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
