//! Philox4x32-10, the counter-based random number generator of the verification rules
//! (`core/DETERMINISM.md`), and the draws of its three streams.
//!
//! A counter-based generator has no state to carry between calls: the random word for a given
//! (seed, offset, position, vocabulary index) is a pure function of those numbers. That is what
//! makes a request's result independent of its batch slot, the thread that handles it and the
//! order in which a reduction visits the vocabulary.

/// First round multiplier.
const M0: u32 = 0xD251_1F53;
/// Second round multiplier.
const M1: u32 = 0xCD9E_8D57;
/// Weyl increment of key word 0.
const W0: u32 = 0x9E37_79B9;
/// Weyl increment of key word 1.
const W1: u32 = 0xBB67_AE85;

/// Stream 0: the acceptance draw of a draft position (index 0, output words 0 and 1).
pub const STREAM_ACCEPT: u32 = 0;
/// Stream 1: the high words of the race draws over the vocabulary (index `v >> 2`, output word
/// `v & 3`).
pub const STREAM_RACE: u32 = 1;
/// Stream 2: the low words of the race draws, at the same index and word as stream 1.
pub const STREAM_RACE_LO: u32 = 2;

#[inline(always)]
fn mulhilo(a: u32, b: u32) -> (u32, u32) {
    let p = u64::from(a) * u64::from(b);
    ((p >> 32) as u32, p as u32)
}

/// Philox4x32 with 10 rounds on counter `ctr` and key `key` (Salmon et al. 2011, as in
/// Random123 and curand).
#[inline(always)]
#[must_use]
pub fn philox4x32_10(ctr: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let [mut c0, mut c1, mut c2, mut c3] = ctr;
    let [mut k0, mut k1] = key;
    let mut round = 0;
    loop {
        let (hi0, lo0) = mulhilo(M0, c0);
        let (hi1, lo1) = mulhilo(M1, c2);
        let n0 = hi1 ^ c1 ^ k0;
        let n2 = hi0 ^ c3 ^ k1;
        c0 = n0;
        c1 = lo1;
        c2 = n2;
        c3 = lo0;
        round += 1;
        if round == 10 {
            break;
        }
        // The key is bumped between rounds only, never after the tenth.
        k0 = k0.wrapping_add(W0);
        k1 = k1.wrapping_add(W1);
    }
    [c0, c1, c2, c3]
}

/// The key of a request's stream: `[seed lo 32 bits, seed hi 32 bits]`.
#[inline(always)]
#[must_use]
pub fn key(seed: u64) -> [u32; 2] {
    [seed as u32, (seed >> 32) as u32]
}

/// The counter `[index, (position << 2) | stream, offset lo, offset hi]`.
///
/// `position` must be below 2³⁰ (the verifier checks `k_max` for that before any call).
#[inline(always)]
#[must_use]
pub fn counter(index: u32, position: u32, stream: u32, offset: u64) -> [u32; 4] {
    [
        index,
        (position << 2) | stream,
        offset as u32,
        (offset >> 32) as u32,
    ]
}

/// Uniform in `[0, 1)`: `(x >> 8) · 2⁻²⁴`, exact.
#[inline(always)]
#[must_use]
pub fn uniform_co(x: u32) -> f32 {
    (x >> 8) as f32 * f32::from_bits(0x3380_0000) // 2⁻²⁴
}

/// The 64-bit acceptance draw (stream 0, index 0: word 0 high, word 1 low) of draft position
/// `position` of a request; [`accepts`](crate::verify::exponential::accepts) turns it into the test.
#[inline]
#[must_use]
pub fn accept_draw(seed: u64, offset: u64, position: u32) -> u64 {
    let w = philox4x32_10(counter(0, position, STREAM_ACCEPT, offset), key(seed));
    (u64::from(w[0]) << 32) | u64::from(w[1])
}

/// The four race high words (stream 1) for vocabulary ids `4·index .. 4·index + 4` at
/// `position`.
#[inline(always)]
#[must_use]
pub fn race_words(seed: u64, offset: u64, position: u32, index: u32) -> [u32; 4] {
    philox4x32_10(counter(index, position, STREAM_RACE, offset), key(seed))
}

/// The four race low words (stream 2) for the same ids as [`race_words`].
#[inline(always)]
#[must_use]
pub fn race_words_lo(seed: u64, offset: u64, position: u32, index: u32) -> [u32; 4] {
    philox4x32_10(counter(index, position, STREAM_RACE_LO, offset), key(seed))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random123 `kat_vectors`, philox4x32 with 10 rounds.
    #[test]
    fn random123_known_answers() {
        assert_eq!(
            philox4x32_10([0; 4], [0; 2]),
            [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]
        );
        assert_eq!(
            philox4x32_10([u32::MAX; 4], [u32::MAX; 2]),
            [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]
        );
        assert_eq!(
            philox4x32_10(
                [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
                [0xa409_3822, 0x299f_31d0]
            ),
            [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1]
        );
    }

    #[test]
    fn counter_and_key_layout() {
        assert_eq!(key(0x0123_4567_89ab_cdef), [0x89ab_cdef, 0x0123_4567]);
        assert_eq!(
            counter(7, 3, STREAM_RACE, 0x1111_2222_3333_4444),
            [7, 13, 0x3333_4444, 0x1111_2222]
        );
        assert_eq!(counter(7, 3, STREAM_RACE_LO, 0)[1], 14);
    }

    #[test]
    fn draws_pair_the_words_high_then_low() {
        let w = philox4x32_10(counter(0, 2, STREAM_ACCEPT, 9), key(5));
        assert_eq!(
            accept_draw(5, 9, 2),
            (u64::from(w[0]) << 32) | u64::from(w[1])
        );
        let lo = philox4x32_10(counter(3, 2, STREAM_RACE_LO, 9), key(5));
        assert_eq!(race_words_lo(5, 9, 2, 3), lo);
        assert_ne!(race_words_lo(5, 9, 2, 3), race_words(5, 9, 2, 3));
    }

    #[test]
    fn uniforms_hit_their_ends_exactly() {
        assert_eq!(uniform_co(0), 0.0);
        assert_eq!(uniform_co(0xFF), 0.0);
        assert_eq!(uniform_co(u32::MAX), 1.0 - f32::EPSILON / 2.0);
        assert_eq!(uniform_co(0x8000_0000), 0.5);
    }
}
