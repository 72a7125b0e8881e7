//! The verification conformance suite, written once and run against every [`Verifier`] backend:
//! the core [`Reference`](specula_core::verify::Reference), the CPU backend, GPU backends and the
//! host-executed kernel.
//!
//! ```no_run
//! use specula_tests::conformance;
//! use specula_core::verify::Reference;
//! conformance::run_all(Reference::<8>::new);
//! ```
//!
//! Every case takes `make`, a constructor of fresh verifiers, so a case can check counts from
//! zero. The expected outputs come either from first principles (exact cases, one-hot targets,
//! error cases) or from the core reference [`verify_batch`] compared bit for bit. A backend that
//! cannot pass a case yet should call the others and mark that one as an expected failure with
//! the reason, not drop it.

use specula_core::Counters;
use specula_core::verify::{
    Batch, Check, Dims, Drafts, Method, Outputs, Param, SENTINEL, Streams, Strides, Tensor,
    Verifier, VerifyError, validate, validate_with, verify_batch,
};
use specula_core::verify::{
    Draft, Feature, Half, HalfLogits, Logits, NO_DRAFT_ROWS, RaggedDrafts, Rows,
};

/// The counters' maximum draft length the suite is written for.
pub const K: usize = 8;

/// All three methods.
pub const METHODS: [Method; 3] = [Method::Rejection, Method::Greedy, Method::Typical];

/// A small seeded generator (SplitMix64): the suite's inputs depend only on its seeds.
#[derive(Clone, Debug)]
pub struct Gen(pub u64);

impl Gen {
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (`n > 0`; the tiny modulo bias does not matter here).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
    /// True with probability `num / den`.
    pub fn chance(&mut self, num: usize, den: usize) -> bool {
        self.below(den) < num
    }
}

/// An owned batch (inputs) from which [`BatchData::view`] makes a [`Batch`].
#[derive(Clone, Debug, PartialEq)]
#[allow(missing_docs)] // the fields are those of `Batch`
pub struct BatchData {
    pub vocab: usize,
    pub k_max: usize,
    pub k: Vec<u32>,
    pub draft_ids: Vec<u32>,
    pub draft_probs: Option<Vec<f32>>,
    pub draft_stride: usize,
    pub target_probs: Vec<f32>,
    pub target_stride: usize,
    pub seed: Vec<u64>,
    pub offset: Vec<u64>,
    pub eps: Option<Vec<f32>>,
    pub delta: Option<Vec<f32>>,
}

/// Owned output buffers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutData {
    /// `accepted`.
    pub accepted: Vec<u32>,
    /// `tokens`.
    pub tokens: Vec<u32>,
}

impl OutData {
    /// Buffers for `b` requests of `k_max` slots, filled with a marker that no verifier writes
    /// (so untouched outputs are visible).
    pub fn new(b: usize, k_max: usize) -> Self {
        Self {
            accepted: vec![0xDEAD_BEEF; b],
            tokens: vec![0xDEAD_BEEF; b * (k_max + 1)],
        }
    }
    /// The view.
    pub fn view(&mut self) -> Outputs<'_> {
        Outputs::new(
            specula_core::verify::AcceptedOut(&mut self.accepted),
            specula_core::verify::TokensOut(&mut self.tokens),
        )
    }
}

impl BatchData {
    /// The borrowed view.
    pub fn view(&self) -> Batch<'_> {
        let mut b = Batch::dense(
            Dims {
                vocab: self.vocab,
                k_max: self.k_max,
            },
            Drafts {
                k: &self.k,
                ids: &self.draft_ids,
            },
            &self.target_probs,
            Streams {
                seed: &self.seed,
                offset: &self.offset,
            },
        )
        .with_strides(Strides {
            draft: self.draft_stride,
            target: self.target_stride,
        });
        b.draft = self.draft_probs.as_deref().map(|d| Draft {
            rows: Rows::f32(d, self.draft_stride),
            first_row: None,
        });
        b.eps = self.eps.as_deref();
        b.delta = self.delta.as_deref();
        b
    }

    /// Number of requests.
    pub fn requests(&self) -> usize {
        self.k.len()
    }

    /// An empty batch (zero requests) with this vocabulary and layout; fill it with
    /// [`push_from`](Self::push_from).
    pub fn empty_like(&self) -> Self {
        Self {
            k: vec![],
            draft_ids: vec![],
            draft_probs: self.draft_probs.as_ref().map(|_| vec![]),
            target_probs: vec![],
            seed: vec![],
            offset: vec![],
            eps: self.eps.as_ref().map(|_| vec![]),
            delta: self.delta.as_ref().map(|_| vec![]),
            ..self.clone()
        }
    }

    /// Appends request `b` of `src` (same vocabulary and layout).
    pub fn push_from(&mut self, src: &Self, b: usize) {
        let km = self.k_max;
        self.k.push(src.k[b]);
        self.draft_ids
            .extend_from_slice(&src.draft_ids[b * km..(b + 1) * km]);
        if let (Some(d), Some(s)) = (&mut self.draft_probs, &src.draft_probs) {
            let n = km * self.draft_stride;
            d.extend_from_slice(&s[b * n..(b + 1) * n]);
        }
        let n = (km + 1) * self.target_stride;
        self.target_probs
            .extend_from_slice(&src.target_probs[b * n..(b + 1) * n]);
        self.seed.push(src.seed[b]);
        self.offset.push(src.offset[b]);
        if let (Some(d), Some(s)) = (&mut self.eps, &src.eps) {
            d.push(s[b]);
        }
        if let (Some(d), Some(s)) = (&mut self.delta, &src.delta) {
            d.push(s[b]);
        }
    }
}

/// Shape of the random rows.
#[derive(Clone, Copy, Debug)]
enum Shape {
    Dense,
    Sparse,
    Peaked,
    OneHot,
    Flat,
}

fn random_row(g: &mut Gen, row: &mut [f32], shape: Shape) {
    let v = row.len();
    match shape {
        Shape::Dense => row.iter_mut().for_each(|p| {
            let u = g.unit();
            *p = u * u * u;
        }),
        Shape::Sparse => row.iter_mut().for_each(|p| {
            *p = if g.chance(1, 4) { g.unit() } else { 0.0 };
        }),
        Shape::Peaked => {
            row.iter_mut().for_each(|p| *p = g.unit() * 0.01);
            row[g.below(v)] = 1.0;
        }
        Shape::OneHot => {
            row.fill(0.0);
            row[g.below(v)] = 1.0;
        }
        Shape::Flat => row.fill(1.0),
    }
    let s: f32 = row.iter().sum();
    if s > 0.0 {
        row.iter_mut().for_each(|p| *p /= s);
    } else {
        row.fill(0.0);
        row[g.below(v)] = 1.0;
    }
}

fn shape(g: &mut Gen) -> Shape {
    [
        Shape::Dense,
        Shape::Sparse,
        Shape::Peaked,
        Shape::OneHot,
        Shape::Flat,
    ][g.below(5)]
}

/// Samples an id from a normalised `row` with the test's own generator (inverse CDF).
pub fn sample(g: &mut Gen, row: &[f32]) -> u32 {
    let u = g.unit();
    let mut acc = 0.0f32;
    for (i, &p) in row.iter().enumerate() {
        acc += p;
        if u < acc {
            return i as u32;
        }
    }
    // Rounding left u above the last partial sum: take the last nonzero entry.
    row.iter().rposition(|&p| p > 0.0).unwrap_or(0) as u32
}

/// Knobs of [`random_batch`].
#[derive(Clone, Copy, Debug)]
pub struct RandomSpec {
    /// Requests: `1..=max_requests`.
    pub max_requests: usize,
    /// Vocabulary: `1..=max_vocab`.
    pub max_vocab: usize,
    /// Inject NaN / ±∞ / negative / subnormal values into some rows (cheap check only).
    pub garbage: bool,
}

impl Default for RandomSpec {
    fn default() -> Self {
        Self {
            max_requests: 6,
            max_vocab: 40,
            garbage: true,
        }
    }
}

/// A random valid batch: random sizes, strides with padding, `k[b] ≤ k_max ≤ K`, dense, sparse,
/// peaked, one-hot and flat (tied) rows, drafts near the target (so tokens get accepted) or
/// independent, with or without draft probabilities and typical parameters. The second value
/// says whether the values are clean enough for [`Check::STRICT`].
pub fn random_batch(g: &mut Gen, spec: RandomSpec) -> (BatchData, bool) {
    let b = 1 + g.below(spec.max_requests);
    let vocab = 1 + g.below(spec.max_vocab);
    let k_max = 1 + g.below(K);
    let pad = |g: &mut Gen| if g.chance(1, 2) { 0 } else { g.below(5) };
    let draft_stride = vocab + pad(g);
    let target_stride = vocab + pad(g);
    let with_draft = g.chance(2, 3);
    let mut d = BatchData {
        vocab,
        k_max,
        k: (0..b).map(|_| 1 + g.below(k_max) as u32).collect(),
        draft_ids: vec![0; b * k_max],
        draft_probs: with_draft.then(|| vec![0.0; b * k_max * draft_stride]),
        draft_stride,
        target_probs: vec![0.0; b * (k_max + 1) * target_stride],
        target_stride,
        seed: (0..b).map(|_| g.next_u64()).collect(),
        offset: (0..b)
            .map(|_| {
                if g.chance(1, 2) {
                    g.below(100) as u64
                } else {
                    g.next_u64()
                }
            })
            .collect(),
        eps: g
            .chance(1, 2)
            .then(|| (0..b).map(|_| g.unit() * 0.3).collect()),
        delta: g.chance(1, 2).then(|| (0..b).map(|_| g.unit()).collect()),
    };
    let mut clean = true;
    for r in 0..b {
        for j in 0..=k_max {
            let t0 = (r * (k_max + 1) + j) * target_stride;
            let sh = shape(g);
            random_row(g, &mut d.target_probs[t0..t0 + vocab], sh);
            // Padding holds garbage: a backend must never read it.
            for p in &mut d.target_probs[t0 + vocab..t0 + target_stride] {
                *p = f32::NAN;
            }
            if j == k_max {
                continue;
            }
            let target_row: Vec<f32> = d.target_probs[t0..t0 + vocab].to_vec();
            let id = if let Some(dp) = &mut d.draft_probs {
                let d0 = (r * k_max + j) * draft_stride;
                let row = &mut dp[d0..d0 + vocab];
                if g.chance(1, 2) {
                    // Near the target: acceptance is likely.
                    for (p, &t) in row.iter_mut().zip(&target_row) {
                        *p = t + g.unit() * 0.05;
                    }
                    let s: f32 = row.iter().sum();
                    row.iter_mut().for_each(|p| *p /= s);
                } else {
                    let sh = shape(g);
                    random_row(g, row, sh);
                }
                let id = sample(g, row);
                for p in &mut dp[d0 + vocab..d0 + draft_stride] {
                    *p = -7.0;
                }
                id
            } else if g.chance(1, 2) {
                sample(g, &target_row)
            } else {
                g.below(vocab) as u32
            };
            d.draft_ids[r * k_max + j] = id;
        }
        // Slots past k[r] hold ids a backend must ignore (even out of range ones).
        for j in d.k[r] as usize..k_max {
            d.draft_ids[r * k_max + j] = u32::MAX - g.below(3) as u32;
        }
    }
    if spec.garbage && g.chance(1, 4) {
        clean = false;
        let specials = [
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            -0.5,
            -0.0,
            1e-42,
            f32::MAX,
            3.0,
        ];
        for _ in 0..1 + g.below(6) {
            let v = specials[g.below(specials.len())];
            let r = g.below(b);
            let j = g.below(k_max + 1);
            let i = g.below(vocab);
            if g.chance(1, 2) || j == k_max {
                d.target_probs[(r * (k_max + 1) + j) * target_stride + i] = v;
            } else if let Some(dp) = &mut d.draft_probs {
                dp[(r * k_max + j) * draft_stride + i] = v;
            }
        }
    }
    (d, clean)
}

