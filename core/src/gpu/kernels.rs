//! The single-source GPU kernel text (`core/kernels/specula_verify.cu`) and its launch contract.
//!
//! One text serves CUDA (NVRTC, in `specula-cuda`), HIP (hipRTC, in `specula-rocm`) and the
//! host-executed tests (g++ over a shim, in `specula-tests`). It implements `core/DETERMINISM.md`
//! exactly, so its outputs are bit-identical to [`crate::verify::verify_batch`].
//!
//! # Launch contract
//! * Every entry point (`extern "C"`: [`VERIFY_ENTRY`] and the others, [`TREE_ENTRY_NAMES`]) takes one
//!   parameter, the argument block [`ArgBlock`](crate::gpu::ArgBlock) (`sp_args` in the text) by
//!   value: `shape` ([`SHAPE_WORDS`] words, see [`shape_words`]), `k`, `draft_ids`,
//!   `draft_probs` (null when the shape says "one-hot drafter"), `target_probs`, `seed`,
//!   `offset`, `eps`, `delta` (read only by typical acceptance), `accepted`, `tokens`, `stats`,
//!   then the fields only some entries read, each null when not used. Every buffer is in device
//!   memory and laid out as `DETERMINISM.md` says. Which entry runs (the template instance) is
//!   the host's choice from the same inputs ([`Family`](crate::gpu::Family)), so the plain
//!   probability path keeps its own code.
//! * Grid `(capacity, 1, 1)` with `capacity ≥ shape[SHAPE_BATCH]`: one block per request; blocks
//!   past the batch return at once. Because the batch size, `k`, seeds and offsets are all read
//!   from device memory, one launch configuration (and one captured CUDA graph) serves every step.
//!   A batch above the capacity makes the whole launch do nothing and raise [`ERR_SHAPE`] (never
//!   a silent cut to the first `capacity` requests).
//! * Block `(n, 1, 1)` with `n ≤ BLOCK_THREADS` (the kernel's compile-time `SPECULA_BLOCK_THREADS`,
//!   256 unless defined otherwise) and `n` a multiple of the warp size (32 on NVIDIA, 64 or 32 on
//!   AMD). No dynamic shared memory.
//! * `stats` holds [`stats_words`]`(K)` words: the chain fields of [`Counters<K>`] in declaration
//!   order (`drafts, draft_tokens, accepted_tokens, emitted_tokens, accepted_per_position[K],
//!   drafted_per_position[K]`), then one error-flag word ([`error_word`]), then the tree fields
//!   `tree_drafts, tree_draft_tokens` ([`tree_drafts_word`], [`tree_draft_tokens_word`]; only
//!   the tree entries [`TREE_ENTRY_NAMES`] add to them). The kernel adds to the counters with
//!   64-bit atomics (`Counters::record(k, accepted)` per request with `k ≥ 1`, in the same
//!   launch; a request with `k = 0` emits only its bonus token and is not counted) and ORs
//!   [`ERR_SHAPE`], [`ERR_DRAFT_LEN`] or [`ERR_TOKEN`] into the flag word. A request with
//!   `k > k_max` or a draft id `≥ V` is skipped and not counted: its `accepted` and every token
//!   slot are set to the sentinel `u32::MAX`. Nothing is ever read or written out of bounds.
//! * Compile with FMA contraction off (NVRTC `--fmad=false`, hipcc `-ffp-contract=off`) and no
//!   fast math; the arithmetic is IEEE binary32 and binary64 in the order the document writes it.
//! * Readback: copy `stats` device-to-device on the compute stream (one consistent point in the
//!   stream) to a staging buffer, then to the host on a copy stream.
//!
//! # Speed (issue 17)
//! `scripts/kernel-report.py` reads the compiled kernel (sm_80, sm_90) and reports, per row pass,
//! instructions per element on the hot path, registers, spills and bytes in flight per SM, and a
//! latency/roofline model's predicted µs (docs/PERFORMANCE.md). What the text does for it:
//! rows are padded past their end with a value that never counts (no per-element bounds checks);
//! each thread loads `SP_UNROLL_*` groups of 4 ids before computing on any of them (64 B
//! per thread for argmax and entropy, 32 B for the race, 64 B for the residual race); the CUDA
//! build asks for 4 blocks of 256 per SM (`__launch_bounds__(256, 4)`: 64 registers, which ptxas
//! meets without spilling), so ≥ 32 KB are in flight per SM; Philox's key schedule is hoisted out
//! of the race loop; the race computes the stream-2 word, `expo` and the division only for ids
//! the f32 skip test cannot rule out.
//!
//! ## Rows split across blocks ([`VERIFY_SPLIT_ENTRY`])
//! One block per request leaves most SMs idle below batch ~132 and makes every row pass one
//! block's latency chain (the model predicts ~135 µs for greedy at batch 1, V = 128k, k = 4).
//! The second entry point, `specula_verify_split`, spreads each request over `slices` blocks;
//! `specula-cuda` launches it below one request per multiprocessor (`CudaVerifier::slices_for`:
//! `min(⌈2·SMs / capacity⌉, 64)` blocks per request, scratch reserved at staging time so the step
//! path never allocates; the graph keeps the scratch alive). The numerics are unchanged (every
//! reduction is order-free), so it gives the same bits; the host-executed kernel runs it in both
//! macro forms against the reference (`tests/tests/kernel_host.rs`, `*_rows_split`).
//! * **Grid** `(capacity · slices, 1, 1)`: block `x` works on request `x / slices`, slice
//!   `x % slices`; threads take groups `g_first, g_first + g_step, …` of every row
//!   (`g_first = slice · blockDim + thread`, `g_step = slices · blockDim`).
//! * **All rows at once**: greedy takes the argmax of rows `0..=k` (packed (f32 key, `~id`),
//!   combined with a 64-bit `atomicMax`); typical acceptance the fixed-point entropy sums of rows
//!   `0..k` (64-bit wrapping `atomicAdd`, exactly the order-free sum) and, as the rejection
//!   position is not known yet, the race of every row `0..=k`; rejection sampling runs the `k`
//!   acceptance tests at once (one per thread, first rejection by a block-wide reduction) in
//!   every block, then the residual race of the first rejected row and
//!   the plain race of that row (its fallback) in the same launch, or the bonus race. A race's
//!   result is one (binary64 key bits, id) slot per slice: a binary64 key and an id do not fit
//!   one 64-bit atomic; the finishing block takes the largest key, then the lowest id holding it.
//! * **Finish**: each block fences (`__threadfence`) and takes a ticket (`atomicAdd`); the block
//!   that draws the last one decides acceptance in order, writes `accepted`/`tokens`, records the
//!   counters (fused, as in the one-block entry) and zeroes the request's scratch words for the
//!   next launch (graph replays need no memset). The host shim runs blocks one after another, so
//!   no block ever waits on another.
//! * **Cost**: greedy and typical read rows `0..=k` even when an early draft is rejected, and
//!   typical computes every row's race (≈ 70 instructions per element): worth it when most of
//!   the GPU would otherwise idle, not at batch ≥ SMs, where the launch keeps one block per
//!   request. `specula-rocm` splits below 128 requests (`min(⌈256 / batch⌉, 64)` blocks; it
//!   cannot query the CU count). Not done: a two-phase typical acceptance (entropies, then only
//!   the chosen row's race) would save the speculative races.

