//! The engine inputs of the kernel text's logits entries (`specula_verify_logits`,
//! `specula_verify_split_logits`), executed on the host in both macro forms and both entries,
//! bit for bit against the Rust reference: bf16 / f16 target logits and draft probabilities,
//! a method per request (mixed with temperature 0 = greedy), recovered tokens, and top-k /
//! top-p / min-p. Plus the kernel's own guards on the raw device path (`ERR_PARAM`,
//! `ERR_SHAPE` for half flags on a plain entry).

use specula_core::Counters;
use specula_core::gpu::kernels::{self, ERR_PARAM, ERR_SHAPE};
use specula_core::gpu::{ArgBlock, Family};
use specula_core::verify::{
    Batch, Check, Dims, Drafts, Filter, Half, HalfLogits, Logits, Method, RaggedDrafts, SENTINEL,
    Streams, Strides, Verifier, draft_slots, recovered_tokens, verify_batch,
};
use specula_tests::conformance::{
    self as c, Gen, K, METHODS, OutData, RandomSpec, random_batch, random_filters, to_bf16, to_f16,
};
use specula_tests::kernel_host::{FilterPassMode, KernelHost, Mode, at, at_mut, filter_pass};

/// One-block and split hosts in both macro forms.
fn hosts() -> Vec<KernelHost<K>> {
    vec![
        KernelHost::new(Mode::Cuda, 64).unwrap(),
        KernelHost::new(Mode::Hip, 64).unwrap(),
        KernelHost::with_slices(Mode::Cuda, 32, 3).unwrap(),
        KernelHost::with_slices(Mode::Hip, 64, 2).unwrap(),
    ]
}

/// The conformance suite's sampling inputs (filters on probabilities and logits, binary32 /
/// bf16 / f16 logits and drafts, temperatures mixing 0 and > 0, methods per request) and its
/// recovered-token output case, bit for bit, on every host.
#[test]
fn sampling_inputs_match_the_reference_both_modes_both_entries() {
    for (i, make) in [
        || KernelHost::<K>::new(Mode::Cuda, 64).unwrap(),
        || KernelHost::<K>::new(Mode::Hip, 64).unwrap(),
        || KernelHost::<K>::with_slices(Mode::Cuda, 32, 3).unwrap(),
        || KernelHost::<K>::with_slices(Mode::Hip, 64, 2).unwrap(),
    ]
    .into_iter()
    .enumerate()
    {
        c::sampling_inputs(make, 0x13_0000 + i as u64, 40);
        // The recovered-token output through `Verifier::verify` (`Outputs::with_recovered`).
        c::recovered_output(make, 0x13_0100 + i as u64, 20);
    }
}

/// Reference outputs, counters and recovered tokens of `batch`.
fn reference(method: Method, batch: &Batch<'_>) -> (OutData, Counters<K>, Vec<u32>) {
    let mut out = OutData::new(batch.requests(), batch.k_max);
    let mut counters = Counters::<K>::ZERO;
    verify_batch(method, Check::Cheap, batch, &mut out.view(), &mut counters).unwrap();
    let mut rec = vec![0xDEAD_BEEF; draft_slots(batch)];
    recovered_tokens::<K>(method, Check::Cheap, batch, &mut rec).unwrap();
    (out, counters, rec)
}

/// Checks `host` against the reference on `batch`: outputs, counters, recovered tokens.
fn check(host: &mut KernelHost<K>, method: Method, batch: &Batch<'_>, what: &str) {
    let (want, wc, wrec) = reference(method, batch);
    let before = host.totals().unwrap();
    let mut got = OutData::new(batch.requests(), batch.k_max);
    let mut rec = vec![0xDEAD_BEEF; draft_slots(batch)];
    host.verify_recovered(method, Check::Cheap, batch, &mut got.view(), &mut rec)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let mode = (host.mode(), host.slices());
    assert_eq!(got, want, "{what} {method:?} {mode:?}: outputs");
    assert_eq!(rec, wrec, "{what} {method:?} {mode:?}: recovered tokens");
    assert_eq!(
        host.totals().unwrap().delta_since(&before),
        wc,
        "{what} {method:?} {mode:?}: counters"
    );
    assert!(host.scratch_is_clear(), "{what}: split scratch left dirty");
    assert_eq!(host.error_flags(), 0, "{what}");
}

