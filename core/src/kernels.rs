//! The single-source GPU kernel text (`core/kernels/specula_verify.cu`) and its launch contract.
//!
//! One text serves CUDA (NVRTC, in `specula-cuda`), HIP (hipRTC, in `specula-rocm`) and the
//! host-executed tests (g++ over a shim, in `specula-tests`). It implements `core/DETERMINISM.md`
//! exactly, so its outputs are bit-identical to [`crate::verify::verify_batch`].
//!
//! # Launch contract
//! * Entry point [`VERIFY_ENTRY`] (`extern "C"`), parameters in this order:
//!   `shape: *const u32` ([`SHAPE_WORDS`] words, see [`shape_words`]), `k: *const u32`,
//!   `draft_ids: *const u32`, `draft_probs: *const f32` (may be null when the shape says
//!   "one-hot drafter"), `target_probs: *const f32`, `seed: *const u64`, `offset: *const u64`,
//!   `eps: *const f32`, `delta: *const f32` (read only by typical acceptance; may be null
//!   otherwise), `accepted: *mut u32`, `tokens: *mut u32`, `stats: *mut u64`.
//!   Every buffer is in device memory and laid out as `DETERMINISM.md` says.
//! * Grid `(capacity, 1, 1)` with `capacity ≥ shape[SHAPE_BATCH]`: one block per request; blocks
//!   past the batch return at once. Because the batch size, `k`, seeds and offsets are all read
//!   from device memory, one launch configuration (and one captured CUDA graph) serves every step.
//!   A batch above the capacity makes the whole launch do nothing and raise [`ERR_SHAPE`] (never
//!   a silent cut to the first `capacity` requests).
//! * Block `(n, 1, 1)` with `n ≤ BLOCK_THREADS` (the kernel's compile-time `SPECULA_BLOCK_THREADS`,
//!   256 unless defined otherwise) and `n` a multiple of the warp size (32 on NVIDIA, 64 or 32 on
//!   AMD). No dynamic shared memory.
//! * `stats` holds [`stats_words`]`(K)` words: the fields of [`Counters<K>`] in declaration order
//!   (`drafts, draft_tokens, accepted_tokens, emitted_tokens, accepted_per_position[K],
//!   drafted_per_position[K]`), then one error-flag word. The kernel adds to the counters with
//!   64-bit atomics (`Counters::record(k, accepted)` per request, in the same launch) and ORs
//!   [`ERR_SHAPE`], [`ERR_DRAFT_LEN`] or [`ERR_TOKEN`] into the flag word. A request with a bad `k`
//!   or a draft id `≥ V` is skipped and not counted: its `accepted` and every token slot are set
//!   to the sentinel `u32::MAX`. Nothing is ever read or written out of bounds.
//! * Compile with FMA contraction off (NVRTC `--fmad=false`, hipcc `-ffp-contract=off`) and no
//!   fast math; the arithmetic is IEEE binary32 and binary64 in the order the document writes it.
//! * Readback: copy `stats` device-to-device on the compute stream (one consistent point in the
//!   stream) to a staging buffer, then to the host on a copy stream.
//!
//! # Speed (issue 17)
//! `scripts/kernel-report.py` reads the compiled kernel (sm_80, sm_90) and reports, per row pass,
//! instructions per element on the hot path, registers, spills and bytes in flight per SM, and a
//! latency/roofline model's predicted µs (README, "Kernel speed"). What the text does for it:
//! rows are padded past their end with a value that never counts (no per-element bounds checks);
//! each thread loads `SP_UNROLL_*` groups of 4 ids before computing on any of them (64 B
//! per thread for argmax and entropy, 32 B for the race, 64 B for the residual race); the CUDA
//! build asks for 4 blocks of 256 per SM (`__launch_bounds__(256, 4)`: 64 registers, which ptxas
//! meets without spilling), so ≥ 32 KB are in flight per SM; Philox's key schedule is hoisted out
//! of the race loop; the race computes the stream-2 word, `expo` and the division only for ids
//! the f32 skip test cannot rule out.
//!
//! ## Not done yet: rows split across blocks (design)
//! One block per request leaves most SMs idle below batch ~132 and makes every row pass one
//! block's latency chain (the model predicts ~130 µs for greedy at batch 1, V = 128k, k = 4,
//! against ~10 µs for the same bytes spread over the GPU). The numerics already allow a split
//! (every reduction is order-free); the plan, for a later change:
//! * **Grid** `(capacity · S, 1, 1)`, block `(b, s) = (x / S, x % S)` with `S` a shape word (the
//!   backends launch `capacity · S` blocks, `S = clamp(⌈4·SMs / capacity⌉, 1, ⌈V / 8192⌉)`,
//!   fixed per captured graph like the capacity). Slice `s` covers groups `s, s + S, …` of every
//!   row (interleaved, so slices stay balanced at any V).
//! * **Scratch**: a new device buffer (kernel parameter 13, owned by the verifier and sized for
//!   the capacity at staging time, so the step path still makes no allocating call) holding, per
//!   request and row: the argmax as one packed (f32 key, `~id`) u64 combined with a 64-bit
//!   `atomicMax`; the entropy as a fixed-point sum combined with a 64-bit `atomicAdd` (wrapping
//!   i64: exactly the order-free sum); the race as `S` slots of (binary64 key bits, id), one per
//!   slice, since a binary64 key and an id do not fit one 64-bit atomic (the finishing block
//!   reduces the `S` slots: largest key, then lowest id); and one ticket counter per request.
//! * **Passes in parallel**: every block evaluates all `k` acceptance tests of its request at
//!   once (threads `j < k`; each a Philox block and two loads), so the rejection position `j*`
//!   is known everywhere without a chain of `k` latencies. Greedy: argmax of rows `0..=k` over
//!   the slice. Rejection: the residual race of row `j*` (or the bonus race of row `k`), and in
//!   the same sweep the plain race of row `j*` (the fallback: same draws, same loads). Typical
//!   acceptance needs the entropies before it knows `j*`: phase one sums entropies of rows
//!   `0..k` over the slices, phase two (a second kernel in the same captured graph, or the
//!   race of every row computed speculatively in phase one) races row `j*`.
//! * **Finish**: after its atomics a block does `__threadfence()` and takes a ticket
//!   (`atomicAdd`); the block that draws `S − 1` reads the combined words, decides acceptance in
//!   order, writes `accepted`/`tokens`, records the counters (fused, as now) and zeroes the
//!   request's scratch words and ticket for the next launch (graph replays need no memset).
//! * **Host shim**: runs blocks one after another, so the last ticket is always the last block
//!   (no block ever waits on another: no deadlock); the conformance suite runs the split path in
//!   both forms with `S > 1` forced by the shape word.

