use super::*;
use specula_core::verify::Cut;

/// The lane-wise softmax kernels give the core's bits (`softmax_max`, `softmax_fixed` of
/// `softmax_exp`, `Softmax::p`) on every instruction set, for rows with −∞, NaN, +∞, huge
/// and tiny logits, at lengths that leave tails.
#[test]
fn softmax_kernels_match_the_core() {
    use specula_core::verify::{Softmax, softmax_exp, softmax_fixed};
    let mut s = 0x50F7_3A11u64;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    for x in [
        -200.0f32,
        -87.0,
        -86.9,
        -0.0,
        0.0,
        1e-30,
        88.0,
        88.1,
        f32::NAN,
    ] {
        assert_eq!(
            exp_p(x).to_bits(),
            specula_core::verify::fmath::exp_p(x).to_bits(),
            "{x}"
        );
    }
    for round in 0..200 {
        let n = 1 + (next() % 300) as usize;
        let row: Vec<f32> = (0..n)
            .map(|_| match next() % 40 {
                0 => f32::NEG_INFINITY,
                1 => f32::NAN,
                2 => 1e30,
                3 => -1e30,
                _ => ((next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 60.0,
            })
            .collect();
        let t = [0.05f32, 0.7, 1.0, 3.0][round % 4];
        let want = Softmax::of(&row, t);
        let mut m = f32::NEG_INFINITY;
        for &l in &row {
            m = specula_core::verify::softmax_max(m, l / t);
        }
        let f: u128 = row
            .iter()
            .map(|&l| softmax_fixed(softmax_exp(l, t, m)))
            .fold(0, u128::wrapping_add);
        for isa in Isa::available() {
            let got_m = softmax_max(isa, &row[..], t);
            assert_eq!(
                got_m.to_bits() & 0x7FFF_FFFF,
                m.to_bits() & 0x7FFF_FFFF,
                "{isa:?}"
            );
            let mut w = vec![7f32; n];
            assert_eq!(
                softmax_pass(isa, &row[..], t, m, Some(&mut w)),
                f,
                "{isa:?} round {round}"
            );
            for (x, &l) in w.iter().zip(&row) {
                assert_eq!(x.to_bits(), softmax_exp(l, t, m).to_bits(), "{isa:?}");
            }
            assert_eq!(softmax_pass(isa, &row[..], t, m, None), f, "{isa:?}");
            // The write-out: the weights divided by the sum, as a cut keeping every id.
            if f != 0 {
                let mut out = vec![0f32; n];
                let all = specula_core::verify::Cut {
                    threshold: 0,
                    fixed: f,
                };
                cut_write(isa, &w, all, &mut out);
                for (o, &l) in out.iter().zip(&row) {
                    assert_eq!(o.to_bits(), want.p(l).to_bits(), "{isa:?} round {round}");
                }
            }
        }
    }
}

/// The one-pass softmax sum (and weights) at the vocabularies users run, binary32 and
/// bf16, on every instruction set: the core's maximum, sum and weights bit for bit. The
/// rows are long enough for the 32-bit piece sums to be emptied many times, and include a
/// row of equal logits (every weight exactly 1, the largest pieces) and rows with −∞, NaN
/// and huge logits.
#[test]
fn softmax_pass_matches_the_core_at_real_sizes() {
    use specula_core::verify::{softmax_exp, softmax_fixed};
    let mut s = 0xB16_50F7u64;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    for (case, vocab) in [32_000usize, 32_768, 128_256, 131_072, 151_936]
        .into_iter()
        .enumerate()
    {
        for kind in 0..3 {
            let row: Vec<f32> = (0..vocab)
                .map(|_| match kind {
                    // Every weight 1 (the largest pieces, in every lane).
                    0 => 2.5,
                    1 => 3.0 * (((next() >> 40) as f32 + 1.0) / 16_777_216.0).ln(),
                    _ => match next() % 50 {
                        0 => f32::NEG_INFINITY,
                        1 => f32::NAN,
                        2 => -1e30,
                        _ => ((next() >> 40) as f32 / 16_777_216.0 - 0.5) * 40.0,
                    },
                })
                .collect();
            let bf: Vec<u16> = row.iter().map(|x| (x.to_bits() >> 16) as u16).collect();
            let widened: Vec<f32> = bf
                .iter()
                .map(|&b| f32::from_bits(u32::from(b) << 16))
                .collect();
            let hf: Vec<u16> = row
                .iter()
                .map(|&x| half::f16::from_f32(x).to_bits())
                .collect();
            let widened16: Vec<f32> = hf
                .iter()
                .map(|&b| half::f16::from_bits(b).to_f32())
                .collect();
            let t = [0.8f32, 1.0, 0.37][(case + kind) % 3];
            for (name, want_row) in [("f32", &row), ("bf16", &widened), ("f16", &widened16)] {
                let mut m = f32::NEG_INFINITY;
                for &l in want_row.iter() {
                    m = specula_core::verify::softmax_max(m, l / t);
                }
                let f: u128 = want_row
                    .iter()
                    .map(|&l| softmax_fixed(softmax_exp(l, t, m)))
                    .sum();
                for isa in Isa::available() {
                    let what = format!("{isa:?} {name} V {vocab} kind {kind}");
                    let mut w = vec![7f32; vocab];
                    let (got_m, got_f) = if name == "f32" {
                        let gm = softmax_max(isa, &row[..], t);
                        (gm, softmax_pass(isa, &row[..], t, m, Some(&mut w)))
                    } else if name == "bf16" {
                        let gm = softmax_max(isa, Bf16Row(&bf), t);
                        (gm, softmax_pass(isa, Bf16Row(&bf), t, m, Some(&mut w)))
                    } else {
                        let gm = softmax_max(isa, F16Row(&hf), t);
                        // The maximum read in place is the widened row's, to the bit.
                        let wide = softmax_max(isa, &widened16[..], t);
                        assert_eq!(
                            gm.to_bits(),
                            wide.to_bits(),
                            "{isa:?} V {vocab} kind {kind}"
                        );
                        (gm, softmax_pass(isa, F16Row(&hf), t, m, Some(&mut w)))
                    };
                    assert_eq!(
                        got_m.to_bits() & 0x7FFF_FFFF,
                        m.to_bits() & 0x7FFF_FFFF,
                        "{what}"
                    );
                    assert_eq!(got_f, f, "{what}");
                    for (i, (x, &l)) in w.iter().zip(want_row.iter()).enumerate() {
                        assert_eq!(x.to_bits(), softmax_exp(l, t, m).to_bits(), "{what} id {i}");
                    }
                    // The write-out from the weights is the core's softmax `p`.
                    let sm = specula_core::verify::Softmax::from_parts(t, m, f);
                    let all = specula_core::verify::Cut {
                        threshold: 0,
                        fixed: f,
                    };
                    let mut out = vec![7f32; vocab];
                    cut_write(isa, &w, all, &mut out);
                    for (i, (o, &l)) in out.iter().zip(want_row.iter()).enumerate() {
                        assert_eq!(o.to_bits(), sm.p(l).to_bits(), "{what} p of id {i}");
                    }
                }
            }
        }
    }
}

/// `gather_keys` returns exactly the keys in `[lo, hi)` in id order and the exact mass of
/// the keys `≥ hi` on every instruction set, and says when there are more than the cap.
#[test]
fn gather_keys_is_the_filter() {
    use specula_core::verify::weight_fixed;
    let mut s = 0x6A7_4E55u64;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    for round in 0..72 {
        let n = 1 + (next() % 140_000) as usize;
        let w: Vec<f32> = (0..n)
            .map(|_| match next() % 20 {
                0 => f32::NAN,
                1 => -0.25,
                2 => 0.0,
                3 => 1.0,
                4 => f32::from_bits(1 + (next() % 1000) as u32),
                _ => ((next() >> 40) as f32 / 16_777_216.0).powi(8),
            })
            .collect();
        let lo = [1u32, 0x3E80_0000, 0x3F00_0000, 0x3C00_0000][round % 4];
        // Every route of the AVX-512 gather: no mass (`u32::MAX`), binary64 sums (`≥ 2⁻¹⁴`),
        // 32-bit pieces (below).
        let hi = [
            u32::MAX,
            0x3F40_0000,
            0x3F80_0000,
            0x3F80_0001,
            0x3000_0000,
            0x0100_0000,
        ][(round / 4) % 6]
            .max(lo + 1);
        let key = |x: f32| if x > 0.0 { x.to_bits() } else { 0 };
        let want: Vec<u32> = w
            .iter()
            .map(|&x| key(x))
            .filter(|&k| k >= lo && k < hi)
            .collect();
        let above: u128 = if hi == u32::MAX {
            0
        } else {
            w.iter()
                .filter(|&&x| key(x) >= hi)
                .map(|&x| weight_fixed(x))
                .sum()
        };
        for isa in Isa::available() {
            let mut got = Vec::new();
            assert_eq!(
                gather_keys(isa, &w, lo, hi, &mut got, n),
                Some(above),
                "{isa:?}"
            );
            assert_eq!(got, want, "{isa:?} round {round}");
            if !want.is_empty() {
                let mut got = Vec::new();
                assert_eq!(gather_keys(isa, &w, lo, hi, &mut got, want.len() - 1), None);
            }
        }
    }
}

/// `max_mass` gives the largest key of every row and, for rows with no value above 1, the
/// exact mass of the positive values (NaN, zeros, negatives and subnormals among them), on
/// every instruction set and at lengths that leave a tail.
#[test]
fn max_mass_is_the_key_and_the_mass() {
    use specula_core::verify::{weight_fixed, weight_key};
    let mut s = 0x3A5_5EEDu64;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    for round in 0..40 {
        let n = [1usize, 7, 31, 32, 33, 4_095, 32_000, 128_256][round % 8] + (round / 8) * 3;
        let mut w: Vec<f32> = (0..n)
            .map(|_| match next() % 20 {
                0 => f32::NAN,
                1 => -0.25,
                2 => 0.0,
                3 => -0.0,
                4 => f32::from_bits(1 + (next() % 1000) as u32),
                _ => ((next() >> 40) as f32 / 16_777_216.0).powi(8),
            })
            .collect();
        // A row with a 1, one above 1 and one with +∞, on some rounds.
        match round % 5 {
            1 => w[n / 2] = 1.0,
            2 => w[n - 1] = 1.5,
            3 => w[0] = f32::INFINITY,
            _ => {}
        }
        let top = w.iter().map(|&x| weight_key(x)).max().unwrap_or(0);
        // Wrapping, as the rules sum masses (`+∞` alone saturates a term).
        let mass = w
            .iter()
            .fold(0u128, |a, &x| a.wrapping_add(weight_fixed(x)));
        for isa in Isa::available() {
            let (k, m) = max_mass(isa, &w);
            assert_eq!(k, top, "{isa:?} round {round}");
            assert_eq!(
                k,
                weight_key(softmax_max(isa, &w[..], 1.0)),
                "{isa:?} round {round}"
            );
            if top <= 0x3F80_0000 {
                assert_eq!(m, mass, "{isa:?} round {round}");
            }
        }
    }
}

/// The clamped `exp_p` is the core's for a sweep of every bit pattern and the edges, and so
/// is `exp_nonpos` wherever it is defined (`x ≤ 0` or NaN; every pattern of `(−87, 0]` near
/// the range reduction's seams is in the sweep's neighbourhoods below).
#[test]
fn exp_p_matches_the_core_everywhere() {
    // Around each seam of `n` (x = (k + ½)·ln 2) and the ends of the range, every pattern.
    let seams = (0..=126).flat_map(|k| {
        let x = -((k as f32) + 0.5) * std::f32::consts::LN_2;
        let b = x.to_bits();
        b - 64..b + 64
    });
    for bits in (0..=u32::MAX)
        .step_by(89)
        .chain([0x7F80_0000, 0xFF80_0000, 0x7FC0_0000, 0x8000_0000, 0])
        .chain(seams)
        .chain((-87.0f32).to_bits() - 64..(-87.0f32).to_bits() + 64)
    {
        let x = f32::from_bits(bits);
        let want = specula_core::verify::fmath::exp_p(x).to_bits();
        assert_eq!(exp_p(x).to_bits(), want, "{x:e} ({bits:#x})");
        if x.is_nan() || x <= 0.0 {
            assert_eq!(exp_nonpos(x).to_bits(), want, "{x:e} ({bits:#x})");
        }
    }
}

/// `div_t` and `div_s` either give the divisions' bits or say they may not: over a sweep of
/// logits for many temperatures (including values built to sit near rounding boundaries),
/// and over random weights and sums.
#[test]
fn reciprocal_products_are_the_divisions_or_flagged() {
    let mut s = 0x0D17_5EEDu64;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let (mut flagged, mut total) = (0u64, 0u64);
    let temps = [
        0.8f32,
        0.7,
        1.0,
        0.3,
        1.7,
        0.05,
        3.0,
        1e-20,
        7e30,
        f32::MIN_POSITIVE,
    ];
    for (i, &t) in temps.iter().chain(&[0.123_456_7f32; 1]).enumerate() {
        let inv_t = 1.0 / f64::from(t);
        let step = if i < 2 { 61 } else { 4093 };
        for bits in (0..=u32::MAX).step_by(step) {
            let l = f32::from_bits(bits);
            let (q, near) = div_t(l, inv_t);
            total += 1;
            if near {
                flagged += 1;
            } else {
                assert_eq!(q.to_bits(), (l / t).to_bits(), "{l:e} / {t:e}");
            }
        }
        // Logits whose quotient is (nearly) a binary32 midpoint.
        for _ in 0..200_000 {
            let q = f32::from_bits((next() as u32 & 0x3FFF_FFFF) | 0x2000_0000);
            let mid = f64::from(q) * (1.0 + 2f64.powi(-24));
            let l = (mid * f64::from(t)) as f32;
            let (q, near) = div_t(l, inv_t);
            if !near {
                assert_eq!(q.to_bits(), (l / t).to_bits(), "{l:e} / {t:e}");
            }
        }
    }
    assert!(total > 0 && flagged < total);
    // Realistic logits at a realistic temperature are almost never flagged.
    let inv_t = 1.0 / f64::from(0.8f32);
    let flagged = (0..1_000_000)
        .filter(|_| {
            let l = ((next() >> 40) as f32 / 16_777_216.0 - 0.5) * 60.0;
            div_t(l, inv_t).1
        })
        .count();
    assert!(flagged < 100, "{flagged} of 1000000 flagged");
    for _ in 0..2_000_000 {
        let e = f32::from_bits((next() >> 40) as u32 % 0x3F80_0001);
        let sum = 1.0 + (next() >> 11) as f64 * 2f64.powi(-53) * 300_000.0;
        let (p, near) = div_s(e, 1.0 / sum);
        if !near {
            assert_eq!(
                p.to_bits(),
                ((f64::from(e) / sum) as f32).to_bits(),
                "{e:e} / {sum:e}"
            );
        }
    }
}

/// `cut_write` gives `Cut::p` of every weight on every instruction set, kept or not.
#[test]
fn cut_write_matches_the_core() {
    let mut s = 0xC07_0F5u64;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    for round in 0..300 {
        let n = 1 + (next() % 500) as usize;
        let w: Vec<f32> = (0..n)
            .map(|_| match next() % 30 {
                0 => f32::NAN,
                1 => -0.5,
                2 => 0.0,
                3 => f32::from_bits(1 + (next() % 1000) as u32),
                4 => 3.0e38,
                _ => (next() >> 40) as f32 / 16_777_216.0,
            })
            .collect();
        let cut = Cut {
            threshold: [0, 0x3E80_0000, 0x3F00_0000, 1][round % 4],
            fixed: match round % 5 {
                0 => 0,
                1 => 1,
                _ => u128::from(next()) << (next() % 64),
            },
        };
        for isa in Isa::available() {
            let mut out = vec![7f32; n];
            cut_write(isa, &w, cut, &mut out);
            for (o, &x) in out.iter().zip(&w) {
                assert_eq!(o.to_bits(), cut.p(x).to_bits(), "{isa:?} {x:e} {cut:?}");
            }
        }
    }
}

/// [`softmax_weights`] (the weight tables' fill) writes the exact pass's weights, at the
/// vocabularies users run, for f32 and bf16 rows, on every instruction set.
#[test]
fn softmax_weights_are_the_pass_weights() {
    let mut s = 0xA99_0C5u64;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    for vocab in [32_000usize, 32_768, 128_256, 151_936, 262_144] {
        for kind in 0..3 {
            let row: Vec<f32> = (0..vocab)
                .map(|_| {
                    let u = ((next() >> 40) as f32 + 1.0) / 16_777_216.0;
                    match kind {
                        0 => 3.0 * u.ln(),
                        // LLM-like: a few high logits over a wide low tail.
                        1 => {
                            if next() % 1000 == 0 {
                                10.0 * u
                            } else {
                                -12.0 + 4.0 * u.ln()
                            }
                        }
                        // Coarse values: many equal weights.
                        _ => (8.0 * u.ln()).round() / 2.0,
                    }
                })
                .collect();
            let bf: Vec<u16> = row.iter().map(|x| (x.to_bits() >> 16) as u16).collect();
            let t = [0.8f32, 1.0, 0.37][kind];
            for isa in Isa::available() {
                for half in [false, true] {
                    let what = format!("{isa:?} V {vocab} kind {kind} bf16 {half}");
                    let mut exact_w = vec![0f32; vocab];
                    let mut w = vec![7f32; vocab];
                    if half {
                        let max = softmax_max(isa, Bf16Row(&bf), t);
                        softmax_pass(isa, Bf16Row(&bf), t, max, Some(&mut exact_w));
                        softmax_weights(isa, Bf16Row(&bf), t, max, &mut w);
                    } else {
                        let max = softmax_max(isa, &row[..], t);
                        softmax_pass(isa, &row[..], t, max, Some(&mut exact_w));
                        softmax_weights(isa, &row[..], t, max, &mut w);
                    }
                    assert!(
                        w.iter()
                            .zip(&exact_w)
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{what}"
                    );
                }
            }
        }
    }
}

/// The gather's mass above `hi` is exact on the binary64 route too (`hi ≥ 2⁻¹⁴`), up to
/// its per-lane limit: rows of ones (the largest sums) and of random weights in `[2⁻¹⁴, 1]`
/// near a binade boundary, at 256k and 1M ids, every instruction set.
#[test]
fn gather_mass_is_exact_on_the_binary64_route() {
    use specula_core::verify::weight_fixed;
    let mut s = 0x6A7_4E5u64;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    for len in [262_144usize, 1 << 20, 1_000_003] {
        for kind in 0..3 {
            let w: Vec<f32> = (0..len)
                .map(|_| match kind {
                    0 => 1.0,
                    1 => f32::from_bits(KEY_2_M14 + (next() % 0x0100_0000) as u32),
                    _ => f32::from_bits((next() % u64::from(0x3F80_0001u32)) as u32),
                })
                .collect();
            for hi in [KEY_2_M14, KEY_2_M14 + 1, 0x3F00_0000, 0x3F80_0000] {
                let want: u128 = w
                    .iter()
                    .filter(|&&x| x.to_bits() >= hi)
                    .map(|&x| weight_fixed(x))
                    .sum();
                for isa in Isa::available() {
                    let got = gather_keys(isa, &w, u32::MAX, hi, &mut Vec::new(), 0);
                    assert_eq!(got, Some(want), "{isa:?} len {len} kind {kind} hi {hi:#x}");
                }
            }
        }
    }
}

/// Times the softmax passes on one 128k row (`cargo test --release -p specula --lib --
/// --ignored --nocapture softmax_pass_timing`), in this thread's CPU time.
#[test]
#[ignore = "timing, run by hand"]
fn softmax_pass_timing() {
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
    fn time(name: &str, mut f: impl FnMut()) {
        f();
        let c0 = cpu_s();
        let mut n = 0;
        while cpu_s() - c0 < 0.5 || n < 3 {
            f();
            n += 1;
        }
        println!("{name:<28} {:8.1} us", (cpu_s() - c0) / f64::from(n) * 1e6);
    }
    let v = std::env::var("SPECULA_TIMING_V")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(128 * 1024);
    let mut x = 0x1234_5678u32;
    let row: Vec<f32> = (0..v)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            3.0 * ((x >> 8) as f32 / 16_777_216.0 + 1e-6).ln()
        })
        .collect();
    let mut out = vec![0f32; v];
    let t = 0.8;
    for isa in Isa::available() {
        time(&format!("{isa:?} read"), || {
            std::hint::black_box(row.iter().fold(0f32, |a, &b| a.max(b)));
        });
        time(&format!("{isa:?} max"), || {
            std::hint::black_box(softmax_max(isa, std::hint::black_box(&row[..]), t));
        });
        let m = softmax_max(isa, &row[..], t);
        time(&format!("{isa:?} pass (sum)"), || {
            std::hint::black_box(softmax_pass(
                isa,
                std::hint::black_box(&row[..]),
                t,
                m,
                None,
            ));
        });
        time(&format!("{isa:?} max + sum bound"), || {
            std::hint::black_box(sum_bound(isa, std::hint::black_box(&row[..]), t, None));
        });
        let bf: Vec<u16> = row.iter().map(|x| (x.to_bits() >> 16) as u16).collect();
        time(&format!("{isa:?} pass bf16 (sum)"), || {
            std::hint::black_box(softmax_pass(
                isa,
                Bf16Row(std::hint::black_box(&bf)),
                t,
                m,
                None,
            ));
        });
        time(&format!("{isa:?} weights"), || {
            softmax_weights(isa, std::hint::black_box(&row[..]), t, m, &mut out);
            std::hint::black_box(&out);
        });
        time(&format!("{isa:?} bf16 pass (sum + weights)"), || {
            std::hint::black_box(softmax_pass(
                isa,
                Bf16Row(std::hint::black_box(&bf)),
                t,
                m,
                Some(&mut out),
            ));
        });
        // A model-like bf16 row: one large logit over a `2·ln u` background (its maximum far
        // from 0, so most patterns collapse into one table entry).
        let peaked: Vec<u16> = row
            .iter()
            .enumerate()
            .map(|(i, &l)| {
                let x = if i == 7 { 25.0 } else { 2.0 / 3.0 * l + 1.0 };
                (x.to_bits() >> 16) as u16
            })
            .collect();
        let pm = softmax_max(isa, Bf16Row(&peaked), t);
        time(&format!("{isa:?} bf16 peaked pass (sum + weights)"), || {
            std::hint::black_box(softmax_pass(
                isa,
                Bf16Row(std::hint::black_box(&peaked)),
                t,
                pm,
                Some(&mut out),
            ));
        });
        time(&format!("{isa:?} pass (sum + weights)"), || {
            std::hint::black_box(softmax_pass(
                isa,
                std::hint::black_box(&row[..]),
                t,
                m,
                Some(&mut out),
            ));
        });
        let mut w = vec![0f32; v];
        let all = specula_core::verify::Cut {
            threshold: 0,
            fixed: softmax_pass(isa, &row[..], t, m, Some(&mut w)),
        };
        time(&format!("{isa:?} write (weights / S)"), || {
            cut_write(isa, std::hint::black_box(&w), all, &mut out);
            std::hint::black_box(&out);
        });
        // f16: read in place (the maximum widened on load, the weights from the table) against
        // widening into a binary32 buffer first, as rows were before (`f16 widen` + the f32
        // lines above).
        let hf: Vec<u16> = row
            .iter()
            .map(|&x| half::f16::from_f32(x).to_bits())
            .collect();
        let hm = softmax_max(isa, F16Row(&hf), t);
        let mut wide = vec![0f32; v];
        time(&format!("{isa:?} f16 widen"), || {
            let half = specula_core::verify::Half::F16(std::hint::black_box(&hf));
            specula_core::verify::Values::Half(half).widen_into(&mut wide);
            std::hint::black_box(&wide);
        });
        time(&format!("{isa:?} f16 widen (lanes)"), || {
            let half = specula_core::verify::Half::F16(std::hint::black_box(&hf));
            widen_into(specula_core::verify::Values::Half(half), &mut wide);
            std::hint::black_box(&wide);
        });
        time(&format!("{isa:?} f16 max"), || {
            std::hint::black_box(softmax_max(isa, F16Row(std::hint::black_box(&hf)), t));
        });
        time(&format!("{isa:?} f16 pass (sum)"), || {
            std::hint::black_box(softmax_pass(
                isa,
                F16Row(std::hint::black_box(&hf)),
                t,
                hm,
                None,
            ));
        });
        time(&format!("{isa:?} f16 plain pass (sum)"), || {
            std::hint::black_box(softmax_pass_plain(
                isa,
                F16Row(std::hint::black_box(&hf)),
                t,
                hm,
                0.0,
                None,
            ));
        });
        time(&format!("{isa:?} f16 pass (sum + weights)"), || {
            std::hint::black_box(softmax_pass(
                isa,
                F16Row(std::hint::black_box(&hf)),
                t,
                hm,
                Some(&mut out),
            ));
        });
    }
}

