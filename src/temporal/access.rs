//! How a process reaches its Temporal cluster: plain TCP (the dev server, a cluster inside a
//! private network), TLS (with a CA of its own, mutual TLS with a client certificate) or an
//! API key (Temporal Cloud; TLS implied). Turned into the SDK's connection options here, once,
//! for servers, workers and `run --engine temporal` alike.
//!
//! Deliberately not here: where the options come from (flags and environment: `cli::args`),
//! and any retry or reconnection (the SDK's).

use std::path::PathBuf;

use temporalio_client::{ClientTlsOptions, TlsOptions};

use super::TemporalError;

/// The environment variable an API key is read from (never a flag: it would show in `ps`).
pub const API_KEY_ENV: &str = "TEMPORAL_API_KEY";

/// How to reach the cluster; the default is plain TCP without credentials.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Access {
    /// Use TLS (implied by any of the other fields).
    pub tls: bool,
    /// A PEM file with the CA that signed the server's certificate (else the system's roots).
    pub ca: Option<PathBuf>,
    /// The client's certificate (PEM) for mutual TLS; needs `key`.
    pub cert: Option<PathBuf>,
    /// The client's private key (PEM) for mutual TLS; needs `cert`.
    pub key: Option<PathBuf>,
    /// The name the server's certificate is checked against (else the address's host).
    pub domain: Option<String>,
    /// An API key, sent as a bearer token (Temporal Cloud).
    pub api_key: Option<String>,
}

/// What the SDK is given: TLS options (None: plain TCP) and the API key.
pub(super) struct Resolved {
    pub tls: Option<TlsOptions>,
    pub api_key: Option<String>,
}

impl Access {
    /// True when the connection uses TLS.
    pub fn uses_tls(&self) -> bool {
        self.tls
            || self.ca.is_some()
            || self.cert.is_some()
            || self.key.is_some()
            || self.domain.is_some()
            || self.api_key.is_some()
    }

    /// The SDK's options, the PEM files read. A certificate without its key (or the reverse)
    /// and a file that cannot be read are refused, naming the option.
    pub(super) fn resolve(&self, address: &str) -> Result<Resolved, TemporalError> {
        let refuse = |reason: String| TemporalError::Connect {
            address: address.to_string(),
            reason,
        };
        let read = |what: &str, p: &PathBuf| {
            std::fs::read(p).map_err(|e| refuse(format!("cannot read {what} {}: {e}", p.display())))
        };
        let api_key = self.api_key.clone().filter(|k| !k.trim().is_empty());
        if !self.uses_tls() {
            return Ok(Resolved { tls: None, api_key });
        }
        let client = match (&self.cert, &self.key) {
            (Some(c), Some(k)) => Some(
                ClientTlsOptions::builder()
                    .client_cert(read("--temporal-tls-cert", c)?)
                    .client_private_key(read("--temporal-tls-key", k)?)
                    .build(),
            ),
            (None, None) => None,
            _ => {
                return Err(refuse(
                    "mutual TLS needs both --temporal-tls-cert and --temporal-tls-key".into(),
                ));
            }
        };
        let ca = self
            .ca
            .as_ref()
            .map(|p| read("--temporal-tls-ca", p))
            .transpose()?;
        let tls = TlsOptions::builder()
            .maybe_server_root_ca_cert(ca)
            .maybe_domain(self.domain.clone())
            .maybe_client_tls_options(client)
            .build();
        Ok(Resolved {
            tls: Some(tls),
            api_key,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_by_default_tls_when_asked_or_implied() {
        let plain = Access::default().resolve("h:1").expect("plain");
        assert!(plain.tls.is_none() && plain.api_key.is_none());
        let key = Access {
            api_key: Some("k".into()),
            ..Access::default()
        };
        let r = key.resolve("h:1").expect("api key");
        assert!(r.tls.is_some(), "an API key implies TLS");
        assert_eq!(r.api_key.as_deref(), Some("k"));
        let domain = Access {
            domain: Some("ns.acct.tmprl.cloud".into()),
            ..Access::default()
        };
        let tls = domain.resolve("h:1").expect("tls").tls.expect("tls on");
        assert_eq!(tls.domain.as_deref(), Some("ns.acct.tmprl.cloud"));
    }

    #[test]
    fn mutual_tls_needs_both_files_and_reads_them() {
        let dir = tempfile::tempdir().expect("dir");
        let cert = dir.path().join("c.pem");
        let key = dir.path().join("k.pem");
        std::fs::write(&cert, "CERT").expect("cert");
        std::fs::write(&key, "KEY").expect("key");
        let half = Access {
            cert: Some(cert.clone()),
            ..Access::default()
        };
        let e = half.resolve("h:1").err().expect("refused");
        assert_eq!(e.code(), "temporal.connect");
        assert!(e.to_string().contains("--temporal-tls-key"), "{e}");
        let both = Access {
            cert: Some(cert),
            key: Some(key),
            ..Access::default()
        };
        let tls = both.resolve("h:1").expect("mtls").tls.expect("tls on");
        let client = tls.client_tls_options.expect("client cert");
        assert_eq!(
            (client.client_cert, client.client_private_key),
            (b"CERT".to_vec(), b"KEY".to_vec())
        );
        let missing = Access {
            ca: Some(dir.path().join("nope.pem")),
            ..Access::default()
        };
        let e = missing.resolve("h:1").err().expect("refused");
        assert!(e.to_string().contains("--temporal-tls-ca"), "{e}");
    }
}
