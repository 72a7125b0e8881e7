use super::*;
use specula_core::verify::{softmax_exp, softmax_max, weight_fixed};

/// The mass of a key from its bits is `weight_fixed` for every weight in `(0, 1]`.
#[test]
fn fixed_of_key_is_weight_fixed() {
    for key in (1..=ONE_KEY)
        .step_by(7)
        .chain([1, 2, 0x0080_0000, ONE_KEY - 1, ONE_KEY])
    {
        assert_eq!(
            fixed_of_key(key),
            weight_fixed(f32::from_bits(key)),
            "{key:#x}"
        );
    }
}

/// The softmax weights of `logits` at `t` (the core's) and their whole mass.
fn weights(logits: &[f32], t: f32) -> (Vec<f32>, u128) {
    let mut m = f32::NEG_INFINITY;
    for &l in logits {
        m = softmax_max(m, l / t);
    }
    assert!(m.is_finite());
    let w: Vec<f32> = logits.iter().map(|&l| softmax_exp(l, t, m)).collect();
    let total = w.iter().map(|&x| weight_fixed(x)).sum();
    (w, total)
}

fn filters() -> Vec<Filter> {
    let f = |top_k, top_p, min_p| {
        Filter::NONE
            .with_top_k(top_k)
            .with_top_p(top_p)
            .with_min_p(min_p)
    };
    vec![
        f(50, 1.0, 0.0),
        f(1, 1.0, 0.0),
        f(1000, 1.0, 0.0),
        f(0, 0.9, 0.0),
        f(0, 0.5, 0.0),
        f(0, 0.999, 0.0),
        f(0, 1e-6, 0.0),
        f(0, 1.0, 0.05),
        f(0, 1.0, 0.9),
        f(50, 0.9, 0.0),
        f(20, 0.95, 0.1),
        f(0, 0.8, 0.02),
        f(40_000, 0.9, 0.0),
        f(200_000, 0.7, 0.0),
    ]
}

