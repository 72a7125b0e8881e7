//! The GPU orchestration's tree path (`specula_core::gpu::tree`) over the fake driver
//! (`fake_driver.rs`) in its immediate mode: stream work runs when it is enqueued (or is
//! recorded while capturing), and the fake tree kernel writes values derived from its inputs,
//! so the tests see exactly what was staged, launched, replayed and copied down. (The host
//! driver of `specula-tests` runs the same code with the real kernel text.) Runs under Miri.

use specula_core::ErrorKind;
use specula_core::gpu::kernels;
use specula_core::gpu::{
    Driver, Element, GpuError, GpuVerifier, RowsView, Staging, TreeArgs, TreeStep, View, ViewMut,
    tree_shape,
};
use specula_core::verify::tree::{
    DeviceTreeOutputs, PathOut, Tree, TreeBatch, TreeDims, TreeOutputs,
};
use specula_core::verify::{
    AcceptedOut, Check, DEFAULT_DELTA, DEFAULT_EPS, Device, DeviceOut, Feature, Filter, Half,
    Logits, Method, Param, Rows, Streams, Target, TokensOut, Verifier, VerifyError,
};

use crate::fake_driver::*;

/// An owned batch of `b` requests of 3 node slots (root + 1 or 2 children), depth 1, V = 2.
struct Owned {
    nodes: Vec<u32>,
    tokens: Vec<u32>,
    first_child: Vec<i32>,
    next_sibling: Vec<i32>,
    target: Vec<f32>,
    draft: Option<Vec<f32>>,
    seed: Vec<u64>,
    offset: Vec<u64>,
}

impl Owned {
    fn new(b: usize) -> Self {
        Self {
            nodes: (0..b).map(|i| 2 + (i % 2) as u32).collect(),
            tokens: [0, 1, 0].repeat(b),
            first_child: [1, -1, -1].repeat(b),
            // Request i has 2 + i % 2 nodes: the second child only in odd requests.
            next_sibling: (0..b)
                .flat_map(|i| [-1, if i % 2 == 1 { 2 } else { -1 }, -1])
                .collect(),
            target: [0.25, 0.75].repeat(3 * b),
            draft: None,
            seed: (0..b as u64).collect(),
            offset: vec![7; b],
        }
    }
    fn view(&self) -> TreeBatch<'_> {
        let batch = TreeBatch::new(
            TreeDims {
                vocab: 2,
                max_nodes: 3,
                max_depth: 1,
            },
            Tree {
                nodes: &self.nodes,
                tokens: &self.tokens,
                first_child: &self.first_child,
                next_sibling: &self.next_sibling,
            },
            &self.target,
            Streams {
                seed: &self.seed,
                offset: &self.offset,
            },
        );
        match &self.draft {
            Some(d) => batch.with_draft_probs(d),
            None => batch,
        }
    }
}

struct Outs {
    accepted: Vec<u32>,
    path: Vec<u32>,
    tokens: Vec<u32>,
}

impl Outs {
    fn new(b: usize) -> Self {
        Self {
            accepted: vec![0; b],
            path: vec![0; 2 * b],
            tokens: vec![0; 2 * b],
        }
    }
    fn view(&mut self) -> TreeOutputs<'_> {
        TreeOutputs::new(
            AcceptedOut(&mut self.accepted),
            PathOut(&mut self.path),
            TokensOut(&mut self.tokens),
        )
    }
}

fn rig(b: usize) -> (Fake, GpuVerifier<Fake, K>, Staging<Fake, TreeStep>, Owned) {
    let drv = Fake::immediate(1);
    let mut v = GpuVerifier::<Fake, K>::new(drv.clone()).unwrap();
    let mut staging = Staging::<_, TreeStep>::default();
    let d = Owned::new(b);
    let mut o = Outs::new(b);
    v.stage(
        &mut staging,
        Method::Rejection,
        Check::Cheap,
        &d.view(),
        &o.view(),
    )
    .unwrap();
    (drv, v, staging, d)
}