/// Recovered tokens with every input combination the conformance suite draws (probabilities,
/// binary32 / half logits, half drafts, filters, methods per request, the ragged layout is
/// covered by `recovered_tokens_ragged`), every host.
#[test]
fn recovered_tokens_match_the_reference() {
    let mut g = Gen(0x13_0EC0);
    let mut hosts = hosts();
    for i in 0..24 {
        let spec = RandomSpec {
            garbage: i % 3 == 0,
            ..RandomSpec::default()
        };
        let (d, _) = random_batch(&mut g, spec);
        let n = d.k.len();
        let (top_k, top_p, min_p) = random_filters(&mut g, n, d.vocab);
        let logits: Vec<f32> = d
            .target_probs
            .iter()
            .map(|_| (8.0 * g.unit()).round() * 0.5 - 3.0)
            .collect();
        let temps: Vec<f32> = (0..n)
            .map(|_| if g.chance(1, 4) { 0.0 } else { 0.3 + g.unit() })
            .collect();
        let lb = to_bf16(&logits);
        let draft_f16 = d.draft_probs.as_ref().map(|p| to_f16(p));
        let methods: Vec<Method> = (0..n).map(|_| METHODS[g.below(3)]).collect();
        let mut batch = d.view();
        match i % 3 {
            0 => {}
            1 => {
                batch = batch.with_target_logits(Logits {
                    values: &logits,
                    temperature: &temps,
                });
            }
            _ => {
                batch = batch.with_target_logits_half(HalfLogits {
                    values: Half::Bf16(&lb),
                    temperature: &temps,
                });
            }
        }
        if let Some(h) = draft_f16.as_ref().filter(|_| g.chance(1, 2)) {
            batch = batch.with_draft_probs_half(Half::F16(h));
        }
        let filters = c::some_filters(&mut g, (&top_k, &top_p, &min_p), [(1, 2), (1, 2), (1, 3)]);
        if let Some(f) = &filters {
            batch = batch.with_filters(f);
        }
        if g.chance(1, 2) {
            batch = batch.with_methods(&methods);
        }
        for method in METHODS {
            for h in &mut hosts {
                check(h, method, &batch, &format!("batch {i}"));
            }
        }
    }
}

/// Recovered tokens in the ragged layout (one value per draft token, `cu[b−1] + j`), with
/// bonus tokens and a request with `k = 0`.
#[test]
fn recovered_tokens_ragged() {
    let (vocab, b) = (37usize, 3usize);
    let cu = [2u32, 2, 5];
    let mut g = Gen(0x13_4A66);
    let rows = 5;
    let mut target = vec![0.0f32; rows * vocab];
    for r in target.chunks_exact_mut(vocab) {
        for x in r.iter_mut() {
            *x = g.unit();
        }
    }
    let ids: Vec<u32> = (0..5).map(|_| g.below(vocab) as u32).collect();
    let temps = [0.8f32, 0.0, 1.1];
    let bonus = [1u32, 2, 3];
    let seed = [5u64, 6, 7];
    let offset = [0u64, 1, 2];
    let filters = [3u32, 0, 7].map(|k| Filter::NONE.with_top_k(k));
    let batch = Batch::ragged(
        vocab,
        RaggedDrafts {
            cu_num_draft_tokens: &cu,
            ids: &ids,
        },
        &[],
        Streams {
            seed: &seed,
            offset: &offset,
        },
    )
    .with_bonus(&bonus)
    .with_target_logits(Logits {
        values: &target,
        temperature: &temps,
    })
    .with_filters(&filters);
    assert_eq!(batch.requests(), b);
    for method in METHODS {
        for h in &mut hosts() {
            check(h, method, &batch, "ragged");
        }
    }
}

/// Realistic vocabularies (V = 32 000 with bf16 logits and f16 drafts, V = 151 936 with f16
/// logits), every method, filters on, a method per request, recovered tokens: one-block and
/// split entries (CUDA macros; the HIP form runs the same text on the small batches above).
#[test]
fn large_vocabulary_inputs_match() {
    for (vocab, half_drafts) in [(32_000usize, true), (151_936, false)] {
        let mut g = Gen(vocab as u64 ^ 0x13);
        let (k_max, b) = (2usize, 3usize);
        let logits: Vec<f32> = (0..b * (k_max + 1) * vocab)
            .map(|_| 14.0 * g.unit() - 10.0)
            .collect();
        let (lb, lh) = (to_bf16(&logits), to_f16(&logits));
        let ids: Vec<u32> = (0..b * k_max).map(|_| g.below(vocab) as u32).collect();
        let mut draft = vec![0.0f32; b * k_max * vocab];
        for r in draft.chunks_exact_mut(vocab) {
            let peak = g.below(vocab);
            for (i, x) in r.iter_mut().enumerate() {
                *x = if i == peak {
                    0.5
                } else {
                    0.5 / (vocab - 1) as f32
                };
            }
        }
        let dh = to_f16(&draft);
        let k = [2u32, 1, 2];
        let temps = [0.7f32, 1.0, 0.0];
        let filters = [
            Filter::NONE.with_top_k(50).with_top_p(0.9),
            Filter::NONE.with_top_p(0.5).with_min_p(0.05),
            Filter::NONE.with_top_k(5).with_min_p(0.1),
        ];
        let methods = [Method::Rejection, Method::Typical, Method::Greedy];
        let seed = [1u64, 2, 3];
        let offset = [9u64, 8, 7];
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
            target: vocab,
        })
        .with_target_logits_half(HalfLogits {
            values: if half_drafts {
                Half::Bf16(&lb)
            } else {
                Half::F16(&lh)
            },
            temperature: &temps,
        })
        .with_filters(&filters);
        if half_drafts {
            batch = batch.with_draft_probs_half(Half::F16(&dh));
        } else {
            batch = batch.with_draft_probs(&draft);
        }
        for (mi, method) in METHODS.into_iter().enumerate() {
            let b2 = if mi == 0 {
                batch.with_methods(&methods)
            } else {
                batch
            };
            for slices in [1u32, 3] {
                let mut h = KernelHost::<K>::with_slices(Mode::Cuda, 128, slices).unwrap();
                check(&mut h, method, &b2, &format!("V={vocab}"));
            }
        }
    }
}