/// A random clean batch of exactly `n` requests with every optional part (draft probabilities,
/// `ε`, `δ`): the largest layout, so every batch [`vary`] draws from it fits the same buffers.
pub fn full_layout_batch(g: &mut Gen, n: usize) -> BatchData {
    let spec = RandomSpec {
        max_requests: n,
        max_vocab: 40,
        garbage: false,
    };
    loop {
        let (d, _) = random_batch(g, spec);
        if d.requests() == n && d.draft_probs.is_some() && d.eps.is_some() && d.delta.is_some() {
            return d;
        }
    }
}

/// A new step drawn from `pool`'s layout: 1 to `pool.requests()` requests picked from it, each
/// with a new seed and offset and a draft length no longer than the pool request's (so every
/// draft id stays valid). What a runtime replaying one captured launch feeds it step by step.
pub fn vary(g: &mut Gen, pool: &BatchData) -> BatchData {
    let n = 1 + g.below(pool.requests());
    let mut d = pool.empty_like();
    for _ in 0..n {
        d.push_from(pool, g.below(pool.requests()));
    }
    for b in 0..n {
        d.seed[b] = g.next_u64();
        d.offset[b] = g.next_u64() >> g.below(64);
        d.k[b] = 1 + g.below(d.k[b] as usize) as u32;
    }
    d
}

/// What the reference gives: outputs and the counters of this batch alone.
pub fn reference(
    method: Method,
    check: Check,
    d: &BatchData,
) -> Result<(OutData, Counters<K>), VerifyError> {
    let mut out = OutData::new(d.requests(), d.k_max);
    let mut c = Counters::ZERO;
    verify_batch(method, check, &d.view(), &mut out.view(), &mut c)?;
    Ok((out, c))
}

/// Runs `v` on `d` and returns its outputs and how much its totals grew.
pub fn run<V: Verifier<K>>(
    v: &mut V,
    method: Method,
    check: Check,
    d: &BatchData,
) -> Result<(OutData, Counters<K>), V::Error> {
    let before = v.totals()?;
    let mut out = OutData::new(d.requests(), d.k_max);
    v.verify(method, check, &d.view(), &mut out.view())?;
    let after = v.totals()?;
    Ok((out, after.delta_since(&before)))
}

/// Asserts `v` gives the reference's outputs, counts and errors for `d`.
pub fn assert_matches_reference<V: Verifier<K>>(
    v: &mut V,
    method: Method,
    check: Check,
    d: &BatchData,
    what: &str,
) {
    // What the backend supports decides which error a batch gets; supported, the reference's.
    let want = {
        let mut o = OutData::new(d.requests(), d.k_max);
        match validate_with::<K>(v.support(), method, check, &d.view(), &o.view()) {
            Err(e) => Err(e),
            Ok(()) => reference(method, check, d),
        }
    };
    let got = run(v, method, check, d);
    match (want, got) {
        (Ok(w), Ok(g)) => {
            assert_eq!(
                g.0, w.0,
                "{what}: outputs differ from the reference ({method:?})"
            );
            assert_eq!(
                g.1, w.1,
                "{what}: counts differ from the reference ({method:?})"
            );
        }
        (Err(w), Err(g)) => assert_eq!(g, V::Error::from(w), "{what}: error differs"),
        (w, g) => panic!("{what}: reference gave {w:?}, backend gave {g:?}"),
    }
}

/// Bit-for-bit comparison with the core reference on `batches` random batches (cycling the
/// three methods, cheap and strict checks), all through one verifier.
pub fn matches_reference_on_random_batches<V: Verifier<K>>(
    mut make: impl FnMut() -> V,
    seed: u64,
    batches: usize,
) {
    let mut g = Gen(seed);
    let mut v = make();
    let mut expected_total = Counters::<K>::ZERO;
    for i in 0..batches {
        let (d, clean) = random_batch(&mut g, RandomSpec::default());
        let method = METHODS[i % 3];
        let check = if clean && g.chance(1, 3) {
            Check::STRICT
        } else {
            Check::Cheap
        };
        let (w, c) = reference(method, check, &d)
            .unwrap_or_else(|e| panic!("batch {i}: generator made an invalid batch: {e}"));
        let (got, gc) =
            run(&mut v, method, check, &d).unwrap_or_else(|e| panic!("batch {i}: {e:?}"));
        assert_eq!(
            got, w,
            "batch {i} ({method:?}, {check:?}): outputs differ\n{d:?}"
        );
        assert_eq!(gc, c, "batch {i}: counts differ");
        expected_total.add(&c);
    }
    assert_eq!(v.totals().unwrap(), expected_total, "cumulative totals");
}

/// Checks the outputs are well formed: accepted ≤ k, accepted slots hold the draft, the emitted
/// token is < V, then sentinels; and the counts equal `Counters::record` of each request.
pub fn assert_well_formed(d: &BatchData, out: &OutData, counted: &Counters<K>) {
    let w = d.k_max + 1;
    let mut c = Counters::<K>::ZERO;
    for b in 0..d.requests() {
        let (k, a) = (d.k[b] as usize, out.accepted[b] as usize);
        let count = k > 0;
        assert!(a <= k, "request {b}: accepted {a} > k {k}");
        let row = &out.tokens[b * w..(b + 1) * w];
        assert_eq!(
            &row[..a],
            &d.draft_ids[b * d.k_max..b * d.k_max + a],
            "request {b}"
        );
        assert!(
            (row[a] as usize) < d.vocab,
            "request {b}: emitted {} ≥ V",
            row[a]
        );
        assert!(
            row[a + 1..].iter().all(|&t| t == SENTINEL),
            "request {b}: padding {row:?}"
        );
        // A request without drafts is not counted (as vLLM counts no draft for it).
        if count {
            c.record(k, a).unwrap();
        }
    }
    assert_eq!(
        *counted, c,
        "counts are not one record per request with drafts"
    );
}

