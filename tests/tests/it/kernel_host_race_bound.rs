//! The race's skip-test shortcut on logit rows (`sp_weight_ub`, `sp_race_wcut` in the kernel
//! text), attacked where its margins are thinnest: the bound `u` of an id's weight must never be
//! below the exact weight `e`, the scaled bound never below the exact `p`, and the claim "p ≤ 0"
//! (no candidate) never made of an id with `p > 0`. Hostile rows: ids swept ulp by ulp where the
//! bound's interpolation is exact (`y` at integers, so only the margins separate `u` from `e`),
//! large `|m|` (the rounding margin's `|m|` term), the `exp_p` cut-off at −87, huge and tiny
//! temperatures (off rows), ±∞, NaN, subnormal logits, f16 rows (every bit pattern) and
//! thresholds at the weights' own keys. Dropping the `+1` of `sp_exp2_ub`, the `|m|` or constant
//! term of the margin `d`, or the floor of `wcut` makes these tests fail; the bit-for-bit race
//! itself is `kernel_host_inputs` and `kernel_host` (every logits row goes through the bound).

use specula_tests::kernel_host::{BoundRow, Mode, RaceBound, race_bound};

const LOG2E: f32 = f32::from_bits(0x3FB8_AA3B);

/// The softmax maximum of a row (the kernel's `m`: the largest `RN(l / t)`, NaN aside).
fn max_z(l: &[f32], t: f32) -> f32 {
    l.iter()
        .map(|&x| x / t)
        .filter(|z| !z.is_nan())
        .fold(f32::NEG_INFINITY, f32::max)
}

/// Checks every id of one row in both macro forms; returns how many ids the claim "p ≤ 0" took.
fn check(row: BoundRow<'_>, t: f32, m: f32, theta: u32, s: f64, what: &str) -> usize {
    let mut none = 0;
    for mode in [Mode::Cuda, Mode::Hip] {
        let got = race_bound(mode, row, t, m, theta, s);
        for (i, b) in got.iter().enumerate() {
            let RaceBound { u, e, pu, p, .. } = *b;
            let l = match row {
                BoundRow::F32(v) => format!("{:e} ({:#010x})", v[i], v[i].to_bits()),
                BoundRow::F16(v) => format!("f16 {:#06x}", v[i]),
            };
            let ctx =
                || format!("{what} {mode:?}: id {i}, l {l}, t {t:e}, m {m:e}, theta {theta:#x}");
            assert!(!e.is_nan() && e >= 0.0, "{}: e {e:e}", ctx());
            assert!(u >= e, "{}: bound {u:e} below the weight {e:e}", ctx());
            assert!(
                pu.is_nan() || pu >= p,
                "{}: scaled bound {pu:e} below p {p:e}",
                ctx()
            );
            assert!(
                !b.none || p <= 0.0,
                "{}: claimed no candidate, p {p:e}",
                ctx()
            );
            none += usize::from(b.none);
        }
    }
    none
}

/// `n` consecutive binary32 values on each side of `x` (towards and away from zero).
fn around(x: f32, n: u32) -> impl Iterator<Item = f32> {
    let b = x.to_bits();
    (0..2 * n).map(move |k| f32::from_bits(b.wrapping_sub(n).wrapping_add(k)))
}

/// A row whose maximum is `top / t`, with ids swept around the logits whose weight is 2^-k
/// (`y` near an integer: the bound's interpolation is exact there), for each k in `ks`.
fn swept(top: f32, t: f32, ks: &[f32], n: u32) -> Vec<f32> {
    let m = top / t;
    let mut row = vec![top];
    for &k in ks {
        // z − m = −k ln 2: z = m − k / log2 e, l = z t.
        let z = m - k / LOG2E;
        row.extend(around(z * t, n).filter(|&l| l.is_finite() && l / t <= m));
    }
    row
}

/// Sums of the weights, as a kept mass (any positive `s` must keep the claims true).
fn mass(l: &[f32], t: f32, m: f32) -> f64 {
    race_bound(Mode::Cuda, BoundRow::F32(l), t, m, 0, 1.0)
        .iter()
        .map(|b| f64::from(b.e))
        .sum::<f64>()
        .max(1.0)
}

#[test]
fn the_weight_bound_holds_where_its_interpolation_is_exact() {
    let ks = [
        0.0, 1.0, 2.0, 3.0, 10.0, 24.0, 60.0, 100.0, 120.0, 124.0, 125.0, 125.5, 126.0,
    ];
    for t in [1.0f32, 0.8, 0.37, 3.0, 1.0e-3, 70_000.0] {
        // |m| from 0 to the bounded rows' limit 2^20 and past it (an off row).
        for top_z in [
            0.0f32,
            1.5,
            -7.25,
            3000.0,
            -5000.0,
            524_288.0,
            -1_000_000.0,
            1_048_576.0,
            2.0e6,
        ] {
            let top = top_z * t;
            if !top.is_finite() || top / t != top_z {
                continue;
            }
            let row = swept(top, t, &ks, 1500);
            let m = max_z(&row, t);
            let s = mass(&row, t, m);
            check(BoundRow::F32(&row), t, m, 0, s, "swept");
        }
    }
}

