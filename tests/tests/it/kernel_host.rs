//! The GPU kernel text, executed on the host (CUDA-macro and HIP-macro modes), against the Rust
//! reference: outputs and counters must be bit-identical for every batch.

use specula_core::Counters;
use specula_core::gpu::kernels::{self, ERR_DRAFT_LEN, ERR_SHAPE, ERR_TOKEN};
use specula_core::gpu::{ArgBlock, Family};
use specula_core::verify::{
    Batch, Check, Dims, Drafts, Method, Outputs, Reference, Rows, Streams, Strides, Verifier,
    VerifyError,
};
use specula_tests::conformance::Gen;
use specula_tests::kernel_host::{KernelHost, KernelHostError, Mode, at, at_mut};

const K: usize = 8;

/// An owned batch: probabilities shaped like real ones (peaked, normalised) or hostile ones
/// (NaN, ±0, negative, ∞, exact ties, subnormals, values > 1), odd vocabularies and strides
/// that misalign rows (scalar path) or keep them 16-byte aligned (float4 path).
struct Owned {
    vocab: usize,
    k_max: usize,
    k: Vec<u32>,
    ids: Vec<u32>,
    draft: Option<Vec<f32>>,
    dstride: usize,
    target: Vec<f32>,
    tstride: usize,
    seed: Vec<u64>,
    offset: Vec<u64>,
    eps: Option<Vec<f32>>,
    delta: Option<Vec<f32>>,
}

fn row(g: &mut Gen, v: usize, hostile: bool, out: &mut [f32]) {
    let peak = g.below(v);
    let mut sum = 0.0f32;
    for (i, p) in out.iter_mut().enumerate().take(v) {
        let x = g.unit();
        *p = if i == peak { 4.0 + x * 8.0 } else { x * x * x };
        sum += *p;
    }
    for p in out.iter_mut().take(v) {
        *p /= sum;
    }
    if hostile {
        for _ in 0..1 + g.below(4) {
            let i = g.below(v);
            out[i] = match g.below(9) {
                0 => f32::NAN,
                1 => -0.0,
                2 => 0.0,
                3 => -0.25,
                4 => f32::INFINITY,
                5 => out[peak], // exact tie with the peak
                6 => 1e-40,     // subnormal: no entropy term
                7 => 3.5,       // not a probability
                _ => f32::NEG_INFINITY,
            };
        }
        if g.below(6) == 0 {
            out[..v].fill(0.0); // nothing to sample from
        }
    }
}

fn gen_batch(g: &mut Gen) -> Owned {
    let vocab = match g.below(6) {
        0 => 1 + g.below(4),
        1 => 4 * (1 + g.below(16)),
        2 => 257,
        3 => 1000 + g.below(100),
        _ => 5 + g.below(200),
    };
    let pad = |g: &mut Gen| match g.below(3) {
        0 => 0,
        1 => (4 - vocab % 4) % 4, // aligned rows (float4 path)
        _ => 1 + g.below(5),
    };
    let tstride = vocab + pad(g);
    let dstride = vocab + pad(g);
    let k_max = 1 + g.below(K);
    let b = 1 + g.below(12);
    let hostile = g.below(3) == 0;
    let k: Vec<u32> = (0..b).map(|_| 1 + g.below(k_max) as u32).collect();
    let mut target = vec![0.0f32; b * (k_max + 1) * tstride];
    for r in target.chunks_exact_mut(tstride) {
        row(g, vocab, hostile, r);
    }
    let draft = (g.below(2) == 0).then(|| {
        let mut d = vec![0.0f32; b * k_max * dstride];
        for r in d.chunks_exact_mut(dstride) {
            row(g, vocab, hostile, r);
        }
        d
    });
    // Draft ids: often the target's argmax (so greedy and typical accept some), else random.
    let mut ids = vec![0u32; b * k_max];
    for r in 0..b {
        for j in 0..k_max {
            let t = &target[(r * (k_max + 1) + j) * tstride..][..vocab];
            ids[r * k_max + j] = if g.below(3) > 0 {
                specula_core::verify::argmax(t)
            } else {
                g.below(vocab) as u32
            };
        }
    }
    let typical_params = g.below(2) == 0;
    Owned {
        vocab,
        k_max,
        k,
        ids,
        draft,
        dstride,
        target,
        tstride,
        seed: (0..b).map(|_| g.next_u64()).collect(),
        offset: (0..b).map(|_| g.next_u64() >> g.below(64)).collect(),
        eps: typical_params.then(|| (0..b).map(|_| g.unit() * 0.3).collect()),
        delta: typical_params.then(|| (0..b).map(|_| g.unit()).collect()),
    }
}

