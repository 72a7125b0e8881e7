//! The softmax passes' per-id shortcuts in the kernel text (`core/kernels/specula_verify.cu`:
//! `sp_quot` and `sp_quot2`, the quotient `RN(l / t)` from a per-row reciprocal without a
//! division, in the sum pass and in `sp_soft_e`; `sp_exp_w` / `sp_soft_fixed_w`, the sum's term
//! `floor(exp_p(z - m) 2^64)` in one multiply and one conversion), executed on the host in both
//! macro forms and attacked where their proofs (the comments above `sp_rcp` and `sp_quot2`) are
//! thin: whole binades of logits and near-midpoint quotients at
//! temperatures across the proven range and at its edges, bit for bit against the IEEE division;
//! hostile logits (NaN, ±0, −∞, subnormals, quotients that underflow or overflow) against the
//! rules' terms; and the cases that fail outside the range, so that a range test that let them in
//! would be caught.

use specula_core::verify::fmath::exp_p;
use specula_tests::conformance::Gen;
use specula_tests::kernel_host::{Mode, softmax_terms};

const MODES: [Mode; 2] = [Mode::Cuda, Mode::Hip];

/// `2^e` as binary32 (`-149 <= e <= 127`).
fn pow2(e: i32) -> f32 {
    if e >= -126 {
        f32::from_bits(((e + 127) as u32) << 23)
    } else {
        f32::from_bits(1u32 << (e + 149))
    }
}

/// The rules' term of logit `l` in a row at temperature `t` with maximum `m`:
/// `floor(exp_p(RN(l / t) - m) 2^64)`, `2^64` when `exp_p` gives 1 or more.
fn term(l: f32, t: f32, m: f32) -> u128 {
    let e = exp_p(l / t - m);
    if e >= 1.0 {
        1u128 << 64
    } else {
        (f64::from(e) * 2f64.powi(64)) as u128
    }
}

/// Temperatures inside the proven range `[2^-16, 2^16]`: its ends and their neighbours, all-ones
/// significands (the reciprocal's hardest case), powers of two (a reciprocal with no residual),
/// the usual ones.
fn temperatures(g: &mut Gen) -> Vec<f32> {
    let mut t = vec![
        pow2(-16),
        f32::from_bits(pow2(-16).to_bits() + 1),
        pow2(16),
        f32::from_bits(pow2(16).to_bits() - 1),
        f32::from_bits(0x3FFF_FFFF),
        f32::from_bits(0x3F7F_FFFF),
        f32::from_bits(0x3F80_0001),
        1.0,
        0.5,
        0.7,
        0.8,
        1.3,
        0.1,
        1e-3,
        std::f32::consts::PI,
    ];
    for _ in 0..24 {
        // Random significand and exponent in range.
        let e = g.below(33) as i32 - 16;
        let bits = (((e + 127) as u32) << 23) | (g.next_u64() as u32 & 0x7F_FFFF);
        t.push(f32::from_bits(bits).clamp(pow2(-16), pow2(16)));
    }
    t
}