/// The kernel's own guards on raw launches: a method code above 2, top-p outside (0, 1] and
/// min-p outside [0, 1] (NaN included) skip their request with ERR_PARAM (sentinels, recovered
/// sentinels, not counted), the neighbours run; half-precision flags on a plain entry, or both
/// half flags of one tensor on the logits entry, refuse the launch with ERR_SHAPE.
#[test]
fn raw_launch_guards() {
    for (mode, slices) in [
        (Mode::Cuda, 1),
        (Mode::Hip, 1),
        (Mode::Cuda, 3),
        (Mode::Hip, 2),
    ] {
        let (vocab, k_max, b) = (8u32, 2u32, 5usize);
        let mut target = vec![0.0f32; b * 3 * vocab as usize];
        for r in target.chunks_exact_mut(vocab as usize) {
            r[3] = 1.0;
        }
        let k = [2u32; 5];
        let ids = [3u32; 10];
        let methods = [1u32, 3, 1, 1, 1];
        let top_p = [1.0f32, 1.0, 0.0, f32::NAN, 0.5];
        let min_p = [0.0f32, 0.0, 0.0, 0.0, 1.5];
        let (seed, offset) = ([1u64; 5], [0u64; 5]);
        let mut accepted = [7u32; 5];
        let mut tokens = [7u32; 15];
        let mut rec = [7u32; 10];
        let shape = kernels::shape_words(5, k_max, vocab, None, vocab, 0, K as u32);
        let mut host = KernelHost::<K>::with_slices(mode, 64, slices).unwrap();
        let p = ArgBlock {
            k: at(&k),
            draft_ids: at(&ids),
            target_probs: at(&target),
            seed: at(&seed),
            offset: at(&offset),
            accepted: at_mut(&mut accepted),
            tokens: at_mut(&mut tokens),
            ..ArgBlock::default()
        };
        // The sampling words: method code, top-k (off), top-p and min-p bits per request.
        let sampling: Vec<u32> = (0..5)
            .flat_map(|i| [methods[i], 0, top_p[i].to_bits(), min_p[i].to_bits()])
            .collect();
        let x = ArgBlock {
            sampling: at(&sampling),
            recovered: at_mut(&mut rec),
            ..p
        };
        // SAFETY: every address holds the B = 5 values (ids, recovered B·k_max, target
        // B·(k_max+1) rows of V, tokens B·(k_max+1)) the padded shape implies.
        let rc = unsafe { host.launch_raw(5, &shape, Family::Logits, x) };
        assert_eq!(rc, 0);
        assert_eq!(host.error_flags(), ERR_PARAM, "{mode:?} {slices}");
        assert!(host.scratch_is_clear());
        // Request 0 (greedy): both drafts are the argmax 3, then the bonus 3.
        assert_eq!(accepted, [2, SENTINEL, SENTINEL, SENTINEL, SENTINEL]);
        assert_eq!(&tokens[..3], &[3, 3, 3]);
        assert!(tokens[3..].iter().all(|&t| t == SENTINEL));
        assert_eq!(&rec[..2], &[3, 3]);
        assert!(rec[2..].iter().all(|&t| t == SENTINEL));
        let mut want = Counters::<K>::ZERO;
        want.record(2, 2).unwrap();
        assert_eq!(host.totals().unwrap(), want);

        // Half flags: refused by a plain entry, and both of a pair by the logits entry.
        for (flags, logits_entry) in [
            (kernels::FLAG_TARGET_BF16, false),
            (kernels::FLAG_TARGET_BF16 | kernels::FLAG_TARGET_F16, true),
            (
                kernels::FLAG_DRAFT_PROBS | kernels::FLAG_DRAFT_BF16 | kernels::FLAG_DRAFT_F16,
                true,
            ),
        ] {
            let mut host = KernelHost::<K>::with_slices(mode, 64, slices).unwrap();
            let mut sh = shape;
            sh[kernels::SHAPE_FLAGS] = flags;
            sh[kernels::SHAPE_DRAFT_STRIDE] = vocab;
            // SAFETY: as above; the launch refuses the shape before reading anything else
            // (draft_probs points at the target, long enough for the draft extent).
            let rc = unsafe {
                let q = ArgBlock {
                    draft_probs: at(&target),
                    ..p
                };
                let family = if logits_entry {
                    Family::Logits
                } else {
                    Family::Plain
                };
                host.launch_raw(5, &sh, family, q)
            };
            assert_eq!(rc, 0);
            assert_eq!(host.error_flags(), ERR_SHAPE, "flags {flags:#x}");
            assert!(host.totals().unwrap().is_zero());
        }
    }
}