impl Owned {
    fn batch(&self) -> Batch<'_> {
        let mut b = Batch::dense(
            Dims {
                vocab: self.vocab,
                k_max: self.k_max,
            },
            Drafts {
                k: &self.k,
                ids: &self.ids,
            },
            &self.target,
            Streams {
                seed: &self.seed,
                offset: &self.offset,
            },
        )
        .with_strides(Strides {
            draft: self.dstride,
            target: self.tstride,
        });
        if let Some(d) = self.draft.as_deref() {
            b = b.with_draft(Rows::f32(d, self.dstride));
        }
        b.eps = self.eps.as_deref();
        b.delta = self.delta.as_deref();
        b
    }
}

fn run<V: Verifier<K>>(v: &mut V, method: Method, o: &Owned) -> (Vec<u32>, Vec<u32>)
where
    V::Error: core::fmt::Debug,
{
    let b = o.k.len();
    let mut accepted = vec![0xAAAA_AAAA; b];
    let mut tokens = vec![0xAAAA_AAAA; b * (o.k_max + 1)];
    let mut out = Outputs::new(
        specula_core::verify::AcceptedOut(&mut accepted),
        specula_core::verify::TokensOut(&mut tokens),
    );
    v.verify(method, Check::Cheap, &o.batch(), &mut out)
        .expect("valid batch");
    (accepted, tokens)
}

const METHODS: [Method; 3] = [Method::Rejection, Method::Greedy, Method::Typical];

/// Every (mode, block size) the host build allows, including a single-warp block, and the
/// split entry (rows over several blocks per request) in both modes.
fn hosts() -> Vec<KernelHost<K>> {
    let mut v = Vec::new();
    for (mode, blocks) in [(Mode::Cuda, [32u32, 128]), (Mode::Hip, [64, 128])] {
        for block in blocks {
            v.push(KernelHost::new(mode, block).unwrap());
        }
    }
    v.push(KernelHost::with_slices(Mode::Cuda, 32, 3).unwrap());
    v.push(KernelHost::with_slices(Mode::Hip, 64, 2).unwrap());
    v
}

#[test]
fn kernel_text_matches_the_reference_bit_for_bit() {
    let mut g = Gen(0x5EC0_1A7E);
    let mut hosts = hosts();
    let mut reference = Reference::<K>::new();
    let batches = 40;
    let mut identical = 0usize;
    let mut accepted_total = 0u64;
    for i in 0..batches {
        let o = gen_batch(&mut g);
        for method in METHODS {
            let want = run(&mut reference, method, &o);
            accepted_total += want.0.iter().map(|&a| u64::from(a)).sum::<u64>();
            for h in &mut hosts {
                let got = run(h, method, &o);
                assert!(h.scratch_is_clear(), "split scratch left dirty");
                assert_eq!(
                    got,
                    want,
                    "batch {i} {method:?} mode {:?} slices {}: V={} k_max={} draft={} strides {}/{}",
                    h.mode(),
                    h.slices(),
                    o.vocab,
                    o.k_max,
                    o.draft.is_some(),
                    o.dstride,
                    o.tstride
                );
                identical += 1;
            }
        }
    }
    let want = reference.totals().unwrap();
    for h in &mut hosts {
        assert_eq!(h.totals().unwrap(), want, "counters, mode {:?}", h.mode());
        assert_eq!(h.error_flags(), 0);
    }
    // The inputs must exercise both outcomes, or the comparison proves little.
    assert!(accepted_total > 0 && want.accepted_tokens < want.draft_tokens);
    println!("{identical} (batch, method, mode, block) runs bit-identical over {batches} batches");
}

