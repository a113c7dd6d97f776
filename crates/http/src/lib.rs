//! The HTTP/1.1 server loop under `warden serve` and `warden proxy`.
//!
//! Both face clients nobody here controls. axum's own `serve` sets no timer
//! on its connections, so a client that sends half a request head (or one
//! byte a second) holds a connection — and a file descriptor — for ever,
//! and nothing bounds how many it may hold. [`serve`] runs an axum
//! [`Router`] with four limits:
//!
//! - **a header-read timeout** ([`Limits::header_timeout`], default 30 s):
//!   a request head not complete within it closes the connection. The
//!   same timer runs while a kept-alive connection waits for its next
//!   request, so it is the idle timeout too;
//! - **a body stall timeout**, the same duration: while the application
//!   waits for the request's body and none of it comes for that long, the
//!   request is answered `408 Request Timeout` with the caller's JSON body
//!   and the connection closed (a head declaring a body it never sends
//!   would otherwise hold its slot for ever; see [`BodyStalled`]);
//! - **a connection cap** ([`Limits::max_connections`], default 4,096):
//!   past it, a new connection is answered `503 Service Unavailable` with
//!   `Retry-After: 1` and the caller's JSON body, then closed — a client
//!   is told, not left waiting in the accept queue;
//! - **a shutdown that ends every connection**: when `shutdown` completes
//!   the listener closes, idle connections and half-read heads close
//!   within half a second, responses under way may finish, and the future returns when the
//!   last connection has ended. Dropping the future (after the caller's
//!   grace period) closes every connection still open.
//!
//! Sockets get `TCP_NODELAY`: a stream's small events go out at once
//! instead of waiting on Nagle's algorithm for the previous segment's ACK;
//! and, on Linux, `TCP_NOTSENT_LOWAT` (`UNSENT_LIMIT`): a client that
//! stops reading leaves at most that much unsent in the kernel before the
//! response stops being written, so backpressure reaches the application
//! (and, through it, its upstream) after 128 KiB instead of the up to
//! 4 MiB the send buffer grows to on its own. What is in flight is not
//! limited by it, so a reading client's throughput is unchanged.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use derive_setters::Setters;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

mod stall;

pub use stall::BodyStalled;

/// The default [`Limits::header_timeout`].
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(30);

/// The default [`Limits::max_connections`].
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;

/// How long a refused connection is given to take its `503` before it is
/// closed.
const REFUSAL_LINGER: Duration = Duration::from_secs(1);

/// How long a connection with no request under way is given at shutdown
/// to flush what it has written before it is closed.
const FLUSH_AT_SHUTDOWN: Duration = Duration::from_millis(500);

/// The unsent bytes a connection's socket may hold (`TCP_NOTSENT_LOWAT`)
/// before a write waits: a client that stops reading while `warden serve`
/// streams a 50 MB reply in 8 KiB deltas made it read ~4 MiB of the reply
/// before its turn paused (2.8 MB of it waiting in this socket), and peak
/// at 72-80 MB of RSS; with it, 64-67 MB (debug build; docs/serve.md).
#[cfg(target_os = "linux")]
const UNSENT_LIMIT: u32 = 128 * 1024;

/// At most this many refused connections are answered at once; past it a
/// refused connection is closed without an answer (a flood gets no more
/// of the server than the cap allows).
const MAX_REFUSALS_IN_FLIGHT: usize = 256;

/// What a server allows its clients.
#[derive(Clone, Debug, Setters)]
#[setters(prefix = "with_", strip_option)]
pub struct Limits {
    /// A request head must arrive whole within this; a kept-alive
    /// connection must start its next request within it; a request body
    /// the application waits for must send something within it (else
    /// `408`). Default 30 s.
    pub header_timeout: Duration,
    /// Connections open at once; past it a new one gets a `503`. Default
    /// 4,096 (mind the process's file-descriptor limit: `ulimit -n`).
    #[setters(skip)]
    pub max_connections: usize,
    /// The JSON body of the `503` past the cap.
    #[setters(
        into,
        doc = "Sets the JSON body a connection past the cap gets with its `503`, in the error shape the server's clients parse."
    )]
    busy_body: Arc<str>,
    /// The JSON body of the `408` for a stalled request body.
    #[setters(
        into,
        doc = "Sets the JSON body a request whose body stalled gets with its `408`, in the error shape the server's clients parse."
    )]
    stalled_body: Arc<str>,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            busy_body: Arc::from(
                r#"{"error":{"type":"overloaded","message":"too many connections; retry shortly"}}"#,
            ),
            stalled_body: Arc::from(
                r#"{"error":{"type":"request_timeout","message":"the request body sent nothing within the header timeout"}}"#,
            ),
        }
    }
}

impl Limits {
    /// Sets [`Limits::max_connections`] (at least 1).
    #[must_use]
    pub fn with_max_connections(mut self, max: usize) -> Self {
        self.max_connections = max.max(1);
        self
    }

    /// The `408` for a request whose body stalled; the connection closes
    /// after it (the rest of the body is never read).
    fn stalled_response(&self) -> axum::response::Response {
        use axum::http::{HeaderValue, StatusCode, header};
        let mut response = axum::response::Response::new(axum::body::Body::from(
            self.stalled_body.as_bytes().to_vec(),
        ));
        *response.status_mut() = StatusCode::REQUEST_TIMEOUT;
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        response
    }

