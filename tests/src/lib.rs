//! Shared test support for Specula: the conformance suite every backend instantiates, and
//! helpers for the cross-crate tests.

pub mod conformance;
pub mod kernel_host;