/// The skip test of [`race_range`] relies on [`skip_key`] never exceeding the key by more
/// than one `f32` rounding and on its clamp to `f32::MAX`.
#[test]
fn skip_key_is_conservative() {
    for key in [1e-300, 1e-46, 1.5, 3.4e38, 3.5e38, 1e300, f64::INFINITY] {
        let s = f64::from(skip_key(key));
        assert!(
            s.is_finite() && s <= key * (1.0 + 1.0 / 16_777_216.0),
            "{key:e} → {s:e}"
        );
    }
    assert_eq!(skip_key(-1.0), -1.0);
}

#[test]
fn conversion_matches_saturating_as() {
    let check = |t: f32| {
        if !t.is_nan() {
            assert_eq!(f32_to_i64_sat(t), t as i64, "{t:e} ({:#x})", t.to_bits());
        }
    };
    // A sparse sweep of all bit patterns, plus every exponent's edges.
    for bits in (0..=u32::MAX).step_by(997) {
        check(f32::from_bits(bits));
    }
    for e in 0u32..256 {
        for sign in [0, 0x8000_0000] {
            for mant in [0, 1, 0x40_0000, 0x7F_FFFF] {
                check(f32::from_bits(sign | e << 23 | mant));
            }
        }
    }
    assert_eq!(f32_to_i64_sat(-9.223_372e18), i64::MIN);
}

