//! Owned token-tree batches and their random generator, for the tree conformance and
//! statistical tests.

use crate::conformance::{Gen, K, METHODS};
use specula_core::gpu::{Driver, GpuError, GpuVerifier, Staging, TreeStep};
use specula_core::verify::tree::{
    NO_NODE, PathOut, Tree, TreeBatch, TreeDims, TreeOutputs, links_from_parents, verify_tree_batch,
};
use specula_core::verify::{
    AcceptedOut, Check, Logits, Method, Rows, SENTINEL, Streams, TokensOut, Values, Verifier,
};
use specula_core::{Counters, Readback};

/// An owned tree batch; [`TreeData::view`] makes the [`TreeBatch`].
#[derive(Clone, Debug, PartialEq)]
#[allow(missing_docs)] // the fields are those of `TreeBatch`
pub struct TreeData {
    pub vocab: usize,
    pub max_nodes: usize,
    pub max_depth: usize,
    pub nodes: Vec<u32>,
    pub tokens: Vec<u32>,
    pub first_child: Vec<i32>,
    pub next_sibling: Vec<i32>,
    pub draft: Option<Vec<f32>>,
    pub target: Vec<f32>,
    pub temperature: Option<Vec<f32>>,
    pub seed: Vec<u64>,
    pub offset: Vec<u64>,
    pub eps: Vec<f32>,
    pub delta: Vec<f32>,
}

impl TreeData {
    /// The borrowed batch.
    pub fn view(&self) -> TreeBatch<'_> {
        let mut b = TreeBatch::new(
            TreeDims {
                vocab: self.vocab,
                max_nodes: self.max_nodes,
                max_depth: self.max_depth,
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
        )
        .with_typical(&self.eps, &self.delta);
        if let Some(d) = &self.draft {
            b = b.with_draft_probs(d);
        }
        if let Some(t) = &self.temperature {
            b = b.with_target_logits(Logits {
                values: &self.target,
                temperature: t,
            });
        }
        b
    }

    /// The batch size.
    pub fn requests(&self) -> usize {
        self.nodes.len()
    }

    /// The parent of every node of request `b` (`-1` for the root), from its links.
    pub fn parents(&self, b: usize) -> Vec<i32> {
        let n = self.nodes[b] as usize;
        let base = b * self.max_nodes;
        let mut parents = vec![NO_NODE; n];
        for u in 0..n {
            let mut c = self.first_child[base + u];
            while c >= 0 {
                parents[c as usize] = u as i32;
                c = self.next_sibling[base + c as usize];
            }
        }
        parents
    }
}

/// Owned outputs for a [`TreeData`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct TreeOut {
    pub accepted: Vec<u32>,
    pub path: Vec<u32>,
    pub tokens: Vec<u32>,
}

impl TreeOut {
    /// Outputs for `b` requests of `max_depth`, filled with a marker value.
    pub fn new(b: usize, max_depth: usize) -> Self {
        let w = b * (max_depth + 1);
        Self {
            accepted: vec![0xAAAA; b],
            path: vec![0xAAAA; w],
            tokens: vec![0xAAAA; w],
        }
    }

    /// The borrowed outputs.
    pub fn view(&mut self) -> TreeOutputs<'_> {
        TreeOutputs::new(
            AcceptedOut(&mut self.accepted),
            PathOut(&mut self.path),
            TokensOut(&mut self.tokens),
        )
    }
}

/// A random parent array of `n` nodes whose depth stays `≤ max_depth`, with node labels
/// shuffled so that sibling order is not creation order.
pub fn random_parents(g: &mut Gen, n: usize, max_depth: usize) -> Vec<i32> {
    let mut depth = vec![0usize; n];
    let mut created = vec![-1i32; n];
    for i in 1..n {
        let p = loop {
            let p = g.below(i);
            if depth[p] < max_depth {
                break p;
            }
        };
        created[i] = p as i32;
        depth[i] = depth[p] + 1;
    }
    let mut label: Vec<usize> = (0..n).collect();
    for i in (2..n).rev() {
        let j = 1 + g.below(i);
        label.swap(i, j);
    }
    let mut parents = vec![NO_NODE; n];
    for i in 1..n {
        parents[label[i]] = label[created[i] as usize] as i32;
    }
    parents
}

