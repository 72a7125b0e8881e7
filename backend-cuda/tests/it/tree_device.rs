//! Token trees on a real CUDA device: the tree entry (`specula_verify_tree`) compiled and loaded
//! on first use only, the shared tree conformance (bit-equal to `verify_tree_batch`, a 64-node
//! tree at V = 32000 among the cases) and the shared tree step path (graph capture and replay of
//! changing trees, no synchronising driver call, malformed trees flagged and skipped). The same
//! shared routines run in CI over the host driver (`tests/tests/it/gpu_tree_host.rs`). Every test
//! prints SKIPPED and passes when the machine has no CUDA driver or device (CI), unless
//! `SPECULA_REQUIRE_DEVICE` is set.

use crate::support::device;
use specula_core::verify::{Check, Method, Verifier};
use specula_cuda::call_counts;
use specula_tests::conformance::{self, K};
use specula_tests::tree::{
    TreeOut, full_tree, tree_backend_conformance, tree_step_path_conformance,
};

/// Chain verification never compiles the tree module; the first tree verification does, once.
#[test]
fn the_tree_module_is_compiled_on_first_tree_use_only() {
    let Some(dev) = device() else { return };
    let mut v = dev.verifier::<K>().unwrap();
    let d = conformance::full_layout_batch(&mut conformance::Gen(0x7EE1), 4);
    conformance::run(&mut v, Method::Greedy, Check::Cheap, &d).unwrap();
    assert!(
        !dev.tree_loaded(),
        "a chain launch compiled the tree module"
    );
    let t = full_tree(&mut conformance::Gen(0x7EE2), 9, 3, 50, false);
    let mut out = TreeOut::new(1, 3);
    v.verify_tree(Method::Greedy, Check::Cheap, &t.view(), &mut out.view())
        .unwrap();
    assert!(dev.tree_loaded());
    assert!(v.totals().unwrap().drafts >= 1);
}

#[test]
fn tree_conformance_on_device() {
    let Some(dev) = device() else { return };
    let mut v = dev.verifier::<K>().unwrap();
    tree_backend_conformance(&mut v, |v, m, c, b, o| v.verify_tree(m, c, b, o), 0xC7EE);
}

#[test]
fn tree_step_path_and_graph_replay_on_device() {
    let Some(dev) = device() else { return };
    let mut v = dev.verifier::<K>().unwrap();
    tree_step_path_conformance(&mut v, |_| call_counts().synchronizing, |_| false, 0xC57E);
}
