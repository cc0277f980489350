//! The socket of one connection, as hyper reads it: every read tells the connection's state
//! (the start of a request head after idle), the first bytes tell HTTP/2 (its preface) from
//! HTTP/1, and an HTTP/1 request head longer than `max_header_bytes` is answered 431 with a
//! JSON body here, before hyper has buffered it (hyper's own answer to a head over its buffer
//! has no body). Under TLS ([`Socket::Tls`]) it watches the decrypted bytes.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::state::ConnState;
use crate::metrics as m;
use crate::tls::MaybeTls;

/// A look at a connection's socket for bytes the client sent that nobody has read yet (hyper
/// reads a socket only when its task runs; a stopping connection asks the kernel).
#[derive(Debug)]
pub(crate) struct Unread {
    #[cfg(unix)]
    fd: std::os::fd::RawFd,
}

impl Unread {
    /// The look for `tcp`; valid while the stream is open (the connection that owns it).
    pub(crate) fn of(tcp: &TcpStream) -> Unread {
        Unread {
            #[cfg(unix)]
            fd: std::os::fd::AsRawFd::as_raw_fd(tcp),
        }
    }

    /// Whether bytes wait unread in the socket (none are taken; never blocks).
    pub(crate) fn has_bytes(&self) -> bool {
        #[cfg(unix)]
        {
            let mut byte = 0u8;
            // SAFETY: `fd` is the socket of a stream the caller's connection still owns (a
            // connection's watchdog asks only while it holds the connection), so it is open and
            // is this socket; recv with MSG_PEEK | MSG_DONTWAIT writes at most one byte into the
            // local `byte`, takes nothing off the socket and does not block.
            let n = unsafe {
                libc::recv(
                    self.fd,
                    (&mut byte as *mut u8).cast(),
                    1,
                    libc::MSG_PEEK | libc::MSG_DONTWAIT,
                )
            };
            n > 0
        }
        #[cfg(not(unix))]
        false
    }
}

/// The client preface every HTTP/2 connection starts with.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// A connection's byte stream: plain TCP, or TLS over it.
pub(crate) type Socket = MaybeTls<tokio_rustls::server::TlsStream<TcpStream>>;

impl Socket {
    /// Writes `bytes` now if the socket takes them without waiting (best effort: an answer
    /// sent just before the connection closes).
    fn write_now(&mut self, cx: &mut Context<'_>, bytes: &[u8]) {
        match self {
            Socket::Plain(tcp) => {
                let _ = tcp.try_write(bytes);
            }
            Socket::Tls(tls) => {
                let mut tls = Pin::new(&mut **tls);
                if let Poll::Ready(Ok(_)) = tls.as_mut().poll_write(cx, bytes) {
                    let _ = tls.poll_flush(cx);
                }
            }
        }
    }
}

/// A connection's stream that reports its reads to the connection's state.
#[derive(Debug)]
pub(crate) struct WatchedStream {
    tcp: Socket,
    state: Arc<ConnState>,
    /// Bytes of the preface matched so far; `None` once decided.
    preface: Option<usize>,
    head: HeadScan,
}

/// Where the HTTP/1 request head being read stands.
#[derive(Debug)]
struct HeadScan {
    limit: usize,
    /// Bytes of the head so far.
    bytes: usize,
    /// How much of the blank line (`\r\n\r\n`) ending a head the last bytes matched.
    matched: usize,
    /// The head ended; `Some(begun)` holds the connection's request count then (the bytes after
    /// it are its body until a request starts).
    ended_at: Option<u64>,
}

impl HeadScan {
    /// Scans `bytes` of a head; returns whether it is now over the limit.
    fn scan(&mut self, bytes: &[u8]) -> bool {
        for (i, &b) in bytes.iter().enumerate() {
            self.matched = match (self.matched, b) {
                (0 | 2, b'\r') => self.matched + 1,
                (1 | 3, b'\n') => self.matched + 1,
                (_, b'\r') => 1,
                _ => 0,
            };
            if self.matched == 4 {
                self.bytes += i + 1;
                return self.bytes > self.limit;
            }
        }
        self.bytes += bytes.len();
        self.bytes > self.limit
    }
}

impl WatchedStream {
    pub(crate) fn new(tcp: Socket, state: Arc<ConnState>, max_header_bytes: usize) -> Self {
        WatchedStream {
            tcp,
            state,
            preface: Some(0),
            head: HeadScan {
                limit: max_header_bytes,
                bytes: 0,
                matched: 0,
                ended_at: None,
            },
        }
    }

    /// Looks for the HTTP/2 preface in the first bytes read.
    fn sniff(&mut self, bytes: &[u8]) {
        let Some(seen) = self.preface else {
            return;
        };
        let n = bytes.len().min(H2_PREFACE.len() - seen);
        if bytes[..n] != H2_PREFACE[seen..seen + n] {
            self.preface = None;
        } else if seen + n == H2_PREFACE.len() {
            self.state.set_http2();
            self.preface = None;
        } else {
            self.preface = Some(seen + n);
        }
    }

