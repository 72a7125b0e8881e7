//! The conformance suite on the core reference verifier, the value-stability pins, and the
//! fuzzed entry point.

use proptest::prelude::*;
use specula_core::verify::{Check, Reference};
use specula_tests::conformance::{self, BatchData, Gen, K, RandomSpec};

#[test]
fn exact_cases() {
    conformance::exact_cases(Reference::<K>::new);
}

#[test]
fn error_cases() {
    conformance::error_cases(Reference::<K>::new);
}

#[test]
fn one_hot_targets() {
    conformance::one_hot_targets(Reference::<K>::new, 0x0AE_0001, 300);
}

#[test]
fn batch_invariance() {
    conformance::batch_invariance(Reference::<K>::new, 0x1A7_0002);
}

/// The reference against itself through the [`Verifier`](specula_core::verify::Verifier) seam:
/// checks the harness (and that the reference is deterministic run to run).
#[test]
fn matches_reference_on_random_batches() {
    conformance::matches_reference_on_random_batches(Reference::<K>::new, 0x5EED_0003, 2_000);
}

/// A fixed batch: dense, peaked and one-hot rows, with draft probabilities.
fn pinned_batch() -> BatchData {
    let mut g = Gen(0x0574_1B1E);
    loop {
        let (d, clean) = conformance::random_batch(
            &mut g,
            RandomSpec {
                max_requests: 8,
                max_vocab: 50,
                garbage: false,
            },
        );
        if clean && d.requests() >= 6 && d.draft_probs.is_some() && d.k_max >= 4 {
            return d;
        }
    }
}

/// Pins seeded outputs. The expected values were computed once by this reference and written
/// here: they pin the behaviour every backend (CUDA, ROCm, host kernel) must reproduce. If this
/// fails, the bits changed; that is a breaking change of the verification rules, not a test to
/// update (unless `core/DETERMINISM.md` was deliberately changed, and the kernels with it).
#[test]
fn value_stability() {
    let d = pinned_batch();
    let mut got = Vec::new();
    for m in conformance::METHODS {
        let (out, _) = conformance::reference(m, Check::STRICT, &d).unwrap();
        got.push((out.accepted, out.tokens));
    }
    let want: Vec<(Vec<u32>, Vec<u32>)> = PINNED
        .iter()
        .map(|(a, t)| (a.to_vec(), t.to_vec()))
        .collect();
    assert_eq!(got, want, "{:?}", (d.vocab, d.k_max, d.requests()));
    // The raw stream too: Philox words and derived uniforms at fixed coordinates.
    use specula_core::verify::exponential::{draw, exponential};
    use specula_core::verify::philox::{accept_draw, race_words, race_words_lo};
    assert_eq!(race_words(7, 11, 2, 5), PINNED_WORDS);
    assert_eq!(race_words_lo(7, 11, 2, 5), PINNED_WORDS_LO);
    assert_eq!(accept_draw(u64::MAX, 1 << 40, 3), PINNED_ACCEPT);
    let e = exponential(draw(PINNED_WORDS[1], PINNED_WORDS_LO[1]));
    assert_eq!(e.to_bits(), PINNED_EXPONENTIAL, "{e}");
}

const S: u32 = specula_core::verify::SENTINEL;

/// Pinned outputs (accepted, tokens) of [`pinned_batch`] (8 requests, V = 42, k_max = 8) for
/// rejection sampling, greedy and typical acceptance, in that order. The input comes from the
/// suite's seeded generator: only a change of that generator justifies re-deriving them.
#[rustfmt::skip]
const PINNED: [(&[u32], &[u32]); 3] = [
    // Rejection
    (&[1, 5, 0, 0, 0, 0, 2, 0],
     &[17, 40, S, S, S, S, S, S, S, 33, 24, 41, 4, 5, 37, S, S, S, 2, S, S, S, S, S, S, S, S, 14, S, S, S, S, S, S, S, S, 5, S, S, S, S, S, S, S, S, 6, S, S, S, S, S, S, S, S, 5, 22, 10, S, S, S, S, S, S, 15, S, S, S, S, S, S, S, S]),
    // Greedy
    (&[0, 1, 0, 0, 0, 0, 2, 0],
     &[39, S, S, S, S, S, S, S, S, 33, 9, S, S, S, S, S, S, S, 2, S, S, S, S, S, S, S, S, 14, S, S, S, S, S, S, S, S, 12, S, S, S, S, S, S, S, S, 5, S, S, S, S, S, S, S, S, 5, 22, 28, S, S, S, S, S, S, 8, S, S, S, S, S, S, S, S]),
    // Typical
    (&[4, 5, 0, 0, 0, 0, 2, 0],
     &[17, 33, 38, 23, 4, S, S, S, S, 33, 24, 41, 4, 5, 37, S, S, S, 2, S, S, S, S, S, S, S, S, 14, S, S, S, S, S, S, S, S, 11, S, S, S, S, S, S, S, S, 6, S, S, S, S, S, S, S, S, 5, 22, 10, S, S, S, S, S, S, 15, S, S, S, S, S, S, S, S]),
];
/// Philox4x32-10 words at seed 7, offset 11, position 2, race index 5.
const PINNED_WORDS: [u32; 4] = [0x7be1_714c, 0xe6d0_6a4c, 0x06bb_ca6f, 0xce82_d299];
/// Stream-2 words at the same coordinates.
const PINNED_WORDS_LO: [u32; 4] = [0x4e2f_279f, 0xebf1_efce, 0xab8c_3b15, 0x6eee_6207];
/// The 64-bit acceptance draw at seed u64::MAX, offset 2⁴⁰, position 3.
const PINNED_ACCEPT: u64 = 0x566f_e672_80e8_3f5d;
/// The race variate E of word 1 of the pinned groups.
const PINNED_EXPONENTIAL: u64 = 0x4002_8d18_4cc2_98f6;

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]
    /// Arbitrary shapes, lengths, ids and probability bits never panic, and either verify to
    /// well-formed outputs or fail with nothing written or counted.
    #[test]
    fn fuzz_entry_point(input in conformance::arb_fuzz_input()) {
        let mut v = Reference::<K>::new();
        conformance::fuzz_one(&mut v, &input);
    }
}

#[test]
fn empty_drafts() {
    conformance::empty_drafts(Reference::<K>::new);
}

#[test]
fn mixed_drafters() {
    conformance::mixed_drafters(Reference::<K>::new, 0x31C_0009, 500);
}

#[test]
fn ragged_layout() {
    conformance::ragged_layout(Reference::<K>::new, 0x4A6_0005, 500);
}

/// Ragged and padded layouts give the same bits at a real vocabulary size (32 000).
#[test]
fn ragged_matches_padded_at_32k() {
    conformance::ragged_matches_padded_at(&mut Reference::<K>::new(), 0x32_000, 32_000, 2);
}

#[test]
fn target_logits() {
    conformance::target_logits(Reference::<K>::new, 0x106_0006, 300);
}
