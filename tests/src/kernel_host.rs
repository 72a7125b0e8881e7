//! The GPU kernel text (`core/kernels/specula_verify.cu`), executed on the host.
//!
//! `tests/build.rs` compiles the exact kernel source with g++ over a small CUDA/HIP shim (one OS
//! thread per GPU thread, `std::barrier` for `__syncthreads`, `std::atomic_ref` for atomics),
//! once in CUDA-macro mode (warp 32) and once in HIP-macro mode (wave 64). [`KernelHost`] wraps
//! either launcher as a [`Verifier`], so the shared conformance suite checks the kernel's logic
//! bit for bit against [`specula_core::verify::verify_batch`] on any CI machine, without a GPU.
//!
//! Like a GPU backend, it validates the batch on the host first (same errors as the reference),
//! then launches one block per request; the device-side counters and error flag live in a
//! `Vec<u64>` laid out as the kernel's `stats` buffer
//! ([`specula_core::gpu::kernels::stats_words`]).

use specula_core::Counters;
use specula_core::gpu::kernels;
use specula_core::verify::{
    Batch, Check, DEFAULT_DELTA, DEFAULT_EPS, Half, Method, Outputs, Rows, Support, Target, Values,
    Verifier, VerifyError, validate_recovered, validate_with,
};

/// Which macro set the kernel text was compiled with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// CUDA macros: warp size 32, `__shfl_down_sync`.
    Cuda,
    /// HIP macros: wave size 64, `__shfl_down`.
    Hip,
}

impl Mode {
    /// The warp (wave) size the shim emulates in this mode.
    #[must_use]
    pub const fn warp_size(self) -> u32 {
        match self {
            Self::Cuda => 32,
            Self::Hip => 64,
        }
    }
}

/// The most threads per block the host build allows (`SPECULA_BLOCK_THREADS` in `build.rs`).
pub const MAX_BLOCK_THREADS: u32 = 128;

/// Why a host-executed verification failed.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum KernelHostError {
    /// The batch failed the reference's validation; nothing ran and nothing was counted.
    Verify(VerifyError),
    /// The block size is 0, above [`MAX_BLOCK_THREADS`] or not a multiple of the warp size.
    BadBlock {
        /// Threads per block asked for.
        block: u32,
        /// The mode's warp size.
        warp: u32,
    },
    /// A size does not fit the kernel's 32-bit shape words (batch, `k_max + 1`, strides).
    TooLarge,
    /// The kernel raised error flags (`kernels::ERR_*` bits) although the batch was validated:
    /// a kernel bug, never expected.
    DeviceFlags(u64),
    /// Some threads of a block reached a barrier that others never did (they returned): a
    /// kernel bug, undefined on a GPU; the shim stopped the launch (its outputs are partial).
    BarrierDivergence,
}

impl From<VerifyError> for KernelHostError {
    fn from(e: VerifyError) -> Self {
        Self::Verify(e)
    }
}

impl core::fmt::Display for KernelHostError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Verify(e) => write!(f, "invalid batch: {e:?}"),
            Self::BadBlock { block, warp } => {
                write!(
                    f,
                    "block of {block} threads (warp {warp}, at most {MAX_BLOCK_THREADS})"
                )
            }
            Self::TooLarge => f.write_str("a size does not fit the kernel's 32-bit shape words"),
            Self::DeviceFlags(bits) => write!(f, "kernel error flags {bits:#x}"),
            Self::BarrierDivergence => {
                f.write_str("a barrier reached by only some threads of a block")
            }
        }
    }
}

impl std::error::Error for KernelHostError {}

type Launcher = unsafe extern "C" fn(
    grid: u32,
    block: u32,
    shape: *const u32,
    k: *const u32,
    draft_ids: *const u32,
    draft_probs: *const f32,
    target_probs: *const f32,
    seed: *const u64,
    offset: *const u64,
    eps: *const f32,
    delta: *const f32,
    accepted: *mut u32,
    tokens: *mut u32,
    stats: *mut u64,
    scratch: *mut u64,
    slices: u32,
) -> i32;

/// [`Launcher`] with the additive entry points' two last arguments (`cu_num_draft_tokens`,
/// `bonus`; null when not used).
type LauncherEx = unsafe extern "C" fn(
    grid: u32,
    block: u32,
    shape: *const u32,
    k: *const u32,
    draft_ids: *const u32,
    draft_probs: *const f32,
    target_probs: *const f32,
    seed: *const u64,
    offset: *const u64,
    eps: *const f32,
    delta: *const f32,
    accepted: *mut u32,
    tokens: *mut u32,
    stats: *mut u64,
    scratch: *mut u64,
    slices: u32,
    cu: *const u32,
    bonus: *const u32,
) -> i32;

/// The logits launcher (`specula_verify_logits` / `specula_verify_split_logits`): the ex
/// launcher's parameters, then the target logits and the temperatures (null: probabilities),
/// then `methods`, `top_k`, `top_p`, `min_p` and `recovered` (null: not used).
type LauncherLogits = unsafe extern "C" fn(
    u32,
    u32,
    *const u32,
    *const u32,
    *const u32,
    *const f32,
    *const f32,
    *const u64,
    *const u64,
    *const f32,
    *const f32,
    *mut u32,
    *mut u32,
    *mut u64,
    *mut u64,
    u32,
    *const u32,
    *const u32,
    *const f32,
    *const f32,
    *const u32,
    *const u32,
    *const f32,
    *const f32,
    *mut u32,
) -> i32;

