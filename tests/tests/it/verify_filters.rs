//! Sampling inputs (issue 13): per-request top-k / top-p / min-p and bf16 / f16 inputs.
//!
//! * the CPU backend equals the reference bit for bit at real vocabulary sizes (32k, 152k),
//!   padded and ragged, bf16 logits, filters on both paths;
//! * filters that are off change no bit; half-precision input gives the bits of its widened
//!   binary32 values;
//! * the kept set at V = 32768 equals a sort-based reading of `core/DETERMINISM.md` (ties at
//!   the top-k and top-p boundaries kept, the crossing id kept);
//! * bad parameters are typed errors with nothing counted, and backends without the support
//!   refuse them;
//! * a method per request gives each request the bits it gets alone with that method;
//! * recovered tokens (vLLM's `recovered_token_ids`) follow the filters, CPU = reference.
//!
//! That the emitted tokens follow the filtered law is the statistics tier's (`verify_filters`
//! there).

// Request and row indices address several tables at once.
#![allow(clippy::needless_range_loop)]

use specula::cpu::CpuVerifier;
use specula_core::Counters;
use specula_core::verify::{
    Batch, Check, Dims, Drafts, Feature, Filter, Half, HalfLogits, Logits, Method, Param,
    Processed, Reference, Rows, Streams, Support, Target, Values, VerifyError, validate_with,
    verify_batch,
};
use specula_tests::conformance::{
    self, Gen, K, METHODS, OutData, RaggedData, assert_view_matches_reference, filters_of,
    random_filters, random_logits, sized_batch, to_bf16, to_f16,
};

/// CPU (3 threads, 1 thread) against the reference at V = 32000 and 151936: bf16 and f16 logits
/// with and without filters, f32 probabilities with filters, padded and ragged; every method.
#[test]
fn cpu_matches_reference_at_real_sizes() {
    let mut g = Gen(0xF117_0001);
    let mut many = CpuVerifier::<K>::new(3).expect("pool");
    let mut one = CpuVerifier::<K>::new(1).expect("verifier");
    for (vocab, batches) in [(32_000usize, 2usize), (151_936, 1)] {
        for i in 0..batches {
            let d = sized_batch(&mut g, 3, vocab, 2, true);
            let (logits, temps) = random_logits(&mut g, &d);
            let (lb, lh) = (to_bf16(&logits), to_f16(&logits));
            let (top_k, top_p, min_p) = random_filters(&mut g, 3, vocab);
            let f_kp = filters_of(3, Some(&top_k), Some(&top_p), None).expect("a part");
            let f_kpm = filters_of(3, Some(&top_k), Some(&top_p), Some(&min_p)).expect("a part");
            let f_pm = filters_of(3, None, Some(&top_p), Some(&min_p)).expect("a part");
            // The same requests in the ragged layout: its "probabilities" are the bf16 logits.
            let mut as_logits = d.clone();
            as_logits.target_probs = logits.clone();
            let r = RaggedData::from_padded(&as_logits, None);
            let rb = to_bf16(&r.target_probs);
            for m in METHODS {
                let what = format!("V = {vocab}, batch {i}");
                let views = [
                    d.view()
                        .with_target_logits_half(HalfLogits {
                            values: Half::Bf16(&lb),
                            temperature: &temps,
                        })
                        .with_filters(&f_kpm),
                    d.view().with_filters(&f_pm),
                    {
                        r.view()
                            .with_target_logits_half(HalfLogits {
                                values: Half::Bf16(&rb),
                                temperature: &temps,
                            })
                            .with_filters(&f_kp)
                    },
                    d.view().with_target_logits_half(HalfLogits {
                        values: Half::F16(&lh),
                        temperature: &temps,
                    }),
                    d.view()
                        .with_target_logits_half(HalfLogits {
                            values: Half::F16(&lh),
                            temperature: &temps,
                        })
                        .with_filters(&f_pm),
                ];
                for (n, batch) in views.iter().enumerate() {
                    let what = format!("{what}, view {n}");
                    assert_view_matches_reference(&mut many, m, Check::STRICT, batch, &what)
                        .expect("valid batch");
                    assert_view_matches_reference(&mut one, m, Check::STRICT, batch, &what)
                        .expect("valid batch");
                }
            }
        }
    }
}

