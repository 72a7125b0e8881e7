//! Known answers of the portable numerics (`verify::fmath`, `verify::philox`,
//! `verify::exponential`): the GPU kernels must give the same bits. A change here is a change of
//! behaviour, not a test to update.

mod fmath {
    use crate::support::Fnv;
    use specula_core::verify::fmath::{entropy, entropy_from_fixed, entropy_term, exp_p, ln_p};

    fn ln_bits(x_bits: u32) -> u32 {
        ln_p(f32::from_bits(x_bits)).to_bits()
    }

    #[test]
    fn ln_at_the_mantissa_fold() {
        // The mantissa exactly √2 (rounded) is not folded (`m > SQRT_2`); one ulp above is.
        assert_eq!(ln_bits(0x3FB5_04F3), 0x3EB1_7218, "ln_p(√2)");
        assert_eq!(ln_bits(0x3FB5_04F2), 0x3EB1_7215);
        assert_eq!(ln_bits(0x3FB5_04F4), 0x3EB1_7219);
        assert_eq!(ln_bits(0x3F35_04F3), 0xBEB1_7218, "ln_p(√2 / 2)");
        // The largest |s| of the series, where the C7 term's sign shows in the last bit.
        assert_eq!(ln_p(1.414_062_5).to_bits(), 0x3EB1_6418);
        assert_eq!(ln_bits(0x3FC0_0000), 0x3ECF_9920, "ln_p(1.5)");
        assert_eq!(ln_bits(0x3F40_0000), 0xBE93_4B10, "ln_p(0.75)");
        assert_eq!(ln_bits(0x4000_0000), 0x3F31_7218, "ln_p(2)");
        // The ends of the normal range.
        assert_eq!(ln_bits(0x0080_0000), 0xC2AE_AC50, "ln_p(MIN_POSITIVE)");
        assert_eq!(ln_bits(0x7F7F_FFFF), 0x42B1_7218, "ln_p(MAX)");
        assert_eq!(ln_bits(0x0DA2_4260), 0xC28A_27B5, "ln_p(1e-30)");
        assert_eq!(ln_bits(0x7217_7617), 0x428C_5A32, "ln_p(3e30)");
    }

    #[test]
    fn exp_at_its_boundaries() {
        let exp_bits = |x: f32| exp_p(x).to_bits();
        // x = 88 is the last input that is not +∞: e⁸⁸ ≈ 1.65e38 is finite.
        assert_eq!(exp_bits(88.0), 0x7EF8_82B7);
        assert_eq!(exp_bits(87.99), 0x7EF6_0990);
        assert_eq!(
            exp_bits(f32::from_bits(0x42B0_0001)),
            0x7F80_0000,
            "just above 88"
        );
        // Just above −87: n = −126, the smallest normal scale, not flushed to 0.
        assert_eq!(exp_bits(f32::from_bits(0xC2AD_FFFF)), 0x00B3_36E0);
        assert_eq!(exp_bits(-86.99), 0x00B5_03B6);
        assert_eq!(exp_bits(-86.5), 0x0113_BC74);
        assert_eq!(exp_bits(-87.0), 0);
        // The largest reduced arguments |r| ≈ ln2/2, on both sides of the rounding of n.
        assert_eq!(exp_bits(0.3466), 0x3FB5_062E);
        assert_eq!(exp_bits(-0.3466), 0x3F35_03B9);
        assert_eq!(exp_bits(f32::from_bits(0x3EB1_7218)), 0x3FB5_04F5);
        assert_eq!(exp_bits(f32::from_bits(0xBEB1_7218)), 0x3F35_04F2);
        assert_eq!(exp_bits(1.039_720_7), 0x4035_04F1);
        assert_eq!(exp_bits(0.5), 0x3FD3_094C);
        assert_eq!(exp_bits(-0.5), 0x3F1B_4598);
        assert_eq!(exp_bits(10.0), 0x46AC_14EE);
        assert_eq!(exp_bits(-10.0), 0x383E_6BCE);
        assert_eq!(exp_bits(50.0), 0x638C_881F);
        assert_eq!(exp_bits(0.0), 0x3F80_0000);
        assert_eq!(exp_bits(-0.0), 0x3F80_0000);
    }

