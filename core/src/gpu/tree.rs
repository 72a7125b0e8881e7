//! Token trees on the GPU: the tree entry points of the kernel text
//! ([`kernels::TREE_ENTRY`] for binary32 rows, [`kernels::TREE_HALF_ENTRY`] when the views hold
//! half rows: [`TreeLaunch::entry_name`]; `core/kernels/specula_tree.cu`) launched by [`GpuVerifier`] over
//! any [`Driver`](super::Driver), with the same counters buffer as chain launches (so tree counts flow
//! through the same [`GpuReadback`](super::GpuReadback), slot and exporters).
//!
//! * The step path: [`GpuVerifier::launch`] on typed views ([`TreeArgs`]), or a
//!   [`VerifyGraph`](super::VerifyGraph)`<D, `[`TreeStep`]`>` captured once
//!   ([`GpuVerifier::capture`]) and replayed ([`GpuVerifier::replay`]): the chain's calls, one
//!   block per request, nothing synchronises. A malformed tree on this path is the kernel's to
//!   catch: it sets [`kernels::ERR_TREE`] (a node token `≥ V`: [`kernels::ERR_TOKEN`]) and
//!   skips that request only.
//! * The host-slice path: [`Verifier::verify_tree`](crate::verify::Verifier::verify_tree), as
//!   `CpuVerifier::verify_tree` of the CPU backend (the reference's validation first, with the
//!   same [`VerifyError`](crate::verify::VerifyError)s; one synchronising call), staged in
//!   grow-only buffers ([`Staging`](super::Staging)`<D, `[`TreeStep`]`>`); rows in device memory
//!   ([`Values::Device`](crate::verify::Values::Device)) are read in place, and outputs in
//!   device memory ([`TreeOutputs::on_device`]) are written in place, with no copy down and no
//!   synchronising call.
//!
//! Rows may be binary32, bf16 or f16 (host or device; [`RowsView`](super::RowsView) in the
//! [`target`](super::StepViews::target) and [`draft_probs`](super::StepViews::draft_probs) of
//! [`TreeArgs::step`], and the shape's half flags): the tree entry widens each value exactly as
//! it reads it, so half rows give the bits of the tree of their widened values.
//!
//! The tree entry takes target probabilities, or target logits with a temperature per request
//! ([`target`](super::StepViews::target) with [`temperature`](super::StepViews::temperature);
//! `0`: greedy on the logit rows, `> 0`: each node row's softmax computed on the fly,
//! `core/DETERMINISM.md`).

pub(super) mod args;
pub(super) mod staging;

pub use args::{TreeArgs, TreeLaunch};
pub use staging::{TreeStep, tree_shape};

use super::driver::Driver;
use super::error::GpuError;
use super::kernels;
use super::staging::sealed::{Download, Launch, download};
use super::verifier::GpuVerifier;
use crate::verify::tree::TreeOutputs;

/// The tree step's launch: the tree entry ([`Driver::launch_tree`]), one block per request,
/// never split (apart from the chain's entries: its own kernel parameters and no scratch).
impl<D: Driver> Launch<D> for TreeArgs<'_, D> {
    type Step = TreeStep;

    fn capacity(&self) -> u32 {
        self.step.capacity
    }

    fn key(&self) {}

    /// The tree's shape words, and at least `capacity` elements in every per-request buffer
    /// and in every per-node or per-slot one (each request has at least one node slot and one
    /// output slot), the temperatures included when given. The extents and formats the shape
    /// words give are the caller's promise (the unsafe launch).
    fn fits(&self) -> bool {
        let s = &self.step;
        let own = [
            self.nodes.len(),
            self.tree_tokens.len(),
            self.first_child.len(),
            self.next_sibling.len(),
            self.path.len(),
            s.target.len(),
        ];
        s.fits(kernels::TREE_SHAPE_WORDS, &own)
            && s.draft_probs.is_none_or(|d| d.len() >= s.capacity as usize)
    }

    fn enqueue<const K: usize>(&self, v: &GpuVerifier<D, K>) -> Result<(), GpuError<D::Error>> {
        let launch = TreeLaunch {
            grid: self.step.capacity.max(1),
            block: v.driver().block_threads(),
            args: self,
            stats: v.stats(),
        };
        v.driver()
            .launch_tree(v.stream(), &launch)
            .map_err(GpuError::Driver)
    }

    fn downloads<'x>(
        &'x self,
        out: &'x mut TreeOutputs<'_>,
    ) -> Result<[Download<'x, D>; 3], GpuError<D::Error>> {
        let (accepted, path, tokens) = match out {
            TreeOutputs::Host {
                accepted,
                path,
                tokens,
            } => (&mut **accepted, &mut **path, &mut **tokens),
            // The launch wrote them in place: only the stats words are copied.
            TreeOutputs::Device { .. } => (&mut [][..], &mut [][..], &mut [][..]),
        };
        Ok([
            download(&self.step.accepted, accepted)?,
            download(&self.path, path)?,
            download(&self.step.tokens, tokens)?,
        ])
    }
}
