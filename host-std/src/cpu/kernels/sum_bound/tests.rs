use super::*;
use crate::cpu::kernels::{Bf16Row, F16Row, softmax_max, softmax_pass};
use rayon::prelude::*;
use specula_core::verify::fmath::exp_p;
use specula_core::verify::{Cut, softmax_exp};

/// `2⁻⁶⁴`.
const TWO_M64: f64 = 1.0 / 18_446_744_073_709_551_616.0;

/// The largest relative distance of `f(x)` from `base^x` (binary64, within an ulp of the real
/// value: far inside the bounds checked) over the binary32 `x` from `hi` down to `lo` (both
/// `≤ 0`, `lo` excluded) whose bits are `step` apart (1: every one).
fn worst(step: usize, hi: f32, lo: f32, base: f64, f: fn(f32) -> f32) -> f64 {
    // Negative values order as their bits.
    (hi.to_bits()..lo.to_bits())
        .into_par_iter()
        .step_by(step)
        .map(|b| {
            let x = f32::from_bits(b);
            let want = base.powf(f64::from(x));
            (f64::from(f(x)) - want).abs() / want
        })
        .reduce(|| 0.0, f64::max)
}

/// The two bounds the module's argument reads, on every binary32 argument where the tests run
/// optimised (`cargo test --release -p specula --lib -- sum_bound`, about 40 s on 2 cores),
/// every 241st otherwise: `exp2_rough(y)` within `2⁻¹³` of `2ʸ` for `y ∈ (−125, 4]`, the
/// rules' `exp_p(x)` within `2⁻²⁰` of `eˣ` for `x ∈ (−87, 0]`; and below `y = −125` (and NaN)
/// `exp2_rough` gives at most `2⁻¹²⁴`, as the module's argument counts.
#[test]
fn exp_rough_is_within_its_bound() {
    let step = if cfg!(debug_assertions) { 241 } else { 1 };
    // Fused and not: both forms the kernels compile (fused only where FMA is an instruction).
    let fused = worst(step, -0.0, -125.0, 2.0, exp2_rough::<true>);
    let rough = worst(step, -0.0, -125.0, 2.0, exp2_rough::<false>).max(fused);
    let above = (0..4f32.to_bits() + 1)
        .into_par_iter()
        .step_by(step)
        .map(|b| {
            let y = f32::from_bits(b);
            let want = 2f64.powf(f64::from(y));
            let got = [exp2_rough::<false>(y), exp2_rough::<true>(y)];
            got.map(|g| (f64::from(g) - want).abs() / want)
                .into_iter()
                .fold(0.0, f64::max)
        })
        .reduce(|| 0.0, f64::max);
    let rules = worst(step, -0.0, -87.0, std::f64::consts::E, exp_p);
    println!(
        "exp2_rough {rough:e} (2^{:.2}), above 0 {above:e}, exp_p {rules:e} (2^{:.2})",
        rough.log2(),
        rules.log2()
    );
    let two_m13 = f64::from(f32::from_bits(0x3900_0000));
    assert!(
        rough <= two_m13 && above <= two_m13,
        "exp2_rough: {rough:e} {above:e}"
    );
    assert!(
        rules <= f64::from(f32::from_bits(0x3580_0000)),
        "exp_p: {rules:e}"
    ); // 2⁻²⁰
    let floor = f32::from_bits(0x0180_0000); // 2⁻¹²⁴
    for y in [
        -125.0,
        -125.5,
        -1e30,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
    ] {
        for v in [exp2_rough::<false>(y), exp2_rough::<true>(y)] {
            assert!(v > 0.0 && v <= floor, "{y}: {v:e}");
        }
    }
    for x in [-87.0, -87.5, f32::NEG_INFINITY, f32::NAN] {
        assert_eq!(exp_p(x).to_bits(), 0, "{x}");
    }
}

/// A reproducible stream of uniforms in `(0, 1)`.
fn uniforms(seed: u64) -> impl FnMut() -> f32 {
    let mut x = seed | 1;
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        ((x >> 40) as f32 + 0.5) / 16_777_216.0
    }
}