use crate::metrics::Counters;
use crate::verify::{Batch, Format, Method};

/// The kernel source text (CUDA/HIP common subset; no headers needed).
pub const SOURCE: &str = include_str!("../../kernels/specula_verify.cu");

/// The tree-verification kernel text (`core/kernels/specula_tree.cu`) after the chain kernel's
/// device functions (its entry points left out, `SPECULA_TREE_MODULE`), in one self-contained source (the tree file's `#include "specula_verify.cu"` is then
/// skipped by its guard, so NVRTC and hipRTC need no header). Entry points [`TREE_ENTRY_NAMES`].
pub const TREE_SOURCE: &str = concat!(
    // The chain kernel's entry points (and what only they call) are left out of this module.
    "#define SPECULA_TREE_MODULE 1\n",
    include_str!("../../kernels/specula_verify.cu"),
    "\n",
    include_str!("../../kernels/specula_tree.cu")
);

/// Name of the tree-verification entry point (`extern "C"`, in [`TREE_SOURCE`]). It takes the
/// chain entries' argument block ([`TreeLaunch::arg_block`](crate::gpu::TreeLaunch::arg_block)):
/// `shape` ([`TREE_SHAPE_WORDS`] words: the chain's [`SHAPE_WORDS`] with [`SHAPE_K_MAX`] read as
/// the tree's `max_depth`, then [`TREE_SHAPE_NODES`]), `k` the node counts (B), `draft_ids` the
/// node tokens, `first_child` and `next_sibling` the links (B·N each, `-1`: none), `draft_probs`
/// (B·N rows; null unless [`FLAG_DRAFT_PROBS`]), `target_probs` (B·N rows of probabilities; null
/// with logits), `seed`, `offset`, `eps`, `delta`, `accepted` (B), `path` and `tokens`
/// (B·(max_depth + 1) each), `stats` ([`stats_words`]`(K)`), `target_logits` (exactly the
/// layout of `target_probs`, which is then not read; null: probabilities) and `temperature` (B
/// values, read only with logits; `0`: greedy on the logit rows whatever the method, `> 0`:
/// each node row's softmax of `core/DETERMINISM.md`, computed on the fly as in
/// [`VERIFY_LOGITS_ENTRY`]); the chain's other fields are null. Binary32 rows only: a half flag
/// ([`FLAG_TARGET_BF16`], [`FLAG_TARGET_F16`], [`FLAG_DRAFT_BF16`], [`FLAG_DRAFT_F16`]) sets
/// [`ERR_SHAPE`]; half rows take [`TREE_HALF_ENTRY`] (same contract), so this entry's code is
/// the binary32 instance alone, calling only its binary32 row passes.
/// Grid `(capacity, 1, 1)`, one block per request, block as for [`VERIFY_ENTRY`]. It follows
/// `core/DETERMINISM.md` "Token trees" bit for bit (greedy, the target-only rule, SpecInfer's
/// rule with draft rows, typical acceptance) and records
/// `Counters::record_tree(depth, n − 1, accepted)` per request of depth ≥ 1 (the chain words
/// as `record(depth, accepted)`, plus the tree words after the flag word). A malformed tree sets [`ERR_TREE`] (a node token `≥ V`:
/// [`ERR_TOKEN`]); that request is skipped, not counted, and its outputs are the sentinel.
/// (Checked bit for bit on the host through `tests/src/kernel_host.rs`; launched by the shared
/// orchestration, [`GpuVerifier::launch`](crate::gpu::GpuVerifier::launch) of [`TreeArgs`](crate::gpu::TreeArgs), over a
/// [`Driver::launch_tree`](crate::gpu::Driver::launch_tree); shape words: [`tree_shape`](crate::gpu::tree_shape).)
pub const TREE_ENTRY: &str = "specula_verify_tree";