#[test]
fn verify_tree_stages_launches_and_downloads_with_one_sync() {
    let drv = Fake::immediate(1);
    let mut v = GpuVerifier::<Fake, K>::new(drv.clone()).unwrap();
    let d = Owned::new(3);
    let mut o = Outs::new(3);
    v.verify_tree(Method::Greedy, Check::STRICT, &d.view(), &mut o.view())
        .unwrap();
    let l = drv.tree_launches();
    assert_eq!(l.len(), 1);
    let TreeRec {
        grid,
        block,
        stats,
        draft,
        entry,
        args: a,
    } = l[0].clone();
    assert_eq!((grid, block, stats, draft), (3, 96, v.stats().id, false));
    assert_eq!(entry, kernels::TREE_ENTRY, "binary32 rows");
    // The chain entries' argument block: node counts in `k`, node tokens in `draft_ids`, the
    // links and the path in their own fields, each its own view; the chain's own fields null.
    let set = [
        a.shape,
        a.k,
        a.draft_ids,
        a.first_child,
        a.next_sibling,
        a.target_probs,
        a.seed,
        a.offset,
        a.eps,
        a.delta,
        a.accepted,
        a.path,
        a.tokens,
        a.stats,
    ]
    .map(at);
    assert!(set.iter().all(Option::is_some), "{set:?}");
    let mut distinct = set.to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), set.len(), "one view per field");
    assert_eq!(at(a.stats), Some((v.stats().id, 0)));
    assert_eq!(
        [
            a.draft_probs,
            a.scratch,
            a.cu_num_draft_tokens,
            a.bonus,
            a.target_logits,
            a.temperature,
            a.sampling,
            a.recovered,
            a.draft_first_row,
        ],
        [0; 9]
    );
    assert_eq!((a.slices, a.reserved), (1, 0));
    assert_eq!(o.accepted, [102, 103, 102]);
    assert_eq!(o.path, [300, 301, 302, 303, 304, 305]);
    assert_eq!(o.tokens, [400, 401, 402, 403, 404, 405]);
    assert_eq!(v.sync_calls(), 1);
    assert_eq!(drv.st.syncs.get(), 1);
    // The tree launch counts into the verifier's own counters buffer.
    assert_eq!(v.totals().unwrap().drafts, 3);
}

#[test]
fn a_refused_tree_batch_enqueues_nothing() {
    let drv = Fake::immediate(1);
    let mut v = GpuVerifier::<Fake, K>::new(drv.clone()).unwrap();
    let mut d = Owned::new(2);
    d.first_child[3] = 3; // request 1's root links past its node count
    let mut o = Outs::new(2);
    let e = v
        .verify_tree(Method::Greedy, Check::Cheap, &d.view(), &mut o.view())
        .unwrap_err();
    assert_eq!(
        e,
        GpuError::Verify(VerifyError::LinkOutOfRange {
            request: 1,
            node: 0,
            link: 3
        })
    );
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
    let d = Owned::new(2);
    // Target logits are taken; a temperature the reference refuses is refused the same way.
    let temps = [0.0f32, f32::NAN];
    let batch = d.view().with_target_logits(Logits {
        values: &d.target,
        temperature: &temps,
    });
    let e = v
        .verify_tree(Method::Greedy, Check::Cheap, &batch, &mut o.view())
        .unwrap_err();
    assert_eq!(
        e,
        GpuError::Verify(VerifyError::BadParam {
            request: 1,
            param: Param::Temperature
        })
    );
    // Sampling filters: the tree entries have no filter pass.
    let filters = [Filter::NONE.with_top_p(0.9); 2];
    let e = v
        .verify_tree(
            Method::Rejection,
            Check::Cheap,
            &d.view().with_filters(&filters),
            &mut o.view(),
        )
        .unwrap_err();
    assert_eq!(
        e,
        GpuError::Verify(VerifyError::Unsupported {
            feature: Feature::Filters
        })
    );
    let mut short = Outs::new(2);
    short.path.pop();
    let e = v
        .verify_tree(Method::Greedy, Check::Cheap, &d.view(), &mut short.view())
        .unwrap_err();
    assert_eq!(
        e,
        GpuError::Verify(VerifyError::Length {
            param: Param::Path,
            len: 3,
            expected: 4
        })
    );
    assert_eq!(drv.st.ops.get(), 0, "nothing enqueued");
    assert_eq!((v.sync_calls(), o.accepted), (0, vec![0, 0]));
}

#[test]
fn tree_device_flags_are_reported_once() {
    let drv = Fake::immediate(1);
    let mut v = GpuVerifier::<Fake, K>::new(drv.clone()).unwrap();
    let d = Owned::new(1);
    let mut o = Outs::new(1);
    drv.st.flags.set(kernels::ERR_TREE);
    let e = v.verify_tree(Method::Rejection, Check::Cheap, &d.view(), &mut o.view());
    assert_eq!(e, Err(GpuError::DeviceFlags(kernels::ERR_TREE)));
    assert_eq!(
        v.verify_tree(Method::Rejection, Check::Cheap, &d.view(), &mut o.view()),
        Ok(())
    );
    drv.st.fail_launch.set(true);
    let e = v.verify_tree(Method::Rejection, Check::Cheap, &d.view(), &mut o.view());
    assert_eq!(e, Err(GpuError::Driver(FakeError(ErrorKind::Device))));
}