/// Runs the reference on `batch` (method `m`), returning the outputs.
fn run(m: Method, batch: &Batch<'_>) -> OutData {
    let mut out = OutData::new(batch.requests(), batch.k_max);
    let mut counters = Counters::<K>::ZERO;
    verify_batch(m, Check::Cheap, batch, &mut out.view(), &mut counters).expect("valid batch");
    out
}

/// Filters given but off (top-k 0, top-p 1, min-p 0) give the bits of no filter at all, on
/// both paths; and switching one on does change outputs (so the comparison can fail).
#[test]
fn filters_that_are_off_change_nothing() {
    let mut g = Gen(0xF117_0002);
    let mut changed = 0;
    for i in 0..200 {
        let vocab = 64 + g.below(200);
        let d = sized_batch(&mut g, 4, vocab, 3, true);
        let (logits, temps) = random_logits(&mut g, &d);
        let m = METHODS[i % 3];
        // Every part given, each at its neutral value (not `Filter::NONE` itself: the values
        // as an engine would send them).
        let f_kpm = vec![Filter::NONE.with_top_k(0).with_top_p(1.0).with_min_p(0.0); 4];
        let f_p = vec![Filter::NONE.with_top_p(0.3); 4];
        let lv = Logits {
            values: &logits,
            temperature: &temps,
        };
        for base in [d.view(), d.view().with_target_logits(lv)] {
            let plain = run(m, &base);
            let off = run(m, &base.with_filters(&f_kpm));
            assert_eq!(plain, off, "batch {i}: filters off changed the outputs");
            if run(m, &base.with_filters(&f_p)) != plain {
                changed += 1;
            }
        }
    }
    assert!(
        changed > 50,
        "top-p 0.3 changed only {changed} of 400 batches"
    );
}

/// bf16 / f16 logits and draft probabilities give exactly the bits of the binary32 tensors of
/// their widened values, on the reference and the CPU backend.
#[test]
fn half_inputs_equal_their_widened_values() {
    let mut g = Gen(0xF117_0003);
    let cpu = CpuVerifier::<K>::new(2).expect("pool");
    for i in 0..60 {
        let vocab = 32 + g.below(3000);
        let d = sized_batch(&mut g, 3, vocab, 3, true);
        let (logits, temps) = random_logits(&mut g, &d);
        let dp = d.draft_probs.clone().expect("draft probabilities");
        let (top_k, top_p, min_p) = random_filters(&mut g, 3, d.vocab);
        let f_km = filters_of(3, Some(&top_k), None, Some(&min_p)).expect("a part");
        let f_p = filters_of(3, None, Some(&top_p), None).expect("a part");
        let m = METHODS[i % 3];
        for bf in [true, false] {
            let (lh, dh) = if bf {
                (to_bf16(&logits), to_bf16(&dp))
            } else {
                (to_f16(&logits), to_f16(&dp))
            };
            let widen = |h: &[u16]| -> Vec<f32> {
                let mut w = vec![0f32; h.len()];
                let v = if bf {
                    Values::Half(Half::Bf16(h))
                } else {
                    Values::Half(Half::F16(h))
                };
                v.widen_into(&mut w);
                w
            };
            let half = if bf { Half::Bf16 } else { Half::F16 };
            let (lw, dw) = (widen(&lh), widen(&dh));
            let wide = d
                .view()
                .with_target_logits(Logits {
                    values: &lw,
                    temperature: &temps,
                })
                .with_draft_probs(&dw);
            let narrow = d
                .view()
                .with_target_logits_half(HalfLogits {
                    values: half(&lh),
                    temperature: &temps,
                })
                .with_draft_probs_half(half(&dh));
            for (a, b) in [
                (wide, narrow),
                (wide.with_filters(&f_km), narrow.with_filters(&f_km)),
                (wide.with_filters(&f_p), narrow.with_filters(&f_p)),
            ] {
                let want = run(m, &a);
                assert_eq!(run(m, &b), want, "batch {i}, bf16 {bf}");
                let mut got = OutData::new(3, d.k_max);
                cpu.verify(m, Check::Cheap, &b, &mut got.view())
                    .expect("valid batch");
                assert_eq!(got, want, "CPU, batch {i}, bf16 {bf}");
            }
        }
    }
}

