//! `specula bench` on the CPU backend.

use crate::support::{expect_code, specula};

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