/// Sanity of the inputs themselves: the outputs are not all one method's (the mixed-method and
/// filter cases exercise acceptance and rejection).
#[test]
fn mixed_methods_differ_from_a_single_method() {
    let mut g = Gen(0x13_3E7D);
    let vocab = 64usize;
    let (b, k_max) = (6usize, 3usize);
    let mut target = vec![0.0f32; b * (k_max + 1) * vocab];
    for r in target.chunks_exact_mut(vocab) {
        for x in r.iter_mut() {
            *x = g.unit() * g.unit();
        }
        let s: f32 = r.iter().sum();
        r.iter_mut().for_each(|x| *x /= s);
    }
    let ids: Vec<u32> = (0..b * k_max).map(|_| g.below(vocab) as u32).collect();
    let k = [3u32; 6];
    let (seed, offset) = ([3u64; 6], [4u64; 6]);
    let methods = [
        Method::Greedy,
        Method::Rejection,
        Method::Typical,
        Method::Greedy,
        Method::Rejection,
        Method::Typical,
    ];
    let batch = Batch::dense(
        Dims { vocab, k_max },
        Drafts { k: &k, ids: &ids },
        &target,
        Streams {
            seed: &seed,
            offset: &offset,
        },
    )
    .with_methods(&methods);
    let mut h = KernelHost::<K>::new(Mode::Cuda, 64).unwrap();
    check(&mut h, Method::Rejection, &batch, "mixed");
    let (mixed, _, _) = reference(Method::Rejection, &batch);
    let mut plain = batch;
    plain.methods = None;
    let (single, _, _) = reference(Method::Greedy, &plain);
    assert_ne!(mixed, single);
}

/// The filters' histogram shortcuts (core/kernels/specula_verify.cu, `sp_filter_pass`): the
/// ids of key 0 left out of every pass (and with them the ids past the row's end), and the mass
/// histogram's one scaled value per weight (`sp_fix_scaled`: its scale's break at top key digit
/// 43, i.e. weights around 2^-41, weights of 1 and more, and weights of 2^64 and more, which
/// saturate: exactly 2^64 among them, where treating it as unsaturated changes the mass most). Stored target rows, each scaled by a power of two from the subnormals to beyond
/// 2^64, with zeros, negative, NaN and infinite values, the smallest subnormal and ties; top-k
/// around the number of positive weights, top-p and min-p; vocabularies that end inside a
/// tile: every host gives the reference's bits. (Scaled rows make the kept set, not only the
/// low bits of the kept mass, depend on the tiny or huge weights' masses.)
#[test]
fn filter_key_zero_and_row_end_cases() {
    // 2^64 <= w < 2^65 (scale 65, and 69 for the ties) is the first saturated digit.
    let scales = [
        -140i32, -100, -60, -46, -43, -42, -41, -38, 0, 20, 40, 62, 63, 64, 65, 69, 90,
    ];
    let specials = [
        0.0f32,
        -0.0,
        -0.5,
        f32::NAN,
        f32::NEG_INFINITY,
        1e-45,
        f32::INFINITY,
    ];
    for vocab in [37usize, 1003] {
        let mut g = Gen(0x13_F117 ^ vocab as u64);
        let k_max = 2usize;
        // Each (scale, row shape) in 4 requests of their own rows and streams: a request shows
        // its filtered rows through a token or two only.
        let b = 8 * scales.len();
        let mut target = vec![0f32; b * (k_max + 1) * vocab];
        let mut peaks = vec![0usize; b * (k_max + 1)];
        for (r, row) in target.chunks_exact_mut(vocab).enumerate() {
            let req = r / (k_max + 1);
            let scale = 2f32.powi(scales[req % scales.len()]);
            let peak = g.below(vocab);
            peaks[r] = peak;
            // The first request of each scale: a peaked row (one weight of about 0.6, groups
            // of ties) with every special; the second: a flat one (ties and a spread
            // background), whose kept set then decides the outputs, without infinities.
            let tie = g.unit();
            let first = (req / scales.len()) % 2 == 0;
            for (i, x) in row.iter_mut().enumerate() {
                let base = if i == peak && first {
                    0.6
                } else if g.chance(1, 4) {
                    tie * 0.05
                } else {
                    let u = g.unit();
                    u * u * u * 0.1
                };
                *x = base * scale;
                // Exactly 2^64 (the smallest saturated weight) among the large scales.
                if scales[req % scales.len()] >= 62 && g.chance(1, 16) {
                    *x = 2f32.powi(64);
                }
                if g.chance(1, 8) {
                    let n = if first { 7 } else { 6 };
                    *x = specials[g.below(n)];
                }
            }
        }
        let mut draft = vec![0f32; b * k_max * vocab];
        for r in draft.chunks_exact_mut(vocab) {
            let peak = g.below(vocab);
            for (i, x) in r.iter_mut().enumerate() {
                *x = if i == peak {
                    0.5
                } else {
                    0.5 / (vocab - 1) as f32
                };
            }
        }
        // Draft ids: the target row's peak half of the time (acceptance is then decided by
        // the filtered, renormalised target), else any id (often cut by the filter).
        let ids: Vec<u32> = (0..b * k_max)
            .map(|i| {
                let r = (i / k_max) * (k_max + 1) + i % k_max;
                if g.chance(1, 2) {
                    peaks[r] as u32
                } else {
                    g.below(vocab) as u32
                }
            })
            .collect();
        let positive = |r: usize| {
            target[r * vocab..(r + 1) * vocab]
                .iter()
                .filter(|&&x| x > 0.0)
                .count()
        };
        // Every scale with top-p below 1 in both of its requests, top-k and min-p in turn.
        let filters: Vec<Filter> = (0..b)
            .map(|q| {
                let (i, j) = (q % scales.len(), (q / scales.len()) % 2);
                let row = q * (k_max + 1);
                let top_k = match (i + 3 * j) % 6 {
                    0 => 0,
                    1 => 1,
                    2 => positive(row) as u32, // the last positive weight's key
                    3 => positive(row) as u32 + 1, // more than the positive weights, <= V
                    4 => vocab as u32,
                    _ => vocab as u32 + 3,
                };
                let top_p = [0.9f32, 0.5, 0.999, 0.1][(i + j) % 4];
                let min_p = [0.0f32, 1e-3, 0.0, 0.5][(i + 2 * j) % 4];
                Filter::NONE
                    .with_top_k(top_k)
                    .with_top_p(top_p)
                    .with_min_p(min_p)
            })
            .collect();
        let k: Vec<u32> = (0..b).map(|i| [2u32, 1, 0][i % 3]).collect();
        let seed: Vec<u64> = (0..b as u64).map(|i| 17 + i).collect();
        let offset: Vec<u64> = (0..b as u64).map(|i| 5 * i).collect();
        let batch = Batch::dense(
            Dims { vocab, k_max },
            Drafts { k: &k, ids: &ids },
            &target,
            Streams {
                seed: &seed,
                offset: &offset,
            },
        )
        .with_draft_probs(&draft)
        .with_filters(&filters);
        for method in METHODS {
            for h in &mut hosts() {
                check(h, method, &batch, &format!("scaled rows, V={vocab}"));
            }
        }
    }
}