/// Half-precision target *probabilities* (a `Target::Probs` of half rows, which the typed batch
/// lets a runtime write) give the bits of their widened binary32 rows, with and without
/// filters, on the reference and the CPU backend; the GPU path refuses them with a typed error.
#[test]
fn half_probabilities_equal_their_widened_values() {
    let mut g = Gen(0xF117_0004);
    let cpu = CpuVerifier::<K>::new(2).expect("pool");
    for i in 0..40 {
        let vocab = 32 + g.below(3000);
        let d = sized_batch(&mut g, 3, vocab, 3, true);
        let (top_k, top_p, min_p) = random_filters(&mut g, 3, d.vocab);
        let f_kp = filters_of(3, Some(&top_k), Some(&top_p), None).expect("a part");
        let f_m = filters_of(3, None, None, Some(&min_p)).expect("a part");
        let m = METHODS[i % 3];
        let stride = d.view().target.rows().stride;
        for bf in [true, false] {
            let h = if bf {
                to_bf16(&d.target_probs)
            } else {
                to_f16(&d.target_probs)
            };
            let half = if bf { Half::Bf16(&h) } else { Half::F16(&h) };
            let mut w = vec![0f32; h.len()];
            Values::Half(half).widen_into(&mut w);
            let wide = d.view().with_target(Target::Probs(Rows::f32(&w, stride)));
            let narrow = d
                .view()
                .with_target(Target::Probs(Rows::half(half, stride)));
            assert_eq!(
                validate_with::<K>(
                    specula_core::gpu::SUPPORT,
                    m,
                    Check::Cheap,
                    &narrow,
                    &OutData::new(3, d.k_max).view()
                ),
                Err(VerifyError::Unsupported {
                    feature: Feature::HalfProbs
                })
            );
            for (n, (a, b)) in [
                (wide, narrow),
                (wide.with_filters(&f_kp), narrow.with_filters(&f_kp)),
                (wide.with_filters(&f_m), narrow.with_filters(&f_m)),
            ]
            .into_iter()
            .enumerate()
            {
                let want = run(m, &a);
                assert_eq!(run(m, &b), want, "batch {i}, pair {n}, bf16 {bf}");
                let mut got = OutData::new(3, d.k_max);
                cpu.verify(m, Check::Cheap, &b, &mut got.view())
                    .expect("valid batch");
                assert_eq!(got, want, "CPU, batch {i}, pair {n}, {m:?}, bf16 {bf}");
            }
        }
    }
}

/// The kept set by sorting, as `core/DETERMINISM.md` reads: `(count kept, threshold value)`.
fn kept_by_sort(w: &[f32], f: Filter) -> usize {
    let mut s: Vec<f32> = w.iter().copied().filter(|&x| x > 0.0).collect();
    s.sort_by(|a, b| b.total_cmp(a));
    let mut th = 0f32;
    if f.min_p > 0.0 {
        th = f.min_p * s[0];
    }
    if f.top_k > 0 && f.top_k as usize <= w.len() && (f.top_k as usize) <= s.len() {
        th = th.max(s[f.top_k as usize - 1]);
    }
    let fix = |x: f32| (f64::from(x) * 18_446_744_073_709_551_616.0) as u128;
    if f.top_p < 1.0 {
        let kept: Vec<f32> = s.iter().copied().filter(|&x| x >= th).collect();
        let mass: u128 = kept.iter().map(|&x| fix(x)).sum();
        let target = f64::from(f.top_p) * (mass as f64);
        // Walk down by distinct values: the first value whose cumulative mass (ties included)
        // reaches the target is the threshold.
        let mut acc = 0u128;
        let mut i = 0;
        while i < kept.len() {
            let v = kept[i];
            while i < kept.len() && kept[i] == v {
                acc += fix(kept[i]);
                i += 1;
            }
            if acc as f64 >= target {
                th = th.max(v);
                break;
            }
        }
    }
    w.iter().filter(|&&x| x > 0.0 && x >= th).count()
}

