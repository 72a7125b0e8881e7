//! What a test does when a tool it needs is missing here.

/// Reports a test that could not run because `what` is missing: prints
/// `SKIPPED: {krate} {test}: {what}` (shown with `--nocapture`) and, when `SPECULA_SKIP_LOG`
/// names a file, appends the line to it so that `scripts/test.sh` lists it in its summary, then
/// returns so the test passes. Under `CI=true` a missing tool is a failure instead: CI installs
/// every tool, so a skip there means the set-up broke, and a skip that looks like a pass would
/// hide it.
pub fn skipped(krate: &str, test: &str, what: &str) {
    let line = format!("SKIPPED: {krate} {test}: {what}");
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{line} (a missing tool fails the run under CI=true)");
    }
    println!("{line}");
    if let Some(path) = std::env::var_os("SPECULA_SKIP_LOG") {
        use std::io::Write as _;
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(f, "{line}");
        }
    }
}
