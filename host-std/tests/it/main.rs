//! The integration tests of `specula` (host-std), one module per subject, in one binary: one
//! link instead of one per file. The fast tier: `scripts/test.sh quick` runs it (docs/TESTING.md).
//!
//! The HTTP server's modules need the `http` feature, the `metrics` bridge's the `metrics`
//! feature and the candle module's the `candle` feature: they are compiled out without it, so
//! `cargo test -p specula` with default features still builds and runs the rest (a
//! `required-features` entry would drop the whole binary).

mod log_capture;

#[cfg(feature = "candle")]
mod candle;

#[cfg(feature = "http")]
mod http;
#[cfg(feature = "http")]
mod http_admission;
#[cfg(feature = "http")]
mod http_attacks;
mod log_sink;
#[cfg(feature = "metrics")]
mod metrics_bridge;
mod prometheus;