#[test]
fn tree_staging_writes_shape_words_defaults_and_draft_rows() {
    let (drv, v, staging, mut d) = rig(2);
    let a = staging
        .write::<K>(&drv, v.stream(), Method::Typical, &d.view(), ())
        .unwrap();
    let shape = elems(&a.step.shape);
    assert_eq!(shape, tree_shape::<K>(Method::Typical, &d.view()).unwrap());
    assert_eq!(
        shape,
        [
            2,
            1,
            2,
            0,
            2,
            kernels::method_code(Method::Typical),
            K as u32,
            0,
            3
        ]
    );
    assert_eq!(elems(&a.nodes), d.nodes);
    assert_eq!(elems(&a.tree_tokens), d.tokens);
    assert_eq!(elems(&a.first_child), d.first_child);
    assert_eq!(elems(&a.next_sibling), d.next_sibling);
    assert_eq!(elems(&f32_rows(a.step.target).unwrap()), d.target);
    assert_eq!(elems(&a.step.seed), d.seed);
    assert_eq!(elems(&a.step.offset), d.offset);
    assert_eq!(elems(&a.step.eps), [DEFAULT_EPS; 2]);
    assert_eq!(elems(&a.step.delta), [DEFAULT_DELTA; 2]);
    assert!(a.step.draft_probs.is_none());
    assert_eq!(
        (
            a.step.capacity,
            a.step.accepted.len(),
            a.path.len(),
            a.step.tokens.len()
        ),
        (2, 2, 4, 4)
    );
    // Draft rows need their own buffer: not reserved yet.
    d.draft = Some([0.5, 0.5].repeat(6));
    assert!(matches!(
        staging.write::<K>(&drv, v.stream(), Method::Rejection, &d.view(), ()),
        Err(GpuError::ViewTooShort)
    ));
    let mut staging = staging;
    staging.reserve(&drv, &d.view(), ()).unwrap();
    let a = staging
        .write::<K>(&drv, v.stream(), Method::Rejection, &d.view(), ())
        .unwrap();
    assert_eq!(
        elems(&a.step.draft_probs.and_then(f32_rows).unwrap()),
        [0.5; 12]
    );
    let shape = elems(&a.step.shape);
    assert_eq!(
        (
            shape[kernels::SHAPE_DRAFT_STRIDE],
            shape[kernels::SHAPE_FLAGS]
        ),
        (2, kernels::FLAG_DRAFT_PROBS)
    );
    // A larger batch than reserved is refused, nothing enqueued.
    let ops = drv.st.ops.get();
    let big = Owned::new(3);
    assert!(matches!(
        staging.write::<K>(&drv, v.stream(), Method::Rejection, &big.view(), ()),
        Err(GpuError::ViewTooShort)
    ));
    // Slices that do not match the sizes: the reference's error.
    let mut bad = Owned::new(2);
    bad.next_sibling.pop();
    assert_eq!(
        staging
            .write::<K>(&drv, v.stream(), Method::Rejection, &bad.view(), ())
            .unwrap_err(),
        GpuError::Verify(VerifyError::Length {
            param: Param::NextSibling,
            len: 5,
            expected: 6
        })
    );
    let mut bad = Owned::new(2);
    bad.target.pop();
    assert!(matches!(
        staging.write::<K>(&drv, v.stream(), Method::Rejection, &bad.view(), ()),
        Err(GpuError::Verify(VerifyError::Length {
            param: Param::TargetProbs,
            ..
        }))
    ));
    assert_eq!(drv.st.ops.get(), ops, "nothing enqueued");
    // Target logits: the rows as `target_logits` (`target_probs` empty, not read), the
    // temperatures in their own buffer (reserved: 8 bytes hold two).
    let temps = [0.0f32, 1.5];
    let logits = d.view().with_target_logits(Logits {
        values: &d.target,
        temperature: &temps,
    });
    let a = staging
        .write::<K>(&drv, v.stream(), Method::Rejection, &logits, ())
        .unwrap();
    assert_eq!(elems(&f32_rows(a.step.target).unwrap()), d.target);
    assert_eq!(elems(&a.step.temperature.unwrap()), temps);
    // Probabilities again in the same staging: no logits views.
    let a = staging
        .write::<K>(&drv, v.stream(), Method::Rejection, &d.view(), ())
        .unwrap();
    assert!(a.step.temperature.is_none());
    assert_eq!(elems(&f32_rows(a.step.target).unwrap()), d.target);
}