#[test]
fn large_vocabulary_rows_match() {
    // One realistic-size row set: V = 32003 (odd: whole float4 groups plus a tail).
    let mut g = Gen(7);
    let vocab = 32_003;
    let k_max = 4;
    let b = 2;
    let tstride = vocab + 1; // row 1 onwards misaligned: the scalar path on some rows
    let mut target = vec![0.0f32; b * (k_max + 1) * tstride];
    for r in target.chunks_exact_mut(tstride) {
        row(&mut g, vocab, false, r);
    }
    let ids: Vec<u32> = (0..b * k_max).map(|_| g.below(vocab) as u32).collect();
    let o = Owned {
        vocab,
        k_max,
        k: vec![4, 3],
        ids,
        draft: None,
        dstride: vocab,
        target,
        tstride,
        seed: vec![1, 2],
        offset: vec![3, u64::MAX],
        eps: None,
        delta: None,
    };
    let mut reference = Reference::<K>::new();
    let mut host = KernelHost::<K>::new(Mode::Hip, 128).unwrap();
    for method in METHODS {
        assert_eq!(
            run(&mut host, method, &o),
            run(&mut reference, method, &o),
            "{method:?}"
        );
    }
    assert_eq!(host.totals().unwrap(), reference.totals().unwrap());
}

#[test]
fn invalid_batches_are_refused_like_the_reference() {
    let mut g = Gen(11);
    let mut o = gen_batch(&mut g);
    o.ids[0] = o.vocab as u32; // out of range
    let mut host = KernelHost::<K>::new(Mode::Cuda, 64).unwrap();
    let mut reference = Reference::<K>::new();
    let b = o.k.len();
    let (mut a1, mut t1) = (vec![7u32; b], vec![7u32; b * (o.k_max + 1)]);
    let (mut a2, mut t2) = (a1.clone(), t1.clone());
    let e1 = host.verify(
        Method::Greedy,
        Check::Cheap,
        &o.batch(),
        &mut Outputs::new(
            specula_core::verify::AcceptedOut(&mut a1),
            specula_core::verify::TokensOut(&mut t1),
        ),
    );
    let e2 = reference.verify(
        Method::Greedy,
        Check::Cheap,
        &o.batch(),
        &mut Outputs::new(
            specula_core::verify::AcceptedOut(&mut a2),
            specula_core::verify::TokensOut(&mut t2),
        ),
    );
    let e2 = e2.unwrap_err();
    assert!(matches!(e2, VerifyError::TokenOutOfRange { .. }), "{e2:?}");
    assert_eq!(e1, Err(KernelHostError::Verify(e2)));
    assert_eq!((a1, t1), (a2, t2), "outputs untouched");
    assert!(host.totals().unwrap().is_zero());
    assert!(matches!(
        KernelHost::<K>::new(Mode::Hip, 32),
        Err(KernelHostError::BadBlock {
            block: 32,
            warp: 64
        })
    ));
}

/// The additive entry points' own guards (ragged layout, caller's bonus tokens), launched raw:
/// a decreasing cumulative count (DRAFT_LEN) and a bonus token >= V (TOKEN) skip their request;
/// the valid neighbours, one of them k = 0, emit their bonus tokens and are counted as usual.
#[test]
fn ex_entries_skip_bad_ragged_requests_and_flag_them() {
    for (mode, slices) in [
        (Mode::Cuda, 1),
        (Mode::Hip, 1),
        (Mode::Cuda, 3),
        (Mode::Hip, 2),
    ] {
        let mut host = KernelHost::<K>::with_slices(mode, 64, slices).unwrap();
        let (vocab, k_max) = (6u32, 2u32);
        // k = 2, 0, then cu decreases (request 2), then k = 1 with a bonus token >= V (request 3).
        let cu = [2u32, 2, 1, 3];
        let ids = [5u32, 5, 5];
        let bonus = [3u32, 4, 0, 1_000];
        // With bonus tokens the ragged target has num_tokens = 3 rows (no bonus rows).
        let mut target = vec![0.0f32; 3 * vocab as usize];
        for r in target.chunks_exact_mut(vocab as usize) {
            r[5] = 1.0;
        }
        let seeds = [1u64; 4];
        let offsets = [0u64; 4];
        let mut accepted = [9u32; 4];
        let mut tokens = [9u32; 12];
        let shape = kernels::shape_words(4, k_max, vocab, None, vocab, 1, K as u32);
        // SAFETY: cu, bonus, seeds, offsets and the outputs hold B = 4 values (tokens B (k_max +
        // 1)), ids and target num_tokens = 3 (the kernel reads no more for valid requests and
        // only cu and bonus for the skipped ones); `k` is not read in the ragged layout.
        let rc = unsafe {
            host.launch_raw(
                4,
                &shape,
                Family::Plain,
                ArgBlock {
                    draft_ids: at(&ids),
                    target_probs: at(&target),
                    seed: at(&seeds),
                    offset: at(&offsets),
                    accepted: at_mut(&mut accepted),
                    tokens: at_mut(&mut tokens),
                    cu_num_draft_tokens: at(&cu),
                    bonus: at(&bonus),
                    ..ArgBlock::default()
                },
            )
        };
        assert_eq!(rc, 0);
        assert_eq!(
            host.error_flags(),
            ERR_DRAFT_LEN | ERR_TOKEN,
            "{mode:?} {slices}"
        );
        assert!(host.scratch_is_clear());
        assert_eq!(accepted, [2, 0, u32::MAX, u32::MAX], "{mode:?} {slices}");
        // Request 0 accepts both drafts (argmax 5), then its bonus 3; request 1 (k = 0): bonus 4.
        assert_eq!(&tokens[..6], &[5, 5, 3, 4, u32::MAX, u32::MAX]);
        assert!(tokens[6..].iter().all(|&t| t == u32::MAX));
        let mut want = Counters::<K>::ZERO;
        want.record(2, 2).unwrap();
        assert_eq!(host.totals().unwrap(), want, "only request 0 counted");
    }
}

