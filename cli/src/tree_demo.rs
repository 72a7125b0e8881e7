//! `specula demo --tree WIDTHxDEPTH`: token-tree drafting on the demo's n-gram models, against
//! a chain of the same node budget, both verified on the CPU backend.
//!
//! The tree is the full `WIDTH`-ary tree of depth `DEPTH` on the n-gram draft model
//! (`WIDTH + WIDTH² + … + WIDTH^DEPTH` draft nodes): for greedy, each node's children are its
//! top-`WIDTH` continuations; for rejection sampling, `WIDTH` continuations drawn independently
//! from the draft model, with its probabilities, verified by SpecInfer's multi-step speculative
//! sampling (lossless). The chain drafts `k` = the tree's node count the demo's way (sampled,
//! with draft probabilities, for rejection sampling; the argmax for greedy). Both runs start
//! from the same prompts and count in their own verifier's counters, so the accepted length per
//! step is read from the same counters the exporters read.

use crate::ngram::{NgramModel, SplitMix64, Vocab, argmax, sample};
use crate::step::{DemoError, MAX_K, Models, Request, Step};
use specula::backend::Backend;
use specula::cpu::CpuVerifier;
use specula::specula_core::Counters;
use specula::specula_core::verify::tree::{
    PathOut, Tree, TreeBatch, TreeDims, TreeOutputs, links_from_parents,
};
use specula::specula_core::verify::{
    AcceptedOut, Batch, Check, Dims, Drafts, Method, Outputs, Streams, TokensOut, Verifier,
};

/// The counters' maximum depth (and the chain's maximum length) of the comparison.
pub const TREE_K: usize = 64;

/// A tree shape `WIDTHxDEPTH`: the full `WIDTH`-ary tree of depth `DEPTH`, at most [`TREE_K`]
/// draft nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TreeShape {
    /// Nodes kept per depth (and continuations tried per node).
    pub width: usize,
    /// Depth of the tree.
    pub depth: usize,
}

impl TreeShape {
    /// Draft nodes (root excluded): `width + width² + … + width^depth`, saturating at
    /// `usize::MAX`. Constant time in `depth` (a user-supplied number): width 0 and 1 are
    /// closed forms, and from width 2 the sum saturates within 64 levels.
    #[must_use]
    pub fn nodes(&self) -> usize {
        match self.width {
            0 => 0,
            1 => self.depth,
            w => {
                let (mut level, mut total) = (1usize, 0usize);
                for _ in 0..self.depth {
                    level = level.saturating_mul(w);
                    total = total.saturating_add(level);
                    if total == usize::MAX {
                        break;
                    }
                }
                total
            }
        }
    }

    /// True if this shape can be drafted: width and depth at least 1, at most [`TREE_K`]
    /// draft nodes.
    #[must_use]
    pub fn is_valid(&self) -> bool {
        self.width >= 1 && self.depth >= 1 && self.nodes() <= TREE_K
    }
}

impl std::str::FromStr for TreeShape {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (w, d) = s
            .split_once(['x', 'X'])
            .ok_or_else(|| format!("tree shape {s:?} is not WIDTHxDEPTH"))?;
        let parse = |x: &str| x.trim().parse::<usize>().map_err(|e| format!("{x:?}: {e}"));
        let (width, depth) = (parse(w)?, parse(d)?);
        let shape = Self { width, depth };
        if !shape.is_valid() {
            return Err(format!(
                "tree shape {width}x{depth}: WIDTH and DEPTH must be ≥ 1 and the tree at most \
                 {TREE_K} draft nodes (WIDTH + WIDTH² + … + WIDTH^DEPTH)"
            ));
        }
        Ok(shape)
    }
}

/// What [`compare`] measured.
#[derive(Clone, Debug)]
pub struct TreeReport {
    /// The tree shape.
    pub shape: TreeShape,
    /// The tree run's counters (a tree counted as a chain of its depth).
    pub tree: Counters<TREE_K>,
    /// The chain run's counters (`k` = the tree's draft nodes).
    pub chain: Counters<TREE_K>,
}

