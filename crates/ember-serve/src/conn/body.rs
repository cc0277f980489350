//! A request body that must keep arriving: after a grace period (`body_timeout`), at least
//! `min_body_rate` bytes per second on average since the body started, or it fails with
//! [`SlowBody`] (the handler answers 408 and the connection closes). A client that trickles a
//! body one byte a second holds a request slot for the grace period, not forever.
//!
//! Its bytes are also counted against the server's in-flight budget (`budget.rs`) as they come,
//! for bodies whose length was not declared up front; past it the body fails with
//! [`OverBudget`] (503). On the gRPC listener both failures are gRPC statuses
//! (DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED), which tonic answers as they are.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::time::Sleep;

use super::budget::Share;
use super::state::ConnState;

/// The error of a body that arrived too slowly.
#[derive(Debug, Clone)]
pub struct SlowBody {
    pub bytes: u64,
    pub secs: f64,
    pub min_rate: u64,
}

impl std::fmt::Display for SlowBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the request body arrived too slowly: {} bytes in {:.1} s, below the server's minimum \
             of {} bytes/s (--min-body-rate) after its grace period (--body-timeout)",
            self.bytes, self.secs, self.min_rate
        )
    }
}

impl std::error::Error for SlowBody {}

/// The error of a body that would take the server past its in-flight byte budget.
#[derive(Debug, Clone)]
pub struct OverBudget {
    pub limit: usize,
}

impl std::fmt::Display for OverBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the server holds its limit of {} bytes of request bodies in flight \
             (--max-inflight-bytes)",
            self.limit
        )
    }
}

impl std::error::Error for OverBudget {}

/// A request body held to a minimum rate (see the module documentation).
#[derive(Debug)]
pub(crate) struct MinRateBody {
    inner: Incoming,
    state: Arc<ConnState>,
    start: Instant,
    bytes: u64,
    grace: Duration,
    rate: u64,
    timer: Option<Pin<Box<Sleep>>>,
    done: bool,
    share: Arc<Share>,
    /// Fail with gRPC statuses (the gRPC listener).
    grpc: bool,
}

impl MinRateBody {
    pub(crate) fn new(
        inner: Incoming,
        state: Arc<ConnState>,
        grace: Duration,
        rate: u64,
        share: Arc<Share>,
        grpc: bool,
    ) -> Self {
        let done = inner.is_end_stream();
        if !done {
            state.body_started();
        }
        state.set_body_ended(done);
        MinRateBody {
            inner,
            state,
            start: Instant::now(),
            bytes: 0,
            grace,
            rate,
            timer: None,
            done,
            share,
            grpc,
        }
    }

    /// The error a failure becomes: as it is, or as a gRPC status.
    fn fail(&self, e: Box<dyn std::error::Error + Send + Sync>, code: tonic::Code) -> BoxError {
        match self.grpc {
            true => Box::new(tonic::Status::new(code, e.to_string())),
            false => e,
        }
    }

    /// When the body falls below the rate unless more bytes come (`rate` > 0).
    fn deadline(&self) -> Instant {
        let earned = Duration::from_secs_f64(self.bytes as f64 / self.rate as f64);
        self.start + self.grace + earned
    }

    fn finish(&mut self) {
        if !self.done {
            self.done = true;
            self.state.body_done();
        }
    }
}

impl Drop for MinRateBody {
    fn drop(&mut self) {
        self.finish();
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl Body for MinRateBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let me = &mut *self;
        match Pin::new(&mut me.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(d) = frame.data_ref() {
                    me.bytes += d.len() as u64;
                    if !me.share.cover(me.bytes as usize) {
                        me.finish();
                        let limit = me.share.budget().limit();
                        return Poll::Ready(Some(Err(me.fail(
                            Box::new(OverBudget { limit }),
                            tonic::Code::ResourceExhausted,
                        ))));
                    }
                }
                if me.inner.is_end_stream() {
                    me.state.set_body_ended(true);
                    me.finish();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(None) => {
                me.state.set_body_ended(true);
                me.finish();
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => {
                me.finish();
                Poll::Ready(Some(Err(e.into())))
            }
            Poll::Pending => {
                if me.rate == 0 {
                    return Poll::Pending;
                }
                let deadline = me.deadline();
                let timer = me
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline.into())));
                if timer.deadline() != deadline.into() {
                    timer.as_mut().reset(deadline.into());
                }
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => {
                        me.finish();
                        let slow = SlowBody {
                            bytes: me.bytes,
                            secs: me.start.elapsed().as_secs_f64(),
                            min_rate: me.rate,
                        };
                        Poll::Ready(Some(Err(
                            me.fail(Box::new(slow), tonic::Code::DeadlineExceeded)
                        )))
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