/// The softmax maximum of logit rows whose largest value is a hostile one (NaN, ±0, ±∞,
/// subnormals, values whose quotient by `t` overflows or underflows), at temperatures from
/// tiny to huge, with and without a filter: every host gives the reference's bits. (The
/// logits entries take the largest logit's quotient, not the largest quotient: the same key
/// by monotonicity, which this attacks.)
#[test]
fn hostile_logit_maxima_match_the_reference() {
    const V: usize = 37;
    let mut g = Gen(0x13_3A11);
    let nan = f32::NAN;
    let neg_nan = f32::from_bits(0xFFC0_0001);
    let fills: [&[f32]; 9] = [
        &[nan],
        &[neg_nan, -1.0],
        &[-0.0, -3.0],
        &[0.0, -0.0, -1e-40],
        &[f32::INFINITY, 2.0],
        &[f32::NEG_INFINITY],
        &[3.0e38, -3.0e38],
        &[1e-45, 3e-45, -1e-45],
        &[f32::MAX, f32::MIN_POSITIVE],
    ];
    let temps = [0.25f32, 1.0, 1e30, 0.7, 3e-39, 2.0, 0.5, 1e38, 1e-3];
    let b = fills.len();
    let mut target = vec![0f32; b * 2 * V];
    for (r, row) in target.chunks_exact_mut(V).enumerate() {
        let fill = fills[r / 2];
        for x in row.iter_mut() {
            // Mostly the hostile values, some ordinary ones below them.
            *x = if g.chance(2, 3) {
                fill[g.below(fill.len())]
            } else {
                -4.0 - g.unit()
            };
        }
    }
    let ids: Vec<u32> = (0..b).map(|_| g.below(V) as u32).collect();
    let k = vec![1u32; b];
    let (seed, offset) = (vec![3u64; b], vec![1u64; b]);
    let filters: Vec<Filter> = (0..b)
        .map(|i| Filter::NONE.with_top_p([1.0, 0.5][i % 2]))
        .collect();
    // Every row kind at every temperature: a wrong maximum at a tiny one leaves every weight 0
    // (or one), which the outputs show.
    for turn in 0..b {
        let mut t = temps;
        t.rotate_left(turn);
        let batch = Batch::dense(
            Dims { vocab: V, k_max: 1 },
            Drafts { k: &k, ids: &ids },
            &[],
            Streams {
                seed: &seed,
                offset: &offset,
            },
        )
        .with_target_logits(Logits {
            values: &target,
            temperature: &t,
        });
        let what = format!("hostile maxima, turn {turn}");
        for method in METHODS {
            for h in &mut hosts() {
                check(h, method, &batch, &what);
                check(h, method, &batch.with_filters(&filters), &what);
            }
        }
    }
}

