//! The upstream connection of a watched request, driven by the task that
//! writes the client's response.
//!
//! A pooled client (reqwest's, hyper-util's) runs each connection in a
//! task of its own and hands the body over a channel: two task polls per
//! event and a request channel per connection. Here the connection is
//! hyper's HTTP/1 client connection ([`hyper::client::conn::http1`]) held
//! by the response: reading the body polls the connection first, so the
//! bytes go from the upstream socket to the client's in one task. A
//! connection whose body was read to its end goes back to a small idle
//! pool per origin (plain TCP or TLS through rustls, as before) and is
//! checked for a close by the server before it is used again; one that
//! was not, one whose body broke and one that answered an error are
//! closed. A request is sent again on a new connection only when hyper
//! gives it back unsent.

use std::collections::HashMap;
use std::future::Future as _;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue, Request, StatusCode, Uri, header};
use bytes::Bytes;
use futures_util::Stream;
use http_body_util::Full;
use hyper::body::{Body as _, Incoming};
use hyper::client::conn::http1::{self, Connection, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::either::Either;

/// The most idle connections kept per origin.
const IDLE_PER_ORIGIN: usize = 32;

/// How long an idle connection is kept before it is closed rather than
/// used (servers close theirs after a few seconds to minutes).
const IDLE_FOR: Duration = Duration::from_secs(30);

/// The read buffer of an upstream connection: events are small, and a
/// head or chunk larger than this is read in several goes.
const READ_BUF: usize = 4096;

type Conn = Connection<TokioIo<Io>, Full<Bytes>>;

/// A TCP connection, or a TLS one over it (tokio-util's `Either` reads
/// and writes whichever it holds).
type Io = Either<TcpStream, Box<tokio_rustls::client::TlsStream<TcpStream>>>;

/// Where a connection goes: scheme, host and port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Origin {
    https: bool,
    host: String,
    port: u16,
}

/// A connection not in use.
struct Idle {
    send: SendRequest<Full<Bytes>>,
    conn: Pin<Box<Conn>>,
    since: Instant,
}

/// Why a request got no answer, in words (no URL: it may carry a query
/// string the user did not mean to log).
pub(crate) type Reason = String;

/// The upstream connections of watched requests.
pub(crate) struct Upstreams {
    idle: Mutex<HashMap<Origin, Vec<Idle>>>,
    tls: tokio_rustls::TlsConnector,
}

impl Upstreams {
    /// No connection yet; TLS verified against the public web roots
    /// (`webpki-roots`, what reqwest's `rustls-tls` uses).
    pub(crate) fn new() -> Result<Self, String> {
        let mut roots = rustls::RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        Self::with_roots(roots)
    }

