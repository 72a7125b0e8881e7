//! The binary's one `log` logger. `log` takes a single logger per process, and `cargo test` runs
//! every module of this binary in one process: the log sink's tests read the sink's lines, the
//! server's test reads the warnings, so one logger records both.

use std::sync::{Mutex, OnceLock, PoisonError};

/// What went through the `log` facade since the logger was installed. A log sink line for a
/// label starting with `panics` panics, as a broken logger would.
pub struct Capture {
    /// The log sink's lines (target `specula::log_sink::TARGET`), as formatted.
    pub lines: Mutex<Vec<String>>,
    /// Every record at `Warn` or above, as `target: message`.
    pub warnings: Mutex<Vec<String>>,
}

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, r: &log::Record<'_>) {
        let sink = r.target() == specula::log_sink::TARGET;
        if sink {
            let line = r.args().to_string();
            if line.contains("[panics") {
                panic!("this logger breaks on {line:.40}");
            }
        }
        if r.level() <= log::Level::Warn {
            self.warnings
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(format!("{}: {}", r.target(), r.args()));
        }
        if sink {
            self.lines
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(r.args().to_string());
        }
    }
    fn flush(&self) {}
}

/// The logger, installed (at level `Info`) on first use.
pub fn captured() -> &'static Capture {
    static CAPTURE: OnceLock<&'static Capture> = OnceLock::new();
    CAPTURE.get_or_init(|| {
        let c: &'static Capture = Box::leak(Box::new(Capture {
            lines: Mutex::new(Vec::new()),
            warnings: Mutex::new(Vec::new()),
        }));
        log::set_logger(c).expect("no other logger in this test binary");
        log::set_max_level(log::LevelFilter::Info);
        c
    })
}
