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
    /// Temporal cannot be reached (`serve --engine temporal`).
    #[error("cannot use Temporal: {reason}")]
    Temporal {
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
            ServerError::Temporal { .. } => "temporal.connect",
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
    /// The message is made fit for a client ([`for_client`]).
    pub fn new(status: StatusCode, code: impl Into<String>, message: impl ToString) -> Self {
        let code = code.into();
        ApiError {
            status: status.as_u16(),
            message: for_client(&code, &message.to_string()),
            code,
            errors: Vec::new(),
        }
    }

    /// The status an op refusal maps to.
    pub fn from_op(e: &crate::protocol::OpError) -> Self {
        ApiError::new(Self::op_status(e.code()), e.code(), e)
    }

    /// The status of an op refused with `code` (the one mapping for refusals by this process's
    /// run and by a Temporal workflow's validator): an unknown call or standing approval is 404, an op
    /// that cannot apply 422, one that came too late or too early 409, the rest 503.
    pub fn op_status(code: &str) -> StatusCode {
        match code {
            "op.unknown_call" | "op.unknown_standing_approval" => StatusCode::NOT_FOUND,
            "op.not_awaiting"
            | "op.already_decided"
            | "op.stale"
            | "op.stale_presentation"
            | "op.run_finished" => StatusCode::CONFLICT,
            "op.edit_changes_tool" | "op.invalid_decision" | "op.invalid_standing_approval" => {
                StatusCode::UNPROCESSABLE_ENTITY
            }
            _ => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// A store failure: unknown runs are 404, a compacted run's journal 410, a full disk 507
    /// (saying so: the operator has to make room), the rest 500.
    /// What a client is told names no lease owner (its process id and host) and no file: those
    /// go to the server's log.
    pub fn from_store(e: &crate::store::StoreError) -> Self {
        use crate::store::StoreError as S;
        let status = match e {
            S::UnknownRun { .. } => StatusCode::NOT_FOUND,
            S::Busy { .. } | S::SessionBusy { .. } => StatusCode::CONFLICT,
            S::Locked { .. } => StatusCode::SERVICE_UNAVAILABLE,
            S::Compacted { .. } => StatusCode::GONE,
            full if full.disk_full() => StatusCode::INSUFFICIENT_STORAGE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let message = match e {
            S::UnknownRun { .. }
            | S::Compacted { .. }
            | S::NotFinished { .. }
            | S::Exists { .. }
            | S::SessionBusy { .. }
            | S::LeaseLost { .. } => e.to_string(),
            S::Busy { id, expires_at, .. } => format!(
                "run {id} is being run by another process (its lease runs until {expires_at} ms); try again once its lease has expired"
            ),
            full if full.disk_full() => {
                tracing::error!(code = full.code(), "the run store failed: {full}");
                "the run store's disk is full: nothing was recorded; try again once the operator has made room".to_string()
            }
            other => {
                tracing::error!(code = other.code(), "the run store failed: {other}");
                "the run store failed; the server's log says why".to_string()
            }
        };
        ApiError::new(status, e.code(), message)
    }
}

/// A message fit for a client: the server's working directory taken out of the paths it
/// names (a path is shown relative to it), and, for a file a goal named that could not be read
/// as a scripted model or a goal, the parser's words left out (they quote the file's content:
/// a value, a key), keeping where the problem is.
pub(super) fn for_client(code: &str, message: &str) -> String {
    let mut out = message.to_string();
    if let Ok(cwd) = std::env::current_dir() {
        let prefix = format!("{}/", cwd.display());
        if prefix.len() > 1 {
            out = out.replace(&prefix, "");
        }
    }
    // A scripted model, or a goal file (a delegate's, an agent's): not the client's own goal.
    let from_file = match out.find("invalid script ") {
        Some(i) if code.starts_with("llm.") || code.starts_with("agent.") => {
            Some((i, "invalid script "))
        }
        _ => out
            .find("goal file ")
            .filter(|i| !out[*i..].starts_with("goal file the submitted goal"))
            .map(|i| (i, "goal file ")),
    };
    let Some((at, lead)) = from_file else {
        return out;
    };
    // `<lead><path>: <what the parser said>`; the path is what the goal wrote.
    let rest = &out[at + lead.len()..];
    let path = rest
        .split_once(": ")
        .map_or(rest, |(p, _)| p)
        .trim_end_matches(" is invalid");
    let place = out
        .rfind(" at line ")
        .map(|i| out[i..].trim().to_string())
        .filter(|p| {
            p.trim_start_matches("at line ")
                .split(" column ")
                .all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
        .map(|p| format!(" ({p})"))
        .unwrap_or_default();
    format!(
        "{}{lead}{path}: the file cannot be read as one{place}; its content is not shown",
        &out[..at]
    )
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_files_content_is_not_shown_to_clients() {
        let m = for_client(
            "llm.script_invalid",
            "invalid script /srv/x/arr.json: invalid type: string \"hunter3\", expected a sequence at line 1 column 17",
        );
        assert_eq!(
            m,
            "invalid script /srv/x/arr.json: the file cannot be read as one (at line 1 column 17); its content is not shown"
        );
        let m = for_client(
            "goal.invalid",
            "goal file d/secret.json is invalid: unknown field `password`",
        );
        assert!(!m.contains("password"), "{m}");
        assert!(m.contains("d/secret.json"), "{m}");
        // The client's own goal keeps the parser's words.
        let own = "goal file the submitted goal is invalid: missing field `goal`";
        assert_eq!(for_client("goal.invalid", own), own);
        assert_eq!(for_client("op.stale", "x: y"), "x: y");
    }

    #[test]
    fn the_working_directory_is_not_shown_to_clients() {
        let cwd = std::env::current_dir().expect("cwd");
        let m = for_client("x.y", &format!("cannot read {}/a/b.json", cwd.display()));
        assert_eq!(m, "cannot read a/b.json");
    }
}
