//! Token trees through the shared GPU orchestration (`specula_core::gpu`: `Staging<_, TreeStep>`,
//! `GpuVerifier::{verify_tree, launch, capture, replay}` on `TreeArgs`) executed end to end over
//! the host driver, whose `Driver::launch_tree` runs the tree entry of the kernel text
//! (`specula_verify_tree`) through the C++ shim: outputs and counters bit-equal to the reference
//! (`verify_tree_batch`) for greedy, the target-only rule, SpecInfer's rule with draft rows and
//! typical acceptance (a 64-node tree at V = 32000 among them), the reference's validation
//! errors, graph capture and replay over changing trees, no synchronising call on the step path,
//! tree and chain counts in one counters buffer and readback, and malformed trees on the raw
//! launch flagged (`ERR_TREE`) and skipped alone.

use specula_core::gpu::kernels::{ERR_TOKEN, ERR_TREE};
use specula_core::gpu::{GpuError, GpuVerifier, Staging, TreeStep};
use specula_core::verify::tree::verify_tree_batch;
use specula_core::verify::{Check, Method, SENTINEL, Verifier, VerifyError};
use specula_core::{Counters, Readback};
use specula_tests::conformance::{self as c, Gen, K, METHODS};
use specula_tests::host_driver::HostDriver;
use specula_tests::kernel_host::Mode;
use specula_tests::tree::{
    TreeData, TreeOut, TreeSpec, full_tree, random_tree_batch, tree_backend_conformance,
    tree_step_path_conformance,
};
use std::task::Poll;

fn verifier(mode: Mode) -> GpuVerifier<HostDriver, K> {
    // Block 64: two CUDA warps, one HIP wave.
    GpuVerifier::new(HostDriver::new(mode, 64, 1)).unwrap()
}

fn reference(
    method: Method,
    check: Check,
    d: &TreeData,
) -> Result<(TreeOut, Counters<K>), VerifyError> {
    let mut out = TreeOut::new(d.requests(), d.max_depth);
    let mut counted = Counters::ZERO;
    verify_tree_batch(method, check, &d.view(), &mut out.view(), &mut counted)?;
    Ok((out, counted))
}

fn spec(draft: bool) -> TreeSpec {
    TreeSpec {
        max_requests: 5,
        max_nodes: 12,
        max_depth: 5,
        vocab: 37,
        draft,
        logits: false,
        garbage: false,
    }
}

/// Verifies `d` on `v` and on the reference: same outputs, and `v`'s counters grow by exactly
/// the reference's counts.
fn assert_matches(
    v: &mut GpuVerifier<HostDriver, K>,
    method: Method,
    check: Check,
    d: &TreeData,
    what: &str,
) {
    let (want, counted) = reference(method, check, d).unwrap();
    let before = v.totals().unwrap();
    let syncs = v.sync_calls();
    let mut out = TreeOut::new(d.requests(), d.max_depth);
    v.verify_tree(method, check, &d.view(), &mut out.view())
        .unwrap_or_else(|e| panic!("{what} {method:?}: {e}"));
    assert_eq!(
        v.sync_calls(),
        syncs + 1,
        "{what}: one wait per verify_tree"
    );
    assert_eq!(out, want, "{what} {method:?}: outputs");
    let mut expected = before;
    expected.add(&counted);
    assert_eq!(v.totals().unwrap(), expected, "{what} {method:?}: counters");
}

/// Random trees (shapes, duplicated sibling tokens, with and without draft rows), every method,
/// both macro forms of the kernel text: the reference's bits and counts.
#[test]
fn tree_conformance_through_the_orchestration() {
    for (i, mode) in [Mode::Cuda, Mode::Hip].into_iter().enumerate() {
        let mut v = verifier(mode);
        let mut g = Gen(0x7EE_0000 + i as u64);
        for n in 0..16 {
            let d = random_tree_batch(&mut g, spec(n % 2 == 1));
            for m in METHODS {
                assert_matches(&mut v, m, Check::STRICT, &d, &format!("{mode:?} batch {n}"));
            }
        }
    }
}

