//! Token trees on a real ROCm device: the shared tree conformance (bit-equal to
//! `verify_tree_batch`, a 64-node tree at V = 32000 among the cases) and the shared tree step path
//! (graph capture and replay of changing trees, no synchronising call, malformed trees flagged
//! and skipped), through the tree entry compiled with hiprtc on first use. The same shared
//! routines run in CI over the host driver (`tests/tests/it/gpu_tree_host.rs`). Every test prints
//! SKIPPED and passes without a ROCm device (CI has none), unless `SPECULA_REQUIRE_DEVICE` is set.

use crate::support::verifier;
use specula_core::gpu::GpuError;
use specula_core::verify::Verifier;
use specula_rocm::RocmError;
use specula_tests::tree::{tree_backend_conformance, tree_step_path_conformance};

#[test]
fn tree_conformance_on_device() {
    let Some(mut v) = verifier() else { return };
    tree_backend_conformance(&mut v, |v, m, c, b, o| v.verify_tree(m, c, b, o), 0xA7EE);
}

#[test]
fn tree_step_path_and_graph_replay_on_device() {
    let Some(mut v) = verifier() else { return };
    // The orchestration's own count: HIP's pageable uploads wait inside the staging writes,
    // which are not the step path.
    tree_step_path_conformance(
        &mut v,
        |v| v.sync_calls(),
        |e| matches!(e, GpuError::Driver(RocmError::Unsupported(_))),
        0xA57E,
    );
}
