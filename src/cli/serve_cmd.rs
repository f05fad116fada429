//! `dagloop serve` and `dagloop mock-llm`: the HTTP server with the operator's config and
//! principals, and the OpenAI-compatible mock of a scripted model (both need `server`).
//!
//! Deliberately not here: the server itself (`crate::server`).

use super::*;

#[cfg(feature = "server")]
pub(super) async fn mock_llm(script: &FsPath, port: u16) -> Result<i32, CliError> {
    let script = crate::llm::Script::load(script).map_err(|e| CliError::new(e.code(), &e))?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .map_err(|e| {
            CliError::new(
                "cli.bind",
                format!("cannot listen on 127.0.0.1:{port}: {e}"),
            )
        })?;
    let server = crate::llm::serve_mock(script, listener)
        .await
        .map_err(|e| CliError::new("cli.bind", e))?;
    outln!(
        "{}",
        json!({"status": "listening", "base_url": server.base_url()})
    );
    tokio::select! {
        r = server.wait() => r.map_err(|e| CliError::new("cli.serve", e))?,
        _ = tokio::signal::ctrl_c() => {}
    }
    Ok(0)
}

#[cfg(feature = "server")]
pub(super) async fn serve(
    addr: std::net::SocketAddr,
    grants: Arc<crate::grants::Grants>,
    config: Option<&crate::config::Config>,
    allowed_hosts: Vec<String>,
    principals: Option<&FsPath>,
    (store, no_store): (Option<&FsPath>, bool),
    temporal: &super::TemporalArgs,
) -> Result<i32, CliError> {
    #[cfg(feature = "temporal")]
    let temporal =
        (temporal.engine == super::EngineArg::Temporal).then(|| crate::server::TemporalServe {
            address: temporal.address(),
            namespace: temporal.namespace.clone(),
            task_queue: temporal.task_queue.clone(),
            access: temporal.access(),
        });
    #[cfg(not(feature = "temporal"))]
    if temporal.engine == super::EngineArg::Temporal {
        return Err(CliError::new(
            "cli.feature_disabled",
            "this dagloop was built without Temporal; build it with `--features temporal`",
        ));
    }
    let store = match (
        no_store,
        store
            .map(FsPath::to_path_buf)
            .or_else(crate::store::default_path),
    ) {
        (false, Some(p)) => p,
        _ => {
            return Err(CliError::new(
                "cli.no_store",
                "the server keeps its runs in the store (drop --no-store, or give --store PATH)",
            ));
        }
    };
    let token = std::env::var("DAGLOOP_TOKEN")
        .ok()
        .filter(|t| !t.is_empty());
    // Principals and Host names: the operator's config, then the command line's.
    let mut principals = match principals {
        Some(p) => read_principals(p)?,
        None => Vec::new(),
    };
    let mut allowed_hosts = allowed_hosts;
    if let Some(c) = config {
        for (i, v) in c.principals.iter().enumerate() {
            let p = serde_json::from_value(v.clone()).map_err(|e| {
                CliError::new(
                    "cli.bad_principals",
                    format!("the config's principals[{i}]: {e}"),
                )
            })?;
            principals.insert(i, p);
        }
        allowed_hosts.extend(c.allowed_hosts.iter().cloned());
    }
    let base_dir = std::env::current_dir().unwrap_or_default();
    let agents = config
        .map(|c| {
            c.agents
                .keys()
                .filter_map(|name| Some((name.clone(), c.agent_goal(name)?)))
                .collect()
        })
        .unwrap_or_default();
    let agent_models = config
        .map(|c| {
            c.agents
                .keys()
                .map(|name| (name.clone(), c.agent_models(name)))
                .collect()
        })
        .unwrap_or_default();
    let floor = match config {
        Some(c) => c.floor().map_err(|e| CliError::new("config.invalid", e))?,
        None => Default::default(),
    };
    crate::server::serve(crate::server::ServeOptions {
        addr,
        store,
        token,
        principals,
        allowed_hosts,
        grants,
        agents,
        agent_models,
        floor,
        separate_duties: config.is_some_and(|c| c.approval.separate_duties),
        base_dir,
        webhook: config.and_then(|c| c.notify.webhook.clone()),
        retention: config
            .and_then(|c| c.store.retention().ok())
            .unwrap_or_default(),
        active_runs: config
            .and_then(|c| c.limits.active_runs)
            .unwrap_or(crate::server::DEFAULT_ACTIVE_RUNS),
        #[cfg(feature = "temporal")]
        temporal,
    })
    .await
    .map_err(|e| CliError::new(e.code(), e))?;
    Ok(0)
}

/// `--principals FILE`: a JSON array of principals.
#[cfg(feature = "server")]
pub(super) fn read_principals(
    path: &FsPath,
) -> Result<Vec<crate::server::PrincipalConfig>, CliError> {
    let bad = |reason: String| {
        CliError::new(
            "cli.bad_principals",
            format!("{}: {reason}", path.display()),
        )
    };
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    serde_json::from_str(&text).map_err(|e| bad(e.to_string()))
}

#[cfg(not(feature = "server"))]
pub(super) async fn serve(
    _addr: std::net::SocketAddr,
    _grants: Arc<crate::grants::Grants>,
    _config: Option<&crate::config::Config>,
    _allowed_hosts: Vec<String>,
    _principals: Option<&FsPath>,
    _store: (Option<&FsPath>, bool),
    _temporal: &super::TemporalArgs,
) -> Result<i32, CliError> {
    Err(CliError::new(
        "cli.feature_disabled",
        "serve needs the `server` feature",
    ))
}

#[cfg(not(feature = "server"))]
pub(super) async fn mock_llm(_script: &FsPath, _port: u16) -> Result<i32, CliError> {
    Err(CliError::new(
        "cli.feature_disabled",
        "mock-llm needs the `server` feature",
    ))
}