/// Name of the tree entry point for half rows (`extern "C"`, in [`TREE_SOURCE`]): exactly
/// [`TREE_ENTRY`]'s argument block, launch and outputs, and the half flags ([`FLAG_TARGET_BF16`],
/// [`FLAG_TARGET_F16`], [`FLAG_DRAFT_BF16`], [`FLAG_DRAFT_F16`]) make it read the target rows
/// (probabilities or logits) or the draft rows as bf16 / f16 patterns, widened exactly as the
/// logits entries widen them (binary32 rows give [`TREE_ENTRY`]'s results too, through the
/// any-format passes). Its own entry point, not a call from [`TREE_ENTRY`]: a call to the
/// half instance forced the call ABI, and spills, on the binary32 entry's row loops.
/// [`TreeLaunch::entry_name`](crate::gpu::TreeLaunch::entry_name) picks between the two.
pub const TREE_HALF_ENTRY: &str = "specula_verify_tree_half";

/// The tree entry points, indexed by
/// [`TreeLaunch::entry_index`](crate::gpu::TreeLaunch::entry_index): binary32 rows, half rows.
pub const TREE_ENTRY_NAMES: [&str; 2] = [TREE_ENTRY, TREE_HALF_ENTRY];

/// Number of `u32` shape words of [`TREE_ENTRY`].
pub const TREE_SHAPE_WORDS: usize = 9;
/// Tree shape word: node slots `N` per request (`1 ≤ N ≤ 512`).
pub const TREE_SHAPE_NODES: usize = 8;