fn short<T: Element>(view: View<'_, Fake, T>) -> View<'_, Fake, T> {
    View::range(view.buffer(), 0, view.len() - 1).unwrap()
}

#[test]
fn tree_launch_checks_every_view_against_the_capacity() {
    let (drv, v, mut staging, mut d) = rig(2);
    d.draft = Some([0.5, 0.5].repeat(6));
    staging.reserve(&drv, &d.view(), ()).unwrap();
    // A one-node, depth-0 batch of 2: every per-node and per-slot view holds exactly 2.
    let one = Owned {
        nodes: vec![1, 1],
        tokens: vec![0, 0],
        first_child: vec![-1, -1],
        next_sibling: vec![-1, -1],
        target: vec![0.5; 2],
        draft: Some(vec![0.5; 2]),
        seed: vec![1, 2],
        offset: vec![0, 0],
    };
    let one_batch = TreeBatch::new(
        TreeDims {
            vocab: 1,
            max_nodes: 1,
            max_depth: 0,
        },
        Tree {
            nodes: &one.nodes,
            tokens: &one.tokens,
            first_child: &one.first_child,
            next_sibling: &one.next_sibling,
        },
        &one.target[..2],
        Streams {
            seed: &one.seed,
            offset: &one.offset,
        },
    )
    .with_draft_probs(&one.target[..2]);
    let temps = [0.0f32, 0.7];
    let one_logits = one_batch.with_target_logits(Logits {
        values: &one.target[..2],
        temperature: &temps,
    });
    let (mut acc1, mut path1, mut tok1) = (
        drv.alloc(8).unwrap(),
        drv.alloc(8).unwrap(),
        drv.alloc(8).unwrap(),
    );
    for field in 0..18 {
        // Fields 14 and 15 and the second control: the batch as logits.
        let batch = if (14..16).contains(&field) || field == 17 {
            &one_logits
        } else {
            &one_batch
        };
        let mut a: TreeArgs<'_, Fake> = staging
            .write::<K>(&drv, v.stream(), Method::Greedy, batch, ())
            .unwrap()
            .into_args();
        match field {
            0 => a.step.shape = View::range(a.step.shape.buffer(), 0, 8).unwrap(),
            1 => a.nodes = short(a.nodes),
            2 => a.tree_tokens = short(a.tree_tokens),
            3 => a.first_child = short(a.first_child),
            4 => a.next_sibling = short(a.next_sibling),
            5 => a.step.draft_probs = a.step.draft_probs.map(short_rows),
            6 => a.step.target = short_rows(a.step.target),
            7 => a.step.seed = short(a.step.seed),
            8 => a.step.offset = short(a.step.offset),
            9 => a.step.eps = short(a.step.eps),
            10 => a.step.delta = short(a.step.delta),
            11 => a.step.accepted = ViewMut::range(&mut acc1, 0, 1).unwrap(),
            12 => a.path = ViewMut::range(&mut path1, 0, 1).unwrap(),
            13 => a.step.tokens = ViewMut::range(&mut tok1, 0, 1).unwrap(),
            14 => a.step.target = short_rows(a.step.target),
            15 => a.step.temperature = a.step.temperature.map(short),
            _ => a.step.capacity = 2, // fits: the controls
        }
        let ops = drv.st.ops.get();
        // SAFETY: refused before anything is enqueued (or, for the control, staged views of a
        // valid batch).
        let launched = unsafe { v.launch(&a) };
        if field >= 16 {
            launched.unwrap();
            assert_eq!(drv.tree_launches().len(), field as usize - 15);
            continue;
        }
        assert_eq!(launched, Err(GpuError::ViewTooShort), "field {field}");
        // SAFETY: as above.
        let captured = unsafe { v.capture(&a) };
        assert_eq!(
            captured.map(|g| g.capacity()),
            Err(GpuError::ViewTooShort),
            "field {field}"
        );
        assert_eq!(drv.st.ops.get(), ops, "field {field}: nothing enqueued");
        assert!(v.stream().capture.borrow().is_none(), "not left capturing");
    }
    assert_eq!(drv.tree_launches().len(), 2);
}

/// Host tree outputs of three slices.
fn host<'a>(x: &'a mut [u32], y: &'a mut [u32], z: &'a mut [u32]) -> TreeOutputs<'a> {
    TreeOutputs::new(AcceptedOut(x), PathOut(y), TokensOut(z))
}

#[test]
fn download_outputs_refuses_tree_slices_longer_than_the_views() {
    let (drv, mut v, staging, d) = rig(2);
    let a = staging
        .write::<K>(&drv, v.stream(), Method::Greedy, &d.view(), ())
        .unwrap();
    // SAFETY: staged views; nothing else writes the staging buffers.
    unsafe { v.launch_staged(&a) }.unwrap();
    for (acc, path, tok) in [(3, 4, 4), (2, 5, 4), (2, 4, 5)] {
        let (mut x, mut y, mut z) = (vec![0; acc], vec![0; path], vec![0; tok]);
        assert_eq!(
            v.download_outputs(&a, &mut host(&mut x, &mut y, &mut z)),
            Err(GpuError::ViewTooShort)
        );
    }
    let (mut x, mut y, mut z) = (vec![0; 2], vec![0; 4], vec![0; 4]);
    assert_eq!(
        v.download_outputs(&a, &mut host(&mut x, &mut y, &mut z)),
        Ok(0)
    );
    assert_eq!(
        (x, y, z),
        (
            vec![102, 103],
            vec![300, 301, 302, 303],
            vec![400, 401, 402, 403]
        )
    );
    assert_eq!(v.sync_calls(), 1);
}

#[test]
fn a_tree_graph_runs_nothing_until_replayed_and_replays_new_trees() {
    let (drv, mut v, staging, d) = rig(4);
    let a = staging
        .write::<K>(&drv, v.stream(), Method::Greedy, &d.view(), ())
        .unwrap();
    // SAFETY: staged views; only `write` writes the staging buffers.
    let graph = unsafe { v.capture_staged(&a) }.unwrap();
    assert_eq!(graph.capacity(), 4);
    assert!(drv.tree_launches().is_empty(), "capture runs nothing");
    // A smaller batch into the same buffers, then a replay.
    let mut small = Owned::new(2);
    small.nodes = vec![3, 1];
    let a2 = staging
        .write::<K>(&drv, v.stream(), Method::Greedy, &small.view(), ())
        .unwrap();
    let syncs = v.sync_calls();
    v.replay(&graph).unwrap();
    assert_eq!(v.sync_calls(), syncs, "a replay never synchronises");
    assert_eq!(drv.tree_launches().len(), 1);
    assert_eq!(drv.tree_launches()[0].grid, 4, "the captured capacity");
    let (mut x, mut y, mut z) = (vec![0; 2], vec![0; 4], vec![0; 4]);
    v.download_outputs(&a2, &mut host(&mut x, &mut y, &mut z))
        .unwrap();
    assert_eq!(x, [103, 101], "the new node counts");
    assert_eq!(v.totals().unwrap().drafts, 2, "the new batch word");
    // A capture whose launch fails still ends the capture.
    drv.st.fail_launch.set(true);
    // SAFETY: as above.
    let e = unsafe { v.capture_staged(&a2) }.err();
    assert_eq!(e, Some(GpuError::Driver(FakeError(ErrorKind::Device))));
    assert!(v.stream().capture.borrow().is_none(), "capture ended");
}