/// At V = 32768 with many tied weights: the reference's kept set (ids with a non-zero
/// processed probability) equals the sort-based reading of the rules for every filter mix, and
/// the kept probabilities sum to 1.
#[test]
fn kept_set_is_the_sorted_definition_at_32k() {
    const V: usize = 32_768;
    let mut g = Gen(0xF117_0004);
    for round in 0..12 {
        // Quantised weights: many ties, including at the boundaries.
        let w: Vec<f32> = (0..V)
            .map(|_| {
                let u = g.unit();
                (u * u * u * 64.0).floor() / 64.0
            })
            .collect();
        for f in [
            Filter::NONE.with_top_k(1 + g.below(500) as u32),
            Filter::NONE.with_top_p(0.05 + 0.9 * g.unit()),
            Filter::NONE.with_min_p(0.5 * g.unit()),
            Filter::NONE
                .with_top_k(1 + g.below(5000) as u32)
                .with_top_p(0.1 + 0.85 * g.unit())
                .with_min_p(0.1 * g.unit()),
        ] {
            let pr = Processed::of(Values::F32(&w), None, f);
            let p: Vec<f32> = w.iter().map(|&x| pr.p(x)).collect();
            let kept = p.iter().filter(|&&x| x > 0.0).count();
            assert_eq!(kept, kept_by_sort(&w, f), "round {round}, {f:?}");
            // Kept ids keep their order and all ties together.
            let min_kept = w
                .iter()
                .zip(&p)
                .filter(|(_, q)| **q > 0.0)
                .map(|(x, _)| *x)
                .fold(f32::INFINITY, f32::min);
            assert!(
                w.iter()
                    .zip(&p)
                    .all(|(&x, &q)| (q > 0.0) == (x >= min_kept)),
                "round {round}, {f:?}: not an upper set"
            );
            let s: f64 = p.iter().map(|&x| f64::from(x)).sum();
            assert!((s - 1.0).abs() < 1e-4, "round {round}: sum {s}");
        }
    }
}

/// Bad filter parameters and conflicting inputs are typed errors, nothing is counted, and a
/// backend without the support refuses them.
#[test]
fn bad_filter_inputs_are_typed_errors() {
    let mut g = Gen(0xF117_0005);
    let d = sized_batch(&mut g, 2, 16, 2, false);
    let cpu = CpuVerifier::<K>::new(1).expect("verifier");
    let check = |batch: &Batch<'_>, want: VerifyError| {
        let mut out = OutData::new(2, d.k_max);
        let mut counters = Counters::<K>::ZERO;
        assert_eq!(
            verify_batch(
                Method::Rejection,
                Check::Cheap,
                batch,
                &mut out.view(),
                &mut counters
            ),
            Err(want)
        );
        assert_eq!(
            cpu.verify(Method::Rejection, Check::Cheap, batch, &mut out.view()),
            Err(want)
        );
        assert_eq!(out, OutData::new(2, d.k_max), "outputs written on error");
        assert!(cpu.totals().is_zero(), "counted on error");
    };
    for bad in [0.0, -0.5, 1.5, f32::NAN, f32::INFINITY] {
        check(
            &d.view()
                .with_filters(&[Filter::NONE, Filter::NONE.with_top_p(bad)]),
            VerifyError::BadParam {
                request: 1,
                param: Param::TopP,
            },
        );
    }
    for bad in [-0.1, 1.01, f32::NAN] {
        check(
            &d.view()
                .with_filters(&[Filter::NONE.with_min_p(bad), Filter::NONE.with_min_p(0.5)]),
            VerifyError::BadParam {
                request: 0,
                param: Param::MinP,
            },
        );
    }
    check(
        &d.view().with_filters(&[Filter::NONE.with_top_k(3)]),
        VerifyError::Length {
            param: Param::Filters,
            len: 1,
            expected: 2,
        },
    );
    // Draft probabilities in binary32 and half at once cannot be written: the draft rows are
    // one `Rows` in one format.
    let lh = to_f16(&d.target_probs);
    check(
        &d.view().with_target_logits_half(HalfLogits {
            values: Half::F16(&lh[1..]),
            temperature: &[1.0, 1.0],
        }),
        VerifyError::Length {
            param: Param::TargetLogits,
            len: lh.len() - 1,
            expected: lh.len(),
        },
    );
    // Support::PADDED refuses both features.
    let out = OutData::new(2, d.k_max);
    let mut o = out.clone();
    let v = |b: &Batch<'_>, o: &mut OutData| {
        validate_with::<K>(Support::PADDED, Method::Greedy, Check::Cheap, b, &o.view())
    };
    assert_eq!(
        v(&d.view().with_filters(&[Filter::NONE; 2]), &mut o),
        Err(VerifyError::Unsupported {
            feature: Feature::Filters
        })
    );
    let dh = to_bf16(d.draft_probs.as_deref().expect("draft probabilities"));
    assert_eq!(
        v(&d.view().with_draft_probs_half(Half::Bf16(&dh)), &mut o),
        Err(VerifyError::Unsupported {
            feature: Feature::Half
        })
    );
    // The reference as a backend supports both.
    assert!(Reference::<K>::new().counters.is_zero());
}

