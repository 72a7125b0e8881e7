use super::*;
use crate::cpu::kernels::{
    Bf16Row, F16Row, half_span, softmax_max, softmax_max_of, softmax_pass, softmax_weights,
};
use specula_core::verify::{softmax_exp, softmax_fixed};

/// Both formats.
const FORMATS: [Half16; 2] = [Half16::Bf16, Half16::F16];

/// The pattern of `format` nearest below `x` in magnitude (truncated; `x` finite, tiny values
/// to zero): enough to build rows of a given shape.
fn pattern(format: Half16, x: f32) -> u16 {
    match format {
        Half16::Bf16 => (x.to_bits() >> 16) as u16,
        Half16::F16 => {
            let b = x.to_bits();
            let sign = ((b >> 16) & 0x8000) as u16;
            let exp = ((b >> 23) & 0xFF) as i32 - 127 + 15;
            if exp <= 0 {
                sign
            } else if exp >= 31 {
                sign | 0x7BFF
            } else {
                sign | ((exp as u16) << 10) | ((b >> 13) & 0x3FF) as u16
            }
        }
    }
}

/// The core's widening of pattern `b` of `format`.
fn core_value(format: Half16, b: u16) -> f32 {
    match format {
        Half16::Bf16 => specula_core::verify::bf16_to_f32(b),
        Half16::F16 => specula_core::verify::f16_to_f32(b),
    }
}

/// [`softmax_max`] of `bits` as a `format` row.
fn row_max(isa: Isa, format: Half16, bits: &[u16], t: f32) -> f32 {
    match format {
        Half16::Bf16 => softmax_max(isa, Bf16Row(bits), t),
        Half16::F16 => softmax_max(isa, F16Row(bits), t),
    }
}

fn xorshift(mut s: u64) -> impl FnMut() -> u64 {
    move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    }
}

/// The core's weights and exact sum of the `format` row `bits` at `t` (`max` the core's
/// maximum), widened by the core.
fn core_weights(format: Half16, bits: &[u16], t: f32) -> (f32, Vec<f32>, u128) {
    let value = |b: u16| core_value(format, b);
    let mut m = f32::NEG_INFINITY;
    for &b in bits {
        m = specula_core::verify::softmax_max(m, value(b) / t);
    }
    let w: Vec<f32> = bits.iter().map(|&b| softmax_exp(value(b), t, m)).collect();
    let f = w
        .iter()
        .map(|&e| softmax_fixed(e))
        .fold(0, u128::wrapping_add);
    (m, w, f)
}

/// The sum and weights of `bits` through a table filled whatever the cost (`force`), with
/// `isa`'s lookup.
fn tabled_pass(isa: Isa, format: Half16, bits: &[u16], t: f32, max: f32) -> (u128, Vec<f32>) {
    let mut w = vec![7f32; bits.len()];
    let f = with_table(isa, format, bits, t, max.into(), true, |lookup| {
        assert!(!matches!(lookup, Lookup::Plain), "forced");
        // The plain row is never run: any row of the right type.
        on_lookup!(lookup, Bf16Row(bits), |r| {
            super::super::softmax_pass_plain(isa, r, t, max, 0.0, Some(&mut w))
        })
    });
    (f, w)
}

/// Rows built to break the table, in both formats: NaN payloads of both signs, ±∞, ±0,
/// subnormals (1023 of each sign in f16), the largest finite values, rows whose maximum is 0,
/// −0 or negative, all-equal rows, only tiny values, at temperatures from subnormal to huge, at
/// lengths with tails. Forced through the table on every instruction set, each weight and the
/// sum are the core's (of the core's widening).
#[test]
fn forced_tables_give_the_core_weights_on_hostile_rows() {
    for format in FORMATS {
        forced_tables_on_hostile_rows(format);
    }
}