#[test]
fn entropy_term_matches_core() {
    for bits in (0..=u32::MAX).step_by(991) {
        let p = f32::from_bits(bits);
        assert_eq!(
            entropy_term(p),
            specula_core::verify::fmath::entropy_term(p),
            "{p:e}"
        );
    }
}

/// The 512-bit widening ([`F16Wide512`], the sum bound's f16 loads on AVX-512) is the core's
/// `f16_to_f32` for every pattern that is a number, bit for bit, and a NaN for every NaN
/// pattern, in blocks of 16 and 32 and, through [`F16Wide`], of 8.
#[cfg(specula_avx512)]
#[test]
fn f16_512_widening_is_the_cores_for_every_number() {
    #[target_feature(enable = "avx512f")]
    fn wide<const N: usize>(bits: &[u16], start: usize) -> [f32; N] {
        F16Wide512(bits).block::<N>(start)
    }
    if Isa::best() != Isa::Avx512 {
        println!("SKIPPED: this CPU has no AVX-512");
        return;
    }
    let all: Vec<u16> = (0..=u16::MAX).collect();
    let check = |b: u16, got: f32| {
        let want = specula_core::verify::f16_to_f32(b);
        if want.is_nan() {
            assert!(got.is_nan(), "pattern {b:#06x}: {got}");
        } else {
            assert_eq!(got.to_bits(), want.to_bits(), "pattern {b:#06x}");
        }
    };
    for start in (0..all.len()).step_by(32) {
        // SAFETY: AVX-512F is present (checked above).
        let (w8, w16, w32) = unsafe {
            (
                wide::<8>(&all, start),
                wide::<16>(&all, start + 16),
                wide::<32>(&all, start),
            )
        };
        for (l, &w) in w32.iter().enumerate() {
            check(all[start + l], w);
        }
        for (l, &w) in w16.iter().enumerate() {
            check(all[start + 16 + l], w);
        }
        for (l, &w) in w8.iter().enumerate() {
            check(all[start + l], w);
        }
    }
}