/// The kernel's own guards, reached by launching it on unvalidated arguments as a device would
/// be: a bad request is skipped (sentinels, not counted, flag raised), its neighbours are not;
/// a request with `k = 0` is valid (only its bonus token, not counted).
#[test]
fn kernel_skips_bad_requests_and_flags_them() {
    // One block per request, and the split entry (rows over 3 / 2 blocks per request).
    for (mode, slices) in [
        (Mode::Cuda, 1),
        (Mode::Hip, 1),
        (Mode::Cuda, 3),
        (Mode::Hip, 2),
    ] {
        let mut host = KernelHost::<K>::with_slices(mode, 64, slices).unwrap();
        let (vocab, k_max, b) = (6u32, 2u32, 4usize);
        let k = [2u32, 0, 3, 1]; // request 1: k = 0 (valid); request 2: k > k_max
        let mut ids = vec![1u32; b * k_max as usize];
        ids[6] = 1_000_000; // request 3, position 0: id >= V
        ids[0] = 5; // request 0 stays valid and accepts both (argmax 5)
        ids[1] = 5;
        let mut target = vec![0.0f32; b * (k_max as usize + 1) * vocab as usize];
        for r in target.chunks_exact_mut(vocab as usize) {
            r[5] = 1.0;
        }
        let seeds = [1u64; 4];
        let offsets = [0u64; 4];
        let mut accepted = [9u32; 4];
        let mut tokens = [9u32; 12];
        let shape = kernels::shape_words(4, k_max, vocab, None, vocab, 1, K as u32);
        // The inputs of every launch below (eps, delta and draft rows null).
        let inputs = ArgBlock {
            k: at(&k),
            draft_ids: at(&ids),
            target_probs: at(&target),
            seed: at(&seeds),
            offset: at(&offsets),
            ..ArgBlock::default()
        };
        // SAFETY: every buffer is sized for B = 4, k_max = 2, V = stride = 6; eps/delta are not
        // read by greedy; draft probs are absent (flag clear).
        let rc = unsafe {
            host.launch_raw(
                4,
                &shape,
                Family::Plain,
                ArgBlock {
                    accepted: at_mut(&mut accepted),
                    tokens: at_mut(&mut tokens),
                    ..inputs
                },
            )
        };
        assert_eq!(rc, 0);
        assert_eq!(
            host.error_flags(),
            ERR_DRAFT_LEN | ERR_TOKEN,
            "{mode:?} {slices}"
        );
        assert!(host.scratch_is_clear());
        assert_eq!(accepted, [2, 0, u32::MAX, u32::MAX]);
        assert_eq!(&tokens[..3], &[5, 5, 5]);
        // Request 1 (k = 0): only its bonus, the argmax of its row 0.
        assert_eq!(&tokens[3..6], &[5, u32::MAX, u32::MAX]);
        assert!(tokens[6..].iter().all(|&t| t == u32::MAX));
        let mut want = Counters::<K>::ZERO;
        want.record(2, 2).unwrap();
        assert_eq!(
            host.totals().unwrap(),
            want,
            "only request 0 counted (k = 0 is not)"
        );

        // A shape the kernel cannot honour (k_max > K): nothing runs, nothing is written.
        let bad = kernels::shape_words(4, K as u32 + 1, vocab, None, vocab, 1, K as u32);
        let mut accepted2 = [9u32; 4];
        // SAFETY: the kernel rejects the shape before reading any per-request buffer.
        let rc = unsafe {
            host.launch_raw(
                4,
                &bad,
                Family::Plain,
                ArgBlock {
                    accepted: at_mut(&mut accepted2),
                    tokens: at_mut(&mut tokens),
                    ..inputs
                },
            )
        };
        assert_eq!(rc, 0);
        assert_ne!(host.error_flags() & ERR_SHAPE, 0);
        assert_eq!(accepted2, [9; 4]);
        assert_eq!(host.totals().unwrap(), want);

        // A batch above the launch's capacity (4 requests, grid 3): refused as a whole with the
        // shape bit, never silently cut to the first three.
        let mut host = KernelHost::<K>::with_slices(mode, 64, slices).unwrap();
        let mut accepted3 = [9u32; 4];
        // SAFETY: as above; the kernel rejects the shape before reading any per-request buffer.
        let rc = unsafe {
            host.launch_raw(
                3,
                &shape,
                Family::Plain,
                ArgBlock {
                    accepted: at_mut(&mut accepted3),
                    tokens: at_mut(&mut tokens),
                    ..inputs
                },
            )
        };
        assert_eq!(rc, 0);
        assert_eq!(host.error_flags(), ERR_SHAPE, "{mode:?} {slices}");
        assert_eq!(accepted3, [9; 4]);
        assert_eq!(host.totals().unwrap(), Counters::ZERO);
    }
}