fn forced_tables_on_hostile_rows(format: Half16) {
    let mut next = xorshift(0x7AB1_E5EE_D000_0001);
    // Zeros, the smallest and largest subnormals, the largest finite values, infinities, quiet
    // and signalling NaNs of both signs, 1.
    let specials: [u16; 14] = match format {
        Half16::Bf16 => [
            0x0000, 0x8000, 0x0001, 0x8001, 0x007F, 0x807F, 0x7F7F, 0xFF7F, 0x7F80, 0xFF80, 0x7FC0,
            0xFFC1, 0x7F81, 0x3F80,
        ],
        Half16::F16 => [
            0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x83FF, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00, 0x7E00,
            0xFE01, 0x7C01, 0x3C00,
        ],
    };
    // Patterns of magnitude below `big` are below 128; below `tiny`, subnormals and the
    // smallest binade of normals.
    let (big, tiny) = match format {
        Half16::Bf16 => (0x4300u16, 0x0200u16),
        Half16::F16 => (0x5800, 0x0800),
    };
    let (ten, minus_five) = (pattern(format, 10.0), pattern(format, -5.0));
    let temps = [
        f32::from_bits(1),
        3e-39,
        1e-30,
        0.05,
        0.8,
        1.0,
        7.0,
        1e30,
        f32::MAX,
    ];
    for round in 0..120 {
        let n = 1 + (next() % 700) as usize;
        let kind = round % 6;
        let bits: Vec<u16> = (0..n)
            .map(|_| {
                let r = next();
                match kind {
                    // Anything, specials often.
                    0 => {
                        if r % 5 == 0 {
                            specials[(r >> 8) as usize % specials.len()]
                        } else {
                            (r >> 20) as u16
                        }
                    }
                    // Logits with the maximum at 0: only non-positive values.
                    1 => 0x8000 | ((r >> 20) as u16 % big),
                    // Tiny values only (subnormals and the smallest normals), both signs.
                    2 => ((r >> 20) as u16 & 0x8000) | ((r >> 24) as u16 % tiny),
                    // A few distinct values.
                    3 => [ten, minus_five, 0x0000, 0x8000][(r >> 30) as usize % 4],
                    // A model-like row: logits in [−20, 12].
                    4 => {
                        let u = (r >> 40) as f32 / (1u64 << 24) as f32;
                        pattern(format, -20.0 + 32.0 * u)
                    }
                    // −∞ everywhere but a few.
                    _ => {
                        if r % 9 == 0 {
                            (r >> 20) as u16 & 0xBFFF
                        } else {
                            0x8000 | format.inf() as u16
                        }
                    }
                }
            })
            .collect();
        let t = temps[(next() % temps.len() as u64) as usize];
        let (m, want_w, want_f) = core_weights(format, &bits, t);
        for isa in Isa::available() {
            let what = format!("{format:?} {isa:?} round {round} kind {kind} n {n} t {t:e}");
            let gm = row_max(isa, format, &bits, t);
            assert_eq!(
                gm.to_bits() & 0x7FFF_FFFF,
                m.to_bits() & 0x7FFF_FFFF,
                "{what}"
            );
            let (f, w) = tabled_pass(isa, format, &bits, t, m);
            assert_eq!(f, want_f, "{what}");
            for (i, (a, b)) in w.iter().zip(&want_w).enumerate() {
                assert_eq!(
                    a.to_bits(),
                    b.to_bits(),
                    "{what} id {i} bits {:#06x}",
                    bits[i]
                );
            }
        }
    }
}

/// [`collapse`] attacked by brute force, in both formats: for maxima and temperatures of
/// every kind, every pattern of magnitude below `c` has the `x` of `+0` (so one weight), and
/// `c` is the largest such bound among the patterns below `top` (the pattern at `c`, when below
/// `top`, differs at one sign or the other).
#[test]
fn collapse_is_the_widest_equal_span() {
    for format in FORMATS {
        collapse_widest(format);
    }
}

fn collapse_widest(format: Half16) {
    let mut next = xorshift(0xC011_A95E);
    let maxima = [
        0.0f32,
        -0.0,
        1.0,
        -1.0,
        12.5,
        -3.25,
        1e-30,
        -1e-30,
        3e38,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::from_bits(1),
        // Powers of two: the spacing below them is half the spacing above, so `x − max` and
        // `x + max` absorb different spans (a sign slip in `collapse` shows only there).
        2.0,
        0.5,
        -4.0,
    ];
    let temps = [0.8f32, 1.0, 1e-38, 1e38, 0.37, f32::from_bits(1), f32::MAX];
    let tops = [format.inf(), 0x4200, 0x0100, 1, 0, 0x0400];
    // Every listed maximum at every temperature with the widest span, then random ones.
    let listed = maxima.len() * temps.len();
    for round in 0..listed + 60 {
        let (max, t, top) = if round < listed {
            (
                maxima[round / temps.len()],
                temps[round % temps.len()],
                format.inf(),
            )
        } else {
            (
                f32::from_bits(next() as u32 & 0xFF7F_FFFF),
                temps[round % temps.len()],
                tops[round % tops.len()],
            )
        };
        let c = collapse(format, top, t, max);
        assert!(c <= top, "{format:?} round {round}");
        let x = |p: u32| core_value(format, p as u16) / t - max;
        let x0 = x(0);
        for p in 0..c {
            for q in [p, SIGN | p] {
                let xq = x(q);
                assert!(
                    xq == x0 && exp_p(xq).to_bits() == exp_p(x0).to_bits(),
                    "{format:?} round {round} max {max:e} t {t:e} pattern {q:#06x} below c {c:#06x}"
                );
            }
        }
        if c < top {
            assert!(
                x(c) != x(SIGN | c),
                "{format:?} round {round}: c {c:#06x} is not the widest"
            );
        }
    }
}