/// The sum bound's bf16 reads two ids a word ([`Bf16Pairs`]): a block of `N` holds id
/// `s + 2k` at `k` and id `s + 2k + 1` at `N/2 + k`, each the exact widening of its pattern,
/// for every pattern, in blocks of 8, 16 and 32, from a slice that starts off a word's
/// alignment too, and an odd block in id order.
#[cfg(target_arch = "x86_64")]
#[test]
fn bf16_pairs_hold_the_even_ids_then_the_odd_ones() {
    fn check<const N: usize>(bits: &[u16], start: usize) {
        let got = Bf16Pairs(bits).block::<N>(start);
        for k in 0..N / 2 {
            for (slot, id) in [(k, start + 2 * k), (N / 2 + k, start + 2 * k + 1)] {
                assert_eq!(
                    got[slot].to_bits(),
                    Half16::Bf16.value(bits[id]).to_bits(),
                    "N {N} start {start} slot {slot} id {id}"
                );
            }
        }
    }
    let all: Vec<u16> = (0..=u16::MAX).chain(0..=7).collect();
    for bits in [&all[..], &all[1..]] {
        for start in (0..1 << 16).step_by(32) {
            check::<32>(bits, start);
            check::<16>(bits, start);
            check::<8>(bits, start + 8);
        }
    }
    let odd = Bf16Pairs(&all[1..]).block::<5>(0x7F7E);
    for (l, &w) in odd.iter().enumerate() {
        assert_eq!(
            w.to_bits(),
            Half16::Bf16.value(all[1 + 0x7F7E + l]).to_bits()
        );
    }
}

