//! `specula demo` runs to the end: its summary and `FINAL` line, the same totals on the reference
//! backend, vLLM's log line, the advice and finished requests, the `k` sweep.

use crate::support::{demo, expect_code, final_field, line_delta, specula, text};

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
