//! SIGTERM and SIGINT stop the demo with every count flushed: the final counters equal the sum
//! of the logged deltas and the last scrape, the summary names the signal, exit 0. Bursts of
//! signals: `bursts`.

use crate::support::{
    final_field, free_port, line_delta, lines_of, read_until, scrape, send, wait_within,
};
use std::process::Command;

mod bursts;

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