/// F16C's widening ([`F16Wide`], the x86 kernels' f16 loads) is the core's `f16_to_f32` for
/// every pattern that is a number, bit for bit, and a NaN for every NaN pattern (whose weight
/// is 0 however its payload reads), in blocks of 8 and 32 and with a tail.
#[cfg(target_arch = "x86_64")]
#[test]
fn f16c_widening_is_the_cores_for_every_number() {
    #[target_feature(enable = "f16c")]
    unsafe fn wide<const N: usize>(bits: &[u16], start: usize) -> [f32; N] {
        F16Wide(bits).block::<N>(start)
    }
    if !std::arch::is_x86_feature_detected!("f16c") {
        assert!(std::env::var_os("CI").is_none(), "CI machines have F16C");
        println!("SKIPPED: this CPU has no F16C");
        return;
    }
    let all: Vec<u16> = (0..=u16::MAX).collect();
    let check = |b: u16, got: f32| {
        let want = specula_core::verify::f16_to_f32(b);
        if want.is_nan() {
            assert!(got.is_nan(), "pattern {b:#06x}: {got}");
        } else {
            assert_eq!(got.to_bits(), want.to_bits(), "pattern {b:#06x}");
        }
    };
    for start in (0..all.len()).step_by(32) {
        // SAFETY: F16C is present (checked above).
        let (w8, w32) = unsafe { (wide::<8>(&all, start), wide::<32>(&all, start)) };
        for (l, &w) in w32.iter().enumerate() {
            check(all[start + l], w);
        }
        for (l, &w) in w8.iter().enumerate() {
            check(all[start + l], w);
        }
    }
    // A block length the instruction does not divide: the lane code.
    // SAFETY: as above.
    let odd = unsafe { wide::<5>(&all, 0x7BFE) };
    for (l, &w) in odd.iter().enumerate() {
        check(0x7BFE + l as u16, w);
    }
}