/// Every binary32 quotient of the proven range equals the IEEE division: at three temperatures
/// (an all-ones significand, one near each end of the range) every logit of a whole binade and
/// its negation; at every temperature of [`temperatures`] logits whose quotient lies within a
/// few ulps of a midpoint between two binary32 numbers (the rounding's hardest cases), at every
/// exponent of the range, its ends included.
#[test]
fn quotients_without_a_division_are_the_ieee_quotients() {
    let mut g = Gen(0x5_07F7);
    let whole = [
        f32::from_bits(0x3FFF_FFFF),
        f32::from_bits(pow2(-16).to_bits() + 0x12_3457),
        f32::from_bits(pow2(15).to_bits() | 0x7F_FFFF),
    ];
    let binade: Vec<f32> = (0..1u32 << 23)
        .flat_map(|s| {
            let l = f32::from_bits(0x3F80_0000 | s);
            [l, -l]
        })
        .collect();
    for mode in MODES {
        for &t in &whole {
            let r = softmax_terms(mode, t, 0.0, &binade);
            assert!(r.ok, "{mode:?}: t = {t:e} is in the range");
            for (i, &l) in binade.iter().enumerate() {
                let want = (l / t).to_bits();
                assert_eq!(r.quot[i], want, "{mode:?}: sp_quot {l:e} / {t:e}");
                assert_eq!(r.quot2[i], want, "{mode:?}: sp_quot2 {l:e} / {t:e}");
            }
        }
    }
    for t in temperatures(&mut g) {
        let mut logits = Vec::new();
        for e in -70..=99 {
            for _ in 0..40 {
                // A binary32 k with exponent e, the midpoint above it, and l = RN(t mid): its
                // quotient is within an ulp of l of that midpoint (t mid is exact in binary64).
                let k =
                    f32::from_bits((((e + 127) as u32) << 23) | (g.next_u64() as u32 & 0x7F_FFFF));
                let mid = f64::from(k) + f64::from(f32::from_bits(k.to_bits() + 1) - k) / 2.0;
                let l = (f64::from(t) * mid) as f32;
                for d in -2i32..=2 {
                    let x = f32::from_bits(l.to_bits().wrapping_add_signed(d));
                    logits.push(x);
                    logits.push(-x);
                }
            }
        }
        // The range's ends: quotients 2^-70 and 2^100 and a few ulps around them.
        for q in [pow2(-70), pow2(100)] {
            let l = (f64::from(t) * f64::from(q)) as f32;
            for d in -3i32..=3 {
                logits.push(f32::from_bits(l.to_bits().wrapping_add_signed(d)));
            }
        }
        for mode in MODES {
            let r = softmax_terms(mode, t, 0.0, &logits);
            assert!(r.ok, "{mode:?}: t = {t:e} is in the range");
            let mut checked = 0usize;
            for (i, &l) in logits.iter().enumerate() {
                let exact = (f64::from(l) / f64::from(t)).abs();
                if (f64::from(pow2(-70))..=f64::from(pow2(100))).contains(&exact) {
                    let want = (l / t).to_bits();
                    assert_eq!(r.quot[i], want, "{mode:?}: sp_quot {l:e} / {t:e}");
                    assert_eq!(r.quot2[i], want, "{mode:?}: sp_quot2 {l:e} / {t:e}");
                    checked += 1;
                }
            }
            assert!(
                checked > logits.len() * 9 / 10,
                "{mode:?}: t = {t:e}: {checked} checked"
            );
        }
    }
}

/// Hostile logits of the kinds the proof treats apart (NaN, ±0, −∞, subnormals, quotients below
/// `2^-70`, quotients below `-2^100` and overflowing ones) and ordinary ones near the maximum,
/// in rows whose maximum is 0, tiny, ordinary or at the range's end `±2^80`: the sum pass's term
/// and `sp_soft_e`'s `e` are the rules' for every logit whose quotient is at most the maximum
/// (the premise; NaN included).
#[test]
fn softmax_terms_match_the_rules_for_hostile_logits() {
    let mut g = Gen(0x7E_A115);
    let ms = [
        0.0,
        pow2(-41),
        -pow2(-41),
        pow2(-40),
        -pow2(-40),
        1e-30,
        -1e-30,
        f32::from_bits(1),
        -f32::from_bits(1),
        1.5,
        -3.0,
        20.25,
        -87.5,
        pow2(80),
        -pow2(80),
        f32::from_bits(pow2(80).to_bits() - 1),
    ];
    let temps = temperatures(&mut g);
    for (i, &t) in temps.iter().enumerate() {
        for (j, &m) in ms.iter().enumerate() {
            let mut logits = vec![
                f32::NAN,
                f32::from_bits(0xFFC0_0001),
                f32::NEG_INFINITY,
                0.0,
                -0.0,
                f32::from_bits(1),
                -f32::from_bits(1),
                f32::MIN_POSITIVE,
                -f32::MIN_POSITIVE,
                f32::MIN,
                -1e38,
                -3e30,
            ];
            for _ in 0..400 {
                let u = g.unit();
                let l = match g.below(6) {
                    // Near the maximum's logit m t (m t itself, and a few ulps around it).
                    0 => {
                        f32::from_bits((m * t).to_bits().wrapping_add_signed(g.below(9) as i32 - 4))
                    }
                    // Within exp_p's range below it.
                    1 => (m - 90.0 * u) * t,
                    // Tiny quotients, either sign, down to subnormal logits.
                    2 => {
                        let e = g.below(80) as i32 - 149;
                        pow2(e) * (1.0 + u) * if g.chance(1, 2) { -1.0 } else { 1.0 }
                    }
                    // Quotients around the range's bottom 2^-70.
                    3 => pow2(-70) * t * (0.5 + 2.0 * u) * if g.chance(1, 2) { -1.0 } else { 1.0 },
                    // Quotients far below: beyond -2^100, overflowing at small t.
                    4 => -pow2(96 + g.below(32) as i32) * (1.0 + u),
                    _ => (g.unit() - 0.5) * 200.0,
                };
                logits.push(l);
            }
            // The premise: every quotient at most m (NaN never counts).
            logits.retain(|&l| (l / t).partial_cmp(&m) != Some(std::cmp::Ordering::Greater));
            for mode in MODES {
                let r = softmax_terms(mode, t, m, &logits);
                assert!(r.ok, "{mode:?}: t = {t:e}, m = {m:e} is in the range");
                for (n, &l) in logits.iter().enumerate() {
                    let what =
                        format!("{mode:?}: temperature {i} ({t:e}), m {j} ({m:e}), l = {l:e}");
                    assert_eq!(r.terms[n], term(l, t, m), "{what}: the sum's term");
                    assert_eq!(r.e[n], exp_p(l / t - m).to_bits(), "{what}: sp_soft_e");
                }
            }
        }
    }
}