/// `replay_staged` of a tree graph (the chain's call): a batch beyond the graph's capacity
/// (written into another staging) is `GraphMismatch` with nothing enqueued; one within it
/// replays.
#[test]
fn replay_staged_refuses_trees_beyond_the_graphs_capacity() {
    let (drv, mut v, staging, d) = rig(2);
    let (_, _, big_staging, big) = rig(3);
    let a = staging
        .write::<K>(&drv, v.stream(), Method::Greedy, &d.view(), ())
        .unwrap();
    // SAFETY: staged views; only `write` writes the staging buffers.
    let graph = unsafe { v.capture_staged(&a) }.unwrap();
    let b = big_staging
        .write::<K>(&drv, v.stream(), Method::Greedy, &big.view(), ())
        .unwrap();
    let ops = drv.st.ops.get();
    assert_eq!(v.replay_staged(&graph, &b), Err(GpuError::GraphMismatch));
    assert_eq!(drv.st.ops.get(), ops, "nothing enqueued");
    assert!(drv.tree_launches().is_empty());
    v.replay_staged(&graph, &a).unwrap();
    assert_eq!(drv.tree_launches().len(), 1);
    // Outputs on the device were written in place: only the counters are copied down, with
    // the one wait.
    let mut bufs = [(); 3].map(|()| drv.alloc(16).unwrap());
    let [x, y, z] = &mut bufs;
    let mut out = TreeOutputs::on_device(DeviceTreeOutputs {
        accepted: DeviceOut::new(ViewMut::<Fake, u32>::new(x)),
        path: DeviceOut::new(ViewMut::<Fake, u32>::new(y)),
        tokens: DeviceOut::new(ViewMut::<Fake, u32>::new(z)),
    });
    let syncs = v.sync_calls();
    assert_eq!(v.download_outputs(&a, &mut out), Ok(0));
    assert_eq!(v.sync_calls(), syncs + 1);
}

/// `Staging::<_, TreeStep>::write` refuses what the reference's shape checks refuse, with the same error
/// (batch size, node slots, depth, vocabulary, strides, every input slice), and nothing is
/// enqueued.
#[test]
fn tree_staging_refuses_malformed_shapes_with_the_references_errors() {
    use specula_core::verify::Strides;
    use specula_core::verify::tree::{MAX_TREE_NODES, validate_tree_shape};
    let (drv, v, staging, _) = rig(2);
    let n = MAX_TREE_NODES + 1;
    let big = (vec![0u32; n], vec![-1i32; n], vec![0.5f32; 2 * n]);
    let d = Owned::new(2);
    let eps1 = [0.1f32];
    let cases: Vec<(&str, TreeBatch<'_>)> = vec![
        ("empty", {
            let mut b = d.view();
            b.tree.nodes = &[];
            b
        }),
        ("no node slot", {
            let mut b = d.view();
            b.max_nodes = 0;
            b
        }),
        ("too many node slots", {
            let mut b = TreeBatch::new(
                TreeDims {
                    vocab: 2,
                    max_nodes: n,
                    max_depth: 1,
                },
                Tree {
                    nodes: &[1],
                    tokens: &big.0,
                    first_child: &big.1,
                    next_sibling: &big.1,
                },
                &big.2,
                Streams {
                    seed: &[1],
                    offset: &[0],
                },
            );
            b.max_nodes = n;
            b
        }),
        ("too deep", {
            let mut b = d.view();
            b.max_depth = K + 1;
            b
        }),
        ("no vocabulary", {
            let mut b = d.view();
            b.vocab = 0;
            b
        }),
        ("vocabulary above u32::MAX", {
            let mut b = d.view();
            b.vocab = u32::MAX as usize + 1;
            b
        }),
        ("vocabulary u32::MAX: slices too short", {
            let mut b = d.view();
            b.vocab = u32::MAX as usize;
            b
        }),
        (
            "target stride",
            d.view().with_strides(Strides {
                draft: 2,
                target: 1,
            }),
        ),
        ("draft stride", {
            let b = d.view().with_draft_probs(&d.target);
            b.with_strides(Strides {
                draft: 1,
                target: 2,
            })
        }),
        ("draft rows", d.view().with_draft_probs(&d.target[1..])),
        ("tokens", {
            let mut b = d.view();
            b.tree.tokens = &d.tokens[1..];
            b
        }),
        ("first children", {
            let mut b = d.view();
            b.tree.first_child = &d.first_child[1..];
            b
        }),
        ("seeds", {
            let mut b = d.view();
            b.seed = &d.seed[1..];
            b
        }),
        ("offsets", {
            let mut b = d.view();
            b.offset = &d.offset[1..];
            b
        }),
        ("eps", d.view().with_typical(&eps1, &eps1)),
        ("delta", {
            let mut b = d.view().with_typical(&[0.1, 0.1], &[0.2, 0.2]);
            b.delta = Some(&eps1);
            b
        }),
    ];
    let ops = drv.st.ops.get();
    for (what, b) in cases {
        let w = b.max_depth.saturating_add(1).min(64);
        let r = b.requests();
        let (mut acc, mut path, mut tok) = (vec![0; r], vec![0; r * w], vec![0; r * w]);
        let out = TreeOutputs::new(
            AcceptedOut(&mut acc),
            PathOut(&mut path),
            TokensOut(&mut tok),
        );
        let want = validate_tree_shape::<K>(&b, &out).unwrap_err();
        let got = staging
            .write::<K>(&drv, v.stream(), Method::Rejection, &b, ())
            .err();
        assert_eq!(got, Some(GpuError::Verify(want)), "{what}");
    }
    assert_eq!(drv.st.ops.get(), ops, "nothing enqueued");
}