    /// Every result bit of 4096 + 2048 `ln_p` and 4096 `exp_p` inputs spread over their ranges.
    #[test]
    #[cfg_attr(
        miri,
        ignore = "pure arithmetic, minutes under Miri; the boundary tests run"
    )]
    fn ln_and_exp_sweeps() {
        let mut h = Fnv::new();
        let (lo, hi) = (0x0080_0000u32, 0x7F7F_FFFFu32);
        for i in 0..4096u32 {
            h.add(u64::from(ln_bits(lo + (hi - lo) / 4096 * i)));
        }
        // Densely around 1, where the series does all the work.
        let (lo, hi) = (0x3F35_04F3u32, 0x3FB5_04F3u32);
        for i in 0..2048u32 {
            h.add(u64::from(ln_bits(lo + (hi - lo) / 2048 * i)));
        }
        assert_eq!(h.0, 7_507_939_885_867_699_002, "ln_p sweep");
        let mut h = Fnv::new();
        for i in 0..4096u32 {
            let x = -87.5f32 + i as f32 * (176.0 / 4096.0);
            h.add(u64::from(exp_p(x).to_bits()));
        }
        assert_eq!(h.0, 13_565_997_445_163_094_477, "exp_p sweep");
    }

    #[test]
    fn entropy_known_answers() {
        assert_eq!(entropy_term(0.5), 381_061_693_440);
        assert_eq!(entropy_term(1.0), 0);
        assert_eq!(entropy_term(f32::MIN_POSITIVE), 0);
        assert_eq!(entropy_term(f32::from_bits(0x007F_FFFF)), 0, "subnormal");
        assert_eq!(entropy_term(-0.5), 0);
        assert_eq!(entropy_from_fixed(1 << 40).to_bits(), 1.0f32.to_bits());
        assert_eq!(
            entropy_from_fixed(-(3 << 39)).to_bits(),
            (-1.5f32).to_bits()
        );
        let row = [0.5f32, 0.25, 0.125, 0.125];
        assert_eq!(entropy(&row).to_bits(), 0x3F9B_43D5);
    }
}

mod philox {
    use crate::support::Fnv;
    use specula_core::verify::philox::{
        STREAM_ACCEPT, STREAM_RACE, STREAM_RACE_LO, accept_draw, counter, key, philox4x32_10,
        race_words, race_words_lo, uniform_co,
    };

    /// The same coordinates `specula-tests`' value-stability test pins for every backend.
    #[test]
    fn stream_words_at_fixed_coordinates() {
        assert_eq!(
            race_words(7, 11, 2, 5),
            [0x7be1_714c, 0xe6d0_6a4c, 0x06bb_ca6f, 0xce82_d299]
        );
        assert_eq!(
            race_words_lo(7, 11, 2, 5),
            [0x4e2f_279f, 0xebf1_efce, 0xab8c_3b15, 0x6eee_6207]
        );
        assert_eq!(accept_draw(u64::MAX, 1 << 40, 3), 0x566f_e672_80e8_3f5d);
        assert_eq!(
            (STREAM_ACCEPT, STREAM_RACE, STREAM_RACE_LO),
            (0, 1, 2),
            "the stream numbers are part of the counter layout"
        );
    }

    #[test]
    fn counter_and_key_use_every_bit() {
        assert_eq!(key(u64::MAX), [u32::MAX, u32::MAX]);
        assert_eq!(key(1 << 32), [0, 1]);
        assert_eq!(
            counter(u32::MAX, (1 << 30) - 1, 3, u64::MAX),
            [u32::MAX, u32::MAX, u32::MAX, u32::MAX]
        );
        assert_eq!(counter(0, 1, 0, 1 << 32), [0, 4, 0, 1]);
        assert_eq!(uniform_co(0x0000_0100), f32::from_bits(0x3380_0000), "2⁻²⁴");
        assert_eq!(uniform_co(0x1234_5678), 0x12_3456 as f32 / 16_777_216.0);
    }