/// Hand-made cases with outputs known from the rules alone.
pub fn exact_cases<V: Verifier<K>>(mut make: impl FnMut() -> V) {
    // V = 4, k_max = 3, one request, one-hot drafter.
    let base = |k: u32, ids: [u32; 3], rows: [[f32; 4]; 4]| BatchData {
        vocab: 4,
        k_max: 3,
        k: vec![k],
        draft_ids: ids.to_vec(),
        draft_probs: None,
        draft_stride: 4,
        target_probs: rows.iter().flatten().copied().collect(),
        target_stride: 4,
        seed: vec![99],
        offset: vec![3],
        eps: None,
        delta: None,
    };
    let one = |i: usize| {
        let mut r = [0.0f32; 4];
        r[i] = 1.0;
        r
    };
    let expect = |v: &mut V, m: Method, d: &BatchData, acc: u32, toks: [u32; 4], what: &str| {
        let (out, c) = run(v, m, Check::STRICT, d).unwrap_or_else(|e| panic!("{what}: {e:?}"));
        assert_eq!(
            (out.accepted[0], &out.tokens[..]),
            (acc, &toks[..]),
            "{what} ({m:?})"
        );
        assert_well_formed(d, &out, &c);
    };
    let mut v = make();
    let s = SENTINEL;
    // Targets one-hot at 1, 2, 3, 0: a draft [1, 2, 0] is accepted twice then corrected to 3,
    // by every method (pt(x) = 1 accepts, pt(x) = 0 rejects, the only candidate is the one-hot).
    let d = base(3, [1, 2, 0], [one(1), one(2), one(3), one(0)]);
    for m in super::conformance::METHODS {
        expect(
            &mut v,
            m,
            &d,
            2,
            [1, 2, 3, s],
            "one-hot targets, mismatch at 2",
        );
    }
    // Whole draft accepted: the bonus comes from row k (one-hot at 0).
    let d = base(3, [1, 2, 3], [one(1), one(2), one(3), one(0)]);
    for m in METHODS {
        expect(&mut v, m, &d, 3, [1, 2, 3, 0], "all accepted, bonus");
    }
    // k = 1 < k_max: the bonus comes from row 1, and slots past it are sentinels.
    let d = base(1, [1, 9, 9], [one(1), one(2), one(3), one(0)]);
    for m in METHODS {
        expect(&mut v, m, &d, 1, [1, 2, s, s], "k < k_max");
    }
    // Greedy ties go to the lowest id; NaN is −∞; a row of NaN gives 0.
    let nan = f32::NAN;
    let d = base(
        3,
        [1, 2, 3],
        [
            [0.1, 0.4, 0.4, 0.1],
            [nan, 0.2, 0.7, 0.7],
            [0.25, 0.25, 0.25, 0.25],
            [nan; 4],
        ],
    );
    let (out, _) = run(&mut v, Method::Greedy, Check::Cheap, &d).unwrap();
    assert_eq!(
        (out.accepted[0], &out.tokens[..]),
        (2, &[1, 2, 0, s][..]),
        "greedy ties"
    );
    let d = base(
        1,
        [1, 0, 0],
        [[0.1, 0.2, 0.3, 0.4], [nan; 4], one(0), one(0)],
    );
    let (out, _) = run(&mut v, Method::Greedy, Check::Cheap, &d).unwrap();
    assert_eq!(
        &out.tokens[..],
        &[3, s, s, s][..],
        "greedy mismatch emits the argmax"
    );
    let d = base(
        1,
        [3, 0, 0],
        [[0.1, 0.2, 0.3, 0.4], [nan; 4], one(0), one(0)],
    );
    let (out, _) = run(&mut v, Method::Greedy, Check::Cheap, &d).unwrap();
    assert_eq!(
        &out.tokens[..],
        &[3, 0, s, s][..],
        "all-NaN bonus row gives 0"
    );

    // Rejection with draft probabilities.
    let with_draft = |d: &mut BatchData, rows: [[f32; 4]; 3]| {
        d.draft_probs = Some(rows.iter().flatten().copied().collect());
    };
    // pd(x) = 0 < pt(x): u·0 = 0 < pt always accepts. Bonus one-hot 2.
    let mut d = base(3, [0, 1, 2], [one(0), [0.5, 0.5, 0.0, 0.0], one(2), one(2)]);
    with_draft(&mut d, [[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0], one(1)]);
    let (out, _) = run(&mut v, Method::Rejection, Check::Cheap, &d).unwrap();
    // Position 2: pt(2) = 1 > u·pd(2) = u·0: accepted.
    assert_eq!(
        (out.accepted[0], &out.tokens[..]),
        (3, &[0, 1, 2, 2][..]),
        "pd = 0 accepts"
    );
    // pt(x) = 0 rejects; residual max(0, pt − pd) is positive only at 3.
    let mut d = base(2, [0, 0, 0], [[0.0, 0.2, 0.3, 0.5], one(0), one(0), one(0)]);
    with_draft(&mut d, [[0.4, 0.3, 0.3, 0.0], one(0), one(0)]);
    let (out, _) = run(&mut v, Method::Rejection, Check::STRICT, &d).unwrap();
    assert_eq!(
        &out.tokens[..],
        &[3, s, s, s][..],
        "residual support is {{3}}"
    );
    // Residual all ≤ 0 (unnormalised draft): fall back to the target row, one-hot at 1.
    let mut d = base(1, [0, 0, 0], [one(1), one(0), one(0), one(0)]);
    with_draft(&mut d, [[0.5, 2.0, 0.0, 0.0], one(0), one(0)]);
    let (out, _) = run(&mut v, Method::Rejection, Check::Cheap, &d).unwrap();
    assert_eq!(
        &out.tokens[..],
        &[1, s, s, s][..],
        "fallback to the target row"
    );
    // Target row all zero too: emit 0.
    let mut d = base(1, [2, 0, 0], [[0.0; 4], one(0), one(0), one(0)]);
    with_draft(&mut d, [one(2), one(0), one(0)]);
    let (out, _) = run(&mut v, Method::Rejection, Check::Cheap, &d).unwrap();
    assert_eq!(
        &out.tokens[..],
        &[0, s, s, s][..],
        "no candidate at all gives 0"
    );
    // Bonus row all zero: 0.
    let d = base(1, [1, 0, 0], [one(1), [0.0; 4], one(0), one(0)]);
    for m in [Method::Rejection, Method::Typical] {
        let (out, _) = run(&mut v, m, Check::Cheap, &d).unwrap();
        assert_eq!(
            &out.tokens[..],
            &[1, 0, s, s][..],
            "empty bonus row ({m:?})"
        );
    }

    // Typical acceptance thresholds. Flat row of 4: H = ln 4, δ·e^(−H) = 0.3/4 = 0.075 < ε.
    let flat = [0.25f32; 4];
    let mut d = base(1, [2, 0, 0], [flat, one(3), one(0), one(0)]);
    // pt = 0.25 > 0.075: accepted.
    let (out, _) = run(&mut v, Method::Typical, Check::STRICT, &d).unwrap();
    assert_eq!(
        &out.tokens[..],
        &[2, 3, s, s][..],
        "typical accepts above the threshold"
    );
    // ε = 0.3 and δ = 10: threshold min(0.3, 2.5) = 0.3 > 0.25: rejected, resampled from the
    // flat row itself (any id; checked against the reference elsewhere).
    d.eps = Some(vec![0.3]);
    d.delta = Some(vec![10.0]);
    let (out, _) = run(&mut v, Method::Typical, Check::STRICT, &d).unwrap();
    assert_eq!(out.accepted[0], 0, "typical rejects below ε");
    assert!(out.tokens[0] < 4 && out.tokens[1..] == [s, s, s]);
    // ε = 0: threshold 0, so any pt > 0 is accepted and pt = 0 is not.
    let mut d = base(
        3,
        [1, 1, 0],
        [[0.0, 1e-30, 1.0, 0.0], [0.5, 0.0, 0.5, 0.0], one(1), one(3)],
    );
    d.eps = Some(vec![0.0]);
    let (out, _) = run(&mut v, Method::Typical, Check::Cheap, &d).unwrap();
    assert_eq!(
        out.accepted[0], 1,
        "ε = 0: tiny pt accepted, pt = 0 rejected"
    );
    assert!(
        out.tokens[1] == 0 || out.tokens[1] == 2,
        "resample within the row's support"
    );

    // Counts of a multi-request batch are exactly one record per request.
    let mut d = base(3, [1, 2, 0], [one(1), one(2), one(3), one(0)]);
    let e = base(1, [0, 0, 0], [one(1), one(2), one(3), one(0)]);
    d.push_from(&e, 0);
    d.push_from(&base(2, [1, 2, 0], [one(1), one(2), one(3), one(0)]), 0);
    let mut fresh = make();
    let (out, c) = run(&mut fresh, Method::Greedy, Check::STRICT, &d).unwrap();
    assert_eq!(out.accepted, [2, 0, 2]);
    assert_eq!(
        (
            c.drafts,
            c.draft_tokens,
            c.accepted_tokens,
            c.emitted_tokens
        ),
        (3, 6, 4, 7)
    );
    assert_eq!(c.accepted_per_position, [2, 2, 0, 0, 0, 0, 0, 0]);
    assert_eq!(c.drafted_per_position, [3, 2, 1, 0, 0, 0, 0, 0]);
    assert_eq!(fresh.totals().unwrap(), c);
}

/// One-hot targets make every method deterministic: accept while the draft equals the target's
/// token, then emit the target's token (or row k's). Checked on random batches.
pub fn one_hot_targets<V: Verifier<K>>(mut make: impl FnMut() -> V, seed: u64, batches: usize) {
    let mut g = Gen(seed);
    let mut v = make();
    for i in 0..batches {
        let (mut d, _) = random_batch(
            &mut g,
            RandomSpec {
                garbage: false,
                ..RandomSpec::default()
            },
        );
        let (km, ts, vocab) = (d.k_max, d.target_stride, d.vocab);
        let mut hot = vec![0u32; d.requests() * (km + 1)];
        for (r, h) in hot.iter_mut().enumerate() {
            *h = g.below(vocab) as u32;
            let row = &mut d.target_probs[r * ts..r * ts + vocab];
            row.fill(0.0);
            row[*h as usize] = 1.0;
        }
        for b in 0..d.requests() {
            for j in 0..km {
                // Half the drafts match the target, so long prefixes are accepted too.
                if g.chance(1, 2) {
                    d.draft_ids[b * km + j] = hot[b * (km + 1) + j];
                }
            }
        }
        // A draft with probabilities must give its token pd ≤ 1 and pd(hot) < 1 for the rules
        // to be deterministic here: use it one-hot at the drafted token.
        let (nreq, ds) = (d.requests(), d.draft_stride);
        if let Some(dp) = &mut d.draft_probs {
            dp.fill(0.0);
            for b in 0..nreq {
                for j in 0..km {
                    let x = d.draft_ids[b * km + j];
                    if (x as usize) < vocab {
                        dp[(b * km + j) * ds + x as usize] = 1.0;
                    }
                }
            }
        }
        for m in METHODS {
            let (out, c) =
                run(&mut v, m, Check::STRICT, &d).unwrap_or_else(|e| panic!("batch {i}: {e:?}"));
            for b in 0..d.requests() {
                let k = d.k[b] as usize;
                let ids = &d.draft_ids[b * km..b * km + k];
                let hots = &hot[b * (km + 1)..(b + 1) * (km + 1)];
                let a = ids.iter().zip(hots).take_while(|(x, h)| x == h).count();
                let mut want = vec![SENTINEL; km + 1];
                want[..a].copy_from_slice(&ids[..a]);
                want[a] = hots[a];
                assert_eq!(out.accepted[b] as usize, a, "batch {i} request {b} ({m:?})");
                assert_eq!(&out.tokens[b * (km + 1)..(b + 1) * (km + 1)], &want[..]);
            }
            assert_well_formed(&d, &out, &c);
        }
    }
}

/// A request's outputs do not depend on its batch: batches of sizes 1..=256, made of requests
/// drawn (with repeats) from a pool in shuffled order, give each request its solo outputs.
pub fn batch_invariance<V: Verifier<K>>(mut make: impl FnMut() -> V, seed: u64) {
    let mut g = Gen(seed);
    let mut v = make();
    let (pool, _) = loop {
        let (d, clean) = random_batch(
            &mut g,
            RandomSpec {
                max_requests: 48,
                max_vocab: 24,
                garbage: true,
            },
        );
        if d.requests() >= 16 {
            break (d, clean);
        }
    };
    let w = pool.k_max + 1;
    for m in METHODS {
        let solo: Vec<OutData> = (0..pool.requests())
            .map(|b| {
                let mut one = pool.empty_like();
                one.push_from(&pool, b);
                run(&mut v, m, Check::Cheap, &one).unwrap().0
            })
            .collect();
        let sizes = [
            1usize, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 200,
            255, 256,
        ];
        for &n in &sizes {
            let mut batch = pool.empty_like();
            let mut picks = Vec::with_capacity(n);
            for _ in 0..n {
                let b = g.below(pool.requests());
                picks.push(b);
                batch.push_from(&pool, b);
            }
            let (out, c) = run(&mut v, m, Check::Cheap, &batch).unwrap();
            for (slot, &b) in picks.iter().enumerate() {
                assert_eq!(
                    out.accepted[slot], solo[b].accepted[0],
                    "size {n} slot {slot} ({m:?})"
                );
                assert_eq!(
                    &out.tokens[slot * w..(slot + 1) * w],
                    &solo[b].tokens[..],
                    "size {n} slot {slot} ({m:?})"
                );
            }
            assert_well_formed(&batch, &out, &c);
        }
    }
}

