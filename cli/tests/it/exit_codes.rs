//! The exit codes a user or a script relies on: `--help` documents them; a GPU backend exits 3
//! when it is not compiled in and 4 when it cannot run here; a `--metrics-addr` in use exits 1.
//!
//! Exit codes: 0 success (also a demo stopped by SIGINT/SIGTERM), 1 run failure, 2 bad input,
//! 3 backend not compiled in, 4 backend compiled in but no driver / runtime / device here,
//! 5 stdout or stderr could not be written.

use crate::support::{demo, error_line, expect_code, specula};
use specula::specula_core::ErrorKind;
use specula::{BackendKind, BackendSpec};

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
