//! `--corpus`: a text file is read and trained on; what is not a readable regular file of at most
//! 32 MiB exits 2 with the reason.

use crate::support::{QUICK, demo, error_line, expect_code, specula_within};
use std::process::Command;

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
