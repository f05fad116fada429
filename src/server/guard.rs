//! Browser safety, checked before any handler runs: the `Host` allowlist (a DNS-rebinding page
//! reaches the server under its own name, which is not on the list: 421 `http.bad_host`; two
//! `Host` headers: 400 `http.bad_host`), the page's framing headers (`no_framing`) and
//! JSON-only state changes (a cross-origin page can send a "simple" POST — form-encoded,
//! multipart or `text/plain` — without a CORS preflight, but never `application/json`: every
//! POST without it gets 415 `http.unsupported_media_type`).
//!
//! Deliberately not here: who the caller is and what it may do (`auth`, `principals`). No CORS
//! headers are ever sent, so other origins cannot read any answer either.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::state::AppState;

/// The names a request's `Host` may carry.
#[derive(Debug, Clone)]
pub(super) struct HostAllowlist {
    /// The exact listening address, `IP:PORT` (IPv6 in brackets).
    listening: String,
    /// Extra names from the operator, lowercase: a bare name matches any port, `NAME:PORT` that
    /// port only.
    extra: Vec<String>,
}

/// Loopback names, allowed with any port.
const LOOPBACK: [&str; 3] = ["localhost", "127.0.0.1", "[::1]"];

impl HostAllowlist {
    pub fn new(listening: SocketAddr, extra: &[String]) -> HostAllowlist {
        HostAllowlist {
            listening: listening.to_string(),
            extra: extra
                .iter()
                .map(|h| h.trim().to_ascii_lowercase())
                .filter(|h| !h.is_empty())
                .collect(),
        }
    }

    /// Whether a `Host` header value (`name`, `name:port`, `[v6]:port`) is allowed.
    pub fn allows(&self, host: &str) -> bool {
        let host = host.trim().to_ascii_lowercase();
        let Some((name, port)) = split_host(&host) else {
            return false;
        };
        if LOOPBACK.contains(&name) || host == self.listening {
            return true;
        }
        self.extra.iter().any(|e| match split_host(e) {
            Some((en, Some(ep))) => en == name && Some(ep) == port,
            Some((en, None)) => en == name,
            None => false,
        })
    }
}

/// `name` and `port` of a Host value; None when it is malformed (empty name, non-numeric port,
/// characters no host name has).
fn split_host(h: &str) -> Option<(&str, Option<&str>)> {
    let (name, port) = if h.starts_with('[') {
        let end = h.find(']')?;
        let (name, rest) = h.split_at(end + 1);
        match rest {
            "" => (name, None),
            r => (name, Some(r.strip_prefix(':')?)),
        }
    } else {
        match h.rsplit_once(':') {
            Some((n, p)) => (n, Some(p)),
            None => (h, None),
        }
    };
    let name_ok = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._[]:".contains(&b));
    let port_ok =
        port.is_none_or(|p| !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()));
    (name_ok && port_ok).then_some((name, port))
}

/// Refuses, with 421, a request whose `Host` is not on the allowlist (the page and the API).
pub(super) async fn require_host(
    State(st): State<Arc<AppState>>,
    req: Request,
    next: Next,
) -> Response {
    // Two `Host` headers: which one a proxy in front read is unknown, so neither decides.
    if req.headers().get_all(header::HOST).iter().count() > 1 {
        return ApiError::new(
            StatusCode::BAD_REQUEST,
            "http.bad_host",
            "the request has more than one Host header",
        )
        .into_response();
    }
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or_else(|| req.uri().authority().map(|a| a.as_str().to_string()));
    match host {
        Some(h) if st.hosts.allows(&h) => next.run(req).await,
        _ => ApiError::new(
            StatusCode::MISDIRECTED_REQUEST,
            "http.bad_host",
            "this server does not answer to this Host (allowed: localhost, 127.0.0.1, [::1], the listening address, and names given with --allow-host)",
        )
        .into_response(),
    }
}

/// Every answer (the page above all) says it may not be shown in a frame: `X-Frame-Options:
/// DENY` and the CSP `frame-ancestors 'none'`, so no other site can frame the page and trick
/// a reviewer into a click (clickjacking) or a key press.
pub(super) async fn no_framing(req: Request, next: Next) -> Response {
    let mut r = next.run(req).await;
    let h = r.headers_mut();
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("frame-ancestors 'none'"),
    );
    r
}

/// Refuses, with 415, a state-changing request whose body is not declared as JSON.
pub(super) async fn require_json(req: Request, next: Next) -> Response {
    if matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS) {
        return next.run(req).await;
    }
    let json = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(is_json);
    if json {
        return next.run(req).await;
    }
    ApiError::new(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "http.unsupported_media_type",
        "state-changing requests need `Content-Type: application/json`",
    )
    .into_response()
}

/// `application/json`, with or without parameters (`; charset=utf-8`).
fn is_json(content_type: &str) -> bool {
    content_type
        .split(';')
        .next()
        .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_names_and_the_listening_address_are_allowed_others_not() {
        let a = HostAllowlist::new(
            "127.0.0.1:8080".parse().expect("addr"),
            &["Reviews.Example.com".into(), "box:9000".into()],
        );
        for ok in [
            "localhost",
            "localhost:1234",
            "LOCALHOST:8080",
            "127.0.0.1",
            "127.0.0.1:8080",
            "[::1]",
            "[::1]:8080",
            "reviews.example.com",
            "reviews.example.com:443",
            "box:9000",
        ] {
            assert!(a.allows(ok), "{ok}");
        }
        for bad in [
            "",
            "evil.example",
            "evil.example:8080",
            "localhost.evil.example",
            "127.0.0.2:8080",
            "box:9001",
            "box",
            "localhost:",
            "localhost:80a",
            "[::1]x",
            "user@localhost",
            "localhost/x",
        ] {
            assert!(!a.allows(bad), "{bad}");
        }
        let v6 = HostAllowlist::new("[::1]:9999".parse().expect("addr"), &[]);
        assert!(v6.allows("[::1]:9999"));
        let any = HostAllowlist::new("0.0.0.0:7000".parse().expect("addr"), &[]);
        assert!(any.allows("0.0.0.0:7000") && !any.allows("10.0.0.5:7000"));
    }

    #[test]
    fn only_application_json_is_json() {
        assert!(is_json("application/json"));
        assert!(is_json("Application/JSON; charset=utf-8"));
        for no in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "application/jsonx",
            "text/plain; application/json",
        ] {
            assert!(!is_json(no), "{no}");
        }
    }
}