// SAFETY: both symbols are defined by tests/kernel_host/launch.cpp (compiled by build.rs) with
// exactly the `LauncherLogits` signature.
unsafe extern "C" {
    fn specula_host_verify_logits_cuda(
        grid: u32,
        block: u32,
        shape: *const u32,
        k: *const u32,
        draft_ids: *const u32,
        draft_probs: *const f32,
        target_probs: *const f32,
        seed: *const u64,
        offset: *const u64,
        eps: *const f32,
        delta: *const f32,
        accepted: *mut u32,
        tokens: *mut u32,
        stats: *mut u64,
        scratch: *mut u64,
        slices: u32,
        cu: *const u32,
        bonus: *const u32,
        logits: *const f32,
        temperature: *const f32,
        methods: *const u32,
        top_k: *const u32,
        top_p: *const f32,
        min_p: *const f32,
        recovered: *mut u32,
    ) -> i32;
    fn specula_host_verify_logits_hip(
        grid: u32,
        block: u32,
        shape: *const u32,
        k: *const u32,
        draft_ids: *const u32,
        draft_probs: *const f32,
        target_probs: *const f32,
        seed: *const u64,
        offset: *const u64,
        eps: *const f32,
        delta: *const f32,
        accepted: *mut u32,
        tokens: *mut u32,
        stats: *mut u64,
        scratch: *mut u64,
        slices: u32,
        cu: *const u32,
        bonus: *const u32,
        logits: *const f32,
        temperature: *const f32,
        methods: *const u32,
        top_k: *const u32,
        top_p: *const f32,
        min_p: *const f32,
        recovered: *mut u32,
    ) -> i32;
}

// SAFETY: both symbols are defined by tests/kernel_host/launch.cpp (compiled by build.rs) with
// exactly the `LauncherEx` signature.
unsafe extern "C" {
    fn specula_host_verify_ex_cuda(
        grid: u32,
        block: u32,
        shape: *const u32,
        k: *const u32,
        draft_ids: *const u32,
        draft_probs: *const f32,
        target_probs: *const f32,
        seed: *const u64,
        offset: *const u64,
        eps: *const f32,
        delta: *const f32,
        accepted: *mut u32,
        tokens: *mut u32,
        stats: *mut u64,
        scratch: *mut u64,
        slices: u32,
        cu: *const u32,
        bonus: *const u32,
    ) -> i32;
    fn specula_host_verify_ex_hip(
        grid: u32,
        block: u32,
        shape: *const u32,
        k: *const u32,
        draft_ids: *const u32,
        draft_probs: *const f32,
        target_probs: *const f32,
        seed: *const u64,
        offset: *const u64,
        eps: *const f32,
        delta: *const f32,
        accepted: *mut u32,
        tokens: *mut u32,
        stats: *mut u64,
        scratch: *mut u64,
        slices: u32,
        cu: *const u32,
        bonus: *const u32,
    ) -> i32;
}

// SAFETY: both symbols are defined by tests/kernel_host/launch.cpp (compiled by build.rs) with
// exactly the `Launcher` signature: 32-bit unsigned ints, pointers to u32/f32/u64, a 32-bit
// unsigned int, int result.
unsafe extern "C" {
    fn specula_host_verify_cuda(
        grid: u32,
        block: u32,
        shape: *const u32,
        k: *const u32,
        draft_ids: *const u32,
        draft_probs: *const f32,
        target_probs: *const f32,
        seed: *const u64,
        offset: *const u64,
        eps: *const f32,
        delta: *const f32,
        accepted: *mut u32,
        tokens: *mut u32,
        stats: *mut u64,
        scratch: *mut u64,
        slices: u32,
    ) -> i32;
    fn specula_host_verify_hip(
        grid: u32,
        block: u32,
        shape: *const u32,
        k: *const u32,
        draft_ids: *const u32,
        draft_probs: *const f32,
        target_probs: *const f32,
        seed: *const u64,
        offset: *const u64,
        eps: *const f32,
        delta: *const f32,
        accepted: *mut u32,
        tokens: *mut u32,
        stats: *mut u64,
        scratch: *mut u64,
        slices: u32,
    ) -> i32;
}

/// What a launcher returns when the shim stopped a launch whose block diverged at a barrier.
const DIVERGED: i32 = 2;

unsafe extern "C" {
    fn specula_host_skip_barrier_cuda(n: u32, ascending_only: bool);
    fn specula_host_skip_barrier_hip(n: u32, ascending_only: bool);
}

/// The shim's fault injection, for the test that attacks it: from now on every thread of every
/// block of `mode`'s launches passes its `n`-th barrier (a `__syncthreads` or a shuffle's)
/// without waiting, as if the kernel text lacked it; `0` restores every barrier. With
/// `ascending_only` the shim resumes the threads in ascending order in every round instead of
/// alternating the order (the attack's control). It applies to every launch of the process:
/// only a test binary of its own may use it.
pub fn skip_barrier(mode: Mode, n: u32, ascending_only: bool) {
    // SAFETY: the shim's function stores its arguments in atomics; no pointer is involved.
    unsafe {
        match mode {
            Mode::Cuda => specula_host_skip_barrier_cuda(n, ascending_only),
            Mode::Hip => specula_host_skip_barrier_hip(n, ascending_only),
        }
    }
}