    /// No connection yet; TLS verified against `roots`.
    fn with_roots(roots: rustls::RootCertStore) -> Result<Self, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            idle: Mutex::new(HashMap::new()),
            tls: tokio_rustls::TlsConnector::from(Arc::new(tls)),
        })
    }

    /// Sends `POST url` with `headers` and `body` on an idle connection to
    /// its origin or a new one, and waits for the answer's head. A reused
    /// connection that closed before the request was written (hyper gives
    /// the request back) is replaced by a new one, once; one that failed
    /// after it was written is this attempt's failure (the upstream may
    /// have read the request: sending it again is the policy's decision,
    /// counted).
    pub(crate) async fn post(
        self: &Arc<Self>,
        url: &str,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<Answer, Reason> {
        let uri: Uri = url
            .parse()
            .map_err(|e| format!("request failed: the upstream URL: {e}"))?;
        let origin = origin(&uri)?;
        let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
        let authority = uri
            .authority()
            .map(|a| a.as_str().to_owned())
            .unwrap_or_default();
        let request = || {
            let mut request = Request::post(path.as_str())
                .body(Full::new(body.clone()))
                .map_err(|e| format!("request failed: {e}"))?;
            *request.headers_mut() = headers.clone();
            let host =
                HeaderValue::from_str(&authority).map_err(|e| format!("request failed: {e}"))?;
            request.headers_mut().insert(header::HOST, host);
            Ok::<_, Reason>(request)
        };
        let mut unsent = None;
        if let Some(idle) = self.take(&origin) {
            tracing::trace!(host = %origin.host, port = origin.port, "reusing an upstream connection");
            match exchange(idle.send, idle.conn, request()?).await {
                Ok((head, incoming, send, conn)) => {
                    return Ok(self.answer(origin, head, incoming, send, conn));
                }
                // Closed before the request left: it goes on a new one.
                Err(Failed {
                    unsent: Some(request),
                    ..
                }) => unsent = Some(request),
                Err(Failed { reason, .. }) => return Err(reason),
            }
        }
        let (send, conn) = self.connect(&origin).await?;
        tracing::debug!(
            host = %origin.host,
            port = origin.port,
            tls = origin.https,
            "opened an upstream connection"
        );
        let request = match unsent {
            Some(request) => request,
            None => request()?,
        };
        let (head, incoming, send, conn) =
            exchange(send, conn, request).await.map_err(|f| f.reason)?;
        Ok(self.answer(origin, head, incoming, send, conn))
    }

    fn answer(
        self: &Arc<Self>,
        origin: Origin,
        head: axum::http::response::Parts,
        incoming: Incoming,
        send: SendRequest<Full<Bytes>>,
        conn: Option<Pin<Box<Conn>>>,
    ) -> Answer {
        // An error answer may come before the upstream read the whole
        // request, or with more to follow: its connection is not used
        // again.
        let home = head.status.is_success().then(|| (Arc::clone(self), origin));
        Answer {
            status: head.status,
            headers: head.headers,
            body: UpstreamBody {
                incoming,
                conn,
                send: Some(send),
                home,
                ended: false,
            },
        }
    }

    /// An idle connection to `origin` the server has not closed, if any.
    fn take(&self, origin: &Origin) -> Option<Idle> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let list = idle.get_mut(origin)?;
        while let Some(mut candidate) = list.pop() {
            if candidate.since.elapsed() > IDLE_FOR {
                continue;
            }
            // A close the server sent while it sat idle is read now.
            let mut cx = Context::from_waker(std::task::Waker::noop());
            if candidate.conn.as_mut().poll(&mut cx).is_ready() {
                continue;
            }
            if candidate.send.is_ready() {
                return Some(candidate);
            }
        }
        None
    }

    /// Keeps a connection whose answer was read to its end.
    fn keep(&self, origin: Origin, send: SendRequest<Full<Bytes>>, conn: Pin<Box<Conn>>) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let list = idle.entry(origin).or_default();
        list.retain(|i| i.since.elapsed() <= IDLE_FOR);
        if list.len() < IDLE_PER_ORIGIN {
            list.push(Idle {
                send,
                conn,
                since: Instant::now(),
            });
        }
    }

    /// A new connection to `origin`: TCP (no Nagle delay), TLS over it
    /// for `https`, then HTTP/1.1.
    async fn connect(
        &self,
        origin: &Origin,
    ) -> Result<(SendRequest<Full<Bytes>>, Pin<Box<Conn>>), Reason> {
        let failed = |e: &dyn std::error::Error| {
            format!("connection failed: {}", warden_llm::error_chain(e))
        };
        let host = origin.host.trim_start_matches('[').trim_end_matches(']');
        let tcp = TcpStream::connect((host, origin.port))
            .await
            .map_err(|e| failed(&e))?;
        let _ = tcp.set_nodelay(true);
        let io = if origin.https {
            let name =
                rustls::pki_types::ServerName::try_from(host.to_owned()).map_err(|e| failed(&e))?;
            let tls = self.tls.connect(name, tcp).await.map_err(|e| failed(&e))?;
            Either::Right(Box::new(tls))
        } else {
            Either::Left(tcp)
        };
        let (send, conn) = http1::Builder::new()
            .read_buf_exact_size(Some(READ_BUF))
            .handshake(TokioIo::new(io))
            .await
            .map_err(|e| failed(&e))?;
        Ok((send, Box::pin(conn)))
    }
}

fn origin(uri: &Uri) -> Result<Origin, Reason> {
    let https = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => return Err("request failed: the upstream URL is not http:// or https://".to_owned()),
    };
    let host = uri
        .host()
        .ok_or_else(|| "request failed: the upstream URL has no host".to_owned())?
        .to_owned();
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    Ok(Origin { https, host, port })
}

/// The answer's head and its body, the connection driven until the head
/// came (`None` once it has ended).
type Exchanged = (
    axum::http::response::Parts,
    Incoming,
    SendRequest<Full<Bytes>>,
    Option<Pin<Box<Conn>>>,
);

/// Why an exchange got no answer, and its request when it provably never
/// left (hyper gives it back when the connection closed before writing
/// it).
struct Failed {
    reason: Reason,
    unsent: Option<Request<Full<Bytes>>>,
}

