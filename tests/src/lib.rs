//! Shared test support for Specula: the conformance suite every backend instantiates, and
//! helpers for the cross-crate tests.

pub mod bench_read;
pub mod bench_step;
pub mod conformance;
pub mod gpu_inputs;
pub mod host_driver;
pub mod kernel_host;
pub mod readback_conformance;
pub mod skip;
pub mod tree;

/// The README's quick start, compiled and run as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

/// The usage guide's examples (`docs/USAGE.md`), compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../docs/USAGE.md")]
pub struct UsageDoctests;