/// The kernel text run on the host as a [`Verifier`].
#[derive(Clone, Debug)]
pub struct KernelHost<const K: usize> {
    mode: Mode,
    block: u32,
    /// Blocks per request: 1 runs `specula_verify`, more `specula_verify_split`.
    slices: u32,
    /// The split entry's scratch words (zero between launches, as the kernel leaves them).
    scratch: Vec<u64>,
    /// The kernel's `stats` buffer: the chain `Counters<K>` words, the error-flag word, then the
    /// tree words (`kernels::stats_words`).
    stats: Vec<u64>,
}

impl<const K: usize> KernelHost<K> {
    /// A host-executed kernel in `mode` with `block` threads per block (a multiple of the warp
    /// size, at most [`MAX_BLOCK_THREADS`]), with zero counters.
    pub fn new(mode: Mode, block: u32) -> Result<Self, KernelHostError> {
        let warp = mode.warp_size();
        if block == 0 || block > MAX_BLOCK_THREADS || !block.is_multiple_of(warp) {
            return Err(KernelHostError::BadBlock { block, warp });
        }
        Ok(Self {
            mode,
            block,
            slices: 1,
            scratch: Vec::new(),
            stats: vec![0; kernels::stats_words(K)],
        })
    }

    /// The same, with each request's rows split over `slices` blocks (the kernel's
    /// `specula_verify_split` entry when `slices > 1`). `slices` 0 is taken as 1.
    pub fn with_slices(mode: Mode, block: u32, slices: u32) -> Result<Self, KernelHostError> {
        let mut h = Self::new(mode, block)?;
        h.slices = slices.max(1);
        Ok(h)
    }

    /// Blocks per request.
    #[must_use]
    pub fn slices(&self) -> u32 {
        self.slices
    }

    /// Whether the split entry's scratch words are all zero, as every launch must leave them
    /// (a captured graph replays with no memset in between).
    #[must_use]
    pub fn scratch_is_clear(&self) -> bool {
        self.scratch.iter().all(|&w| w == 0)
    }

    /// The macro mode.
    #[must_use]
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The error-flag word as the kernel left it (`kernels::ERR_*` bits; 0 when all is well).
    #[must_use]
    pub fn error_flags(&self) -> u64 {
        self.stats[kernels::error_word(K)]
    }

    /// Launches the kernel on raw, unvalidated arguments, exactly as a device launch would
    /// read them: the kernel's own checks are all that stands between bad input and memory.
    /// `grid` is the capacity in requests; with [`slices`](Self::slices) > 1 the split entry
    /// runs on `grid · slices` blocks with scratch sized for `grid` requests and `shape`'s
    /// `k_max`. Returns the launcher's status (0: ran).
    ///
    /// # Safety
    /// Every pointer must be valid for the extent the shape words (and `grid`) imply, as for a
    /// device launch; `draft_probs`, `eps` and `delta` may be null when not used.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn launch_raw(
        &mut self,
        grid: u32,
        shape: &[u32; kernels::SHAPE_WORDS],
        k: *const u32,
        draft_ids: *const u32,
        draft_probs: *const f32,
        target_probs: *const f32,
        seed: *const u64,
        offset: *const u64,
        eps: *const f32,
        delta: *const f32,
        accepted: *mut u32,
        tokens: *mut u32,
    ) -> i32 {
        let (blocks, scratch) = self.grid_and_scratch(grid, shape);
        let params = Params {
            shape: shape.as_ptr(),
            k,
            draft_ids,
            draft_probs,
            target_probs,
            seed,
            offset,
            eps,
            delta,
            accepted,
            tokens,
            stats: self.stats.as_mut_ptr(),
            scratch,
        };
        // SAFETY: the caller guarantees the pointers; `shape`, `self.stats` and the scratch are
        // live and sized for the kernel (8 shape words; stats_words(K) stats words, with
        // shape[COUNTERS_K] set by the caller to K or less; split_scratch_words per request of
        // `grid`, zero as the kernel leaves them).
        unsafe { launch_params(self.mode, blocks, self.block, self.slices, &params) }
    }

    /// [`launch_raw`](Self::launch_raw) through the additive entry points
    /// (`specula_verify_ex`, `specula_verify_split_ex`): `cu_num_draft_tokens` (B values: the
    /// ragged layout, `k` is then not read) and `bonus` (B caller-supplied bonus tokens), each
    /// null when not used.
    ///
    /// # Safety
    /// As for [`launch_raw`](Self::launch_raw), with the extents of the ragged layout when `cu`
    /// is not null; `cu` and `bonus` hold B values when not null. `p.shape`, `p.stats` and
    /// `p.scratch` are not used (`shape`, the host's counters and its scratch are).
    pub unsafe fn launch_raw_ex(
        &mut self,
        grid: u32,
        shape: &[u32; kernels::SHAPE_WORDS],
        p: &Params,
        cu: *const u32,
        bonus: *const u32,
    ) -> i32 {
        let (blocks, scratch) = self.grid_and_scratch(grid, shape);
        let q = Params {
            shape: shape.as_ptr(),
            stats: self.stats.as_mut_ptr(),
            scratch,
            ..*p
        };
        let x = Inputs {
            cu,
            bonus,
            ..Inputs::default()
        };
        // SAFETY: as in `launch_raw`; `cu` and `bonus` are null or hold B values (caller).
        unsafe { launch_params_ext(self.mode, blocks, self.block, self.slices, &q, &x, false) }
    }

    /// [`launch_raw_ex`](Self::launch_raw_ex) through `specula_verify_logits` /
    /// `specula_verify_split_logits`: `logits` (target logits in `target_probs`' layout, which is
    /// then not read) and `temperature` (B values; 0: greedy on the logits), both null for the
    /// probability path. The engine inputs after them are null
    /// ([`launch_raw_inputs`](Self::launch_raw_inputs) passes them).
    ///
    /// # Safety
    /// As for [`launch_raw_ex`](Self::launch_raw_ex); `logits` has the target extent and
    /// `temperature` B values when `logits` is not null.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn launch_raw_logits(
        &mut self,
        grid: u32,
        shape: &[u32; kernels::SHAPE_WORDS],
        p: &Params,
        cu: *const u32,
        bonus: *const u32,
        logits: *const f32,
        temperature: *const f32,
    ) -> i32 {
        let x = Inputs {
            cu,
            bonus,
            logits,
            temperature,
            ..Inputs::default()
        };
        // SAFETY: the caller's guarantees, as documented; the other inputs are null.
        unsafe { self.launch_raw_inputs(grid, shape, p, &x) }
    }

    /// The logits entries (`specula_verify_logits` / `specula_verify_split_logits`) with every
    /// trailing input of [`Inputs`]: `p.shape`, `p.stats` and `p.scratch` are not used
    /// (`shape`, the host's counters and its scratch are).
    ///
    /// # Safety
    /// As for [`launch_raw_ex`](Self::launch_raw_ex), and each non-null pointer of `x` valid for
    /// the extent [`Inputs`] documents.
    pub unsafe fn launch_raw_inputs(
        &mut self,
        grid: u32,
        shape: &[u32; kernels::SHAPE_WORDS],
        p: &Params,
        x: &Inputs,
    ) -> i32 {
        let (blocks, scratch) = self.grid_and_scratch(grid, shape);
        let q = Params {
            shape: shape.as_ptr(),
            stats: self.stats.as_mut_ptr(),
            scratch,
            ..*p
        };
        // SAFETY: as in `launch_raw_ex`; `x` as the caller guarantees.
        unsafe { launch_inputs_params(self.mode, blocks, self.block, self.slices, &q, x) }
    }

    /// Blocks to launch for `grid` requests, and the split entry's scratch (null for one slice).
    fn grid_and_scratch(
        &mut self,
        grid: u32,
        shape: &[u32; kernels::SHAPE_WORDS],
    ) -> (u32, *mut u64) {
        if self.slices > 1 {
            let words = kernels::split_scratch_words(
                shape[kernels::SHAPE_K_MAX] as usize,
                self.slices as usize,
            );
            let len = words.saturating_mul(grid as usize);
            if self.scratch.len() < len {
                self.scratch.resize(len, 0);
            }
            (grid.saturating_mul(self.slices), self.scratch.as_mut_ptr())
        } else {
            (grid, core::ptr::null_mut())
        }
    }
}