/// Name of the verification entry point (`extern "C"`, so not mangled). Besides the common
/// fields it reads `cu_num_draft_tokens` (B values, vLLM's cumulative draft counts; `k` is then
/// not read; null: the padded layout) and `bonus` (B bonus tokens; each request's target row
/// `k` is then not read, and absent from a ragged target tensor; null: sampled), as
/// `core/DETERMINISM.md` lays them out. On the raw device path a decreasing cumulative count
/// sets [`ERR_DRAFT_LEN`], a bonus token `≥ V` sets [`ERR_TOKEN`]; that request is skipped.
pub const VERIFY_ENTRY: &str = "specula_verify";

/// Name of the entry point that splits each request's rows over several blocks (`extern "C"`):
/// it reads [`VERIFY_ENTRY`]'s fields and the block's `scratch`
/// ([`split_scratch_words`]`(k_max, slices)` words per request of the capacity, zero before the
/// first launch; the kernel leaves them zero) and `slices` (≥ 1). Grid
/// `(capacity · slices, 1, 1)`, block as for [`VERIFY_ENTRY`]; same results bit for bit.
pub const VERIFY_SPLIT_ENTRY: &str = "specula_verify_split";

/// Name of the additive entry point for target logits with per-request temperature and the
/// engine's other inputs (`extern "C"`): it reads [`VERIFY_ENTRY`]'s fields and
/// * `target_logits` (exactly the layout of `target_probs`, which is then not read; null: the
///   probability path, as [`VERIFY_ENTRY`]);
/// * `temperature` (B values; `0`: greedy on the logits, `> 0`: the softmax of
///   `core/DETERMINISM.md`, computed on the fly, never materialised);
/// * `sampling` ([`SAMPLING_WORDS`] per request, [`sampling_words`]: request b's
///   [`method_code`] (logits at `T = 0` stay greedy) and its [`Filter`](crate::verify::Filter)
///   — the filters of `core/DETERMINISM.md` ("Sampling filters"), applied to every target row
///   the method reads; null: the shape word's method and no filter for every request);
/// * `draft_first_row` (mixed drafters, B values: request b's first draft row, `u32::MAX` for a
///   one-hot drafter's request; null: the layout's rows);
/// * `recovered` (output, one value per draft slot as
///   [`recovered_tokens`](crate::verify::recovered_tokens) lays it out: padded `b·k_max + j`
///   with the sentinel for `j ≥ k[b]`, ragged `cu[b−1] + j`; null: not written).
///
/// The shape flags [`FLAG_TARGET_BF16`] / [`FLAG_TARGET_F16`] and [`FLAG_DRAFT_BF16`] /
/// [`FLAG_DRAFT_F16`] (these entries and [`TREE_HALF_ENTRY`] only) make the target tensor read (the logits, else the
/// probabilities) or the draft probabilities hold u16 bf16 / f16 patterns, strides in elements,
/// widened exactly on read. A request whose method code is above 2, or whose filter is out of
/// its range ([`Filter::out_of_range`](crate::verify::Filter::out_of_range), NaN included), is skipped with [`ERR_PARAM`] (sentinel outputs, not
/// counted). Launch as [`VERIFY_ENTRY`]. (Checked bit for bit on the host through
/// `tests/src/kernel_host.rs`.)
pub const VERIFY_LOGITS_ENTRY: &str = "specula_verify_logits";