/// Rows of the shapes users have and of shapes that attack the bound, each with a temperature.
fn rows() -> Vec<(&'static str, Vec<f32>, f32)> {
    let mut rows = Vec::new();
    for &v in &[31, 32000, 128_256, 151_936] {
        let mut u = uniforms(v as u64);
        // A model's output: one id near p = 0.7 at T = 0.8 over a 2·N(0, 1) background.
        let mut normal = || {
            let (a, b) = (u(), u());
            (-2.0 * a.ln()).sqrt() * (std::f32::consts::TAU * b).cos()
        };
        let mut peaked: Vec<f32> = (0..v).map(|_| 2.0 * normal()).collect();
        peaked[v / 3] = 16.0;
        rows.push(("peaked", peaked, 0.8));
        let flat: Vec<f32> = (0..v).map(|_| 0.01 * normal()).collect();
        rows.push(("flat", flat, 1.0));
        // The maximum rises in every chunk: a rescale each time.
        let rising: Vec<f32> = (0..v).map(|i| i as f32 * 1e-3).collect();
        rows.push(("rising", rising, 1.0));
        let rising_far: Vec<f32> = (0..v).map(|i| i as f32 * 0.5).collect();
        rows.push(("rising far", rising_far, 0.7));
        // Large magnitudes at a small temperature: every argument's rounding is as large as
        // it gets, most weights flush to 0.
        let wide: Vec<f32> = (0..v).map(|_| 3.0e4 * (u() - 0.5)).collect();
        rows.push(("wide", wide, 0.01));
        let mut hostile: Vec<f32> = (0..v).map(|_| 40.0 * (u() - 0.5)).collect();
        for (i, x) in hostile.iter_mut().enumerate().step_by(7) {
            *x = match i % 3 {
                0 => f32::NAN,
                1 => f32::NEG_INFINITY,
                _ => -f32::NAN,
            };
        }
        rows.push(("NaN and -inf", hostile, 1.3));
        // Every weight 1 (the sum is V), and ties at the maximum.
        rows.push(("ties", vec![2.5; v], 0.9));
        // The mass and the maximum on the odd ids only, then on the even ones only: a bf16
        // row is read two ids a word, even ids and odd ones in separate lanes (`Bf16Pairs`),
        // so a pass that dropped either half, or read one half twice, would lose the maximum
        // or half the sum.
        for (name, keep) in [("odd ids", 1), ("even ids", 0)] {
            let mut row: Vec<f32> = (0..v)
                .map(|i| if i % 2 == keep { 2.0 * u() } else { -40.0 })
                .collect();
            row[(v / 3) & !1 | keep] = 9.0;
            rows.push((name, row, 1.1));
        }
    }
    rows
}

/// The bound of `row` checked against the exact pass of the same row (`name`: for messages):
/// the bound's maximum is the rules' `m` (bit for bit), the exact sum `S` lies within
/// `S̃(1 ± E)` (with room: within half of it, the bound before `width`'s factor 2), with and
/// without the maximum given, and `p_range` brackets `Cut::p` of the row's weights.
fn check_bound<R: LogitRow>(isa: Isa, name: &str, row: R, t: f32) {
    let m = softmax_max(isa, row, t);
    let b = sum_bound(isa, row, t, None).unwrap_or_else(|| panic!("{name}: a finite maximum"));
    assert_eq!(b.m.to_bits(), m.to_bits(), "{isa:?} {name}: maximum");
    let fixed = softmax_pass(isa, row, t, m, None);
    let s = (fixed as f64) * TWO_M64;
    let err = (s - b.sum()).abs() / b.sum();
    assert!(
        err <= b.width() / 2.0,
        "{isa:?} {name} V {}: S {s} S~ {} error {err:e} width {:e}",
        row.len(),
        b.sum(),
        b.width()
    );
    // With the maximum given: the same bound without rescales.
    let k = sum_bound(isa, row, t, Some(m)).expect("finite");
    let err = (s - k.sum()).abs() / k.sum();
    assert!(
        k.m.to_bits() == m.to_bits() && k.width() <= b.width() && err <= k.width() / 2.0,
        "{isa:?} {name}, maximum given: {k:?} error {err:e}"
    );
    let cut = Cut {
        threshold: 0,
        fixed,
    };
    for i in (0..row.len())
        .step_by(row.len() / 29 + 1)
        .chain([row.len() / 3])
    {
        let e = softmax_exp(row.at(i), t, m);
        // Logits in the tens of thousands at T 0.01 leave the bound too wide.
        let Some((lo, hi)) = b.p_range(e) else {
            assert!(
                name.starts_with("wide") && b.width() >= 0.25,
                "{isa:?} {name}: {b:?}"
            );
            continue;
        };
        let p = cut.p(e);
        assert!(lo <= p && p <= hi, "{isa:?} {name} id {i}: {lo} {p} {hi}");
    }
}