/// The largest shapes the checks allow pass them: 512 node slots, `max_depth = K`, rows padded
/// past `V` (strides above the vocabulary).
#[test]
fn tree_staging_accepts_the_boundary_shapes() {
    use specula_core::verify::tree::MAX_TREE_NODES;
    let drv = Fake::immediate(1);
    let v = GpuVerifier::<Fake, K>::new(drv.clone()).unwrap();
    let n = MAX_TREE_NODES;
    let big = (vec![0u32; n], vec![-1i32; n], vec![0.5f32; 2 * n]);
    let widest = TreeBatch::new(
        TreeDims {
            vocab: 2,
            max_nodes: n,
            max_depth: 1,
        },
        Tree {
            nodes: &[1],
            tokens: &big.0,
            first_child: &big.1,
            next_sibling: &big.1,
        },
        &big.2,
        Streams {
            seed: &[1],
            offset: &[0],
        },
    );
    let d = Owned::new(2);
    let mut deepest = d.view();
    deepest.max_depth = K;
    let padded_rows = [0.25f32, 0.75, 9.0].repeat(6);
    let padded = d
        .view()
        .with_target(Target::Probs(Rows::f32(&padded_rows, 3)))
        .with_draft(Rows::f32(&padded_rows, 3));
    for (what, b, out) in [
        ("512 node slots", widest, 2),
        ("max_depth = K", deepest, 2 * (K + 1)),
        ("padded rows", padded, 4),
    ] {
        let mut staging = Staging::<_, TreeStep>::default();
        staging.reserve(&drv, &b, ()).unwrap();
        let a = staging
            .write::<K>(&drv, v.stream(), Method::Rejection, &b, ())
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(a.path.len(), out, "{what}");
        let shape = elems(&a.step.shape);
        assert_eq!(
            shape,
            tree_shape::<K>(Method::Rejection, &b).unwrap(),
            "{what}"
        );
    }
}

/// The default ε and δ are uploaded in chunks of 64 from the stack: every request gets them,
/// past the first chunk too.
#[test]
fn default_typical_parameters_reach_every_request() {
    let (drv, v, mut staging, _) = rig(1);
    let d = Owned::new(130);
    staging.reserve(&drv, &d.view(), ()).unwrap();
    let a = staging
        .write::<K>(&drv, v.stream(), Method::Typical, &d.view(), ())
        .unwrap();
    assert_eq!(elems(&a.step.eps), vec![DEFAULT_EPS; 130]);
    assert_eq!(elems(&a.step.delta), vec![DEFAULT_DELTA; 130]);
}

/// The tree entry is made ready at set-up (`stage`, and `capture` before its capture
/// begins), never while a stream captures; a failure to prepare is the driver's error, with
/// nothing captured or staged.
#[test]
fn the_tree_entry_is_prepared_at_set_up_outside_any_capture() {
    let (drv, v, staging, d) = rig(2);
    assert_eq!(drv.st.prepared.get(), 1, "stage prepared it");
    let a = staging
        .write::<K>(&drv, v.stream(), Method::Greedy, &d.view(), ())
        .unwrap();
    // SAFETY: staged views; only `write` writes the staging buffers.
    let graph = unsafe { v.capture_staged(&a) }.ok().unwrap();
    assert_eq!(drv.st.prepared.get(), 2, "capture prepared it");
    assert_eq!(drv.st.prepared_while_capturing.get(), 0);
    v.replay(&graph).unwrap();
    assert_eq!(drv.st.prepared.get(), 2, "a replay does not");
    drv.st.fail_prepare.set(true);
    // SAFETY: as above.
    let e = unsafe { v.capture_staged(&a) }.err();
    assert_eq!(e, Some(GpuError::Driver(FakeError(ErrorKind::Compile))));
    assert!(
        v.stream().capture.borrow().is_none(),
        "no capture left open"
    );
    let drv2 = Fake::immediate(1);
    drv2.st.fail_prepare.set(true);
    let mut fresh = GpuVerifier::<Fake, K>::new(drv2.clone()).unwrap();
    let mut staging2 = Staging::<_, TreeStep>::default();
    let mut o = Outs::new(2);
    let e = fresh.stage(
        &mut staging2,
        Method::Greedy,
        Check::Cheap,
        &d.view(),
        &o.view(),
    );
    assert_eq!(e, Err(GpuError::Driver(FakeError(ErrorKind::Compile))));
    assert_eq!(drv2.st.ops.get(), 0, "nothing staged");
}

