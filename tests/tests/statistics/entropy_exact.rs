//! The kernel text's entropy term (`sp_entropy_fixed` in `core/kernels/specula_verify.cu`) is a
//! rewriting of `specula_core::verify::fmath::entropy_term` that must give the same bits for every
//! input. This file replays that rewriting step for step in Rust and compares:
//!
//! * over every mantissa of the exponent fields where something changes (subnormals and zero,
//!   the smallest normals, around 1, the largest normals and the infinities/NaNs), both signs,
//!   and a stride through all 2³² bit patterns;
//! * the CUDA division `(m − 1)/(m + 1)` (reciprocal, one Newton step, quotient, one remainder
//!   correction, all FMAs) for every `m` against every reciprocal within the hardware's error:
//!   correctly rounded whenever the reciprocal is within `2⁻²³` above or `< 2⁻²⁴` below `1/d`
//!   (relative), and the single operand where a reciprocal exactly `2⁻²⁴` low would round the
//!   other way is pinned (the kernel relies on the compiler's own `div.rn` sequence there).
//!
//! Exhaustive when optimised (about ten seconds on 2 cores; scripts/test.sh runs it), sampled in
//! debug builds: `cargo test -p specula-tests --profile statistics --test statistics --
//! entropy_exact::`.

use specula_core::verify::fmath::entropy_term;

/// `(k − 127) × LN2 × 2⁴⁰` for k < 256, NaN above: the kernel's shared-memory table.
fn ln_table() -> Vec<f32> {
    (0..512u32)
        .map(|k| {
            if k < 256 {
                (k as i32 - 127) as f32 * f32::from_bits(0x5331_7218)
            } else {
                f32::NAN
            }
        })
        .collect()
}

/// Rust's `as i64` is what the kernel's conversion does (truncation, saturation, NaN → 0).
fn kernel_term(p: f32, tab: &[f32], div: impl Fn(f32, f32) -> f32) -> i64 {
    let bits = p.to_bits();
    let t = bits.wrapping_add(0x004A_FB0C);
    let a = tab[(t >> 23) as usize];
    let m = f32::from_bits(bits.wrapping_sub(t & 0xFF80_0000).wrapping_add(0x3F80_0000));
    let s = div(m - 1.0, m + 1.0);
    let z = s * s;
    let mut q = f32::from_bits(0x5263_8E39);
    q = f32::from_bits(0x5292_4925) + z * q;
    q = f32::from_bits(0x52CC_CCCD) + z * q;
    q = f32::from_bits(0x532A_AAAB) + z * q;
    q = f32::from_bits(0x5400_0000) + z * q;
    let ln = a + s * q;
    let x = -(p * ln);
    x as i64
}

fn plain_div(n: f32, d: f32) -> f32 {
    n / d
}

/// The CUDA sequence with reciprocal `r` of `d`.
fn fma_div(n: f32, d: f32, r: f32) -> f32 {
    let e = (-d).mul_add(r, 1.0);
    let r2 = r.mul_add(e, r);
    let q0 = n * r2;
    let rem = (-q0).mul_add(d, n);
    rem.mul_add(r2, q0)
}

fn check(bits: u32, tab: &[f32]) {
    let p = f32::from_bits(bits);
    let want = entropy_term(p);
    let got = kernel_term(p, tab, plain_div);
    assert_eq!(got, want, "p bits {bits:#010x}");
}

#[test]
fn term_matches_the_reference_over_every_mantissa_of_the_edges() {
    let tab = ln_table();
    // Exponent fields: zero/subnormal, smallest normals, around 1 and 2^40's inverse, the largest
    // normals (saturation starts near 2^23) and all-ones (infinities and NaNs).
    let exps: &[u32] = if cfg!(debug_assertions) {
        &[0, 1, 126, 127, 254, 255]
    } else {
        &[
            0, 1, 2, 60, 100, 125, 126, 127, 128, 149, 150, 189, 190, 253, 254, 255,
        ]
    };
    // Debug builds (the workspace's test run) sample the mantissas; release checks them all.
    let mant_step = if cfg!(debug_assertions) { 127 } else { 1 };
    for &e in exps {
        for sign in [0u32, 0x8000_0000] {
            for mant in (0..(1u32 << 23)).step_by(mant_step) {
                check(sign | (e << 23) | mant, &tab);
            }
        }
    }
    // Every exponent: a stride through the mantissas (prime, so the low bits vary).
    let stride = if cfg!(debug_assertions) { 65_537 } else { 257 };
    let mut b = 0u64;
    while b < 1 << 32 {
        check(b as u32, &tab);
        b += stride;
    }
}