/// A random probability row (some ids exactly 0), summing to 1 within rounding.
pub fn random_row(g: &mut Gen, v: usize) -> Vec<f32> {
    let mut row: Vec<f32> = (0..v)
        .map(|_| if g.chance(1, 4) { 0.0 } else { g.unit() + 1e-3 })
        .collect();
    if g.chance(1, 5) {
        // A peaked row.
        let t = g.below(v);
        row[t] += 20.0;
    }
    let s: f32 = row.iter().sum();
    row.iter_mut().for_each(|x| *x /= s);
    row
}

/// What [`random_tree_batch`] builds.
#[derive(Clone, Copy, Debug)]
pub struct TreeSpec {
    /// At most this many requests.
    pub max_requests: usize,
    /// Node slots per request.
    pub max_nodes: usize,
    /// Deepest node allowed.
    pub max_depth: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// Draft probabilities present.
    pub draft: bool,
    /// Target logits with these temperatures per request (picked at random) instead of
    /// probabilities.
    pub logits: bool,
    /// Inject NaN, negative and oversized values into some rows.
    pub garbage: bool,
}

/// A random valid tree batch: random shapes, siblings' tokens drawn from their draft rows (or
/// the target's), sometimes duplicated.
pub fn random_tree_batch(g: &mut Gen, spec: TreeSpec) -> TreeData {
    let b = 1 + g.below(spec.max_requests);
    let (v, nmax) = (spec.vocab, spec.max_nodes);
    let mut d = TreeData {
        vocab: v,
        max_nodes: nmax,
        max_depth: spec.max_depth,
        nodes: vec![],
        tokens: vec![0; b * nmax],
        first_child: vec![NO_NODE; b * nmax],
        next_sibling: vec![NO_NODE; b * nmax],
        draft: spec.draft.then(|| vec![0.0; b * nmax * v]),
        target: vec![0.0; b * nmax * v],
        temperature: None,
        seed: (0..b).map(|_| g.next_u64()).collect(),
        offset: (0..b).map(|_| g.next_u64() >> g.below(64)).collect(),
        eps: (0..b).map(|_| 0.05 + 0.1 * g.unit()).collect(),
        delta: (0..b).map(|_| 0.2 + 0.3 * g.unit()).collect(),
    };
    for r in 0..b {
        let n = 1 + g.below(nmax);
        d.nodes.push(n as u32);
        let parents = random_parents(g, n, spec.max_depth);
        let base = r * nmax;
        links_from_parents(
            &parents,
            &mut d.first_child[base..base + n],
            &mut d.next_sibling[base..base + n],
        )
        .expect("a valid parent array");
        for i in 0..n {
            let row = random_row(g, v);
            d.target[(base + i) * v..][..v].copy_from_slice(&row);
        }
        for i in 1..n {
            let p = parents[i] as usize;
            let token = if let Some(dr) = &mut d.draft {
                let row = random_row(g, v);
                dr[(base + i) * v..][..v].copy_from_slice(&row);
                crate::conformance::sample(g, &row)
            } else if g.chance(1, 2) {
                crate::conformance::sample(g, &d.target[(base + p) * v..][..v])
            } else {
                g.below(v) as u32
            };
            d.tokens[base + i] = token;
        }
        // Some duplicated sibling tokens.
        if n > 2 && g.chance(1, 3) {
            let i = 1 + g.below(n - 1);
            let p = parents[i];
            if let Some(j) = (1..n).find(|&j| j != i && parents[j] == p) {
                d.tokens[base + j] = d.tokens[base + i];
            }
        }
    }
    if spec.logits {
        for x in &mut d.target {
            *x = if *x > 0.0 { x.ln() } else { f32::NEG_INFINITY };
        }
        d.temperature = Some((0..b).map(|_| [0.0, 0.5, 1.0, 1.7][g.below(4)]).collect());
    }
    if spec.garbage {
        for _ in 0..3 {
            let rows = match &mut d.draft {
                Some(dr) if g.chance(1, 2) => dr,
                _ => &mut d.target,
            };
            let i = g.below(rows.len());
            rows[i] = [f32::NAN, -0.5, 3.0, f32::INFINITY, 0.0][g.below(5)];
        }
    }
    d
}