#[test]
fn device_tree_rows_and_outputs_are_launched_in_place_without_a_wait() {
    let drv = Fake::immediate(1);
    let mut v = GpuVerifier::<Fake, K>::new(drv.clone()).unwrap();
    let d = Owned::new(3);
    // Target rows at an offset in a larger device buffer; outputs in the caller's buffers, the
    // accepted counts at an offset.
    let target = drv.alloc(4 * (2 + d.target.len())).unwrap();
    for (i, &x) in d.target.iter().enumerate() {
        write(&target, 4 * (2 + i), x);
    }
    let mut batch = d.view();
    batch.target = Target::Probs(Rows::device(
        Device::f32(View::<Fake, f32>::range(&target, 2, d.target.len()).unwrap()),
        2,
    ));
    let (mut acc, mut path, mut tok) = (
        drv.alloc(4 * 5).unwrap(),
        drv.alloc(4 * 6).unwrap(),
        drv.alloc(4 * 6).unwrap(),
    );
    let ids = (acc.id, path.id, tok.id);
    let mut out = TreeOutputs::on_device(DeviceTreeOutputs {
        accepted: DeviceOut::new(ViewMut::<Fake, u32>::range(&mut acc, 2, 3).unwrap()),
        path: DeviceOut::new(ViewMut::<Fake, u32>::new(&mut path)),
        tokens: DeviceOut::new(ViewMut::<Fake, u32>::new(&mut tok)),
    });
    v.verify_tree(Method::Greedy, Check::Cheap, &batch, &mut out)
        .unwrap();
    assert_eq!((v.sync_calls(), drv.st.syncs.get()), (0, 0), "no wait");
    let a = drv.tree_launches()[0].args;
    assert_eq!(
        at(a.target_probs),
        Some((target.id, 8)),
        "rows read in place"
    );
    assert_eq!(
        (at(a.accepted), at(a.path), at(a.tokens)),
        (Some((ids.0, 8)), Some((ids.1, 0)), Some((ids.2, 0))),
        "outputs written in place"
    );
    let acc_vals: Vec<u32> = (0..5).map(|i| read(&acc, 4 * i)).collect();
    assert_eq!(acc_vals, [0, 0, 102, 103, 102], "only the window written");
    let path_vals: Vec<u32> = (0..6).map(|i| read(&path, 4 * i)).collect();
    assert_eq!(path_vals, [300, 301, 302, 303, 304, 305]);
    assert_eq!(v.totals().unwrap().drafts, 3);
}