use crate::counters::Counters;
use crate::verify::{Batch, Method};

/// The kernel source text (CUDA/HIP common subset; no headers needed).
pub const SOURCE: &str = include_str!("../kernels/specula_verify.cu");

/// Name of the verification entry point (`extern "C"`, so not mangled).
pub const VERIFY_ENTRY: &str = "specula_verify";

/// Default threads per block the text is compiled for (`SPECULA_BLOCK_THREADS`).
pub const BLOCK_THREADS: u32 = 256;

/// Number of `u32` shape words.
pub const SHAPE_WORDS: usize = 8;
/// Shape word: batch size `B` (blocks at or past it return at once).
pub const SHAPE_BATCH: usize = 0;
/// Shape word: `k_max`.
pub const SHAPE_K_MAX: usize = 1;
/// Shape word: vocabulary size `V`.
pub const SHAPE_VOCAB: usize = 2;
/// Shape word: draft-probability row stride (ignored without [`FLAG_DRAFT_PROBS`]).
pub const SHAPE_DRAFT_STRIDE: usize = 3;
/// Shape word: target-probability row stride.
pub const SHAPE_TARGET_STRIDE: usize = 4;
/// Shape word: method code ([`method_code`]).
pub const SHAPE_METHOD: usize = 5;
/// Shape word: `K` of the `Counters<K>` layout in `stats`.
pub const SHAPE_COUNTERS_K: usize = 6;
/// Shape word: flags ([`FLAG_DRAFT_PROBS`]).
pub const SHAPE_FLAGS: usize = 7;
/// Flag: `draft_probs` is present (otherwise the drafter is one-hot).
pub const FLAG_DRAFT_PROBS: u32 = 1;

/// Error flag: the shape words were invalid, or the batch exceeded the launch's grid; the launch
/// did nothing.
pub const ERR_SHAPE: u64 = 1;
/// Error flag: some request had `k = 0` or `k > k_max`; it was skipped and not counted.
pub const ERR_DRAFT_LEN: u64 = 2;
/// Error flag: some request had a draft id `≥ V`; it was skipped and not counted.
pub const ERR_TOKEN: u64 = 4;

/// The kernel's method code.
#[must_use]
pub const fn method_code(method: Method) -> u32 {
    match method {
        Method::Rejection => 0,
        Method::Greedy => 1,
        Method::Typical => 2,
    }
}

/// The shape words of one launch. `draft_stride` is `None` for a one-hot drafter.
#[must_use]
pub const fn shape_words(
    batch: u32,
    k_max: u32,
    vocab: u32,
    draft_stride: Option<u32>,
    target_stride: u32,
    method: u32,
    counters_k: u32,
) -> [u32; SHAPE_WORDS] {
    let (dstride, flags) = match draft_stride {
        Some(s) => (s, FLAG_DRAFT_PROBS),
        None => (0, 0),
    };
    [
        batch,
        k_max,
        vocab,
        dstride,
        target_stride,
        method,
        counters_k,
        flags,
    ]
}

/// A batch dimension does not fit the kernels' 32-bit shape words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct ShapeTooLarge;