/// [`VERIFY_SPLIT_ENTRY`]'s fields, and `target_logits`, `temperature`, `sampling`,
/// `recovered` and `draft_first_row` as for [`VERIFY_LOGITS_ENTRY`];
/// launched as [`VERIFY_SPLIT_ENTRY`] (same scratch). Each block computes the state of the rows
/// it works on (softmax maximum and exact sum, filter threshold and kept mass) over the whole
/// row; the passes after it are split.
pub const VERIFY_SPLIT_LOGITS_ENTRY: &str = "specula_verify_split_logits";

/// `u64` scratch words per request that [`VERIFY_SPLIT_ENTRY`] needs for `k_max` (the shape
/// word) and `slices` blocks per request: a ticket, one word per row (argmax or entropy sum) and
/// a (key, id) slot per slice for each race it may run.
#[must_use]
pub const fn split_scratch_words(k_max: usize, slices: usize) -> usize {
    1 + k_max + 2 * slices * (k_max + 1)
}

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
/// `u32` words per request of the logits entries' `sampling` view ([`sampling_words`]).
pub const SAMPLING_WORDS: usize = 1 + crate::verify::FILTER_WORDS;

/// Request `b`'s sampling words as the logits entries read them, from its
/// [`plan`](Batch::plan) under `call`: its method code, then its
/// [`Filter`](crate::verify::Filter)'s words (greedy and no filter for logits at `T = 0`, as
/// the kernel reads them anyway). The one place a per-request sampling parameter enters the
/// GPU path.
#[must_use]
pub fn sampling_words(batch: &Batch<'_>, b: usize, call: Method) -> [u32; SAMPLING_WORDS] {
    let plan = batch.plan(b, call);
    let mut w = [method_code(plan.method); SAMPLING_WORDS];
    w[1..].copy_from_slice(&plan.filter.words());
    w
}

/// Whether `batch` has per-request sampling inputs (methods or filters): then the logits
/// entries read [`sampling_words`].
#[must_use]
pub fn has_sampling(batch: &Batch<'_>) -> bool {
    batch.methods.is_some() || batch.filters.is_some()
}

/// Shape word: method code ([`method_code`]).
pub const SHAPE_METHOD: usize = 5;
/// Shape word: `K` of the `Counters<K>` layout in `stats`.
pub const SHAPE_COUNTERS_K: usize = 6;
/// Shape word: flags ([`FLAG_DRAFT_PROBS`]).
pub const SHAPE_FLAGS: usize = 7;
/// Flag: `draft_probs` is present (otherwise the drafter is one-hot).
pub const FLAG_DRAFT_PROBS: u32 = 1;
/// Flag ([`VERIFY_LOGITS_ENTRY`], [`VERIFY_SPLIT_LOGITS_ENTRY`] and [`TREE_HALF_ENTRY`] only; the
/// other entries refuse it with [`ERR_SHAPE`]): the target tensor the entry reads holds bf16
/// patterns (u16).
pub const FLAG_TARGET_BF16: u32 = 2;
/// Flag (logits and half tree entries only): the target tensor holds f16 patterns (u16). Not with
/// [`FLAG_TARGET_BF16`] ([`ERR_SHAPE`]).
pub const FLAG_TARGET_F16: u32 = 4;
/// Flag (logits and half tree entries only, with [`FLAG_DRAFT_PROBS`]): `draft_probs` holds bf16
/// patterns.
pub const FLAG_DRAFT_BF16: u32 = 8;
/// Flag (logits and half tree entries only, with [`FLAG_DRAFT_PROBS`]): `draft_probs` holds f16
/// patterns.
/// Not with [`FLAG_DRAFT_BF16`] ([`ERR_SHAPE`]).
pub const FLAG_DRAFT_F16: u32 = 16;