impl TreeReport {
    /// Mean accepted length per step of the tree run.
    #[must_use]
    pub fn tree_mean_accepted(&self) -> f64 {
        self.tree.accepted_tokens as f64 / self.tree.drafts.max(1) as f64
    }

    /// Mean accepted length per step of the chain run.
    #[must_use]
    pub fn chain_mean_accepted(&self) -> f64 {
        self.chain.accepted_tokens as f64 / self.chain.drafts.max(1) as f64
    }
}

impl std::fmt::Display for TreeReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (w, d) = (self.shape.width, self.shape.depth);
        writeln!(
            f,
            "tree {w}x{d} ({} draft nodes): mean accepted length {:.3} per step ({} steps)",
            self.shape.nodes(),
            self.tree_mean_accepted(),
            self.tree.drafts
        )?;
        writeln!(
            f,
            "chain k={} (same node budget): mean accepted length {:.3} per step ({} steps)",
            self.shape.nodes(),
            self.chain_mean_accepted(),
            self.chain.drafts
        )?;
        let per_depth: Vec<String> = (0..d)
            .map(|i| {
                let p = self.tree.accepted_per_position[i] as f64
                    / self.tree.drafted_per_position[i].max(1) as f64;
                format!("{p:.3}")
            })
            .collect();
        writeln!(f, "tree acceptance per depth: {}", per_depth.join(","))?;
        write!(
            f,
            "tokens per target pass: tree {:.3}, chain {:.3}",
            self.tree_mean_accepted() + 1.0,
            self.chain_mean_accepted() + 1.0
        )
    }
}

/// The settings of [`compare`].
#[derive(Clone, Debug)]
pub struct TreeDemoConfig {
    /// The tree shape; the chain drafts as many tokens as the tree has draft nodes.
    pub shape: TreeShape,
    /// [`Method::Rejection`] or [`Method::Greedy`] (typical acceptance is a lossy rule and not
    /// compared here).
    pub method: Method,
    /// Seed of the prompts, the chain's draft sampler and the verifiers' streams.
    pub seed: u64,
    /// Requests per step.
    pub batch: usize,
    /// Steps per run.
    pub steps: usize,
    /// Target model order.
    pub target_order: usize,
    /// Draft model order.
    pub draft_order: usize,
    /// CPU threads (0 = all).
    pub threads: usize,
}

/// The most steps of [`compare`], per run.
pub const MAX_STEPS: usize = 1_000_000;

/// The most verified tree nodes (`steps × batch × (draft nodes + 1)`) one [`compare`] run may
/// cost: about a minute of the CPU backend on one core per run at the largest.
pub const MAX_NODE_STEPS: u64 = 1 << 28;

impl TreeDemoConfig {
    /// Checks every setting before any work (the corpus is not read, nothing is trained):
    /// a valid shape, rejection sampling or greedy, batch 1..=4096, steps 1..=[`MAX_STEPS`],
    /// at most [`MAX_NODE_STEPS`] nodes verified per run, model orders
    /// 1..=[`MAX_ORDER`](crate::ngram::MAX_ORDER).
    ///
    /// # Errors
    /// [`DemoError::Config`], or [`DemoError::Corpus`] for an order out of range.
    pub fn check(&self) -> Result<(), DemoError> {
        if !self.shape.is_valid() {
            return Err(DemoError::Config(format!(
                "tree shape {}x{}: WIDTH and DEPTH must be ≥ 1 and the tree at most {TREE_K} \
                 draft nodes",
                self.shape.width, self.shape.depth
            )));
        }
        if !matches!(self.method, Method::Rejection | Method::Greedy) {
            return Err(DemoError::Config(
                "--tree compares rejection sampling or greedy".into(),
            ));
        }
        if self.batch == 0 || self.batch > 4096 || self.steps == 0 || self.steps > MAX_STEPS {
            return Err(DemoError::Config(format!(
                "batch must be 1..=4096 and steps 1..={MAX_STEPS}"
            )));
        }
        // Both factors are bounded above: no overflow in u64.
        let work = (self.steps as u64) * (self.batch as u64) * (self.shape.nodes() as u64 + 1);
        if work > MAX_NODE_STEPS {
            return Err(DemoError::Config(format!(
                "--steps {} × --batch {} × {} tree nodes is {work} verified nodes per run; at \
                 most {MAX_NODE_STEPS}",
                self.steps,
                self.batch,
                self.shape.nodes() + 1
            )));
        }
        crate::step::check_order(self.target_order)?;
        crate::step::check_order(self.draft_order)?;
        Ok(())
    }
}

