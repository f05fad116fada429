//! The built-in `http` activity: one HTTP request per call, configured by the tool's `_http`.
//! The response body is read as a stream, and no further than the smaller of `_http.max_bytes`
//! (past it: `http.too_large`) and what the run can still keep of tool results (past it: the
//! run's `run.result_bound` record of what was read, [`super::ResultBudget::over`]): a response
//! over either is never held whole.

use futures::StreamExt;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use std::sync::{Arc, OnceLock};

use super::{ActivityError, ActivityFuture, ActivityOutput, ResultBudget, fill_template};
use crate::grants::SecretHosts;
use crate::grants::egress::{Egress, EgressResolver, redirect_policy};
use crate::protocol::{Call, Tool};

/// `_http` in a tool schema.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpConfig {
    /// HTTP method (default POST).
    #[serde(default = "default_method")]
    pub method: String,
    /// URL; `{param}` is replaced by the (URL-encoded) param.
    pub url: String,
    /// Extra request headers; `{param}` is replaced too.
    #[serde(default)]
    pub headers: std::collections::BTreeMap<String, String>,
    /// How params are sent: `json` (default; query string for GET), `query`, `none`.
    #[serde(default = "default_body")]
    pub body: String,
    /// Time limit in seconds (default 30).
    #[serde(default = "default_timeout")]
    pub timeout_s: f64,
    /// Largest response accepted, in bytes (default 1 MiB).
    #[serde(default = "default_max_bytes")]
    pub max_bytes: usize,
}

fn default_method() -> String {
    "POST".into()
}
fn default_body() -> String {
    "json".into()
}
fn default_timeout() -> f64 {
    30.0
}
fn default_max_bytes() -> usize {
    1 << 20
}

impl HttpConfig {
    /// Reads `_http` from a tool.
    pub fn from_tool(tool: &Tool) -> Result<HttpConfig, ActivityError> {
        let raw = tool
            .schema
            .get("_http")
            .cloned()
            .ok_or_else(|| ActivityError::Config {
                tool: tool.name.clone(),
                reason: "an http tool needs `_http` with at least `url`".into(),
            })?;
        let config = |reason: String| ActivityError::Config {
            tool: tool.name.clone(),
            reason,
        };
        let cfg: HttpConfig =
            serde_json::from_value(raw).map_err(|e| config(format!("`_http`: {e}")))?;
        reqwest::Method::from_bytes(cfg.method.to_uppercase().as_bytes()).map_err(|_| {
            config(format!(
                "`_http.method`: unknown HTTP method `{}`",
                cfg.method
            ))
        })?;
        if !matches!(cfg.body.as_str(), "json" | "query" | "none") {
            return Err(config(format!(
                "`_http.body`: unknown body mode `{}` (json, query, none)",
                cfg.body
            )));
        }
        crate::duration::seconds("_http.timeout_s", cfg.timeout_s)
            .map_err(|e| config(e.to_string()))?;
        // The hard cap on `max_bytes`: a body is held in memory and its value in the store.
        const MAX_BYTES_CAP: usize = 64 * 1024 * 1024;
        if cfg.max_bytes > MAX_BYTES_CAP {
            return Err(config(format!(
                "`_http.max_bytes` is {}; at most {MAX_BYTES_CAP} (64 MiB)",
                cfg.max_bytes
            )));
        }
        Ok(cfg)
    }
}

#[derive(Clone)]
pub(super) struct Client {
    /// The HTTP clients, by (the request carries a granted variable's value, its port is 80
    /// or 443), each made on first use: a resolver does not see the port, and a request that
    /// carries a secret follows redirects only to the same origin (headers go along).
    clients: Arc<[OnceLock<Result<reqwest::Client, String>>; 4]>,
    egress: Option<Arc<Egress>>,
    secrets: Option<Arc<SecretHosts>>,
}