/// Rows of `vocab` logits of shape `kind`: 0 a long tail (`3·ln u`); 1 coarse steps (many
/// ties at every threshold, the maximum shared by hundreds of ids); 2 and 3 built to
/// mislead the sample (it sees only the low logits, or only the high ones); 4 a language
/// model's usual output (one id with p ≈ 0.7 at T = 0.8 over a `2·N(0, 1)` background:
/// the sample mostly misses the id that holds the mass); 5 two ids holding about 0.45 and
/// 0.25; 6 kind 4 with 90 % of the ids masked to `−∞` (weight 0).
fn row(next: &mut impl FnMut() -> f32, vocab: usize, kind: usize) -> Vec<f32> {
    let mut in_sample = vec![false; vocab];
    for j in 0..vocab / stride(vocab) {
        in_sample[sample_id(vocab, j)] = true;
    }
    let mut normal = || {
        let (u, v) = (f64::from(next()) + 1e-9, f64::from(next()));
        ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
    };
    let mut logits: Vec<f32> = match kind {
        0 => (0..vocab).map(|_| 3.0 * (next() + 1e-6).ln()).collect(),
        1 => (0..vocab)
            .map(|_| (16.0 * (next() + 1e-6).ln()).round() / 4.0)
            .collect(),
        2 => (0..vocab)
            .map(|i| {
                if in_sample[i] {
                    -20.0 + next()
                } else {
                    3.0 * (next() + 1e-6).ln()
                }
            })
            .collect(),
        3 => (0..vocab)
            .map(|i| {
                if in_sample[i] {
                    next()
                } else {
                    -10.0 + 3.0 * (next() + 1e-6).ln()
                }
            })
            .collect(),
        _ => (0..vocab).map(|_| 2.0 * normal()).collect(),
    };
    if kind >= 4 {
        if kind == 6 {
            for (i, l) in logits.iter_mut().enumerate() {
                if i % 10 != 3 {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        // exp(L/T) = share/(1 − shares) · Σ exp(l/T) of the rest (T = 0.8).
        let shares: &[f64] = if kind == 5 { &[0.45, 0.25] } else { &[0.7] };
        let rest: f64 = logits.iter().map(|&l| (f64::from(l) / 0.8).exp()).sum();
        let free = 1.0 - shares.iter().sum::<f64>();
        for (j, share) in shares.iter().enumerate() {
            let id = (vocab / 3 + 7919 * j) % vocab;
            logits[id] = (0.8 * (rest * share / free).ln()) as f32;
        }
    }
    logits
}

/// The candidate cut is [`Cut::of`] (threshold and kept mass) at the vocabularies users
/// run, for realistic rows (flat and peaked), rows with many ties, rows with most ids
/// masked, and rows built to mislead the sample (the largest weights exactly where it does
/// not look), on every instruction set; and on the realistic rows the candidates decide it
/// at the first try (the path is taken).
#[test]
fn candidate_cut_is_the_cut() {
    let mut s = 0xC0_7C07u64;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 40) as f32 / 16_777_216.0
    };
    let mut cands = Vec::new();
    for vocab in [32_000usize, 128_256, 151_936, 256_000] {
        for kind in 0..7 {
            let logits = row(&mut next, vocab, kind);
            let (w, total) = weights(&logits, 0.8);
            for f in filters() {
                let want = Cut::of(&w[..], f);
                // `softmax_cut` is the candidate cut or else `Cut::of`: the wrapper once, the
                // candidates on every set (a fall-back on every set would redo `Cut::of`, most
                // of this test's time unoptimised).
                assert_eq!(
                    softmax_cut(Isa::detect(), &w, f, Some(total), &mut cands),
                    want,
                    "V {vocab} kind {kind} {f:?}"
                );
                for isa in Isa::available() {
                    if let Some(got) = candidate_cut(isa, &w, f, ONE_KEY, Some(total), &mut cands) {
                        assert_eq!(got, want, "{isa:?} V {vocab} kind {kind} {f:?}");
                    }
                }
                // Realistic settings (not top-p 0.999 or 1e-6: those fall back, exactly).
                if [0, 4, 5, 6].contains(&kind)
                    && f.top_k < 10_000
                    && (0.1..=0.95).contains(&f.top_p)
                {
                    let fast =
                        candidate_cut(Isa::detect(), &w, f, ONE_KEY, Some(total), &mut cands);
                    assert_eq!(fast, Some(want), "V {vocab} kind {kind} {f:?}: not decided");
                }
            }
        }
    }
}

/// [`probs_cut`] is [`Cut::of`] on probability rows (the softmax of the shapes of
/// [`row`], in binary64, rounded), and on rows no softmax gives (a value above 1, `+∞`,
/// NaN, negative values), on every instruction set; on the realistic rows the candidates
/// decide it.
#[test]
fn probs_cut_is_the_cut() {
    let mut s = 0x9B0B_5EEDu64;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 40) as f32 / 16_777_216.0
    };
    let mut cands = Vec::new();
    for vocab in [32_000usize, 128_256, 151_936, 256_000] {
        for kind in 0..7 {
            let logits = row(&mut next, vocab, kind);
            let m = logits
                .iter()
                .fold(f64::NEG_INFINITY, |m, &l| m.max(f64::from(l)));
            let e: Vec<f64> = logits
                .iter()
                .map(|&l| ((f64::from(l) - m) / 0.8).exp())
                .collect();
            let sum: f64 = e.iter().sum();
            let probs: Vec<f32> = e.iter().map(|&x| (x / sum) as f32).collect();
            // The odd values on two shapes only (the whole-row search is slow unoptimised).
            let odds = if kind == 0 || kind == 4 {
                &[
                    None,
                    Some(1.5f32),
                    Some(f32::INFINITY),
                    Some(f32::NAN),
                    Some(-0.25),
                ][..]
            } else {
                &[None][..]
            };
            for &odd in odds {
                let mut p = probs.clone();
                if let Some(x) = odd {
                    p[vocab / 2] = x;
                    p[7] = x;
                }
                for f in filters() {
                    let want = Cut::of(&p[..], f);
                    // As in `candidate_cut_is_the_cut`: the wrapper once, the candidates on
                    // every set.
                    // Also with the row's maximum and mass handed in, as the CPU backend's
                    // lazy rows do.
                    let found =
                        probs_needs_mass(f, p.len()).then(|| kernels::max_mass(Isa::detect(), &p));
                    for known in [None, found]
                        .into_iter()
                        .take(1 + usize::from(found.is_some()))
                    {
                        assert_eq!(
                            probs_cut(Isa::detect(), &p, f, known, &mut cands),
                            want,
                            "V {vocab} kind {kind} {odd:?} {f:?} {known:?}"
                        );
                    }
                    for isa in Isa::available() {
                        if let Some(got) = probs_candidate_cut(isa, &p, f, None, &mut cands) {
                            assert_eq!(got, want, "{isa:?} V {vocab} kind {kind} {odd:?} {f:?}");
                        }
                    }
                    if odd.is_none()
                        && [0, 4, 5, 6].contains(&kind)
                        && f.top_k < 10_000
                        && (0.1..=0.95).contains(&f.top_p)
                    {
                        let fast = probs_candidate_cut(Isa::detect(), &p, f, None, &mut cands);
                        assert_eq!(fast, Some(want), "V {vocab} kind {kind} {f:?}: not decided");
                    }
                }
            }
        }
    }
}