/// The lane code's f16 widening is the core's `f16_to_f32`, for every pattern, one at a time
/// and in blocks (as the kernels load them).
#[test]
fn f16_widening_is_the_cores_for_every_pattern() {
    let all: Vec<u16> = (0..=u16::MAX).collect();
    for (c, block) in all.chunks_exact(32).enumerate() {
        let block: &[u16; 32] = block.try_into().unwrap();
        let wide = Half16::F16.widen(block);
        for (l, (&b, w)) in block.iter().zip(wide).enumerate() {
            let want = specula_core::verify::f16_to_f32(b).to_bits();
            assert_eq!(Half16::F16.value(b).to_bits(), want, "pattern {b:#06x}");
            assert_eq!(w.to_bits(), want, "pattern {b:#06x} in block {c} lane {l}");
            assert_eq!(
                F16Row(&all).at(usize::from(b)).to_bits(),
                want,
                "pattern {b:#06x}"
            );
        }
    }
    // The row widening, at lengths with tails, and for both formats.
    use specula_core::verify::{Half, Values};
    for len in [0usize, 5, 16, 1000, 65_536 - 3] {
        for half in [Half::F16(&all[3..3 + len]), Half::Bf16(&all[..len])] {
            let (mut got, mut want) = (vec![7f32; len], vec![8f32; len]);
            widen_into(Values::Half(half), &mut got);
            Values::Half(half).widen_into(&mut want);
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "len {len}"
            );
        }
    }
}

/// Rows of weights for the [`CutRow`] tests: softmax-like weights in `(0, 1]`, some zero,
/// NaN, negative, subnormal and above-1 values (stored probabilities are not checked for
/// those), at lengths that leave partial blocks.
fn cut_rows() -> Vec<Vec<f32>> {
    let mut s = 0x0C07_2025u64;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let mut rows = Vec::new();
    for (i, len) in [1usize, 5, 63, 64, 65, 200, 1000, 4099]
        .into_iter()
        .enumerate()
    {
        for mode in 0..3 {
            let row = (0..len)
                .map(|_| {
                    let u = (next() >> 40) as f32 / (1u64 << 24) as f32;
                    match (mode, next() % 50) {
                        (1, 0) => f32::NAN,
                        (1, 1) => -u,
                        (1, 2) => f32::from_bits((next() % 0x0080_0000) as u32),
                        (1, 3) => 1.0 + 3.0 * u,
                        (_, 4..=9) => 0.0,
                        // A peaked row: one large weight, a background spread over decades.
                        (2, _) => (-30.0 * u).exp(),
                        _ => u,
                    }
                })
                .collect::<Vec<f32>>();
            let mut row = row;
            if mode == 2 {
                row[(i * 7) % len] = 1.0;
            }
            rows.push(row);
        }
    }
    rows
}

/// The cuts of a row the tests race: every id (the softmax's own sum), a threshold in the
/// middle of the keys, sums far from the row's (reciprocals just above and below binary32
/// values), and sums whose reciprocals leave the binary32 range (no unwritten row).
fn cuts_of(row: &[f32], next: &mut impl FnMut() -> u64) -> Vec<Cut> {
    let fixed: u128 = row
        .iter()
        .map(|&w| specula_core::verify::weight_fixed(w.min(1.0)))
        .fold(0, u128::wrapping_add);
    let mid = row
        .iter()
        .copied()
        .find(|w| *w > 0.0)
        .map_or(0, f32::to_bits);
    let mut cuts = vec![
        Cut {
            threshold: 0,
            fixed,
        },
        Cut {
            threshold: mid,
            fixed,
        },
        Cut {
            threshold: 0,
            fixed: 1,
        },
        Cut {
            threshold: 0,
            fixed: 0,
        },
    ];
    for _ in 0..6 {
        // Sums between 2⁻³⁰ and 2³⁰ with random low bits.
        let e = next() % 60;
        cuts.push(Cut {
            threshold: if next() % 2 == 0 { 0 } else { mid },
            fixed: (u128::from(next()) | 1) << e >> 4,
        });
    }
    cuts
}

