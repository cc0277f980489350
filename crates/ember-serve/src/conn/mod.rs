//! The connection layer: accepting connections, holding each to its timeouts, capping how many
//! are open, and ending them all when the server stops. HTTP/1.1, HTTP/2 and gRPC alike.
//!
//! - **Timeouts** ([`ConnConfig`]): a request head must arrive within `header_timeout` of its
//!   first byte (slow headers); a body must keep up `min_body_rate` after `body_timeout`
//!   (`body.rs`); a connection with nothing in flight closes after `idle_timeout`; HTTP/2
//!   connections are pinged every `h2_ping_interval` and closed when a ping goes unanswered for
//!   `h2_ping_timeout`. Each connection's watchdog (its task) sleeps until the deadline its state
//!   (`state.rs`) gives, and its reader (`io.rs`) marks the bytes as they come.
//! - **The cap**: at most `max_connections` open (within the descriptors the process has; its
//!   soft limit is raised to the hard one at start, `limits.rs`). At the cap, the oldest idle
//!   connection is closed to make room; with none idle, the new one is refused (`open.rs`, one
//!   lock for admitting and registering). When the OS runs out of descriptors anyway, accepting
//!   pauses and an idle connection is closed.
//! - **Refusals before work**: on the HTTP listener, a `Content-Length` over the body limit is
//!   refused from the header (400, the body is never read), and request heads over
//!   `max_header_bytes` get 431 with a JSON body.
//! - **Stopping** ([`OpenConns::stop_all`]): nothing a client sent before the stop is lost.
//!   Connections with nothing in flight and nothing unread in their socket close at once; a
//!   request already in the socket, or with its head or body being read, is read and answered
//!   (heads and bodies still held to their timeouts); every answer from then on says
//!   `Connection: close` (HTTP/2: GOAWAY) and the connection closes after it. The server waits
//!   for them up to its grace period, then drops what is left.
//!
//! Every refusal and close is counted in `/metrics` (`ember_connections_*`).

mod body;
mod budget;
mod handshake;
mod io;
mod limits;
mod open;
mod state;

pub use body::{OverBudget, SlowBody};
pub(crate) use budget::Budget;
pub(crate) use limits::{connection_cap, listen, raise_fd_limit};
use open::Admit;
pub(crate) use open::OpenConns;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, Response, StatusCode, header};
use axum::response::IntoResponse;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tower::ServiceExt;

use crate::error::ServeError;
use crate::metrics as m;
use crate::restrict::Restrictions;
use body::MinRateBody;
use budget::Share;
use io::{Socket, WatchedStream};
use state::{Close, ConnState};

/// How connections are held (see the module documentation); every field is a flag of
/// `ember serve`.
#[derive(Debug, Clone)]
pub struct ConnConfig {
    /// Longest a request head may take from its first byte.
    pub header_timeout: Duration,
    /// Longest a connection may stay open with nothing in flight.
    pub idle_timeout: Duration,
    /// Grace period before a request body must keep up `min_body_rate`.
    pub body_timeout: Duration,
    /// Bytes per second a request body must average after `body_timeout` (0: no minimum).
    pub min_body_rate: u64,
    /// HTTP/2 keep-alive pings (`None`: no pings).
    pub h2_ping_interval: Option<Duration>,
    /// Longest an HTTP/2 ping may go unanswered.
    pub h2_ping_timeout: Duration,
    /// Most connections open at once (also bounded by the process's descriptors).
    pub max_connections: usize,
    /// Largest request head (HTTP/1 request line and headers), in bytes.
    pub max_header_bytes: usize,
    /// Longest the server waits for requests in flight when it stops.
    pub shutdown_grace: Duration,
    /// Most bytes of request bodies held at once, across connections (each until its request
    /// is answered); a request past it gets 503.
    pub max_inflight_bytes: usize,
}

