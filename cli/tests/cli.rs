//! The `specula` binary end to end: exit codes and messages a user or a script relies on.
//!
//! Exit codes: 0 success (also a demo stopped by SIGINT/SIGTERM), 1 run failure, 2 bad input,
//! 3 backend not compiled in, 4 backend compiled in but no driver / runtime / device here,
//! 5 stdout or stderr could not be written.

use specula::specula_core::ErrorKind;
use specula::{BackendKind, BackendSpec};
use std::process::{Command, Output};

fn specula(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_specula"))
        .args(args)
        .output()
        .expect("the specula binary runs")
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// The exit code, with both streams in the panic message when it is not `want`.
fn expect_code(o: &Output, want: i32) -> (String, String) {
    let (out, err) = text(o);
    assert_eq!(
        o.status.code(),
        Some(want),
        "exit status {:?}\n--- stdout\n{out}\n--- stderr\n{err}",
        o.status
    );
    (out, err)
}

/// A short run that never needs more than a moment (the log thread's stop does not wait for
/// its interval, so the interval no longer bounds the exit; 0.2 s still gives a line or two).
const SHORT: &[&str] = &["--tokens", "40", "--threads", "1", "--log-interval", "0.2"];

fn demo(extra: &[&str]) -> Output {
    let mut args = vec!["demo"];
    args.extend_from_slice(SHORT);
    args.extend_from_slice(extra);
    specula(&args)
}

/// The one-line error message on stderr (`error: …`).
fn error_line(err: &str) -> &str {
    err.lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("no `error:` line in stderr:\n{err}"))
}

#[test]
fn cpu_demo_prints_its_summary_and_exits_0() {
    let o = demo(&[]);
    let (out, _) = expect_code(&o, 0);
    assert!(out.contains("== specula demo summary =="), "{out}");
    let last = out.lines().last().unwrap_or_default();
    assert!(last.starts_with("FINAL drafts="), "{out}");
    let emitted = final_field(last, "emitted_tokens");
    assert!(emitted >= 40, "{last}");
    // One accepted count per drafted position (the default draft length is 4).
    let per_pos = last
        .split("accepted_per_position=")
        .nth(1)
        .unwrap_or_else(|| panic!("no accepted_per_position in {last:?}"));
    assert_eq!(per_pos.split(',').count(), 4, "{last}");
}

#[test]
fn reference_demo_exits_0_with_the_same_totals_as_the_cpu() {
    // Same seed, same batches: the CPU backend is bit-identical to the reference, and both
    // reach the summary through their readbacks (CpuReadback / HostReadback).
    let cpu = demo(&[]);
    let reference = demo(&["--backend", "reference"]);
    let (cpu_out, _) = expect_code(&cpu, 0);
    let (ref_out, _) = expect_code(&reference, 0);
    let final_line = |s: &str| s.lines().last().unwrap_or_default().to_owned();
    assert_eq!(final_line(&cpu_out), final_line(&ref_out));
}

#[test]
fn cpu_bench_exits_0() {
    let o = specula(&[
        "bench",
        "--batch",
        "2",
        "--k",
        "4",
        "--vocab",
        "64",
        "--method",
        "greedy",
        "--seconds",
        "0.01",
        "--threads",
        "1",
        "--json",
    ]);
    let (out, _) = expect_code(&o, 0);
    assert!(out.contains("\"backend\":\"cpu\""), "{out}");
}

#[test]
fn help_documents_the_exit_codes() {
    for args in [&["--help"][..], &["demo", "--help"], &["bench", "--help"]] {
        let (out, _) = expect_code(&specula(args), 0);
        assert!(out.contains("Exit codes:"), "{args:?}: {out}");
        assert!(
            out.contains("3  the requested backend is not compiled in"),
            "{out}"
        );
        assert!(
            out.contains("4  the backend is compiled in but cannot run here"),
            "{out}"
        );
        assert!(out.contains("0  success, including a demo stopped by SIGINT or SIGTERM"));
        assert!(out.contains("5  output failed: stdout or stderr could not be written"));
    }
}

#[test]
fn unreadable_corpus_exits_2() {
    let o = demo(&["--corpus", "/nonexistent/specula/corpus.txt"]);
    let (_, err) = expect_code(&o, 2);
    let line = error_line(&err);
    assert!(
        line.contains("cannot read corpus /nonexistent/specula/corpus.txt"),
        "{line}"
    );
}

