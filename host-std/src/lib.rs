//! Specula for std runtimes: clock, CPU backend, collector thread, exporters, HTTP /metrics and the specula command.
//!
//! Not implemented yet: see the crate README.
