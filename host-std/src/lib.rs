//! Specula for std runtimes: what a serving runtime with an operating system adds to
//! `specula-core`.
#![warn(missing_docs)]

pub use specula_core as core;

pub mod cpu;