/// Each malformed batch gives its typed error, counts nothing and leaves the outputs untouched.
pub fn error_cases<V: Verifier<K>>(mut make: impl FnMut() -> V) {
    let mut g = Gen(0xE440);
    let (good, _) = loop {
        let (mut d, clean) = random_batch(
            &mut g,
            RandomSpec {
                max_requests: 4,
                max_vocab: 16,
                garbage: false,
            },
        );
        if clean && d.requests() >= 2 && d.k_max >= 2 && d.draft_probs.is_some() {
            d.eps = Some(vec![0.09; d.requests()]);
            d.delta = Some(vec![0.3; d.requests()]);
            break (d, clean);
        }
    };
    let mut v = make();
    let empty_drafts = v.support().empty_drafts;
    // Warm the counters so "nothing counted" is checked against non-zero totals.
    run(&mut v, Method::Greedy, Check::Cheap, &good).unwrap();
    let (b, km, vocab) = (good.requests(), good.k_max, good.vocab);
    let kmax_out = |k_max| VerifyError::KMaxOutOfRange { k_max, max: K };
    let len = |param, len, expected| VerifyError::Length {
        param,
        len,
        expected,
    };
    type Case = (
        &'static str,
        Method,
        Check,
        Box<dyn Fn(&mut BatchData)>,
        VerifyError,
    );
    let last = b - 1;
    let mut cases: Vec<Case> = vec![
        (
            "empty batch",
            Method::Greedy,
            Check::Cheap,
            Box::new(|d| *d = d.empty_like()),
            VerifyError::EmptyBatch,
        ),
        (
            "k_max 0",
            Method::Greedy,
            Check::Cheap,
            Box::new(|d| d.k_max = 0),
            // Where k = 0 is supported, k_max = 0 is a valid shape: the draft ids are too long.
            if empty_drafts {
                len(Param::DraftIds, b * km, 0)
            } else {
                kmax_out(0)
            },
        ),
        (
            "k_max > K",
            Method::Greedy,
            Check::Cheap,
            Box::new(|d| d.k_max = K + 1),
            kmax_out(K + 1),
        ),
        (
            "vocab 0",
            Method::Greedy,
            Check::Cheap,
            Box::new(|d| d.vocab = 0),
            VerifyError::VocabOutOfRange { vocab: 0 },
        ),
        (
            "draft ids short",
            Method::Greedy,
            Check::Cheap,
            Box::new(|d| {
                d.draft_ids.pop();
            }),
            len(Param::DraftIds, b * km - 1, b * km),
        ),
        (
            "draft stride < V",
            Method::Rejection,
            Check::Cheap,
            Box::new(move |d| d.draft_stride = vocab - 1),
            VerifyError::StrideTooSmall {
                tensor: Tensor::Draft,
                stride: vocab - 1,
                vocab,
            },
        ),
        (
            "target stride < V",
            Method::Rejection,
            Check::Cheap,
            Box::new(move |d| d.target_stride = vocab - 1),
            VerifyError::StrideTooSmall {
                tensor: Tensor::Target,
                stride: vocab - 1,
                vocab,
            },
        ),
        (
            "k_max no longer matches the draft ids",
            Method::Greedy,
            Check::Cheap,
            Box::new(|d| d.k_max -= 1),
            len(Param::DraftIds, b * km, b * (km - 1)),
        ),
        (
            "seed short",
            Method::Greedy,
            Check::Cheap,
            Box::new(|d| {
                d.seed.pop();
            }),
            len(Param::Seed, b - 1, b),
        ),
        (
            "offset long",
            Method::Greedy,
            Check::Cheap,
            Box::new(|d| d.offset.push(0)),
            len(Param::Offset, b + 1, b),
        ),
        (
            "eps short",
            Method::Greedy,
            Check::Cheap,
            Box::new(|d| {
                d.eps.as_mut().unwrap().pop();
            }),
            len(Param::Eps, b - 1, b),
        ),
        (
            "k = 0",
            Method::Greedy,
            Check::Cheap,
            Box::new(move |d| d.k[last] = 0),
            VerifyError::DraftLength {
                request: last,
                k: 0,
                k_max: km,
            },
        ),
        (
            "k > k_max",
            Method::Greedy,
            Check::Cheap,
            Box::new(move |d| d.k[last] = km as u32 + 1),
            VerifyError::DraftLength {
                request: last,
                k: km as u32 + 1,
                k_max: km,
            },
        ),
        (
            "token ≥ V",
            Method::Greedy,
            Check::Cheap,
            Box::new(move |d| {
                d.k[last] = km as u32;
                d.draft_ids[last * km..(last + 1) * km].fill(0);
                d.draft_ids[last * km + km - 1] = vocab as u32;
            }),
            VerifyError::TokenOutOfRange {
                request: last,
                position: km - 1,
                token: vocab as u32,
                vocab,
            },
        ),
        (
            "eps NaN",
            Method::Typical,
            Check::Cheap,
            Box::new(move |d| d.eps.as_mut().unwrap()[last] = f32::NAN),
            VerifyError::BadParam {
                request: last,
                param: Param::Eps,
            },
        ),
        (
            "delta negative",
            Method::Typical,
            Check::Cheap,
            Box::new(move |d| d.delta.as_mut().unwrap()[last] = -0.1),
            VerifyError::BadParam {
                request: last,
                param: Param::Delta,
            },
        ),
        (
            "delta infinite",
            Method::Typical,
            Check::Cheap,
            Box::new(move |d| d.delta.as_mut().unwrap()[0] = f32::INFINITY),
            VerifyError::BadParam {
                request: 0,
                param: Param::Delta,
            },
        ),
        (
            "target NaN (strict)",
            Method::Greedy,
            Check::STRICT,
            Box::new(move |d| {
                d.k[last] = 1;
                let i = (last * (km + 1) + 1) * d.target_stride + vocab - 1;
                d.target_probs[i] = f32::NAN;
            }),
            VerifyError::BadProbability {
                request: last,
                tensor: Tensor::Target,
                position: 1,
                index: vocab - 1,
            },
        ),
        (
            "draft negative (strict)",
            Method::Rejection,
            Check::STRICT,
            Box::new(move |d| {
                let i = last * km * d.draft_stride;
                d.draft_probs.as_mut().unwrap()[i] = -0.25;
            }),
            VerifyError::BadProbability {
                request: last,
                tensor: Tensor::Draft,
                position: 0,
                index: 0,
            },
        ),
        (
            "draft infinite (strict)",
            Method::Rejection,
            Check::STRICT,
            Box::new(move |d| {
                d.draft_probs.as_mut().unwrap()[0] = f32::INFINITY;
            }),
            VerifyError::BadProbability {
                request: 0,
                tensor: Tensor::Draft,
                position: 0,
                index: 0,
            },
        ),
    ];
    // Row sums: scale a target row by 2 (it then sums to ~2).
    cases.push((
        "target row sum (strict)",
        Method::Typical,
        Check::STRICT,
        Box::new(move |d| {
            let i = last * (km + 1) * d.target_stride;
            let vocab = d.vocab;
            d.target_probs[i..i + vocab]
                .iter_mut()
                .for_each(|p| *p *= 2.0);
        }),
        VerifyError::RowSum {
            request: last,
            tensor: Tensor::Target,
            position: 0,
            sum: 0.0,
        },
    ));
    if empty_drafts {
        // Not an error there: `empty_drafts` covers it.
        cases.retain(|c| c.0 != "k = 0");
    }
    let before = v.totals().unwrap();
    for (what, m, check, break_it, want) in cases {
        let mut d = good.clone();
        break_it(&mut d);
        // Outputs sized for the original layout where possible, or the broken one.
        let mut out = OutData::new(d.requests().max(1), d.k_max.max(1));
        if what.contains("empty") {
            out = OutData::new(0, km);
        }
        let fresh = out.clone();
        let r = v.verify(m, check, &d.view(), &mut out.view());
        let err = r.expect_err(what);
        match (want, &err) {
            // The exact f64 sum is not worth pinning; the reference must agree on it.
            (VerifyError::RowSum { .. }, _) => {
                let mut o2 = fresh.clone();
                let re = validate::<K>(m, check, &d.view(), &o2.view()).unwrap_err();
                assert!(
                    matches!(re, VerifyError::RowSum { request, tensor: Tensor::Target, position: 0, sum } if request == last && sum > 1.5),
                    "{what}: {re:?}"
                );
                assert_eq!(err, V::Error::from(re), "{what}");
            }
            _ => assert_eq!(err, V::Error::from(want), "{what}"),
        }
        assert_eq!(out, fresh, "{what}: outputs were written");
        assert_eq!(v.totals().unwrap(), before, "{what}: something was counted");
    }
    // Output buffers of the wrong size.
    let mut out = OutData::new(b, km);
    out.tokens.pop();
    let e = v.verify(Method::Greedy, Check::Cheap, &good.view(), &mut out.view());
    assert_eq!(
        e,
        Err(V::Error::from(len(
            Param::Tokens,
            b * (km + 1) - 1,
            b * (km + 1)
        )))
    );
    let mut out = OutData::new(b + 1, km);
    out.tokens.truncate(b * (km + 1));
    let e = v.verify(Method::Greedy, Check::Cheap, &good.view(), &mut out.view());
    assert_eq!(e, Err(V::Error::from(len(Param::Accepted, b + 1, b))));
    // A layout whose size overflows usize.
    let mut d = good.clone();
    d.target_stride = usize::MAX / 2;
    d.vocab = 1;
    let e = run(&mut v, Method::Greedy, Check::Cheap, &d).unwrap_err();
    assert_eq!(
        e,
        V::Error::from(len(Param::TargetProbs, d.target_probs.len(), usize::MAX))
    );
    // The first error is the lowest request's, even if a later request also fails.
    let mut d = good.clone();
    d.k[last] = 0;
    d.draft_ids[0] = vocab as u32;
    let e = run(&mut v, Method::Greedy, Check::Cheap, &d).unwrap_err();
    assert_eq!(
        e,
        V::Error::from(VerifyError::TokenOutOfRange {
            request: 0,
            position: 0,
            token: vocab as u32,
            vocab
        })
    );
    assert_eq!(
        v.totals().unwrap(),
        before,
        "nothing counted for any refused batch"
    );
}

/// Every case, with the sizes the issue asks for (≥ 10⁴ random batches against the reference).
pub fn run_all<V: Verifier<K>>(mut make: impl FnMut() -> V) {
    exact_cases(&mut make);
    error_cases(&mut make);
    empty_drafts(&mut make);
    ragged_layout(&mut make, 0x4A6_0005, 1_000);
    target_logits(&mut make, 0x106_0006, 300);
    sampling_inputs(&mut make, 0x5A3_0007, 400);
    mixed_drafters(&mut make, 0x31C_0009, 300);
    one_hot_targets(&mut make, 0x0AE_0001, 300);
    batch_invariance(&mut make, 0x1A7_0002);
    matches_reference_on_random_batches(&mut make, 0x5EED_0003, 10_000);
}

/// Arbitrary, mostly malformed, input for fuzzing a verifier's entry point.
#[derive(Clone, Debug)]
pub struct FuzzInput {
    /// Vocabulary size.
    pub vocab: usize,
    /// `k_max`.
    pub k_max: usize,
    /// Draft lengths (their count is the batch size).
    pub k: Vec<u32>,
    /// Pool of draft ids, used cyclically.
    pub ids: Vec<u32>,
    /// Pool of probability bit patterns, used cyclically.
    pub bits: Vec<u32>,
    /// Whether the drafter gives probabilities.
    pub with_draft: bool,
    /// Stride slack (`stride = vocab + slack − 2`, saturating).
    pub slack: [u8; 2],
    /// Length errors of draft ids, draft probs, target probs, seed, offset, eps, delta, accepted,
    /// tokens (0 = correct length).
    pub len_err: [i8; 9],
    /// Which method (mod 3).
    pub method: u8,
    /// Strict check with this tolerance.
    pub strict: Option<f32>,
    /// Typical parameters given.
    pub params: Option<(f32, f32)>,
}