/// The entry a tree launch names follows its rows: the binary32 entry for binary32 rows, the
/// half entry as soon as the target or the draft rows are bf16 / f16 (device views here), the
/// same argument block either way.
#[test]
fn half_tree_rows_launch_the_half_entry_and_binary32_rows_the_binary32_one() {
    let drv = Fake::immediate(1);
    let plain = Owned::new(3);
    let drafted = Owned {
        draft: Some([0.5, 0.5].repeat(3 * 3)),
        ..Owned::new(3)
    };
    // The rows as bf16 patterns (0.25, 0.5 and 0.75 are exact in bf16).
    let bf16 = |x: &[f32]| {
        let b = drv.alloc(2 * x.len()).unwrap();
        for (i, &v) in x.iter().enumerate() {
            write(&b, 2 * i, (v.to_bits() >> 16) as u16);
        }
        b
    };
    let (target, draft) = (bf16(&plain.target), bf16(drafted.draft.as_deref().unwrap()));
    let half_rows = |b| Rows::device(Device::bf16(View::<Fake, u16>::new(b)), 2);
    // (what, draft rows, bf16 target, bf16 draft, the entry)
    let cases = [
        ("binary32 rows", false, false, false, kernels::TREE_ENTRY),
        (
            "binary32 rows, draft",
            true,
            false,
            false,
            kernels::TREE_ENTRY,
        ),
        ("bf16 target", false, true, false, kernels::TREE_HALF_ENTRY),
        ("bf16 draft", true, false, true, kernels::TREE_HALF_ENTRY),
        (
            "bf16 target and draft",
            true,
            true,
            true,
            kernels::TREE_HALF_ENTRY,
        ),
    ];
    for (what, with_draft, half_target, half_draft, entry) in cases {
        let mut v = GpuVerifier::<Fake, K>::new(drv.clone()).unwrap();
        let mut batch = if with_draft {
            drafted.view()
        } else {
            plain.view()
        };
        if half_target {
            batch.target = Target::Probs(half_rows(&target));
        }
        if half_draft {
            batch = batch.with_draft(half_rows(&draft));
        }
        let m = if with_draft {
            Method::Rejection
        } else {
            Method::Greedy
        };
        let mut o = Outs::new(3);
        v.verify_tree(m, Check::Cheap, &batch, &mut o.view())
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let rec = drv.tree_launches().last().cloned().unwrap();
        assert_eq!(rec.entry, entry, "{what}");
        assert_eq!(
            rec.draft,
            with_draft && !half_draft,
            "{what}: binary32 draft rows"
        );
        assert_eq!(o.accepted, [102, 103, 102], "{what}: the launch ran");
        // Half rows go in the field of their binary32 kind, read in place.
        let a = rec.args;
        match (with_draft, half_draft) {
            (false, _) => assert_eq!(a.draft_probs, 0, "{what}"),
            (true, true) => assert_eq!(at(a.draft_probs), Some((draft.id, 0)), "{what}"),
            (true, false) => assert!(at(a.draft_probs).is_some_and(|(id, _)| id != draft.id)),
        }
        let probs = at(a.target_probs).unwrap();
        assert_eq!(probs.0 == target.id, half_target, "{what}: target rows");
        assert_eq!((a.target_logits, a.temperature), (0, 0), "{what}");
    }
    assert_eq!(drv.tree_launches().len(), cases.len());
    // Logits: bf16 logit rows in the logits field with the temperatures, the binary32
    // probabilities field then not the rows'.
    let temps = [0.0f32, 0.7, 1.0];
    for half in [false, true] {
        let mut v = GpuVerifier::<Fake, K>::new(drv.clone()).unwrap();
        let rows = if half {
            half_rows(&target)
        } else {
            Rows::f32(&plain.target, 2)
        };
        let batch = plain.view().with_target(Target::Logits {
            rows,
            temperature: &temps,
        });
        let mut o = Outs::new(3);
        v.verify_tree(Method::Greedy, Check::Cheap, &batch, &mut o.view())
            .unwrap();
        let a = drv.tree_launches().last().unwrap().args;
        let logits = at(a.target_logits).expect("logits passed");
        assert_eq!(
            logits.0 == target.id,
            half,
            "half {half}: logit rows in place"
        );
        assert!(a.temperature != 0 && at(a.target_probs) != Some((target.id, 0)));
    }
}

#[test]
fn device_tree_outputs_of_another_device_are_refused_before_any_work() {
    let drv = Fake::immediate(1);
    let mut v = GpuVerifier::<Fake, K>::new(drv.clone()).unwrap();
    let d = Owned::new(2);
    let (mut acc, mut path, mut tok) = (
        drv.alloc(4 * 2).unwrap(),
        drv.alloc(4 * 4).unwrap(),
        drv.alloc(4 * 4).unwrap(),
    );
    drv.st.foreign.set(Some(path.id));
    let mut out = TreeOutputs::on_device(DeviceTreeOutputs {
        accepted: DeviceOut::new(ViewMut::<Fake, u32>::new(&mut acc)),
        path: DeviceOut::new(ViewMut::<Fake, u32>::new(&mut path)),
        tokens: DeviceOut::new(ViewMut::<Fake, u32>::new(&mut tok)),
    });
    let e = v
        .verify_tree(Method::Greedy, Check::Cheap, &d.view(), &mut out)
        .unwrap_err();
    assert!(
        matches!(e, GpuError::ForeignMemory { param: Param::Path }),
        "{e:?}"
    );
    assert!(drv.tree_launches().is_empty());
    assert_eq!(v.totals().unwrap().drafts, 0, "nothing counted");
}

#[test]
fn tree_launch_checks_the_half_row_views() {
    let (drv, v, mut staging, d) = rig(2);
    // bf16 draft rows (0.5 each), N · V per request; then every half view must hold a request.
    let draft = vec![0x3f00u16; 2 * 3 * 2];
    let batch = d.view().with_draft(Rows::half(Half::Bf16(&draft), 2));
    staging.reserve(&drv, &batch, ()).unwrap();
    for case in 0..2 {
        let mut a: TreeArgs<'_, Fake> = staging
            .write::<K>(&drv, v.stream(), Method::Rejection, &batch, ())
            .unwrap()
            .into_args();
        assert!(a.step.draft_probs.is_some_and(|d| d.is_half()));
        if case == 0 {
            let h = a.step.draft_probs.and_then(half_rows).unwrap();
            a.step.draft_probs = Some(RowsView::Half(View::range(h.buffer(), 0, 1).unwrap()));
        }
        // SAFETY: refused before anything is enqueued, or the staged views of a valid batch.
        let launched = unsafe { v.launch(&a) };
        if case == 1 {
            launched.unwrap(); // the control
        } else {
            assert_eq!(launched, Err(GpuError::ViewTooShort), "case {case}");
        }
    }
    assert_eq!(drv.tree_launches().len(), 1);
}
