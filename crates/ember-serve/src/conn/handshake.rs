//! The start of a connection on a TLS listener: its first byte must open a TLS handshake
//! record, and the handshake must end within `header_timeout` (a client that opens connections
//! and never finishes their handshakes holds each for that long at most, as a slow request head
//! would). A client that speaks plain HTTP to the port gets a 400 saying so (not a TLS alert it
//! would show as a broken connection), and the connection closes.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;

use super::io::Socket;

/// The first byte of a TLS handshake record (RFC 8446, 5.1: `ContentType.handshake`).
const TLS_HANDSHAKE: u8 = 0x16;

/// The connection as TLS, or why it closed (the `reason` label of
/// `ember_connections_closed_total`). `http` marks the HTTP listener, which answers a plain
/// HTTP/1 request with a 400 (gRPC's clients would not read it).
pub(super) async fn accept(
    tcp: TcpStream,
    tls: Arc<rustls::ServerConfig>,
    limit: Duration,
    http: bool,
) -> Result<Socket, &'static str> {
    // One deadline for the first byte and the handshake together.
    let deadline = tokio::time::Instant::now() + limit;
    let first = tokio::time::timeout_at(deadline, async {
        let mut b = [0u8; 1];
        tcp.peek(&mut b).await.map(|n| (n > 0).then_some(b[0]))
    })
    .await;
    match first {
        Err(_) => return Err("tls_handshake_timeout"),
        Ok(Err(_)) => return Err("error"),
        Ok(Ok(None)) => return Err("client"),
        Ok(Ok(Some(TLS_HANDSHAKE))) => {}
        Ok(Ok(Some(b))) => {
            if http && b.is_ascii_uppercase() {
                let _ = tokio::time::timeout(Duration::from_secs(1), refuse_plain(tcp)).await;
            }
            return Err("plain_on_tls");
        }
    }
    match tokio::time::timeout_at(deadline, TlsAcceptor::from(tls).accept(tcp)).await {
        Err(_) => Err("tls_handshake_timeout"),
        Ok(Err(e)) => {
            tracing::debug!("TLS handshake failed: {e}");
            Err("tls_handshake_failed")
        }
        Ok(Ok(s)) => Ok(Socket::Tls(Box::new(s))),
    }
}

/// Answers a plain HTTP/1 request on a TLS port, as nginx does.
async fn refuse_plain(mut tcp: TcpStream) {
    let body = serde_json::json!({
        "error": "this port speaks TLS: send the request as https:// (the server was started \
                  with --tls-cert)"
    })
    .to_string();
    let resp = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tcp.write_all(resp.as_bytes()).await;
    let _ = tcp.shutdown().await;
}
