//! TLS to the cluster's nodes (`rediss://`): rustls (ring provider) over the node's TCP
//! connection, set up by [`RedisTls`] from the URL's `tls_ca`, `tls_cert` / `tls_key` and
//! `tls_server_name` parameters. The handshake runs inside [`crate::Conn::connect`]'s deadline;
//! a certificate the CA did not sign, or one that does not name the node, fails the connection
//! with the reason ("TLS handshake with 127.0.0.1:7000: invalid peer certificate: ...").

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConnection, StreamOwned};

use crate::error::FailKind;

/// How to speak TLS to every node: whom to trust, what to show, which name to expect.
#[derive(Clone)]
pub struct RedisTls {
    /// The CA certificates (PEM) the nodes' certificates must chain to (`tls_ca=`).
    pub ca: PathBuf,
    /// A client certificate and key (PEM), for nodes started with `tls-auth-clients yes`
    /// (`tls_cert=`, `tls_key=`).
    pub client: Option<(PathBuf, PathBuf)>,
    /// The name every node's certificate must carry (`tls_server_name=`); `None`: the host the
    /// node is reached at (its address in `CLUSTER SLOTS`, usually an IP).
    pub server_name: Option<String>,
    config: Arc<rustls::ClientConfig>,
}

impl PartialEq for RedisTls {
    fn eq(&self, o: &Self) -> bool {
        (&self.ca, &self.client, &self.server_name) == (&o.ca, &o.client, &o.server_name)
    }
}

impl Eq for RedisTls {}

impl std::fmt::Debug for RedisTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTls")
            .field("ca", &self.ca)
            .field("client", &self.client)
            .field("server_name", &self.server_name)
            .finish()
    }
}

fn read_err(what: &str, path: &Path, e: impl std::fmt::Display) -> String {
    format!("{what} {}: {e}", path.display())
}

impl RedisTls {
    /// Reads the files and builds the client configuration; errors name the parameter and file.
    pub fn new(
        ca: PathBuf,
        client: Option<(PathBuf, PathBuf)>,
        server_name: Option<String>,
    ) -> Result<Self, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        let certs = CertificateDer::pem_file_iter(&ca)
            .map_err(|e| read_err("tls_ca", &ca, e))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| read_err("tls_ca", &ca, e))?;
        if certs.is_empty() {
            return Err(read_err("tls_ca", &ca, "holds no PEM CERTIFICATE block"));
        }
        for c in certs {
            roots.add(c).map_err(|e| read_err("tls_ca", &ca, e))?;
        }
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots);
        let config = match &client {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                let chain = CertificateDer::pem_file_iter(cert)
                    .map_err(|e| read_err("tls_cert", cert, e))?
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| read_err("tls_cert", cert, e))?;
                let k =
                    PrivateKeyDer::from_pem_file(key).map_err(|e| read_err("tls_key", key, e))?;
                builder
                    .with_client_auth_cert(chain, k)
                    .map_err(|e| read_err("tls_key", key, format!("does not fit tls_cert: {e}")))?
            }
        };
        if let Some(n) = &server_name {
            ServerName::try_from(n.clone())
                .map_err(|e| format!("tls_server_name '{n}' is not a DNS name or IP: {e}"))?;
        }
        Ok(RedisTls {
            ca,
            client,
            server_name,
            config: Arc::new(config),
        })
    }

    /// The TLS session over `tcp` to the node at `addr` (`host:port`), its handshake done
    /// before `deadline` (the socket's timeouts bound each step).
    pub(crate) fn handshake(
        &self,
        tcp: TcpStream,
        addr: &str,
        deadline: Instant,
    ) -> Result<Stream, (FailKind, String)> {
        let host = match &self.server_name {
            Some(n) => n.as_str(),
            None => addr.rsplit_once(':').map_or(addr, |(h, _)| h),
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let fail = |detail: String| {
            (
                FailKind::Connect,
                format!("TLS handshake with {addr}: {detail}"),
            )
        };
        let name = ServerName::try_from(host.to_string()).map_err(|e| fail(e.to_string()))?;
        let mut conn =
            ClientConnection::new(self.config.clone(), name).map_err(|e| fail(e.to_string()))?;
        let mut tcp = tcp;
        while conn.is_handshaking() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err((
                    FailKind::Timeout,
                    format!("TLS handshake with {addr}: timed out"),
                ));
            }
            let _ = tcp.set_read_timeout(Some(left));
            let _ = tcp.set_write_timeout(Some(left));
            if let Err(e) = conn.complete_io(&mut tcp) {
                return Err(match e.kind() {
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => (
                        FailKind::Timeout,
                        format!("TLS handshake with {addr}: timed out"),
                    ),
                    io::ErrorKind::UnexpectedEof => fail(
                        "the node closed the connection (does it speak TLS on this port, and \
                         does it want a client certificate: tls_cert= / tls_key=?)"
                            .into(),
                    ),
                    _ => fail(e.to_string()),
                });
            }
        }
        Ok(Stream::Tls(Box::new(StreamOwned::new(conn, tcp))))
    }
}

/// A node's byte stream: plain TCP or TLS over it.
#[derive(Debug)]
pub(crate) enum Stream {
    Plain(TcpStream),
    Tls(Box<StreamOwned<ClientConnection, TcpStream>>),
}

impl Stream {
    /// The TCP socket under it (timeouts, the peer's address).
    pub(crate) fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(t) => t,
            Stream::Tls(s) => s.get_ref(),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(t) => t.read(buf),
            Stream::Tls(s) => s.read(buf).map_err(explain),
        }
    }
}

/// A TLS error with what to do about it, where there is something to do: under TLS 1.3 a node
/// that wants a client certificate says so after the handshake, at the first read.
fn explain(e: io::Error) -> io::Error {
    let wants_cert = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        .is_some_and(|r| {
            matches!(
                r,
                rustls::Error::AlertReceived(rustls::AlertDescription::CertificateRequired)
            )
        });
    match wants_cert {
        true => io::Error::new(
            e.kind(),
            format!(
                "the node requires a client certificate (tls_cert= and tls_key= in the URL): {e}"
            ),
        ),
        false => e,
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(t) => t.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }

    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Stream::Plain(t) => t.write_vectored(bufs),
            Stream::Tls(s) => s.write_vectored(bufs),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Plain(t) => t.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}