/// The shared tree conformance the CUDA and ROCm device tests run, here on the host driver.
#[test]
fn shared_tree_conformance_on_the_host_driver() {
    let mut v = verifier(Mode::Cuda);
    tree_backend_conformance(&mut v, |v, m, c, b, o| v.verify_tree(m, c, b, o), 0x5EA);
}

/// The shared tree step path the CUDA and ROCm device tests run, here on the host driver (both
/// macro forms).
#[test]
fn shared_tree_step_path_on_the_host_driver() {
    for mode in [Mode::Cuda, Mode::Hip] {
        let mut v = verifier(mode);
        let drv = v.driver().clone();
        tree_step_path_conformance(&mut v, |_| drv.sync_calls(), |_| false, 0x57E9);
    }
}

/// Wide, shallow trees at a small vocabulary: many siblings per node, duplicated tokens, the
/// target-only residual and SpecInfer's `Z` passes at every level.
#[test]
fn wide_trees_match_the_reference() {
    let mut v = verifier(Mode::Cuda);
    let mut g = Gen(0x51DE);
    for n in 0..8 {
        let d = random_tree_batch(
            &mut g,
            TreeSpec {
                max_requests: 3,
                max_nodes: 24,
                max_depth: 2,
                vocab: 11,
                draft: n % 2 == 0,
                logits: false,
                garbage: false,
            },
        );
        assert_matches(
            &mut v,
            Method::Rejection,
            Check::STRICT,
            &d,
            &format!("wide {n}"),
        );
    }
}

/// A 64-node tree (EAGLE-2's default budget) at V = 32000, with and without draft rows.
#[test]
fn sixty_four_node_trees_at_v_32000() {
    let mut v = verifier(Mode::Hip);
    let mut g = Gen(0x32_000);
    for draft in [false, true] {
        let d = full_tree(&mut g, 64, 7, 32_000, draft);
        for m in METHODS {
            assert_matches(
                &mut v,
                m,
                Check::Cheap,
                &d,
                &format!("V=32000 draft={draft}"),
            );
        }
    }
}

/// Target logits with a temperature per request (0: greedy on the logits, > 0: each node row's
/// softmax on the fly), every method, with and without draft rows, both macro forms, batches
/// of probabilities in between (the same staging): the reference's bits and counts.
#[test]
fn logits_trees_through_the_orchestration() {
    for (i, mode) in [Mode::Cuda, Mode::Hip].into_iter().enumerate() {
        let mut v = verifier(mode);
        let mut g = Gen(0x1061_0000 + i as u64);
        let mut mixed = 0;
        for n in 0..12 {
            let d = random_tree_batch(
                &mut g,
                TreeSpec {
                    logits: n % 3 != 2,
                    ..spec(n % 2 == 1)
                },
            );
            if d.temperature
                .as_ref()
                .is_some_and(|t| t.contains(&0.0) && t.iter().any(|&x| x > 0.0))
            {
                mixed += 1;
            }
            for m in METHODS {
                assert_matches(&mut v, m, Check::STRICT, &d, &format!("{mode:?} batch {n}"));
            }
        }
        assert!(mixed >= 2, "{mode:?}: {mixed} batches mix T = 0 and T > 0");
    }
}

/// A 64-node tree at V = 32000 as logits (`ln(p + 1e-6)` of a full tree's rows), two requests
/// at T = 0 and T = 0.8, with and without draft rows.
#[test]
fn sixty_four_node_logits_trees_at_v_32000() {
    let mut v = verifier(Mode::Cuda);
    let mut g = Gen(0x32_1061);
    for draft in [false, true] {
        let one = full_tree(&mut g, 64, 7, 32_000, draft);
        // The same tree twice: request 0 at T = 0, request 1 at T = 0.8.
        let two = |x: &[f32]| [x, x].concat();
        let d = TreeData {
            nodes: two_u32(&one.nodes),
            tokens: two_u32(&one.tokens),
            first_child: [&one.first_child[..], &one.first_child[..]].concat(),
            next_sibling: [&one.next_sibling[..], &one.next_sibling[..]].concat(),
            draft: one.draft.as_deref().map(two),
            target: two(&one.target).iter().map(|&p| (p + 1e-6).ln()).collect(),
            temperature: Some(vec![0.0, 0.8]),
            seed: vec![one.seed[0], one.seed[0] ^ 0x5EED],
            offset: vec![one.offset[0]; 2],
            eps: two(&one.eps),
            delta: two(&one.delta),
            ..one
        };
        assert_eq!(d.requests(), 2);
        for m in METHODS {
            assert_matches(
                &mut v,
                m,
                Check::Cheap,
                &d,
                &format!("logits V=32000 draft={draft}"),
            );
        }
    }
}

