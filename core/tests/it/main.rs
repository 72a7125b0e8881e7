//! specula-core's tests, one binary (the fast tier): a module per subject.
//!
//! The tiers are binaries, named once: `it` (this one: fast, deterministic, also the judge of
//! `scripts/mutants.sh`), `statistics` (the collector's freshness sweep, run in release) and
//! `loom` (the slot under loom's model checker, a `--cfg loom` build of its own). Everything
//! here also runs under Miri (`cargo +nightly miri test -p specula-core`) but what leaves Miri
//! nothing to check and takes it long, which the debug run has: simulations cut short or, the
//! longest (safe code on one thread), ignored there, and the scans of the kernel text.
#![cfg(not(loom))]

mod sim;
mod support;

mod advisor;
mod batch;
mod clock;
mod collector;
mod delivery;
mod device;
mod errors;
mod fake_driver;
mod gpu;
mod gpu_tree;
mod kernels;
mod numerics;
mod rates;
mod recovered;
mod reference;
mod slot;
mod unaligned_timers;
mod validate;