/// Logit rows the softmax sum pass must divide (the quotient without a division is proven for
/// temperatures in `[2^-16, 2^16]` and maxima of magnitude at most `2^80` only: the comment above
/// `sp_rcp` in the kernel text): subnormal and huge temperatures, maxima beyond `2^80`, and rows
/// beside them inside the range, every method, with and without a filter, on every host. (Read
/// without the division, the row at `t = 1e-40` gives every weight 0: its reciprocal overflows.)
#[test]
fn logits_outside_the_fast_quotients_range_match_the_reference() {
    const V: usize = 1000;
    let mut g = Gen(0x0D17_1DE5);
    // (temperature, largest logit, spread of the others below it, in units of the temperature)
    let rows: [(f32, f32, f32); 8] = [
        (1e-40, 1e-20, 0.0),
        (3e-39, 2.5e-37, 40.0),
        (1.2e-5, 3.0, 60.0),
        (1.5e-5, 3.0, 60.0),
        (7.0e4, 1.0e5, 30.0),
        (1.0, -3.0e25, 5.0e19),
        (2.0, 4.0e24, 3.0e18),
        (0.8, 12.0, 20.0),
    ];
    let b = rows.len();
    let mut target = vec![0f32; b * 2 * V];
    let mut temps = Vec::new();
    for (r, row) in target.chunks_exact_mut(V).enumerate() {
        let (t, top, spread) = rows[r / 2];
        if r % 2 == 0 {
            temps.push(t);
        }
        for (i, x) in row.iter_mut().enumerate() {
            *x = if i == 7 || g.chance(1, 20) {
                top
            } else {
                top - spread * t * g.unit()
            };
        }
    }
    let ids: Vec<u32> = (0..b).map(|_| g.below(V) as u32).collect();
    let k = vec![1u32; b];
    let (seed, offset) = (vec![5u64; b], vec![2u64; b]);
    let filters: Vec<Filter> = (0..b)
        .map(|i| Filter::NONE.with_top_p([1.0, 0.5][i % 2]))
        .collect();
    let batch = Batch::dense(
        Dims { vocab: V, k_max: 1 },
        Drafts { k: &k, ids: &ids },
        &[],
        Streams {
            seed: &seed,
            offset: &offset,
        },
    )
    .with_target_logits(Logits {
        values: &target,
        temperature: &temps,
    });
    for method in METHODS {
        for h in &mut hosts() {
            check(h, method, &batch, "outside the fast quotients' range");
            check(
                h,
                method,
                &batch.with_filters(&filters),
                "outside the fast quotients' range",
            );
        }
    }
}

/// Half logit rows with no filter (the softmax's own sum pass, which reads half rows in tiles
/// of 8 groups: rows long enough for whole tiles at every block size here), bf16 and f16, at
/// temperatures inside and outside the range of the quotients without a division, every
/// method, one-block and split entries in both macro forms.
#[test]
fn half_logits_without_a_filter_match_in_whole_tiles() {
    const V: usize = 9000;
    let mut g = Gen(0x4A1F_7113);
    let (k_max, b) = (2usize, 3usize);
    let logits: Vec<f32> = (0..b * (k_max + 1) * V)
        .map(|_| 16.0 * g.unit() - 12.0)
        .collect();
    let (lb, lh) = (to_bf16(&logits), to_f16(&logits));
    let ids: Vec<u32> = (0..b * k_max).map(|_| g.below(V) as u32).collect();
    let draft: Vec<f32> = vec![1.0 / V as f32; b * k_max * V];
    let k = [2u32, 1, 2];
    let temps = [0.7f32, 1e-6, 1.3];
    let (seed, offset) = ([4u64, 5, 6], [1u64, 2, 3]);
    for values in [Half::Bf16(&lb), Half::F16(&lh)] {
        let batch = Batch::dense(
            Dims { vocab: V, k_max },
            Drafts { k: &k, ids: &ids },
            &draft,
            Streams {
                seed: &seed,
                offset: &offset,
            },
        )
        .with_target_logits_half(HalfLogits {
            values,
            temperature: &temps,
        });
        for method in METHODS {
            for mut h in [
                KernelHost::<K>::new(Mode::Cuda, 128).unwrap(),
                KernelHost::<K>::with_slices(Mode::Cuda, 128, 3).unwrap(),
                KernelHost::<K>::new(Mode::Hip, 64).unwrap(),
            ] {
                check(&mut h, method, &batch, "half rows, no filter");
            }
        }
    }
}

// ---- the filters' sparse passes (core/kernels/specula_verify.cu, sp_filter_sparse)

/// The softmax maximum of a logit row (the kernel's `m`: the largest `RN(l / t)`, NaN aside).
fn max_quotient(l: &[f32], t: f32) -> f32 {
    l.iter()
        .map(|&x| x / t)
        .filter(|z| !z.is_nan())
        .fold(f32::NEG_INFINITY, f32::max)
}

/// The filters' key of each id of a logit row: the bits of `e = exp_p(RN(l / t) − m)`, 0 for
/// `e = 0` (the rules' weights, computed here from `specula_core`'s `exp_p`).
fn filter_keys(l: &[f32], t: f32, m: f32) -> Vec<u32> {
    l.iter()
        .map(|&x| {
            let e = specula_core::verify::fmath::exp_p(x / t - m);
            if e > 0.0 { e.to_bits() } else { 0 }
        })
        .collect()
}

/// The keys a pass at `level` under `prefix` with `floor` adds (`sp_filter_pass`'s range; key
/// 0 never), and the digit's shift.
fn pass_range(level: u32, prefix: u32, floor: u32) -> (u32, u32, u32) {
    let shift = 24 - 8 * level;
    let width = ((256u64 << shift) - 1) as u32;
    let base = prefix & !width;
    let lo = base.max(floor).max(1);
    (lo, base + width, shift)
}

