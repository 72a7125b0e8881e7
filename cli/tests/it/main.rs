//! The `specula` program end to end (`specula-cli`'s integration tests), one module per subject,
//! in one binary: one link instead of one per file. Every test runs the built binary
//! (`CARGO_BIN_EXE_specula`) and reads its exit code and output; nextest runs them one at a time
//! (the real-io group of .config/nextest.toml), since they time real processes and sockets.

mod support;

mod bench;
mod corpus;
mod demo;
mod exit_codes;
mod http_attacks;
mod labels;
mod limits;
mod lost_output;
mod sampling;
#[cfg(unix)]
mod signals;
mod trees;
