//! Every number a user gives the `specula` program is bounded before any work is done: an
//! out-of-range value exits 2 at once, with the bound, whatever its size (no check loops over
//! a user-supplied number).
//!
//! "Before any work": each bad value is given with `--corpus` naming a file that does not
//! exist; the error must be about the value, so nothing was read (or trained, or opened)
//! first. "At once": each refusal takes under [`AT_ONCE`] (a debug binary on a loaded two-core
//! machine; the refusal itself is microseconds). Before the fix, `--tree 2x18446744073709551615`
//! still ran after 25 s and `--tree 1x2000000000` took 11 s.

use crate::support::{QUICK, error_line, expect_code, specula_within};
use std::process::Command;
use std::time::{Duration, Instant};

const AT_ONCE: Duration = Duration::from_secs(3);
const NO_CORPUS: &str = "/nonexistent/specula-corpus.txt";

/// Runs the binary; its exit code, stderr and how long it took. Fails past a minute.
fn specula(args: &[&str]) -> (Option<i32>, String, Duration) {
    let t = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_specula"))
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the specula binary runs");
    let mut err = child.stderr.take().expect("stderr");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut err, &mut s);
        s
    });
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if t.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("specula {args:?} still ran after a minute");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    (status.code(), reader.join().expect("reader"), t.elapsed())
}

/// `args` exit 2 at once, with an error that contains `want` (and not the corpus's).
fn refused(args: &[&str], want: &str) {
    let (code, err, took) = specula(args);
    assert_eq!(code, Some(2), "{args:?}: exit {code:?}\n{err}");
    assert!(err.contains(want), "{args:?}: {want:?} not in\n{err}");
    assert!(
        !err.contains("cannot read corpus"),
        "{args:?}: the corpus was read first\n{err}"
    );
    assert!(took < AT_ONCE, "{args:?} took {took:?} to be refused");
}

fn demo_refused(extra: &[&str], want: &str) {
    let mut args = vec!["demo", "--corpus", NO_CORPUS];
    args.extend_from_slice(extra);
    refused(&args, want);
}

#[test]
fn huge_tree_shapes_are_refused_at_once() {
    let max = u64::MAX.to_string();
    for shape in [
        format!("2x{max}"),
        "1x2000000000".into(),
        format!("1x{max}"),
        format!("{max}x{max}"),
        format!("{max}x1"),
        "65x1".into(),
        "2x6".into(),
        "0x3".into(),
    ] {
        demo_refused(&["--tree", &shape], "at most 64 draft nodes");
        demo_refused(&["--tree", &shape, "--compare"], "at most 64 draft nodes");
    }
    // Valid shapes, refused for what the live demo cannot track (depth 9 > 8) or the work a
    // comparison would take.
    demo_refused(&["--tree", "1x9"], "depth");
    demo_refused(
        &[
            "--tree",
            "2x5",
            "--compare",
            "--steps",
            "1000000",
            "--batch",
            "4096",
        ],
        "verified nodes per run",
    );
    demo_refused(
        &["--tree", "2x2", "--compare", "--threads", "1000000"],
        "--threads",
    );
}

#[test]
fn every_numeric_demo_flag_is_bounded_before_any_work() {
    let huge = u64::MAX.to_string();
    let huge_f = "1e300";
    for (extra, want) in [
        (&["--k", "9"][..], "--k"),
        (&["--k", &huge], "--k"),
        (&["--batch", "0"], "--batch"),
        (&["--batch", "4097"], "--batch"),
        (&["--batch", &huge], "--batch"),
        (&["--seed", "18446744073709551616"], "--seed"),
        (&["--tokens", "18446744073709551616"], "--tokens"),
        (&["--duration=-1"], "--duration"),
        (&["--duration", huge_f], "--duration"),
        (&["--duration", "NaN"], "--duration"),
        (&["--log-interval", "0.0001"], "--log-interval"),
        (&["--log-interval", huge_f], "--log-interval"),
        (&["--collect-interval", "0"], "--collect-interval"),
        (&["--collect-interval", huge_f], "--collect-interval"),
        (&["--linger=-1"], "--linger"),
        (&["--linger", huge_f], "--linger"),
        (&["--target-order", "6"], "--target-order"),
        (&["--target-order", &huge], "--target-order"),
        (&["--draft-order", "0"], "--draft-order"),
        (&["--draft-order", &huge], "--draft-order"),
        (&["--threads", "1000000"], "--threads"),
        (&["--threads", &huge], "--threads"),
        (&["--device", "1024"], "--device"),
        (&["--device", &huge], "--device"),
        (&["--temperature=-1"], "temperature"),
        (&["--temperature", "inf"], "temperature"),
        (&["--top-k", &huge], "--top-k"),
        (&["--top-p", "0"], "top-p"),
        (&["--top-p", "1.5"], "top-p"),
        (&["--min-p", "2"], "min-p"),
        (&["--greedy-requests", "9"], "greedy requests"),
        (&["--greedy-requests", &huge], "--greedy-requests"),
        (&["--steps", "0"], "--steps"),
        (&["--steps", &huge], "--steps"),
    ] {
        demo_refused(extra, want);
    }
}

#[test]
fn label_counts_are_bounded() {
    let labels: Vec<String> = (0..33).map(|i| format!("l{i}=v")).collect();
    let mut args = vec!["demo", "--corpus", NO_CORPUS];
    for l in &labels {
        args.extend_from_slice(&["--label", l]);
    }
    refused(&args, "at most 32");
}

#[test]
fn bench_grids_are_bounded_before_anything_is_allocated() {
    let list = |n: usize| (1..=n).map(|i| i.to_string()).collect::<Vec<_>>().join(",");
    let (b64, v64) = (list(64), list(64));
    for (args, want) in [
        (
            vec![
                "bench",
                "--batch",
                b64.as_str(),
                "--k",
                "1,2,3,4,5,6,7,8",
                "--vocab",
                v64.as_str(),
            ],
            "cells",
        ),
        (
            vec!["bench", "--batch", "1,2,3,4", "--seconds", "600"],
            "s of timing",
        ),
        (
            vec!["bench", "--batch", "4096", "--k", "8", "--vocab", "1048576"],
            "GB of probabilities",
        ),
        (
            vec![
                "bench",
                "--batch",
                "480,479,478,477,476,475",
                "--k",
                "8",
                "--vocab",
                "32000",
            ],
            "in all",
        ),
        (vec!["bench", "--device", "1024"], "--device"),
        (vec!["bench", "--threads", "1000000"], "--threads"),
        (vec!["bench", "--seconds", "NaN"], "--seconds"),
    ] {
        refused(&args, want);
    }
}

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