/// On rows shaped like a language model's output, a new one per row, top-p alone is
/// decided by the candidates at the first try on every row: a fall-back to the whole-row
/// search costs about ten passes, so even one row in twenty would double a batch's time.
#[test]
fn peaked_rows_take_the_candidate_path() {
    let mut s = 0x9EA_4ED5u64;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 40) as f32 / 16_777_216.0
    };
    let mut cands = Vec::new();
    for vocab in [32_000usize, 128_256] {
        for round in 0..24 {
            let logits = row(&mut next, vocab, 4 + round % 3);
            let (w, total) = weights(&logits, 0.8);
            for top_p in [0.9f32, 0.8, 0.95] {
                let f = Filter::NONE.with_top_p(top_p);
                let fast = try_cut(Isa::detect(), &w, f, ONE_KEY, Some(total), &mut cands, 0);
                assert_eq!(
                    fast,
                    Some(Cut::of(&w[..], f)),
                    "V {vocab} round {round} kind {} {f:?}",
                    4 + round % 3
                );
            }
        }
    }
}

/// Peaked rows at the vocabularies engines ship (Llama 2 32000, Llama 3 128256, Qwen2 152064,
/// Gemma 256000) in the forms that stress a threshold: the dominant weight shared by three
/// ids, the background rounded to bf16 (hundreds of ids tied at the crossing), and half the
/// vocabulary masked to `−∞`; as softmax weights and as stored probabilities, with top-p
/// alone and behind min-p. The cut is [`Cut::of`]'s on every instruction set, and the
/// candidates decide top-p 0.9 alone (the fast path is taken).
#[test]
fn peaked_rows_with_ties_and_masks_at_real_vocabularies() {
    let mut s = 0x7E_D1E5u64;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 40) as f32 / 16_777_216.0
    };
    let mut cands = Vec::new();
    for vocab in [32_000usize, 128_256, 152_064, 256_000] {
        for shape in 0..3 {
            let mut logits = row(&mut next, vocab, 4);
            let top = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            match shape {
                // Three ids share the largest logit.
                0 => {
                    logits[1] = top;
                    logits[vocab - 1] = top;
                }
                // bf16 logits: 8 significand bits.
                1 => {
                    for l in &mut logits {
                        *l = f32::from_bits(l.to_bits() & 0xFFFF_0000);
                    }
                }
                // Every other id masked (the dominant one kept).
                _ => {
                    for (i, l) in logits.iter_mut().enumerate() {
                        if i % 2 == 1 && *l < top {
                            *l = f32::NEG_INFINITY;
                        }
                    }
                }
            }
            let (w, total) = weights(&logits, 0.8);
            let sum: f64 = w.iter().map(|&x| f64::from(x)).sum();
            let probs: Vec<f32> = w.iter().map(|&x| (f64::from(x) / sum) as f32).collect();
            for f in [
                Filter::NONE.with_top_p(0.9),
                Filter::NONE.with_top_p(0.9).with_min_p(0.001),
            ] {
                let want = Cut::of(&w[..], f);
                let want_p = Cut::of(&probs[..], f);
                for isa in Isa::available() {
                    let got = softmax_cut(isa, &w, f, Some(total), &mut cands);
                    assert_eq!(got, want, "{isa:?} V {vocab} shape {shape} {f:?}");
                    let got = probs_cut(isa, &probs, f, None, &mut cands);
                    assert_eq!(got, want_p, "{isa:?} V {vocab} shape {shape} {f:?} probs");
                }
                if f.min_p == 0.0 {
                    let fast = try_cut(Isa::detect(), &w, f, ONE_KEY, Some(total), &mut cands, 0);
                    assert_eq!(fast, Some(want), "V {vocab} shape {shape}: not decided");
                    let fast = probs_candidate_cut(Isa::detect(), &probs, f, None, &mut cands);
                    assert_eq!(
                        fast,
                        Some(want_p),
                        "V {vocab} shape {shape}: probs not decided"
                    );
                }
            }
        }
    }
}