/// The race over a [`CutRow`] (weights never written out) is the race over the written row
/// (`cut_write`, then `Row`, `Residual` or `OneHot`), on every instruction set: rows with NaN,
/// negative, subnormal and above-1 values, draft rows above and below the target, thresholds,
/// and sums far from the row's.
#[test]
fn unwritten_rows_race_as_written_ones() {
    let mut s = 0x5EED_0C07u64;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let mut raced = 0;
    for (r, w) in cut_rows().iter().enumerate() {
        let len = w.len();
        let draft: Vec<f32> = w
            .iter()
            .map(|&x| {
                let f = 0.5 + (next() >> 40) as f32 / (1u64 << 24) as f32;
                if next() % 9 == 0 { -x } else { x * f }
            })
            .collect();
        for cut in cuts_of(w, &mut next) {
            let Some(row) = CutRow::new(w, cut, Minus::Nothing) else {
                assert!(
                    cut.fixed < 2,
                    "row {r}: a plain sum must be raced unwritten"
                );
                continue;
            };
            let mut p = vec![0f32; len];
            cut_write(Isa::Portable, w, cut, &mut p);
            let token = (next() % len as u64) as u32;
            for isa in Isa::available() {
                for position in 0..3 {
                    let rng = RaceRng {
                        seed: next(),
                        offset: next() % 1000,
                        position,
                    };
                    let name = format!("{isa:?} row {r} cut {cut:?} position {position}");
                    assert_eq!(
                        race(isa, rng, row, 0, len),
                        race(isa, rng, Row(&p), 0, len),
                        "plain {name}"
                    );
                    assert_eq!(
                        race(isa, rng, row.minus(Minus::Draft(&draft)), 0, len),
                        race(
                            isa,
                            rng,
                            Residual {
                                target: &p,
                                draft: &draft
                            },
                            0,
                            len
                        ),
                        "residual {name}"
                    );
                    assert_eq!(
                        race(isa, rng, row.minus(Minus::OneHot(token)), 0, len),
                        race(isa, rng, OneHot { target: &p, token }, 0, len),
                        "one-hot {name}"
                    );
                    raced += 1;
                }
            }
        }
    }
    assert!(raced > 500);
}

/// The hand-written AVX-512 race (two Philox blocks at a time, the values of cut rows computed
/// in registers) gives the lane race's best on every form of weights, from starts that are and
/// are not on a 64- or 128-id boundary, to ends inside a block pair, on rows whose blocks hold
/// no candidate in one half of a pair (the half whose random numbers are skipped).
#[test]
fn every_race_kernel_gives_the_lane_race() {
    let mut s = 0x2ACE_0001u64;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let mut raced = 0;
    for (r, w) in cut_rows().iter().enumerate() {
        let len = w.len();
        // Whole 64-id blocks of zeros, so one half of a pair may have no candidate.
        let mut sparse = w.clone();
        for (i, x) in sparse.iter_mut().enumerate() {
            if (i / 64) % 3 == 1 {
                *x = 0.0;
            }
        }
        let draft: Vec<f32> = w
            .iter()
            .map(|&x| if next() % 5 == 0 { -x } else { x * 0.75 })
            .collect();
        for row in [w, &sparse] {
            for cut in cuts_of(row, &mut next) {
                let Some(c) = CutRow::new(row, cut, Minus::Nothing) else {
                    continue;
                };
                let token = (next() % len as u64) as u32;
                let rng = RaceRng {
                    seed: next(),
                    offset: next() % 1000,
                    position: (next() % 5) as u32,
                };
                for start in [0usize, 4, 60, 64, 124, 128, 132] {
                    if start >= len {
                        continue;
                    }
                    for end in [len, len - (len - start) / 3] {
                        let ends = format!("row {r} cut {cut:?} {start}..{end}");
                        let lane = |w: &dyn Fn(Isa) -> Best, name: &str| {
                            for isa in Isa::available() {
                                assert_eq!(w(isa), w(Isa::Portable), "{isa:?} {name} {ends}");
                            }
                        };
                        let plain = Row(row);
                        let res = Residual {
                            target: row,
                            draft: &draft,
                        };
                        let hot = OneHot { target: row, token };
                        let cd = c.minus(Minus::Draft(&draft));
                        let ch = c.minus(Minus::OneHot(token));
                        lane(&|isa| race(isa, rng, plain, start, end), "row");
                        lane(&|isa| race(isa, rng, res, start, end), "residual");
                        lane(&|isa| race(isa, rng, hot, start, end), "one-hot");
                        lane(&|isa| race(isa, rng, c, start, end), "cut");
                        lane(&|isa| race(isa, rng, cd, start, end), "cut residual");
                        lane(&|isa| race(isa, rng, ch, start, end), "cut one-hot");
                        raced += 1;
                    }
                }
            }
        }
    }
    assert!(raced > 300, "{raced}");
}

/// What the proof of [`CutRow`] rests on, id by id: each block value is at least the written
/// row's (so the skip test rules out no id the written row's keeps open), positive wherever
/// the written row's is, and `exact` is the written row's weight where that is positive, else
/// `−∞`. Fails when `up` is the nearest binary32 reciprocal instead of one rounded upwards.
#[test]
fn unwritten_row_blocks_bound_the_written_ones() {
    let mut s = 0xB10C_0C07u64;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let mut checked = 0u64;
    for w in &cut_rows() {
        let len = w.len();
        let draft: Vec<f32> = w.iter().map(|&x| x * 0.75).collect();
        for cut in cuts_of(w, &mut next) {
            let Some(row) = CutRow::new(w, cut, Minus::Nothing) else {
                continue;
            };
            let mut p = vec![0f32; len];
            cut_write(Isa::Portable, w, cut, &mut p);
            for (un, wr) in [
                (row, None),
                (row.minus(Minus::Draft(&draft)), Some(&draft[..])),
            ] {
                for start in (0..len).step_by(16) {
                    let (mut a, mut b) = ([0f32; 16], [0f32; 16]);
                    un.block(start, len, &mut a);
                    match wr {
                        None => Row(&p).block(start, len, &mut b),
                        Some(d) => Residual {
                            target: &p,
                            draft: d,
                        }
                        .block(start, len, &mut b),
                    }
                    for i in 0..16 {
                        let (x, y) = (a[i], b[i]);
                        assert!(
                            x >= y || (x.is_nan() && y.is_nan()),
                            "id {} cut {cut:?}: {x:e} below {y:e}",
                            start + i
                        );
                        assert!(y <= 0.0 || y.is_nan() || x > 0.0);
                        if start + i < len {
                            let want = match wr {
                                None => Row(&p).exact(start + i),
                                Some(d) => Residual {
                                    target: &p,
                                    draft: d,
                                }
                                .exact(start + i),
                            };
                            let got = un.exact(start + i);
                            if want > 0.0 {
                                assert_eq!(got.to_bits(), want.to_bits());
                            } else {
                                assert_eq!(got, f64::NEG_INFINITY);
                            }
                        }
                        checked += 1;
                    }
                }
            }
        }
    }
    assert!(checked > 100_000);
}

