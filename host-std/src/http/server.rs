//! The `/metrics` server: hyper 1 (HTTP/1.x only) on a one-thread tokio runtime.

use super::{PATH, Scrape, scrape};
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
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::oneshot;
use tokio::task::{AbortHandle, JoinSet};
use tokio::time::{Instant, sleep, timeout, timeout_at};

/// Server settings. Build with `..ServerConfig::default()`; [`MetricsServer::start`] checks
/// the ranges.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Where to listen; loopback by default so metrics are not exposed by accident (binding
    /// any other address logs a warning).
    pub addr: SocketAddr,
    /// Connections open at once, those still sending their request head included
    /// (1..=65 536; by default [`default_max_connections`]). When all are taken, a new
    /// connection is admitted by evicting (`503`, then close) the connection accepted longest
    /// ago that has not sent a complete request head, whether or not its turn to read has come
    /// (what waits unread in its socket counts); the new connection gets `503` only when every
    /// connection holds a complete head, that is, is being answered. Each connection costs two
    /// descriptors and about as many bytes as its client sent (at most
    /// [`max_head_bytes`](Self::max_head_bytes)) until its head is complete.
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
            max_connections: default_max_connections(),
            head_timeout: Duration::from_secs(2),
            timeout: Duration::from_secs(5),
            max_head_bytes: 8 * 1024,
            shutdown_grace: Duration::from_millis(500),
        }
    }
}

