//! The `specula` binary end to end: exit codes and messages a user or a script relies on.
//!
//! Exit codes: 0 success, 1 run failure, 2 bad input, 3 backend not compiled in, 4 backend
//! compiled in but no driver / runtime / device here.

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

/// A short run that never needs more than a moment. The short log interval bounds shutdown:
/// a run this short can end before the log thread first waits, and then its stop waits out one
/// interval.
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
    let emitted: u64 = last
        .rsplit("emitted_tokens=")
        .next()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("cannot parse {last:?}"));
    assert!(emitted >= 40, "{last}");
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

#[cfg(not(all(feature = "cuda", feature = "rocm")))]
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

#[cfg(not(feature = "cuda"))]
#[test]
fn cuda_without_the_feature_exits_3() {
    expect_not_compiled("CUDA", "cuda");
}

#[cfg(not(feature = "rocm"))]
#[test]
fn rocm_without_the_feature_exits_3() {
    expect_not_compiled("ROCm", "rocm");
}

/// Runs `demo` and `bench` on a GPU backend that cannot start here and checks exit 4 and a
/// one-line message starting with `error: no …`.
#[cfg(any(feature = "cuda", feature = "rocm"))]
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

#[cfg(feature = "rocm")]
#[test]
fn rocm_without_a_device_exits_4() {
    use specula_rocm::RocmError as E;
    match specula_rocm::RocmVerifier::<8>::new(0) {
        Ok(v) => eprintln!(
            "skipped: a ROCm device is present ({:?}), so the no-device path cannot be checked",
            v.device()
        ),
        Err(E::NoRuntime { .. }) => expect_unavailable("rocm", &["no ROCm runtime"]),
        Err(E::NoHiprtc { .. }) => expect_unavailable("rocm", &["no hiprtc"]),
        Err(E::NoDevice { code: 0 }) => {
            expect_unavailable("rocm", &["no ROCm device", "hipGetDeviceCount found none"]);
        }
        Err(E::NoDevice { code }) => {
            expect_unavailable("rocm", &[&format!("hipGetDeviceCount returned {code}")])
        }
        Err(E::InvalidDevice { .. }) => expect_unavailable("rocm", &["ROCm device 0 requested"]),
        Err(e) => eprintln!("skipped: the ROCm backend fails here for another reason: {e}"),
    }
}

#[cfg(feature = "cuda")]
#[test]
fn cuda_without_a_driver_or_device_exits_4() {
    use specula_cuda::CudaError as E;
    let probe = specula_cuda::CudaDevice::new(0)
        .and_then(|d| specula_cuda::CudaVerifier::<8>::new(std::sync::Arc::new(d)));
    match probe {
        Ok(_) => {
            eprintln!("skipped: a CUDA device is present, so the no-device path cannot be checked")
        }
        Err(E::NoDriver) => expect_unavailable("cuda", &["no CUDA driver"]),
        Err(E::NoDevice) => expect_unavailable("cuda", &["no CUDA device"]),
        Err(E::NoNvrtc) => expect_unavailable("cuda", &["no NVRTC"]),
        Err(e) => eprintln!("skipped: the CUDA backend fails here for another reason: {e}"),
    }
}