/// [`check_bound`] on every row of [`rows`], as binary32, bf16 and f16 logits, on every
/// instruction set.
#[test]
fn sum_bound_holds() {
    for isa in Isa::available() {
        for (name, row, t) in rows() {
            check_bound(isa, name, &row[..], t);
            let bf: Vec<u16> = row
                .iter()
                .map(|&l| half::bf16::from_f32(l).to_bits())
                .collect();
            check_bound(isa, &format!("{name} bf16"), Bf16Row(&bf), t);
            let hf: Vec<u16> = row
                .iter()
                .map(|&l| half::f16::from_f32(l).to_bits())
                .collect();
            // Beyond f16's range (the wide row, the far-rising one at 151936) logits are ±∞.
            if softmax_max(isa, F16Row(&hf), t).is_finite() {
                check_bound(isa, &format!("{name} f16"), F16Row(&hf), t);
            }
        }
    }
}

/// Rows with no finite maximum have no bound (the exact pass handles them), and a rising row's
/// rescales widen it.
#[test]
fn sum_bound_refuses_and_widens() {
    for isa in Isa::available() {
        for row in [
            vec![f32::NEG_INFINITY; 100],
            vec![f32::NAN; 100],
            vec![],
            [1.0, f32::INFINITY, 2.0].repeat(40),
        ] {
            assert!(
                sum_bound(isa, &row[..], 1.0, None).is_none(),
                "{isa:?} {row:?}"
            );
        }
        let flat = sum_bound(isa, &[0.5f32; 4096][..], 1.0, None).expect("finite");
        let reach = (0.5 + 88.0) * f64::from(f32::from_bits(0x3600_0000));
        assert_eq!(
            flat.width(),
            3.0 * f64::from(f32::from_bits(0x3980_0000)) + reach
        );
        let rising: Vec<f32> = (0..4096).map(|i| i as f32).collect();
        let b = sum_bound(isa, &rising[..], 1.0, None).expect("finite");
        assert!(b.width() > flat.width(), "{isa:?}: {b:?}");
        // A tiny temperature overflows `l / t` to +inf: no bound.
        assert!(
            sum_bound(isa, &[1.0f32, 3.0e38][..], 1e-3, None).is_none(),
            "{isa:?}"
        );
    }
}

