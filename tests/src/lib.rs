//! Shared test support for Specula: the conformance suite every backend instantiates, and
//! helpers for the cross-crate tests.

pub mod bench_step;
pub mod conformance;
pub mod gpu_inputs;
pub mod host_driver;
pub mod kernel_host;
pub mod readback_conformance;
pub mod tree;

/// The README's usage example, compiled and run as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
