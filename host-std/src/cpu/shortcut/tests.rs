use crate::cpu::{CpuVerifier, kernels};
use specula_core::verify::exponential::accepts;
use specula_core::verify::philox::accept_draw;
use specula_core::verify::{
    AcceptedOut, Batch, Check, Cut, Dims, Drafts, Filter, Half, HalfLogits, Logits, Method,
    Outputs, Processed, ScalarOps, Streams, TokensOut, Values, softmax_exp, verify_request,
};

/// The sum bound's acceptance (`verify_rejection_lazy_in`) is the exact test's, attacked
/// where it is closest: at the seeds whose `U·q(x)` lies between the bound's lower bound of
/// `p(x)` and its upper bound or the filtered `p(x)` (the exact pass decides there, on
/// both sides of `p(x)` where `p(x) < q(x)`), and at others, the CPU backend's tokens are
/// the core reference's on the logits themselves, without a filter and with each filter
/// (the drafted token the row's largest weight, as the filtered rows' bound needs).
#[test]
fn sum_bound_decides_as_the_exact_test() {
    let (v, k, t) = (32_000, 2, 0.8f32);
    let mut x = 0x5EED_u64;
    let mut unif = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        ((x >> 40) as f32 + 0.5) / 16_777_216.0
    };
    // bf16 values, so that the bf16 rows (the half rows' path) hold the same logits.
    let mut logits: Vec<f32> = (0..(k + 1) * v)
        .map(|_| f32::from_bits((6.0 * unif() - 3.0).to_bits() & 0xFFFF_0000))
        .collect();
    // The drafted tokens hold a good part of their rows' mass.
    logits[17] = 9.0;
    logits[v + 4242] = 9.5;
    let bits: Vec<u16> = logits.iter().map(|l| (l.to_bits() >> 16) as u16).collect();
    let draft: Vec<f32> = (0..k * v)
        .map(|i| match (i / v, i % v) {
            (0, 17) => 0.4,
            // Below its plain softmax `p`: a cut token the bound must not accept.
            (0, 18) => 1e-6,
            (0, _) => 0.6 / (v - 2) as f32,
            (_, 4242) => 0.5,
            _ => 0.5 / (v - 1) as f32,
        })
        .collect();
    let pd = draft[17];
    let isa = kernels::Isa::detect();
    let row = &logits[..v];
    let bound = kernels::sum_bound(isa, row, t, None).expect("finite");
    let e = softmax_exp(row[17], t, bound.m);
    let (lo, hi) = bound.p_range(e).expect("narrow");
    // The bf16 row holds the same values: the same bound.
    let half = kernels::sum_bound(isa, kernels::Bf16Row(&bits[..v]), t, None).expect("finite");
    assert_eq!(half.p_range(e), Some((lo, hi)));
    // The same rows as stored probabilities (their softmax).
    let stored: Vec<f32> = logits
        .chunks_exact(v)
        .flat_map(|r| {
            let pr = Processed::of(Values::F32(r), Some(t), Filter::NONE);
            r.iter().map(move |&l| pr.p(l))
        })
        .collect();
    let prow = &stored[..v];
    let verifier = CpuVerifier::<8>::new(1).expect("pool");
    for filter in [
        Filter::NONE,
        Filter::NONE.with_top_p(0.9),
        Filter::NONE.with_top_k(50).with_top_p(0.9),
        Filter::NONE.with_min_p(0.05),
        Filter::NONE.with_top_k(1),
    ] {
        let exact = Processed::of(Values::F32(row), Some(t), filter).p(row[17]);
        assert!(lo <= exact && lo < hi, "{filter:?}: {lo} {exact} {hi}");
        for kind in ["f32", "bf16", "probs"] {
            // The lower bound each kind's shortcut uses: the sum bound's (logits), a
            // probability's stored value over the row's mass.
            let (lo, exact, top) = match kind {
                "f32" | "bf16" => (lo, exact, exact.max(hi)),
                _ => {
                    let mass = kernels::max_mass(isa, prow).1;
                    let lo = Cut {
                        threshold: 0,
                        fixed: mass,
                    }
                    .p(prow[17]);
                    let exact = Processed::of(Values::F32(prow), None, filter).p(prow[17]);
                    (lo, exact, exact.max(lo))
                }
            };
            let (mut inside_accepted, mut inside_rejected, mut outside) = (0, 0, 0);
            for seed in 0..60_000u64 {
                let u = accept_draw(seed, 0, 0);
                let class = if accepts(u, lo, pd) || !accepts(u, top, pd) {
                    &mut outside
                } else if accepts(u, exact, pd) {
                    &mut inside_accepted
                } else {
                    &mut inside_rejected
                };
                *class += 1;
                if *class > 30 {
                    continue;
                }
                // And a drafted token that is not its row's largest (a filter may cut it).
                for ids in [[17u32, 4242], [18, 4242]] {
                    if ids[0] == 18 && seed >= 40 {
                        continue;
                    }
                    let (ks, seeds, temps, filters) = ([k as u32], [seed], [t], [filter]);
                    let target: &[f32] = if kind == "probs" { &stored } else { &[] };
                    let batch = Batch::dense(
                        Dims { vocab: v, k_max: k },
                        Drafts { k: &ks, ids: &ids },
                        target,
                        Streams {
                            seed: &seeds,
                            offset: &[0],
                        },
                    )
                    .with_draft_probs(&draft)
                    .with_filters(&filters);
                    let batch = match kind {
                        "bf16" => batch.with_target_logits_half(HalfLogits {
                            values: Half::Bf16(&bits),
                            temperature: &temps,
                        }),
                        "f32" => batch.with_target_logits(Logits {
                            values: &logits,
                            temperature: &temps,
                        }),
                        _ => batch,
                    };
                    let mut want = [0u32; 3];
                    let acc = verify_request(&ScalarOps, Method::Rejection, &batch, 0, &mut want);
                    let (mut accepted, mut tokens) = ([0u32; 1], [0u32; 3]);
                    verifier
                        .verify(
                            Method::Rejection,
                            Check::STRICT,
                            &batch,
                            &mut Outputs::new(AcceptedOut(&mut accepted), TokensOut(&mut tokens)),
                        )
                        .expect("valid");
                    assert_eq!(
                        (accepted[0], tokens),
                        (acc, want),
                        "{filter:?} {ids:?} {kind} seed {seed}"
                    );
                }
            }
            // Seeds the bound leaves to the exact test and it rejects, where there are: none
            // when a filter's `p(x)` lies above the bound's range (rejected rows always take
            // the exact pass there).
            let rejections = if kind != "probs" && exact < hi { 3 } else { 0 };
            // Without a filter stored probabilities have no shortcut to attack.
            let accepted = if kind == "probs" && filter == Filter::NONE {
                0
            } else {
                3
            };
            assert!(
                inside_accepted >= accepted && inside_rejected >= rejections,
                "{filter:?} {kind}: {inside_accepted} {inside_rejected}"
            );
        }
    }
}

