//! The statistics tier: the tests that draw millions of samples or sweep whole number ranges, at
//! stated significance levels (docs/GUARANTEES.md). Built with optimisation: scripts/test.sh runs
//! this binary alone, with nextest's `statistics` profile and cargo's `statistics` profile
//! (docs/TESTING.md); the fast tier's runs leave it out by name (`binary(statistics)`).
//!
//! In a debug build (a plain `cargo test`) the sampling tests are ignored and the sweeps shrink
//! (`cfg!(debug_assertions)`), so that the workspace's debug run stays short.

mod tree_model;

mod entropy_exact;
mod gpu_tree_stats;
mod race_tails;
mod race_variates;
mod recovered;
mod tree_stats;
mod verify_filters;
mod verify_logits;
mod verify_stats;