/// Times the first reads of rows that are not in the cache (each pass over 64 rows of 128k
/// binary32 logits, 32 MiB, in turn; `cargo test --release -p specula --lib -- --ignored
/// --nocapture first_read_timing`), µs per row, in this thread's CPU time.
#[test]
#[ignore = "timing, run by hand"]
fn first_read_timing() {
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
    let (v, rows) = (128 * 1024, 64);
    let mut x = 0x1234_5678u32;
    let data: Vec<f32> = (0..v * rows)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            3.0 * ((x >> 8) as f32 / 16_777_216.0 + 1e-6).ln()
        })
        .collect();
    let bf: Vec<u16> = data.iter().map(|x| (x.to_bits() >> 16) as u16).collect();
    let t = 0.8;
    let time = |name: &str, f: &mut dyn FnMut(usize)| {
        let c0 = cpu_s();
        let mut n = 0;
        while cpu_s() - c0 < 1.0 {
            for r in 0..rows {
                f(r);
            }
            n += rows;
        }
        println!("{name:<36} {:8.1} us", (cpu_s() - c0) / n as f64 * 1e6);
    };
    for isa in Isa::available() {
        let row = |r: usize| &data[r * v..(r + 1) * v];
        let brow = |r: usize| Bf16Row(&bf[r * v..(r + 1) * v]);
        time(&format!("{isa:?} read (sum)"), &mut |r| {
            std::hint::black_box(row(r).iter().fold(0f32, |a, &b| a + b));
        });
        time(&format!("{isa:?} max"), &mut |r| {
            std::hint::black_box(softmax_max(isa, row(r), t));
        });
        time(&format!("{isa:?} max, then bound"), &mut |r| {
            let m = softmax_max(isa, row(r), t);
            std::hint::black_box(sum_bound(isa, row(r), t, Some(m)));
        });
        time(&format!("{isa:?} bound (max in chunks)"), &mut |r| {
            std::hint::black_box(sum_bound(isa, row(r), t, None));
        });
        time(&format!("{isa:?} bf16 span"), &mut |r| {
            std::hint::black_box(softmax_max_of(isa, brow(r), t));
        });
        time(&format!("{isa:?} bf16 span, then bound"), &mut |r| {
            let m = softmax_max_of(isa, brow(r), t);
            std::hint::black_box(sum_bound(isa, brow(r), t, Some(m.m)));
        });
        time(&format!("{isa:?} bf16 bound (max in chunks)"), &mut |r| {
            std::hint::black_box(sum_bound(isa, brow(r), t, None));
        });
    }
}

/// Times the race over one 128k row of softmax weights raced unwritten ([`CutRow`]: the
/// stopping row of a logits request), plain and as a residual, over the written row, and over
/// a row with 50 candidates (a top-k cut's) (`cargo test --release -p specula --lib -- --ignored --nocapture race_timing`), µs per race,
/// in this thread's CPU time.
#[test]
#[ignore = "timing, run by hand"]
fn race_timing() {
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
    fn time(name: &str, mut f: impl FnMut(u64)) {
        f(0);
        let c0 = cpu_s();
        let mut n = 0;
        while cpu_s() - c0 < 0.5 || n < 3 {
            n += 1;
            f(n);
        }
        println!("{name:<28} {:8.1} us", (cpu_s() - c0) / n as f64 * 1e6);
    }
    let v = 128 * 1024;
    let mut x = 0x1234_5678u32;
    let row: Vec<f32> = (0..v)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            3.0 * ((x >> 8) as f32 / 16_777_216.0 + 1e-6).ln()
        })
        .collect();
    let t = 0.8;
    let isa = Isa::detect();
    let m = softmax_max(isa, &row[..], t);
    let mut w = vec![0f32; v];
    let cut = Cut {
        threshold: 0,
        fixed: softmax_pass(isa, &row[..], t, m, Some(&mut w)),
    };
    let mut p = vec![0f32; v];
    cut_write(isa, &w, cut, &mut p);
    let draft: Vec<f32> = p.iter().map(|&x| x * 0.9).collect();
    let unwritten = CutRow::new(&w, cut, Minus::Nothing).unwrap();
    for isa in Isa::available() {
        let rng = |n: u64| RaceRng {
            seed: 0x5EED ^ n,
            offset: n,
            position: 2,
        };
        time(&format!("{isa:?} race unwritten"), |n| {
            std::hint::black_box(race(isa, rng(n), unwritten, 0, v));
        });
        time(&format!("{isa:?} residual unwritten"), |n| {
            let r = unwritten.minus(Minus::Draft(&draft));
            std::hint::black_box(race(isa, rng(n), r, 0, v));
        });
        time(&format!("{isa:?} race written"), |n| {
            std::hint::black_box(race(isa, rng(n), Row(&p), 0, v));
        });
        // A top-k-like row: 50 candidates spread over the row, the rest 0.
        let sparse: Vec<f32> = (0..v)
            .map(|i| if i % (v / 50) == 7 { 0.02 } else { 0.0 })
            .collect();
        time(&format!("{isa:?} race 50 of V"), |n| {
            std::hint::black_box(race(isa, rng(n), Row(&sparse), 0, v));
        });
    }
}
