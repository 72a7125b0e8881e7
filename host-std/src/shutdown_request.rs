//! The shutdown request, public as `specula::shutdown::{Reason, Shutdown}`: below both
//! `log_sink` (a failed write requests a shutdown) and `shutdown` (whose `finish` stops the log
//! thread), so that those two never import each other.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Why a shutdown was requested.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reason {
    /// A signal, by number (`SIGINT` = 2, `SIGTERM` = 15 on Unix).
    Signal(i32),
    /// Writing the program's output failed (a closed pipe, a full disk).
    Output,
    /// Asked for by code (an admin endpoint, a test, an example).
    Requested,
}

impl Reason {
    /// A short name for messages: `SIGINT`, `SIGTERM`, `signal 1`, `output failure`, `request`.
    pub fn name(&self) -> String {
        match *self {
            Self::Signal(2) => "SIGINT".into(),
            Self::Signal(15) => "SIGTERM".into(),
            Self::Signal(n) => format!("signal {n}"),
            Self::Output => "output failure".into(),
            Self::Requested => "request".into(),
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

#[derive(Debug, Default)]
struct Inner {
    /// Requests so far; read without the lock on the hot path.
    requests: AtomicU64,
    /// The first request's reason, and whether an output failure was ever requested.
    state: Mutex<State>,
    wake: Condvar,
}

#[derive(Debug, Default)]
struct State {
    first: Option<Reason>,
    output_failed: bool,
}

/// A shutdown request shared by clones: any clone can [`request`](Self::request) it, every
/// clone sees it. Checking it is one atomic load, cheap enough for every decode step; waiting
/// on it ([`wait_for_request`](Self::wait_for_request)) holds no lock while it sleeps and
/// wakes as soon as a request comes.
///
/// Requests are counted, so a second one can mean more than the first (the `specula` program:
/// the first signal stops the run, one more ends `--linger`).
#[derive(Clone, Debug, Default)]
pub struct Shutdown {
    inner: Arc<Inner>,
}

impl Shutdown {
    /// A shutdown nobody has requested yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Requests shutdown (again): counts the request, remembers the first reason and wakes
    /// every waiter. Never blocks for long and never panics (a poisoned lock is still used).
    pub fn request(&self, reason: Reason) {
        let mut s = self.lock();
        s.first.get_or_insert(reason);
        s.output_failed |= reason == Reason::Output;
        self.inner.requests.fetch_add(1, Ordering::SeqCst);
        drop(s);
        self.inner.wake.notify_all();
    }

    /// True once any request was made.
    #[inline]
    pub fn is_requested(&self) -> bool {
        self.requests() != 0
    }

    /// How many requests were made so far.
    #[inline]
    pub fn requests(&self) -> u64 {
        self.inner.requests.load(Ordering::SeqCst)
    }

    /// The first request's reason, if any.
    pub fn reason(&self) -> Option<Reason> {
        self.lock().first
    }

    /// True if any request was [`Reason::Output`].
    pub fn output_failed(&self) -> bool {
        self.lock().output_failed
    }

    /// Waits until more than `seen` requests were made or `timeout` passed; true if a request
    /// beyond `seen` came. Sleeps on a condition variable (no lock held while it sleeps).
    pub fn wait_for_request(&self, seen: u64, timeout: Duration) -> bool {
        let deadline = Instant::now().checked_add(timeout);
        let mut s = self.lock();
        loop {
            if self.requests() > seen {
                return true;
            }
            let left = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()),
                // A timeout past the end of `Instant`: wait in long steps.
                None => Duration::from_secs(3600),
            };
            if left.is_zero() {
                return false;
            }
            s = self
                .inner
                .wake
                .wait_timeout(s, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_counted_and_the_first_reason_kept() {
        let s = Shutdown::new();
        assert!(!s.is_requested());
        assert_eq!(s.reason(), None);
        let c = s.clone();
        c.request(Reason::Signal(15));
        c.request(Reason::Output);
        assert_eq!(s.requests(), 2);
        assert_eq!(s.reason(), Some(Reason::Signal(15)));
        assert!(s.output_failed());
        assert_eq!(Reason::Signal(15).to_string(), "SIGTERM");
        assert_eq!(Reason::Signal(2).to_string(), "SIGINT");
    }

    #[test]
    fn a_waiter_wakes_on_a_request_from_another_thread() {
        let s = Shutdown::new();
        let c = s.clone();
        let t = std::thread::spawn(move || c.wait_for_request(0, Duration::from_secs(600)));
        s.request(Reason::Requested);
        assert!(t.join().unwrap(), "woken by the request, not the timeout");
        // Already more than 0 requests: returns at once; none beyond 1: times out.
        assert!(s.wait_for_request(0, Duration::ZERO));
        assert!(!s.wait_for_request(1, Duration::from_millis(1)));
        // A timeout beyond what `Instant` can represent still works with a request.
        s.request(Reason::Requested);
        assert!(s.wait_for_request(1, Duration::MAX));
    }
}
