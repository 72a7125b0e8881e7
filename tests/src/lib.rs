//! Cross-crate, property-based and kernel-parity tests of Specula.
//!
//! Not implemented yet: see the crate README.
