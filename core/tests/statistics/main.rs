//! specula-core's statistics tier: the collector's freshness sweep over realistic timing
//! (millions of simulated steps; scripts/test.sh runs it in release).
#![cfg(not(loom))]

#[path = "../it/sim/mod.rs"]
mod sim;

mod freshness;