/// Times the bound on one 128k bf16 row in cache (a model's and a flat one, at T 0.8), read two
/// ids a word as `sum_bound` reads it ([`Bf16Pairs`]) and in id order as before (`Bf16Row`),
/// alternately, the fastest of 15 batches of 20 (`cargo test --release -p specula --lib --
/// --ignored --nocapture sum_bound_timing`): µs per row.
#[cfg(target_arch = "x86_64")]
#[test]
#[ignore = "timing, run by hand"]
fn sum_bound_timing() {
    type Bound = fn(&[u16], f32) -> Option<(SumBound, f64)>;
    fn fastest(f: Bound, bits: &[u16]) -> f64 {
        (0..15)
            .map(|_| {
                let t0 = std::time::Instant::now();
                for _ in 0..20 {
                    std::hint::black_box(f(std::hint::black_box(bits), 0.8));
                }
                t0.elapsed().as_secs_f64() / 20.0 * 1e6
            })
            .fold(f64::INFINITY, f64::min)
    }
    let mut kernels: Vec<(&str, Bound, Bound)> = Vec::new();
    if Isa::available().contains(&Isa::Avx2) {
        kernels.push((
            "Avx2",
            // SAFETY: AVX2, FMA and F16C are present (`Isa::available`).
            |b, t| unsafe { bound_avx2::<Bf16Row<'_>, false>(Bf16Row(b), t, None, f32::INFINITY) },
            // SAFETY: as above.
            |b, t| unsafe { in_order_avx2(b, t) },
        ));
    }
    #[cfg(specula_avx512)]
    if Isa::available().contains(&Isa::Avx512) {
        kernels.push((
            "Avx512",
            // SAFETY: AVX-512 F/DQ/BW/VL are present (`Isa::available`).
            |b, t| unsafe {
                bound_avx512::<Bf16Row<'_>, false>(Bf16Row(b), t, None, f32::INFINITY)
            },
            // SAFETY: as above.
            |b, t| unsafe { in_order_avx512(b, t) },
        ));
    }
    let mut u = uniforms(7);
    let mut peaked: Vec<f32> = (0..128_256).map(|_| 2.0 * (u() - 0.5)).collect();
    peaked[1000] = 16.0;
    let flat: Vec<f32> = (0..128_256).map(|_| 0.01 * (u() - 0.5)).collect();
    let mut f16_kernels: Vec<(&str, Bound, Bound)> = Vec::new();
    #[cfg(specula_avx512)]
    if Isa::available().contains(&Isa::Avx512) {
        f16_kernels.push((
            "Avx512",
            // SAFETY: AVX-512 F/DQ/BW/VL are present (`Isa::available`).
            |b, t| unsafe { bound_avx512::<F16Row<'_>, false>(F16Row(b), t, None, f32::INFINITY) },
            // SAFETY: as above.
            |b, t| unsafe { f16_256_avx512(b, t) },
        ));
    }
    for (name, row) in [("peaked", &peaked), ("flat", &flat)] {
        let bits: Vec<u16> = row
            .iter()
            .map(|&l| half::f16::from_f32(l).to_bits())
            .collect();
        for (isa, new, old) in &f16_kernels {
            for round in 0..3 {
                let (a, b) = (fastest(*old, &bits), fastest(*new, &bits));
                println!(
                    "{isa:<7} {name:<7} f16 round {round}: 256-bit {a:7.1} us, 512-bit {b:7.1} us ({:.2}x)",
                    b / a
                );
            }
        }
    }
    for (name, row) in [("peaked", peaked), ("flat", flat)] {
        let bits: Vec<u16> = row
            .iter()
            .map(|&l| half::bf16::from_f32(l).to_bits())
            .collect();
        for (isa, pairs, in_order) in &kernels {
            for round in 0..3 {
                let (a, b) = (fastest(*in_order, &bits), fastest(*pairs, &bits));
                println!(
                    "{isa:<7} {name:<7} round {round}: in id order {a:7.1} us, pairs {b:7.1} us ({:.2}x)",
                    b / a
                );
            }
        }
    }
}

/// The bound on a bf16 row read in id order (`Bf16Row`), the x86 kernels' code before
/// [`Bf16Pairs`] ([`sum_bound_timing`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn in_order_avx2(bits: &[u16], t: f32) -> Option<(SumBound, f64)> {
    bound_range::<Bf16Row<'_>, 16, true, false>(Bf16Row(bits), t, None, f32::INFINITY)
}

/// As [`in_order_avx2`] with AVX-512's 32 lanes.
#[cfg(specula_avx512)]
#[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl")]
fn in_order_avx512(bits: &[u16], t: f32) -> Option<(SumBound, f64)> {
    bound_range::<Bf16Row<'_>, 32, true, false>(Bf16Row(bits), t, None, f32::INFINITY)
}

/// The bound on an f16 row on AVX-512 with F16C's 256-bit widening (`F16Wide`), the code
/// before `F16Wide512` ([`sum_bound_timing`]).
#[cfg(specula_avx512)]
#[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl")]
fn f16_256_avx512(bits: &[u16], t: f32) -> Option<(SumBound, f64)> {
    bound_range::<F16Wide<'_>, 32, true, false>(F16Wide(bits), t, None, f32::INFINITY)
}