/// The half flags of the rows' formats, chain or tree alike: the target's
/// ([`FLAG_TARGET_BF16`] / [`FLAG_TARGET_F16`]) and the draft's ([`FLAG_DRAFT_BF16`] /
/// [`FLAG_DRAFT_F16`]); none for binary32 rows.
pub(crate) const fn half_flags(target: Format, draft: Option<Format>) -> u32 {
    let draft = match draft {
        Some(Format::Bf16) => FLAG_DRAFT_BF16,
        Some(Format::F16) => FLAG_DRAFT_F16,
        Some(Format::F32) | None => 0,
    };
    draft
        | match target {
            Format::Bf16 => FLAG_TARGET_BF16,
            Format::F16 => FLAG_TARGET_F16,
            Format::F32 => 0,
        }
}

/// Error flag: the shape words were invalid, or the batch exceeded the launch's grid; the launch
/// did nothing.
pub const ERR_SHAPE: u64 = 1;
/// Error flag: some request had `k > k_max`; it was skipped and not counted. (`k = 0` is valid:
/// only the bonus token is emitted, and the request is not counted.)
pub const ERR_DRAFT_LEN: u64 = 2;
/// Error flag: some request had a draft id `≥ V`; it was skipped and not counted.
pub const ERR_TOKEN: u64 = 4;
/// Error flag (the tree entries [`TREE_ENTRY_NAMES`]): some request's tree was malformed (node
/// count, a link out of range, a cycle, an unreachable node, depth above `max_depth`); it was
/// skipped, not counted.
pub const ERR_TREE: u64 = 8;
/// Error flag ([`VERIFY_LOGITS_ENTRY`], [`VERIFY_SPLIT_LOGITS_ENTRY`]): some request had a
/// per-request input the kernel refuses (a method code above 2, a filter out of its range,
/// NaN included: [`Filter::out_of_range`](crate::verify::Filter::out_of_range)); it was skipped, not counted, sentinel outputs
/// (and sentinel recovered tokens).
pub const ERR_PARAM: u64 = 16;

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
    // Half draft rows set their stride with their format flag (the staging does).
    let draft_stride = match batch.draft {
        Some(d) if d.rows.format() == crate::verify::Format::F32 => Some(w(d.rows.stride)?),
        _ => None,
    };
    Ok(shape_words(
        w(batch.requests())?,
        w(batch.k_max)?,
        w(batch.vocab)?,
        draft_stride,
        w(batch.target.rows().stride)?,
        method_code(method),
        w(K)?,
    ))
}

/// Words of the `stats` buffer for `Counters<K>`: the `4 + 2K` chain counters, the error-flag
/// word ([`error_word`]), then the two tree counters ([`tree_drafts_word`],
/// [`tree_draft_tokens_word`]). The tree words come after the flag word so that the chain
/// kernel's layout (counters, then the flag at `4 + 2K`) is unchanged; the chain kernel never
/// writes them.
#[must_use]
pub const fn stats_words(k: usize) -> usize {
    4 + 2 * k + 3
}

/// Index of the error-flag word in a `stats` buffer for `Counters<K>`.
#[must_use]
pub const fn error_word(k: usize) -> usize {
    4 + 2 * k
}

/// Index of [`Counters::tree_drafts`] in a `stats` buffer for `Counters<K>` (after the flag
/// word; added to by the tree entries [`TREE_ENTRY_NAMES`] only).
#[must_use]
pub const fn tree_drafts_word(k: usize) -> usize {
    4 + 2 * k + 1
}

/// Index of [`Counters::tree_draft_tokens`] in a `stats` buffer for `Counters<K>`.
#[must_use]
pub const fn tree_draft_tokens_word(k: usize) -> usize {
    4 + 2 * k + 2
}

