//! A minimal HTTP/1.1 client: persistent connections to one address, one request at a time on
//! each, responses read by `Content-Length`.

use std::net::SocketAddr;
use std::sync::Mutex;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::tls::{Stream, Tls, connect};

#[derive(Debug)]
pub struct Pool {
    addr: SocketAddr,
    /// TLS on each connection (an `https://` URL).
    tls: Option<Tls>,
    idle: Mutex<Vec<Stream>>,
}

impl Pool {
    pub fn new(addr: SocketAddr, tls: Option<Tls>) -> Self {
        Pool {
            addr,
            tls,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// Opens `n` connections ahead of the load, so that the first arrivals do not all pay
    /// for a connect.
    pub async fn warm(&self, n: usize) -> std::io::Result<()> {
        let mut conns = Vec::with_capacity(n);
        for _ in 0..n {
            conns.push(connect(self.addr, self.tls.as_ref()).await?);
        }
        self.idle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(conns);
        Ok(())
    }

    /// Sends `request` (head and body) and returns the response's status code, and its body
    /// into `body` where one is given. A kept-alive connection the server closed meanwhile (its
    /// idle timeout) is replaced by a new one once, as HTTP clients do when a reused connection
    /// fails before any response byte.
    pub async fn send(
        &self,
        request: &[u8],
        mut body: Option<&mut Vec<u8>>,
    ) -> std::io::Result<u16> {
        let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        if let Some(conn) = idle {
            match self.exchange(conn, request, body.as_deref_mut()).await {
                Err(Exchange::BeforeResponse(_)) => {}
                Err(Exchange::After(e)) => return Err(e),
                Ok(status) => return Ok(status),
            }
        }
        let c = connect(self.addr, self.tls.as_ref()).await?;
        self.exchange(c, request, body).await.map_err(|e| match e {
            Exchange::BeforeResponse(e) | Exchange::After(e) => e,
        })
    }

    async fn exchange(
        &self,
        mut conn: Stream,
        request: &[u8],
        body: Option<&mut Vec<u8>>,
    ) -> Result<u16, Exchange> {
        conn.write_all(request)
            .await
            .map_err(Exchange::BeforeResponse)?;
        let (status, keep) = read_response(&mut conn, body).await?;
        if keep {
            self.idle
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(conn);
        }
        Ok(status)
    }
}

/// How an exchange failed: before any byte of the response (the request may be sent again on
/// a new connection), or after.
enum Exchange {
    BeforeResponse(std::io::Error),
    After(std::io::Error),
}

fn bad(msg: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, msg.to_string())
}

/// Reads one response (its body into `body` where one is given); returns its status and whether
/// the connection stays open.
async fn read_response(
    conn: &mut Stream,
    mut body: Option<&mut Vec<u8>>,
) -> Result<(u16, bool), Exchange> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        let n = match conn.read(&mut chunk).await {
            Ok(n) => n,
            Err(e) if buf.is_empty() => return Err(Exchange::BeforeResponse(e)),
            Err(e) => return Err(Exchange::After(e)),
        };
        if n == 0 && buf.is_empty() {
            return Err(Exchange::BeforeResponse(bad(
                "connection closed before the response",
            )));
        }
        if n == 0 {
            return Err(Exchange::After(bad("connection closed inside the head")));
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
        if buf.len() > 64 << 10 {
            return Err(Exchange::After(bad("response head over 64 KB")));
        }
    };
    let head = std::str::from_utf8(&buf[..head_end])
        .map_err(|_| Exchange::After(bad("head is not UTF-8")))?;
    let status: u16 = head
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| Exchange::After(bad("no status code")))?;
    let mut len = None;
    let mut keep = true;
    for line in head.lines().skip(1) {
        if let Some((k, v)) = line.split_once(':') {
            let v = v.trim();
            if k.eq_ignore_ascii_case("content-length") {
                len = v.parse::<usize>().ok();
            } else if k.eq_ignore_ascii_case("connection") && v.eq_ignore_ascii_case("close") {
                keep = false;
            } else if k.eq_ignore_ascii_case("transfer-encoding") {
                return Err(Exchange::After(bad("chunked responses are not supported")));
            }
        }
    }
    let len = len.ok_or_else(|| Exchange::After(bad("no Content-Length")))?;
    let first = &buf[head_end..];
    if let Some(b) = body.as_deref_mut() {
        b.clear();
        b.extend_from_slice(&first[..first.len().min(len)]);
    }
    let mut have = first.len();
    while have < len {
        let n = conn.read(&mut chunk).await.map_err(Exchange::After)?;
        if n == 0 {
            return Err(Exchange::After(bad("connection closed inside the body")));
        }
        if let Some(b) = body.as_deref_mut() {
            b.extend_from_slice(&chunk[..n.min(len - have)]);
        }
        have += n;
    }
    Ok((status, keep && have == len))
}
