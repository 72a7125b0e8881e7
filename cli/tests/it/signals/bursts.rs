//! Signal bursts: every SIGINT / SIGTERM the `specula` program receives counts, however close
//! together, with real signals sent to the binary a millisecond apart.
//!
//! The program's promise (`specula --help`, exit codes): the first signal stops the demo (it
//! flushes and reports, exit 0), one more ends `--linger`, and a third exits at once with 128 +
//! its number. Signals are sent while a decode step runs (a batch of 4 096 takes a good fraction
//! of a second per step), so all of a burst arrives before the loop can react to the first.
//! Before each signal after the first the test waits until the kernel no longer holds the
//! previous one as pending (`ShdPnd` in `/proc/PID/status`): the kernel itself merges a signal
//! sent while the same one is still pending, which no program can count; once delivered, the
//! program must count it.

use crate::support::lines_of;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

/// Runs per test.
const RUNS: usize = 5;
/// The time between two signals of a burst.
const GAP: Duration = Duration::from_millis(1);

/// A demo that runs until it is signalled, with slow steps and a log line every 0.2 s.
fn start(extra: &[&str]) -> (Child, Receiver<String>, Receiver<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_specula"))
        .args(["demo", "--duration", "600", "--threads", "1"])
        .args(["--batch", "4096", "--k", "8", "--log-interval", "0.2"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the specula binary runs");
    let out = lines_of(child.stdout.take().unwrap());
    let err = lines_of(child.stderr.take().unwrap());
    (child, out, err)
}

/// Waits for the first log line: the models are trained and the loop runs.
fn wait_running(err: &Receiver<String>) {
    let limit = Instant::now() + Duration::from_secs(60);
    loop {
        let left = limit.saturating_duration_since(Instant::now());
        let line = err.recv_timeout(left).expect("no log line within a minute");
        if line.contains("| lifetime:") {
            return;
        }
    }
}

/// The process-wide pending signal set of `pid` (`ShdPnd`), if `/proc` shows it.
fn shared_pending(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let hex = status.lines().find_map(|l| l.strip_prefix("ShdPnd:"))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

/// Sends `signals` to `pid` [`GAP`] apart, each once the previous one has left the kernel's
/// pending set.
fn burst(pid: u32, signals: &[i32]) {
    let pid_t = libc::pid_t::try_from(pid).expect("a pid");
    for (i, &sig) in signals.iter().enumerate() {
        if i > 0 {
            let bit = 1u64 << (signals[i - 1] - 1);
            let limit = Instant::now() + Duration::from_secs(5);
            while shared_pending(pid).is_some_and(|p| p & bit != 0) && Instant::now() < limit {
                std::thread::yield_now();
            }
            std::thread::sleep(GAP);
        }
        // SAFETY: kill(2) with the pid of our own child, which we have not waited for yet (so
        // the pid cannot have been reused), and a valid signal number.
        let r = unsafe { libc::kill(pid_t, sig) };
        assert_eq!(
            r,
            0,
            "kill {pid} {sig}: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// The child's exit code; kills it and fails past `limit`.
fn wait_within(child: &mut Child, limit: Duration) -> (i32, Duration) {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            let code = status
                .code()
                .unwrap_or_else(|| panic!("killed: {status:?}"));
            return (code, start.elapsed());
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("specula still ran {limit:?} after the burst");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_third_signal_a_millisecond_after_two_exits_at_once_with_128_plus_its_number() {
    use libc::{SIGINT, SIGTERM};
    let t = Instant::now();
    // Five SIGTERM bursts, and one of mixed signals whose third is SIGINT.
    let mut bursts = vec![[SIGTERM, SIGTERM, SIGTERM]; RUNS];
    bursts.push([SIGTERM, SIGINT, SIGINT]);
    for signals in bursts {
        let (mut child, _out, err) = start(&[]);
        wait_running(&err);
        burst(child.id(), &signals);
        let (code, took) = wait_within(&mut child, Duration::from_secs(30));
        let want = 128 + signals[2];
        assert_eq!(code, want, "signals {signals:?}: exit {code}, not {want}");
        // At once: not after the step in progress, the flush and the summary.
        println!("burst {signals:?}: exit {code} {took:.1?} after the last signal");
    }
    println!("{} bursts in {:.1?}", RUNS + 1, t.elapsed());
}

#[test]
fn a_second_signal_a_millisecond_after_the_first_ends_the_linger() {
    let t = Instant::now();
    for _ in 0..RUNS {
        let (mut child, out, err) = start(&["--metrics-addr", "127.0.0.1:0", "--linger", "30"]);
        wait_running(&err);
        burst(child.id(), &[libc::SIGTERM, libc::SIGTERM]);
        let (code, took) = wait_within(&mut child, Duration::from_secs(60));
        let out: Vec<String> = out.iter().collect();
        let err: Vec<String> = err.iter().collect();
        assert_eq!(code, 0, "{out:?}\n{err:?}");
        // The step in progress, the flush and the summary; not the 30 s of --linger.
        assert!(
            took < Duration::from_secs(20),
            "exit {took:?} after the burst"
        );
        assert!(
            out.iter().any(|l| l == "stopped early by:        SIGTERM"),
            "{out:?}"
        );
        assert!(
            out.last().is_some_and(|l| l.starts_with("FINAL ")),
            "{out:?}"
        );
        // The second signal usually arrives before the linger starts, which then never does;
        // on a loaded machine the sender can be descheduled past the flush, and the linger
        // starts and is ended by that signal at once (the exit time above says so).
        let lingered = err.iter().any(|l| l.contains("serving final totals"));
        assert!(
            !lingered || err.iter().any(|l| l.contains("linger ended by request")),
            "the linger started and was not ended by the signal: {err:?}"
        );
        println!("two SIGTERMs: exit 0 {took:.1?} after the burst, no linger");
    }
    println!("{RUNS} runs in {:.1?}", t.elapsed());
}