/// The counters held in a `stats` buffer ([`stats_words`]`(K)` words: the first `4 + 2K` and
/// the two tree words after the flag word); `None` if it is shorter.
#[must_use]
pub fn counters_from_stats<const K: usize>(stats: &[u64]) -> Option<Counters<K>> {
    (stats.len() >= stats_words(K)).then(|| counters_of(|i| stats[i]))
}

/// The counters of a `stats` buffer whose word `i` is `word(i)` (called once per counter word;
/// the error word is not read).
pub(crate) fn counters_of<const K: usize>(word: impl Fn(usize) -> u64) -> Counters<K> {
    let mut c = Counters::<K>::ZERO;
    c.drafts = word(0);
    c.draft_tokens = word(1);
    c.accepted_tokens = word(2);
    c.emitted_tokens = word(3);
    for j in 0..K {
        c.accepted_per_position[j] = word(4 + j);
        c.drafted_per_position[j] = word(4 + K + j);
    }
    c.tree_drafts = word(tree_drafts_word(K));
    c.tree_draft_tokens = word(tree_draft_tokens_word(K));
    c
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::verify::Filter;

    #[test]
    #[cfg_attr(miri, ignore = "a scan of the kernel text; too slow under Miri")]
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
            ("SP_SAMPLING_WORDS", SAMPLING_WORDS as u64),
            ("SP_FLAG_DRAFT_PROBS", u64::from(FLAG_DRAFT_PROBS)),
            ("SP_FLAG_TARGET_BF16", u64::from(FLAG_TARGET_BF16)),
            ("SP_FLAG_TARGET_F16", u64::from(FLAG_TARGET_F16)),
            ("SP_FLAG_DRAFT_BF16", u64::from(FLAG_DRAFT_BF16)),
            ("SP_FLAG_DRAFT_F16", u64::from(FLAG_DRAFT_F16)),
            ("SP_ERR_PARAM", ERR_PARAM),
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

    #[test]
    #[cfg_attr(miri, ignore = "a scan of the kernel text; too slow under Miri")]
    fn sampling_words_are_where_the_kernel_reads_them() {
        let f = Filter::NONE
            .with_top_k(7)
            .with_top_p(0.25)
            .with_min_p(0.125);
        let filters = [f];
        let batch = Batch::dense(
            crate::verify::Dims { vocab: 4, k_max: 0 },
            crate::verify::Drafts { k: &[0], ids: &[] },
            &[],
            crate::verify::Streams {
                seed: &[0],
                offset: &[0],
            },
        )
        .with_filters(&filters);
        let w = sampling_words(&batch, 0, Method::Typical);
        for (name, value) in [
            ("SP_SAMPLING_METHOD", method_code(Method::Typical)),
            ("SP_SAMPLING_TOP_K", 7),
            ("SP_SAMPLING_TOP_P", 0.25f32.to_bits()),
            ("SP_SAMPLING_MIN_P", 0.125f32.to_bits()),
        ] {
            let at = define_value(name).unwrap_or_else(|| panic!("{name}"));
            assert_eq!(w[usize::try_from(at).unwrap()], value, "{name}");
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
        c.record_tree(2, 5, 1).unwrap();
        for (i, v) in [
            c.drafts,
            c.draft_tokens,
            c.accepted_tokens,
            c.emitted_tokens,
        ]
        .into_iter()
        .enumerate()
        {
            stats[i] = v;
        }
        stats[4..7].copy_from_slice(&c.accepted_per_position);
        stats[7..10].copy_from_slice(&c.drafted_per_position);
        stats[tree_drafts_word(3)] = c.tree_drafts;
        stats[tree_draft_tokens_word(3)] = c.tree_draft_tokens;
        assert_eq!(counters_from_stats::<3>(&stats), Some(c));
        assert_eq!(stats[error_word(3)], ERR_TOKEN, "the flag word is apart");
        assert_eq!(counters_from_stats::<3>(&stats[..12]), None);
    }
}