/// A greedy request (T = 0) and sampled ones with filters in one batch: the greedy request
/// gives the bits it gives alone, whatever the others' filters.
#[test]
fn greedy_and_filtered_requests_mix() {
    let mut g = Gen(0xF117_0007);
    for i in 0..40 {
        let d = sized_batch(&mut g, 4, 500, 3, true);
        let (logits, mut temps) = random_logits(&mut g, &d);
        temps[1] = 0.0;
        let (top_k, top_p, min_p) = random_filters(&mut g, 4, d.vocab);
        let f_kpm = filters_of(4, Some(&top_k), Some(&top_p), Some(&min_p)).expect("a part");
        let m = METHODS[i % 3];
        let batch = d
            .view()
            .with_target_logits(Logits {
                values: &logits,
                temperature: &temps,
            })
            .with_filters(&f_kpm);
        let all = run(m, &batch);
        // Request 1 alone, greedy on its logits, no filter.
        let w = d.k_max + 1;
        let rows = &logits[w * d.vocab..2 * w * d.vocab];
        let alone = Batch::dense(
            Dims {
                vocab: d.vocab,
                k_max: d.k_max,
            },
            Drafts {
                k: &d.k[1..2],
                ids: &d.draft_ids[d.k_max..2 * d.k_max],
            },
            rows,
            Streams {
                seed: &d.seed[1..2],
                offset: &d.offset[1..2],
            },
        );
        let one = run(Method::Greedy, &alone);
        assert_eq!(all.accepted[1], one.accepted[0], "batch {i}");
        assert_eq!(&all.tokens[w..2 * w], &one.tokens[..], "batch {i}");
    }
    // The conformance case runs too (small shapes, every combination).
    conformance::sampling_inputs(|| CpuVerifier::<K>::new(2).expect("pool"), 0xF117_0008, 200);
}