/// Checks that outputs are a well-formed path of each tree: starts at the root, each node a
/// child of the one before, tokens the nodes' tokens then one emitted token `< V`, sentinels
/// after.
pub fn assert_well_formed(d: &TreeData, out: &TreeOut, what: &str) {
    let w = d.max_depth + 1;
    for b in 0..d.requests() {
        let parents = d.parents(b);
        let n = out.accepted[b] as usize;
        let path = &out.path[b * w..][..w];
        let tokens = &out.tokens[b * w..][..w];
        assert_eq!(path[0], 0, "{what}: request {b} starts at the root");
        for j in 1..=n {
            let x = path[j] as usize;
            assert_eq!(
                parents[x],
                path[j - 1] as i32,
                "{what}: request {b}, step {j}"
            );
            assert_eq!(tokens[j - 1], d.tokens[b * d.max_nodes + x], "{what}");
        }
        assert!((tokens[n] as usize) < d.vocab, "{what}: emitted token");
        assert!(path[n + 1..].iter().all(|&x| x == SENTINEL), "{what}");
        assert!(tokens[n + 1..].iter().all(|&x| x == SENTINEL), "{what}");
    }
}

/// One request of exactly `n` nodes (depth ≤ `max_depth`) at vocabulary `v`: random shape, a
/// random target row per node, and with `draft` a random draft row per node that its token is
/// drawn from.
pub fn full_tree(g: &mut Gen, n: usize, max_depth: usize, v: usize, draft: bool) -> TreeData {
    let parents = random_parents(g, n, max_depth);
    let (mut first_child, mut next_sibling) = (vec![0; n], vec![0; n]);
    links_from_parents(&parents, &mut first_child, &mut next_sibling).unwrap();
    let target: Vec<f32> = (0..n).flat_map(|_| random_row(g, v)).collect();
    let draft_rows: Option<Vec<f32>> =
        draft.then(|| (0..n).flat_map(|_| random_row(g, v)).collect());
    let tokens = (0..n)
        .map(|i| match (&draft_rows, i) {
            (_, 0) => 0,
            (Some(q), i) => crate::conformance::sample(g, &q[i * v..][..v]),
            (None, i) => crate::conformance::sample(g, &target[parents[i] as usize * v..][..v]),
        })
        .collect();
    TreeData {
        vocab: v,
        max_nodes: n,
        max_depth,
        nodes: vec![n as u32],
        tokens,
        first_child,
        next_sibling,
        draft: draft_rows,
        target,
        temperature: None,
        seed: vec![g.next_u64()],
        offset: vec![g.next_u64() >> 20],
        eps: vec![0.1],
        delta: vec![0.3],
    }
}

