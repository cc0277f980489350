//! `ember serve`'s flags for who may reach what: TLS on the listeners, API groups restricted
//! by a header, `/metrics` on an address of its own.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::bail;
use clap::Args;
use ember_serve::{Restrictions, TlsConfig};

/// TLS, restricted API groups, the metrics address (see `docs/security.md`).
#[derive(Debug, Clone, Args)]
pub struct SecurityArgs {
    /// Serve every listener (HTTP, gRPC) over TLS with this certificate chain (PEM, the
    /// server's certificate first). Needs --tls-key.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Mutual TLS: every client must show a certificate signed by one of these CAs (PEM);
    /// a client without one fails the handshake.
    #[arg(long, value_name = "FILE")]
    tls_client_ca: Option<PathBuf>,
    /// Serve only requests carrying header KEY with VALUE for these API groups (comma-separated:
    /// health, metadata, model-config, inference, model-repository, statistics, metrics, trace,
    /// logging, shared-memory), on HTTP and gRPC alike; others get 403 / PERMISSION_DENIED.
    /// Repeat for groups with other keys. Triton's --http-restricted-api.
    #[arg(long, value_name = "GROUPS:KEY=VALUE", value_parser = check_restriction)]
    restricted_api: Vec<String>,
    /// Serve GET /metrics on this address alone (the HTTP listener then answers it 404), e.g. an
    /// internal interface for Prometheus. Same TLS as the other listeners.
    #[arg(long, value_name = "ADDR")]
    metrics_addr: Option<SocketAddr>,
}

fn check_restriction(s: &str) -> Result<String, String> {
    Restrictions::default().add(s)?;
    Ok(s.to_string())
}

impl SecurityArgs {
    /// The restricted API groups.
    pub fn restricted(&self) -> anyhow::Result<Restrictions> {
        let mut r = Restrictions::default();
        for spec in &self.restricted_api {
            r.add(spec)
                .map_err(|e| anyhow::anyhow!("--restricted-api: {e}"))?;
        }
        Ok(r)
    }

    /// `--metrics-addr`.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// The listeners' TLS, if asked for.
    pub fn tls(&self) -> anyhow::Result<Option<TlsConfig>> {
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Ok(Some(TlsConfig {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: self.tls_client_ca.clone(),
            })),
            (None, None) if self.tls_client_ca.is_some() => {
                bail!(
                    "--tls-client-ca needs --tls-cert and --tls-key (the server's own certificate)"
                )
            }
            _ => Ok(None),
        }
    }
}
