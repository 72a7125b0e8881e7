//! Token trees on a real CUDA device: the tree entry (`specula_verify_tree`) compiled and loaded
//! on first use only, the shared tree conformance (bit-equal to `verify_tree_batch`, a 64-node
//! tree at V = 32000 among the cases) and the shared tree step path (graph capture and replay of
//! changing trees, no synchronising driver call, malformed trees flagged and skipped), and tree
//! rows and outputs in the caller's cudarc memory, read and written in place. The same
//! shared routines run in CI over the host driver (`tests/tests/it/gpu_tree_host.rs`). Every test
//! prints SKIPPED and passes when the machine has no CUDA driver or device (CI), unless
//! `SPECULA_REQUIRE_DEVICE` is set.

use crate::support::{device, download, upload};
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

/// Tree rows in the caller's cudarc memory (`CudaDriver::borrow_rows`, issues 28 and 31): the
/// target rows, and the draft rows where the drafter gave them, read in place; the outputs and
/// counters of the same tree from host rows.
#[test]
fn tree_rows_in_the_callers_cudarc_memory() {
    use specula_core::gpu::GpuVerifier;
    use specula_core::verify::Target;
    use specula_cuda::CudaDriver;
    let Some(dev) = device() else { return };
    let s = dev.stream().clone();
    let drv = CudaDriver::new(dev.clone());
    let verifier = || GpuVerifier::<CudaDriver, K>::with_stream(drv.clone(), s.clone()).unwrap();
    let mut g = conformance::Gen(0x28_C0DA);
    for draft in [false, true] {
        let t = full_tree(&mut g, 64, 7, 32_000, draft);
        let tp = upload(&s, &t.target);
        let dp = t.draft.as_ref().map(|p| upload(&s, p));
        for m in [Method::Greedy, Method::Rejection, Method::Typical] {
            let mut host = verifier();
            let mut want = TreeOut::new(t.requests(), t.max_depth);
            host.verify_tree(m, Check::Cheap, &t.view(), &mut want.view())
                .unwrap();
            let mut v = verifier();
            let mut got = TreeOut::new(t.requests(), t.max_depth);
            {
                let rows = drv.borrow_rows(&tp);
                let draft_rows = dp.as_ref().map(|p| drv.borrow_rows(p));
                let mut b = t.view().with_target(Target::Probs(rows.rows(t.vocab)));
                if let Some(d) = &draft_rows {
                    b = b.with_draft(d.rows(t.vocab));
                }
                v.verify_tree(m, Check::Cheap, &b, &mut got.view()).unwrap();
            }
            assert_eq!(got, want, "draft={draft} {m:?}");
            assert_eq!(
                v.totals().unwrap(),
                host.totals().unwrap(),
                "draft={draft} {m:?}"
            );
        }
    }
}

/// Tree outputs in the caller's cudarc memory (`TreeOutputs::on_device`, issue 31), from rows
/// there too: written in place by the launch with no synchronising driver call; the outputs and
/// counters of the same tree from host rows into host outputs.
#[test]
fn tree_outputs_in_the_callers_cudarc_memory() {
    use specula_core::gpu::GpuVerifier;
    use specula_core::verify::Target;
    use specula_core::verify::tree::{DeviceTreeOutputs, TreeOutputs};
    use specula_cuda::CudaDriver;
    let Some(dev) = device() else { return };
    let s = dev.stream().clone();
    let drv = CudaDriver::new(dev.clone());
    let verifier = || GpuVerifier::<CudaDriver, K>::with_stream(drv.clone(), s.clone()).unwrap();
    let mut g = conformance::Gen(0x31_C0DA);
    for draft in [false, true] {
        let t = full_tree(&mut g, 64, 7, 32_000, draft);
        let tp = upload(&s, &t.target);
        let dp = t.draft.as_ref().map(|p| upload(&s, p));
        let (b, w) = (t.requests(), t.requests() * (t.max_depth + 1));
        for m in [Method::Greedy, Method::Rejection, Method::Typical] {
            let mut host = verifier();
            let mut want = TreeOut::new(b, t.max_depth);
            host.verify_tree(m, Check::Cheap, &t.view(), &mut want.view())
                .unwrap();
            let mut accepted = upload(&s, &vec![u32::MAX; b]);
            let mut path = upload(&s, &vec![u32::MAX; w]);
            let mut tokens = upload(&s, &vec![u32::MAX; w]);
            let mut v = verifier();
            {
                let rows = drv.borrow_rows(&tp);
                let draft_rows = dp.as_ref().map(|p| drv.borrow_rows(p));
                let mut batch = t.view().with_target(Target::Probs(rows.rows(t.vocab)));
                if let Some(d) = &draft_rows {
                    batch = batch.with_draft(d.rows(t.vocab));
                }
                let mut acc = drv.borrow_mut(&mut accepted);
                let mut pa = drv.borrow_mut(&mut path);
                let mut tok = drv.borrow_mut(&mut tokens);
                let mut out = TreeOutputs::on_device(DeviceTreeOutputs {
                    accepted: acc.output(),
                    path: pa.output(),
                    tokens: tok.output(),
                });
                let before = call_counts();
                v.verify_tree(m, Check::Cheap, &batch, &mut out).unwrap();
                assert_eq!(
                    call_counts().synchronizing,
                    before.synchronizing,
                    "draft={draft} {m:?}: the step waited"
                );
                assert_eq!(v.sync_calls(), 0);
            }
            let got = TreeOut {
                accepted: download(&s, &accepted),
                path: download(&s, &path),
                tokens: download(&s, &tokens),
            };
            assert_eq!(got, want, "draft={draft} {m:?}");
            assert_eq!(
                v.totals().unwrap(),
                host.totals().unwrap(),
                "draft={draft} {m:?}"
            );
        }
    }
}