#[test]
fn term_of_the_named_values() {
    let tab = ln_table();
    for p in [
        0.0f32,
        -0.0,
        f32::MIN_POSITIVE,
        f32::MIN_POSITIVE / 2.0,
        1.0,
        0.5,
        1e-7,
        f32::MAX,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        -0.25,
        f32::from_bits(0x7F80_0001),
        f32::from_bits(0xFFFF_FFFF),
    ] {
        check(p.to_bits(), &tab);
    }
    // +inf saturates like f32::MAX (DETERMINISM.md), negative values and NaN give 0.
    assert_eq!(kernel_term(f32::INFINITY, &tab, plain_div), i64::MIN);
    assert_eq!(kernel_term(-1.0, &tab, plain_div), 0);
}

/// Every reciprocal `r` of `d` with `lo < r·d − 1 ≤ hi` (relative error window), as f32s.
fn reciprocals(d: f32, lo: f64, hi: f64) -> impl Iterator<Item = f32> {
    let r0 = (1.0 / f64::from(d)) as f32;
    (-8i32..=8).filter_map(move |i| {
        let r = f32::from_bits(r0.to_bits().wrapping_add_signed(i));
        let err = f64::from(r) * f64::from(d) - 1.0;
        (err > lo && err <= hi).then_some(r)
    })
}

#[test]
fn cuda_division_is_correctly_rounded_for_every_series_operand() {
    let two_m23 = 2f64.powi(-23);
    let two_m24 = 2f64.powi(-24);
    let mut cases = 0u64;
    let mut near_misses = Vec::new();
    // Debug builds sample the mantissas (and always take the near miss); release takes all.
    let step = if cfg!(debug_assertions) { 509 } else { 1 };
    for mant in (0..(1u32 << 23)).step_by(step).chain([0x7F_FFFE]) {
        // ln_p's m for this mantissa: [1, √2], or halved when above √2.
        let m = f32::from_bits(0x3F80_0000 | mant);
        let m = if m > f32::from_bits(0x3FB5_04F3) {
            m * 0.5
        } else {
            m
        };
        let (n, d) = (m - 1.0, m + 1.0);
        let want = n / d;
        // The proven window: 2^-23 above, strictly less than 2^-24 below.
        for r in reciprocals(d, -two_m24, two_m23) {
            cases += 1;
            assert_eq!(
                fma_div(n, d, r).to_bits(),
                want.to_bits(),
                "m {m:e} r {r:e}"
            );
        }
        // Exactly 2^-24 .. 2^-23 below: record where the sequence would round the other way.
        for r in reciprocals(d, -two_m23, -two_m24) {
            if fma_div(n, d, r).to_bits() != want.to_bits() {
                near_misses.push((mant, r.to_bits()));
            }
        }
        // The exact quotient is what the host and HIP compute.
        assert_eq!(plain_div(n, d).to_bits(), want.to_bits());
    }
    assert!(cases >= (1 << 23) / step as u64, "{cases} cases");
    // The chained near-miss mantissa is visited twice when the range takes every mantissa.
    near_misses.sort_unstable();
    near_misses.dedup();
    // Only m = 1 − 2⁻²³ (n/d within 2⁻⁷² of a rounding midpoint) with a reciprocal at or below
    // 0.5, i.e. at least half an ulp of 1/d low: the compiler's IEEE division (the same
    // sequence) is correct there, so the hardware's reciprocal is not that low.
    assert_eq!(
        near_misses,
        vec![(0x7F_FFFE, 0x3EFF_FFFF), (0x7F_FFFE, 0x3F00_0000)],
        "operands where a low reciprocal misrounds"
    );
}