/// One filter pass as the rules define it, on the keys of a logit row: the histogram's bins
/// (2 words each: the count, or the sum of the mass's scaled values `v` and 0 saturated
/// weights: logit weights are at most 1) and the result words (the largest key; the kept
/// mass `Σ ⌊e·2⁶⁴⌋` of the keys at or above the floor, as a u128 in `out[0]`, `out[1]`).
fn filter_pass_ref(
    keys: &[u32],
    pass: FilterPassMode,
    level: u32,
    prefix: u32,
    floor: u32,
) -> (Vec<u64>, u128) {
    let (lo, hi, shift) = pass_range(level, prefix, floor);
    let mut hist = vec![0u64; 512];
    let mut out = 0u128;
    for &k in keys {
        match pass {
            FilterPassMode::Max => out = out.max(u128::from(k)),
            _ if k < lo || k > hi => {}
            FilterPassMode::Count => hist[2 * ((k >> shift) & 0xFF) as usize] += 1,
            FilterPassMode::MassHist => {
                // fix(w) = v 2^s with v = trunc(w 2^(150 - 2 t')), t' = max(top digit, 43).
                let w = f64::from(f32::from_bits(k));
                let t = (k >> 24).max(43) as i32;
                hist[2 * ((k >> shift) & 0xFF) as usize] += (w * 2f64.powi(150 - 2 * t)) as u64;
            }
            FilterPassMode::Mass => {
                let w = f64::from(f32::from_bits(k));
                out += (w * 2f64.powi(64)) as u128; // exact: w has 24 bits, w <= 1
            }
        }
    }
    (hist, out)
}

/// A logit row at temperature `t` with its softmax maximum `m` and its ids' keys
/// ([`filter_keys`]).
struct FilterRow<'a> {
    l: &'a [f32],
    t: f32,
    m: f32,
    keys: Vec<u32>,
}

impl<'a> FilterRow<'a> {
    fn new(l: &'a [f32], t: f32) -> Self {
        let m = max_quotient(l, t);
        Self {
            l,
            t,
            m,
            keys: filter_keys(l, t, m),
        }
    }
}

/// Runs one pass in both macro forms against [`filter_pass_ref`]; returns the exact weights
/// the CUDA form took.
fn check_filter_pass(
    row: &FilterRow<'_>,
    pass: FilterPassMode,
    level: u32,
    prefix: u32,
    floor: u32,
    what: &str,
) -> u64 {
    let FilterRow { l, t, m, ref keys } = *row;
    let (want_hist, want_out) = filter_pass_ref(keys, pass, level, prefix, floor);
    let mut exact = 0;
    for (mode, block) in [(Mode::Cuda, 64), (Mode::Hip, 128)] {
        let got = filter_pass(mode, l, t, m, pass, level, prefix, floor, block).expect("launch");
        let ctx = format!(
            "{what} {mode:?}: {pass:?} level {level} prefix {prefix:#010x} floor {floor:#010x}, t {t:e}, m {m:e}"
        );
        match pass {
            FilterPassMode::Max => assert_eq!(u128::from(got.out[0]), want_out, "{ctx}"),
            FilterPassMode::Mass => {
                let [s0, s1, s2, s3] = got.out.map(u128::from);
                let f = s0
                    .wrapping_add(s1 << 32)
                    .wrapping_add(s2 << 64)
                    .wrapping_add(s3 << 96);
                assert_eq!(f, want_out, "{ctx}");
            }
            _ => {
                for d in 0..256 {
                    assert_eq!(
                        (got.hist[2 * d], got.hist[2 * d + 1]),
                        (want_hist[2 * d], want_hist[2 * d + 1]),
                        "{ctx}: bin {d}"
                    );
                }
            }
        }
        if mode == Mode::Cuda {
            exact = got.exact;
        }
    }
    exact
}

