//! The `/metrics` server: hyper 1 (HTTP/1.x only) on a one-thread tokio runtime.

use super::{PATH, negotiate};
use crate::prom::render;
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{ACCEPT, ALLOW, CACHE_CONTROL, CONTENT_TYPE, HOST, HeaderValue};
use hyper::{Method, Request, Response, StatusCode, Version};
use hyper_util::rt::TokioIo;
use prometheus_client::registry::Registry;
use std::collections::VecDeque;
use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::oneshot;
use tokio::task::{AbortHandle, JoinSet};
use tokio::time::{Instant, sleep, sleep_until, timeout};

/// Server settings. Build with `..ServerConfig::default()`; [`MetricsServer::start`] checks
/// the ranges.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Where to listen; loopback by default so metrics are not exposed by accident (binding
    /// any other address logs a warning).
    pub addr: SocketAddr,
    /// Connections served at once (1..=65 536). When all are taken, the oldest connection that
    /// has had its turn to read and still has not sent a complete request head gets `503` and
    /// is closed to make room; when there is none, the new connection gets `503` at once.
    pub max_connections: usize,
    /// Time from accept to the end of the request head; a client still sending its head then
    /// gets `408` and is closed.
    pub head_timeout: Duration,
    /// One deadline for the whole connection, from accept to close, whatever the client does:
    /// the server never reads, writes or waits on a connection past it.
    pub timeout: Duration,
    /// Largest request head (request line and headers) buffered, at least 8 192 bytes; a longer
    /// head gets `431`.
    pub max_head_bytes: usize,
    /// How long [`MetricsServer::shutdown`] (and dropping the server) lets connections already
    /// being served finish before closing them.
    pub shutdown_grace: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            addr: SocketAddr::from(([127, 0, 0, 1], 9464)),
            max_connections: 64,
            head_timeout: Duration::from_secs(2),
            timeout: Duration::from_secs(5),
            max_head_bytes: 8 * 1024,
            shutdown_grace: Duration::from_millis(500),
        }
    }
}

/// Why the server could not start.
#[derive(Debug)]
#[non_exhaustive]
pub enum ServeError {
    /// Binding the address failed (in use, no permission, not a local address).
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// The operating system's error.
        source: io::Error,
    },
    /// A setting is out of range.
    BadConfig(&'static str),
    /// The server thread or its runtime could not be started.
    Spawn(io::Error),
}

impl std::fmt::Display for ServeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Bind { addr, source } if source.kind() == io::ErrorKind::AddrInUse => {
                write!(
                    f,
                    "cannot serve metrics on {addr}: the address is already in use"
                )
            }
            Self::Bind { addr, source } => write!(f, "cannot serve metrics on {addr}: {source}"),
            Self::BadConfig(why) => write!(f, "bad metrics server setting: {why}"),
            Self::Spawn(e) => write!(f, "cannot start the metrics server thread: {e}"),
        }
    }
}

impl std::error::Error for ServeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Bind { source, .. } | Self::Spawn(source) => Some(source),
            Self::BadConfig(_) => None,
        }
    }
}

/// A running `/metrics` endpoint on its own thread. Dropping it (or
/// [`shutdown`](Self::shutdown)) stops it.
///
/// One thread runs a one-thread tokio runtime; hyper parses HTTP/1.0 and 1.1 (no HTTP/2, no
/// keep-alive: one request per connection). The bounds:
/// * **time**: every connection has one deadline ([`ServerConfig::timeout`]) covering its whole
///   life, and its request head must be complete within [`ServerConfig::head_timeout`] (else
///   `408`); the server never drains or lingers past the deadline;
/// * **connections**: at most [`ServerConfig::max_connections`]; when full, the oldest
///   connection that has had its turn to read and is still sending its head gets `503` and is
///   closed to admit the new one, else the new one gets `503`; both answers are written
///   without blocking, so overflow never costs the acceptor a wait, and a crowd of slow clients
///   (reconnecting or not) cannot keep a scraper, whose head arrives with its connection, out;
/// * **memory**: a request head over [`ServerConfig::max_head_bytes`] gets `431`; request
///   bodies are never read;
/// * **answers**: `200` for `GET`/`HEAD /metrics` in the [negotiated](super::negotiate) format,
///   `406` when the `Accept` header excludes both formats, `404` for other paths, `405` (with
///   `Allow`) for other methods, `400` for malformed requests (hyper's parser: a bad request
///   line, a header line such as `Accept : x` with a space before the colon, an obsolete line
///   fold) and for HTTP/1.1 without exactly one `Host` header (RFC 9112 §3.2);
/// * **exposure**: binding an address that is not loopback logs a warning (target
///   `specula::http`).
#[derive(Debug)]
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    registry: Arc<Registry>,
    config: ServerConfig,
}