/// A method per request: a batch whose requests all carry the call's method gives the bits of
/// the call without them, and a mixed batch gives each request the bits it gets alone with its
/// own method (reference and CPU backend).
#[test]
fn a_method_per_request_is_each_request_alone() {
    let mut g = Gen(0xF117_0009);
    let cpu = CpuVerifier::<K>::new(2).expect("pool");
    for i in 0..80 {
        let d = sized_batch(&mut g, 5, 300, 3, true);
        let (logits, temps) = random_logits(&mut g, &d);
        let methods: Vec<Method> = (0..5).map(|_| METHODS[g.below(3)]).collect();
        let lv = Logits {
            values: &logits,
            temperature: &temps,
        };
        for base in [d.view(), d.view().with_target_logits(lv)] {
            for m in METHODS {
                let same = vec![m; 5];
                assert_eq!(
                    run(m, &base.with_methods(&same)),
                    run(m, &base),
                    "batch {i}"
                );
            }
            let mixed = base.with_methods(&methods);
            let got = run(Method::Rejection, &mixed);
            let mut cpu_out = OutData::new(5, d.k_max);
            cpu.verify(Method::Rejection, Check::Cheap, &mixed, &mut cpu_out.view())
                .expect("valid batch");
            assert_eq!(cpu_out, got, "CPU, batch {i}");
            let w = d.k_max + 1;
            for b in 0..5 {
                let alone = run(methods[b], &base);
                assert_eq!(got.accepted[b], alone.accepted[b], "batch {i}, request {b}");
                assert_eq!(
                    &got.tokens[b * w..(b + 1) * w],
                    &alone.tokens[b * w..(b + 1) * w],
                    "batch {i}, request {b}"
                );
            }
        }
    }
    let out = OutData::new(5, 3);
    let d = sized_batch(&mut g, 5, 30, 3, true);
    let methods = [Method::Greedy; 5];
    assert_eq!(
        validate_with::<K>(
            Support::PADDED,
            Method::Greedy,
            Check::Cheap,
            &d.view().with_methods(&methods),
            &out.clone().view(),
        ),
        Err(VerifyError::Unsupported {
            feature: Feature::Methods
        })
    );
    assert_eq!(
        validate_with::<K>(
            Support::ALL,
            Method::Greedy,
            Check::Cheap,
            &d.view().with_methods(&methods[..4]),
            &out.clone().view(),
        ),
        Err(VerifyError::Length {
            param: Param::Methods,
            len: 4,
            expected: 5
        })
    );
}

/// vLLM's recovered tokens with filters, bf16 logits, per-request methods and bonus tokens in
/// the ragged layout: the CPU backend gives the reference's, and at each request's first
/// rejected position the recovered token is the emitted one.
#[test]
fn recovered_tokens_follow_the_filters() {
    use specula_core::verify::{draft_slots, recovered_tokens};
    let mut g = Gen(0xF117_000A);
    let cpu = CpuVerifier::<K>::new(2).expect("pool");
    let mut firsts = 0;
    for i in 0..40 {
        let d = sized_batch(&mut g, 4, 700, 3, true);
        let (logits, temps) = random_logits(&mut g, &d);
        let (top_k, top_p, min_p) = random_filters(&mut g, 4, d.vocab);
        let f_kpm = filters_of(4, Some(&top_k), Some(&top_p), Some(&min_p)).expect("a part");
        let methods: Vec<Method> = (0..4).map(|_| METHODS[g.below(3)]).collect();
        let bonus: Vec<u32> = (0..4).map(|_| g.below(d.vocab) as u32).collect();
        let mut as_logits = d.clone();
        as_logits.target_probs = logits.clone();
        let r = RaggedData::from_padded(&as_logits, Some(&bonus));
        let rb = to_bf16(&r.target_probs);
        let batch = r
            .view()
            .with_target_logits_half(HalfLogits {
                values: Half::Bf16(&rb),
                temperature: &temps,
            })
            .with_filters(&f_kpm)
            .with_methods(&methods);
        let m = Method::Rejection;
        let slots = draft_slots(&batch);
        let mut want = vec![0u32; slots];
        recovered_tokens::<K>(m, Check::STRICT, &batch, &mut want).expect("valid batch");
        let mut got = vec![1u32; slots];
        cpu.recovered_tokens(m, Check::STRICT, &batch, &mut got)
            .expect("valid batch");
        assert_eq!(got, want, "batch {i}");
        let out = run(m, &batch);
        let w = batch.k_max + 1;
        let mut start = 0;
        for b in 0..4 {
            let k = batch.draft_len(b) as usize;
            let a = out.accepted[b] as usize;
            if a < k {
                assert_eq!(
                    out.tokens[b * w + a],
                    want[start + a],
                    "batch {i}, request {b}"
                );
                firsts += 1;
            }
            start += k;
        }
    }
    assert!(firsts > 20, "only {firsts} rejections");
}
