//! The GPU orchestration, written once over a small [`Driver`] trait: staging, launch (the
//! single-block and split entry points of the kernel text), graph capture and replay, the
//! readback ring, flush, and the count of synchronising calls. CUDA, ROCm and the host driver of
//! `specula-tests` (which runs the kernel text on CPU threads, so CI executes this code end to
//! end) are driver glue.
//!
//! Token trees (`kernels::TREE_ENTRY`, `kernels::TREE_HALF_ENTRY` for half rows) are one more
//! [`Step`] kind ([`TreeStep`]): the same stage / launch / capture / replay / download calls of
//! [`GpuVerifier`] on [`TreeArgs`] (a [`VerifyGraph`]`<D, TreeStep>`), the same driver
//! ([`Driver::launch_tree`]) and counters, and
//! [`Verifier::verify_tree`](crate::verify::Verifier::verify_tree).
//!
//! The step path takes [`VerifyArgs`]: typed device views ([`View`], [`ViewMut`]) borrowed for a
//! lifetime the compiler checks, never raw pointers valid "until the next stage". The views
//! every step kind has are one [`StepViews`], the `step` of [`VerifyArgs`] and of [`TreeArgs`].

mod args;
mod block;
mod driver;
mod error;
pub mod kernels;
mod readback;
mod staging;
mod tree;
mod verifier;
mod view;

pub use args::StepViews;
pub use block::ArgBlock;
pub use driver::{Driver, ENTRY_NAMES, Entry, Family, Inputs, Launch, Status, VerifyArgs};
pub use error::GpuError;
pub use readback::GpuReadback;
pub use staging::{ChainStep, SUPPORT, Staged, Staging, Step};
pub use tree::{TreeArgs, TreeLaunch, TreeStep, tree_shape};
pub use verifier::{GpuVerifier, MAX_SLICES, VerifyGraph, split_scratch_bytes};
pub use view::{Element, Memory, OutOfBounds, RowsView, View, ViewMut};
