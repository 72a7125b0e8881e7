//! What several modules use to run the `specula` binary and read what it prints.

use std::process::{Command, Output};

pub fn specula(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_specula"))
        .args(args)
        .output()
        .expect("the specula binary runs")
}

pub fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// The exit code, with both streams in the panic message when it is not `want`.
pub fn expect_code(o: &Output, want: i32) -> (String, String) {
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
pub const SHORT: &[&str] = &["--tokens", "40", "--threads", "1", "--log-interval", "0.2"];

pub fn demo(extra: &[&str]) -> Output {
    let mut args = vec!["demo"];
    args.extend_from_slice(SHORT);
    args.extend_from_slice(extra);
    specula(&args)
}

/// The one-line error message on stderr (`error: …`).
pub fn error_line(err: &str) -> &str {
    err.lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("no `error:` line in stderr:\n{err}"))
}

/// Runs `specula args…`, killing it if it has not exited within `limit` (a hang is a failure,
/// not a stuck test run).
pub fn specula_within(args: &[&str], limit: std::time::Duration) -> Output {
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

pub const QUICK: std::time::Duration = std::time::Duration::from_secs(30);

/// Waits for `child` to exit; kills it and fails if it runs past `limit` (a hang).
pub fn wait_within(child: &mut std::process::Child, limit: std::time::Duration) -> i32 {
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
pub fn lines_of(stream: impl std::io::Read + Send + 'static) -> std::sync::mpsc::Receiver<String> {
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
pub fn read_until(
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
pub fn send(signal: &str, pid: u32) {
    let ok = Command::new("kill")
        .args(["-s", signal, &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(ok.success(), "kill -s {signal} {pid}: {ok:?}");
}

/// `name=value` in a `FINAL …` line.
pub fn final_field(line: &str, name: &str) -> u64 {
    line.split_whitespace()
        .find_map(|f| f.strip_prefix(&format!("{name}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {line:?}"))
}

/// The interval's `Accepted: N tokens` and `Drafted: N tokens` of a report line (`None` for
/// a line without new counts).
pub fn line_delta(line: &str) -> Option<(u64, u64)> {
    let field = |name: &str| -> Option<u64> {
        let rest = line.split(&format!(", {name}: ")).nth(1)?;
        rest.split(' ').next()?.parse().ok()
    };
    Some((field("Accepted")?, field("Drafted")?))
}

/// One `GET /metrics` over a plain socket; the value of `name{…,engine="rank0"}`.
pub fn scrape(addr: &str, name: &str) -> u64 {
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
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The FINAL line of a successful demo run.
pub fn final_of(extra: &[&str]) -> String {
    let o = demo(extra);
    let (out, _) = expect_code(&o, 0);
    out.lines()
        .last()
        .filter(|l| l.starts_with("FINAL "))
        .unwrap_or_else(|| panic!("no FINAL line:\n{out}"))
        .to_owned()
}