    /// 256 blocks with every counter and key word varying, pinned by digest.
    #[test]
    #[cfg_attr(
        miri,
        ignore = "pure arithmetic, minutes under Miri; the boundary tests run"
    )]
    fn philox_sweep() {
        let mut h = Fnv::new();
        let mut x = 0x0123_4567u32;
        for _ in 0..256 {
            let mut w = [0u32; 6];
            for v in &mut w {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                *v = x;
            }
            let out = philox4x32_10([w[0], w[1], w[2], w[3]], [w[4], w[5]]);
            for o in out {
                h.add(u64::from(o));
            }
        }
        assert_eq!(h.0, 8_088_776_234_842_338_135, "philox sweep");
    }
}

mod exponential {
    use crate::support::Fnv;
    use specula_core::verify::exponential::{
        accepts, draw, exponential, exponential_floor, uniform53,
    };

    fn e(x: u64) -> u64 {
        exponential(x).to_bits()
    }

    #[test]
    fn at_the_branch_and_the_fold() {
        // v = ¼ exactly is the first draw of the logarithm branch.
        assert_eq!(e((1 << 62) - 1), 0x3FD2_6962_1134_DB92);
        assert_eq!(e(1 << 62), 0x3FD2_6962_1134_DB92);
        // u = 1 − v with its mantissa exactly √2 (rounded) is not folded; one cell off is.
        let n = (core::f64::consts::SQRT_2 * 9_223_372_036_854_775_808.0) as u64;
        assert_eq!(n, 0xB504_F333_F9DE_6800);
        assert_eq!(e(!n), 0x3FD6_2E42_FEFA_39ED);
        assert_eq!(e(!n - 4096), 0x3FD6_2E42_FEFA_39E8);
        assert_eq!(e(!n + 4096), 0x3FD6_2E42_FEFA_39F4);
        // The ends, and halfway.
        assert_eq!(e(0), 0x3BE0_0000_0000_0000);
        assert_eq!(e(1), 0x3BF8_0000_0000_0000, "1.5 · 2⁻⁶⁴");
        assert_eq!(e(u64::MAX), 0x4046_86FC_0AF6_22D7, "45.05");
        assert_eq!(e(1 << 63), 0x3FE6_2E42_FEFA_39EF, "ln 2");
        assert_eq!(e(0xC000_0000_0000_0000), 0x3FF6_2E42_FEFA_39EF, "ln 4");
    }

    /// 4096 draws over the whole range plus 64 near each end and the branch, pinned by digest.
    #[test]
    #[cfg_attr(
        miri,
        ignore = "pure arithmetic, minutes under Miri; the boundary tests run"
    )]
    fn exponential_sweep() {
        let mut h = Fnv::new();
        for i in 0..4096u64 {
            h.add(e(i.wrapping_mul(0x9E37_79B9_7F4A_7C15)));
        }
        for i in 0..64u64 {
            h.add(e(1 << i));
            h.add(e(u64::MAX - (1 << i)));
            h.add(e((1 << 62) + i * 0x1_0000_0001));
            h.add(e((1 << 62) - 1 - i * 0x1_0000_0001));
        }
        assert_eq!(h.0, 2_459_743_973_946_944_459, "exponential sweep");
    }

    #[test]
    fn draws_floors_and_uniforms() {
        assert_eq!(draw(0x1234_5678, 0x9ABC_DEF0), 0x1234_5678_9ABC_DEF0);
        assert_eq!(draw(u32::MAX, 0), 0xFFFF_FFFF_0000_0000);
        assert_eq!(exponential_floor(0x8000_0000), 0.5);
        assert_eq!(exponential_floor(0x0000_01FF), f32::from_bits(0x3380_0000));
        assert_eq!(exponential_floor(u32::MAX), 1.0 - f32::EPSILON / 2.0);
        assert_eq!(
            uniform53(0x0000_0000_0000_0800),
            1.0 / 9_007_199_254_740_992.0
        );
        assert_eq!(
            uniform53(0x0000_0000_0000_1000),
            3.0 / 9_007_199_254_740_992.0
        );
        // U·pd < pt at the boundary: U = ½ + 2⁻⁵³.
        let half = 1u64 << 63;
        assert!(!accepts(half, 0.5, 1.0));
        assert!(accepts(half, 0.500_001, 1.0));
        assert!(accepts(half, 0.5, 0.999_99));
        assert!(!accepts(half, 0.25, 0.5));
        assert!(!accepts(0, 0.0, 1.0), "pt = 0 never accepts");
    }
}