/// The proptest strategy for [`FuzzInput`]: small shapes, lengths usually right but sometimes
/// off by a few, ids and probabilities from arbitrary bits mixed with sensible values.
pub fn arb_fuzz_input() -> impl proptest::strategy::Strategy<Value = FuzzInput> {
    use proptest::prelude::*;
    let len_err = prop_oneof![8 => Just(0i8), 1 => -3i8..=3];
    let id = prop_oneof![4 => 0u32..12, 1 => any::<u32>()];
    let bit = prop_oneof![
        4 => (0.0f32..1.0).prop_map(f32::to_bits),
        1 => Just(0u32),
        1 => any::<u32>(),
    ];
    (
        (
            0usize..10,
            0usize..11,
            proptest::collection::vec(0u32..11, 0..6),
        ),
        proptest::collection::vec(id, 1..40),
        proptest::collection::vec(bit, 1..64),
        any::<bool>(),
        any::<[u8; 2]>(),
        proptest::array::uniform9(len_err),
        any::<u8>(),
        proptest::option::of(prop_oneof![Just(1e-3f32), any::<f32>()]),
        proptest::option::of((any::<f32>(), 0.0f32..2.0)),
    )
        .prop_map(
            |((vocab, k_max, k), ids, bits, with_draft, slack, len_err, method, strict, params)| {
                FuzzInput {
                    vocab,
                    k_max,
                    k,
                    ids,
                    bits,
                    with_draft,
                    slack: [slack[0] % 5, slack[1] % 5],
                    len_err,
                    method,
                    strict,
                    params,
                }
            },
        )
}

impl FuzzInput {
    /// Builds the (usually malformed) batch and output buffers.
    pub fn build(&self) -> (BatchData, OutData, Method, Check) {
        let b = self.k.len();
        let stride = |s: u8| (self.vocab + s as usize).saturating_sub(2);
        let (ds, ts) = (stride(self.slack[0]), stride(self.slack[1]));
        let sized = |n: usize, e: i8| (n as isize + e as isize).max(0) as usize;
        let take_bits = |n: usize, skew: usize| -> Vec<f32> {
            (0..n)
                .map(|i| f32::from_bits(self.bits[(i + skew) % self.bits.len()]))
                .collect()
        };
        let e = &self.len_err;
        let d = BatchData {
            vocab: self.vocab,
            k_max: self.k_max,
            k: self.k.clone(),
            draft_ids: (0..sized(b * self.k_max, e[0]))
                .map(|i| self.ids[i % self.ids.len()])
                .collect(),
            draft_probs: self
                .with_draft
                .then(|| take_bits(sized(b * self.k_max * ds, e[1]), 3)),
            draft_stride: ds,
            target_probs: take_bits(sized(b * (self.k_max + 1) * ts, e[2]), 0),
            target_stride: ts,
            seed: (0..sized(b, e[3]) as u64).collect(),
            offset: (0..sized(b, e[4]) as u64).map(|o| o * 31).collect(),
            eps: self.params.map(|p| vec![p.0; sized(b, e[5])]),
            delta: self.params.map(|p| vec![p.1; sized(b, e[6])]),
        };
        let out = OutData {
            accepted: vec![0xDEAD_BEEF; sized(b, e[7])],
            tokens: vec![0xDEAD_BEEF; sized(b * (self.k_max + 1), e[8])],
        };
        let method = METHODS[self.method as usize % 3];
        let check = self
            .strict
            .map_or(Check::Cheap, |t| Check::Strict { sum_tolerance: t });
        (d, out, method, check)
    }
}

/// One fuzz case: `v` must not panic, must agree with the reference (same outputs or same
/// error), must write well-formed outputs on success and nothing (and count nothing) on error.
pub fn fuzz_one<V: Verifier<K>>(v: &mut V, input: &FuzzInput) {
    let (d, out0, method, check) = input.build();
    let before = v.totals().unwrap();
    let mut out = out0.clone();
    let got = v.verify(method, check, &d.view(), &mut out.view());
    let mut ref_out = out0.clone();
    let mut ref_counts = Counters::<K>::ZERO;
    // The backend's support decides the error (k = 0 is refused where it is not supported).
    let want =
        validate_with::<K>(v.support(), method, check, &d.view(), &ref_out.view()).and_then(|()| {
            verify_batch(
                method,
                check,
                &d.view(),
                &mut ref_out.view(),
                &mut ref_counts,
            )
        });
    let after = v.totals().unwrap();
    match (want, got) {
        (Ok(()), Ok(())) => {
            assert_eq!(out, ref_out, "outputs differ from the reference");
            let counted = after.delta_since(&before);
            assert_eq!(counted, ref_counts);
            assert_well_formed(&d, &out, &counted);
        }
        (Err(w), Err(g)) => {
            assert_eq!(g, V::Error::from(w));
            assert_eq!(out, out0, "outputs written on error");
            assert_eq!(ref_out, out0, "reference wrote outputs on error");
            assert!(ref_counts.is_zero());
            assert_eq!(after, before, "counted on error");
        }
        (w, g) => panic!("reference {w:?}, backend {g:?}"),
    }
}

/// An owned batch in the ragged layout (vLLM's), from which [`RaggedData::view`] makes a
/// [`Batch`].
#[derive(Clone, Debug, PartialEq)]
#[allow(missing_docs)] // the fields are those of `Batch`
pub struct RaggedData {
    pub vocab: usize,
    pub cu_num_draft_tokens: Vec<u32>,
    pub draft_ids: Vec<u32>,
    pub draft_probs: Option<Vec<f32>>,
    pub draft_stride: usize,
    pub target_probs: Vec<f32>,
    pub target_stride: usize,
    pub seed: Vec<u64>,
    pub offset: Vec<u64>,
    pub eps: Option<Vec<f32>>,
    pub delta: Option<Vec<f32>>,
    pub bonus: Option<Vec<u32>>,
}

impl RaggedData {
    /// The same requests as the padded `d`, packed: draft ids and rows `0..k` back to back,
    /// target rows `0..=k` (only `0..k` with `bonus`, as vLLM's layout has no bonus rows then).
    /// Strides are kept (padding included).
    pub fn from_padded(d: &BatchData, bonus: Option<&[u32]>) -> Self {
        let mut r = Self {
            vocab: d.vocab,
            cu_num_draft_tokens: vec![],
            draft_ids: vec![],
            draft_probs: d.draft_probs.as_ref().map(|_| vec![]),
            draft_stride: d.draft_stride,
            target_probs: vec![],
            target_stride: d.target_stride,
            seed: d.seed.clone(),
            offset: d.offset.clone(),
            eps: d.eps.clone(),
            delta: d.delta.clone(),
            bonus: bonus.map(<[u32]>::to_vec),
        };
        let (km, ds, ts) = (d.k_max, d.draft_stride, d.target_stride);
        let mut cu = 0u32;
        for b in 0..d.requests() {
            let k = d.k[b] as usize;
            cu += d.k[b];
            r.cu_num_draft_tokens.push(cu);
            r.draft_ids
                .extend_from_slice(&d.draft_ids[b * km..b * km + k]);
            if let (Some(out), Some(src)) = (&mut r.draft_probs, &d.draft_probs) {
                out.extend_from_slice(&src[b * km * ds..(b * km + k) * ds]);
            }
            let rows = if bonus.is_some() { k } else { k + 1 };
            let t0 = b * (km + 1) * ts;
            r.target_probs
                .extend_from_slice(&d.target_probs[t0..t0 + rows * ts]);
        }
        r
    }

    /// The borrowed view.
    pub fn view(&self) -> Batch<'_> {
        let mut b = Batch::ragged(
            self.vocab,
            RaggedDrafts {
                cu_num_draft_tokens: &self.cu_num_draft_tokens,
                ids: &self.draft_ids,
            },
            &self.target_probs,
            Streams {
                seed: &self.seed,
                offset: &self.offset,
            },
        )
        .with_strides(Strides {
            draft: self.draft_stride,
            target: self.target_stride,
        });
        b.draft = self.draft_probs.as_deref().map(|d| Draft {
            rows: Rows::f32(d, self.draft_stride),
            first_row: None,
        });
        b.eps = self.eps.as_deref();
        b.delta = self.delta.as_deref();
        b.bonus = self.bonus.as_deref();
        b
    }
}

/// Runs the reference and `v` on the same view; asserts the same outputs (or the same error,
/// the reference's checked against `v`'s [`Verifier::support`]) and the same counts. Returns
/// the outputs and counts on success.
pub fn assert_view_matches_reference<V: Verifier<K>>(
    v: &mut V,
    method: Method,
    check: Check,
    batch: &Batch<'_>,
    what: &str,
) -> Option<(OutData, Counters<K>)> {
    let (b, km) = (batch.requests(), batch.k_max);
    let mut want = OutData::new(b, km);
    let mut wc = Counters::<K>::ZERO;
    let w = validate_with::<K>(v.support(), method, check, batch, &want.view())
        .and_then(|()| verify_batch(method, check, batch, &mut want.view(), &mut wc));
    let before = v.totals().unwrap();
    let mut got = OutData::new(b, km);
    let g = v.verify(method, check, batch, &mut got.view());
    let gc = v.totals().unwrap().delta_since(&before);
    match (w, g) {
        (Ok(()), Ok(())) => {
            assert_eq!(
                got, want,
                "{what} ({method:?}): outputs differ from the reference"
            );
            assert_eq!(
                gc, wc,
                "{what} ({method:?}): counts differ from the reference"
            );
            Some((got, gc))
        }
        (Err(w), Err(g)) => {
            assert_eq!(g, V::Error::from(w), "{what}: error differs");
            assert_eq!(got, OutData::new(b, km), "{what}: outputs written on error");
            assert!(gc.is_zero(), "{what}: counted on error");
            None
        }
        (w, g) => panic!("{what}: reference gave {w:?}, backend gave {g:?}"),
    }
}