impl Default for ConnConfig {
    fn default() -> Self {
        ConnConfig {
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            body_timeout: Duration::from_secs(10),
            min_body_rate: 4096,
            h2_ping_interval: Some(Duration::from_secs(30)),
            h2_ping_timeout: Duration::from_secs(10),
            max_connections: 16_384,
            max_header_bytes: 32 << 10,
            shutdown_grace: Duration::from_secs(5),
            max_inflight_bytes: 256 << 20,
        }
    }
}

/// A listener's connections and the service behind them.
#[derive(Debug, Clone)]
pub(crate) struct Listener {
    pub(crate) router: axum::Router,
    pub(crate) cfg: Arc<ConnConfig>,
    pub(crate) open_conns: Arc<OpenConns>,
    /// The body limit refused from `Content-Length` (the HTTP listener; gRPC has its own).
    pub(crate) max_body_bytes: Option<usize>,
    /// The server-wide in-flight body budget.
    pub(crate) budget: Arc<Budget>,
    /// The gRPC listener (body failures are gRPC statuses).
    pub(crate) grpc: bool,
    /// TLS on this listener (`--tls-cert`).
    pub(crate) tls: Option<Arc<rustls::ServerConfig>>,
    /// API groups restricted to requests carrying a header (`--restricted-api`).
    pub(crate) restricted: Arc<Restrictions>,
}

impl Listener {
    /// Accepts connections on `listener` until `stop` turns true.
    pub(crate) fn spawn(
        self,
        listener: TcpListener,
        mut stop: watch::Receiver<bool>,
    ) -> tokio::task::JoinHandle<std::io::Result<()>> {
        let mut builder = Builder::new(TokioExecutor::new());
        builder
            .http1()
            .max_buf_size(self.cfg.max_header_bytes.max(8192) * 2 + 8192)
            .max_headers(200);
        builder
            .http2()
            .timer(TokioTimer::new())
            .keep_alive_interval(self.cfg.h2_ping_interval)
            .keep_alive_timeout(self.cfg.h2_ping_timeout)
            .max_header_list_size(self.cfg.max_header_bytes.max(8192) as u32);
        let builder = Arc::new(builder);
        tokio::spawn(async move {
            loop {
                let stopped = async {
                    let _ = stop.wait_for(|&s| s).await;
                };
                tokio::select! {
                    _ = stopped => return Ok(()),
                    r = listener.accept() => match r {
                        Ok((tcp, _)) => self.accept(tcp, &builder),
                        Err(e) => self.accept_error(e).await,
                    },
                }
            }
        })
    }

    fn accept(&self, tcp: TcpStream, builder: &Arc<Builder<TokioExecutor>>) {
        let state = Arc::new(ConnState::new());
        let st = state.clone();
        let admitted = self.open_conns.enter(state, |id| {
            let service = ConnService {
                listener: self.clone(),
                state: st.clone(),
            };
            let (cfg, builder) = (self.cfg.clone(), builder.clone());
            let (tls, http) = (self.tls.clone(), !self.grpc);
            let open_conns = self.open_conns.clone();
            metrics::gauge!(m::CONNECTIONS_OPEN).increment(1.0);
            let task = tokio::spawn(async move {
                let _ = tcp.set_nodelay(true);
                let socket = match &tls {
                    None => Ok(Socket::Plain(tcp)),
                    Some(tls) => {
                        handshake::accept(tcp, tls.clone(), cfg.header_timeout, http).await
                    }
                };
                let reason = match socket {
                    Ok(s) => serve_connection(s, st.clone(), &builder, service, &cfg).await,
                    Err(reason) => reason,
                };
                metrics::counter!(m::CONNECTIONS_CLOSED, "reason" => reason).increment(1);
                open_conns.remove(id, &st);
                metrics::gauge!(m::CONNECTIONS_OPEN).decrement(1.0);
            });
            task.abort_handle()
        });
        if admitted == Admit::No {
            // The connection (moved into the closure, never called) is closed as it drops.
            metrics::counter!(m::CONNECTIONS_REFUSED, "reason" => "max_connections").increment(1);
        }
    }