impl Client {
    /// A client with dagloop's TLS set-up (`crate::net`); with `egress`, names are resolved by
    /// the grant's resolver (only granted addresses are connected to), redirects are checked,
    /// and no proxy is used (a proxy would connect on the run's behalf, unchecked). With
    /// `secrets`, a request carrying a `${VAR}` value goes only where the variable is granted.
    pub(super) fn new(egress: Option<Arc<Egress>>, secrets: Option<Arc<SecretHosts>>) -> Client {
        Client {
            clients: Default::default(),
            egress: egress.filter(|e| !e.is_open()),
            secrets: secrets.filter(|s| !s.is_open()),
        }
    }

    /// The client for a request that carries a secret or not, on a standard port or not.
    fn client(&self, carrying: bool, standard_port: bool) -> Result<reqwest::Client, String> {
        // Without a grant to tell them apart, one client serves every request.
        let carrying = carrying && self.secrets.is_some();
        let standard_port = standard_port
            || !self
                .egress
                .as_ref()
                .is_some_and(|e| e.internal_ports_limited());
        let slot = usize::from(carrying) * 2 + usize::from(standard_port);
        self.clients[slot]
            .get_or_init(|| {
                let mut b = crate::net::builder();
                if let Some(e) = &self.egress {
                    b = b
                        .dns_resolver(EgressResolver::new(e.clone(), standard_port))
                        .no_proxy();
                }
                let policy = match &self.egress {
                    Some(e) => Some(redirect_policy(e.clone(), carrying, standard_port)),
                    None if carrying => Some(redirect_policy(
                        Arc::new(Egress::open()),
                        true,
                        standard_port,
                    )),
                    None => None,
                };
                if let Some(p) = policy {
                    b = b.redirect(p);
                }
                b.build().map_err(|e| e.to_string())
            })
            .clone()
    }

