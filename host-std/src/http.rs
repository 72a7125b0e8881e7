//! HTTP `/metrics`: a small, bounded scrape endpoint.
//!
//! Why not tiny_http (which the workspace also declares): tiny_http 0.12 starts one thread per
//! open connection with no upper limit, sets no socket timeouts, buffers header lines without a
//! size limit, and its accept thread exits for good on the first `accept` error (for instance
//! running out of file descriptors). A scrape endpoint serves one resource to one scraper, so a
//! fixed pool over `std::net` that answers one request per connection meets every bound with a
//! couple of hundred lines:
//! * threads: one acceptor plus `workers`; connections beyond the queue get `503` at once;
//! * time: each connection has one overall deadline (`timeout`), so a client that trickles
//!   bytes is cut off as surely as one that sends nothing (`408`);
//! * memory: a request head over `max_head_bytes` gets `431`; bodies are never read;
//! * `404` for other paths, `405` (with `Allow`) for other methods on `/metrics`, `400` for
//!   anything that is not an HTTP/1.x request line.

use crate::prom::{Format, render};
use prometheus_client::registry::Registry;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The path served.
pub const PATH: &str = "/metrics";

/// Server settings.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Where to listen; loopback by default so metrics are not exposed by accident.
    pub addr: SocketAddr,
    /// Worker threads answering requests.
    pub workers: usize,
    /// Accepted connections waiting for a worker; more get `503`.
    pub queue: usize,
    /// Overall deadline of one connection, from accept to the last byte written.
    pub timeout: Duration,
    /// Largest request head (request line and headers) read.
    pub max_head_bytes: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            addr: SocketAddr::from(([127, 0, 0, 1], 9464)),
            workers: 2,
            queue: 32,
            timeout: Duration::from_secs(5),
            max_head_bytes: 8 * 1024,
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
    /// A thread could not be started.
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
            Self::Spawn(e) => write!(f, "cannot start a metrics server thread: {e}"),
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

/// A running `/metrics` endpoint. Dropping it (or [`shutdown`](Self::shutdown)) stops it.
#[derive(Debug)]
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

struct Shared {
    registry: Arc<Registry>,
    config: ServerConfig,
}

impl MetricsServer {
    /// Binds `config.addr` and starts serving `registry` (encoded at each scrape).
    pub fn start(config: ServerConfig, registry: Arc<Registry>) -> Result<Self, ServeError> {
        if config.workers == 0 || config.queue == 0 {
            return Err(ServeError::BadConfig(
                "workers and queue must be at least 1",
            ));
        }
        if config.timeout.is_zero() || config.max_head_bytes < 64 {
            return Err(ServeError::BadConfig(
                "timeout must be > 0 and max_head_bytes >= 64",
            ));
        }
        let listener = TcpListener::bind(config.addr).map_err(|source| ServeError::Bind {
            addr: config.addr,
            source,
        })?;
        let addr = listener.local_addr().map_err(|source| ServeError::Bind {
            addr: config.addr,
            source,
        })?;
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = sync_channel::<(TcpStream, Instant)>(config.queue);
        let rx = Arc::new(Mutex::new(rx));
        let shared = Arc::new(Shared { registry, config });
        let mut server = Self {
            addr,
            stop: Arc::clone(&stop),
            threads: Vec::new(),
        };
        for i in 0..shared.config.workers {
            let (rx, shared) = (Arc::clone(&rx), Arc::clone(&shared));
            let t = std::thread::Builder::new()
                .name(format!("specula-http-{i}"))
                .spawn(move || worker(&rx, &shared))
                .map_err(ServeError::Spawn)?;
            server.threads.push(t);
        }
        let t = std::thread::Builder::new()
            .name("specula-http-accept".into())
            .spawn(move || acceptor(&listener, &tx, &stop, shared.config.timeout))
            .map_err(ServeError::Spawn)?;
        server.threads.push(t);
        Ok(server)
    }

    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, lets the workers finish the connections already accepted, and joins
    /// every thread.
    pub fn shutdown(mut self) {
        self.stop_threads();
    }