/// The tree conformance every GPU backend runs through its host-slice tree path (`verify` is
/// its `verify_tree`): random trees of every shape (duplicated sibling tokens, with and without
/// draft rows, garbage-free probability rows, every third batch as target logits with mixed
/// temperatures 0 and > 0) under every method, and a 64-node tree at V = 32000 (probabilities
/// with and without draft rows, and logits at T = 0.8 with draft rows), each bit-equal to [`verify_tree_batch`] with the same counts added to `v`'s
/// totals; then malformed batches refused with nothing written or counted. Panics on the first
/// difference.
pub fn tree_backend_conformance<V, E>(
    v: &mut V,
    mut verify: impl FnMut(&mut V, Method, Check, &TreeBatch<'_>, &mut TreeOutputs<'_>) -> Result<(), E>,
    seed: u64,
) where
    V: Verifier<K>,
    V::Error: core::fmt::Debug,
    E: core::fmt::Debug,
{
    let mut g = Gen(seed);
    let mut expected = v.totals().expect("totals");
    let mut check = |v: &mut V, m: Method, d: &TreeData, what: &str| {
        let mut want = TreeOut::new(d.requests(), d.max_depth);
        let mut counted = Counters::<K>::ZERO;
        verify_tree_batch(m, Check::Cheap, &d.view(), &mut want.view(), &mut counted)
            .expect("a valid batch");
        let mut got = TreeOut::new(d.requests(), d.max_depth);
        verify(v, m, Check::Cheap, &d.view(), &mut got.view())
            .unwrap_or_else(|e| panic!("{what} {m:?}: {e:?}"));
        assert_eq!(got, want, "{what} {m:?}: outputs");
        expected.add(&counted);
        assert_eq!(
            v.totals().expect("totals"),
            expected,
            "{what} {m:?}: counters"
        );
    };
    for i in 0..12 {
        let d = random_tree_batch(
            &mut g,
            TreeSpec {
                max_requests: 6,
                max_nodes: 16,
                max_depth: 6,
                vocab: 41,
                draft: i % 2 == 1,
                // Every third batch as target logits (temperatures 0 and > 0 mixed).
                logits: i % 3 == 2,
                garbage: false,
            },
        );
        for m in METHODS {
            check(v, m, &d, &format!("random batch {i}"));
        }
    }
    for draft in [false, true] {
        let d = full_tree(&mut g, 64, 7, 32_000, draft);
        for m in METHODS {
            check(
                v,
                m,
                &d,
                &format!("64 nodes, V = 32000, draft rows {draft}"),
            );
        }
    }
    let mut d = full_tree(&mut g, 64, 7, 32_000, true);
    d.target = d.target.iter().map(|&p| (p + 1e-6).ln()).collect();
    d.temperature = Some(vec![0.8]);
    for m in METHODS {
        check(v, m, &d, "64 nodes, V = 32000, logits at T = 0.8");
    }
    let good = random_tree_batch(
        &mut g,
        TreeSpec {
            max_requests: 3,
            max_nodes: 8,
            max_depth: 4,
            vocab: 17,
            draft: false,
            logits: false,
            garbage: false,
        },
    );
    let last = good.requests() - 1;
    let mut bad = Vec::new();
    let mut d = good.clone();
    d.nodes[last] = 0;
    bad.push(("no root", d));
    let mut d = good.clone();
    d.next_sibling[last * d.max_nodes] = 1;
    bad.push(("root sibling", d));
    let mut d = good.clone();
    d.offset.pop();
    bad.push(("offsets", d));
    let mut d = good.clone();
    d.temperature = Some(vec![f32::NAN; d.requests()]);
    bad.push(("NaN temperature", d));
    let before = v.totals().expect("totals");
    for (what, d) in bad {
        let mut got = TreeOut::new(d.requests(), d.max_depth);
        let r = verify(
            v,
            Method::Rejection,
            Check::Cheap,
            &d.view(),
            &mut got.view(),
        );
        assert!(r.is_err(), "{what}: refused");
        assert_eq!(
            got,
            TreeOut::new(d.requests(), d.max_depth),
            "{what}: untouched"
        );
    }
    assert_eq!(
        v.totals().expect("totals"),
        before,
        "refused batches count nothing"
    );
}

