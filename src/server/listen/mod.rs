//! The listener: seeker's own accept loop over hyper-util (header and
//! first-line deadlines, a JSON 414 for over-long request lines, graceful
//! shutdown), serving [`super::app`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use tokio::net::TcpStream;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

use super::error::{ApiError, ErrorCode};
use super::{app, AppState};

/// How long connections may take to close after the grace period ended the
/// requests still running (their streams send a last error event and
/// `[DONE]`); a connection still open then (half-sent headers or body) is
/// not waited for.
const AFTER_GRACE: Duration = Duration::from_secs(1);

mod idle;

/// Serves `app(state)` on `listener` until `shutdown` resolves; then refuses
/// new connections, lets open requests run for `grace`, ends the ones still
/// running (streams get a `server_shutting_down` error event and `[DONE]`,
/// others a 503), and returns once every connection has closed, or at the
/// latest a second after that (a client that sent half its headers or body
/// is not waited for).
///
/// At most `server.max_connections` connections are open at once; at the
/// cap the loop stops accepting until one closes.
///
/// Each connection (HTTP/1.1, or HTTP/2 with prior knowledge) gets
/// `server.header_timeout_s` to send a request's headers, on a new
/// connection and between requests on a kept-alive one: a client that
/// connects and sends nothing, or trickles its headers, or idles, is closed
/// then. An HTTP/2 connection (whose header timer hyper does not offer) is
/// closed after the same time without a byte either way while none of its
/// requests is open ([`idle`]). (axum's own `serve` runs hyper without a timer, so with no such
/// timeout: idle connections piled up until the process ran out of file
/// descriptors — seeker issue 18.)
///
/// # Errors
/// None today: accept errors are logged and retried (a full descriptor
/// table is waited out, not fatal).
pub async fn run(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    grace: Duration,
) -> std::io::Result<()> {
    // One permit per open connection (`server.max_connections`).
    let connection_slots = state
        .ops
        .max_connections
        .map(|cap| Arc::new(Semaphore::new(cap)));
    let (stopping, stopping_rx) = watch::channel(false);
    let ending = Arc::clone(&state);
    let serving = Serving {
        builder: connection_builder(state.ops.header_timeout),
        header_timeout: state.ops.header_timeout,
        secure: state.security_headers,
        stopping: stopping_rx,
        router: app(state),
    };
    let connections = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    let mut at_cap = false;
    loop {
        // At the cap, wait for a connection to close before accepting: the
        // next clients wait in the listen backlog, not in memory.
        let permit = match &connection_slots {
            None => None,
            Some(slots) => {
                warn_at_cap(slots, &mut at_cap);
                tokio::select! {
                    permit = Arc::clone(slots).acquire_owned() => Some(permit.expect("never closed")),
                    () = &mut shutdown => break,
                }
            }
        };
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let Some(stream) = accepted_stream(accepted).await else {
            continue;
        };
        // Taken now, before a shutdown can start: it then waits for this one.
        let watcher = connections.watcher();
        tokio::spawn(serving.clone().serve(stream, permit, watcher));
    }
    drop(listener);
    stopping.send_replace(true);
    close_connections(connections, grace, &ending).await;
    Ok(())
}

/// The connection builder: HTTP/1.1 with `header_timeout` to send a
/// request's headers, HTTP/2 with its limits stated ([`H2_MAX_STREAMS`],
/// [`H2_MAX_PENDING_RESETS`]).
fn connection_builder(header_timeout: Option<Duration>) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    // HTTP/2 limits, stated rather than inherited: streams per connection,
    // and the rapid-reset guard (CVE-2023-44487): a client that resets more
    // than this many streams before they are served gets a GOAWAY
    // (ENHANCE_YOUR_CALM) and loses the connection.
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(H2_MAX_STREAMS)
        .max_pending_accept_reset_streams(H2_MAX_PENDING_RESETS);
    builder
}

/// Logs a warning when `slots` has just run out (`at_cap` remembers that it
/// had, so the warning comes once each time the cap is reached, not per
/// connection).
fn warn_at_cap(slots: &Semaphore, at_cap: &mut bool) {
    if slots.available_permits() == 0 && !*at_cap {
        tracing::warn!("server.max_connections reached: new connections wait until one closes");
    }
    *at_cap = slots.available_permits() == 0;
}