    pub(super) fn run(
        &self,
        cfg: HttpConfig,
        tool: String,
        call: Arc<Call>,
        budget: Option<ResultBudget>,
    ) -> ActivityFuture {
        let carried: Vec<String> = std::iter::once(cfg.url.as_str())
            .chain(cfg.headers.values().map(String::as_str))
            .flat_map(super::env_placeholders)
            .map(str::to_string)
            .collect();
        let this = self.clone();
        Box::pin(async move {
            // Read in place from the shared call (the request is built from them, not them).
            let params: &Map<String, Value> = &call.params;
            let (egress, secrets) = (&this.egress, &this.secrets);
            let config_err = |reason: String| ActivityError::Config {
                tool: tool.clone(),
                reason,
            };
            let method = reqwest::Method::from_bytes(cfg.method.to_uppercase().as_bytes())
                .map_err(|_| config_err(format!("unknown HTTP method `{}`", cfg.method)))?;
            let base =
                super::fill_env(&cfg.url).map_err(|e| config_err(format!("`_http.url`: {e}")))?;
            let url = fill_template(&base, params, true);
            if let Some(s) = &secrets {
                // Before anything else looks at the URL: its host may carry a value.
                let refused = |e: crate::grants::SecretHostError| ActivityError::Failed {
                    message: e.to_string(),
                    details: json!({"code": e.code()}),
                };
                if !carried.is_empty() {
                    let parsed = reqwest::Url::parse(&url).map_err(|_| ActivityError::Failed {
                        message: "the request was not sent: its URL does not parse".into(),
                        details: json!({"code": "grant.egress_url"}),
                    })?;
                    s.check(carried.iter().map(String::as_str), &parsed)
                        .map_err(refused)?;
                }
            }
            if let Some(e) = &egress {
                e.check_str(&url).map_err(|e| ActivityError::Failed {
                    message: format!("the request was not sent: {e}"),
                    details: json!({"code": e.code()}),
                })?;
            }
            let used: Vec<String> = params
                .keys()
                .filter(|k| cfg.url.contains(&format!("{{{k}}}")))
                .cloned()
                .collect();
            let rest: Map<String, Value> = params
                .iter()
                .filter(|(k, _)| !used.contains(k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let standard_port =
                reqwest::Url::parse(&url).is_ok_and(|u| crate::grants::egress::standard_port(&u));
            let client = this
                .client(!carried.is_empty(), standard_port)
                .map_err(|e| config_err(format!("the HTTP client could not be built: {e}")))?;
            let mut req = client.request(method.clone(), &url).timeout(
                crate::duration::seconds("_http.timeout_s", cfg.timeout_s.max(0.001))
                    .map_err(|e| config_err(e.to_string()))?,
            );
            for (k, v) in &cfg.headers {
                let v = super::fill_env(v)
                    .map_err(|e| config_err(format!("`_http.headers.{k}`: {e}")))?;
                req = req.header(k, fill_template(&v, params, false));
            }
            let as_query =
                cfg.body == "query" || (cfg.body == "json" && method == reqwest::Method::GET);
            if as_query {
                let pairs: Vec<(String, String)> = rest
                    .iter()
                    .map(|(k, v)| {
                        (
                            k.clone(),
                            v.as_str().map_or_else(|| v.to_string(), str::to_string),
                        )
                    })
                    .collect();
                req = req.query(&pairs);
            } else if cfg.body == "json" {
                req = req.json(&Value::Object(rest));
            } else if cfg.body != "none" {
                return Err(config_err(format!(
                    "unknown body mode `{}` (json, query, none)",
                    cfg.body
                )));
            }
            let resp = req.send().await.map_err(|e| transport(&e, cfg.timeout_s))?;
            let status = resp.status();
            // What the run can still keep: a body longer than this is not read on (a response
            // is counted by the bytes received once it is over, not by its JSON text).
            let keepable = budget.map_or(u64::MAX, |b| b.remaining());
            let mut body = Vec::new();
            let mut stream = resp.bytes_stream();
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|e| transport(&e, cfg.timeout_s))?;
                let len = body.len() + chunk.len();
                if len > cfg.max_bytes && (cfg.max_bytes as u64) <= keepable {
                    return Err(ActivityError::Failed {
                        message: format!("response larger than {} bytes", cfg.max_bytes),
                        details: json!({"code": "http.too_large", "status": status.as_u16()}),
                    });
                }
                if let Some(b) = budget
                    && len as u64 > keepable
                {
                    // Stop here: the rest is never read (the connection is dropped).
                    let take = usize::try_from(keepable.saturating_add(1)).unwrap_or(usize::MAX);
                    let room = take.saturating_sub(body.len()).min(chunk.len());
                    body.extend_from_slice(&chunk[..room]);
                    let (message, details) = b.over(&body, false, !status.is_success());
                    return Err(ActivityError::ResultBound { message, details });
                }
                body.extend_from_slice(&chunk);
            }
            let text = String::from_utf8_lossy(&body).into_owned();
            let value = serde_json::from_str::<Value>(&text).unwrap_or(Value::String(text));
            if status.is_success() {
                Ok(ActivityOutput::from(value))
            } else {
                Err(ActivityError::Failed {
                    message: format!("HTTP {}", status.as_u16()),
                    details: json!({"status": status.as_u16(), "body": value}),
                })
            }
        })
    }
}

fn transport(e: &reqwest::Error, timeout_s: f64) -> ActivityError {
    if e.is_timeout() {
        return ActivityError::Timeout { seconds: timeout_s };
    }
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(refused) = s.downcast_ref::<crate::grants::EgressError>() {
            return ActivityError::Failed {
                message: format!("the request was not sent: {refused}"),
                details: json!({"code": refused.code()}),
            };
        }
        if let Some(refused) = s.downcast_ref::<crate::grants::SecretHostError>() {
            return ActivityError::Failed {
                message: refused.to_string(),
                details: json!({"code": refused.code()}),
            };
        }
        source = s.source();
    }
    let cause = transport_cause(e);
    let kind = if e.is_connect() {
        "connect"
    } else {
        "transport"
    };
    ActivityError::Failed {
        message: format!("HTTP request failed ({kind}): {cause}"),
        details: json!({"code": "http.transport", "cause": cause}),
    }
}

/// The innermost causes of a transport error (connection refused, DNS failure, TLS...), joined;
/// without the URL, which may carry values from the environment.
fn transport_cause(e: &reqwest::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        let text = s.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = s.source();
    }
    if parts.is_empty() {
        parts.push(if e.is_connect() {
            "cannot connect".into()
        } else {
            "the request could not be sent".into()
        });
    }
    parts.join(": ")
}
