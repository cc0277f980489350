//! A minimal HTTP/1.1 client: persistent connections to one address, one request at a time on
//! each, responses read by `Content-Length`.

use std::net::SocketAddr;
use std::sync::Mutex;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[derive(Debug)]
pub struct Pool {
    addr: SocketAddr,
    idle: Mutex<Vec<TcpStream>>,
}

impl Pool {
    pub fn new(addr: SocketAddr) -> Self {
        Pool {
            addr,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// Opens `n` connections ahead of the load, so that the first arrivals do not all pay
    /// for a connect.
    pub async fn warm(&self, n: usize) -> std::io::Result<()> {
        let mut conns = Vec::with_capacity(n);
        for _ in 0..n {
            let c = TcpStream::connect(self.addr).await?;
            c.set_nodelay(true)?;
            conns.push(c);
        }
        self.idle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(conns);
        Ok(())
    }

    /// Sends `request` (head and body) and returns the response's status code.
    pub async fn send(&self, request: &[u8]) -> std::io::Result<u16> {
        let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let mut conn = match idle {
            Some(c) => c,
            None => {
                let c = TcpStream::connect(self.addr).await?;
                c.set_nodelay(true)?;
                c
            }
        };
        conn.write_all(request).await?;
        let (status, keep) = read_response(&mut conn).await?;
        if keep {
            self.idle
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(conn);
        }
        Ok(status)
    }
}

fn bad(msg: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, msg.to_string())
}

/// Reads one response; returns its status and whether the connection stays open.
async fn read_response(conn: &mut TcpStream) -> std::io::Result<(u16, bool)> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        let n = conn.read(&mut chunk).await?;
        if n == 0 {
            return Err(bad("connection closed before the response"));
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
        if buf.len() > 64 << 10 {
            return Err(bad("response head over 64 KB"));
        }
    };
    let head = std::str::from_utf8(&buf[..head_end]).map_err(|_| bad("head is not UTF-8"))?;
    let status: u16 = head
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("no status code"))?;
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
                return Err(bad("chunked responses are not supported"));
            }
        }
    }
    let len = len.ok_or_else(|| bad("no Content-Length"))?;
    let mut have = buf.len() - head_end;
    while have < len {
        let n = conn.read(&mut chunk).await?;
        if n == 0 {
            return Err(bad("connection closed inside the body"));
        }
        have += n;
    }
    Ok((status, keep && have == len))
}