/// Times top-p's cut on peaked rows, step by step (`cargo test --release -p specula --lib --
/// --ignored --nocapture top_p_cut_timing`), in this thread's CPU time.
#[test]
#[ignore = "timing, run by hand"]
fn top_p_cut_timing() {
    fn cpu_s() -> f64 {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
        let f: Vec<&str> = stat
            .rsplit_once(')')
            .unwrap()
            .1
            .split_whitespace()
            .collect();
        (f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap()) / 100.0
    }
    // The least of ten means over 50 ms each: on a machine shared with other jobs the mean
    // of one long run moves with their load.
    fn time(name: &str, mut f: impl FnMut()) {
        f();
        let mut best = f64::INFINITY;
        for _ in 0..10 {
            let c0 = cpu_s();
            let mut n = 0;
            while cpu_s() - c0 < 0.05 || n < 3 {
                f();
                n += 1;
            }
            best = best.min((cpu_s() - c0) / f64::from(n));
        }
        println!("{name:<36} {:8.1} us", best * 1e6);
    }
    let mut s = 0x71_3E5u64;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 40) as f32 / 16_777_216.0
    };
    let isa = Isa::detect();
    for vocab in [32_000usize, 128_256] {
        let logits = row(&mut next, vocab, 4);
        let (w, total) = weights(&logits, 0.8);
        let f = Filter::NONE.with_top_p(0.9);
        let mut cands = Vec::new();
        let m = kernels::softmax_max(isa, &logits[..], 0.8);
        let mut out = vec![0f32; vocab];
        time(&format!("V {vocab} max"), || {
            std::hint::black_box(kernels::softmax_max(
                isa,
                std::hint::black_box(&logits[..]),
                0.8,
            ));
        });
        time(&format!("V {vocab} pass + weights"), || {
            std::hint::black_box(kernels::softmax_pass(
                isa,
                &logits[..],
                0.8,
                m,
                Some(&mut out),
            ));
        });
        time(&format!("V {vocab} top-p cut"), || {
            std::hint::black_box(softmax_cut(isa, &w, f, Some(total), &mut cands));
        });
        let (lo, hi) = sample_bracket(&w, 0.9, 0, ONE_KEY, total, 0).unwrap();
        time(&format!("V {vocab} bracket"), || {
            std::hint::black_box(sample_bracket(&w, 0.9, 0, ONE_KEY, total, 0));
        });
        for isa in Isa::available() {
            for top in [hi, u32::MAX] {
                time(&format!("V {vocab} gather {isa:?} to {top:#x}"), || {
                    cands.clear();
                    std::hint::black_box(kernels::gather_keys(isa, &w, lo, top, &mut cands, vocab));
                });
            }
        }
        let first = try_cut(isa, &w, f, ONE_KEY, Some(total), &mut cands, 0).is_some();
        cands.clear();
        kernels::gather_keys(isa, &w, lo, hi, &mut cands, vocab);
        let theta = Cut::of(&w[..], f).threshold;
        let kept = w.iter().filter(|&&x| weight_key(x) >= theta).count();
        println!(
            "V {vocab}: bracket {lo:#x}..{hi:#x}, {} candidates, {kept} kept, first try {first}",
            cands.len()
        );
    }
}