/// The accepted stream (with `TCP_NODELAY` set), or `None` when accepting
/// failed: at once for an error of that one connection, after a 100 ms
/// pause (logged) for others (EMFILE/ENFILE and the like).
async fn accepted_stream(
    accepted: std::io::Result<(TcpStream, std::net::SocketAddr)>,
) -> Option<TcpStream> {
    match accepted {
        Ok((stream, _peer)) => {
            let _ = stream.set_nodelay(true);
            Some(stream)
        }
        Err(e) if is_per_connection(&e) => None,
        Err(e) => {
            // EMFILE/ENFILE and the like: wait for descriptors to free up.
            tracing::error!(error = %e, "accepting a connection failed; retrying in 100 ms");
            tokio::time::sleep(Duration::from_millis(100)).await;
            None
        }
    }
}

/// What every connection is served with; each connection's task gets a
/// clone.
#[derive(Clone)]
struct Serving {
    builder: auto::Builder<TokioExecutor>,
    router: axum::Router,
    /// `server.header_timeout_s`.
    header_timeout: Option<Duration>,
    /// `server.security_headers` (for the 414 written by hand).
    secure: bool,
    /// Turns true when the server starts shutting down.
    stopping: watch::Receiver<bool>,
}

impl Serving {
    /// Serves one accepted connection until it closes, holding `permit` (its
    /// `server.max_connections` slot) meanwhile and watched by `watcher` for
    /// the graceful shutdown: a connection whose first line does not come
    /// is dropped, one whose first line is too long gets a 414, others are
    /// served by the router with the idle deadline of [`idle`].
    async fn serve(
        mut self,
        stream: TcpStream,
        permit: Option<OwnedSemaphorePermit>,
        watcher: Watcher,
    ) {
        // Held until the connection ends.
        let _permit = permit;
        match self.first_line(&stream).await {
            FirstLine::Missing => return,
            FirstLine::TooLong => return refuse_long_request_line(stream, self.secure).await,
            FirstLine::Fits => {}
        }
        // The idle deadline of a connection with no request open (HTTP/2
        // has no header timer of its own; see `idle`).
        let activity = Arc::new(idle::Activity::new());
        let service = hyper_util::service::TowerToHyperService::new(idle::Tracked::new(
            self.router,
            Arc::clone(&activity),
        ));
        let stream = idle::IdleStream::new(stream, activity, self.header_timeout);
        let connection = self
            .builder
            .serve_connection_with_upgrades(TokioIo::new(stream), service)
            .into_owned();
        if let Err(e) = watcher.watch(connection).await {
            tracing::debug!(error = %e, "connection ended with an error");
        }
    }

    /// Waits for the connection's first line, within the header timeout;
    /// [`FirstLine::Missing`] when it does not come in time or the server
    /// starts shutting down meanwhile.
    async fn first_line(&mut self, stream: &TcpStream) -> FirstLine {
        // hyper-util reads the first bytes to tell HTTP/1 from HTTP/2
        // before hyper's header timer starts: a connection that sends
        // nothing would wait there for good, so its first line gets the
        // same deadline (and a shutdown drops it at once).
        let first_line = async {
            match self.header_timeout {
                Some(limit) => tokio::time::timeout(limit, peek_request_line(stream))
                    .await
                    .unwrap_or(FirstLine::Missing),
                None => peek_request_line(stream).await,
            }
        };
        tokio::select! {
            line = first_line => line,
            _ = self.stopping.wait_for(|stop| *stop) => FirstLine::Missing,
        }
    }
}

/// The shutdown once the accept loop has stopped: lets open requests run for
/// `grace`, then ends the ones still running (`state`'s running requests),
/// and returns once every connection has closed, or [`AFTER_GRACE`] after
/// the grace period at the latest.
async fn close_connections(connections: GracefulShutdown, grace: Duration, state: &AppState) {
    tracing::info!(
        grace_s = grace.as_secs_f64(),
        "shutting down: refusing new connections, letting open requests finish"
    );
    let closed = connections.shutdown();
    let grace_over = async {
        tokio::time::sleep(grace).await;
        tracing::info!("grace period over: ending the requests still running");
        state.ops.end_running_requests();
        tokio::time::sleep(AFTER_GRACE).await;
    };
    tokio::select! {
        () = closed => {}
        () = grace_over => {
            // A client that sent half its headers or body keeps its
            // connection open until `header_timeout_s`/`body_timeout_s`:
            // the server does not wait for it.
            tracing::warn!("connections still open after the grace period; not waiting for them");
        }
    }
}