/// The top `n` ids of `row` (ties to the lowest id).
fn top(row: &[f32], n: usize) -> Vec<u32> {
    let mut ids: Vec<u32> = (0..row.len() as u32).collect();
    ids.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b)));
    ids.truncate(n);
    ids
}

/// One request's full tree: (parents, tokens, token path of each node); with `rng`, each
/// node's children are drawn independently from the draft row at the node, written into
/// `draft_rows` (one row per node, the root's unused), else they are its top `width` ids.
fn full_tree(
    draft: &NgramModel,
    ctx: &[u32],
    shape: TreeShape,
    mut rng: Option<&mut SplitMix64>,
    draft_rows: &mut [f32],
) -> (Vec<i32>, Vec<u32>, Vec<Vec<u32>>) {
    let v = draft.vocab();
    let mut parents = vec![-1i32];
    let mut tokens = vec![0u32];
    let mut paths: Vec<Vec<u32>> = vec![vec![]];
    let mut level = vec![0usize];
    let mut row = vec![0f32; v];
    let mut hist = Vec::new();
    for _ in 0..shape.depth {
        let mut next = Vec::new();
        for &u in &level {
            hist.clear();
            hist.extend_from_slice(ctx);
            hist.extend_from_slice(&paths[u]);
            draft.probs(&hist, &mut row);
            let kids = match rng.as_deref_mut() {
                Some(g) => (0..shape.width).map(|_| sample(&row, g)).collect(),
                None => top(&row, shape.width),
            };
            for t in kids {
                let i = parents.len();
                draft_rows[i * v..][..v].copy_from_slice(&row);
                let mut p = paths[u].clone();
                p.push(t);
                next.push(i);
                parents.push(u as i32);
                tokens.push(t);
                paths.push(p);
            }
        }
        level = next;
    }
    (parents, tokens, paths)
}

/// The live demo's tree drafter (`demo::run_tree`): per request and step, the full
/// tree of `shape` on the draft model (sampled children with their draft rows for rejection
/// sampling, the top-`WIDTH` for greedy), verified by the backend's tree verifier, which
/// counts it (`Counters::record_tree`) where the demo's collector reads.
pub(crate) struct TreeStep {
    verifier: Backend<MAX_K>,
    shape: TreeShape,
    method: Method,
    vocab: usize,
    seeds: Vec<u64>,
    nodes: Vec<u32>,
    tokens: Vec<u32>,
    first_child: Vec<i32>,
    next_sibling: Vec<i32>,
    target_rows: Vec<f32>,
    draft_rows: Vec<f32>,
    accepted: Vec<u32>,
    path: Vec<u32>,
    emitted: Vec<u32>,
    ctx: Vec<u32>,
    /// The last step's time drafting and scoring its trees (ns).
    drafting_ns: u64,
}

impl TreeStep {
    /// A drafter of `shape` trees for `seeds.len()` requests over a vocabulary of `vocab`.
    pub(crate) fn new(
        verifier: Backend<MAX_K>,
        shape: TreeShape,
        method: Method,
        seeds: Vec<u64>,
        vocab: usize,
    ) -> Self {
        let (b, n, w) = (seeds.len(), shape.nodes() + 1, shape.depth + 1);
        Self {
            verifier,
            shape,
            method,
            vocab,
            seeds,
            nodes: vec![n as u32; b],
            tokens: vec![0; b * n],
            first_child: vec![0; b * n],
            next_sibling: vec![0; b * n],
            target_rows: vec![0.0; b * n * vocab],
            draft_rows: vec![0.0; b * n * vocab],
            accepted: vec![0; b],
            path: vec![0; b * w],
            emitted: vec![0; b * w],
            ctx: Vec::new(),
            drafting_ns: 0,
        }
    }
}