/// The logits entries' parameters after the split entry's (`specula_verify_logits`,
/// `specula_verify_split_logits`, in their order), as raw host pointers; each null when not
/// used ([`Inputs::default`]: all null, the padded probability path).
#[derive(Clone, Copy, Debug)]
pub struct Inputs {
    /// Ragged layout: `cu_num_draft_tokens` (B values).
    pub cu: *const u32,
    /// Caller-supplied bonus tokens (B values).
    pub bonus: *const u32,
    /// Target logits in `target_probs`' layout (u16 elements under a target half-precision
    /// shape flag).
    pub logits: *const f32,
    /// Temperatures (B values; read when `logits` is not null).
    pub temperature: *const f32,
    /// Method codes per request (B values, [`kernels::method_code`]).
    pub methods: *const u32,
    /// top-k per request (B values; 0: off).
    pub top_k: *const u32,
    /// top-p per request (B values; 1: off).
    pub top_p: *const f32,
    /// min-p per request (B values; 0: off).
    pub min_p: *const f32,
    /// Output: recovered tokens, one per draft slot (padded `B·k_max`, ragged `num_tokens`).
    pub recovered: *mut u32,
}

impl Default for Inputs {
    fn default() -> Self {
        Self {
            cu: core::ptr::null(),
            bonus: core::ptr::null(),
            logits: core::ptr::null(),
            temperature: core::ptr::null(),
            methods: core::ptr::null(),
            top_k: core::ptr::null(),
            top_p: core::ptr::null(),
            min_p: core::ptr::null(),
            recovered: core::ptr::null_mut(),
        }
    }
}

/// Runs the logits entries of the kernel text compiled in `mode` (the split one when
/// `slices > 1`) on `p` and `x`. Returns the launcher's status (0: ran).
///
/// # Safety
/// As for [`launch_params`], and every non-null pointer of `x` valid for the extent the shape
/// words imply.
pub unsafe fn launch_inputs_params(
    mode: Mode,
    blocks: u32,
    block: u32,
    slices: u32,
    p: &Params,
    x: &Inputs,
) -> i32 {
    let f: LauncherLogits = match mode {
        Mode::Cuda => specula_host_verify_logits_cuda,
        Mode::Hip => specula_host_verify_logits_hip,
    };
    // SAFETY: the caller guarantees the pointers; `f` has exactly this signature.
    unsafe {
        f(
            blocks,
            block,
            p.shape,
            p.k,
            p.draft_ids,
            p.draft_probs,
            p.target_probs,
            p.seed,
            p.offset,
            p.eps,
            p.delta,
            p.accepted,
            p.tokens,
            p.stats,
            p.scratch,
            slices,
            x.cu,
            x.bonus,
            x.logits,
            x.temperature,
            x.methods,
            x.top_k,
            x.top_p,
            x.min_p,
            x.recovered,
        )
    }
}