    /// An accept that failed: out of descriptors (pause, and close an idle connection), or a
    /// connection that died in the backlog (go on).
    async fn accept_error(&self, e: std::io::Error) {
        let out_of_fds = matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE));
        let reason = if out_of_fds {
            "fd_exhausted"
        } else {
            "accept_error"
        };
        metrics::counter!(m::CONNECTIONS_REFUSED, "reason" => reason).increment(1);
        if out_of_fds {
            self.open_conns.evict_oldest_idle();
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Serves one connection until it ends; returns why (the `reason` label).
async fn serve_connection(
    tcp: Socket,
    state: Arc<ConnState>,
    builder: &Builder<TokioExecutor>,
    service: ConnService,
    cfg: &ConnConfig,
) -> &'static str {
    let socket = io::Unread::of(match &tcp {
        Socket::Plain(t) => t,
        Socket::Tls(t) => t.get_ref().0,
    });
    let io = TokioIo::new(WatchedStream::new(tcp, state.clone(), cfg.max_header_bytes));
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    let why = loop {
        let deadline = match state.check(cfg) {
            Ok(d) => d,
            // A request that has reached the server (in its socket, its head or its body being
            // read) is served before the connection closes; the grace period bounds it.
            Err(Close::Shutdown) if arriving(&state, &socket) => match state.deadline(cfg) {
                Ok(d) => d,
                Err(why) => break why,
            },
            Err(why) => break why,
        };
        let sleep = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            r = conn.as_mut() => return if r.is_ok() { "client" } else { "error" },
            _ = sleep => {}
            _ = state.changed.notified() => {}
        }
    };
    if why != Close::Header {
        // Idle HTTP/1 connections close now; one with a request in flight answers it with
        // `Connection: close` and then closes (HTTP/2: GOAWAY, the streams begun are answered).
        conn.as_mut().graceful_shutdown();
        // The server's grace period bounds what is in flight when it stops.
        let limit = match why {
            Close::Shutdown => Duration::MAX,
            _ => Duration::from_secs(1),
        };
        let _ = tokio::time::timeout(limit, conn).await;
    }
    why.label()
}

/// Whether a request is on its way into a stopping connection: its head or body being read,
/// or (HTTP/1, nothing in flight) bytes waiting unread in the socket, which hyper would drop
/// if the connection closed now. HTTP/2's own graceful stop answers the streams already sent.
fn arriving(state: &ConnState, socket: &io::Unread) -> bool {
    state.receiving()
        || state.head_in_progress()
        || (!state.busy() && !state.is_http2() && socket.has_bytes())
}

/// The service of one connection: marks requests in flight, refuses oversize bodies and heads
/// before any work, holds bodies to their minimum rate, and hands the request to the router.
#[derive(Debug, Clone)]
struct ConnService {
    listener: Listener,
    state: Arc<ConnState>,
}

impl hyper::service::Service<Request<Incoming>> for ConnService {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        let guard = self.state.begin();
        let l = &self.listener;
        let share = Arc::new(Share::new(l.budget.clone()));
        let refusal = refuse_early(&req, l.max_body_bytes, l.cfg.max_header_bytes)
            .or_else(|| refuse_restricted(&req, &l.restricted, l.grpc))
            .or_else(|| refuse_over_budget(&req, &share, l.grpc));
        if let Some(refusal) = refusal {
            return Box::pin(async move {
                drop(guard);
                Ok(refusal)
            });
        }
        let (grace, rate) = (l.cfg.body_timeout, l.cfg.min_body_rate);
        let (state, body_share) = (self.state.clone(), share.clone());
        let grpc = l.grpc;
        let req = req.map(|b| Body::new(MinRateBody::new(b, state, grace, rate, body_share, grpc)));
        let router = l.router.clone();
        let http1 = !self.state.is_http2();
        let state = self.state.clone();
        Box::pin(async move {
            let mut r = router.oneshot(req).await;
            // The request's bytes count until its answer is made.
            drop((guard, share));
            // Answered before its body was read (a refusal on the head, a model not found): the
            // connection closes after the answer, and says so, rather than reading a body only
            // to drop it; what it still reads is that body, not a request head.
            if let Ok(resp) = &mut r
                && http1
                && !state.body_ended()
            {
                resp.headers_mut().insert(
                    header::CONNECTION,
                    header::HeaderValue::from_static("close"),
                );
                state.closing();
            }
            r
        })
    }
}

