//! The CPU backend (work in progress).