    fn stop_threads(&mut self) {
        if self.stop.swap(true, Ordering::SeqCst) {
            return;
        }
        // Wake the acceptor, which is blocked in accept(). If the connect fails the acceptor is
        // gone already (or the address is unreachable) and joining does not block on it.
        let _ = TcpStream::connect_timeout(&wake_addr(self.addr), Duration::from_secs(1));
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop_threads();
    }
}

/// The address to connect to in order to wake an acceptor bound to `addr`.
fn wake_addr(addr: SocketAddr) -> SocketAddr {
    let mut a = addr;
    if a.ip().is_unspecified() {
        a.set_ip(match a {
            SocketAddr::V4(_) => [127, 0, 0, 1].into(),
            SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    a
}

fn acceptor(
    listener: &TcpListener,
    tx: &SyncSender<(TcpStream, Instant)>,
    stop: &AtomicBool,
    timeout: Duration,
) {
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, _)) => {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                match tx.try_send((stream, Instant::now())) {
                    Ok(()) => {}
                    Err(TrySendError::Full((stream, _))) => {
                        // Overloaded: answer at once rather than queue without bound. The
                        // response fits in a fresh socket's send buffer, so this does not block
                        // for long; the write timeout bounds it anyway.
                        let _ = stream.set_write_timeout(Some(timeout.min(Duration::from_secs(1))));
                        respond_status(stream, 503, "Service Unavailable", &[]);
                    }
                    Err(TrySendError::Disconnected(_)) => break,
                }
            }
            Err(e) => {
                // Out of descriptors, a connection reset before accept, …: transient. Back off
                // briefly so a persistent error does not spin, but never give up serving.
                log::warn!(target: "specula::http", "accept failed: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    // Dropping `tx` ends the workers once the queue is drained.
}

fn worker(rx: &Mutex<Receiver<(TcpStream, Instant)>>, shared: &Shared) {
    loop {
        let next = rx.lock().unwrap_or_else(PoisonError::into_inner).recv();
        let Ok((stream, accepted)) = next else { return };
        handle(stream, accepted, shared);
    }
}

/// What a request head asked for.
#[derive(Debug, PartialEq, Eq)]
enum Head {
    /// A well-formed request line and headers.
    Request {
        method: String,
        path: String,
        accept: Option<String>,
    },
    /// Not HTTP/1.x.
    Malformed,
}

fn parse_head(head: &[u8]) -> Head {
    let Ok(text) = std::str::from_utf8(head) else {
        return Head::Malformed;
    };
    let mut lines = text.split("\r\n").flat_map(|l| l.split('\n'));
    let Some(request_line) = lines.next() else {
        return Head::Malformed;
    };
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Head::Malformed;
    };
    let method_ok = !method.is_empty() && method.bytes().all(|b| b.is_ascii_uppercase());
    if !method_ok || !matches!(version, "HTTP/1.0" | "HTTP/1.1") || !target.starts_with('/') {
        return Head::Malformed;
    }
    let mut accept = None;
    for line in lines {
        if line.is_empty() {
            break;
        }
        let Some((name, value)) = line.split_once(':') else {
            return Head::Malformed;
        };
        if name.eq_ignore_ascii_case("accept") {
            accept = Some(value.trim().to_owned());
        }
    }
    let path = target.split(['?', '#']).next().unwrap_or(target);
    Head::Request {
        method: method.to_owned(),
        path: path.to_owned(),
        accept,
    }
}

/// Why reading a head stopped.
enum ReadHead {
    Complete(Vec<u8>),
    TooLarge,
    TimedOut,
    Closed,
}

fn read_head(stream: &mut TcpStream, deadline: Instant, max: usize) -> ReadHead {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            return ReadHead::TimedOut;
        }
        match stream.read(&mut chunk) {
            Ok(0) => return ReadHead::Closed,
            Ok(n) => {
                let from = buf.len().saturating_sub(3);
                buf.extend_from_slice(&chunk[..n]);
                let tail = &buf[from..];
                let end = find(tail, b"\r\n\r\n")
                    .map(|i| from + i + 4)
                    .or_else(|| find(tail, b"\n\n").map(|i| from + i + 2));
                if let Some(end) = end {
                    if end > max {
                        return ReadHead::TooLarge;
                    }
                    buf.truncate(end);
                    return ReadHead::Complete(buf);
                }
                if buf.len() > max {
                    return ReadHead::TooLarge;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return ReadHead::TimedOut;
            }
            Err(_) => return ReadHead::Closed,
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn handle(mut stream: TcpStream, accepted: Instant, shared: &Shared) {
    let cfg = &shared.config;
    let deadline = accepted + cfg.timeout;
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() || stream.set_write_timeout(Some(left)).is_err() {
        return; // waited in the queue past its deadline: the client has given up
    }
    let head = match read_head(&mut stream, deadline, cfg.max_head_bytes) {
        ReadHead::Complete(h) => h,
        ReadHead::TooLarge => {
            return respond_status(stream, 431, "Request Header Fields Too Large", &[]);
        }
        ReadHead::TimedOut => return respond_status(stream, 408, "Request Timeout", &[]),
        ReadHead::Closed => return,
    };
    match parse_head(&head) {
        Head::Malformed => respond_status(stream, 400, "Bad Request", &[]),
        Head::Request { path, .. } if path != PATH => respond_status(stream, 404, "Not Found", &[]),
        Head::Request { method, accept, .. } => match method.as_str() {
            "GET" | "HEAD" => {
                let format = Format::negotiate(accept.as_deref());
                match render(&shared.registry, format) {
                    Ok(body) => respond(
                        stream,
                        "200 OK",
                        &[("Content-Type", format.content_type())],
                        body.as_bytes(),
                        method == "HEAD",
                    ),
                    Err(_) => respond_status(stream, 500, "Internal Server Error", &[]),
                }
            }
            _ => respond_status(stream, 405, "Method Not Allowed", &[("Allow", "GET, HEAD")]),
        },
    }
}

fn respond_status(stream: TcpStream, code: u16, reason: &str, headers: &[(&str, &str)]) {
    let status = format!("{code} {reason}");
    let mut h = vec![("Content-Type", "text/plain; charset=utf-8")];
    h.extend_from_slice(headers);
    let body = format!("{status}\n");
    respond(stream, &status, &h, body.as_bytes(), false);
}

fn respond(mut stream: TcpStream, status: &str, headers: &[(&str, &str)], body: &[u8], head: bool) {
    let mut out = Vec::with_capacity(body.len() + 256);
    let _ = write!(out, "HTTP/1.1 {status}\r\n");
    for (k, v) in headers {
        let _ = write!(out, "{k}: {v}\r\n");
    }
    let _ = write!(
        out,
        "Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if !head {
        out.extend_from_slice(body);
    }
    if stream.write_all(&out).is_err() {
        return;
    }
    // Lingering close: stop writing, then read (and discard) briefly what the client still
    // sends, so closing with unread bytes does not reset the connection before the client has
    // read the response.
    let _ = stream.shutdown(Shutdown::Write);
    let _ = stream.set_read_timeout(Some(Duration::from_millis(100)));
    let mut sink = [0u8; 4096];
    let mut drained = 0usize;
    while drained < 64 * 1024 {
        match stream.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(n) => drained += n,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_parse_strictly() {
        let h = parse_head(b"GET /metrics?x=1 HTTP/1.1\r\nAccept: text/plain\r\n\r\n");
        assert_eq!(
            h,
            Head::Request {
                method: "GET".into(),
                path: "/metrics".into(),
                accept: Some("text/plain".into())
            }
        );
        for bad in [
            &b"\x00\xff\xfe garbage\r\n\r\n"[..],
            b"GET /metrics\r\n\r\n",
            b"GET /metrics HTTP/2.0\r\n\r\n",
            b"get /metrics HTTP/1.1\r\n\r\n",
            b"GET metrics HTTP/1.1\r\n\r\n",
            b"GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n",
            b"",
        ] {
            assert_eq!(parse_head(bad), Head::Malformed, "{bad:?}");
        }
    }
}