/// A 503 for a request whose declared `Content-Length` does not fit in the in-flight budget
/// (its body is not read).
fn refuse_over_budget(
    req: &Request<Incoming>,
    share: &Share,
    grpc: bool,
) -> Option<Response<Body>> {
    let len = content_length(req)?;
    if share.cover(usize::try_from(len).unwrap_or(usize::MAX)) {
        return None;
    }
    metrics::counter!(m::REQUESTS_REFUSED, "reason" => "inflight_bytes").increment(1);
    let limit = share.budget().limit();
    let e = ServeError::Overloaded(OverBudget { limit }.to_string());
    m::count_refused_request(if grpc { "grpc" } else { "http" }, &e);
    let mut resp = match grpc {
        true => tonic::Status::from(e).into_http(),
        false => e.into_response(),
    };
    resp.headers_mut().insert(
        header::CONNECTION,
        header::HeaderValue::from_static("close"),
    );
    Some(resp)
}

/// A 403 / PERMISSION_DENIED for a request of a restricted API group without its header (its
/// body is not read).
fn refuse_restricted(
    req: &Request<Incoming>,
    restricted: &Restrictions,
    grpc: bool,
) -> Option<Response<Body>> {
    let (group, key) = restricted.refused(req.uri().path(), req.headers())?;
    metrics::counter!(m::REQUESTS_REFUSED, "reason" => "restricted_api").increment(1);
    let e = ServeError::Forbidden(format!(
        "the {} API is restricted on this server: send header '{}' with the value the server \
         was given (--restricted-api)",
        group.name(),
        key.name
    ));
    m::count_refused_request(if grpc { "grpc" } else { "http" }, &e);
    let mut resp = match grpc {
        true => tonic::Status::from(e).into_http(),
        false => e.into_response(),
    };
    if !grpc {
        resp.headers_mut().insert(
            header::CONNECTION,
            header::HeaderValue::from_static("close"),
        );
    }
    Some(resp)
}

/// The request's `Content-Length`, if it declares one.
fn content_length(req: &Request<Incoming>) -> Option<u64> {
    req.headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
}

/// A response refusing `req` before its body is read: a `Content-Length` over the body limit
/// (400, as a body over it gets), or a head over `max_header_bytes` (431). Both close the
/// connection (the body is not read).
fn refuse_early(
    req: &Request<Incoming>,
    max_body: Option<usize>,
    max_header: usize,
) -> Option<Response<Body>> {
    let head: usize = req
        .headers()
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len() + 4)
        .sum::<usize>()
        + req.uri().to_string().len();
    if head > max_header {
        metrics::counter!(m::REQUESTS_REFUSED, "reason" => "header_too_large").increment(1);
        let body = serde_json::json!({
            "error": format!(
                "the request head is {head} bytes, over the server's limit of {max_header} \
                 bytes (--max-header-bytes)"
            )
        });
        let resp = (
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            [(header::CONNECTION, "close")],
            axum::Json(body),
        );
        return Some(resp.into_response());
    }
    let limit = max_body?;
    let len = content_length(req)?;
    if len <= limit as u64 {
        return None;
    }
    metrics::counter!(m::REQUESTS_REFUSED, "reason" => "body_too_large").increment(1);
    let e = ServeError::bad(format!(
        "request body of {len} bytes (Content-Length) is over the server's limit of {limit} \
         bytes (--max-body-bytes)"
    ));
    m::count_refused_request("http", &e);
    let mut resp = e.into_response();
    resp.headers_mut().insert(
        header::CONNECTION,
        header::HeaderValue::from_static("close"),
    );
    Some(resp)
}
