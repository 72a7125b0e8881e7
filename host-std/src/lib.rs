#![doc = include_str!("../README.md")]
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

/// The no_std core this crate builds on (the crate `specula-core`), re-exported under its own
/// name so that `use specula::*` never shadows the language's `core`.
pub use specula_core;

pub mod advice;
pub mod backend;
#[cfg(feature = "candle")]
#[cfg_attr(docsrs, doc(cfg(feature = "candle")))]
pub mod candle;
pub mod clock;
pub mod cpu;
mod exposition;
pub mod half_tensors;
pub mod http;
pub mod log_sink;
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub mod metrics_bridge;
mod output_buffers;
pub mod prom;
pub mod shutdown;
mod shutdown_request;
pub mod ticker;
pub mod wiring;

/// The `candle-core` crate (feature `candle`), whose [`Tensor`](candle_core::Tensor)s (on the
/// CPU, and on CUDA with `candle-cuda`) [`candle`] verifies, re-exported so that an engine's
/// tensors are of the version this crate reads (0.9).
#[cfg(feature = "candle")]
#[cfg_attr(docsrs, doc(cfg(feature = "candle")))]
pub use candle_core;
/// The `half` crate (bf16 / f16 types), for [`half_tensors`].
pub use half;
/// The `log` crate, whose facade [`LogSink`] logs through (its [`log::Level`] is a
/// [`LogSink::new`] argument), re-exported so that a runtime needs no version of its own.
pub use log;
/// The `prometheus-client` crate, whose [`Registry`](prometheus_client::registry::Registry)
/// [`SpecCollector`] registers in and [`prom::render`] encodes, re-exported so that a
/// runtime's registry is the same version as this crate's.
pub use prometheus_client;
/// The CUDA backend crate (feature `cuda`); [`backend::Backend`] opens it by name.
#[cfg(feature = "cuda")]
#[cfg_attr(docsrs, doc(cfg(feature = "cuda")))]
pub use specula_cuda as cuda;
/// The ROCm backend crate (feature `rocm`); [`backend::Backend`] opens it by name.
#[cfg(feature = "rocm")]
#[cfg_attr(docsrs, doc(cfg(feature = "rocm")))]
pub use specula_rocm as rocm;

pub use backend::{AnyReadback, Backend, BackendError, BackendKind, BackendSpec};
pub use clock::StdClock;
pub use log_sink::{LineLogger, LogSink, LogThread, Logged};
pub use output_buffers::OutputBuffers;
pub use prom::SpecCollector;
pub use shutdown::Shutdown;
pub use ticker::Ticker;
pub use wiring::{HostReadback, Slots, Wired, wire, wire_ranks};