/// Streams one HTTP/2 connection may have open at once (hyper's default is
/// 200); more wait for one to end. `server.max_concurrent_requests` still
/// bounds the chat and `/retrieve` requests of all connections together.
const H2_MAX_STREAMS: u32 = 100;

/// Streams an HTTP/2 client may reset before the server served them (hyper's
/// default) before the connection is closed with `ENHANCE_YOUR_CALM`: the HTTP/2 rapid-reset attack (CVE-2023-44487) opens
/// and cancels streams in a loop to make the server start work it never
/// finishes.
const H2_MAX_PENDING_RESETS: usize = 20;

/// Longest request line (`GET /path?query HTTP/1.1`) answered with a JSON
/// error: a longer first line gets a `uri_too_long` 414 in the API's error
/// shape. hyper itself refuses targets over 64 KiB, but with a bodyless 414,
/// and does so for every request on a connection; seeker checks the first
/// request of each connection (later requests on a kept-alive connection
/// still get hyper's bodyless 414 above 64 KiB). No route takes a long URI.
const MAX_REQUEST_LINE: usize = 16 * 1024;

/// What the first bytes of a connection were.
enum FirstLine {
    /// Nothing arrived (the peer closed, failed, or the deadline passed).
    Missing,
    /// A request line shorter than [`MAX_REQUEST_LINE`] (or HTTP/2's preface).
    Fits,
    /// [`MAX_REQUEST_LINE`] bytes without a line end.
    TooLong,
}

/// Waits for a connection's first line without consuming it (hyper reads it
/// next). Data that arrives in pieces is peeked again with a growing pause
/// (1 to 64 ms): a socket stays readable while unread bytes wait, so there is
/// no wake-up for "more bytes".
async fn peek_request_line(stream: &tokio::net::TcpStream) -> FirstLine {
    let mut buf = vec![0u8; MAX_REQUEST_LINE];
    let (mut seen, mut pause) = (0, Duration::from_millis(1));
    loop {
        let n = match stream.peek(&mut buf).await {
            Ok(0) | Err(_) => return FirstLine::Missing,
            Ok(n) => n,
        };
        if buf[..n].contains(&b'\n') {
            return FirstLine::Fits;
        }
        if n >= MAX_REQUEST_LINE {
            return FirstLine::TooLong;
        }
        if n == seen {
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(64));
        } else {
            (seen, pause) = (n, Duration::from_millis(1));
        }
    }
}

/// Answers a connection whose request line is over [`MAX_REQUEST_LINE`] with
/// a JSON `uri_too_long` 414 and closes it, after reading (for up to a
/// second, at most 1 MiB) what the client still sends, so that the kernel
/// does not reset the connection before the client has read the answer.
async fn refuse_long_request_line(mut stream: tokio::net::TcpStream, secure: bool) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = ApiError::new(
        ErrorCode::UriTooLong,
        format!(
            "the request line is longer than {} KiB; send parameters in a JSON body",
            MAX_REQUEST_LINE / 1024
        ),
    )
    .to_json();
    let security = if secure {
        super::headers::api_header_lines()
    } else {
        String::new()
    };
    let response = format!(
        "HTTP/1.1 414 URI Too Long\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nx-request-id: {}\r\n{security}connection: close\r\n\r\n{body}",
        body.len(),
        uuid::Uuid::new_v4(),
    );
    if stream.write_all(response.as_bytes()).await.is_err() {
        return;
    }
    let _ = stream.shutdown().await;
    let drain = async {
        let mut sink = vec![0u8; 64 * 1024];
        let mut total = 0;
        while total < 1024 * 1024 {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n,
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), drain).await;
}

/// Accept errors that concern one connection only (the peer gave up before
/// it was accepted): the next accept goes on at once.
fn is_per_connection(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
    )
}