/// The kernel's parameters as raw host pointers, in its order (the split entry's two extra
/// ones last). One pack, used by [`KernelHost`] and by the host driver
/// ([`crate::host_driver`]). [`Params::default`] has every pointer null.
#[derive(Clone, Copy, Debug)]
pub struct Params {
    /// Shape words.
    pub shape: *const u32,
    /// `k[b]`.
    pub k: *const u32,
    /// Draft ids.
    pub draft_ids: *const u32,
    /// Draft probabilities, or null.
    pub draft_probs: *const f32,
    /// Target probabilities.
    pub target_probs: *const f32,
    /// Seeds.
    pub seed: *const u64,
    /// Offsets.
    pub offset: *const u64,
    /// `ε`, or null.
    pub eps: *const f32,
    /// `δ`, or null.
    pub delta: *const f32,
    /// Output: accepted counts.
    pub accepted: *mut u32,
    /// Output: tokens.
    pub tokens: *mut u32,
    /// Counters and error word.
    pub stats: *mut u64,
    /// Split scratch, or null with one slice.
    pub scratch: *mut u64,
}

impl Default for Params {
    fn default() -> Self {
        Self {
            shape: core::ptr::null(),
            k: core::ptr::null(),
            draft_ids: core::ptr::null(),
            draft_probs: core::ptr::null(),
            target_probs: core::ptr::null(),
            seed: core::ptr::null(),
            offset: core::ptr::null(),
            eps: core::ptr::null(),
            delta: core::ptr::null(),
            accepted: core::ptr::null_mut(),
            tokens: core::ptr::null_mut(),
            stats: core::ptr::null_mut(),
            scratch: core::ptr::null_mut(),
        }
    }
}

/// Runs `blocks` blocks of `block` threads of the kernel text compiled in `mode` (the split
/// entry when `slices > 1`). Returns the launcher's status (0: ran).
///
/// # Safety
/// Every pointer in `p` must be valid for the extent the shape words (and `blocks`) imply, as
/// for a device launch, and not accessed by anything else while the kernel runs.
pub unsafe fn launch_params(mode: Mode, blocks: u32, block: u32, slices: u32, p: &Params) -> i32 {
    let f: Launcher = match mode {
        Mode::Cuda => specula_host_verify_cuda,
        Mode::Hip => specula_host_verify_hip,
    };
    // SAFETY: the caller guarantees the pointers; `f` has exactly this signature.
    unsafe {
        f(
            blocks,
            block,
            p.shape,
            p.k,
            p.draft_ids,
            p.draft_probs,
            p.target_probs,
            p.seed,
            p.offset,
            p.eps,
            p.delta,
            p.accepted,
            p.tokens,
            p.stats,
            p.scratch,
            slices,
        )
    }
}

/// [`launch_params`] through the additive entry points: `specula_verify_ex` /
/// `specula_verify_split_ex` when `logits_entry` is false (then only `x.cu` and `x.bonus` are
/// passed), the logits entries ([`launch_inputs_params`]) when it is true. Returns the
/// launcher's status (0: ran).
///
/// # Safety
/// As for [`launch_params`]; the pointers of `x` are null or valid for what the kernel reads
/// through them (B values; the logits over the target extent, which in the ragged layout the
/// cumulative counts imply).
pub unsafe fn launch_params_ext(
    mode: Mode,
    blocks: u32,
    block: u32,
    slices: u32,
    p: &Params,
    x: &Inputs,
    logits_entry: bool,
) -> i32 {
    if logits_entry {
        // SAFETY: as vouched for by the caller.
        return unsafe { launch_inputs_params(mode, blocks, block, slices, p, x) };
    }
    let f: LauncherEx = match mode {
        Mode::Cuda => specula_host_verify_ex_cuda,
        Mode::Hip => specula_host_verify_ex_hip,
    };
    // SAFETY: the caller guarantees the pointers; `f` has exactly this signature.
    unsafe {
        f(
            blocks,
            block,
            p.shape,
            p.k,
            p.draft_ids,
            p.draft_probs,
            p.target_probs,
            p.seed,
            p.offset,
            p.eps,
            p.delta,
            p.accepted,
            p.tokens,
            p.stats,
            p.scratch,
            slices,
            x.cu,
            x.bonus,
        )
    }
}

fn to_u32(x: usize) -> Result<u32, KernelHostError> {
    u32::try_from(x).map_err(|_| KernelHostError::TooLarge)
}

impl<const K: usize> KernelHost<K> {
    /// [`Verifier::verify`] that also writes vLLM's recovered tokens (one per draft slot, as
    /// [`specula_core::verify::recovered_tokens`] lays them out) in the same launch, through
    /// the logits entries' `recovered` output.
    pub fn verify_recovered(
        &mut self,
        method: Method,
        check: Check,
        batch: &Batch<'_>,
        out: &mut Outputs<'_>,
        recovered: &mut [u32],
    ) -> Result<(), KernelHostError> {
        validate_recovered::<K>(self.support(), method, check, batch, recovered)?;
        self.launch_verify(method, check, batch, out, recovered.as_mut_ptr())
    }