    /// The full `503` answer, head and body.
    fn busy_response(&self) -> Vec<u8> {
        format!(
            "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
             retry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{}",
            self.busy_body.len(),
            self.busy_body
        )
        .into_bytes()
    }
}

/// Serves `app` on `listener` within `limits` until `shutdown` completes,
/// then until every connection has ended (see the [crate docs](crate)).
///
/// # Errors
/// None today: accept errors (a full file-descriptor table, a connection
/// reset before it was accepted) are logged and retried, not returned.
/// The `Result` leaves room for a listener that can fail for good.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let stopping = CancellationToken::new();
    let mut connections = JoinSet::new();
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let refusals = Arc::new(Semaphore::new(MAX_REFUSALS_IN_FLIGHT));
    let busy = Arc::<[u8]>::from(limits.busy_response());
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let mut last_warning: Option<Instant> = None;
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => accepted,
            // Reap finished connection tasks as they end.
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let tcp = match accepted {
            Ok((tcp, _peer)) => tcp,
            Err(e) if is_connection_error(&e) => continue,
            Err(e) => {
                // EMFILE/ENFILE and the like: wait for a descriptor to
                // come free instead of spinning on accept.
                tracing::warn!(error = %e, "cannot accept a connection; retrying shortly");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        #[cfg(target_os = "linux")]
        let _ = socket2::SockRef::from(&tcp).set_tcp_notsent_lowat(UNSENT_LIMIT);
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            if last_warning.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
                last_warning = Some(Instant::now());
                tracing::warn!(
                    max_connections = limits.max_connections,
                    "connection cap reached; answering new connections 503"
                );
            }
            if let Ok(refusal) = Arc::clone(&refusals).try_acquire_owned() {
                let busy = Arc::clone(&busy);
                connections.spawn(async move {
                    refuse(tcp, &busy).await;
                    drop(refusal);
                });
            }
            continue;
        };
        let busy = Busy::default();
        let service = {
            let app = TowerToHyperService::new(app.clone());
            let busy = busy.clone();
            let limits = limits.clone();
            hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                let guard = busy.enter();
                let stall = stall::Stall::new();
                let request = request
                    .map(|body| stall::Watched::new(body, limits.header_timeout, stall.clone()));
                let answer = hyper::service::Service::call(&app, request);
                let limits = limits.clone();
                async move {
                    // A stalled body ends the request whatever the
                    // application was doing with it.
                    let response = tokio::select! {
                        () = stall.cancelled() => limits.stalled_response(),
                        response = answer => {
                            let response = response?;
                            if stall.is_cancelled() {
                                limits.stalled_response()
                            } else {
                                response
                            }
                        }
                    };
                    Ok::<_, std::convert::Infallible>(response.map(|body| Guarded {
                        body,
                        _guard: guard,
                    }))
                }
            })
        };
        let conn = http.serve_connection(TokioIo::new(tcp), service);
        let stopping = stopping.clone();
        connections.spawn(async move {
            tokio::pin!(conn);
            let ended = tokio::select! {
                ended = conn.as_mut() => ended,
                () = stopping.cancelled() => {
                    // A response under way may finish. An idle connection
                    // closes now; so does one still reading a head (hyper
                    // would wait for the head): it gets a moment to flush
                    // what was written, then it is dropped.
                    conn.as_mut().graceful_shutdown();
                    if busy.is_busy() {
                        conn.await
                    } else {
                        match tokio::time::timeout(FLUSH_AT_SHUTDOWN, conn.as_mut()).await {
                            Ok(ended) => ended,
                            Err(_) => Ok(()),
                        }
                    }
                }
            };
            if let Err(e) = ended {
                tracing::debug!(error = %e, "connection ended with an error");
            }
            drop(slot);
        });
    }
    drop(listener);
    stopping.cancel();
    while connections.join_next().await.is_some() {}
    Ok(())
}

/// Answers a connection past the cap with the `503`, then closes it once
/// the client has read it (or after [`REFUSAL_LINGER`]): closing with its
/// request unread would reset the connection and could lose the answer.
async fn refuse(mut tcp: TcpStream, busy: &[u8]) {
    let _ = tokio::time::timeout(REFUSAL_LINGER, async {
        tcp.write_all(busy).await?;
        tcp.shutdown().await?;
        let mut sink = [0u8; 4096];
        while tcp.read(&mut sink).await? > 0 {}
        Ok::<_, io::Error>(())
    })
    .await;
}

/// How many requests of one connection are under way: from the moment
/// its head reached the router until its response body has been sent.
#[derive(Clone, Default)]
struct Busy(Arc<AtomicUsize>);

impl Busy {
    fn enter(&self) -> BusyGuard {
        self.0.fetch_add(1, Ordering::AcqRel);
        BusyGuard(Arc::clone(&self.0))
    }

    fn is_busy(&self) -> bool {
        self.0.load(Ordering::Acquire) > 0
    }
}

/// One request under way; ends when dropped.
struct BusyGuard(Arc<AtomicUsize>);

impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body that keeps its request marked under way until hyper
/// has taken its last frame (and drops it).
struct Guarded {
    body: axum::body::Body,
    _guard: BusyGuard,
}

impl http_body::Body for Guarded {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// Errors of one connection that came and went before it was accepted:
/// the listener is fine.
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}