fn two_u32(x: &[u32]) -> Vec<u32> {
    [x, x].concat()
}

/// Refused batches: the reference's error (`GpuError::Verify`); nothing launched, written or
/// counted.
#[test]
fn refused_tree_batches_launch_and_count_nothing() {
    let mut v = verifier(Mode::Cuda);
    let drv = v.driver().clone();
    let mut g = Gen(0xE440);
    let good = random_tree_batch(&mut g, spec(false));
    let b = good.requests();
    let mut cases: Vec<(&str, TreeData)> = Vec::new();
    let mut d = good.clone();
    d.nodes[b - 1] = d.max_nodes as u32 + 1;
    cases.push(("node count", d));
    let mut d = good.clone();
    d.next_sibling[0] = 1;
    cases.push(("root sibling", d));
    let mut d = good.clone();
    d.seed.pop();
    cases.push(("seeds", d));
    let mut d = good.clone();
    d.max_depth = K + 1;
    cases.push(("max depth", d));
    for (what, d) in &cases {
        let want = reference(Method::Greedy, Check::Cheap, d).unwrap_err();
        let mut out = TreeOut::new(d.requests(), d.max_depth);
        let got = v.verify_tree(Method::Greedy, Check::Cheap, &d.view(), &mut out.view());
        assert_eq!(got, Err(GpuError::Verify(want)), "{what}");
        assert_eq!(
            out,
            TreeOut::new(d.requests(), d.max_depth),
            "{what}: untouched"
        );
    }
    assert_eq!(drv.launches(), 0, "nothing launched");
    assert_eq!(v.totals().unwrap(), Counters::ZERO, "nothing counted");
}

/// A graph captured on the largest batch replays changing trees (shapes, node counts, batch
/// size, method, draft rows' values, offsets) written into the same staging: the reference's
/// outputs and counts, no synchronising call between the replays.
#[test]
fn tree_graph_replays_changing_trees() {
    for (i, mode) in [Mode::Cuda, Mode::Hip].into_iter().enumerate() {
        let mut v = verifier(mode);
        let drv = v.driver().clone();
        let mut g = Gen(0x6AF_0000 + i as u64);
        // Capacity: 6 requests of 12 node slots, max_depth 5, V = 37, draft rows present.
        let mut cap = random_tree_batch(
            &mut g,
            TreeSpec {
                max_requests: 1,
                ..spec(true)
            },
        );
        while cap.requests() < 6 {
            cap = random_tree_batch(
                &mut g,
                TreeSpec {
                    max_requests: 6,
                    ..spec(true)
                },
            );
        }
        let mut staging = Staging::<_, TreeStep>::default();
        let mut out = TreeOut::new(cap.requests(), cap.max_depth);
        v.stage(
            &mut staging,
            Method::Rejection,
            Check::Cheap,
            &cap.view(),
            &out.view(),
        )
        .unwrap();
        let args = staging
            .write::<K>(&drv, v.stream(), Method::Rejection, &cap.view(), ())
            .unwrap();
        // SAFETY: staged views of a checked batch; only `write` writes the staging.
        let graph = unsafe { v.capture_staged(&args) }.unwrap();
        assert_eq!(graph.capacity(), 6);
        assert_eq!(drv.launches(), 0, "capturing runs nothing");
        let mut expected = Counters::<K>::ZERO;
        for step in 0..10u64 {
            let method = METHODS[step as usize % 3];
            let mut d = random_tree_batch(
                &mut g,
                TreeSpec {
                    max_requests: 6,
                    ..spec(true)
                },
            );
            d.offset.iter_mut().for_each(|o| *o = o.wrapping_add(step));
            let (want, counted) = reference(method, Check::Cheap, &d).unwrap();
            expected.add(&counted);
            let step_args = staging
                .write::<K>(&drv, v.stream(), method, &d.view(), ())
                .unwrap();
            let syncs = (drv.sync_calls(), v.sync_calls());
            v.replay(&graph).unwrap();
            assert_eq!(
                (drv.sync_calls(), v.sync_calls()),
                syncs,
                "a replay never waits"
            );
            let mut got = TreeOut::new(d.requests(), d.max_depth);
            let flags = v.download_outputs(&step_args, &mut got.view()).unwrap();
            assert_eq!(flags, 0);
            assert_eq!(got, want, "{mode:?} step {step} {method:?}");
        }
        assert_eq!(drv.launches(), 10);
        assert_eq!(
            v.totals().unwrap(),
            expected,
            "counted exactly the live requests"
        );
        drop(graph);
        let _ = out.view();
    }
}