    /// Validates `batch` and `out`, then launches: the ex entries for a batch with none of the
    /// logits entries' inputs, the logits entries otherwise (or when `recovered` is not null).
    fn launch_verify(
        &mut self,
        method: Method,
        check: Check,
        batch: &Batch<'_>,
        out: &mut Outputs<'_>,
        recovered: *mut u32,
    ) -> Result<(), KernelHostError> {
        validate_with::<K>(self.support(), method, check, batch, out)?;
        let b = batch.requests();
        let mut shape =
            kernels::batch_shape::<K>(method, batch).map_err(|_| KernelHostError::TooLarge)?;
        let eps: Vec<f32> = batch
            .eps
            .map_or_else(|| vec![DEFAULT_EPS; b], <[f32]>::to_vec);
        let delta: Vec<f32> = batch
            .delta
            .map_or_else(|| vec![DEFAULT_DELTA; b], <[f32]>::to_vec);
        let before = self.error_flags();
        let cu = batch
            .cu_num_draft_tokens()
            .map_or(core::ptr::null(), <[u32]>::as_ptr);
        let bonus = batch.bonus.map_or(core::ptr::null(), <[u32]>::as_ptr);
        // Target logits, binary32 or half (the pointer then holds u16 elements); the logits
        // entry reads the logits instead of the probabilities (null, as it documents).
        let (target_probs, logits): (*const f32, *const f32) = match batch.target {
            Target::Probs(r) => (
                r.as_f32().map_or(core::ptr::null(), <[f32]>::as_ptr),
                core::ptr::null(),
            ),
            Target::Logits { rows, .. } => (
                core::ptr::null(),
                match rows.values {
                    Values::F32(l) => l.as_ptr(),
                    Values::Half(Half::Bf16(h)) => {
                        shape[kernels::SHAPE_FLAGS] |= kernels::FLAG_TARGET_BF16;
                        h.as_ptr().cast()
                    }
                    Values::Half(Half::F16(h)) => {
                        shape[kernels::SHAPE_FLAGS] |= kernels::FLAG_TARGET_F16;
                        h.as_ptr().cast()
                    }
                },
            ),
        };
        let draft_probs: *const f32 = match batch.draft {
            Some(Rows {
                values: Values::F32(d),
                ..
            }) => d.as_ptr(),
            Some(Rows {
                values: Values::Half(h),
                stride,
            }) => {
                shape[kernels::SHAPE_DRAFT_STRIDE] = to_u32(stride)?;
                let (flag, ptr) = match h {
                    Half::Bf16(x) => (kernels::FLAG_DRAFT_BF16, x.as_ptr()),
                    Half::F16(x) => (kernels::FLAG_DRAFT_F16, x.as_ptr()),
                };
                shape[kernels::SHAPE_FLAGS] |= kernels::FLAG_DRAFT_PROBS | flag;
                ptr.cast()
            }
            None => core::ptr::null(),
        };
        let methods: Option<Vec<u32>> = batch
            .methods
            .map(|m| m.iter().map(|&m| kernels::method_code(m)).collect());
        let p = Params {
            shape: shape.as_ptr(),
            k: batch.k().as_ptr(),
            draft_ids: batch.draft_ids.as_ptr(),
            draft_probs,
            target_probs,
            seed: batch.seed.as_ptr(),
            offset: batch.offset.as_ptr(),
            eps: eps.as_ptr(),
            delta: delta.as_ptr(),
            accepted: out.accepted.as_mut_ptr(),
            tokens: out.tokens.as_mut_ptr(),
            stats: core::ptr::null_mut(),
            scratch: core::ptr::null_mut(),
        };
        let x = Inputs {
            cu,
            bonus,
            logits,
            temperature: batch
                .target
                .temperature()
                .map_or(core::ptr::null(), <[f32]>::as_ptr),
            methods: methods
                .as_deref()
                .map_or(core::ptr::null(), <[u32]>::as_ptr),
            top_k: batch.top_k.map_or(core::ptr::null(), <[u32]>::as_ptr),
            top_p: batch.top_p.map_or(core::ptr::null(), <[f32]>::as_ptr),
            min_p: batch.min_p.map_or(core::ptr::null(), <[f32]>::as_ptr),
            recovered,
        };
        let plain = x.logits.is_null()
            && x.methods.is_null()
            && x.top_k.is_null()
            && x.top_p.is_null()
            && x.min_p.is_null()
            && x.recovered.is_null()
            && shape[kernels::SHAPE_FLAGS] & !kernels::FLAG_DRAFT_PROBS == 0;
        let rc = if plain {
            // SAFETY: `validate` checked every slice length against the shape and the layout
            // (ids B·k_max or num_tokens, probs rows × stride, seeds/offsets/eps/delta/cu/bonus
            // B, outputs B and B·(k_max+1)); grid = B.
            unsafe { self.launch_raw_ex(to_u32(b)?, &shape, &p, cu, bonus) }
        } else {
            // SAFETY: as above; `validate` also checked the logits (binary32 or half, in the
            // target layout) and the half draft rows against the layout, the temperatures,
            // methods and filter parameters against B; `recovered` is null or was checked
            // against the draft slots by the caller (`validate_recovered`).
            unsafe { self.launch_raw_inputs(to_u32(b)?, &shape, &p, &x) }
        };
        if rc == DIVERGED {
            return Err(KernelHostError::BarrierDivergence);
        }
        if rc != 0 {
            return Err(KernelHostError::BadBlock {
                block: self.block,
                warp: self.mode.warp_size(),
            });
        }
        let after = self.error_flags();
        if after != before {
            return Err(KernelHostError::DeviceFlags(after));
        }
        Ok(())
    }
}