impl Step for TreeStep {
    fn step(
        &mut self,
        models: &Models,
        requests: &[Request],
        offsets: &[u64],
        rng: &mut SplitMix64,
    ) -> Result<(), DemoError> {
        let (n, v, depth) = (self.shape.nodes() + 1, self.vocab, self.shape.depth);
        let sampled = self.method == Method::Rejection;
        let verr = |e: String| DemoError::Verify(e);
        let started = std::time::Instant::now();
        for (r, req) in requests.iter().enumerate() {
            let h = &req.history;
            let tail = &h[h.len().saturating_sub(models.keep)..];
            let (parents, toks, paths) = full_tree(
                &models.draft,
                tail,
                self.shape,
                sampled.then_some(&mut *rng),
                &mut self.draft_rows[r * n * v..][..n * v],
            );
            links_from_parents(
                &parents,
                &mut self.first_child[r * n..][..n],
                &mut self.next_sibling[r * n..][..n],
            )
            .map_err(|e| verr(e.to_string()))?;
            self.tokens[r * n..][..n].copy_from_slice(&toks);
            for (i, p) in paths.iter().enumerate() {
                self.ctx.clear();
                self.ctx.extend_from_slice(tail);
                self.ctx.extend_from_slice(p);
                models
                    .target
                    .probs(&self.ctx, &mut self.target_rows[(r * n + i) * v..][..v]);
            }
        }
        self.drafting_ns = specula::clock::duration_ns(started.elapsed());
        let mut batch = TreeBatch::new(
            TreeDims {
                vocab: v,
                max_nodes: n,
                max_depth: depth,
            },
            Tree {
                nodes: &self.nodes,
                tokens: &self.tokens,
                first_child: &self.first_child,
                next_sibling: &self.next_sibling,
            },
            &self.target_rows,
            Streams {
                seed: &self.seeds,
                offset: offsets,
            },
        );
        if sampled {
            batch = batch.with_draft_probs(&self.draft_rows);
        }
        let mut out = TreeOutputs::new(
            AcceptedOut(&mut self.accepted),
            PathOut(&mut self.path),
            TokensOut(&mut self.emitted),
        );
        self.verifier
            .verify_tree(self.method, Check::Cheap, &batch, &mut out)
            .map_err(|e| verr(e.to_string()))
    }

    fn emitted(&self, r: usize) -> &[u32] {
        let w = self.shape.depth + 1;
        &self.emitted[r * w..][..=self.accepted[r] as usize]
    }

    fn draft_len(&self) -> usize {
        self.shape.depth
    }

    fn draft_units(&self) -> usize {
        self.shape.nodes()
    }

    fn scaled_ns(&self) -> Option<u64> {
        // Drafting expands every internal node and the target scores every node and the root,
        // one row each: all of it grows with the node count but one target row (the root's).
        let n = self.shape.nodes() as u64;
        Some(self.drafting_ns / (n + 1) * n)
    }
}