/// The filters' sparse passes (`sp_filter_sparse`: at descent levels ≥ 1, and with a floor,
/// the ids a bound of their key places outside the pass's range are skipped without their
/// exact weight), attacked where their margins are thinnest: every pass against the rules'
/// definition, with ranges chosen from the ids' own keys (so ids sit at both ends of a range,
/// where the bound's slack `C` decides), on rows swept densely enough that every significand
/// position (the `log₂(1 + f) − f` term of `C` peaks near `f = 0.44`) and every rounding of the
/// bound's exponent occur; softmax maxima up to `2²⁰` (the `|m|` term of `C`) and past it, tiny
/// and huge temperatures (off rows: no claim above the range), NaN, ±∞ and `−∞`-masked ids.
/// Fails with the `|m|` term, the `log₂(1 + f) − f` term or the exponent's rounding term of
/// `C` dropped, and with the off rows' case removed.
#[test]
fn filter_sparse_passes_are_exact() {
    let mut g = Gen(0x005B_A25E);
    // (temperature, the row's largest logit, the spread of its logits below it)
    let rows: [(f32, f32, f32); 9] = [
        (0.8, 3.0, 40.0),
        (1.0, 0.0, 70.0),
        (0.7, -25.0, 15.0),
        (1.0, 524_288.0, 60.0),    // |m| = 2^19
        (1.0, -1_048_576.0, 60.0), // |m| = 2^20, the last bounded row
        (2.0, 3_000_000.0, 60.0),  // |m| > 2^20: an off row
        (1e-39, 1e-38, 1e-37),     // subnormal temperature: c overflows, an off row
        (3e38, 3e38, 3.3e38),      // c subnormal: an off row
        (0.05, 1.0, 4.0),
    ];
    for (r, &(t, top, spread)) in rows.iter().enumerate() {
        let n = 3001usize;
        // The row ends inside a tile, and the memory past its end holds the row's largest
        // logit (weight 1): a pass that read past the end would add it.
        let buf: Vec<f32> = (0..n + 64)
            .map(|i| {
                if i >= n {
                    top
                } else if i % 97 == 5 {
                    [f32::NAN, f32::NEG_INFINITY, -f32::NAN][i % 3]
                } else if i == 0 {
                    top
                } else {
                    top - spread * g.unit()
                }
            })
            .collect();
        let l = &buf[..n];
        let row = FilterRow::new(l, t);
        let what = format!("row {r}");
        // Ranges from the ids' own keys: each level under a sampled id's prefix, and floors at
        // and just above sampled keys.
        let mut picks: Vec<u32> = (0..24)
            .map(|_| row.keys[g.below(n)])
            .filter(|&k| k != 0)
            .collect();
        picks.push(row.keys[0]);
        for pass in [FilterPassMode::Count, FilterPassMode::MassHist] {
            check_filter_pass(&row, pass, 0, 0, 0, &what);
            // A floor of 1: every id in the range, the pad's bound (2^-126) included.
            check_filter_pass(&row, pass, 0, 0, 1, &what);
            for &k in &picks {
                for level in 1..4 {
                    check_filter_pass(&row, pass, level, k, 0, &what);
                    check_filter_pass(&row, pass, level, k, k, &what);
                }
                check_filter_pass(&row, pass, 0, 0, k, &what);
                check_filter_pass(&row, pass, 0, 0, k + 1, &what);
            }
        }
        check_filter_pass(&row, FilterPassMode::Max, 0, 0, 0, &what);
        check_filter_pass(&row, FilterPassMode::Mass, 0, 0, 0, &what);
        for &k in &picks {
            check_filter_pass(&row, FilterPassMode::Mass, 0, 0, k, &what);
        }
    }
}

/// How rare the sparse passes' cold region is on rows shaped like real LLM output (128256
/// logits: one token of `p ≈ 0.7` at `T = 0.8` over a `2·randn` background, and that background
/// alone, "flat"): the fraction of ids whose exact weight each pass of a top-k 50 and a top-p
/// 0.9 descent computes (levels 1 to 3 under the threshold's own digits, and top-p's first
/// level above top-k's threshold), printed, and bounded so that a change that made the bound
/// useless on these rows fails. Each pass also matches the rules' histogram
/// ([`check_filter_pass`]).
#[test]
fn filter_sparse_passes_are_rare_on_real_rows() {
    const V: usize = 128_256;
    let t = 0.8f32;
    let mut g = Gen(0x005B_A25E_0002);
    let mut randn = move || {
        let u1 = f64::from(g.unit()) + 1e-9;
        let u2 = f64::from(g.unit());
        ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
    };
    let flat: Vec<f32> = (0..V).map(|_| 2.0 * randn()).collect();
    let mut peaked = flat.clone();
    // The peak's logit: p = 0.7 of the row at T, the background's mass 0.3.
    let bg: f64 = flat[1..]
        .iter()
        .map(|&l| (f64::from(l) / f64::from(t)).exp())
        .sum();
    peaked[0] = (f64::from(t) * (bg * 0.7 / 0.3).ln()) as f32;
    for (shape, l) in [("peaked", &peaked), ("flat", &flat)] {
        let row = FilterRow::new(l, t);
        let mut sorted = row.keys.clone();
        sorted.sort_unstable_by(|a, b| b.cmp(a));
        let theta_k = sorted[49];
        // Top-p 0.9's threshold: the largest key whose mass at and above it reaches the target.
        let fix = |k: u32| (f64::from(f32::from_bits(k)) * 2f64.powi(64)) as u128;
        let total: u128 = sorted.iter().map(|&k| fix(k)).sum();
        let target = f64::from(0.9f32) * total as f64;
        let mut run = 0u128;
        let mut theta_p = 0;
        for &k in &sorted {
            run += fix(k);
            if run as f64 >= target {
                theta_p = k;
                break;
            }
        }
        let mut report = Vec::new();
        let mut pass =
            |what: &str, p: FilterPassMode, level: u32, prefix: u32, floor: u32, most: f64| {
                let exact = check_filter_pass(&row, p, level, prefix, floor, shape);
                let frac = exact as f64 / V as f64;
                report.push(format!("{what} {:.3} %", 100.0 * frac));
                assert!(frac <= most, "{shape} {what}: {exact} exact weights of {V}");
            };
        for level in 1..4 {
            pass(
                &format!("top-k 50 level {level}"),
                FilterPassMode::Count,
                level,
                theta_k,
                0,
                0.01,
            );
        }
        pass(
            "top-p after top-k 50, level 0",
            FilterPassMode::MassHist,
            0,
            0,
            theta_k,
            0.01,
        );
        for level in 1..4 {
            let most = if level == 1 { 0.25 } else { 0.05 };
            pass(
                &format!("top-p 0.9 level {level}"),
                FilterPassMode::MassHist,
                level,
                theta_p,
                0,
                most,
            );
        }
        println!(
            "{shape} rows, exact weights per pass: {}",
            report.join(", ")
        );
    }
}