impl MetricsServer {
    /// Binds `config.addr` and starts serving `registry` (encoded at each scrape).
    pub fn start(config: ServerConfig, registry: Arc<Registry>) -> Result<Self, ServeError> {
        if !(1..=65_536).contains(&config.max_connections) {
            return Err(ServeError::BadConfig("max_connections must be 1..=65536"));
        }
        if config.timeout.is_zero() || config.head_timeout.is_zero() {
            return Err(ServeError::BadConfig(
                "timeout and head_timeout must be > 0",
            ));
        }
        if !(8 * 1024..=1024 * 1024).contains(&config.max_head_bytes) {
            return Err(ServeError::BadConfig(
                "max_head_bytes must be 8192..=1048576",
            ));
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(ServeError::Spawn)?;
        let bind = |source| ServeError::Bind {
            addr: config.addr,
            source,
        };
        let listener = {
            let _entered = runtime.enter();
            let socket = match config.addr {
                SocketAddr::V4(_) => TcpSocket::new_v4(),
                SocketAddr::V6(_) => TcpSocket::new_v6(),
            }
            .map_err(bind)?;
            socket.set_reuseaddr(true).map_err(bind)?;
            socket.bind(config.addr).map_err(bind)?;
            socket.listen(1024).map_err(bind)?
        };
        let addr = listener.local_addr().map_err(bind)?;
        if !addr.ip().is_loopback() {
            log::warn!(
                target: "specula::http",
                "serving /metrics on {addr}, which is not a loopback address: every host that \
                 can reach it can read the metrics"
            );
        }
        let (stop, stopped) = oneshot::channel();
        let shared = Arc::new(Shared { registry, config });
        let thread = std::thread::Builder::new()
            .name("specula-http".into())
            .spawn(move || {
                runtime.block_on(accept_loop(listener, shared, stopped));
                // Dropping the runtime drops whatever is left: nothing outlives the server.
            })
            .map_err(ServeError::Spawn)?;
        Ok(Self {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, gives the connections being served up to
    /// [`ServerConfig::shutdown_grace`] to finish, closes the rest and joins the thread.
    pub fn shutdown(mut self) {
        self.stop_thread();
    }

    fn stop_thread(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop_thread();
    }
}

/// A connection being served, as the acceptor sees it.
struct Live {
    phase: Arc<AtomicU8>,
    raw: Arc<std::net::TcpStream>,
    task: AbortHandle,
}

async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    mut stopped: oneshot::Receiver<()>,
) {
    let mut live: VecDeque<Live> = VecDeque::new();
    let mut tasks = JoinSet::new();
    loop {
        tokio::select! {
            biased;
            _ = &mut stopped => break,
            r = listener.accept() => match r {
                Ok((stream, _)) => {
                    if let Some(stream) = admit(stream, &shared, &mut live, &mut tasks) {
                        // Every slot is held by a connection that has not run yet (a burst of
                        // accepts): let them take their first turn, which reads what their
                        // clients sent without waiting, and try once more.
                        tokio::task::yield_now().await;
                        if let Some(stream) = admit(stream, &shared, &mut live, &mut tasks) {
                            overflow(stream);
                        }
                    }
                }
                Err(e) => {
                    // Out of descriptors, a connection reset before accept, …: transient. Back
                    // off briefly so a persistent error does not spin, but keep serving.
                    log::warn!(target: "specula::http", "accept failed: {e}");
                    tokio::select! {
                        _ = &mut stopped => break,
                        () = sleep(Duration::from_millis(50)) => {}
                    }
                }
            },
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
    drop(listener);
    let grace = shared.config.shutdown_grace;
    let _ = timeout(grace, async { while tasks.join_next().await.is_some() {} }).await;
    tasks.abort_all();
}

/// Admits `stream` within the connection cap, or gives it back when every slot is taken by a
/// connection that has not had its turn to read yet. Never waits: everything here is a
/// non-blocking call or bookkeeping.
fn admit(
    stream: TcpStream,
    shared: &Arc<Shared>,
    live: &mut VecDeque<Live>,
    tasks: &mut JoinSet<()>,
) -> Option<TcpStream> {
    while tasks.try_join_next().is_some() {}
    live.retain(|c| !c.task.is_finished());
    if live.len() >= shared.config.max_connections {
        // The oldest connection that has had its turn to read and still has no complete head.
        // Connections not yet polled may have their whole request waiting: they stay.
        let slow = live
            .iter()
            .position(|c| c.phase.load(Ordering::Acquire) == READING);
        match slow.and_then(|i| live.remove(i)) {
            Some(evicted) => {
                // No other task runs while this one does (one thread): the evicted connection
                // has written nothing, so it can take a 503 before it is closed.
                let _ = std::io::Write::write(&mut &*evicted.raw, RESPONSE_503);
                evicted.task.abort();
            }
            None => return Some(stream),
        }
    }
    // A second handle on the socket, to answer 408 or 503 without hyper.
    let Ok(std_stream) = stream.into_std() else {
        return None;
    };
    let Ok(raw) = std_stream.try_clone() else {
        return None;
    };
    let Ok(stream) = TcpStream::from_std(std_stream) else {
        return None;
    };
    let raw = Arc::new(raw);
    let phase = Arc::new(AtomicU8::new(QUEUED));
    let task = tasks.spawn(connection(
        stream,
        Arc::clone(&raw),
        Arc::clone(shared),
        Arc::clone(&phase),
    ));
    live.push_back(Live { phase, raw, task });
    None
}

/// Connection phases: spawned but not yet run; reading its head; head complete.
const QUEUED: u8 = 0;
const READING: u8 = 1;
const HEAD_DONE: u8 = 2;

const RESPONSE_503: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; \
    charset=utf-8\r\nContent-Length: 24\r\nConnection: close\r\nRetry-After: 1\r\n\r\n\
    503 Service Unavailable\n";

const RESPONSE_408: &[u8] = b"HTTP/1.1 408 Request Timeout\r\nContent-Type: text/plain; \
    charset=utf-8\r\nContent-Length: 20\r\nConnection: close\r\n\r\n408 Request Timeout\n";

/// Answers a connection over the cap with `503` and closes it, without waiting: a fresh
/// socket's send buffer takes the response whole, and what the client sent so far is read only
/// if it is there already (so that closing does not reset the connection before the client
/// reads the answer).
fn overflow(stream: TcpStream) {
    let mut sink = [0u8; 2048];
    let _ = stream.try_read(&mut sink);
    let _ = stream.try_write(RESPONSE_503);
}

/// Serves one connection within its deadlines.
async fn connection(
    stream: TcpStream,
    raw: Arc<std::net::TcpStream>,
    shared: Arc<Shared>,
    phase: Arc<AtomicU8>,
) {
    let _close = CloseOnDrop(Arc::clone(&raw));
    let start = Instant::now();
    let cfg = &shared.config;
    let deadline = start + cfg.timeout;
    let head_deadline = start + cfg.head_timeout.min(cfg.timeout);
    let svc = {
        let (shared, phase) = (Arc::clone(&shared), Arc::clone(&phase));
        hyper::service::service_fn(move |req: Request<Incoming>| {
            phase.store(HEAD_DONE, Ordering::Release);
            let resp = respond(&shared.registry, &req);
            std::future::ready(Ok::<_, Infallible>(resp))
        })
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .keep_alive(false)
        .half_close(false)
        .title_case_headers(true)
        .max_buf_size(cfg.max_head_bytes)
        .max_headers(64);
    // Boxed so that it can be dropped (closing hyper's handle) before the 408 is written.
    let mut conn = Box::pin(builder.serve_connection(TokioIo::new(stream), svc));
    let head = sleep_until(head_deadline);
    tokio::pin!(head);
    let mut head_checked = false;
    // Polled below before this task yields: whatever the client sent by now is read first.
    phase.store(READING, Ordering::Release);
    loop {
        tokio::select! {
            biased;
            _ = conn.as_mut() => return,
            () = &mut head, if !head_checked => {
                head_checked = true;
                if phase.load(Ordering::Acquire) != HEAD_DONE {
                    break;
                }
            }
            () = sleep_until(deadline) => {
                if phase.load(Ordering::Acquire) == HEAD_DONE {
                    return; // mid-response: just close
                }
                break;
            }
        }
    }
    // The head did not arrive in time: 408, written without waiting, then close.
    drop(conn);
    // The socket is non-blocking (the flag is shared with the clone): this never waits.
    let _ = std::io::Write::write(&mut &*raw, RESPONSE_408);
}

/// Shuts a connection down when its task ends, however it ends (finished, timed out, evicted,
/// or dropped with the runtime): the acceptor's second handle must not keep it open.
struct CloseOnDrop(Arc<std::net::TcpStream>);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        let _ = self.0.shutdown(std::net::Shutdown::Both);
    }
}

fn text(status: StatusCode) -> Response<Full<Bytes>> {
    let reason = status.canonical_reason().unwrap_or("");
    let mut r = Response::new(Full::new(Bytes::from(format!(
        "{} {reason}\n",
        status.as_u16()
    ))));
    *r.status_mut() = status;
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// The answer to one parsed request.
fn respond(registry: &Registry, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let hosts = req.headers().get_all(HOST).iter().count();
    let host_ok = match req.version() {
        Version::HTTP_11 => hosts == 1,
        Version::HTTP_10 => hosts <= 1,
        _ => false,
    };
    if !host_ok {
        return text(StatusCode::BAD_REQUEST);
    }
    if req.uri().path() != PATH {
        return text(StatusCode::NOT_FOUND);
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = text(StatusCode::METHOD_NOT_ALLOWED);
        r.headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    let mut accept = String::new();
    for v in req.headers().get_all(ACCEPT) {
        let Ok(v) = v.to_str() else {
            return text(StatusCode::BAD_REQUEST);
        };
        if !accept.is_empty() {
            accept.push(',');
        }
        accept.push_str(v);
    }
    let has_accept = req.headers().contains_key(ACCEPT);
    let Some(format) = negotiate(has_accept.then_some(accept.as_str())) else {
        return text(StatusCode::NOT_ACCEPTABLE);
    };
    let Ok(body) = render(registry, format) else {
        return text(StatusCode::INTERNAL_SERVER_ERROR);
    };
    let mut r = Response::new(Full::new(Bytes::from(body)));
    let h = r.headers_mut();
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static(format.content_type()),
    );
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}
