//! Lost output during a run: a stdout whose reader went away (`specula demo | true`) or a full
//! stderr ends the program with exit 5 after the counters are flushed, the totals on the other
//! stream. Streams closed before the program starts: `closed_at_start`.

use crate::support::{SHORT, error_line, final_field, lines_of, wait_within};
use std::process::Command;

#[cfg(unix)]
mod closed_at_start;

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