/// What the reference gives for `batch` with the recovered-token output, from its two calls:
/// [`verify_batch`] without the output, then
/// [`recovered_tokens`](specula_core::verify::recovered_tokens). Asserts that the reference's
/// one call ([`verify_batch`] with [`Outputs::with_recovered`]) gives the same.
pub fn recovered_reference(
    method: Method,
    check: Check,
    batch: &Batch<'_>,
    what: &str,
) -> RecoveredWant {
    use specula_core::verify::{draft_slots, recovered_tokens};
    let (b, km) = (batch.requests(), batch.k_max);
    let slots = draft_slots(batch);
    let mut recovered = vec![MARK; slots];
    recovered_tokens::<K>(method, check, batch, &mut recovered).expect("valid batch");
    let mut out = OutData::new(b, km);
    let mut counters = Counters::<K>::ZERO;
    verify_batch(method, check, batch, &mut out.view(), &mut counters).expect("valid batch");
    let (mut ro, mut rr, mut rc) = (OutData::new(b, km), vec![MARK; slots], Counters::<K>::ZERO);
    verify_batch(
        method,
        check,
        batch,
        &mut ro.view().with_recovered(&mut rr),
        &mut rc,
    )
    .expect("valid batch");
    assert_eq!(
        (&ro, &rr, rc),
        (&out, &recovered, counters),
        "{what} ({method:?}): the reference's one call differs from its two"
    );
    RecoveredWant {
        out,
        recovered,
        counters,
    }
}

/// The marker recovered buffers start with (no verifier writes it).
const MARK: u32 = 0xDEAD_BEEF;

/// The reference's outputs, recovered tokens and counts for a batch ([`recovered_reference`]).
#[derive(Clone, Debug, PartialEq)]
pub struct RecoveredWant {
    /// Accepted counts and tokens.
    pub out: OutData,
    /// The recovered tokens.
    pub recovered: Vec<u32>,
    /// The counts.
    pub counters: Counters<K>,
}

/// Runs `v` on `batch` with the recovered-token output set ([`Outputs::with_recovered`]) and
/// asserts, bit for bit, that the one call gives `want` ([`recovered_reference`]): the
/// accepted counts, tokens and counts of [`verify_batch`] without the output, and the
/// recovered tokens of the separate call. Also: padded slots after `k_b` are [`SENTINEL`],
/// and at each request's first rejected position the recovered token is the emitted one.
/// Returns how many requests rejected a draft. Only for a valid batch and a backend with
/// [`Support::recovered`](specula_core::verify::Support).
pub fn assert_recovered_matches<V: Verifier<K>>(
    v: &mut V,
    want: &RecoveredWant,
    method: Method,
    check: Check,
    batch: &Batch<'_>,
    what: &str,
) -> usize {
    let (b, km) = (batch.requests(), batch.k_max);
    let before = v.totals().unwrap();
    let mut got = OutData::new(b, km);
    let mut rec = vec![MARK; want.recovered.len()];
    v.verify(
        method,
        check,
        batch,
        &mut got.view().with_recovered(&mut rec),
    )
    .expect("valid batch");
    let gc = v.totals().unwrap().delta_since(&before);
    assert_eq!(got, want.out, "{what} ({method:?}): outputs differ");
    assert_eq!(
        rec, want.recovered,
        "{what} ({method:?}): recovered tokens differ"
    );
    assert_eq!(gc, want.counters, "{what} ({method:?}): counts differ");
    let mut rejected = 0;
    let mut start = 0;
    for r in 0..b {
        let k = batch.draft_len(r) as usize;
        let a = got.accepted[r] as usize;
        if !batch.is_ragged() {
            start = r * km;
            assert!(
                rec[start + k..start + km].iter().all(|&t| t == SENTINEL),
                "{what}: request {r}'s padding"
            );
        }
        if a < k {
            rejected += 1;
            assert_eq!(
                rec[start + a],
                got.tokens[r * (km + 1) + a],
                "{what} ({method:?}): request {r}'s first rejection"
            );
        }
        if batch.is_ragged() {
            start += k;
        }
    }
    rejected
}

/// [`recovered_reference`] then [`assert_recovered_matches`]: returns the reference's
/// outputs and the number of requests that rejected a draft.
pub fn assert_recovered_matches_reference<V: Verifier<K>>(
    v: &mut V,
    method: Method,
    check: Check,
    batch: &Batch<'_>,
    what: &str,
) -> (RecoveredWant, usize) {
    let want = recovered_reference(method, check, batch, what);
    let rejected = assert_recovered_matches(v, &want, method, check, batch, what);
    (want, rejected)
}

/// The recovered-token output of the verification call ([`Outputs::with_recovered`]) on
/// `batches` random batches, padded (with `k = 0` where [`Support`] allows it) and ragged
/// (where it does), every method. A backend with
/// [`Support::recovered`](specula_core::verify::Support) must give the reference's outputs,
/// recovered tokens and counts ([`assert_recovered_matches_reference`]); one without must
/// refuse it with `Unsupported { Recovered }`, writing and counting nothing, and verify the
/// same batch without it as the reference does.
///
/// [`Support`]: specula_core::verify::Support
pub fn recovered_output<V: Verifier<K>>(mut make: impl FnMut() -> V, seed: u64, batches: usize) {
    use specula_core::verify::draft_slots;
    let mut v = make();
    let support = v.support();
    let mut g = Gen(seed);
    let spec = RandomSpec {
        garbage: false,
        ..RandomSpec::default()
    };
    for i in 0..batches {
        let (mut d, _) = random_batch(&mut g, spec);
        if support.empty_drafts {
            for k in &mut d.k {
                if g.chance(1, 4) {
                    *k = 0;
                }
            }
        }
        let r = RaggedData::from_padded(&d, None);
        let m = METHODS[i % 3];
        let mut views = vec![("padded", d.view())];
        if support.ragged {
            views.push(("ragged", r.view()));
        }
        for (name, batch) in views {
            let what = format!("recovered batch {i}, {name}");
            if support.recovered {
                assert_recovered_matches_reference(&mut v, m, Check::STRICT, &batch, &what);
                continue;
            }
            let (b, km) = (batch.requests(), batch.k_max);
            let before = v.totals().unwrap();
            let mut out = OutData::new(b, km);
            let mut rec = vec![MARK; draft_slots(&batch)];
            let e = v.verify(
                m,
                Check::STRICT,
                &batch,
                &mut out.view().with_recovered(&mut rec),
            );
            assert_eq!(
                e,
                Err(V::Error::from(VerifyError::Unsupported {
                    feature: Feature::Recovered
                })),
                "{what}"
            );
            assert_eq!(out, OutData::new(b, km), "{what}: outputs written");
            assert!(rec.iter().all(|&t| t == MARK), "{what}: recovered written");
            assert!(
                v.totals().unwrap().delta_since(&before).is_zero(),
                "{what}: counted"
            );
            assert_view_matches_reference(&mut v, m, Check::STRICT, &batch, &what)
                .expect("valid batch");
        }
    }
}

/// The outputs of a padded batch narrowed to `k_max + 1 = width` slots per request (the slots
/// dropped must be sentinels): what the same requests give in a narrower layout.
pub fn narrow(out: &OutData, width: usize) -> OutData {
    let from = out.tokens.len() / out.accepted.len().max(1);
    let mut tokens = vec![];
    for row in out.tokens.chunks(from.max(1)) {
        assert!(
            row[width..].iter().all(|&t| t == SENTINEL),
            "a dropped slot is not a sentinel: {row:?}"
        );
        tokens.extend_from_slice(&row[..width]);
    }
    OutData {
        accepted: out.accepted.clone(),
        tokens,
    }
}

/// `k = 0` (only the bonus is emitted, nothing counted) and `k_max = 0` where the backend
/// supports them ([`Support::empty_drafts`](specula_core::verify::Support)): exact cases and
/// random batches against the reference. Elsewhere: the typed errors, nothing counted.
pub fn empty_drafts<V: Verifier<K>>(mut make: impl FnMut() -> V) {
    let mut v = make();
    let one = |i: usize| {
        let mut r = [0.0f32; 4];
        r[i] = 1.0;
        r
    };
    // V = 4, k_max = 2: request 0 has no draft (its row 0 is one-hot at 3), request 1 drafts
    // [1], accepted by the one-hot row 0 at 1, then the bonus row one-hot at 2.
    let rows = [one(3), one(0), one(0), one(1), one(2), one(0)];
    let d = BatchData {
        vocab: 4,
        k_max: 2,
        k: vec![0, 1],
        draft_ids: vec![7, 7, 1, 7],
        draft_probs: None,
        draft_stride: 4,
        target_probs: rows.iter().flatten().copied().collect(),
        target_stride: 4,
        seed: vec![5, 6],
        offset: vec![0, 1],
        eps: None,
        delta: None,
    };
    let s = SENTINEL;
    let mut only_bonus = d.clone();
    only_bonus.k_max = 0;
    only_bonus.k = vec![0, 0];
    only_bonus.draft_ids = vec![];
    only_bonus.target_probs = [one(0), one(2)].iter().flatten().copied().collect();
    if !v.support().empty_drafts {
        let before = v.totals().unwrap();
        for m in METHODS {
            let mut out = OutData::new(2, 2);
            let e = v.verify(m, Check::STRICT, &d.view(), &mut out.view());
            let want = VerifyError::DraftLength {
                request: 0,
                k: 0,
                k_max: 2,
            };
            assert_eq!(e, Err(V::Error::from(want)), "k = 0 ({m:?})");
            assert_eq!(out, OutData::new(2, 2), "k = 0: outputs written");
            let mut out = OutData::new(2, 0);
            let e = v.verify(m, Check::STRICT, &only_bonus.view(), &mut out.view());
            let want = VerifyError::KMaxOutOfRange { k_max: 0, max: K };
            assert_eq!(e, Err(V::Error::from(want)), "k_max = 0 ({m:?})");
        }
        assert_eq!(
            v.totals().unwrap(),
            before,
            "k = 0 refused: nothing counted"
        );
        return;
    }
    for m in METHODS {
        let (out, c) = run(&mut v, m, Check::STRICT, &d).unwrap();
        assert_eq!(out.accepted, [0, 1], "{m:?}");
        assert_eq!(out.tokens, [3, s, s, 1, 2, s], "{m:?}");
        // Only request 1 is counted: one draft of one token, accepted.
        let mut want = Counters::<K>::ZERO;
        want.record(1, 1).unwrap();
        assert_eq!(c, want, "{m:?}: k = 0 must not be counted");
        let (out, c) = run(&mut v, m, Check::STRICT, &only_bonus).unwrap();
        assert_eq!(
            (out.accepted, out.tokens),
            (vec![0, 0], vec![0, 2]),
            "{m:?}"
        );
        assert!(c.is_zero(), "{m:?}: a batch without drafts counts nothing");
        // A caller-supplied bonus replaces the sample (and needs no valid bonus row).
        let bonus = [1, 0];
        let view = d.view().with_bonus(&bonus);
        let (out, _) = assert_view_matches_reference(&mut v, m, Check::STRICT, &view, "bonus")
            .expect("a valid batch with bonus tokens");
        assert_eq!(out.tokens, [1, s, s, 1, 0, s], "{m:?}: bonus tokens");
        let bad = [4, 0];
        let view = d.view().with_bonus(&bad);
        let mut out = OutData::new(2, 2);
        let e = v.verify(m, Check::Cheap, &view, &mut out.view());
        let want = VerifyError::TokenOutOfRange {
            request: 0,
            position: 0,
            token: 4,
            vocab: 4,
        };
        assert_eq!(e, Err(V::Error::from(want)), "bonus ≥ V");
    }
    // Random batches with some k = 0, bit for bit against the reference.
    let mut g = Gen(0x0E_0000_0004);
    for i in 0..300 {
        let (mut d, clean) = random_batch(&mut g, RandomSpec::default());
        for k in &mut d.k {
            if g.chance(1, 3) {
                *k = 0;
            }
        }
        let check = if clean { Check::STRICT } else { Check::Cheap };
        let m = METHODS[i % 3];
        let (out, c) = assert_view_matches_reference(&mut v, m, check, &d.view(), "k = 0 random")
            .expect("a valid batch");
        assert_well_formed(&d, &out, &c);
    }
}

