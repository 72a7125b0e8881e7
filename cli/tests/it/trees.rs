//! The token-tree demo (`--tree`): tree counts through the log line, the `FINAL` line and the
//! metrics; what it refuses; the tree-against-chain comparison.

use crate::support::{demo, expect_code, specula};
#[cfg(unix)]
use crate::support::{final_field, free_port, lines_of, read_until, scrape, send, wait_within};
#[cfg(unix)]
use std::process::Command;

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