impl<const K: usize> Verifier<K> for KernelHost<K> {
    type Error = KernelHostError;

    fn verify(
        &mut self,
        method: Method,
        check: Check,
        batch: &Batch<'_>,
        out: &mut Outputs<'_>,
    ) -> Result<(), KernelHostError> {
        // The recovered-token output (`Outputs::with_recovered`) goes to the logits entries'
        // `recovered` parameter; its length is checked by `launch_verify`'s validation.
        let recovered = out
            .recovered
            .as_deref_mut()
            .map_or(core::ptr::null_mut(), <[u32]>::as_mut_ptr);
        self.launch_verify(method, check, batch, out, recovered)
    }

    fn totals(&mut self) -> Result<Counters<K>, KernelHostError> {
        kernels::counters_from_stats(&self.stats).ok_or(KernelHostError::TooLarge)
    }

    /// Everything: `k = 0`, the ragged layout and caller-supplied bonus tokens (through
    /// `specula_verify_ex` / `specula_verify_split_ex`), and target logits with per-request
    /// temperature, bf16 / f16 inputs, per-request methods, sampling filters and the
    /// recovered-token output (through `specula_verify_logits` / `specula_verify_split_logits`).
    fn support(&self) -> Support {
        Support::ALL
    }
}

// ---------------------------------------------------------------- token trees
// SAFETY: both symbols are defined by tests/kernel_host/launch.cpp (compiled by build.rs) with
// exactly this signature.
unsafe extern "C" {
    fn specula_host_verify_tree_cuda(
        grid: u32,
        block: u32,
        shape: *const u32,
        nodes: *const u32,
        tree_tokens: *const u32,
        first_child: *const i32,
        next_sibling: *const i32,
        draft_probs: *const f32,
        target_probs: *const f32,
        seed: *const u64,
        offset: *const u64,
        eps: *const f32,
        delta: *const f32,
        accepted: *mut u32,
        path: *mut u32,
        tokens: *mut u32,
        stats: *mut u64,
        target_logits: *const f32,
        temperature: *const f32,
    ) -> i32;
    fn specula_host_verify_tree_hip(
        grid: u32,
        block: u32,
        shape: *const u32,
        nodes: *const u32,
        tree_tokens: *const u32,
        first_child: *const i32,
        next_sibling: *const i32,
        draft_probs: *const f32,
        target_probs: *const f32,
        seed: *const u64,
        offset: *const u64,
        eps: *const f32,
        delta: *const f32,
        accepted: *mut u32,
        path: *mut u32,
        tokens: *mut u32,
        stats: *mut u64,
        target_logits: *const f32,
        temperature: *const f32,
    ) -> i32;
}

/// The tree entry's parameters as raw host pointers, in its order
/// ([`kernels::TREE_ENTRY`]): used by the host driver's tree launch
/// ([`crate::host_driver`]).
#[derive(Clone, Copy, Debug)]
pub struct TreeParams {
    /// Shape words ([`kernels::TREE_SHAPE_WORDS`]).
    pub shape: *const u32,
    /// Node counts.
    pub nodes: *const u32,
    /// Node tokens.
    pub tree_tokens: *const u32,
    /// First-child links.
    pub first_child: *const i32,
    /// Next-sibling links.
    pub next_sibling: *const i32,
    /// Draft rows, or null.
    pub draft_probs: *const f32,
    /// Target rows.
    pub target_probs: *const f32,
    /// Seeds.
    pub seed: *const u64,
    /// Offsets.
    pub offset: *const u64,
    /// `ε`.
    pub eps: *const f32,
    /// `δ`.
    pub delta: *const f32,
    /// Output: accepted path lengths.
    pub accepted: *mut u32,
    /// Output: accepted node indices.
    pub path: *mut u32,
    /// Output: emitted tokens.
    pub tokens: *mut u32,
    /// Counters and error word.
    pub stats: *mut u64,
    /// Target logits (the layout of `target_probs`, which is then not read), or null:
    /// probabilities.
    pub target_logits: *const f32,
    /// Per-request temperature (read only with `target_logits`), or null.
    pub temperature: *const f32,
}

/// Runs `grid` blocks of `block` threads of the tree entry compiled in `mode`. Returns the
/// launcher's status (0: ran).
///
/// # Safety
/// Every pointer in `p` must be valid for the extent the shape words (and `grid`) imply, as for
/// a device launch, and not accessed by anything else while the kernel runs.
pub unsafe fn launch_tree_params(mode: Mode, grid: u32, block: u32, p: &TreeParams) -> i32 {
    let f = match mode {
        Mode::Cuda => specula_host_verify_tree_cuda,
        Mode::Hip => specula_host_verify_tree_hip,
    };
    // SAFETY: the caller guarantees the pointers; `f` has exactly this signature.
    unsafe {
        f(
            grid,
            block,
            p.shape,
            p.nodes,
            p.tree_tokens,
            p.first_child,
            p.next_sibling,
            p.draft_probs,
            p.target_probs,
            p.seed,
            p.offset,
            p.eps,
            p.delta,
            p.accepted,
            p.path,
            p.tokens,
            p.stats,
            p.target_logits,
            p.temperature,
        )
    }
}