/// The ragged layout ([`Batch::ragged`]) gives the same bits and counts as the padded layout
/// for the same requests (with and without caller-supplied bonus tokens, `k = 0` included),
/// and the reference's errors; where the backend does not support it, the typed error.
pub fn ragged_layout<V: Verifier<K>>(mut make: impl FnMut() -> V, seed: u64, batches: usize) {
    let mut v = make();
    let mut g = Gen(seed);
    let support = v.support();
    if !support.ragged {
        let (d, _) = random_batch(&mut g, RandomSpec::default());
        let r = RaggedData::from_padded(&d, None);
        let mut out = OutData::new(d.requests(), r.view().k_max);
        let e = v.verify(Method::Greedy, Check::Cheap, &r.view(), &mut out.view());
        let want = VerifyError::Unsupported {
            feature: Feature::Ragged,
        };
        assert_eq!(e, Err(V::Error::from(want)), "ragged");
        if !support.bonus {
            let bonus = vec![0; d.requests()];
            let mut out = OutData::new(d.requests(), d.k_max);
            let view = d.view().with_bonus(&bonus);
            let e = v.verify(Method::Greedy, Check::Cheap, &view, &mut out.view());
            let want = VerifyError::Unsupported {
                feature: Feature::Bonus,
            };
            assert_eq!(e, Err(V::Error::from(want)), "bonus");
        }
        return;
    }
    for i in 0..batches {
        let (mut d, clean) = random_batch(&mut g, RandomSpec::default());
        if support.empty_drafts {
            for k in &mut d.k {
                if g.chance(1, 4) {
                    *k = 0;
                }
            }
        }
        let bonus: Option<Vec<u32>> = g
            .chance(1, 3)
            .then(|| (0..d.requests()).map(|_| g.below(d.vocab) as u32).collect());
        let check = if clean { Check::STRICT } else { Check::Cheap };
        let m = METHODS[i % 3];
        let padded = match &bonus {
            Some(x) => d.view().with_bonus(x),
            None => d.view(),
        };
        let r = RaggedData::from_padded(&d, bonus.as_deref());
        let what = format!("batch {i}");
        let p = assert_view_matches_reference(&mut v, m, check, &padded, &what);
        let q = assert_view_matches_reference(&mut v, m, check, &r.view(), &what);
        let ((po, pc), (qo, qc)) = (p.expect("valid padded"), q.expect("valid ragged"));
        assert_eq!(
            narrow(&po, r.view().k_max + 1),
            qo,
            "{what}: ragged ≠ padded"
        );
        assert_eq!(pc, qc, "{what}: counts differ between the layouts");
    }
    // A decreasing cumulative count is refused, nothing counted.
    let (d, _) = random_batch(&mut g, RandomSpec::default());
    let mut r = RaggedData::from_padded(&d, None);
    r.cu_num_draft_tokens
        .insert(0, r.cu_num_draft_tokens[0] + 1);
    r.seed.insert(0, 0);
    r.offset.insert(0, 0);
    let before = v.totals().unwrap();
    let mut out = OutData::new(r.seed.len(), r.view().k_max);
    let e = v.verify(Method::Greedy, Check::Cheap, &r.view(), &mut out.view());
    let want = VerifyError::CumulativeDecreases { request: 1 };
    assert_eq!(
        e,
        Err(V::Error::from(want)),
        "decreasing cu_num_draft_tokens"
    );
    assert_eq!(v.totals().unwrap(), before, "nothing counted");
}

/// A clean batch of `b` requests at exactly vocabulary `vocab` with `k_max` slots, draft
/// lengths in `0..=k_max` (`1..=k_max` unless `empty_drafts`), draft probabilities and
/// typical-acceptance parameters: real vocabulary sizes for the layout comparisons.
pub fn sized_batch(
    g: &mut Gen,
    b: usize,
    vocab: usize,
    k_max: usize,
    empty_drafts: bool,
) -> BatchData {
    let lo = usize::from(!empty_drafts);
    let mut d = BatchData {
        vocab,
        k_max,
        k: (0..b)
            .map(|_| (lo + g.below(k_max + 1 - lo)) as u32)
            .collect(),
        draft_ids: vec![0; b * k_max],
        draft_probs: Some(vec![0.0; b * k_max * vocab]),
        draft_stride: vocab,
        target_probs: vec![0.0; b * (k_max + 1) * vocab],
        target_stride: vocab,
        seed: (0..b).map(|_| g.next_u64()).collect(),
        offset: (0..b).map(|_| g.next_u64() >> g.below(64)).collect(),
        eps: Some((0..b).map(|_| g.unit() * 0.3).collect()),
        delta: Some((0..b).map(|_| g.unit()).collect()),
    };
    for r in 0..b {
        for j in 0..=k_max {
            let t0 = (r * (k_max + 1) + j) * vocab;
            let sh = shape(g);
            random_row(g, &mut d.target_probs[t0..t0 + vocab], sh);
            if j < k_max {
                let d0 = (r * k_max + j) * vocab;
                let dp = d.draft_probs.as_mut().expect("draft probabilities");
                // Half the drafts near the target (acceptance likely), half elsewhere.
                if g.chance(1, 2) {
                    dp[d0..d0 + vocab].copy_from_slice(&d.target_probs[t0..t0 + vocab]);
                } else {
                    let sh = shape(g);
                    random_row(g, &mut dp[d0..d0 + vocab], sh);
                }
                d.draft_ids[r * k_max + j] = sample(g, &dp[d0..d0 + vocab]);
            }
        }
    }
    d
}

/// Ragged against padded, bit for bit, at vocabulary `vocab` (32k and more: real sizes), each
/// method, with and without caller-supplied bonus tokens, `k = 0` included; both against the
/// reference. Only for a backend that supports the ragged layout and `k = 0`.
pub fn ragged_matches_padded_at<V: Verifier<K>>(
    v: &mut V,
    seed: u64,
    vocab: usize,
    batches: usize,
) {
    let mut g = Gen(seed);
    for i in 0..batches {
        let d = sized_batch(&mut g, 4, vocab, 3, true);
        let bonus: Vec<u32> = (0..4).map(|_| g.below(vocab) as u32).collect();
        for m in METHODS {
            for with_bonus in [false, true] {
                let padded = if with_bonus {
                    d.view().with_bonus(&bonus)
                } else {
                    d.view()
                };
                let r = RaggedData::from_padded(&d, with_bonus.then_some(&bonus[..]));
                let what = format!("V = {vocab}, batch {i}, bonus {with_bonus}");
                let (po, pc) = assert_view_matches_reference(v, m, Check::STRICT, &padded, &what)
                    .expect("valid padded batch");
                let (qo, qc) = assert_view_matches_reference(v, m, Check::STRICT, &r.view(), &what)
                    .expect("valid ragged batch");
                assert_eq!(
                    narrow(&po, r.view().k_max + 1),
                    qo,
                    "{what}: ragged ≠ padded"
                );
                assert_eq!(pc, qc, "{what}: counts differ");
                assert_well_formed(&d, &po, &pc);
            }
        }
    }
}

/// Target logits with per-request temperature: where the backend supports them
/// ([`Support::logits`](specula_core::verify::Support)), random padded batches (mixed
/// temperatures, 0 = greedy; `k = 0` where supported) against the reference, bit for bit;
/// elsewhere the typed error, nothing counted.
pub fn target_logits<V: Verifier<K>>(mut make: impl FnMut() -> V, seed: u64, batches: usize) {
    let mut v = make();
    let mut g = Gen(seed);
    let support = v.support();
    let spec = RandomSpec {
        garbage: false,
        ..RandomSpec::default()
    };
    for i in 0..batches {
        let (mut d, _) = random_batch(&mut g, spec);
        if support.empty_drafts {
            for k in &mut d.k {
                if g.chance(1, 4) {
                    *k = 0;
                }
            }
        }
        let logits: Vec<f32> = d
            .target_probs
            .iter()
            .map(|_| 6.0 * g.unit() - 3.0)
            .collect();
        let temps: Vec<f32> = (0..d.requests())
            .map(|_| if g.chance(1, 3) { 0.0 } else { 0.1 + g.unit() })
            .collect();
        let batch = d.view().with_target_logits(Logits {
            values: &logits,
            temperature: &temps,
        });
        let m = METHODS[i % 3];
        if !support.logits {
            let before = v.totals().unwrap();
            let mut out = OutData::new(d.requests(), d.k_max);
            let e = v.verify(m, Check::Cheap, &batch, &mut out.view());
            let want = VerifyError::Unsupported {
                feature: Feature::Logits,
            };
            assert_eq!(e, Err(V::Error::from(want)), "logits");
            assert_eq!(
                v.totals().unwrap(),
                before,
                "logits refused: nothing counted"
            );
            return;
        }
        let what = format!("logits batch {i}");
        let (out, c) = assert_view_matches_reference(&mut v, m, Check::STRICT, &batch, &what)
            .expect("a valid logits batch");
        assert_well_formed(&d, &out, &c);
    }
}

