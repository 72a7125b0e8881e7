//! The race's variate map `E(x) = −ln(1 − v)`, `v = (x + ½)·2⁻⁶⁴` (`specula_core::verify::exponential`),
//! checked exhaustively over every high word, as the bias bound in `core/DETERMINISM.md` needs:
//! positive, finite, increasing, within `ETA` (relative) of the exact value at the cell midpoint,
//! and above the skip filters' floor.
//!
//! Run optimised: `cargo test -p specula-tests --profile statistics --test statistics --
//! race_variates::` (about half a minute on 2 cores).

use specula_core::verify::exponential::{ETA, draw, exponential, exponential_floor};

/// An independent evaluation of `−ln(1 − v)` at the midpoint of cell `x`: the platform's `ln_1p`
/// and `ln` (correct to about 1 ulp), on the side where each has no cancellation.
fn exact(x: u64) -> f64 {
    let two_m64 = 2f64.powi(-64);
    if x < 1 << 63 {
        let v = ((x as f64) + 0.5) * two_m64;
        -(-v).ln_1p()
    } else {
        let u = (((!x) as f64) + 0.5) * two_m64;
        -u.ln()
    }
}

/// The platform reference is itself good to about 2⁻⁵² and the midpoint is rounded once to
/// binary64, so a map within `ETA` of the truth is within this of the reference.
const TOLERANCE: f64 = ETA + 4.0 * f64::EPSILON;

/// Checks the high words `lo_hi .. hi_hi` with low word 0; returns the worst relative error.
/// (Monotonicity between adjacent 64-bit draws, where rounding could break it, is the seam
/// test's job below.)
fn check_range(lo_hi: u64, hi_hi: u64) -> f64 {
    let mut worst = 0f64;
    let mut prev = if lo_hi == 0 {
        0.0
    } else {
        exponential(draw((lo_hi - 1) as u32, 0))
    };
    for h in lo_hi..hi_hi {
        let x = draw(h as u32, 0);
        let e = exponential(x);
        assert!(e.is_finite() && e > 0.0, "E({x:#x}) = {e}");
        assert!(
            e > prev,
            "E({x:#x}) = {e} not above the previous high word's {prev}"
        );
        prev = e;
        let r = exact(x);
        let err = ((e - r) / r).abs();
        assert!(
            err <= TOLERANCE,
            "E({x:#x}) = {e}, exact {r}: relative error {err:e}"
        );
        worst = worst.max(err);
        let floor = f64::from(exponential_floor(h as u32));
        assert!(
            floor <= e * (1.0 + ETA),
            "floor {floor} above E({x:#x}) = {e}"
        );
    }
    worst
}

#[test]
#[cfg_attr(debug_assertions, ignore = "exhaustive: run with --release")]
fn every_high_word_gives_a_positive_finite_increasing_accurate_variate() {
    let threads = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .max(2) as u64;
    let total = 1u64 << 32;
    let piece = total / threads;
    let worst = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let end = if t + 1 == threads {
                    total
                } else {
                    (t + 1) * piece
                };
                s.spawn(move || check_range(t * piece, end))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("checker thread"))
            .fold(0f64, f64::max)
    });
    println!(
        "worst relative error over 2^32 high words: {worst:e} (ETA = {ETA:e}, 2^{:.1})",
        worst.log2()
    );
}

/// Where rounding could break monotonicity between adjacent 64-bit draws: the branch point, the
/// mantissa fold at `u = √2·2ᵉ`, the binade edges of `u` and `v`, and where `x as f64` starts
/// rounding. Every draw within 2¹⁴ of each such point.
#[test]
fn adjacent_draws_are_monotone_at_every_seam() {
    let mut seams: Vec<u64> = vec![1 << 62, 1 << 52, 1 << 53, 1 << 54, 1 << 63];
    for e in 1..64u32 {
        // v crossing 2^-e (branch A binades): x ≈ 2^(64-e).
        seams.push(1u64 << (64 - e));
        // u crossing 2^-e (branch B binades): !x ≈ 2^(64-e).
        seams.push(!(1u64 << (64 - e)));
        // u crossing √2·2^-e: !x ≈ √2·2^(64-e).
        let fold = std::f64::consts::SQRT_2 * 2f64.powi(64 - e as i32);
        if fold < 2f64.powi(63) {
            seams.push(!(fold as u64));
        }
    }
    let span: u64 = if cfg!(debug_assertions) {
        1 << 10
    } else {
        1 << 14
    };
    for seam in seams {
        let start = seam.saturating_sub(span);
        let mut prev = exponential(start);
        for x in start + 1..seam.saturating_add(span) {
            let e = exponential(x);
            assert!(
                e >= prev,
                "E({x:#x}) = {e:e} below E({:#x}) = {prev:e}",
                x - 1
            );
            prev = e;
        }
    }
}

#[test]
fn the_ends_of_the_map() {
    assert_eq!(exponential(0), 2f64.powi(-65));
    let top = exponential(u64::MAX);
    assert!((top - 65.0 * std::f64::consts::LN_2).abs() < 1e-13, "{top}");
    // E = 0 was possible before (the old race's u' = 1): now the smallest key of a weight w is
    // w / 45.06, and the largest w·2⁶⁵ — finite for every finite weight.
    assert!((f64::from(f32::MAX) / exponential(0)).is_finite());
}