/// The default [`ServerConfig::max_connections`]: an eighth of the process's descriptor limit
/// (the soft `RLIMIT_NOFILE`, read when called), between 64 and 4 096; 1 024 where there is no
/// such limit to read.
///
/// Large, because a crowd of slow or idle connections no larger than the cap is simply held
/// (each until its `head_timeout`) and costs a scraper nothing, while a crowd larger than the
/// cap churns: every eviction makes an attacker reconnect at once, and a scraper's connection
/// waits in the kernel's listen queue behind those reconnections. Bounded, because each
/// connection holds two descriptors (its socket and the acceptor's second handle on it): a
/// crowd never takes more than a quarter of the descriptors the rest of the process needs
/// (systemd's default soft limit of 1 024 gives 128 connections, a limit of 32 768 or more
/// 4 096), and at most about `max_head_bytes` of memory each (36 MiB at 4 096 connections that
/// all send 8 KiB without ending their head; an idle one costs a few hundred bytes).
pub fn default_max_connections() -> usize {
    const FALLBACK: usize = 1024;
    #[cfg(unix)]
    {
        const MAX: usize = 4096;
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit only writes one `rlimit` through the valid, exclusive pointer it is
        // given; no other memory is touched.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut lim) } != 0 {
            return FALLBACK;
        }
        // RLIM_INFINITY is the largest value: it maps to the cap like any large limit.
        // Two descriptors per connection (the socket and the acceptor's second handle).
        usize::try_from(lim.rlim_cur / 8).map_or(MAX, |q| q.clamp(64, MAX))
    }
    #[cfg(not(unix))]
    {
        FALLBACK
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
/// * **connections**: at most [`ServerConfig::max_connections`] (by default an eighth of the
///   process's descriptor limit, 64 to 4 096; two descriptors each). When full, a new
///   connection is admitted as long as one connection has not sent a complete request head:
///   the one accepted longest ago gets `503` and is closed. A connection whose whole head has
///   reached the server (parsed, or waiting unread in its socket) is never evicted; a scraper,
///   which writes its head as soon as it connects, is exposed only between its connect and
///   the arrival of its head, and is evicted then only if `max_connections` newer connections
///   are accepted in that time. A new connection gets `503` only when every connection holds
///   a complete head (they are being answered). Answers to overflow are written without
///   blocking, so overflow never costs the acceptor a wait; a connection reset or closed
///   before its turn costs a peek and no task; running out of descriptors evicts as a
///   newcomer would and accepts again at once. A crowd no larger than the cap is held (each
///   until its head deadline); a larger one churns, and a scraper then waits in the listen
///   queue (4 096 long) behind the attackers' reconnections;
/// * **memory**: a connection still sending its head holds what its client sent (no parser
///   state); a request head over [`ServerConfig::max_head_bytes`] gets `431`; request bodies
///   are never read;
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
            socket.listen(LISTEN_BACKLOG).map_err(bind)?
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
                // The acceptor is a task like the connections, not the future `block_on`
                // polls: the scheduler runs at most 61 tasks between two polls of that one,
                // so an acceptor there could spawn (and evict) connections faster than they
                // run, and a scraper's task would wait behind an ever longer queue (seconds
                // under a reconnecting crowd). As a task it takes its turn in the same FIFO
                // queue: everything it spawned in one turn runs before its next.
                runtime.block_on(async move {
                    let _ = tokio::spawn(accept_loop(listener, shared, stopped)).await;
                });
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
    pub fn shutdown(self) {
        // Dropping the server does it.
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The listen queue asked for (the kernel caps it: `net.core.somaxconn` on Linux, 4 096 by
/// default since 5.4). Under a crowd larger than the cap, or a flood of connections, new
/// connections wait there to be accepted, a scraper's among them, first in first out; when it is
/// full the kernel drops new SYNs and the client retries only after its retransmission timer
/// (1 s, then 2 s, 4 s, …). A long queue makes that wait proportional to the attack (served at
/// the acceptor's full speed) rather than exponential: as long as the kernel allows. Measured
/// with a reconnecting crowd of 2 000 at a cap of 64 (`tests/it/http_admission.rs`): p99 0.7 s
/// with 4 096, 1.2 s with 1 024 (a SYN retransmission).
const LISTEN_BACKLOG: u32 = 4096;

/// A connection being served, as the acceptor sees it.
struct Live {
    phase: Arc<AtomicU8>,
    /// The second handle on the socket. The task holds the only strong reference, so the
    /// descriptor closes when the task ends, whenever the acceptor gets round to this entry.
    raw: Weak<std::net::TcpStream>,
    task: AbortHandle,
}

async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    mut stopped: oneshot::Receiver<()>,
) {
    let mut live = Admission::new(shared.config.max_head_bytes);
    let mut tasks = JoinSet::new();
    loop {
        tokio::select! {
            biased;
            _ = &mut stopped => break,
            r = listener.accept() => match r {
                Ok((stream, _)) => {
                    let accepted = Instant::now();
                    reap(&mut live, &mut tasks);
                    let Some(new) = Newcomer::prepare(stream, accepted, &mut live) else {
                        continue;
                    };
                    if let Err(new) = admit(new, &shared, &mut live, &mut tasks) {
                        // Every connection holds a complete request head: they are being
                        // answered, which takes no waiting on a client that reads. Let them
                        // take their turn (the runtime polls every ready task before this one
                        // resumes) and try once more before refusing.
                        tokio::task::yield_now().await;
                        reap(&mut live, &mut tasks);
                        if let Err(new) = admit(new, &shared, &mut live, &mut tasks) {
                            overflow(&new.raw);
                        }
                    }
                }
                Err(e) if out_of_descriptors(&e) => {
                    // The process's descriptor table is full: free one by evicting as a
                    // newcomer would, and accept again at once, so that a crowd cannot keep
                    // the connections waiting in the listen queue (a scraper among them) out.
                    // With nothing to evict, back off briefly so that this does not spin.
                    reap(&mut live, &mut tasks);
                    if !live.evict_one() {
                        log::warn!(target: "specula::http", "accept failed: {e}");
                        tokio::select! {
                            _ = &mut stopped => break,
                            () = sleep(Duration::from_millis(50)) => {}
                        }
                    }
                }
                Err(e) => {
                    // A connection reset or aborted before it was accepted, …: that
                    // connection's problem, not the listener's. Accept the next one at once
                    // (a reset crowd must not slow the queue down), after a yield so that a
                    // listener that keeps failing still lets the connections run.
                    log::debug!(target: "specula::http", "accept failed: {e}");
                    tokio::task::yield_now().await;
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

/// True for the accept errors that say the process (or the system) has no descriptor left.
fn out_of_descriptors(e: &io::Error) -> bool {
    #[cfg(unix)]
    {
        matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
    }
    #[cfg(not(unix))]
    {
        let _ = e;
        false
    }
}

/// Collects the tasks that have ended (after which `tasks.len()` is the number of
/// connections open) and drops the entries of ended connections: from the front at once,
/// elsewhere once they are half the entries, so that each costs O(1) however large the cap.
fn reap(live: &mut Admission, tasks: &mut JoinSet<()>) {
    while tasks.try_join_next().is_some() {}
    while live.conns.front().is_some_and(|c| c.task.is_finished()) {
        live.conns.pop_front();
    }
    if live.conns.len() > 2 * tasks.len() + 64 {
        live.conns.retain(|c| !c.task.is_finished());
    }
}

/// A connection just accepted, not yet admitted.
struct Newcomer {
    stream: TcpStream,
    /// The second handle on its socket (one `dup`, sharing the non-blocking flag), to answer
    /// 408 or 503 without hyper and to look at what the client has sent without reading it.
    raw: std::net::TcpStream,
    phase: u8,
    accepted: Instant,
}

impl Newcomer {
    /// The second handle and a look at what the client sent; `None` (the connection is closed)
    /// when the client has already closed or reset it (a reset crowd costs a peek, no task and
    /// no eviction) or no descriptor can be had even after evicting one.
    fn prepare(stream: TcpStream, accepted: Instant, live: &mut Admission) -> Option<Self> {
        let raw = match duplicate(&stream) {
            Ok(raw) => raw,
            Err(e) if out_of_descriptors(&e) && live.evict_one() => duplicate(&stream).ok()?,
            Err(_) => return None,
        };
        let phase = match sent(&raw, &mut live.peek) {
            Sent::Gone => return None,
            Sent::Head => HEAD_WAITING,
            Sent::Partial => QUEUED,
        };
        Some(Self {
            stream,
            raw,
            phase,
            accepted,
        })
    }
}

/// Admits `new` within the connection cap, evicting the connection that has been sending its
/// head the longest when the cap is reached; gives `new` back when every connection holds a
/// complete request head (they are being answered). Never waits: everything here is a
/// non-blocking call or bookkeeping. Call [`reap`] first.
fn admit(
    new: Newcomer,
    shared: &Arc<Shared>,
    live: &mut Admission,
    tasks: &mut JoinSet<()>,
) -> Result<(), Newcomer> {
    if tasks.len() >= shared.config.max_connections && !live.evict_one() {
        return Err(new);
    }
    let raw = Arc::new(new.raw);
    let phase = Arc::new(AtomicU8::new(new.phase));
    let task = tasks.spawn(connection(
        new.stream,
        Arc::clone(&raw),
        Arc::clone(shared),
        Arc::clone(&phase),
        new.accepted,
    ));
    live.conns.push_back(Live {
        phase,
        raw: Arc::downgrade(&raw),
        task,
    });
    Ok(())
}

/// A second handle on `stream`'s socket.
fn duplicate(stream: &TcpStream) -> io::Result<std::net::TcpStream> {
    #[cfg(not(windows))]
    {
        use std::os::fd::AsFd;
        Ok(stream.as_fd().try_clone_to_owned()?.into())
    }
    #[cfg(windows)]
    {
        use std::os::windows::io::AsSocket;
        Ok(stream.as_socket().try_clone_to_owned()?.into())
    }
}

/// What a client has sent so far and not yet read by the server.
enum Sent {
    /// Nothing, or part of a request head.
    Partial,
    /// A complete request head, or more bytes than a head may have (answered 431).
    Head,
    /// The client closed or reset the connection.
    Gone,
}

/// Looks at what waits in `raw`'s socket without reading it (a non-blocking peek).
fn sent(raw: &std::net::TcpStream, buf: &mut [u8]) -> Sent {
    match raw.peek(buf) {
        Ok(0) => Sent::Gone,
        Ok(n) if n == buf.len() || head_complete(&buf[..n]) => Sent::Head,
        Ok(_) => Sent::Partial,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Sent::Partial,
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Sent::Partial,
        Err(_) => Sent::Gone,
    }
}

/// The connections being served, oldest first, and a buffer to look at what they were sent.
///
/// Who is evicted when the cap is reached: the connection accepted longest ago that has no
/// complete request head, neither parsed by its task nor waiting in its socket. A client
/// whose whole head has reached the server is therefore never evicted, even before its task
/// has had a turn (a burst of accepts runs before any connection task does); one still
/// sending is evicted only after every incomplete connection accepted before it, so a client
/// that sends its head promptly (a scraper, which writes it as soon as it connects) survives
/// as many newer connections as the cap, while the connection evicted is always the one that
/// has been reading its head the longest: the one most likely an attacker, and the one whose
/// `head_timeout` is nearest anyway. Nothing is refused while one connection can be evicted.
///
/// Why no grace period that would shield young connections from eviction: a crowd that
/// reconnects faster than the period keeps every connection young, and newcomers, a scraper
/// among them, would have to be refused. Evicting by age refuses nobody.
struct Admission {
    conns: VecDeque<Live>,
    peek: Vec<u8>,
}

impl Admission {
    fn new(max_head_bytes: usize) -> Self {
        Self {
            conns: VecDeque::new(),
            peek: vec![0; max_head_bytes],
        }
    }

    /// Evicts the first connection (oldest first) that [`Live::evictable`] picks: it gets
    /// `503` and is closed. False when none can be.
    fn evict_one(&mut self) -> bool {
        let peek = &mut self.peek;
        let Some(i) = self.conns.iter().position(|c| c.evictable(peek)) else {
            return false;
        };
        let Some(evicted) = self.conns.remove(i) else {
            return false;
        };
        // No other task runs while this one does (one thread): the evicted connection has
        // written nothing, so it can take a 503 before it is closed.
        if let Some(raw) = evicted.raw.upgrade() {
            let _ = std::io::Write::write(&mut &*raw, RESPONSE_503);
        }
        evicted.task.abort();
        true
    }
}

/// Connection phases, in the order they are reached (moved forward with `fetch_max`, never
/// back): spawned but not yet run; reading its head; a complete head seen waiting in the
/// socket by the acceptor (its task will parse it at its next turn); head parsed.
const QUEUED: u8 = 0;
const READING: u8 = 1;
const HEAD_WAITING: u8 = 2;
const HEAD_DONE: u8 = 3;

impl Live {
    /// True if this connection may be evicted: its head is neither parsed nor complete in its
    /// socket (looked at without reading it, so its task still reads it all). A connection
    /// the client has closed or reset is evictable too: there is nobody to answer.
    ///
    /// What the task has already read is not looked at: a head whose end (an empty line) is
    /// split between what the task read and what is still in the socket is judged by the
    /// second part alone; a scraper writes its head at once and never meets this.
    fn evictable(&self, peek: &mut [u8]) -> bool {
        // An ended connection holds no slot (it is not counted): nothing to evict.
        if self.task.is_finished() || self.phase.load(Ordering::Acquire) >= HEAD_WAITING {
            return false;
        }
        let Some(raw) = self.raw.upgrade() else {
            return false;
        };
        match sent(&raw, peek) {
            Sent::Head => {
                self.phase.fetch_max(HEAD_WAITING, Ordering::AcqRel);
                false
            }
            Sent::Partial | Sent::Gone => true,
        }
    }
}

/// True if `bytes` hold the end of a request head: an empty line (`\r\n\r\n`, or the bare
/// `\n\n` / `\n\r\n` that hyper's parser also accepts).
fn head_complete(bytes: &[u8]) -> bool {
    bytes
        .windows(2)
        .enumerate()
        .any(|(i, w)| w == b"\n\n" || (w == b"\n\r" && bytes.get(i + 2) == Some(&b'\n')))
}

const RESPONSE_503: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; \
    charset=utf-8\r\nContent-Length: 24\r\nConnection: close\r\nRetry-After: 1\r\n\r\n\
    503 Service Unavailable\n";

const RESPONSE_408: &[u8] = b"HTTP/1.1 408 Request Timeout\r\nContent-Type: text/plain; \
    charset=utf-8\r\nContent-Length: 20\r\nConnection: close\r\n\r\n408 Request Timeout\n";

/// Answers a connection over the cap with `503` (the caller then closes it), without waiting:
/// a fresh socket's send buffer takes the response whole, and what the client sent so far is
/// read only if it is there already (so that closing does not reset the connection before the
/// client reads the answer). Through the second handle: the runtime has no write readiness yet
/// for a socket it has just accepted, so its own `try_write` would write nothing.
fn overflow(raw: &std::net::TcpStream) {
    let mut sink = [0u8; 2048];
    let _ = std::io::Read::read(&mut &*raw, &mut sink);
    let _ = std::io::Write::write(&mut &*raw, RESPONSE_503);
}

/// Serves one connection within its deadlines, both counted from `accepted`. The request head
/// is read here, into a buffer the size of what the client sent (a connection still sending
/// its head costs its bytes, not a parser's buffers), and handed to hyper with the socket once
/// it is complete: hyper parses it and answers.
async fn connection(
    stream: TcpStream,
    raw: Arc<std::net::TcpStream>,
    shared: Arc<Shared>,
    phase: Arc<AtomicU8>,
    accepted: Instant,
) {
    // `raw` is the only strong reference to the second handle (the acceptor keeps a weak
    // one): however this task ends (finished, timed out, evicted, or dropped with the
    // runtime), both descriptors close with it.
    let cfg = &shared.config;
    let deadline = accepted + cfg.timeout;
    let head_deadline = accepted + cfg.head_timeout.min(cfg.timeout);
    // `fetch_max`: the acceptor may have seen the whole head waiting already.
    phase.fetch_max(READING, Ordering::AcqRel);
    let mut head = Vec::new();
    match timeout_at(
        head_deadline,
        read_head(&stream, &raw, &mut head, cfg.max_head_bytes),
    )
    .await
    {
        Ok(Ok(())) => {}
        // Closed or reset by the client before its head was complete: nobody to answer.
        Ok(Err(_)) => return,
        Err(_) => {
            // The head did not arrive in time: 408, written without waiting (the socket is
            // non-blocking, the flag shared with the clone), then close.
            let _ = std::io::Write::write(&mut &*raw, RESPONSE_408);
            return;
        }
    }
    phase.fetch_max(HEAD_DONE, Ordering::AcqRel);
    let svc = {
        let shared = Arc::clone(&shared);
        hyper::service::service_fn(move |req: Request<Incoming>| {
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
    let io = Replay {
        head,
        at: 0,
        stream,
    };
    // Boxed: a connection still sending its head does not carry hyper's state in its task.
    let conn = Box::pin(builder.serve_connection(TokioIo::new(io), svc));
    // Past the deadline the connection is closed, mid-response or not.
    let _ = timeout_at(deadline, conn).await;
}

/// Reads into `head` until it holds the end of a request head (an empty line) or `max` bytes
/// (hyper answers those `431`); bytes after the head in the same read stay in `head` too.
/// An error when the client closes or resets the connection first.
async fn read_head(
    stream: &TcpStream,
    raw: &std::net::TcpStream,
    head: &mut Vec<u8>,
    max: usize,
) -> io::Result<()> {
    // First straight from the socket: a scraper's head is usually there by now, and the
    // runtime has no readiness for a socket it has not polled yet.
    let mut first = true;
    loop {
        let read = if first {
            first = false;
            read_some(head, max, |buf| std::io::Read::read(&mut &*raw, buf))
        } else {
            stream.readable().await?;
            read_some(head, max, |buf| stream.try_read(buf))
        };
        match read {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// One non-blocking read into `head` (at most up to `max` bytes in all); true once the head
/// is complete or `max` bytes long, an `UnexpectedEof` error at the client's end of stream.
fn read_some(
    head: &mut Vec<u8>,
    max: usize,
    read: impl FnOnce(&mut [u8]) -> io::Result<usize>,
) -> io::Result<bool> {
    let mut buf = [0u8; 2048];
    let want = max.saturating_sub(head.len()).min(buf.len());
    let n = read(&mut buf[..want])?;
    if n == 0 {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    // The end of the head may straddle two reads: look from two bytes back.
    let from = head.len().saturating_sub(2);
    head.extend_from_slice(&buf[..n]);
    Ok(head.len() >= max || head_complete(&head[from..]))
}

/// The socket with the bytes already read from it (the request head) in front, for hyper.
struct Replay {
    head: Vec<u8>,
    at: usize,
    stream: TcpStream,
}

impl tokio::io::AsyncRead for Replay {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        let this = &mut *self;
        if this.at < this.head.len() {
            let n = buf.remaining().min(this.head.len() - this.at);
            buf.put_slice(&this.head[this.at..this.at + n]);
            this.at += n;
            if this.at == this.head.len() {
                // Replayed: free it.
                this.head = Vec::new();
                this.at = 0;
            }
            return std::task::Poll::Ready(Ok(()));
        }
        std::pin::Pin::new(&mut this.stream).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Replay {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        std::pin::Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> std::task::Poll<io::Result<usize>> {
        std::pin::Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// `answer` as hyper's response, with `Cache-Control: no-store` on `200`.
fn send(answer: Scrape) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(answer.body)));
    *r.status_mut() =
        StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static(answer.content_type));
    if answer.status == 200 {
        h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    r
}

/// The plain-text answer of an error `status`.
fn text(status: StatusCode) -> Response<Full<Bytes>> {
    let reason = status.canonical_reason().unwrap_or("");
    send(Scrape::error(status.as_u16(), reason))
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
    send(scrape(
        registry,
        req.headers()
            .get_all(ACCEPT)
            .iter()
            .map(HeaderValue::as_bytes),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_end_of_a_head_is_an_empty_line_with_any_line_ending() {
        for done in [
            &b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"[..],
            b"GET / HTTP/1.1\nHost: x\n\n",
            b"GET / HTTP/1.1\r\nHost: x\n\r\n",
            b"\n\n",
            b"GET / HTTP/1.1\r\n\r\nbody",
        ] {
            assert!(head_complete(done), "{:?}", String::from_utf8_lossy(done));
        }
        for partial in [
            &b""[..],
            b"GET / HTTP/1.1\r\n",
            b"GET / HTTP/1.1\r\nHost: x\r\n",
            b"GET / HTTP/1.1\r\nHost: x\r\n\r",
            b"\r\r\n",
            b"\n\r",
        ] {
            assert!(
                !head_complete(partial),
                "{:?}",
                String::from_utf8_lossy(partial)
            );
        }
    }

    /// Feeds `chunks` to `read_some` one read each; the index of the read that completed the
    /// head, if one did, and what was buffered.
    fn feed(chunks: &[&[u8]], max: usize) -> (Option<usize>, Vec<u8>) {
        let mut head = Vec::new();
        for (i, c) in chunks.iter().enumerate() {
            let done = read_some(&mut head, max, |buf| {
                let n = c.len().min(buf.len());
                buf[..n].copy_from_slice(&c[..n]);
                Ok(n)
            })
            .unwrap();
            if done {
                return (Some(i), head);
            }
        }
        (None, head)
    }

    #[test]
    fn a_head_split_anywhere_is_complete_at_its_last_byte() {
        let req: &[u8] = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
        for cut in 1..req.len() {
            let (done, head) = feed(&[&req[..cut], &req[cut..]], 8192);
            assert_eq!(done, Some(1), "cut at {cut}");
            assert_eq!(head, req);
        }
        // One byte at a time (a trickle): complete at the very last byte, not before.
        let bytes: Vec<&[u8]> = req.chunks(1).collect();
        assert_eq!(feed(&bytes, 8192).0, Some(req.len() - 1));
    }

    #[test]
    fn a_head_stops_at_max_bytes_and_an_end_of_stream_is_an_error() {
        // 20 bytes without an end, max 16: complete (hyper answers 431) with 16 bytes read.
        let (done, head) = feed(&[b"GET /aaaaaaaaaaaaaaaaaaaaa"], 16);
        assert_eq!((done, head.len()), (Some(0), 16));
        let mut head = Vec::new();
        let eof = read_some(&mut head, 16, |_| Ok(0));
        assert_eq!(eof.map_err(|e| e.kind()), Err(io::ErrorKind::UnexpectedEof));
    }
}