/// Mixed drafters ([`Batch::with_mixed_drafters`]): requests with draft rows next to requests
/// without (one-hot drafters), the rows packed in another order than the requests'. Each
/// request's outputs are those of the same request in the batch where every request has its
/// rows (if it has them here) or where none has (if not), and the counts are the sum of each
/// request's; the verifier's bits are the reference's. A first row past the tensor, or a
/// `first_row` of the wrong length, is refused with nothing written or counted.
pub fn mixed_drafters<V: Verifier<K>>(mut make: impl FnMut() -> V, seed: u64, batches: usize) {
    let mut v = make();
    let mut g = Gen(seed);
    let spec = RandomSpec {
        garbage: false,
        ..RandomSpec::default()
    };
    for i in 0..batches {
        let (mut d, _) = random_batch(&mut g, spec);
        let (b, km, ds) = (d.requests(), d.k_max, d.draft_stride);
        let full = d.draft_probs.take().unwrap_or_else(|| {
            let mut rows = vec![0.0; b * km * ds];
            for r in rows.chunks_exact_mut(ds) {
                let sh = shape(&mut g);
                random_row(&mut g, &mut r[..d.vocab], sh);
            }
            rows
        });
        let none = d.clone();
        let mut all = d.clone();
        all.draft_probs = Some(full.clone());
        // Requests with rows, packed last request first (any order is allowed).
        let has: Vec<bool> = (0..b).map(|_| g.chance(1, 2)).collect();
        let mut packed = Vec::new();
        let mut first = vec![NO_DRAFT_ROWS; b];
        for r in (0..b).rev().filter(|&r| has[r]) {
            first[r] = u32::try_from(packed.len() / ds).unwrap();
            packed.extend_from_slice(&full[r * km * ds..(r + 1) * km * ds]);
        }
        let m = METHODS[i % 3];
        let check = if i % 2 == 0 {
            Check::Cheap
        } else {
            Check::STRICT
        };
        let (want_all, _) = reference(m, check, &all).expect("valid with every row");
        let (want_none, _) = reference(m, check, &none).expect("valid without rows");
        let mut want = OutData::new(b, km);
        let mut counted = Counters::<K>::ZERO;
        let w = km + 1;
        for (r, &with) in has.iter().enumerate() {
            let src = if with { &want_all } else { &want_none };
            want.accepted[r] = src.accepted[r];
            want.tokens[r * w..(r + 1) * w].copy_from_slice(&src.tokens[r * w..(r + 1) * w]);
            if d.k[r] > 0 {
                counted
                    .record(d.k[r] as usize, src.accepted[r] as usize)
                    .unwrap();
            }
        }
        let batch = d.view().with_mixed_drafters(Rows::f32(&packed, ds), &first);
        let what = format!("mixed drafters batch {i} ({m:?}, {has:?})");
        let (out, c) = assert_view_matches_reference(&mut v, m, check, &batch, &what)
            .expect("a valid mixed batch");
        assert_eq!(out, want, "{what}: each request as its own drafter's");
        assert_eq!(c, counted, "{what}: counts");
        // Refused: a first row past the tensor, and a first-row slice of the wrong length.
        if let Some(r) = (0..b).find(|&r| has[r]) {
            let mut past = first.clone();
            past[r] = u32::try_from(packed.len() / ds).unwrap();
            let bad = d.view().with_mixed_drafters(Rows::f32(&packed, ds), &past);
            let before = v.totals().unwrap();
            let mut o = OutData::new(b, km);
            let want_e = validate::<K>(m, Check::Cheap, &bad, &OutData::new(b, km).view())
                .expect_err("a row past the tensor");
            assert!(
                matches!(
                    want_e,
                    VerifyError::Length {
                        param: Param::DraftProbs,
                        ..
                    }
                ),
                "{what}: {want_e:?}"
            );
            let e = v.verify(m, Check::Cheap, &bad, &mut o.view());
            assert_eq!(
                e,
                Err(V::Error::from(want_e)),
                "{what}: a row past the tensor"
            );
            assert_eq!(o, OutData::new(b, km), "{what}: nothing written");
            assert_eq!(v.totals().unwrap(), before, "{what}: nothing counted");
        }
        let short = &first[..b - 1];
        let bad = d.view().with_mixed_drafters(Rows::f32(&packed, ds), short);
        let mut o = OutData::new(b, km);
        assert_eq!(
            v.verify(m, Check::Cheap, &bad, &mut o.view()),
            Err(V::Error::from(VerifyError::Length {
                param: Param::DraftFirstRow,
                len: b - 1,
                expected: b,
            }))
        );
    }
}

/// The bit patterns of `x` rounded to bf16 (`half`'s round-to-nearest-even).
pub fn to_bf16(x: &[f32]) -> Vec<u16> {
    x.iter()
        .map(|&v| half::bf16::from_f32(v).to_bits())
        .collect()
}

/// The bit patterns of `x` rounded to f16.
pub fn to_f16(x: &[f32]) -> Vec<u16> {
    x.iter()
        .map(|&v| half::f16::from_f32(v).to_bits())
        .collect()
}

/// Random logits in place of `d`'s target rows (a long tail, a few masked ids at `-inf`,
/// coarse steps so that ties occur), and per-request temperatures mixing 0 (greedy) and
/// `(0.1, 1.5)`.
pub fn random_logits(g: &mut Gen, d: &BatchData) -> (Vec<f32>, Vec<f32>) {
    let l = d
        .target_probs
        .iter()
        .map(|_| {
            if g.chance(1, 100) {
                f32::NEG_INFINITY
            } else {
                (16.0 * (g.unit() + 1e-6).ln()).round() / 4.0
            }
        })
        .collect();
    let t = (0..d.requests())
        .map(|_| {
            if g.chance(1, 4) {
                0.0
            } else {
                0.1 + 1.4 * g.unit()
            }
        })
        .collect();
    (l, t)
}

/// Random per-request sampling filters for `b` requests over vocabulary `vocab`: each part on
/// or off independently, top-k from 1 to past `V`, top-p from 0.05 to 1, min-p up to 0.5.
pub fn random_filters(g: &mut Gen, b: usize, vocab: usize) -> (Vec<u32>, Vec<f32>, Vec<f32>) {
    let top_k = (0..b)
        .map(|_| match g.below(4) {
            0 => 0,
            1 => 1,
            2 => 1 + g.below(vocab) as u32,
            _ => vocab as u32 + g.below(3) as u32,
        })
        .collect();
    let top_p = (0..b)
        .map(|_| match g.below(4) {
            0 => 1.0,
            1 => 0.9,
            2 => 0.05 + 0.95 * g.unit(),
            _ => 0.05,
        })
        .collect();
    let min_p = (0..b)
        .map(|_| match g.below(3) {
            0 => 0.0,
            1 => 0.5 * g.unit(),
            _ => 0.05,
        })
        .collect();
    (top_k, top_p, min_p)
}

/// The per-request [`Filter`](specula_core::verify::Filter)s of `n` requests from the parts
/// given (`None`: that part off for every request), or `None` if no part is given: an
/// engine's separate per-parameter slices as one batch input.
pub fn filters_of(
    n: usize,
    top_k: Option<&[u32]>,
    top_p: Option<&[f32]>,
    min_p: Option<&[f32]>,
) -> Option<Vec<specula_core::verify::Filter>> {
    if top_k.is_none() && top_p.is_none() && min_p.is_none() {
        return None;
    }
    let f = specula_core::verify::Filter::NONE;
    Some(
        (0..n)
            .map(|b| {
                f.with_top_k(top_k.map_or(f.top_k, |x| x[b]))
                    .with_top_p(top_p.map_or(f.top_p, |x| x[b]))
                    .with_min_p(min_p.map_or(f.min_p, |x| x[b]))
            })
            .collect(),
    )
}

/// [`filters_of`] with each part of `parts` (top-k, top-p, min-p) on with its chance
/// ([`Gen::chance`]'s numerator and denominator, drawn in that order).
pub fn some_filters(
    g: &mut Gen,
    (top_k, top_p, min_p): (&[u32], &[f32], &[f32]),
    chances: [(usize, usize); 3],
) -> Option<Vec<specula_core::verify::Filter>> {
    let [k, p, m] = chances.map(|(n, d)| g.chance(n, d));
    filters_of(
        top_k.len(),
        k.then_some(top_k),
        p.then_some(top_p),
        m.then_some(min_p),
    )
}

/// Sampling inputs (issue 13): per-request top-k / top-p / min-p on the probability and the
/// logits paths, binary32 / bf16 / f16 logits and draft probabilities, temperatures mixing 0
/// (greedy) and `> 0`, a method per request: against the reference bit for bit where the backend supports them
/// ([`Support::filters`](specula_core::verify::Support), `half`, `logits`), elsewhere the typed
/// error with nothing counted.
pub fn sampling_inputs<V: Verifier<K>>(mut make: impl FnMut() -> V, seed: u64, batches: usize) {
    let mut v = make();
    let mut g = Gen(seed);
    let spec = RandomSpec {
        garbage: false,
        ..RandomSpec::default()
    };
    for i in 0..batches {
        let (d, _) = random_batch(&mut g, spec);
        let n = d.requests();
        let (top_k, top_p, min_p) = random_filters(&mut g, n, d.vocab);
        let logits: Vec<f32> = d
            .target_probs
            .iter()
            .map(|_| {
                if g.chance(1, 40) {
                    f32::NEG_INFINITY
                } else {
                    // Coarse values make ties, which the filters must keep together.
                    (8.0 * g.unit()).round() * 0.5 - 3.0
                }
            })
            .collect();
        let temps: Vec<f32> = (0..n)
            .map(|_| if g.chance(1, 4) { 0.0 } else { 0.2 + g.unit() })
            .collect();
        let (lb, lh) = (to_bf16(&logits), to_f16(&logits));
        let draft_half = d.draft_probs.as_ref().map(|p| (to_bf16(p), to_f16(p)));
        let mut batch = d.view();
        let mut check = Check::STRICT;
        match g.below(4) {
            0 => {}
            1 => {
                batch = batch.with_target_logits(Logits {
                    values: &logits,
                    temperature: &temps,
                });
            }
            2 => {
                batch = batch.with_target_logits_half(HalfLogits {
                    values: Half::Bf16(&lb),
                    temperature: &temps,
                });
            }
            _ => {
                batch = batch.with_target_logits_half(HalfLogits {
                    values: Half::F16(&lh),
                    temperature: &temps,
                });
            }
        }
        if let Some((b16, f16)) = &draft_half {
            match g.below(3) {
                0 => {}
                1 => batch = batch.with_draft_probs_half(Half::Bf16(b16)),
                _ => batch = batch.with_draft_probs_half(Half::F16(f16)),
            }
            if batch.draft.is_some_and(|d| d.rows.as_half().is_some()) {
                // Rounded rows sum to 1 within a few 2⁻⁸ only.
                check = Check::Strict {
                    sum_tolerance: 0.05,
                };
            }
        }
        let filters = some_filters(&mut g, (&top_k, &top_p, &min_p), [(3, 4), (3, 4), (1, 2)]);
        if let Some(f) = &filters {
            batch = batch.with_filters(f);
        }
        let methods: Vec<Method> = (0..n).map(|_| METHODS[g.below(3)]).collect();
        if g.chance(1, 3) {
            batch = batch.with_methods(&methods);
        }
        let m = METHODS[i % 3];
        let what = format!("sampling batch {i}");
        if let Some((out, c)) = assert_view_matches_reference(&mut v, m, check, &batch, &what) {
            assert_well_formed(&d, &out, &c);
        }
    }
}