/// Results do not depend on where a request sits in the batch or what else is in it.
#[test]
fn results_are_batch_invariant() {
    let mut g = Gen(99);
    let mut o = gen_batch(&mut g);
    while o.k.len() < 3 {
        o = gen_batch(&mut g);
    }
    let mut host = KernelHost::<K>::new(Mode::Hip, 128).unwrap();
    for method in METHODS {
        let (acc, tok) = run(&mut host, method, &o);
        // The last request alone, as a batch of one.
        let last = o.k.len() - 1;
        let w = o.k_max + 1;
        let single = Owned {
            vocab: o.vocab,
            k_max: o.k_max,
            k: vec![o.k[last]],
            ids: o.ids[last * o.k_max..].to_vec(),
            draft: o
                .draft
                .as_ref()
                .map(|d| d[last * o.k_max * o.dstride..].to_vec()),
            dstride: o.dstride,
            target: o.target[last * w * o.tstride..].to_vec(),
            tstride: o.tstride,
            seed: vec![o.seed[last]],
            offset: vec![o.offset[last]],
            eps: o.eps.as_ref().map(|e| vec![e[last]]),
            delta: o.delta.as_ref().map(|d| vec![d[last]]),
        };
        let (acc1, tok1) = run(&mut host, method, &single);
        assert_eq!(acc1[0], acc[last]);
        assert_eq!(&tok1[..], &tok[last * w..]);
    }
}

/// The shared conformance suite on the kernel text, whole (`conformance::run_all`: 10 000
/// random batches among its parts), CUDA-macro mode, two warps a block. (A few seconds: the
/// shim runs a GPU thread as a fiber, see tests/kernel_host/shim.hpp.)
#[test]
fn conformance_cuda_macros() {
    specula_tests::conformance::run_all(|| KernelHost::<K>::new(Mode::Cuda, 64).unwrap());
}

/// The same, HIP-macro mode, one 64-wide wave a block.
#[test]
fn conformance_hip_macros() {
    specula_tests::conformance::run_all(|| KernelHost::<K>::new(Mode::Hip, 64).unwrap());
}

/// The split entry (each request's rows over 3 blocks, last-block ticket), CUDA-macro mode:
/// the suite's exact, error and batch-invariance cases and 3 000 random batches.
#[test]
fn conformance_cuda_macros_rows_split() {
    split_conformance(|| KernelHost::<K>::with_slices(Mode::Cuda, 64, 3).unwrap());
}