/// Runs the tree drafter and the chain drafter from the same prompts for `steps` steps each and
/// reports both runs' counters.
pub fn compare(corpus: &str, cfg: &TreeDemoConfig) -> Result<TreeReport, DemoError> {
    cfg.check()?;
    let vocab = Vocab::from_text(corpus).map_err(DemoError::Corpus)?;
    let ids = vocab.encode(corpus);
    let v = vocab.len();
    let target = NgramModel::train(&ids, v, cfg.target_order).map_err(DemoError::Corpus)?;
    let draft = NgramModel::train(&ids, v, cfg.draft_order).map_err(DemoError::Corpus)?;
    let verifier = |_: ()| {
        CpuVerifier::<TREE_K>::new(cfg.threads).map_err(|e| DemoError::Config(e.to_string()))
    };
    let (tree_v, chain_v) = (verifier(())?, verifier(())?);
    let mut rng = SplitMix64::new(cfg.seed);
    let prompt_len = 16.min(ids.len());
    let prompts: Vec<Vec<u32>> = (0..cfg.batch)
        .map(|_| {
            let at = rng.below(ids.len() - prompt_len + 1);
            ids[at..at + prompt_len].to_vec()
        })
        .collect();
    let keep = cfg.target_order.max(cfg.draft_order);
    let b = cfg.batch;
    let seeds: Vec<u64> = (0..b as u64)
        .map(|i| cfg.seed ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .collect();
    let n = cfg.shape.nodes() + 1;
    let depth = cfg.shape.depth;
    let verr = |e: String| DemoError::Verify(e);

    // The tree run.
    let mut hist = prompts.clone();
    let mut offsets = vec![0u64; b];
    let mut tokens = vec![0u32; b * n];
    let (mut fc, mut ns) = (vec![0i32; b * n], vec![0i32; b * n]);
    let mut target_rows = vec![0f32; b * n * v];
    let mut tree_draft = vec![0f32; b * n * v];
    let sampled = cfg.method == Method::Rejection;
    let (mut acc, mut path, mut emitted) = (
        vec![0u32; b],
        vec![0u32; b * (depth + 1)],
        vec![0u32; b * (depth + 1)],
    );
    let mut ctx = Vec::new();
    for _ in 0..cfg.steps {
        for r in 0..b {
            let h = &hist[r];
            let tail = &h[h.len().saturating_sub(keep)..];
            let (parents, toks, paths) = full_tree(
                &draft,
                tail,
                cfg.shape,
                sampled.then_some(&mut rng),
                &mut tree_draft[r * n * v..][..n * v],
            );
            links_from_parents(&parents, &mut fc[r * n..][..n], &mut ns[r * n..][..n])
                .map_err(|e| verr(e.to_string()))?;
            tokens[r * n..][..n].copy_from_slice(&toks);
            for (i, p) in paths.iter().enumerate() {
                ctx.clear();
                ctx.extend_from_slice(tail);
                ctx.extend_from_slice(p);
                target.probs(&ctx, &mut target_rows[(r * n + i) * v..][..v]);
            }
        }
        let nodes = vec![n as u32; b];
        let mut batch = TreeBatch::new(
            TreeDims {
                vocab: v,
                max_nodes: n,
                max_depth: depth,
            },
            Tree {
                nodes: &nodes,
                tokens: &tokens,
                first_child: &fc,
                next_sibling: &ns,
            },
            &target_rows,
            Streams {
                seed: &seeds,
                offset: &offsets,
            },
        );
        if sampled {
            batch = batch.with_draft_probs(&tree_draft);
        }
        let mut out = TreeOutputs::new(
            AcceptedOut(&mut acc),
            PathOut(&mut path),
            TokensOut(&mut emitted),
        );
        tree_v
            .verify_tree(cfg.method, Check::Cheap, &batch, &mut out)
            .map_err(|e| verr(e.to_string()))?;
        for r in 0..b {
            let a = acc[r] as usize;
            hist[r].extend_from_slice(&emitted[r * (depth + 1)..][..=a]);
        }
        specula::specula_core::verify::advance_offsets(&mut offsets);
    }

    // The chain run, k = the tree's node budget.
    let k = cfg.shape.nodes();
    let mut hist = prompts;
    let mut offsets = vec![0u64; b];
    let ks = vec![k as u32; b];
    let mut draft_ids = vec![0u32; b * k];
    let mut draft_probs = vec![0f32; b * k * v];
    let mut target_probs = vec![0f32; b * (k + 1) * v];
    let (mut acc, mut out_tokens) = (vec![0u32; b], vec![0u32; b * (k + 1)]);
    for _ in 0..cfg.steps {
        for r in 0..b {
            let h = &hist[r];
            ctx.clear();
            ctx.extend_from_slice(&h[h.len().saturating_sub(keep)..]);
            for j in 0..k {
                let row = &mut draft_probs[(r * k + j) * v..][..v];
                draft.probs(&ctx, row);
                let t = if cfg.method == Method::Greedy {
                    argmax(row)
                } else {
                    sample(row, &mut rng)
                };
                draft_ids[r * k + j] = t;
                ctx.push(t);
            }
            ctx.truncate(ctx.len() - k);
            for j in 0..=k {
                target.probs(&ctx, &mut target_probs[(r * (k + 1) + j) * v..][..v]);
                if j < k {
                    ctx.push(draft_ids[r * k + j]);
                }
            }
        }
        let mut batch = Batch::dense(
            Dims { vocab: v, k_max: k },
            Drafts {
                k: &ks,
                ids: &draft_ids,
            },
            &target_probs,
            Streams {
                seed: &seeds,
                offset: &offsets,
            },
        );
        if cfg.method == Method::Rejection {
            batch = batch.with_draft_probs(&draft_probs);
        }
        let mut out = Outputs::new(
            specula::specula_core::verify::AcceptedOut(&mut acc),
            specula::specula_core::verify::TokensOut(&mut out_tokens),
        );
        chain_v
            .verify(cfg.method, Check::Cheap, &batch, &mut out)
            .map_err(|e| verr(format!("{e:?}")))?;
        for r in 0..b {
            let a = acc[r] as usize;
            hist[r].extend_from_slice(&out_tokens[r * (k + 1)..][..=a]);
        }
        specula::specula_core::verify::advance_offsets(&mut offsets);
    }
    Ok(TreeReport {
        shape: cfg.shape,
        tree: tree_v.totals(),
        chain: chain_v.totals(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_parse_and_bad_ones_are_refused() {
        assert_eq!(
            "4x2".parse::<TreeShape>(),
            Ok(TreeShape { width: 4, depth: 2 })
        );
        assert_eq!("2x5".parse::<TreeShape>().map(|s| s.nodes()), Ok(62));
        for bad in ["4", "0x3", "3x0", "2x6", "65x1", "ax2", ""] {
            assert!(bad.parse::<TreeShape>().is_err(), "{bad}");
        }
    }

    #[test]
    fn node_counts_take_constant_time_whatever_the_depth() {
        let shape = |width, depth| TreeShape { width, depth };
        // The closed forms and the geometric sum.
        assert_eq!(shape(0, 7).nodes(), 0);
        assert_eq!(shape(1, 7).nodes(), 7);
        assert_eq!(shape(3, 3).nodes(), 3 + 9 + 27);
        // Depths that looped for minutes (issue 26): saturated at once.
        let t = std::time::Instant::now();
        assert_eq!(shape(1, usize::MAX).nodes(), usize::MAX);
        assert_eq!(shape(2, usize::MAX).nodes(), usize::MAX);
        assert_eq!(shape(usize::MAX, usize::MAX).nodes(), usize::MAX);
        assert_eq!(shape(2, 2_000_000_000).nodes(), usize::MAX);
        assert!(
            t.elapsed() < std::time::Duration::from_secs(1),
            "{:?}",
            t.elapsed()
        );
        for (w, d) in [(1, 2_000_000_000), (2, usize::MAX), (0, 1), (1, 0)] {
            assert!(!shape(w, d).is_valid(), "{w}x{d}");
        }
        assert!(shape(1, 64).is_valid() && !shape(1, 65).is_valid());
    }

    #[test]
    fn both_runs_count_every_step_through_the_counters() {
        for method in [Method::Greedy, Method::Rejection] {
            let cfg = TreeDemoConfig {
                shape: TreeShape { width: 3, depth: 2 },
                method,
                seed: 1,
                batch: 4,
                steps: 40,
                target_order: 3,
                draft_order: 2,
                threads: 1,
            };
            let r = compare(crate::ngram::CORPUS, &cfg).unwrap();
            assert_eq!(r.tree.drafts, 160);
            assert_eq!(r.chain.drafts, 160);
            assert_eq!(r.chain.draft_tokens, 160 * 12);
            assert_eq!(r.tree.draft_tokens, 160 * 2, "a tree counts its depth");
            // A path is at most the depth; per-depth counts never grow with depth.
            assert!(
                r.tree_mean_accepted() <= 2.0 && r.chain_mean_accepted() <= 12.0,
                "{r}"
            );
            assert!(r.tree.accepted_per_position[1] <= r.tree.accepted_per_position[0]);
            assert_eq!(r.tree.accepted_per_position[2..], [0; TREE_K - 2]);
            assert_eq!(
                r.tree.emitted_tokens,
                r.tree.accepted_tokens + r.tree.drafts,
                "one emitted token past every accepted path"
            );
        }
    }
}
