//! Owned token-tree batches and their random generator, for the tree conformance and
//! statistical tests.

use crate::conformance::Gen;
use specula_core::verify::tree::{
    NO_NODE, Tree, TreeBatch, TreeDims, TreeOutputs, links_from_parents,
};
use specula_core::verify::{Logits, SENTINEL, Streams};

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
        TreeOutputs {
            accepted: &mut self.accepted,
            path: &mut self.path,
            tokens: &mut self.tokens,
        }
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