/// The split entry over 2 blocks per request, HIP-macro mode.
#[test]
fn conformance_hip_macros_rows_split() {
    split_conformance(|| KernelHost::<K>::with_slices(Mode::Hip, 64, 2).unwrap());
}

fn split_conformance(make: impl FnMut() -> KernelHost<K> + Copy) {
    use specula_tests::conformance as c;
    c::exact_cases(make);
    c::error_cases(make);
    c::batch_invariance(make, 0x1A7_0012);
    c::matches_reference_on_random_batches(make, 0x5EED_0013, 3_000);
}

/// What a captured CUDA graph relies on: one fixed launch (grid = capacity, the same buffers)
/// repeated while only the buffers' contents change — batch size, `k`, seeds, offsets, even the
/// method, through the shape words — gives the reference's results for the live requests, leaves
/// the output slots past the batch untouched and counts exactly the live requests.
#[test]
fn fixed_launch_repeated_with_new_buffer_contents() {
    use specula_tests::conformance as c;
    const CAP: usize = 8;
    const SENTINEL: u32 = 0xDEAD_BEEF;
    for (mode_i, mode) in [Mode::Cuda, Mode::Hip].into_iter().enumerate() {
        let mut host = KernelHost::<K>::new(mode, 64).unwrap();
        let mut g = c::Gen(0x7E_91A7 + mode_i as u64);
        let pool = c::full_layout_batch(&mut g, CAP);
        let (km, ds, ts) = (pool.k_max, pool.draft_stride, pool.target_stride);
        // The "device buffers", allocated once for CAP requests and never moved.
        let mut k = [0u32; CAP];
        let mut ids = vec![0u32; CAP * km];
        let mut draft = vec![0f32; CAP * km * ds];
        let mut target = vec![0f32; CAP * (km + 1) * ts];
        let (mut seed, mut offset) = ([0u64; CAP], [0u64; CAP]);
        let (mut eps, mut delta) = ([0f32; CAP], [0f32; CAP]);
        let mut accepted = [0u32; CAP];
        let mut tokens = vec![0u32; CAP * (km + 1)];
        let mut want = Counters::<K>::ZERO;
        for i in 0..40 {
            let d = c::vary(&mut g, &pool);
            let n = d.requests();
            let m = METHODS[i % 3];
            // New contents in the front of the same buffers; stale requests stay behind them.
            k[..n].copy_from_slice(&d.k);
            ids[..n * km].copy_from_slice(&d.draft_ids);
            draft[..n * km * ds].copy_from_slice(d.draft_probs.as_ref().unwrap());
            target[..n * (km + 1) * ts].copy_from_slice(&d.target_probs);
            seed[..n].copy_from_slice(&d.seed);
            offset[..n].copy_from_slice(&d.offset);
            eps[..n].copy_from_slice(d.eps.as_ref().unwrap());
            delta[..n].copy_from_slice(d.delta.as_ref().unwrap());
            accepted.fill(SENTINEL);
            tokens.fill(SENTINEL);
            let shape = kernels::batch_shape::<K>(m, &d.view()).unwrap();
            // SAFETY: every buffer holds CAP requests of this layout; the shape names n ≤ CAP.
            let rc = unsafe {
                host.launch_raw(
                    CAP as u32,
                    &shape,
                    Family::Plain,
                    ArgBlock {
                        k: at(&k),
                        draft_ids: at(&ids),
                        draft_probs: at(&draft),
                        target_probs: at(&target),
                        seed: at(&seed),
                        offset: at(&offset),
                        eps: at(&eps),
                        delta: at(&delta),
                        accepted: at_mut(&mut accepted),
                        tokens: at_mut(&mut tokens),
                        ..ArgBlock::default()
                    },
                )
            };
            assert_eq!(rc, 0);
            let (r, counted) = c::reference(m, Check::Cheap, &d).unwrap();
            let what = format!("{mode:?} launch {i}: {m:?}, {n} live requests");
            assert_eq!(&accepted[..n], &r.accepted[..], "{what}");
            assert_eq!(&tokens[..n * (km + 1)], &r.tokens[..], "{what}");
            assert!(accepted[n..].iter().all(|&a| a == SENTINEL), "{what}");
            assert!(
                tokens[n * (km + 1)..].iter().all(|&t| t == SENTINEL),
                "{what}"
            );
            want.add(&counted);
            assert_eq!(host.totals().unwrap(), want, "{what}");
            assert_eq!(host.error_flags(), 0, "{what}");
        }
    }
}