/// The tree step path (launches, replays, readback start/poll) makes no synchronising call,
/// counted by the driver; tree and chain launches add to one counters buffer, which one
/// readback reads.
#[test]
fn no_synchronising_call_on_the_tree_step_path() {
    let mut v = verifier(Mode::Cuda);
    let drv = v.driver().clone();
    let mut g = Gen(0x5_1C1);
    let d = random_tree_batch(
        &mut g,
        TreeSpec {
            max_requests: 4,
            ..spec(false)
        },
    );
    let mut staging = Staging::<_, TreeStep>::default();
    let out = TreeOut::new(d.requests(), d.max_depth);
    let mut o = out.clone();
    v.stage(
        &mut staging,
        Method::Greedy,
        Check::Cheap,
        &d.view(),
        &o.view(),
    )
    .unwrap();
    let mut rb = v.readback().unwrap();
    let args = staging
        .write::<K>(&drv, v.stream(), Method::Greedy, &d.view(), ())
        .unwrap();
    // SAFETY: staged views; nothing else writes the staging buffers.
    let graph = unsafe { v.capture_staged(&args) }.unwrap();
    let before = (drv.sync_calls(), v.sync_calls(), rb.sync_calls());
    let mut seen = Counters::<K>::ZERO;
    for step in 0..20 {
        if step % 2 == 0 {
            // SAFETY: staged views; nothing else writes the staging buffers.
            unsafe { v.launch_staged(&args) }.unwrap();
        } else {
            v.replay(&graph).unwrap();
        }
        if rb.in_flight() < rb.max_in_flight() {
            rb.start().unwrap();
        }
        if let Poll::Ready(r) = rb.poll() {
            let now = r.unwrap();
            assert!(now.drafts >= seen.drafts, "monotone");
            seen = now;
        }
    }
    assert_eq!(
        (drv.sync_calls(), v.sync_calls(), rb.sync_calls()),
        before,
        "no synchronising call on the tree step path"
    );
    // A chain step on the same verifier: its counts join the trees' in the same buffer.
    let chain = c::full_layout_batch(&mut g, 3);
    let (chain_out, chain_counted) = c::reference(Method::Greedy, Check::Cheap, &chain).unwrap();
    let mut got = c::OutData::new(chain.requests(), chain.k_max);
    v.verify(Method::Greedy, Check::Cheap, &chain.view(), &mut got.view())
        .unwrap();
    assert_eq!(got, chain_out);
    let total = rb.flush().unwrap();
    let (_, one) = reference(Method::Greedy, Check::Cheap, &d).unwrap();
    let mut expected = Counters::<K>::ZERO;
    for _ in 0..20 {
        expected.add(&one);
    }
    expected.add(&chain_counted);
    assert_eq!(total, expected, "trees and the chain, in one readback");
    assert_eq!(v.totals().unwrap(), total);
}