/// The tree step path every GPU backend runs (`v` over its driver): a batch staged once and
/// captured as a graph (unless `no_graph(error)` accepts the capture's error: a runtime without
/// graph capture), then 12 steps of changing trees written into the same staging, alternately
/// replayed and launched, with a readback started and polled; no step makes a synchronising call
/// (`syncs` counts them as the backend sees them: its driver's count, or the verifier's), every step's outputs equal the reference's,
/// and the readback's flush ends at the exact sum of the reference's counts. Last, a malformed
/// request on the raw launch raises [`ERR_TREE`](specula_core::gpu::kernels::ERR_TREE), gets
/// sentinel outputs and is not counted, while its batch's other requests are.
pub fn tree_step_path_conformance<D: Driver>(
    v: &mut GpuVerifier<D, K>,
    syncs: impl Fn(&GpuVerifier<D, K>) -> u64,
    no_graph: impl Fn(&GpuError<D::Error>) -> bool,
    seed: u64,
) where
    D::Error: core::fmt::Debug,
{
    let drv = v.driver().clone();
    let mut g = Gen(seed);
    let spec = TreeSpec {
        max_requests: 6,
        max_nodes: 12,
        max_depth: 5,
        vocab: 37,
        draft: true,
        logits: false,
        garbage: false,
    };
    let mut cap = random_tree_batch(&mut g, spec);
    while cap.requests() < spec.max_requests {
        cap = random_tree_batch(&mut g, spec);
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
    .expect("stage");
    let first = staging
        .write::<K>(&drv, v.stream(), Method::Rejection, &cap.view(), ())
        .expect("write");
    // SAFETY: views `Staging::<_, TreeStep>::write` returned; later batches are written by it alone, into
    // the same buffers (the graph borrows them).
    let graph = match unsafe { v.capture_staged(&first) } {
        Ok(graph) => Some(graph),
        Err(e) if no_graph(&e) => {
            println!("SKIPPED tree graph replay: {e:?}");
            None
        }
        Err(e) => panic!("capture: {e:?}"),
    };
    let mut rb = v.readback().expect("readback");
    let mut expected = v.totals().expect("totals");
    for step in 0..12u64 {
        let m = METHODS[step as usize % 3];
        let mut d = random_tree_batch(&mut g, spec);
        d.offset.iter_mut().for_each(|o| *o = o.wrapping_add(step));
        let mut want = TreeOut::new(d.requests(), d.max_depth);
        let mut counted = Counters::<K>::ZERO;
        verify_tree_batch(m, Check::Cheap, &d.view(), &mut want.view(), &mut counted)
            .expect("a valid batch");
        expected.add(&counted);
        let args = staging
            .write::<K>(&drv, v.stream(), m, &d.view(), ())
            .expect("write");
        let before = syncs(v);
        match (&graph, step % 2) {
            (Some(graph), 0) => v.replay(graph).expect("replay"),
            // SAFETY: views `Staging::<_, TreeStep>::write` returned just above.
            _ => unsafe { v.launch_staged(&args) }.expect("launch"),
        }
        if rb.in_flight() < rb.max_in_flight() {
            rb.start().expect("start");
        }
        if let core::task::Poll::Ready(r) = rb.poll() {
            r.expect("readback");
        }
        assert_eq!(syncs(v), before, "step {step}: the step path synchronised");
        let mut got = TreeOut::new(d.requests(), d.max_depth);
        let flags = v
            .download_outputs(&args, &mut got.view())
            .expect("download");
        assert_eq!(flags, 0, "step {step}: kernel error flags");
        assert_eq!(got, want, "step {step} ({m:?})");
    }
    drop(graph);
    // A malformed last request on the raw launch: flagged, skipped, not counted.
    let mut d = cap.clone();
    let last = d.requests() - 1;
    d.nodes[last] = 0;
    let mut good = d.clone();
    good.nodes.truncate(last);
    let slots = last * d.max_nodes;
    good.tokens.truncate(slots);
    good.first_child.truncate(slots);
    good.next_sibling.truncate(slots);
    good.target.truncate(slots * d.vocab);
    if let Some(x) = good.draft.as_mut() {
        x.truncate(slots * d.vocab);
    }
    good.seed.truncate(last);
    good.offset.truncate(last);
    good.eps.truncate(last);
    good.delta.truncate(last);
    let mut want = TreeOut::new(last, d.max_depth);
    let mut counted = Counters::<K>::ZERO;
    verify_tree_batch(
        Method::Rejection,
        Check::Cheap,
        &good.view(),
        &mut want.view(),
        &mut counted,
    )
    .expect("the good requests");
    expected.add(&counted);
    let args = staging
        .write::<K>(&drv, v.stream(), Method::Rejection, &d.view(), ())
        .expect("write");
    // SAFETY: views `Staging::<_, TreeStep>::write` returned just above (the trees are the kernel's to
    // check).
    unsafe { v.launch_staged(&args) }.expect("launch");
    let mut got = TreeOut::new(d.requests(), d.max_depth);
    let flags = v
        .download_outputs(&args, &mut got.view())
        .expect("download");
    let w = d.max_depth + 1;
    assert_eq!(
        flags,
        specula_core::gpu::kernels::ERR_TREE,
        "the malformed tree"
    );
    assert_eq!(got.accepted[last], SENTINEL);
    assert!(got.path[last * w..].iter().all(|&x| x == SENTINEL));
    assert!(got.tokens[last * w..].iter().all(|&x| x == SENTINEL));
    assert_eq!(got.accepted[..last], want.accepted[..]);
    assert_eq!(got.path[..last * w], want.path[..]);
    assert_eq!(got.tokens[..last * w], want.tokens[..]);
    assert_eq!(rb.flush().expect("flush"), expected, "the exact totals");
    assert_eq!(rb.error_flags(), specula_core::gpu::kernels::ERR_TREE);
    let _ = out.view();
}

/// `host` with its target (and, if it has them, draft) rows' values replaced, same strides.
pub fn with_values<'a>(
    host: TreeBatch<'a>,
    target: Values<'a>,
    draft: Option<Values<'a>>,
) -> TreeBatch<'a> {
    let t = host.target.with_rows(Rows {
        values: target,
        ..host.target.rows()
    });
    let mut b = host.with_target(t);
    if let (Some(d), Some(values)) = (host.draft, draft) {
        b = b.with_draft(Rows { values, ..d });
    }
    b
}