/// Target logits with per-request temperature (0 = greedy) on the kernel text
/// (`specula_verify_logits` / `specula_verify_split_logits`): the conformance suite's logits
/// cases, bit for bit against the reference, both macro modes, both entries.
#[test]
fn logits_conformance_both_modes_both_entries() {
    use specula_tests::conformance as c;
    c::target_logits(
        || KernelHost::<K>::new(Mode::Cuda, 64).unwrap(),
        0x106_1001,
        300,
    );
    c::target_logits(
        || KernelHost::<K>::new(Mode::Hip, 64).unwrap(),
        0x106_1002,
        300,
    );
    c::target_logits(
        || KernelHost::<K>::with_slices(Mode::Cuda, 64, 3).unwrap(),
        0x106_1003,
        200,
    );
    c::target_logits(
        || KernelHost::<K>::with_slices(Mode::Hip, 64, 2).unwrap(),
        0x106_1004,
        200,
    );
    // Filters, half inputs and a method per request too (tests/tests/it/kernel_host_inputs.rs runs
    // them on every host).
    c::sampling_inputs(
        || KernelHost::<K>::new(Mode::Cuda, 64).unwrap(),
        0x5A3_1005,
        60,
    );
}

/// Logits at the sizes users run (V = 32 003 with a misaligned stride, V = 151 936), every
/// method, temperatures 0 (greedy), 0.7 and 1.3, with and without draft probabilities, one
/// block and rows split over 3 blocks: bit for bit against the reference.
#[test]
fn large_vocabulary_logits_match() {
    use specula_core::verify::Logits;
    for (vocab, tstride) in [(32_003usize, 32_004usize), (151_936, 151_936)] {
        let mut g = Gen(vocab as u64);
        let k_max = 3;
        let b = 3;
        let logits: Vec<f32> = (0..b * (k_max + 1) * tstride)
            .map(|_| 12.0 * g.unit() - 9.0)
            .collect();
        let ids: Vec<u32> = (0..b * k_max).map(|_| g.below(vocab) as u32).collect();
        let mut draft = vec![0.0f32; b * k_max * vocab];
        for r in draft.chunks_exact_mut(vocab) {
            row(&mut g, vocab, false, r);
        }
        let k = vec![3, 2, 3];
        let temps = [0.7f32, 0.0, 1.3];
        let seed = [11u64, 12, 13];
        let offset = [0u64, 5, u64::MAX];
        for with_draft in [false, true] {
            let mut batch = Batch::dense(
                Dims { vocab, k_max },
                Drafts { k: &k, ids: &ids },
                &[],
                Streams {
                    seed: &seed,
                    offset: &offset,
                },
            )
            .with_strides(Strides {
                draft: vocab,
                target: tstride,
            })
            .with_target_logits(Logits {
                values: &logits,
                temperature: &temps,
            });
            if with_draft {
                batch = batch.with_draft_probs(&draft);
            }
            for method in METHODS {
                let mut want = (vec![0u32; b], vec![0u32; b * (k_max + 1)]);
                let mut reference = Reference::<K>::new();
                reference
                    .verify(
                        method,
                        Check::Cheap,
                        &batch,
                        &mut Outputs::new(
                            specula_core::verify::AcceptedOut(&mut want.0),
                            specula_core::verify::TokensOut(&mut want.1),
                        ),
                    )
                    .unwrap();
                for slices in [1u32, 3] {
                    let mut host = KernelHost::<K>::with_slices(Mode::Cuda, 128, slices).unwrap();
                    let mut got = (vec![0u32; b], vec![0u32; b * (k_max + 1)]);
                    host.verify(
                        method,
                        Check::Cheap,
                        &batch,
                        &mut Outputs::new(
                            specula_core::verify::AcceptedOut(&mut got.0),
                            specula_core::verify::TokensOut(&mut got.1),
                        ),
                    )
                    .unwrap();
                    assert_eq!(
                        got, want,
                        "V={vocab} {method:?} draft={with_draft} slices={slices}"
                    );
                    assert_eq!(host.totals().unwrap(), reference.totals().unwrap());
                }
            }
        }
    }
}