/// Runs `specula args…`, killing it if it has not exited within `limit` (a hang is a failure,
/// not a stuck test run).
fn specula_within(args: &[&str], limit: std::time::Duration) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_specula"))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the specula binary runs");
    let start = std::time::Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            let o = child.wait_with_output().expect("output");
            panic!("specula {args:?} still ran after {limit:?}: {o:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

const QUICK: std::time::Duration = std::time::Duration::from_secs(30);

#[test]
fn huge_bench_sizes_exit_2_with_the_figure_before_allocating() {
    let o = specula_within(
        &["bench", "--vocab", "1048576", "--batch", "4096", "--k", "8"],
        QUICK,
    );
    let (_, err) = expect_code(&o, 2);
    let line = error_line(&err);
    assert!(line.contains("needs 292.1 GB of probabilities"), "{line}");
    let many: Vec<String> = (1..=65).map(|i| i.to_string()).collect();
    let o = specula_within(&["bench", "--batch", &many.join(",")], QUICK);
    let (_, err) = expect_code(&o, 2);
    assert!(error_line(&err).contains("--batch lists 65 values; at most 64"));
    let o = specula_within(&["bench", "--seconds", "1e9"], QUICK);
    expect_code(&o, 2);
}

#[test]
fn too_many_threads_exit_2_at_once() {
    for cmd in ["demo", "bench"] {
        let o = specula_within(&[cmd, "--threads", "100000"], QUICK);
        let (_, err) = expect_code(&o, 2);
        let line = error_line(&err);
        assert!(
            line.contains("--threads 100000 is more than 4 per CPU"),
            "{line}"
        );
    }
}

#[test]
fn device_files_fifos_and_directories_are_refused_as_corpus() {
    let dir = std::env::temp_dir().join(format!("specula-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut refused = vec!["/dev/zero".to_owned(), dir.display().to_string()];
    // A FIFO with no writer: opening it for reading would block forever.
    let fifo = dir.join("fifo");
    let made = Command::new("mkfifo").arg(&fifo).status();
    if made.is_ok_and(|s| s.success()) {
        refused.push(fifo.display().to_string());
    } else {
        eprintln!("SKIPPED the FIFO case: mkfifo is not available");
    }
    for path in &refused {
        let o = specula_within(&["demo", "--corpus", path, "--tokens", "1"], QUICK);
        let (_, err) = expect_code(&o, 2);
        assert!(
            error_line(&err).contains("not a regular file"),
            "{path}: {err}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_oversized_corpus_exits_2_with_its_size() {
    let path = std::env::temp_dir().join(format!("specula-big-{}.txt", std::process::id()));
    // Sparse: no disk space used.
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(33 << 20).unwrap();
    drop(f);
    let o = specula_within(
        &["demo", "--corpus", path.to_str().unwrap(), "--tokens", "1"],
        QUICK,
    );
    std::fs::remove_file(&path).unwrap();
    let (_, err) = expect_code(&o, 2);
    assert!(
        error_line(&err).contains("34603008 bytes is more than the 33554432 bytes (32 MiB)"),
        "{err}"
    );
}

#[test]
fn a_corpus_file_is_read_and_trained_on() {
    let path = std::env::temp_dir().join(format!("specula-small-{}.txt", std::process::id()));
    std::fs::write(
        &path,
        "the quick brown fox jumps over the lazy dog. ".repeat(40),
    )
    .unwrap();
    let o = demo(&["--corpus", path.to_str().unwrap()]);
    std::fs::remove_file(&path).unwrap();
    let (out, _) = expect_code(&o, 0);
    assert!(out.contains("== specula demo summary =="), "{out}");
}

#[test]
fn metrics_port_in_use_fails_with_a_clear_message() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    let addr = taken.local_addr().expect("local address").to_string();
    let o = demo(&["--metrics-addr", &addr]);
    let (_, err) = expect_code(&o, 1);
    let line = error_line(&err);
    assert!(
        line.contains(&format!(
            "cannot serve metrics on {addr}: the address is already in use"
        )),
        "{line}"
    );
    drop(taken);
}

/// What `demo` and `bench` on a GPU backend must do here, decided by what the binary's
/// `specula` actually holds, not by this crate's features: in a workspace build another member
/// can turn `specula`'s `cuda`/`rocm` on while `specula-cli`'s are off (Cargo unifies them),
/// so the binary has the backend although this crate did not ask for it. The library is asked
/// the same way the binary asks it, so the two can never disagree.
fn expect_gpu_backend(kind: BackendKind) {
    let (name, feature) = match kind {
        BackendKind::Cuda => ("CUDA", "cuda"),
        _ => ("ROCm", "rocm"),
    };
    let spec = BackendSpec {
        kind,
        index: Some(0),
    };
    match specula::Backend::<8>::open(&spec) {
        Err(e) if e.kind() == ErrorKind::NotCompiledIn => {
            assert!(!kind.compiled_in(), "{e}");
            expect_not_compiled(name, feature);
        }
        Err(e) if e.kind().is_unavailable() => {
            assert!(kind.compiled_in(), "{e}");
            let what: &[&str] = match (kind, e.kind()) {
                (BackendKind::Cuda, ErrorKind::NoDriver) => &["no CUDA driver"],
                (BackendKind::Cuda, ErrorKind::NoCompiler) => &["no NVRTC"],
                (BackendKind::Cuda, _) => &["no CUDA device"],
                (_, ErrorKind::NoDriver) => &["no ROCm runtime"],
                (_, ErrorKind::NoCompiler) => &["no hiprtc"],
                _ => &["no ROCm device"],
            };
            expect_unavailable(feature, what);
        }
        Ok(_) => eprintln!(
            "SKIPPED: a {name} device is present, so neither the not-compiled nor the \
             no-device exit can be checked here"
        ),
        Err(e) => panic!("{name}: opening device 0 failed in an unexpected way: {e}"),
    }
}

/// `demo` and `bench` on a backend not compiled in: exit 3 and the rebuild hint.
fn expect_not_compiled(name: &str, feature: &str) {
    for cmd in ["demo", "bench"] {
        let o = specula(&[cmd, "--backend", feature]);
        let (out, err) = expect_code(&o, 3);
        assert!(out.is_empty(), "{cmd}: nothing on stdout: {out}");
        assert_eq!(
            error_line(&err),
            format!(
                "error: this specula was not compiled with {name} support \
                 (rebuild with `--features {feature}`)"
            )
        );
    }
}

/// `demo` and `bench` on a GPU backend that cannot start here: exit 4 and a one-line message
/// starting with `error: no …` that names what is missing.
fn expect_unavailable(backend: &str, what: &[&str]) {
    let bench = [
        "bench",
        "--backend",
        backend,
        "--batch",
        "1",
        "--k",
        "1",
        "--vocab",
        "8",
        "--seconds",
        "0",
    ];
    for o in [demo(&["--backend", backend]), specula(&bench)] {
        let (out, err) = expect_code(&o, 4);
        assert!(out.is_empty(), "nothing on stdout: {out}");
        let line = error_line(&err);
        assert!(line.starts_with("error: no "), "{line}");
        assert!(
            what.iter().any(|w| line.contains(w)),
            "{line} names none of {what:?}"
        );
        assert!(!line.contains("panicked"), "{err}");
    }
}

#[test]
fn cuda_exits_3_when_not_compiled_in_and_4_without_a_driver_or_device() {
    expect_gpu_backend(BackendKind::Cuda);
}

#[test]
fn rocm_exits_3_when_not_compiled_in_and_4_without_a_runtime_or_device() {
    expect_gpu_backend(BackendKind::Rocm);
}

#[test]
fn intervals_under_1_ms_exit_2_with_the_bound() {
    for (flag, value) in [
        ("--log-interval", "1e-8"),
        ("--log-interval", "0.0009"),
        ("--collect-interval", "1e-6"),
        ("--log-interval", "0"),
    ] {
        let o = specula_within(&["demo", flag, value, "--tokens", "1"], QUICK);
        let (_, err) = expect_code(&o, 2);
        let line = error_line(&err);
        assert!(
            line.contains(&format!("{flag} must be at least 0.001 s (1 ms)")),
            "{flag} {value}: {line}"
        );
    }
    // 1 ms itself is accepted.
    let o = specula_within(
        &[
            "demo",
            "--tokens",
            "40",
            "--threads",
            "1",
            "--log-interval",
            "0.001",
            "--collect-interval",
            "0.001",
        ],
        QUICK,
    );
    expect_code(&o, 0);
}

/// Waits for `child` to exit; kills it and fails if it runs past `limit` (a hang).
fn wait_within(child: &mut std::process::Child, limit: std::time::Duration) -> i32 {
    let start = std::time::Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status
                .code()
                .unwrap_or_else(|| panic!("killed: {status:?}"));
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("specula still ran after {limit:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Lines of a child's stream as they come, read on their own thread.
fn lines_of(stream: impl std::io::Read + Send + 'static) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead as _;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stream).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Reads `rx` into `seen` until a line satisfies `done` (fails after a minute or at EOF).
fn read_until(
    rx: &std::sync::mpsc::Receiver<String>,
    seen: &mut Vec<String>,
    what: &str,
    done: impl Fn(&[String]) -> bool,
) {
    let limit = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !done(seen) {
        let left = limit.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) => seen.push(l),
            Err(_) => panic!("no {what} within a minute; so far:\n{}", seen.join("\n")),
        }
    }
}

/// Sends `signal` (`TERM`, `INT`) to the child `pid` with the system's `kill`.
fn send(signal: &str, pid: u32) {
    let ok = Command::new("kill")
        .args(["-s", signal, &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(ok.success(), "kill -s {signal} {pid}: {ok:?}");
}

/// `name=value` in a `FINAL …` line.
fn final_field(line: &str, name: &str) -> u64 {
    line.split_whitespace()
        .find_map(|f| f.strip_prefix(&format!("{name}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {line:?}"))
}

/// The interval's `Accepted: N tokens` and `Drafted: N tokens` of a report line (`None` for
/// a line without new counts).
fn line_delta(line: &str) -> Option<(u64, u64)> {
    let field = |name: &str| -> Option<u64> {
        let rest = line.split(&format!(", {name}: ")).nth(1)?;
        rest.split(' ').next()?.parse().ok()
    };
    Some((field("Accepted")?, field("Drafted")?))
}

/// One `GET /metrics` over a plain socket; the value of `name{…,engine="rank0"}`.
fn scrape(addr: &str, name: &str) -> u64 {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect(addr).expect("connect to /metrics");
    s.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).expect("read the scrape");
    let key = format!("{name}{{");
    body.lines()
        .filter(|l| l.starts_with(&key))
        .find_map(|l| l.split_once("engine=\"rank0\"} ").map(|(_, v)| v))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key} in:\n{body}"))
}

/// A port that was free a moment ago.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[cfg(unix)]
#[test]
fn sigterm_flushes_and_the_final_counters_equal_the_logged_deltas_and_the_last_scrape() {
    let addr = format!("127.0.0.1:{}", free_port());
    let mut child = Command::new(env!("CARGO_BIN_EXE_specula"))
        .args([
            "demo",
            "--duration",
            "3600",
            "--linger",
            "3600",
            "--threads",
            "1",
        ])
        .args(["--log-interval", "0.2", "--metrics-addr", &addr])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the specula binary runs");
    let out = lines_of(child.stdout.take().unwrap());
    let err = lines_of(child.stderr.take().unwrap());
    let (mut out_seen, mut err_seen) = (Vec::new(), Vec::new());
    // Running: two log lines with counts.
    read_until(&err, &mut err_seen, "two log lines", |l| {
        l.iter().filter(|l| line_delta(l).is_some()).count() >= 2
    });
    send("TERM", child.id());
    // Stopped, flushed, summary printed; still serving /metrics (the linger).
    read_until(&out, &mut out_seen, "the FINAL line", |l| {
        l.last().is_some_and(|l| l.starts_with("FINAL "))
    });
    read_until(&err, &mut err_seen, "the linger line", |l| {
        l.last().is_some_and(|l| l.contains("serving final totals"))
    });
    let scraped = (
        scrape(&addr, "specula_accepted_tokens_total"),
        scrape(&addr, "specula_draft_tokens_total"),
    );
    // A second signal ends the linger; the exit is 0.
    send("TERM", child.id());
    let code = wait_within(&mut child, std::time::Duration::from_secs(60));
    err_seen.extend(err.iter());
    out_seen.extend(out.iter());
    let all_err = err_seen.join("\n");
    assert_eq!(code, 0, "{all_err}");
    let fin = out_seen
        .iter()
        .find(|l| l.starts_with("FINAL "))
        .expect("FINAL line");
    let final_counts = (
        final_field(fin, "accepted_tokens"),
        final_field(fin, "draft_tokens"),
    );
    let mut logged = (0, 0);
    for (a, d) in err_seen.iter().filter_map(|l| line_delta(l)) {
        logged = (logged.0 + a, logged.1 + d);
    }
    assert!(final_counts.1 > 0, "{fin}");
    assert_eq!(logged, final_counts, "sum of the logged deltas\n{all_err}");
    assert_eq!(scraped, final_counts, "the last scrape");
    let summary = out_seen.join("\n");
    assert!(
        summary.contains("stopped early by:        SIGTERM"),
        "{summary}"
    );
    assert!(all_err.contains("stopping on SIGTERM"), "{all_err}");
    assert!(all_err.contains("linger ended by request"), "{all_err}");
}

#[cfg(unix)]
#[test]
fn sigint_stops_the_demo_with_its_summary_and_exit_0() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_specula"))
        .args(["demo", "--duration", "3600", "--threads", "1"])
        .args(["--log-interval", "0.2"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the specula binary runs");
    let out = lines_of(child.stdout.take().unwrap());
    let err = lines_of(child.stderr.take().unwrap());
    let mut err_seen = Vec::new();
    read_until(&err, &mut err_seen, "a log line", |l| {
        l.iter().any(|l| line_delta(l).is_some())
    });
    send("INT", child.id());
    let code = wait_within(&mut child, std::time::Duration::from_secs(60));
    let out: Vec<String> = out.iter().collect();
    err_seen.extend(err.iter());
    assert_eq!(code, 0, "{}", err_seen.join("\n"));
    assert!(
        out.iter().any(|l| l == "stopped early by:        SIGINT"),
        "{out:?}"
    );
    let fin = out.last().expect("output");
    assert!(fin.starts_with("FINAL "), "{out:?}");
    // The last log line (the final drain) carries the same lifetime totals.
    let last_log = err_seen
        .iter()
        .rev()
        .find(|l| l.contains("| lifetime:"))
        .expect("a log line");
    assert!(
        last_log.contains(&format!(
            "lifetime: drafts={}, drafted={}, accepted={},",
            final_field(fin, "drafts"),
            final_field(fin, "draft_tokens"),
            final_field(fin, "accepted_tokens")
        )),
        "{last_log}\n{fin}"
    );
}

#[test]
fn a_closed_stdout_exits_5_after_flushing_with_the_totals_on_stderr() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_specula"))
        .args(["demo"])
        .args(SHORT)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the specula binary runs");
    // The reader goes away before anything is written: `specula demo | true`.
    drop(child.stdout.take());
    let err = lines_of(child.stderr.take().unwrap());
    let code = wait_within(&mut child, std::time::Duration::from_secs(60));
    let err: Vec<String> = err.iter().collect();
    let all = err.join("\n");
    assert_eq!(code, 5, "{all}");
    assert!(!all.contains("panicked"), "{all}");
    let line = error_line(&all);
    assert!(
        line.contains("cannot write the summary to stdout"),
        "{line}"
    );
    let fin = line.split("flushed: ").nth(1).expect("the FINAL line");
    assert!(fin.starts_with("FINAL "), "{line}");
    assert!(final_field(fin, "emitted_tokens") >= 40, "{line}");
    // The final log line carries the same totals: the counts were flushed before the exit.
    assert!(
        all.contains(&format!(
            "lifetime: drafts={}, drafted={},",
            final_field(fin, "drafts"),
            final_field(fin, "draft_tokens")
        )),
        "{all}"
    );
}

#[test]
fn a_full_stderr_ends_the_demo_with_exit_5_and_the_totals_on_stdout() {
    let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
        eprintln!("SKIPPED: no /dev/full here");
        return;
    };
    let mut child = Command::new(env!("CARGO_BIN_EXE_specula"))
        .args(["demo", "--duration", "3600", "--threads", "1"])
        .args(["--log-interval", "0.2"])
        .stdout(std::process::Stdio::piped())
        .stderr(full)
        .spawn()
        .expect("the specula binary runs");
    let out = lines_of(child.stdout.take().unwrap());
    // It stops at its first failed log line, not after an hour.
    let code = wait_within(&mut child, std::time::Duration::from_secs(60));
    let out: Vec<String> = out.iter().collect();
    let all = out.join("\n");
    assert_eq!(code, 5, "{all}");
    assert!(
        all.contains("stopped early by:        output failure"),
        "{all}"
    );
    assert!(out.iter().any(|l| l.starts_with("FINAL drafts=")), "{all}");
    let last = out.last().expect("output");
    assert!(
        last.starts_with("error: ") && last.contains("log lines could not be written to stderr"),
        "{all}"
    );
}

#[test]
fn bench_with_a_closed_stdout_exits_5() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_specula"))
        .args(["bench", "--batch", "2", "--k", "4", "--vocab", "64"])
        .args(["--seconds", "0.01", "--threads", "1"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the specula binary runs");
    drop(child.stdout.take());
    let err = lines_of(child.stderr.take().unwrap());
    let code = wait_within(&mut child, std::time::Duration::from_secs(60));
    let err: Vec<String> = err.iter().collect();
    assert_eq!(code, 5, "{err:?}");
    assert!(
        error_line(&err.join("\n")).contains("cannot write to stdout"),
        "{err:?}"
    );
}

#[test]
fn bad_labels_exit_2_before_the_run() {
    for (args, want) in [
        (
            vec!["--label", "bad-name=x"],
            "must match [a-zA-Z_][a-zA-Z0-9_]*",
        ),
        (vec!["--label", "__x=1"], "must match"),
        (vec!["--label", "engine=x"], "reserved"),
        (vec!["--label", "instance=x"], "reserved"),
        (vec!["--label", "model_name=x"], "given twice"),
        (vec!["--label", "a=1", "--label", "a=2"], "given twice"),
        (vec!["--label", "novalue"], "is not NAME=VALUE"),
        (vec!["--label", "region="], "must be 1 to 256 bytes"),
        (vec!["--model-name", ""], "must be 1 to 256 bytes"),
    ] {
        let o = demo(&args);
        let (_, err) = expect_code(&o, 2);
        let line = error_line(&err);
        assert!(line.contains("bad label"), "{args:?}: {line}");
        assert!(line.contains(want), "{args:?}: {line}");
        assert!(
            !err.contains("SpecDecoding"),
            "refused before the run: {err}"
        );
    }
}

#[test]
fn vllm_compat_demo_logs_vllms_exact_line() {
    let o = demo(&["--vllm-compat", "--k", "3"]);
    let (out, err) = expect_code(&o, 0);
    let fin = out
        .lines()
        .find(|l| l.starts_with("FINAL "))
        .expect("FINAL line");
    let lines: Vec<&str> = err
        .lines()
        .filter_map(|l| l.strip_prefix("INFO  specula: "))
        .filter(|l| l.starts_with("SpecDecoding"))
        .collect();
    assert!(!lines.is_empty(), "{err}");
    let mut logged = (0, 0);
    for l in &lines {
        // vLLM v1's prefix and fields; no engine label, no lifetime part, and no line
        // without drafts (vLLM prints none).
        assert!(
            l.starts_with("SpecDecoding metrics: Mean acceptance length: "),
            "{l}"
        );
        assert!(!l.contains("lifetime") && !l.contains("n/a"), "{l}");
        let per_pos = l
            .split("Per-position acceptance rate: ")
            .nth(1)
            .and_then(|r| r.split(", Avg").next())
            .unwrap_or_else(|| panic!("{l}"));
        let rates: Vec<f64> = per_pos.split(", ").map(|v| v.parse().unwrap()).collect();
        assert_eq!(rates.len(), 3, "one per drafted position: {l}");
        // vLLM's definition: accepted at a position / all drafts, so it never rises.
        assert!(rates.windows(2).all(|w| w[0] >= w[1]), "{l}");
        assert!(l.ends_with('%'), "{l}");
        let (a, d) = line_delta(l).unwrap_or_else(|| panic!("{l}"));
        assert!(d > 0, "{l}");
        logged = (logged.0 + a, logged.1 + d);
    }
    assert_eq!(
        logged,
        (
            final_field(fin, "accepted_tokens"),
            final_field(fin, "draft_tokens")
        ),
        "the lines' intervals add up to the totals\n{err}"
    );
}

/// The FINAL line of a successful demo run.
fn final_of(extra: &[&str]) -> String {
    let o = demo(extra);
    let (out, _) = expect_code(&o, 0);
    out.lines()
        .last()
        .filter(|l| l.starts_with("FINAL "))
        .unwrap_or_else(|| panic!("no FINAL line:\n{out}"))
        .to_owned()
}

#[test]
fn sampling_flags_mix_greedy_and_filtered_requests() {
    let mixed = final_of(&[
        "--temperature",
        "0.7",
        "--top-p",
        "0.9",
        "--top-k",
        "40",
        "--min-p",
        "0.02",
        "--greedy-requests",
        "2",
    ]);
    assert!(final_field(&mixed, "emitted_tokens") >= 40, "{mixed}");
    // The filters reach the verifier: top-k 1 (the target's argmax only) changes the run.
    let plain = final_of(&["--temperature", "1"]);
    let top1 = final_of(&["--temperature", "1", "--top-k", "1"]);
    assert_ne!(plain, top1, "top-k 1 changed nothing");
}

#[test]
fn greedy_requests_in_a_sampled_batch_verify_as_the_greedy_demo() {
    // Every request greedy (T = 0 in a rejection-sampling batch from logits) gives the counts
    // of the greedy method on probabilities: same drafts (argmax), same argmax verification.
    let mixed = final_of(&["--greedy-requests", "8", "--temperature", "1"]);
    let greedy = final_of(&["--method", "greedy"]);
    assert_eq!(mixed, greedy);
}

#[test]
fn bad_sampling_flags_exit_2() {
    for (args, what) in [
        (&["--top-p", "0"][..], "top-p"),
        (&["--top-p", "1.5"][..], "top-p"),
        (&["--min-p=-0.1"][..], "min-p"),
        (&["--min-p", "2"][..], "min-p"),
        (&["--temperature=-1"][..], "temperature"),
        (&["--temperature", "NaN"][..], "temperature"),
        (&["--greedy-requests", "9"][..], "greedy requests"),
    ] {
        let o = demo(args);
        let (_, err) = expect_code(&o, 2);
        assert!(error_line(&err).contains(what), "{args:?}: {err}");
    }
}

#[cfg(unix)]
#[test]
fn tree_demo_counts_trees_through_the_log_line_the_final_line_and_metrics() {
    let addr = format!("127.0.0.1:{}", free_port());
    let mut child = Command::new(env!("CARGO_BIN_EXE_specula"))
        .args(["demo", "--tree", "2x3", "--tokens", "400", "--threads", "1"])
        .args([
            "--log-interval",
            "0.2",
            "--linger",
            "3600",
            "--metrics-addr",
            &addr,
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the specula binary runs");
    let out = lines_of(child.stdout.take().unwrap());
    let err = lines_of(child.stderr.take().unwrap());
    let (mut out_seen, mut err_seen) = (Vec::new(), Vec::new());
    read_until(&out, &mut out_seen, "the FINAL line", |l| {
        l.last().is_some_and(|l| l.starts_with("FINAL "))
    });
    read_until(&err, &mut err_seen, "the linger line", |l| {
        l.last().is_some_and(|l| l.contains("serving final totals"))
    });
    let scraped = [
        scrape(&addr, "specula_tree_drafts_total"),
        scrape(&addr, "specula_tree_draft_tokens_total"),
        scrape(&addr, "specula_drafts_total"),
        scrape(&addr, "specula_draft_tokens_total"),
    ];
    send("TERM", child.id());
    let code = wait_within(&mut child, std::time::Duration::from_secs(60));
    err_seen.extend(err.iter());
    let all_err = err_seen.join("\n");
    assert_eq!(code, 0, "{all_err}");
    let fin = out_seen.last().unwrap();
    let trees = final_field(fin, "tree_drafts");
    assert!(trees > 0, "{fin}");
    // Every tree a 2x3 tree: 14 draft nodes, counted as a draft of depth 3.
    assert_eq!(
        scraped,
        [trees, 14 * trees, trees, 3 * trees],
        "the scrape after the run: {fin}"
    );
    assert_eq!(final_field(fin, "tree_draft_tokens"), 14 * trees, "{fin}");
    assert_eq!(
        fin.split("accepted_per_position=")
            .nth(1)
            .map(|p| p.split(',').count()),
        Some(3)
    );
    // The log lines carry the tree counts; their deltas sum to the final totals.
    let logged: u64 = err_seen
        .iter()
        .filter_map(|l| {
            let rest = l.split(", Trees: ").nth(1)?;
            rest.split(',').next()?.parse::<u64>().ok()
        })
        .sum();
    assert_eq!(logged, trees, "{all_err}");
    assert!(all_err.contains("mean tree size=14.00"), "{all_err}");
    let summary = out_seen.join("\n");
    assert!(
        summary.contains("mean tree size:          14.000 nodes"),
        "{summary}"
    );
}

#[test]
fn tree_demo_refuses_what_it_cannot_run_with_exit_2() {
    for (args, what) in [
        (&["--tree", "1x9"][..], "depth"),
        (
            &["--tree", "2x2", "--method", "typical"][..],
            "rejection sampling or greedy",
        ),
        (
            &["--tree", "2x2", "--temperature", "1"][..],
            "probabilities",
        ),
        (&["--compare"][..], "--tree"),
    ] {
        let o = demo(args);
        let (_, err) = expect_code(&o, 2);
        assert!(err.contains(what), "{args:?}: {err}");
    }
}

#[test]
fn tree_compare_prints_both_runs() {
    let o = specula(&[
        "demo",
        "--tree",
        "2x2",
        "--compare",
        "--steps",
        "5",
        "--batch",
        "2",
        "--threads",
        "1",
    ]);
    let (out, _) = expect_code(&o, 0);
    assert!(out.contains("tree 2x2 (6 draft nodes)"), "{out}");
    assert!(out.contains("chain k=6 (same node budget)"), "{out}");
}

#[test]
fn the_demo_prints_its_advice_and_finished_requests_before_the_final_line() {
    let o = specula(&[
        "demo",
        "--tokens",
        "4000",
        "--threads",
        "1",
        "--log-interval",
        "0.2",
        "--request-tokens",
        "64",
        "--log-detail",
    ]);
    let (out, err) = expect_code(&o, 0);
    let lines: Vec<&str> = out.lines().collect();
    let n = lines.len();
    assert!(lines[n - 1].starts_with("FINAL "), "{out}");
    assert!(lines[n - 2].starts_with("REQUESTS finished="), "{out}");
    assert!(lines[n - 3].starts_with("ADVICE recommended="), "{out}");
    // 4000 tokens over 8 requests of 64: dozens finished.
    let finished: u64 = lines[n - 2]
        .split_whitespace()
        .find_map(|w| w.strip_prefix("finished="))
        .and_then(|v| v.parse().ok())
        .unwrap();
    assert!(finished >= 40, "{out}");
    assert!(out.contains("advice:                  k="), "{out}");
    assert!(out.contains("conditional acceptance:  "), "{out}");
    // The detailed log line: distribution, conditionals and advice, interval and lifetime.
    let detailed = err
        .lines()
        .find(|l| l.contains("Acceptance lengths: "))
        .unwrap_or_else(|| panic!("no detailed line:\n{err}"));
    assert!(detailed.contains("Conditional acceptance: "), "{detailed}");
    assert!(detailed.contains("advice=k="), "{detailed}");
    // Without --log-detail the native line is unchanged.
    let o = demo(&[]);
    let (_, err) = expect_code(&o, 0);
    assert!(!err.contains("Acceptance lengths"), "{err}");
}

#[test]
fn sweep_k_prints_measured_next_to_predicted_throughput_for_every_k() {
    let o = specula(&[
        "demo",
        "--sweep-k",
        "--duration",
        "0.05",
        "--sweep-rounds",
        "1",
        "--threads",
        "1",
    ]);
    // Runs this short are noise: the verdict may go either way (exit 0 or 1), the report not.
    let code = o.status.code();
    let (out, err) = text(&o);
    assert!(matches!(code, Some(0 | 1)), "{code:?}\n{out}\n{err}");
    assert!(out.contains("calibration run at k=8: "), "{out}");
    for k in 1..=8 {
        assert!(
            out.lines()
                .any(|l| l.trim_start().starts_with(&format!("{k} "))),
            "no row for k={k}:\n{out}"
        );
    }
    let verdict = out
        .lines()
        .find(|l| l.starts_with("SWEEP recommended="))
        .unwrap_or_else(|| panic!("{out}"));
    assert_eq!(verdict.ends_with("pass=true"), code == Some(0), "{verdict}");
    assert_eq!(err.matches("sweep-k: run ").count(), 9, "{err}");
    // Token trees and the metrics server are not swept.
    let o = specula(&["demo", "--sweep-k", "--tree", "2x3"]);
    expect_code(&o, 2);
}
