//! TLS on the server's listeners (`ember serve --tls-cert --tls-key [--tls-client-ca]`):
//! rustls, with the ring provider, under the same hyper connections as plain TCP
//! (`conn/mod.rs`). With a client CA, every client must show a certificate that CA signed
//! (mutual TLS); without one, none is asked for.
//!
//! The certificates and key are read once, when the server starts; a file that cannot be read,
//! holds no certificate or key, or a key that does not match its certificate stops the start
//! with an error naming the flag and the file. A TLS listener offers ALPN `h2` and `http/1.1`
//! (gRPC's: `h2`). Its handshake must end within `--header-timeout`, and a client that speaks
//! plain HTTP to it gets a 400 saying the port speaks TLS (the connection then closes).

use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::ServerError;

/// Where a server's certificate chain and key are, and whom it asks for client certificates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsConfig {
    /// The server's certificate chain, PEM (`--tls-cert`): its own certificate first.
    pub cert: PathBuf,
    /// Its private key, PEM: PKCS#8, PKCS#1 (RSA) or SEC1 (EC) (`--tls-key`).
    pub key: PathBuf,
    /// CA certificates, PEM, one of which must have signed every client's certificate
    /// (`--tls-client-ca`; `None`: clients show none).
    pub client_ca: Option<PathBuf>,
}

/// The ALPN protocols of the HTTP listener (HTTP/2 first, as servers offer it).
pub(crate) const ALPN_HTTP: &[&[u8]] = &[b"h2", b"http/1.1"];
/// The ALPN protocol of the gRPC listener.
pub(crate) const ALPN_GRPC: &[&[u8]] = &[b"h2"];

fn bad(flag: &'static str, path: &Path, why: impl std::fmt::Display) -> ServerError {
    ServerError::Tls(format!("{flag} {}: {why}", path.display()))
}

/// Every certificate in the PEM file `path` (`flag` names it in errors); at least one.
pub fn read_certs(
    flag: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, ServerError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(flag, path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(flag, path, e))?;
    if certs.is_empty() {
        return Err(bad(flag, path, "holds no PEM CERTIFICATE block"));
    }
    Ok(certs)
}

/// The private key in the PEM file `path`.
pub fn read_key(flag: &'static str, path: &Path) -> Result<PrivateKeyDer<'static>, ServerError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => bad(
            flag,
            path,
            "holds no private key (a PEM PRIVATE KEY, RSA PRIVATE KEY or EC PRIVATE KEY block)",
        ),
        e => bad(flag, path, e),
    })
}

/// The CA certificates of the PEM file `path` as trust roots.
pub fn read_roots(flag: &'static str, path: &Path) -> Result<RootCertStore, ServerError> {
    let mut roots = RootCertStore::empty();
    for c in read_certs(flag, path)? {
        roots.add(c).map_err(|e| bad(flag, path, e))?;
    }
    Ok(roots)
}

/// The provider every TLS configuration of Ember's uses.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl TlsConfig {
    /// The configurations of the HTTP listener ([`ALPN_HTTP`]) and the gRPC one
    /// ([`ALPN_GRPC`]): the files read and checked once, the two alike but for ALPN.
    pub(crate) fn server_configs(
        &self,
    ) -> Result<(Arc<rustls::ServerConfig>, Arc<rustls::ServerConfig>), ServerError> {
        let certs = read_certs("--tls-cert", &self.cert)?;
        let key = read_key("--tls-key", &self.key)?;
        let builder = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| ServerError::Tls(e.to_string()))?;
        let builder = match &self.client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let roots = read_roots("--tls-client-ca", ca)?;
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(roots.into(), provider())
                        .build()
                        .map_err(|e| bad("--tls-client-ca", ca, e))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config = builder.with_single_cert(certs, key).map_err(|e| {
            ServerError::Tls(format!(
                "the key in --tls-key {} does not fit the certificate in --tls-cert {}: {e}",
                self.key.display(),
                self.cert.display()
            ))
        })?;
        let alpn = |a: &[&[u8]]| a.iter().map(|p| p.to_vec()).collect();
        config.alpn_protocols = alpn(ALPN_GRPC);
        let grpc = Arc::new(config.clone());
        config.alpn_protocols = alpn(ALPN_HTTP);
        Ok((Arc::new(config), grpc))
    }
}

/// A connection's byte stream: plain TCP, or TLS over it (`T`: rustls's server or client
/// stream; the server's connections and `ember loadgen`'s alike).
#[derive(Debug)]
pub enum MaybeTls<T> {
    Plain(TcpStream),
    Tls(Box<T>),
}

/// Calls `$e` on the stream a [`MaybeTls`] holds, pinned as `$io`.
macro_rules! on_stream {
    ($s:expr, $io:ident => $e:expr) => {
        match $s {
            MaybeTls::Plain(t) => {
                let $io = Pin::new(t);
                $e
            }
            MaybeTls::Tls(t) => {
                let $io = Pin::new(&mut **t);
                $e
            }
        }
    };
}

impl<T: AsyncRead + Unpin> AsyncRead for MaybeTls<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        on_stream!(self.get_mut(), s => s.poll_read(cx, buf))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for MaybeTls<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        on_stream!(self.get_mut(), s => s.poll_write(cx, buf))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        on_stream!(self.get_mut(), s => s.poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        on_stream!(self.get_mut(), s => s.poll_shutdown(cx))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        on_stream!(self.get_mut(), s => s.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            MaybeTls::Plain(t) => t.is_write_vectored(),
            MaybeTls::Tls(t) => t.is_write_vectored(),
        }
    }
}