#[test]
fn the_weight_bound_holds_at_the_exp_cut_off_and_on_special_values() {
    for t in [1.0f32, 0.6, 2.5] {
        for top_z in [0.0f32, 20.0, -300.0] {
            let top = top_z * t;
            let m = top / t;
            // exp_p's cut-off: x = RN(z − m) around −87 (weights just above 2^-125.5, and 0).
            let mut row: Vec<f32> = around((m - 87.0) * t, 4000)
                .filter(|l| l / t <= m)
                .collect();
            row.push(top);
            // Special values: ±0, −∞, NaN, subnormals, the most negative finite value.
            row.extend([
                0.0,
                -0.0,
                f32::NEG_INFINITY,
                f32::NAN,
                -f32::NAN,
                f32::from_bits(1),
                -f32::from_bits(1),
                f32::from_bits(0x0080_0000),
                -f32::MAX,
                f32::MIN_POSITIVE * 0.5,
            ]);
            row.retain(|l| (l / t).partial_cmp(&m) != Some(std::cmp::Ordering::Greater));
            let m = max_z(&row, t);
            let s = mass(&row, t, m);
            let none = check(BoundRow::F32(&row), t, m, 0, s, "cut-off");
            // −∞, NaN and the ids below the cut-off are claimed (their groups skip the draws).
            assert!(none >= 2 * 3, "{none} claims on a row with −∞ and NaN");
        }
    }
}

#[test]
fn off_rows_bound_every_id() {
    // Temperatures whose RN(log2 e / t) is infinite, subnormal or zero, and rows whose maximum
    // is infinite (+∞ present: every weight 0), −∞ (every id −∞ or NaN) or beyond 2^20.
    let base: Vec<f32> = (-40..40).map(|i| i as f32 * 0.37).collect();
    for t in [1.0e-39f32, 1.0e-30, 1.0e38, f32::MAX, f32::INFINITY, 1.0] {
        for extra in [vec![], vec![f32::INFINITY], vec![3.0e7, -3.0e7]] {
            let mut row = base.clone();
            row.extend(&extra);
            let m = max_z(&row, t);
            check(BoundRow::F32(&row), t, m, 0, 7.0, "off row");
        }
    }
    let row = [f32::NEG_INFINITY, f32::NAN, f32::NEG_INFINITY];
    check(
        BoundRow::F32(&row),
        0.9,
        max_z(&row, 0.9),
        0,
        0.0,
        "no maximum",
    );
}

#[test]
fn thresholds_at_the_weights_own_keys_claim_only_cut_ids() {
    let t = 0.8f32;
    let row = swept(2.0 * t, t, &[0.0, 1.0, 3.0, 7.0, 30.0], 200);
    let m = max_z(&row, t);
    let weights = race_bound(Mode::Cuda, BoundRow::F32(&row), t, m, 0, 1.0);
    let mut claimed = 0;
    for (k, b) in weights.iter().enumerate().step_by(97) {
        // theta at an id's own key, one above and one below it; the kept mass some plausible S.
        for theta in [
            b.e.to_bits(),
            b.e.to_bits() + 1,
            b.e.to_bits().saturating_sub(1),
        ] {
            for s in [1.0, 1.7, 40.0, 1.0e-30, 0.0] {
                claimed += check(
                    BoundRow::F32(&row),
                    t,
                    m,
                    theta,
                    s,
                    &format!("theta of id {k}"),
                );
            }
        }
    }
    assert!(claimed > 0, "no id was ever claimed cut");
}

#[test]
fn f16_rows_every_bit_pattern() {
    // Every finite f16 and −∞ / NaN (no +∞: it makes the maximum +∞, the next row), then all.
    let finite: Vec<u16> = (0..=u16::MAX).filter(|&h| h != 0x7C00).collect();
    let all: Vec<u16> = (0..=u16::MAX).collect();
    let widen = |h: u16| f32::from(half::f16::from_bits(h));
    for row in [&finite, &all] {
        for t in [1.0f32, 0.7, 3.0e-3, 9.0e-5, 5000.0] {
            let l: Vec<f32> = row.iter().map(|&h| widen(h)).collect();
            let m = max_z(&l, t);
            for theta in [0, 0x3000_0000] {
                check(BoundRow::F16(row), t, m, theta, 2.0, "f16");
            }
        }
    }
}
