#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

pub use specula_core as core;

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

pub use clock::StdClock;
pub use driver::Driver;
pub use log_sink::{LogSink, LogThread, Logged};
pub use prom::SpecCollector;
pub use wiring::{HostReadback, Slots, Wired, wire, wire_ranks};
