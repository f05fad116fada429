//! The one place dagloop builds HTTP clients (model providers, the `http` activity, MCP servers
//! over streamable HTTP), so they all speak TLS the same way.
//!
//! TLS is rustls on the `ring` provider with the Mozilla root certificates compiled in
//! (`webpki-roots`): nothing depends on the machine's certificate store, and no process-wide
//! crypto provider is installed (a program embedding dagloop keeps that choice for itself).
//!
//! Deliberately not here: timeouts, retries and headers, which belong to each caller.

use std::sync::{Arc, LazyLock};

/// The rustls configuration every client shares.
static TLS: LazyLock<Option<rustls::ClientConfig>> = LazyLock::new(|| {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .ok()
        .map(|b| b.with_root_certificates(roots).with_no_client_auth())
});

/// A client builder with dagloop's TLS set up; callers add their own settings, then `build`.
pub fn builder() -> reqwest::ClientBuilder {
    let b = reqwest::Client::builder();
    match TLS.as_ref() {
        Some(tls) => b.tls_backend_preconfigured(tls.clone()),
        // ring supports every default protocol version, so this is not reached; a client
        // without TLS still serves http:// and fails https:// requests with a clear error.
        None => b,
    }
}

/// A client with dagloop's defaults.
pub fn client() -> Result<reqwest::Client, reqwest::Error> {
    builder().build()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_shared_tls_configuration_builds() {
        assert!(super::TLS.is_some());
        assert!(super::client().is_ok());
    }
}