/// What the range and the premise keep out. Rows the pass must divide (`ok` false): a
/// temperature outside `[2^-16, 2^16]` by an ulp, a maximum above `2^80` in magnitude by an ulp,
/// NaN ones. And the controls that show these are not idle: at the temperature `1e-40` (its
/// reciprocal overflows) the quotients without a division give other terms than the rules' for
/// logits of a row, and `l = +inf` (excluded by the premise) gives another term too.
#[test]
fn outside_the_range_the_pass_divides() {
    for mode in MODES {
        for (t, m) in [
            (f32::from_bits(pow2(-16).to_bits() - 1), 0.0),
            (f32::from_bits(pow2(16).to_bits() + 1), 0.0),
            (1.0, f32::from_bits(pow2(80).to_bits() + 1)),
            (1.0, -f32::from_bits(pow2(80).to_bits() + 1)),
            (1.0, f32::INFINITY),
            (1.0, f32::NEG_INFINITY),
            (1.0, f32::NAN),
            (f32::NAN, 0.0),
            (1.5 * pow2(127), 1.0),
            (3e-39, 1.0),
            (1e-40, 1e20),
        ] {
            let ls = [1.0f32, 0.5, -2.0];
            let r = softmax_terms(mode, t, m, &ls);
            assert!(
                !r.ok,
                "{mode:?}: t = {t:e}, m = {m:e} must take the division"
            );
            // sp_soft_e divides there: the rules' e.
            for (&l, &e) in ls.iter().zip(&r.e) {
                assert_eq!(
                    e,
                    exp_p(l / t - m).to_bits(),
                    "{mode:?}: t = {t:e}, m = {m:e}"
                );
            }
        }
        // Inside the range: the ends themselves.
        for (t, m) in [(pow2(-16), pow2(80)), (pow2(16), -pow2(80))] {
            assert!(
                softmax_terms(mode, t, m, &[1.0]).ok,
                "{mode:?}: t = {t:e}, m = {m:e}"
            );
        }

        // Control: a row at t = 1e-40 (subnormal: its reciprocal overflows) read without the
        // division, largest logit 1e-20 (m about 1e20, inside the maximum's bound).
        let t = 1e-40f32;
        let mut g = Gen(0xC0_4740);
        let top = 1e-20f32;
        let m = top / t;
        let logits: Vec<f32> = (0..256)
            .map(|i| {
                f32::from_bits(top.to_bits() - if i == 0 { 0 } else { g.below(1 << 10) as u32 })
            })
            .collect();
        let r = softmax_terms(mode, t, m, &logits);
        let wrong = logits
            .iter()
            .zip(&r.terms)
            .filter(|&(&l, &w)| w != term(l, t, m))
            .count();
        assert!(
            wrong > 0,
            "{mode:?}: the control found no wrong term at t = 1e-40"
        );
        // sp_soft_e divides there (rc.ok is false): the rules' e for every logit.
        for (&l, &e) in logits.iter().zip(&r.e) {
            assert_eq!(
                e,
                exp_p(l / t - m).to_bits(),
                "{mode:?}: sp_soft_e at t = 1e-40"
            );
        }

        // Control: l = +inf with a finite maximum (impossible in a row: its quotient is the
        // maximum) gives the term 0 where the rules give 2^64.
        let r = softmax_terms(mode, 1.0, 3.0, &[f32::INFINITY]);
        assert!(r.ok);
        assert_ne!(
            r.terms[0],
            term(f32::INFINITY, 1.0, 3.0),
            "{mode:?}: +inf control"
        );
        assert_ne!(
            r.e[0],
            exp_p(f32::INFINITY).to_bits(),
            "{mode:?}: +inf control, sp_soft_e"
        );
    }
}