/// The raw device path: a malformed request (written by `Staging::<_, TreeStep>::write`, which does not
/// validate trees) sets its error bit, gets sentinel outputs and is not counted; the others are
/// verified as the reference verifies them alone. The host-slice path then reports the new
/// flags once.
#[test]
fn malformed_trees_on_the_raw_launch_are_flagged_and_skipped_alone() {
    let mut g = Gen(0xBAD1);
    let mut tried = 0;
    while tried < 3 {
        let base = random_tree_batch(&mut g, spec(false));
        let b = base.requests() - 1;
        let slot = b * base.max_nodes;
        let n = base.nodes[b] as usize;
        if n < 2 || base.requests() < 2 {
            continue;
        }
        tried += 1;
        let mut cases: Vec<(&str, TreeData, u64)> = Vec::new();
        let mut d = base.clone();
        d.nodes[b] = 0;
        cases.push(("no root", d, ERR_TREE));
        let mut d = base.clone();
        d.first_child[slot] = n as i32;
        cases.push(("link", d, ERR_TREE));
        let mut d = base.clone();
        let mut u = 0usize;
        while d.first_child[slot + u] >= 0 {
            u = d.first_child[slot + u] as usize;
        }
        d.first_child[slot + u] = d.first_child[slot];
        cases.push(("cycle", d, ERR_TREE));
        let mut d = base.clone();
        d.first_child[slot] = -1;
        cases.push(("unreachable", d, ERR_TREE));
        let mut d = base.clone();
        d.tokens[slot + 1] = d.vocab as u32;
        cases.push(("token", d, ERR_TOKEN));
        for (what, d, bit) in cases {
            let mut good = d.clone();
            good.nodes.truncate(b);
            let nb = b * d.max_nodes;
            good.tokens.truncate(nb);
            good.first_child.truncate(nb);
            good.next_sibling.truncate(nb);
            good.target.truncate(nb * d.vocab);
            good.seed.truncate(b);
            good.offset.truncate(b);
            good.eps.truncate(b);
            good.delta.truncate(b);
            let (want, want_c) = reference(Method::Rejection, Check::Cheap, &good).unwrap();
            let mut v = verifier(Mode::Hip);
            let drv = v.driver().clone();
            let mut staging = Staging::<_, TreeStep>::default();
            staging.reserve(&drv, &d.view(), ()).unwrap();
            let args = staging
                .write::<K>(&drv, v.stream(), Method::Rejection, &d.view(), ())
                .unwrap();
            // SAFETY: staged views: the shape words describe them; the trees' contents are
            // the kernel's to check.
            unsafe { v.launch_staged(&args) }.unwrap();
            let mut out = TreeOut::new(d.requests(), d.max_depth);
            let flags = v.download_outputs(&args, &mut out.view()).unwrap();
            assert_eq!(flags, bit, "{what}");
            let w = d.max_depth + 1;
            assert_eq!(out.accepted[b], SENTINEL, "{what}");
            assert!(out.path[b * w..].iter().all(|&x| x == SENTINEL), "{what}");
            assert!(out.tokens[b * w..].iter().all(|&x| x == SENTINEL), "{what}");
            assert_eq!(&out.accepted[..b], &want.accepted[..], "{what}");
            assert_eq!(&out.path[..b * w], &want.path[..], "{what}");
            assert_eq!(&out.tokens[..b * w], &want.tokens[..], "{what}");
            assert_eq!(
                v.totals().unwrap(),
                want_c,
                "{what}: only the good requests"
            );
            // The next host-slice call reports the flags raised meanwhile, once.
            let mut o = TreeOut::new(good.requests(), good.max_depth);
            let e = v.verify_tree(Method::Rejection, Check::Cheap, &good.view(), &mut o.view());
            assert_eq!(e, Err(GpuError::DeviceFlags(bit)), "{what}");
            assert_eq!(o, want, "{what}: the outputs are still written");
            v.verify_tree(Method::Rejection, Check::Cheap, &good.view(), &mut o.view())
                .unwrap();
        }
    }
}
