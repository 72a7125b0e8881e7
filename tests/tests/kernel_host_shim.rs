//! The attack on the host shim's claim (tests/kernel_host/shim.hpp) that a missing barrier in
//! the kernel text makes results differ from the reference instead of passing by luck of
//! timing: each of the first barriers a block reaches is skipped in turn (as if the text lacked
//! it), and the conformance suite's random batches must fail for a good share of them (the
//! share for one fixed thread order is printed beside it). A test binary of its own: the fault
//! injection applies to every launch of the process.

use specula_tests::conformance as c;
use specula_tests::kernel_host::{KernelHost, Mode, skip_barrier};
use std::panic::{AssertUnwindSafe, catch_unwind};

const K: usize = 8;
/// The barriers tried, from the first a block reaches.
const BARRIERS: u32 = 40;

fn passes(mode: Mode) -> bool {
    catch_unwind(AssertUnwindSafe(|| {
        c::matches_reference_on_random_batches(|| KernelHost::<K>::new(mode, 64).unwrap(), 7, 40);
    }))
    .is_ok()
}

/// How many of the first `BARRIERS` barriers, skipped one at a time, the suite catches.
fn caught(mode: Mode, ascending_only: bool) -> u32 {
    let n = (1..=BARRIERS)
        .filter(|&n| {
            skip_barrier(mode, n, ascending_only);
            !passes(mode)
        })
        .count();
    skip_barrier(mode, 0, false);
    n as u32
}

#[test]
fn a_missing_barrier_changes_the_results() {
    // The suite's own panics are the expected outcome here: keep them off the output.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let control = [passes(Mode::Cuda), passes(Mode::Hip)];
    let alternating = [caught(Mode::Cuda, false), caught(Mode::Hip, false)];
    let ascending = [caught(Mode::Cuda, true), caught(Mode::Hip, true)];
    let restored = [passes(Mode::Cuda), passes(Mode::Hip)];
    std::panic::set_hook(hook);
    println!(
        "of the first {BARRIERS} barriers, skipped one at a time, caught (CUDA, HIP): \
         alternating order {alternating:?}, ascending order {ascending:?}"
    );
    assert_eq!(
        control, [true; 2],
        "every barrier in place: the suite passes"
    );
    assert_eq!(
        restored, [true; 2],
        "barriers restored: the suite passes again"
    );
    // Not every barrier: on the host a shuffle is a whole-block barrier, so one that only
    // orders a reuse of shared memory behind a later shuffle is redundant here (not on a GPU),
    // and small random batches leave most threads with the reduction's identity. Measured:
    // 15 and 13 of 40 with the alternating order, 18 and 12 with the ascending one (the
    // alternation is no stronger than one fixed order on these batches).
    for (mode, n) in ["CUDA", "HIP"].iter().zip(alternating) {
        assert!(
            n >= 10,
            "{mode}: only {n} of {BARRIERS} missing barriers caught"
        );
    }
}