/// The shape words of launching `method` over `batch` with `Counters<K>`: what every backend
/// (CUDA, ROCm, the host-executed kernel) passes to the kernel for a host-slice batch.
pub fn batch_shape<const K: usize>(
    method: Method,
    batch: &Batch<'_>,
) -> Result<[u32; SHAPE_WORDS], ShapeTooLarge> {
    let w = |x: usize| u32::try_from(x).map_err(|_| ShapeTooLarge);
    let draft_stride = match batch.draft_probs {
        Some(_) => Some(w(batch.draft_stride)?),
        None => None,
    };
    Ok(shape_words(
        w(batch.requests())?,
        w(batch.k_max)?,
        w(batch.vocab)?,
        draft_stride,
        w(batch.target_stride)?,
        method_code(method),
        w(K)?,
    ))
}

/// Words of the `stats` buffer for `Counters<K>`: `4 + 2K` counters and the error-flag word.
#[must_use]
pub const fn stats_words(k: usize) -> usize {
    4 + 2 * k + 1
}

/// Index of the error-flag word in a `stats` buffer for `Counters<K>`.
#[must_use]
pub const fn error_word(k: usize) -> usize {
    4 + 2 * k
}

/// The counters held in the first `4 + 2K` words of `stats`; `None` if it is shorter.
#[must_use]
pub fn counters_from_stats<const K: usize>(stats: &[u64]) -> Option<Counters<K>> {
    if stats.len() < 4 + 2 * K {
        return None;
    }
    let mut c = Counters::<K>::ZERO;
    c.drafts = stats[0];
    c.draft_tokens = stats[1];
    c.accepted_tokens = stats[2];
    c.emitted_tokens = stats[3];
    c.accepted_per_position.copy_from_slice(&stats[4..4 + K]);
    c.drafted_per_position
        .copy_from_slice(&stats[4 + K..4 + 2 * K]);
    Some(c)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn source_defines_the_entry_point_and_documented_constants() {
        assert!(SOURCE.contains("extern \"C\" __global__"));
        assert!(SOURCE.contains(VERIFY_ENTRY));
        assert_eq!(
            define_value("SPECULA_BLOCK_THREADS"),
            Some(u64::from(BLOCK_THREADS))
        );
        // The shape-word indices and error bits must match the #defines of the text.
        for (name, value) in [
            ("SP_SHAPE_BATCH", SHAPE_BATCH as u64),
            ("SP_SHAPE_K_MAX", SHAPE_K_MAX as u64),
            ("SP_SHAPE_VOCAB", SHAPE_VOCAB as u64),
            ("SP_SHAPE_DRAFT_STRIDE", SHAPE_DRAFT_STRIDE as u64),
            ("SP_SHAPE_TARGET_STRIDE", SHAPE_TARGET_STRIDE as u64),
            ("SP_SHAPE_METHOD", SHAPE_METHOD as u64),
            ("SP_SHAPE_COUNTERS_K", SHAPE_COUNTERS_K as u64),
            ("SP_SHAPE_FLAGS", SHAPE_FLAGS as u64),
            ("SP_FLAG_DRAFT_PROBS", u64::from(FLAG_DRAFT_PROBS)),
            ("SP_ERR_SHAPE", ERR_SHAPE),
            ("SP_ERR_DRAFT_LEN", ERR_DRAFT_LEN),
            ("SP_ERR_TOKEN", ERR_TOKEN),
            (
                "SP_METHOD_REJECTION",
                u64::from(method_code(Method::Rejection)),
            ),
            ("SP_METHOD_GREEDY", u64::from(method_code(Method::Greedy))),
            ("SP_METHOD_TYPICAL", u64::from(method_code(Method::Typical))),
        ] {
            assert_eq!(define_value(name), Some(value), "{name}");
        }
    }

    /// The value of `#define NAME <int>[u]` in the source.
    fn define_value(name: &str) -> Option<u64> {
        SOURCE.lines().find_map(|line| {
            let rest = line.strip_prefix("#define ")?.strip_prefix(name)?;
            let tok = rest.split_whitespace().next()?.trim_end_matches('u');
            tok.parse().ok()
        })
    }

    #[test]
    fn counters_round_trip_through_stats_words() {
        let mut c = Counters::<3>::ZERO;
        c.record(3, 2).unwrap();
        c.record(1, 0).unwrap();
        let mut stats = [0u64; stats_words(3)];
        stats[0] = c.drafts;
        stats[1] = c.draft_tokens;
        stats[2] = c.accepted_tokens;
        stats[3] = c.emitted_tokens;
        stats[4..7].copy_from_slice(&c.accepted_per_position);
        stats[7..10].copy_from_slice(&c.drafted_per_position);
        stats[error_word(3)] = ERR_TOKEN;
        assert_eq!(counters_from_stats::<3>(&stats), Some(c));
        assert_eq!(counters_from_stats::<3>(&stats[..9]), None);
    }
}
