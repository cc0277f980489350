//! `ember loadgen` against a server started with `--tls-cert`: `https://` (and `grpcs://`)
//! URLs, the CA to trust (`--tls-ca`), and a client certificate for mutual TLS
//! (`--tls-cert`, `--tls-key`). The HTTP/1.1 pool and the lean gRPC client connect with the
//! rustls configuration of [`TlsArgs::for_url`]; reqwest (the metadata) and tonic are given
//! the same files in their own forms.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context as _, bail};
use clap::Args;
use ember_serve::tls::{MaybeTls, provider, read_certs, read_key, read_roots};
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;

#[derive(Debug, Clone, Args)]
pub struct TlsArgs {
    /// Trust this CA (PEM) for `https://` / `grpcs://` URLs (the server's --tls-cert was signed
    /// by it). Needed for TLS: no system roots are read.
    #[arg(long, value_name = "FILE")]
    tls_ca: Option<PathBuf>,
    /// Show this certificate (PEM) to a server started with --tls-client-ca.
    #[arg(long, value_name = "FILE", requires = "tls_key", requires = "tls_ca")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
}

/// TLS to one server: the client configuration and the name its certificate must carry.
#[derive(Debug, Clone)]
pub struct Tls {
    config: Arc<rustls::ClientConfig>,
    name: ServerName<'static>,
}

/// Whether `url` asks for TLS (`https://`, `grpcs://`), and its host:port.
pub fn split(url: &str) -> (bool, &str) {
    let (tls, rest) = match url.split_once("://") {
        Some((s, rest)) => (matches!(s, "https" | "grpcs"), rest),
        None => (false, url),
    };
    (tls, rest.split('/').next().unwrap_or_default())
}

impl TlsArgs {
    /// TLS for `url` (`alpn`: what the connection speaks), or `None` for a plain URL. An
    /// `https://` URL without --tls-ca, or --tls-ca with a plain URL, is an error.
    pub fn for_url(&self, url: &str, alpn: &[u8]) -> anyhow::Result<Option<Tls>> {
        let (tls, hostport) = split(url);
        let ca = match (&self.tls_ca, tls) {
            (None, false) => return Ok(None),
            (Some(_), false) => {
                bail!("--tls-ca is for https:// (or grpcs://) URLs; {url} is plain")
            }
            (None, true) => bail!("{url} needs --tls-ca (the CA that signed its certificate)"),
            (Some(ca), true) => ca,
        };
        let roots = read_roots("--tls-ca", ca)?;
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots);
        let mut config = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => builder
                .with_client_auth_cert(read_certs("--tls-cert", cert)?, read_key("--tls-key", key)?)
                .context("--tls-key does not fit --tls-cert")?,
            _ => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![alpn.to_vec()];
        let host = match hostport.rsplit_once(':') {
            Some((h, port)) if port.parse::<u16>().is_ok() => h,
            _ => hostport,
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let name = ServerName::try_from(host.to_string())
            .with_context(|| format!("{host} (in {url}) as a TLS server name"))?;
        Ok(Some(Tls {
            config: Arc::new(config),
            name,
        }))
    }

    /// A reqwest client trusting --tls-ca and showing --tls-cert.
    pub fn reqwest(&self) -> anyhow::Result<reqwest::Client> {
        let mut b = reqwest::Client::builder()
            .tcp_nodelay(true)
            .tls_built_in_root_certs(false);
        if let Some(ca) = &self.tls_ca {
            for c in read_certs("--tls-ca", ca)? {
                b = b.add_root_certificate(reqwest::Certificate::from_der(&c)?);
            }
        }
        if let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) {
            let mut pem =
                std::fs::read(cert).with_context(|| format!("--tls-cert {}", cert.display()))?;
            pem.extend(std::fs::read(key).with_context(|| format!("--tls-key {}", key.display()))?);
            b = b.identity(reqwest::Identity::from_pem(&pem).context("--tls-cert / --tls-key")?);
        }
        Ok(b.build()?)
    }

    /// `endpoint` with TLS where `url` asks for it.
    pub fn tonic(
        &self,
        url: &str,
        endpoint: tonic::transport::Endpoint,
    ) -> anyhow::Result<tonic::transport::Endpoint> {
        let Some(tls) = self.for_url(url, b"h2")? else {
            return Ok(endpoint);
        };
        let read = |p: &PathBuf| std::fs::read(p).with_context(|| p.display().to_string());
        let mut c = tonic::transport::ClientTlsConfig::new();
        if let Some(ca) = &self.tls_ca {
            c = c.ca_certificate(tonic::transport::Certificate::from_pem(read(ca)?));
        }
        if let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) {
            c = c.identity(tonic::transport::Identity::from_pem(
                read(cert)?,
                read(key)?,
            ));
        }
        if let ServerName::DnsName(d) = &tls.name {
            c = c.domain_name(d.as_ref());
        }
        Ok(endpoint.tls_config(c)?)
    }
}

/// A connection to a server: plain TCP, or TLS over it.
pub type Stream = MaybeTls<tokio_rustls::client::TlsStream<TcpStream>>;

/// Connects to `addr`, with TLS where `tls` is given (its handshake done).
pub async fn connect(addr: SocketAddr, tls: Option<&Tls>) -> io::Result<Stream> {
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    match tls {
        None => Ok(Stream::Plain(tcp)),
        Some(t) => {
            let c = tokio_rustls::TlsConnector::from(t.config.clone());
            Ok(Stream::Tls(Box::new(c.connect(t.name.clone(), tcp).await?)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_say_whether_they_ask_for_tls() {
        assert_eq!(split("https://localhost:8443/x"), (true, "localhost:8443"));
        assert_eq!(split("grpcs://h:1"), (true, "h:1"));
        assert_eq!(split("http://127.0.0.1:8080"), (false, "127.0.0.1:8080"));
        assert_eq!(split("grpc://h:1"), (false, "h:1"));
        let none = TlsArgs {
            tls_ca: None,
            tls_cert: None,
            tls_key: None,
        };
        assert!(none.for_url("http://h:1", b"h2").unwrap().is_none());
        let e = none.for_url("https://h:1", b"h2").unwrap_err().to_string();
        assert!(e.contains("needs --tls-ca"), "{e}");
        let ca = TlsArgs {
            tls_ca: Some("ca.pem".into()),
            ..none
        };
        let e = ca.for_url("http://h:1", b"h2").unwrap_err().to_string();
        assert!(e.contains("is plain"), "{e}");
    }
}