/// Sends `request` on `send`, polling `conn` (which does the I/O) until
/// the answer's head arrives.
async fn exchange(
    mut send: SendRequest<Full<Bytes>>,
    conn: Pin<Box<Conn>>,
    request: Request<Full<Bytes>>,
) -> Result<Exchanged, Failed> {
    let mut conn = Some(conn);
    let mut conn_error = None;
    let mut answer = std::pin::pin!(send.try_send_request(request));
    let response = std::future::poll_fn(|cx| {
        if let Some(c) = conn.as_mut()
            && let Poll::Ready(done) = c.as_mut().poll(cx)
        {
            conn = None;
            if let Err(e) = done {
                conn_error = Some(e);
            }
        }
        answer.as_mut().poll(cx)
    })
    .await
    .map_err(|mut e| Failed {
        reason: match &conn_error {
            Some(c) => format!("request failed: {}", warden_llm::error_chain(c)),
            None => format!("request failed: {}", warden_llm::error_chain(e.error())),
        },
        unsent: e.take_message(),
    })?;
    let (head, incoming) = response.into_parts();
    Ok((head, incoming, send, conn))
}

/// An upstream answer's head and body.
pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: UpstreamBody,
}

/// An answer's body as it arrives, its connection polled by whoever reads
/// it; given back to the idle pool once read to its end, closed if dropped
/// before.
pub(crate) struct UpstreamBody {
    incoming: Incoming,
    conn: Option<Pin<Box<Conn>>>,
    send: Option<SendRequest<Full<Bytes>>>,
    home: Option<(Arc<Upstreams>, Origin)>,
    ended: bool,
}

impl UpstreamBody {
    /// The length the answer declared, if it did.
    pub(crate) fn declared_len(&self) -> Option<u64> {
        self.incoming.size_hint().exact()
    }

    /// The body read to its end: the connection goes back to the pool when
    /// it can carry another request (hyper closes one with bytes past the
    /// answer's end, buffered or arriving while it is idle).
    fn ended(&mut self, cx: &mut Context<'_>) {
        self.ended = true;
        let (Some(mut conn), Some(send), Some((home, origin))) =
            (self.conn.take(), self.send.take(), self.home.take())
        else {
            return;
        };
        // Lets the connection see the end of the message (it is then idle).
        if conn.as_mut().poll(cx).is_pending() && send.is_ready() {
            home.keep(origin, send, conn);
        }
    }
}

