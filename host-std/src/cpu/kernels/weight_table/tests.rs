use super::*;
use crate::cpu::kernels::{softmax_max, softmax_pass, softmax_weights};
use specula_core::verify::{softmax_exp, softmax_fixed};

fn xorshift(mut s: u64) -> impl FnMut() -> u64 {
    move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    }
}

/// The core's weights and exact sum of the bf16 row `bits` at `t` (`max` the core's maximum).
fn core_weights(bits: &[u16], t: f32) -> (f32, Vec<f32>, u128) {
    let mut m = f32::NEG_INFINITY;
    for &b in bits {
        m = specula_core::verify::softmax_max(m, value(u32::from(b)) / t);
    }
    let w: Vec<f32> = bits
        .iter()
        .map(|&b| softmax_exp(value(u32::from(b)), t, m))
        .collect();
    let f = w
        .iter()
        .map(|&e| softmax_fixed(e))
        .fold(0, u128::wrapping_add);
    (m, w, f)
}

/// The sum and weights of `bits` through a table filled whatever the cost (`force`), with
/// `isa`'s lookup.
fn tabled_pass(isa: Isa, bits: &[u16], t: f32, max: f32) -> (u128, Vec<f32>) {
    let mut w = vec![7f32; bits.len()];
    let f = with_table(isa, bits, t, max, true, |lookup| {
        assert!(!matches!(lookup, Lookup::Plain), "forced");
        on_lookup!(lookup, super::super::Bf16Row(bits), |r| {
            super::super::softmax_pass_plain(isa, r, t, max, Some(&mut w))
        })
    });
    (f, w)
}

/// Rows built to break the table: NaN payloads of both signs, ±∞, ±0, subnormals, the
/// largest finite values, rows whose maximum is 0, −0 or negative, all-equal rows, only
/// tiny values, at temperatures from subnormal to huge, at lengths with tails. Forced through
/// the table on every instruction set, each weight and the sum are the core's.
#[test]
fn forced_tables_give_the_core_weights_on_hostile_rows() {
    let mut next = xorshift(0x7AB1_E5EE_D000_0001);
    let specials: [u16; 14] = [
        0x0000, 0x8000, 0x0001, 0x8001, 0x007F, 0x807F, 0x7F7F, 0xFF7F, 0x7F80, 0xFF80, 0x7FC0,
        0xFFC1, 0x7F81, 0x3F80,
    ];
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
                    1 => 0x8000 | ((r >> 20) as u16 % 0x4300),
                    // Tiny values only (subnormals and the smallest normals), both signs.
                    2 => ((r >> 20) as u16 & 0x8000) | ((r >> 24) as u16 % 0x0200),
                    // A few distinct values.
                    3 => [0x4120u16, 0xC0A0, 0x0000, 0x8000][(r >> 30) as usize % 4],
                    // A model-like row: logits in [−20, 12].
                    4 => {
                        let u = (r >> 40) as f32 / (1u64 << 24) as f32;
                        ((-20.0 + 32.0 * u).to_bits() >> 16) as u16
                    }
                    // −∞ everywhere but a few.
                    _ => {
                        if r % 9 == 0 {
                            (r >> 20) as u16 & 0xBFFF
                        } else {
                            0xFF80
                        }
                    }
                }
            })
            .collect();
        let t = temps[(next() % temps.len() as u64) as usize];
        let (m, want_w, want_f) = core_weights(&bits, t);
        for isa in Isa::available() {
            let what = format!("{isa:?} round {round} kind {kind} n {n} t {t:e}");
            let gm = softmax_max(isa, super::super::Bf16Row(&bits), t);
            assert_eq!(
                gm.to_bits() & 0x7FFF_FFFF,
                m.to_bits() & 0x7FFF_FFFF,
                "{what}"
            );
            let (f, w) = tabled_pass(isa, &bits, t, m);
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

/// [`collapse`] attacked by brute force: for maxima and temperatures of every kind, every
/// pattern of magnitude below `c` has the `x` of `+0` (so one weight), and `c` is the largest
/// such bound among the patterns below `top` (the pattern at `c`, when below `top`, differs at
/// one sign or the other).
#[test]
fn collapse_is_the_widest_equal_span() {
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
    ];
    for round in 0..60 {
        let max = if round < maxima.len() {
            maxima[round]
        } else {
            f32::from_bits(next() as u32 & 0xFF7F_FFFF)
        };
        let t = [0.8f32, 1.0, 1e-38, 1e38, 0.37][round % 5];
        let top = [INF, 0x4200, 0x0100, 1, 0][round % 5];
        let c = collapse(top, t, max);
        assert!(c <= top, "round {round}");
        let x = |p: u32| value(p) / t - max;
        let x0 = x(0);
        for p in 0..c {
            for q in [p, SIGN | p] {
                let xq = x(q);
                assert!(
                    xq == x0 && exp_p(xq).to_bits() == exp_p(x0).to_bits(),
                    "round {round} max {max:e} t {t:e} pattern {q:#06x} below c {c:#06x}"
                );
            }
        }
        if c < top {
            assert!(
                x(c) != x(SIGN | c),
                "round {round}: c {c:#06x} is not the widest"
            );
        }
    }
}

/// Rows shaped like a model's output take the table at the vocabularies users run (so the
/// conformance suites run it); a row with maximum 0 whose other values spread over every
/// negative pattern (no tiny values collapse then) does not at `V = 32000`.
#[test]
fn model_rows_take_the_table() {
    let mut next = xorshift(0x5EED);
    for vocab in [32_000usize, 128_256, 151_936, 262_144] {
        let peaked: Vec<u16> = (0..vocab)
            .map(|i| {
                let u = ((next() >> 40) as f32 + 1.0) / (1u64 << 24) as f32;
                // A `2·N(0, 1)`-like background (the log of a uniform) and one large logit.
                let l = if i == 7 { 25.0 } else { 2.0 * u.ln() + 1.0 };
                (l.to_bits() >> 16) as u16
            })
            .collect();
        let spread: Vec<u16> = (0..vocab)
            .map(|i| {
                if i == 0 {
                    0
                } else {
                    0x8000 | ((next() >> 20) as u16 % 0x7F80)
                }
            })
            .collect();
        for isa in Isa::available() {
            for (bits, want) in [(&peaked, true), (&spread, vocab > 65_536)] {
                let t = 0.8;
                let max = softmax_max(isa, super::super::Bf16Row(bits), t);
                let took = with_table(isa, bits, t, max, false, |l| !matches!(l, Lookup::Plain));
                assert_eq!(took, want, "{isa:?} V {vocab}");
                // Whichever way, the pass is the core's.
                let (m, want_w, want_f) = core_weights(bits, t);
                assert_eq!(m.to_bits(), max.to_bits());
                let mut w = vec![0f32; vocab];
                let f = softmax_pass(isa, super::super::Bf16Row(bits), t, max, Some(&mut w));
                assert_eq!(f, want_f, "{isa:?} V {vocab} table {want}");
                assert!(
                    w.iter()
                        .zip(&want_w)
                        .all(|(a, b)| a.to_bits() == b.to_bits())
                );
                let mut w2 = vec![0f32; vocab];
                softmax_weights(isa, super::super::Bf16Row(bits), t, max, 0, &mut w2);
                assert!(
                    w2.iter()
                        .zip(&want_w)
                        .all(|(a, b)| a.to_bits() == b.to_bits())
                );
            }
        }
    }
}