/// Rows shaped like a model's output take the table at the vocabularies users run (so the
/// conformance suites run it): bf16 ones from `V = 32000`, f16 ones (8 times the patterns per
/// binade: about 40 000 to compute for this row) from `V = 128256`; a row with maximum 0 whose
/// other values spread over every negative pattern (no tiny values collapse then) does not at
/// `V = 32000`. Whichever way, the pass and the weights are the core's.
#[test]
fn model_rows_take_the_table() {
    let mut next = xorshift(0x5EED);
    for vocab in [32_000usize, 128_256, 151_936, 262_144] {
        let logits: Vec<f32> = (0..vocab)
            .map(|i| {
                let u = ((next() >> 40) as f32 + 1.0) / (1u64 << 24) as f32;
                // A `2·N(0, 1)`-like background (the log of a uniform) and one large logit.
                if i == 7 { 25.0 } else { 2.0 * u.ln() + 1.0 }
            })
            .collect();
        let spread_r: Vec<u64> = (0..vocab).map(|_| next()).collect();
        for format in FORMATS {
            let peaked: Vec<u16> = logits.iter().map(|&l| pattern(format, l)).collect();
            let spread: Vec<u16> = spread_r
                .iter()
                .enumerate()
                .map(|(i, &r)| {
                    if i == 0 {
                        0
                    } else {
                        0x8000 | ((r >> 20) as u16 % format.inf() as u16)
                    }
                })
                .collect();
            let peaked_takes = format == Half16::Bf16 || vocab > 65_536;
            for isa in Isa::available() {
                for (bits, want) in [(&peaked, peaked_takes), (&spread, vocab > 65_536)] {
                    let what = format!("{format:?} {isa:?} V {vocab} table {want}");
                    let t = 0.8;
                    let max = row_max(isa, format, bits, t);
                    let took = with_table(isa, format, bits, t, max.into(), false, |l| {
                        !matches!(l, Lookup::Plain)
                    });
                    assert_eq!(took, want, "{what}");
                    let (m, want_w, want_f) = core_weights(format, bits, t);
                    assert_eq!(m.to_bits(), max.to_bits(), "{what}");
                    let mut w = vec![0f32; vocab];
                    let mut w2 = vec![0f32; vocab];
                    // As the backend runs them: the span found by the maximum pass.
                    let f = match format {
                        Half16::Bf16 => {
                            let mx = softmax_max_of(isa, Bf16Row(bits), t);
                            assert_eq!(mx.span, Some(half_span(isa, format, bits)));
                            softmax_weights(isa, Bf16Row(bits), t, mx.m, &mut w2);
                            softmax_pass(isa, Bf16Row(bits), t, mx, Some(&mut w))
                        }
                        Half16::F16 => {
                            let mx = softmax_max_of(isa, F16Row(bits), t);
                            softmax_weights(isa, F16Row(bits), t, mx.m, &mut w2);
                            softmax_pass(isa, F16Row(bits), t, mx, Some(&mut w))
                        }
                    };
                    assert_eq!(f, want_f, "{what}");
                    for got in [&w, &w2] {
                        assert!(
                            got.iter()
                                .zip(&want_w)
                                .all(|(a, b)| a.to_bits() == b.to_bits()),
                            "{what}"
                        );
                    }
                }
            }
        }
    }
}

/// The maximum read off the patterns ([`Span::max_logit`]) is the core's on rows made of the
/// cases its selects tell apart: no ids, NaN only (either sign, both formats' payloads), ±∞,
/// ±0 alone or together, negatives only, NaN above every value, lengths below and above the
/// lane count (the tail's code and the lanes').
#[test]
fn the_pattern_maximum_is_the_cores() {
    for format in FORMATS {
        let inf = format.inf() as u16;
        let nan = inf + 1;
        let cases: [&[u16]; 10] = [
            &[],
            &[nan],
            &[nan | 0x8000, 0x7FFF, 0xFFFF],
            &[inf | 0x8000, nan],
            &[0x0000, 0x8000],
            &[0x8000],
            &[0x8000 | 0x3C00, 0x8000 | 0x3800, nan],
            &[inf, 0x3C00, nan],
            &[0x0001, 0x8001],
            &[0x8000 | inf, 0x8000 | inf],
        ];
        for case in cases {
            for copies in [1usize, 40] {
                let bits: Vec<u16> = case
                    .iter()
                    .copied()
                    .cycle()
                    .take(case.len() * copies)
                    .collect();
                let mut want = f32::NEG_INFINITY;
                for &b in &bits {
                    want = specula_core::verify::softmax_max(want, format.value(b));
                }
                for isa in Isa::available() {
                    let got = half_span(isa, format, &bits).max_logit(format);
                    assert_eq!(
                        got.to_bits() & 0x7FFF_FFFF,
                        want.to_bits() & 0x7FFF_FFFF,
                        "{format:?} {isa:?} {bits:04x?}"
                    );
                }
            }
        }
    }
}
