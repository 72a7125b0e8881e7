#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

pub use specula_core as core;

pub mod backend;
pub mod clock;
pub mod cpu;
pub mod demo;
pub mod driver;
pub mod http;
pub mod log_sink;
#[cfg(feature = "metrics")]
pub mod metrics_bridge;
pub mod ngram;
pub mod prom;
pub mod wiring;

/// The CUDA backend crate (feature `cuda`); [`backend::Backend`] opens it by name.
#[cfg(feature = "cuda")]
pub use specula_cuda as cuda;
/// The ROCm backend crate (feature `rocm`); [`backend::Backend`] opens it by name.
#[cfg(feature = "rocm")]
pub use specula_rocm as rocm;

pub use backend::{AnyReadback, Backend, BackendError, BackendKind, BackendSpec};
pub use clock::StdClock;
pub use driver::Driver;
pub use log_sink::{LogSink, LogThread, Logged};
pub use prom::SpecCollector;
pub use wiring::{HostReadback, Slots, Wired, wire, wire_ranks};