/// Why a host-executed tree verification did not run (or ran into a kernel error flag).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum TreeHostError {
    /// The batch failed the reference's validation; nothing ran and nothing was counted.
    Tree(specula_core::verify::VerifyError),
    /// The owned batch's vectors do not have the lengths its sizes imply, or a size does not
    /// fit a 32-bit shape word.
    Layout,
    /// The launcher refused the block size.
    BadBlock,
    /// The kernel raised error flags (`kernels::ERR_*` bits) on a validated batch.
    DeviceFlags(u64),
}

impl<const K: usize> KernelHost<K> {
    /// Launches `specula_verify_tree` on `d` WITHOUT host validation, exactly as the raw device
    /// path reads it (malformed trees reach the kernel's own checks), one block per request.
    /// Returns the error-flag word after the launch. The vectors' lengths are checked first
    /// (so the launch cannot read or write out of bounds whatever the links say).
    pub fn launch_tree(
        &mut self,
        method: Method,
        d: &crate::tree::TreeData,
        out: &mut crate::tree::TreeOut,
    ) -> Result<u64, TreeHostError> {
        let b = d.nodes.len();
        let slots = b * d.max_nodes;
        let w = b * (d.max_depth + 1);
        let rows_ok = |len: usize| len == slots * d.vocab;
        let ok = b > 0
            && d.tokens.len() == slots
            && d.first_child.len() == slots
            && d.next_sibling.len() == slots
            && rows_ok(d.target.len())
            && d.draft.as_ref().is_none_or(|x| rows_ok(x.len()))
            && [d.seed.len(), d.offset.len(), d.eps.len(), d.delta.len()] == [b; 4]
            && d.temperature.as_ref().is_none_or(|t| t.len() == b)
            && out.accepted.len() == b
            && out.path.len() == w
            && out.tokens.len() == w
            && d.max_nodes <= specula_core::verify::tree::MAX_TREE_NODES
            && d.max_depth < K.min(u32::MAX as usize);
        if !ok {
            return Err(TreeHostError::Layout);
        }
        let u = |x: usize| u32::try_from(x).map_err(|_| TreeHostError::Layout);
        let mut shape = [0u32; kernels::TREE_SHAPE_WORDS];
        shape[kernels::SHAPE_BATCH] = u(b)?;
        shape[kernels::SHAPE_K_MAX] = u(d.max_depth)?;
        shape[kernels::SHAPE_VOCAB] = u(d.vocab)?;
        shape[kernels::SHAPE_DRAFT_STRIDE] = u(d.vocab)?;
        shape[kernels::SHAPE_TARGET_STRIDE] = u(d.vocab)?;
        shape[kernels::SHAPE_METHOD] = kernels::method_code(method);
        shape[kernels::SHAPE_COUNTERS_K] = u(K)?;
        shape[kernels::SHAPE_FLAGS] = if d.draft.is_some() {
            kernels::FLAG_DRAFT_PROBS
        } else {
            0
        };
        shape[kernels::TREE_SHAPE_NODES] = u(d.max_nodes)?;
        // Target logits: `target` holds them (target_probs is then null).
        let lg = d.temperature.as_deref();
        let launcher = match self.mode {
            Mode::Cuda => specula_host_verify_tree_cuda,
            Mode::Hip => specula_host_verify_tree_hip,
        };
        // SAFETY: the lengths were checked above against the shape words (B requests, B·N node
        // slots and rows of stride V, B·(max_depth + 1) outputs, stats_words(K) stats words);
        // the kernel reads and writes nothing else, whatever the nodes and links hold.
        let rc = unsafe {
            launcher(
                u(b)?,
                self.block,
                shape.as_ptr(),
                d.nodes.as_ptr(),
                d.tokens.as_ptr(),
                d.first_child.as_ptr(),
                d.next_sibling.as_ptr(),
                d.draft.as_ref().map_or(core::ptr::null(), |x| x.as_ptr()),
                lg.map_or(d.target.as_ptr(), |_| core::ptr::null()),
                d.seed.as_ptr(),
                d.offset.as_ptr(),
                d.eps.as_ptr(),
                d.delta.as_ptr(),
                out.accepted.as_mut_ptr(),
                out.path.as_mut_ptr(),
                out.tokens.as_mut_ptr(),
                self.stats.as_mut_ptr(),
                lg.map_or(core::ptr::null(), |_| d.target.as_ptr()),
                lg.map_or(core::ptr::null(), <[f32]>::as_ptr),
            )
        };
        if rc != 0 {
            return Err(TreeHostError::BadBlock);
        }
        Ok(self.error_flags())
    }

    /// Tree verification as a backend runs it: the reference's validation
    /// ([`validate_tree`](specula_core::verify::tree::validate_tree)), then
    /// [`launch_tree`](Self::launch_tree); a new error flag on a validated batch is a kernel
    /// bug ([`TreeHostError::DeviceFlags`]).
    pub fn verify_tree(
        &mut self,
        method: Method,
        check: Check,
        d: &crate::tree::TreeData,
        out: &mut crate::tree::TreeOut,
    ) -> Result<(), TreeHostError> {
        specula_core::verify::tree::validate_tree::<K>(method, check, &d.view(), &out.view())
            .map_err(TreeHostError::Tree)?;
        let before = self.error_flags();
        let after = self.launch_tree(method, d, out)?;
        if after != before {
            return Err(TreeHostError::DeviceFlags(after));
        }
        Ok(())
    }
}