/// Drafted ids that are not their row's largest but that a filter keeps (min-p alone, top-p
/// alone), attacked where the shortcut is closest to being wrong: ids of every rank, the ids
/// around top-p's crossing (kept by a hair, cut by a hair) and min-p's threshold, at the seeds
/// whose `U·q(x)` falls just below, at and above the exact filtered `p(x)`. Every position
/// [`quick_accept`] decides is one the exact test accepts, with a value at most `p(x)`; and it
/// decides most of the clearly kept ids' seeds that their unfiltered `p` accepts (else the
/// shortcut would be dead).
/// binary32 and bf16 logits and stored binary32 probabilities, a flat row and a peaked one.
#[test]
fn kept_ids_decide_as_the_exact_test() {
    use super::quick_accept;
    use crate::cpu::Src;
    // Each call reads the row: smaller where the tests run unoptimised.
    let (v, seeds) = if cfg!(debug_assertions) {
        (4096, 60)
    } else {
        (32_000, 400)
    };
    let t = 0.8f32;
    let mut x = 0x00C0_FFEE_u64;
    let mut unif = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        ((x >> 40) as f32 + 0.5) / 16_777_216.0
    };
    for shape in ["flat", "peaked"] {
        // bf16 values, so that the bf16 row holds the same logits.
        let mut logits: Vec<f32> = (0..v)
            .map(|_| f32::from_bits((3.0 * unif().ln()).to_bits() & 0xFFFF_0000))
            .collect();
        if shape == "peaked" {
            logits[v / 2] = 12.0;
        }
        let bits: Vec<u16> = logits.iter().map(|l| (l.to_bits() >> 16) as u16).collect();
        let plain = Processed::of(Values::F32(&logits), Some(t), Filter::NONE);
        let probs: Vec<f32> = logits.iter().map(|&l| plain.p(l)).collect();
        // Ids from the largest weight down.
        let mut order: Vec<usize> = (0..v).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
        for filter in [
            Filter::NONE.with_top_p(0.9),
            Filter::NONE.with_top_p(0.3),
            Filter::NONE.with_min_p(0.05),
            Filter::NONE.with_min_p(0.3),
        ] {
            for kind in ["f32", "bf16", "probs"] {
                let (src, tt, values) = match kind {
                    "f32" => (Src::F32(&logits), Some(t), Values::F32(&logits)),
                    "bf16" => (
                        Src::Bf16(kernels::Bf16Row(&bits)),
                        Some(t),
                        Values::Half(Half::Bf16(&bits)),
                    ),
                    _ => (Src::F32(&probs), None, Values::F32(&probs)),
                };
                let exact = Processed::of(values, tt, filter);
                let value = |i: usize| if kind == "probs" { probs[i] } else { logits[i] };
                let p = |i: usize| exact.p(value(i));
                // The last kept rank, and ranks around it and across the row.
                let last = order.iter().rposition(|&i| p(i) > 0.0).expect("one kept");
                let mut ranks: Vec<usize> = vec![1, 2, 5, 20, 100, last / 2];
                ranks.extend(last.saturating_sub(3)..(last + 4).min(v));
                let (mut decided, mut clear_accepted) = (0, 0);
                for rank in ranks {
                    let id = order[rank];
                    let pe = p(id);
                    // U·q(x) ranges over [0, 2·p(x)]: half the seeds accept.
                    let q = if pe > 0.0 { pe * 2.0 } else { 1e-3 };
                    for seed in 0..seeds {
                        let u = accept_draw(seed, 0, 0);
                        let (quick, _) = quick_accept(src, tt, filter, id, |pt| accepts(u, pt, q));
                        let what = format!("{shape} {filter:?} {kind} rank {rank} seed {seed}");
                        if let Some(pt) = quick {
                            assert!(accepts(u, pe, q) && pt <= pe, "{what}: {pt} {pe}");
                            decided += 1;
                        }
                        // Accepted with room by the id's unfiltered `p` (the lower bound a
                        // kept id's shortcut reads: the bound's width is far below 1 %),
                        // an id far from the filter's edge.
                        if rank <= last / 2 && accepts(u, plain.p(logits[id]) * 0.99, q) {
                            clear_accepted += 1;
                        }
                    }
                }
                // Stored probabilities with min-p have no shortcut (their cut is one pass).
                let has = kind != "probs" || filter.min_p == 0.0;
                assert!(
                    !has || decided * 10 >= clear_accepted * 9,
                    "{shape} {filter:?} {kind}: {decided} of {clear_accepted} decided"
                );
            }
        }
    }
}