impl Stream for UpstreamBody {
    type Item = Result<Bytes, Reason>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.ended {
            return Poll::Ready(None);
        }
        let mut conn_error = None;
        if let Some(c) = this.conn.as_mut()
            && let Poll::Ready(done) = c.as_mut().poll(cx)
        {
            this.conn = None;
            if let Err(e) = done {
                conn_error = Some(e);
            }
        }
        loop {
            match Pin::new(&mut this.incoming).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) if !data.is_empty() => return Poll::Ready(Some(Ok(data))),
                    // Empty data or trailers: nothing for the reader.
                    _ => continue,
                },
                Poll::Ready(Some(Err(e))) => {
                    this.ended = true;
                    this.conn = None;
                    let why = conn_error.as_ref().map_or_else(
                        || warden_llm::error_chain(&e),
                        |c| warden_llm::error_chain(c),
                    );
                    return Poll::Ready(Some(Err(format!("the body broke off: {why}"))));
                }
                Poll::Ready(None) => {
                    this.ended(cx);
                    return Poll::Ready(None);
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use futures_util::StreamExt as _;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::TcpListener;

    use super::*;

    /// Bounded: a test fails, it never hangs.
    async fn within<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
        tokio::time::timeout(Duration::from_secs(10), fut)
            .await
            .unwrap_or_else(|_| panic!("timed out: {what}"))
    }

    /// Reads one request head (and its `content-length` body) from `socket`:
    /// `false` once the client closed it.
    async fn read_request(socket: &mut TcpStream) -> bool {
        let mut seen = Vec::new();
        let mut buf = [0u8; 1024];
        loop {
            if let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&seen[..end]).to_lowercase();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length: "))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                if seen.len() >= end + 4 + len {
                    return true;
                }
            }
            match socket.read(&mut buf).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
    }

    const ANSWER: &str =
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: 5\r\n\r\nhello";

    /// A server answering every request on each connection it accepts;
    /// `close_after` answers closes the connection (silently, no
    /// `Connection: close`). Counts the connections accepted.
    async fn server(close_after: Option<usize>) -> (String, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!(
            "http://{}/v1/messages?beta=true",
            listener.local_addr().expect("addr")
        );
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut answered = 0;
                    while read_request(&mut socket).await {
                        if socket.write_all(ANSWER.as_bytes()).await.is_err() {
                            return;
                        }
                        answered += 1;
                        if close_after == Some(answered) {
                            return;
                        }
                    }
                });
            }
        });
        (url, accepted)
    }

    async fn post_and_read(upstreams: &Arc<Upstreams>, url: &str) -> String {
        let answer = within(
            "the answer",
            upstreams.post(url, &HeaderMap::new(), Bytes::from_static(b"{}")),
        )
        .await
        .expect("answered");
        assert_eq!(answer.status, StatusCode::OK);
        let chunks: Vec<_> = within("the body", answer.body.collect()).await;
        chunks
            .into_iter()
            .map(|c| String::from_utf8_lossy(&c.expect("a chunk")).into_owned())
            .collect()
    }

    #[tokio::test]
    async fn a_connection_read_to_its_end_carries_the_next_request() {
        let (url, accepted) = server(None).await;
        let upstreams = Arc::new(Upstreams::new().expect("client"));
        for _ in 0..3 {
            assert_eq!(post_and_read(&upstreams, &url).await, "hello");
        }
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "one connection for three requests"
        );
    }

    #[tokio::test]
    async fn an_idle_connection_the_server_closed_is_replaced_not_used() {
        let (url, accepted) = server(Some(1)).await;
        let upstreams = Arc::new(Upstreams::new().expect("client"));
        assert_eq!(post_and_read(&upstreams, &url).await, "hello");
        // The server's close reaches the idle connection.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(post_and_read(&upstreams, &url).await, "hello");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_body_dropped_before_its_end_closes_its_connection() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!(
            "http://{}/v1/messages",
            listener.local_addr().expect("addr")
        );
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.expect("accept");
            assert!(read_request(&mut socket).await);
            let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n";
            socket.write_all(head.as_bytes()).await.expect("write");
            // The client closes: a read sees the end.
            let mut rest = Vec::new();
            let _ = socket.read_to_end(&mut rest).await;
        });
        let upstreams = Arc::new(Upstreams::new().expect("client"));
        let mut answer = within(
            "the answer",
            upstreams.post(&url, &HeaderMap::new(), Bytes::new()),
        )
        .await
        .expect("answered");
        let first = within("a chunk", answer.body.next()).await;
        assert_eq!(
            first.expect("one").expect("ok"),
            Bytes::from_static(b"hello")
        );
        drop(answer);
        within("the server sees the close", server)
            .await
            .expect("server");
        let idle = upstreams.idle.lock().unwrap_or_else(|p| p.into_inner());
        assert!(idle.values().all(Vec::is_empty), "nothing pooled");
    }

    /// An HTTPS upstream with a certificate for `localhost` of its own:
    /// its URL, and that certificate.
    async fn tls_server() -> (String, rustls::pki_types::CertificateDer<'static>) {
        let rcgen::CertifiedKey { cert, signing_key } =
            rcgen::generate_simple_self_signed(vec!["localhost".to_owned()])
                .expect("a certificate");
        let der = cert.der().clone();
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(
            rustls::pki_types::PrivatePkcs8KeyDer::from(signing_key.serialize_der()),
        );
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(vec![der.clone()], key)
            .expect("server config");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(socket).await else {
                        return;
                    };
                    let mut buf = vec![0u8; 4096];
                    let mut seen = Vec::new();
                    while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                        match tls.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => seen.extend_from_slice(&buf[..n]),
                        }
                    }
                    let _ = tls.write_all(ANSWER.as_bytes()).await;
                    let _ = tls.flush().await;
                    let _ = tls.read(&mut buf).await;
                });
            }
        });
        (format!("https://localhost:{port}/v1/messages"), der)
    }

    #[tokio::test]
    async fn an_https_upstream_is_verified_against_the_roots() {
        let (url, cert) = tls_server().await;
        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert).expect("a root");
        let trusting = Arc::new(Upstreams::with_roots(roots).expect("client"));
        assert_eq!(post_and_read(&trusting, &url).await, "hello");
        // The public web roots do not vouch for it: refused, saying why.
        let public = Arc::new(Upstreams::new().expect("client"));
        let why = within(
            "the failure",
            public.post(&url, &HeaderMap::new(), Bytes::new()),
        )
        .await
        .err()
        .expect("not trusted");
        assert!(
            why.starts_with("connection failed: ") && why.contains("certificate"),
            "{why}"
        );
    }

    #[tokio::test]
    async fn a_refused_connection_says_so_without_the_url() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!(
            "http://{}/v1/messages?key=secret",
            listener.local_addr().expect("addr")
        );
        drop(listener);
        let upstreams = Arc::new(Upstreams::new().expect("client"));
        let why = within(
            "the failure",
            upstreams.post(&url, &HeaderMap::new(), Bytes::new()),
        )
        .await
        .err()
        .expect("refused");
        assert!(
            why.starts_with("connection failed: ") && why.contains("refused"),
            "{why}"
        );
        assert!(!why.contains("secret"), "{why}");
    }
}
