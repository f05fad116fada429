//! The server's errors: why it could not start, and the JSON body of a refused request.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// Why the server could not start or stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// Listening off loopback needs a token.
    #[error(
        "refusing to listen on {addr} without a token: set DAGLOOP_TOKEN (only loopback addresses may go without)"
    )]
    TokenRequired {
        /// The address asked for.
        addr: std::net::SocketAddr,
    },
    /// The address cannot be bound.
    #[error("cannot listen on {addr}: {reason}")]
    Bind {
        /// The address.
        addr: std::net::SocketAddr,
        /// Why.
        reason: String,
    },
    /// The configured principals cannot be used.
    #[error(transparent)]
    Principals(#[from] super::principals::PrincipalError),
    /// The store cannot be opened.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    /// The operator's webhook cannot be used.
    #[error(transparent)]
    Notify(#[from] crate::notify::NotifyError),
    /// Serving failed.
    #[error("the server stopped: {reason}")]
    Serve {
        /// Why.
        reason: String,
    },
}

crate::codes::has_code!(ServerError);

impl ServerError {
    /// A stable code.
    pub fn code(&self) -> &'static str {
        match self {
            ServerError::TokenRequired { .. } => "server.token_required",
            ServerError::Bind { .. } => "server.bind",
            ServerError::Principals(e) => e.code(),
            ServerError::Store(e) => e.code(),
            ServerError::Notify(e) => e.code(),
            ServerError::Serve { .. } => "server.serve",
        }
    }
}

/// One problem in a request body, located by JSON pointer.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct Problem {
    /// Where in the body (`""` for the body itself).
    pub pointer: String,
    /// What is wrong there.
    pub message: String,
}

/// A refused request: `{"code", "message", "errors"?}`.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct ApiError {
    /// HTTP status.
    #[serde(skip)]
    pub status: u16,
    /// Stable code (`goal.invalid`, `op.already_decided`, `auth.missing`, ...).
    pub code: String,
    /// What went wrong.
    pub message: String,
    /// Each problem in the body, when the body was checked.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<Problem>,
}

impl ApiError {
    /// A refusal with this status and code.
    pub fn new(status: StatusCode, code: impl Into<String>, message: impl ToString) -> Self {
        ApiError {
            status: status.as_u16(),
            code: code.into(),
            message: message.to_string(),
            errors: Vec::new(),
        }
    }

    /// The status an op refusal maps to.
    pub fn from_op(e: &crate::protocol::OpError) -> Self {
        use crate::protocol::OpError as O;
        let status = match e {
            O::UnknownCall { .. } | O::UnknownGrant { .. } => StatusCode::NOT_FOUND,
            O::NotAwaiting { .. }
            | O::AlreadyDecided { .. }
            | O::Stale { .. }
            | O::StalePresentation { .. }
            | O::Moved { .. } => StatusCode::CONFLICT,
            O::RunFinished { .. } => StatusCode::CONFLICT,
            O::EditChangesTool { .. } | O::InvalidDecision { .. } | O::InvalidGrant { .. } => {
                StatusCode::UNPROCESSABLE_ENTITY
            }
            _ => StatusCode::SERVICE_UNAVAILABLE,
        };
        ApiError::new(status, e.code(), e)
    }

    /// A store failure: unknown runs are 404, a compacted run's journal 410, the rest 500.
    pub fn from_store(e: &crate::store::StoreError) -> Self {
        let status = match e {
            crate::store::StoreError::UnknownRun { .. } => StatusCode::NOT_FOUND,
            crate::store::StoreError::Busy { .. } => StatusCode::CONFLICT,
            crate::store::StoreError::Locked { .. } => StatusCode::SERVICE_UNAVAILABLE,
            crate::store::StoreError::Compacted { .. } => StatusCode::GONE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::new(status, e.code(), e)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut body = json!({"code": self.code, "message": self.message});
        if !self.errors.is_empty() {
            body["errors"] = json!(self.errors);
        }
        (status, Json(body)).into_response()
    }
}