    /// Follows HTTP/1 request heads read while no request is in flight; true when one is over
    /// the limit.
    fn head_too_large(&mut self, bytes: &[u8]) -> bool {
        if self.state.is_http2() || self.state.busy() || self.state.is_closing() {
            return false;
        }
        let head = &mut self.head;
        if let Some(at) = head.ended_at {
            if self.state.begun() == at {
                // The body of a request hyper has not started yet.
                return false;
            }
            *head = HeadScan {
                limit: head.limit,
                bytes: 0,
                matched: 0,
                ended_at: None,
            };
        }
        let over = head.scan(bytes);
        if head.matched == 4 {
            head.ended_at = Some(self.state.begun());
        }
        over
    }

    /// Answers 431 with a JSON body (best effort: a small write to a fresh socket buffer).
    fn refuse_head(&mut self, cx: &mut Context<'_>) -> io::Error {
        metrics::counter!(m::REQUESTS_REFUSED, "reason" => "header_too_large").increment(1);
        let body = serde_json::json!({
            "error": format!(
                "the request head is over the server's limit of {} bytes (--max-header-bytes)",
                self.head.limit
            )
        })
        .to_string();
        let resp = format!(
            "HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n\
             content-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        self.tcp.write_now(cx, resp.as_bytes());
        io::Error::new(io::ErrorKind::InvalidData, "request head too large")
    }
}

impl AsyncRead for WatchedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.tcp).poll_read(cx, buf);
        let after = buf.filled().len();
        if after > before {
            let me = &mut *self;
            let new = &buf.filled()[before..after];
            me.sniff(new);
            if me.head_too_large(new) {
                return Poll::Ready(Err(me.refuse_head(cx)));
            }
            me.state.on_read();
        }
        r
    }
}

impl AsyncWrite for WatchedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(limit: usize, chunks: &[&[u8]]) -> (bool, usize, bool) {
        let mut h = HeadScan {
            limit,
            bytes: 0,
            matched: 0,
            ended_at: None,
        };
        let mut over = false;
        for c in chunks {
            over |= h.scan(c);
            if h.matched == 4 {
                break;
            }
        }
        (over, h.bytes, h.matched == 4)
    }

    #[test]
    fn a_head_ends_at_its_blank_line_even_across_reads() {
        let head = b"POST /x HTTP/1.1\r\nHost: a\r\n\r\nBODY";
        assert_eq!(scan(100, &[head]), (false, head.len() - 4, true));
        let (a, b) = head.split_at(27);
        assert_eq!(scan(100, &[a, b]), (false, head.len() - 4, true));
        // "\r\n\r" then "\n": split inside the blank line.
        let (a, b) = head.split_at(29);
        assert_eq!(scan(100, &[a, b]), (false, head.len() - 4, true));
        // Lone CRs or LFs do not end it.
        assert!(!scan(100, &[b"GET / HTTP/1.1\r\r\n\n\r\nx"]).2);
        // A whole head over the limit, in one read.
        let mut big = b"GET / HTTP/1.1\r\nX: ".to_vec();
        big.extend_from_slice(&[b'a'; 100]);
        big.extend_from_slice(b"\r\n\r\n");
        assert_eq!(scan(100, &[&big]), (true, big.len(), true));
        // A head with no end, over the limit.
        let long = vec![b'a'; 101];
        assert_eq!(scan(100, &[&long]), (true, 101, false));
        assert_eq!(scan(100, &[&long[..60], &long[60..]]), (true, 101, false));
    }

    /// `Unread::has_bytes` agrees with the safe `peek` of the standard library (on a second
    /// descriptor of the same socket, what the server avoids: it would double the descriptors
    /// a connection costs) before any byte, while bytes wait, and once they are read.
    #[tokio::test]
    async fn unread_bytes_are_seen_without_being_taken() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (mut server, _) = listener.accept().await.unwrap();
        let unread = Unread::of(&server);
        // The reference: a second, non-blocking descriptor of the server's socket.
        let reference = {
            use std::os::fd::AsFd;
            let fd = server.as_fd().try_clone_to_owned().unwrap();
            let r = std::net::TcpStream::from(fd);
            r.set_nonblocking(true).unwrap();
            r
        };
        let safe = |r: &std::net::TcpStream| {
            let mut b = [0u8; 1];
            matches!(r.peek(&mut b), Ok(n) if n > 0)
        };
        assert!(!unread.has_bytes() && !safe(&reference));
        client.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        // Loopback delivery is not promised to be done when the write returns: wait for it.
        let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !safe(&reference) {
            assert!(std::time::Instant::now() < end, "the bytes never arrived");
            tokio::task::yield_now().await;
        }
        for _ in 0..3 {
            assert!(unread.has_bytes(), "bytes wait, and a look takes none");
        }
        let mut buf = [0u8; 18];
        server.read_exact(&mut buf).await.unwrap();
        assert!(!unread.has_bytes() && !safe(&reference));
    }
}
