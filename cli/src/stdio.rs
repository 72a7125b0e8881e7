//! The program's standard streams, checked.
//!
//! A program started with stdout or stderr closed (`>&-`, `2>&-`) finds them open on
//! `/dev/null`: std's start-up code, before `main`, reopens a closed descriptor 0, 1 or 2 there
//! (so that no file or socket opened later takes its number), and where it does not, std
//! treats a write to the closed descriptor (`EBADF`) as a success. Either way every line is
//! lost and the program exits 0. A program whose output is its result must say that it was
//! lost instead: `closed_at_exec` records, before std's start-up code runs, which of the
//! streams were closed; [`guard`] runs first in `main` and holds any still closed on
//! `/dev/null` itself; [`stdout`] and [`stderr`] are writers that fail with `EBADF` on a stream
//! that was closed at start and otherwise write (and report errors: `ENOSPC`, `EPIPE`) as std
//! does.

use std::io::{self, Write};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, Ordering};

/// Which standard streams were closed when the program started.
#[derive(Clone, Copy, Debug, Default)]
pub struct Closed {
    /// Descriptor 1.
    pub stdout: bool,
    /// Descriptor 2.
    pub stderr: bool,
}

static CLOSED: OnceLock<Closed> = OnceLock::new();

/// Finds the standard streams that are closed and holds their descriptors on `/dev/null`
/// (call it before anything opens a file or socket); returns what it found. Later calls
/// return the first answer.
pub fn guard() -> Closed {
    *CLOSED.get_or_init(find_and_hold)
}

/// Which of stdout and stderr were closed when the process was executed, as seen before std's
/// start-up code reopened them on `/dev/null`: bit 1 for stdout, bit 2 for stderr; `u8::MAX`
/// where nothing ran before `main` to look.
static AT_EXEC: AtomicU8 = AtomicU8::new(u8::MAX);

/// Runs before `main`, from the executable's initialiser list (where std's start-up code has
/// not yet reopened closed standard descriptors: that happens in the `main` the compiler
/// generates): records in [`AT_EXEC`] which of descriptors 1 and 2 are closed.
///
/// This is the only point at which the process can tell `>&-` from `>/dev/null`; the
/// initialiser list is the documented mechanism for running code there (ELF `.init_array`,
/// Mach-O `__mod_init_func`).
#[cfg(any(target_os = "linux", target_os = "android", target_os = "macos"))]
extern "C" fn closed_at_exec() {
    // SAFETY: `fcntl(fd, F_GETFD)` only reads the flags of a descriptor number, open or not;
    // it fails (with EBADF, its only error for F_GETFD) exactly when the descriptor is closed.
    let closed = |fd| unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1;
    let bits = u8::from(closed(1)) | (u8::from(closed(2)) << 1);
    AT_EXEC.store(bits, Ordering::SeqCst);
}

#[cfg(any(target_os = "linux", target_os = "android"))]
#[used]
// SAFETY: `.init_array` holds pointers to functions the loader calls before `main` with no
// argument this one reads; `closed_at_exec` touches nothing std needs initialised (a libc call
// and an atomic store).
#[unsafe(link_section = ".init_array")]
static RUN_AT_EXEC: extern "C" fn() = closed_at_exec;

#[cfg(target_os = "macos")]
#[used]
// SAFETY: as for `.init_array` above: dyld calls the functions in `__mod_init_func` before
// `main`.
#[unsafe(link_section = "__DATA,__mod_init_func")]
static RUN_AT_EXEC: extern "C" fn() = closed_at_exec;

#[cfg(unix)]
fn find_and_hold() -> Closed {
    use std::os::fd::{AsFd, AsRawFd, IntoRawFd};
    // Duplicating a descriptor fails with EBADF exactly when it is not open.
    let closed = |fd: std::os::fd::BorrowedFd<'_>| {
        fd.try_clone_to_owned()
            .is_err_and(|e| e.raw_os_error() == Some(libc::EBADF))
    };
    let at_exec = AT_EXEC.load(Ordering::SeqCst);
    let found = Closed {
        stdout: (at_exec != u8::MAX && at_exec & 1 != 0) || closed(io::stdout().as_fd()),
        stderr: (at_exec != u8::MAX && at_exec & 2 != 0) || closed(io::stderr().as_fd()),
    };
    // `open` returns the lowest free descriptor: each of 0, 1, 2 that is closed is filled in
    // turn, and the first one above 2 means none is left. Kept open for the process's life
    // (`into_raw_fd` gives up the ownership without closing it).
    for _ in 0..3 {
        let Ok(null) = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/null")
        else {
            break;
        };
        if null.as_raw_fd() > 2 {
            break;
        }
        let _ = null.into_raw_fd();
    }
    found
}

#[cfg(not(unix))]
fn find_and_hold() -> Closed {
    Closed::default()
}

fn closed_error(name: &str) -> io::Error {
    #[cfg(unix)]
    let e = io::Error::from_raw_os_error(libc::EBADF);
    #[cfg(not(unix))]
    let e = io::Error::other("bad file descriptor");
    io::Error::new(
        e.kind(),
        format!("{name} was closed when the program started ({e})"),
    )
}

/// A standard stream that reports writes to a descriptor closed at start as failed.
#[derive(Debug)]
pub struct Checked<W> {
    inner: W,
    closed: bool,
    name: &'static str,
}

impl<W: Write> Write for Checked<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.closed {
            return Err(closed_error(self.name));
        }
        self.inner.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.closed {
            return Err(closed_error(self.name));
        }
        self.inner.flush()
    }
}

/// stdout, checked (see the module documentation).
pub fn stdout() -> Checked<io::StdoutLock<'static>> {
    Checked {
        inner: io::stdout().lock(),
        closed: guard().stdout,
        name: "stdout",
    }
}

/// stderr, checked (see the module documentation).
pub fn stderr() -> Checked<io::Stderr> {
    Checked {
        inner: io::stderr(),
        closed: guard().stderr,
        name: "stderr",
    }
}
