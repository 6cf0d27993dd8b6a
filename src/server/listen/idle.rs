//! The idle deadline of a connection: closed after `server.header_timeout_s`
//! with none of its requests open, counted from the connection's start or
//! its last request's end.
//!
//! hyper's header timer covers HTTP/1.1 (a new connection, or a kept-alive
//! one between requests) but HTTP/2 has none: a client that sends the
//! preface and nothing more, or stays after its last stream, or sends half a
//! header block, held its connection — and, at `server.max_connections`,
//! every other client out — for good (found by a new user's attack, issue
//! 28). A request is open from the moment the router is called until its
//! response body has been sent or dropped, so a slow rollout, a long stream
//! and an upload are never cut by this deadline (`request_timeout_s` and
//! `body_timeout_s` bound those). Bytes alone do not extend it: HTTP/2
//! control frames (PING, SETTINGS, WINDOW_UPDATE) sent with no request open
//! kept such a connection for good when they did (a second attack, issue 28).

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::response::Response;
use axum::Router;
use http_body::{Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// What one connection is doing: its open requests and when its last one
/// ended (milliseconds since the connection began; an atomic, set by the
/// connection's requests as they end).
pub(super) struct Activity {
    open: AtomicUsize,
    began: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    pub(super) fn new() -> Self {
        Self {
            open: AtomicUsize::new(0),
            began: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }

    fn touch(&self) {
        let ms = self.began.elapsed().as_millis() as u64;
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// When the connection is due to close: `None` while a request is open.
    fn deadline(&self, limit: Duration) -> Option<Instant> {
        (self.open.load(Ordering::SeqCst) == 0).then(|| {
            self.began + Duration::from_millis(self.last_ms.load(Ordering::Relaxed)) + limit
        })
    }
}

/// A request counted open until it is dropped.
struct Open(Arc<Activity>);

impl Open {
    fn new(activity: Arc<Activity>) -> Self {
        activity.open.fetch_add(1, Ordering::SeqCst);
        Self(activity)
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.touch();
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// `router` as the connection's service: each request counts as open until
/// its response body is done.
#[derive(Clone)]
pub(super) struct Tracked {
    router: Router,
    activity: Arc<Activity>,
}

impl Tracked {
    pub(super) fn new(router: Router, activity: Arc<Activity>) -> Self {
        Self { router, activity }
    }
}

impl<B> tower::Service<axum::http::Request<B>> for Tracked
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: axum::http::Request<B>) -> Self::Future {
        use tower::ServiceExt;
        let open = Open::new(Arc::clone(&self.activity));
        let router = self.router.clone();
        Box::pin(async move {
            let response = router.oneshot(request.map(Body::new)).await?;
            Ok(response.map(|body| Body::new(TrackedBody { body, _open: open })))
        })
    }
}

/// A response body that keeps its request open while it is sent.
struct TrackedBody {
    body: Body,
    _open: Open,
}

impl http_body::Body for TrackedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A connection's socket that fails its reads with `TimedOut` once the
/// connection has had no request open for `limit`; hyper then closes the
/// connection. `limit` `None`: never.
pub(super) struct IdleStream<S> {
    inner: S,
    activity: Arc<Activity>,
    limit: Option<Duration>,
    timer: Pin<Box<Sleep>>,
}

impl<S> IdleStream<S> {
    pub(super) fn new(inner: S, activity: Arc<Activity>, limit: Option<Duration>) -> Self {
        Self {
            inner,
            activity,
            limit,
            timer: Box::pin(tokio::time::sleep(Duration::ZERO)),
        }
    }

    /// Ready when the idle deadline has passed; otherwise the timer is set
    /// to wake the reader then.
    fn idle_over(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(deadline) = self.limit.and_then(|l| self.activity.deadline(l)) else {
            return false;
        };
        if Instant::now() >= deadline {
            return true;
        }
        self.timer.as_mut().reset(deadline);
        self.timer.as_mut().poll(cx).is_ready()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for IdleStream<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Pending if this.idle_over(cx) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "idle connection (server.header_timeout_s)",
            ))),
            other => other,
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for IdleStream<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, data)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
