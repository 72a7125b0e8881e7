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
use specula_core::gpu::{ArgBlock, ENTRY_NAMES, Entry, Family, Inputs, kernels};
use specula_core::verify::{
    AcceptedOut, Batch, Check, DEFAULT_DELTA, DEFAULT_EPS, Half, Method, Outputs, Rows, Support,
    Target, TokensOut, Values, Verifier, VerifyError, validate_recovered, validate_with,
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

// SAFETY: both symbols are defined by tests/kernel_host/launch.cpp (compiled by build.rs) with
// exactly this signature: two 32-bit unsigned ints (grid, block), the entry index, a pointer to
// the argument block `sp_args` (laid out as `ArgBlock`: the kernel text checks it), int result.
unsafe extern "C" {
    fn specula_host_verify_cuda(grid: u32, block: u32, entry: u32, args: *const ArgBlock) -> i32;
    fn specula_host_verify_hip(grid: u32, block: u32, entry: u32, args: *const ArgBlock) -> i32;
}

/// The launcher's index of the first tree entry (after the chain entries, indexed as
/// [`ENTRY_NAMES`]): tree entry `i` of [`kernels::TREE_ENTRY_NAMES`] (binary32 rows, half rows;
/// `TreeLaunch::entry_index`) is `TREE_ENTRY_INDEX + i`.
pub const TREE_ENTRY_INDEX: u32 = ENTRY_NAMES.len() as u32;

/// Every entry point the launcher runs, indexed as it takes them: [`ENTRY_NAMES`], then
/// [`kernels::TREE_ENTRY_NAMES`] from [`TREE_ENTRY_INDEX`] on.
pub const LAUNCHER_ENTRY_NAMES: [&str; ENTRY_NAMES.len() + kernels::TREE_ENTRY_NAMES.len()] = {
    let mut names = [""; ENTRY_NAMES.len() + kernels::TREE_ENTRY_NAMES.len()];
    let mut i = 0;
    while i < names.len() {
        names[i] = if i < ENTRY_NAMES.len() {
            ENTRY_NAMES[i]
        } else {
            kernels::TREE_ENTRY_NAMES[i - ENTRY_NAMES.len()]
        };
        i += 1;
    }
    names
};

/// A host slice's address as the argument block holds it.
#[must_use]
pub fn at<T>(s: &[T]) -> u64 {
    s.as_ptr() as usize as u64
}

/// A host slice's address as the argument block holds it, for an output.
#[must_use]
pub fn at_mut<T>(s: &mut [T]) -> u64 {
    s.as_mut_ptr() as usize as u64
}

/// Runs `grid` blocks of `block` threads of entry point `entry` (an index of
/// [`LAUNCHER_ENTRY_NAMES`]) of the kernel text compiled in `mode`, with the argument block `a`.
/// Returns the launcher's status (0: ran; 1: a block size or entry the launcher refuses).
///
/// # Safety
/// Every address in `a` must be null or valid for the extent the shape words (and `grid`)
/// imply, as for a device launch, and not accessed by anything else while the kernel runs.
pub unsafe fn launch_block(mode: Mode, grid: u32, block: u32, entry: u32, a: &ArgBlock) -> i32 {
    let f = match mode {
        Mode::Cuda => specula_host_verify_cuda,
        Mode::Hip => specula_host_verify_hip,
    };
    // SAFETY: the caller guarantees the addresses; `f` has exactly this signature and reads the
    // block before it returns.
    unsafe { f(grid, block, entry, a) }
}

// SAFETY: both symbols are defined by tests/kernel_host/launch.cpp (compiled by build.rs) with
// exactly this signature: `n` values read from `l` (binary32) or `bits` (f16, when `f16`), four
// floats per value written to `out` and one to `p`.
unsafe extern "C" {
    fn specula_host_race_bound_cuda(
        l: *const f32,
        bits: *const u16,
        n: u32,
        t: f32,
        m: f32,
        theta: u32,
        s: f64,
        f16: bool,
        out: *mut f32,
        p: *mut f32,
    );
    fn specula_host_race_bound_hip(
        l: *const f32,
        bits: *const u16,
        n: u32,
        t: f32,
        m: f32,
        theta: u32,
        s: f64,
        f16: bool,
        out: *mut f32,
        p: *mut f32,
    );
}

/// A logit row for [`race_bound`]: binary32 values, or f16 bit patterns.
#[derive(Clone, Copy, Debug)]
pub enum BoundRow<'a> {
    /// Binary32 logits.
    F32(&'a [f32]),
    /// F16 logits (bit patterns).
    F16(&'a [u16]),
}

/// What the race's skip test reads of one id of a logit row ([`race_bound`]).
#[derive(Clone, Copy, Debug)]
pub struct RaceBound {
    /// The weight's upper bound (`sp_weight_ub`).
    pub u: f32,
    /// The exact weight `e = exp_p(RN(l / T) − m)` before the threshold (`sp_soft_e`).
    pub e: f32,
    /// The scaled bound `u × sinv` the skip test compares.
    pub pu: f32,
    /// Whether `pu` lies below the row's `wcut` (the kernel's claim that `p ≤ 0`).
    pub none: bool,
    /// The exact probability (`sp_scale` of `sp_weight`, the threshold applied).
    pub p: f32,
}

/// The race's skip-test values of every id of a logit row at temperature `t` with softmax
/// maximum `m` (the maximum of `RN(l / t)` over the row, the kernel's precondition), threshold
/// `theta` (a key, 0: none) and kept mass `s`, computed by the kernel text compiled in `mode`.
#[must_use]
pub fn race_bound(
    mode: Mode,
    row: BoundRow<'_>,
    t: f32,
    m: f32,
    theta: u32,
    s: f64,
) -> Vec<RaceBound> {
    let (l, bits, n, f16) = match row {
        BoundRow::F32(v) => (v.as_ptr(), std::ptr::null(), v.len(), false),
        BoundRow::F16(v) => (std::ptr::null(), v.as_ptr(), v.len(), true),
    };
    let n32 = u32::try_from(n).expect("a row below 2^32 ids");
    let mut out = vec![0f32; 4 * n];
    let mut p = vec![0f32; n];
    let f = match mode {
        Mode::Cuda => specula_host_race_bound_cuda,
        Mode::Hip => specula_host_race_bound_hip,
    };
    // SAFETY: `l` or `bits` (the one `f16` selects) holds `n` values, `out` 4n and `p` n floats,
    // all live and unaliased for the call; the function reads and writes nothing else.
    unsafe {
        f(
            l,
            bits,
            n32,
            t,
            m,
            theta,
            s,
            f16,
            out.as_mut_ptr(),
            p.as_mut_ptr(),
        )
    };
    (0..n)
        .map(|i| RaceBound {
            u: out[4 * i],
            e: out[4 * i + 1],
            pu: out[4 * i + 2],
            none: out[4 * i + 3] != 0.0,
            p: p[i],
        })
        .collect()
}

// SAFETY: both symbols are defined by tests/kernel_host/launch.cpp (compiled by build.rs) with
// exactly this signature: `n` binary32 values read from `l`, 512 u64 written to `hist` and 4 to
// `out`, a u64 result.
unsafe extern "C" {
    fn specula_host_filter_pass_cuda(
        l: *const f32,
        n: u32,
        t: f32,
        m: f32,
        mode: u32,
        level: u32,
        prefix: u32,
        floor: u32,
        block: u32,
        hist: *mut u64,
        out: *mut u64,
    ) -> u64;
    fn specula_host_filter_pass_hip(
        l: *const f32,
        n: u32,
        t: f32,
        m: f32,
        mode: u32,
        level: u32,
        prefix: u32,
        floor: u32,
        block: u32,
        hist: *mut u64,
        out: *mut u64,
    ) -> u64;
}

/// Which result one pass of the filters computes ([`filter_pass`]; the kernel's `SP_FP_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FilterPassMode {
    /// The largest key (`out[0]`).
    Max = 0,
    /// The count histogram by key digit (word 0 of each bin).
    Count = 1,
    /// The mass histogram by key digit (word 0: the sum of the scaled values, word 1: the
    /// saturated weights).
    MassHist = 2,
    /// The kept mass of the keys at or above the floor, as four limb sums (`out`).
    Mass = 3,
}

/// What one filter pass left ([`filter_pass`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FilterPass {
    /// The histogram's 256 bins, two words each (the kernel's shared memory after the pass).
    pub hist: Vec<u64>,
    /// The pass's result words (modes [`FilterPassMode::Max`] and [`FilterPassMode::Mass`]).
    pub out: [u64; 4],
    /// How many ids the pass took the exact weight of in its sparse passes' cold region.
    pub exact: u64,
}

/// One pass of the filters' radix descent (`sp_filter_pass`) over a binary32 logit row at
/// temperature `t` with softmax maximum `m` (the largest `RN(l / t)`, the kernel's
/// precondition), at descent `level` under `prefix` with `floor`, on one block of `block`
/// threads, computed by the kernel text compiled in `mode`. `None` when `block` is not a
/// launchable size or the launch failed.
#[must_use]
#[allow(clippy::too_many_arguments)]
pub fn filter_pass(
    mode: Mode,
    l: &[f32],
    t: f32,
    m: f32,
    pass: FilterPassMode,
    level: u32,
    prefix: u32,
    floor: u32,
    block: u32,
) -> Option<FilterPass> {
    let n = u32::try_from(l.len()).expect("a row below 2^32 ids");
    let mut hist = vec![0u64; 512];
    let mut out = [0u64; 4];
    let f = match mode {
        Mode::Cuda => specula_host_filter_pass_cuda,
        Mode::Hip => specula_host_filter_pass_hip,
    };
    // SAFETY: `l` holds `n` values, `hist` 512 and `out` 4 words, all live and unaliased for
    // the call; the function reads and writes nothing else.
    let exact = unsafe {
        f(
            l.as_ptr(),
            n,
            t,
            m,
            pass as u32,
            level,
            prefix,
            floor,
            block,
            hist.as_mut_ptr(),
            out.as_mut_ptr(),
        )
    };
    (exact != u64::MAX).then_some(FilterPass { hist, out, exact })
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

unsafe extern "C" {
    fn specula_host_softmax_terms_cuda(
        t: f32,
        m: f32,
        l: *const f32,
        n: u64,
        q: *mut u32,
        w: *mut u64,
        e: *mut u32,
    ) -> i32;
    fn specula_host_softmax_terms_hip(
        t: f32,
        m: f32,
        l: *const f32,
        n: u64,
        q: *mut u32,
        w: *mut u64,
        e: *mut u32,
    ) -> i32;
}

/// The softmax passes' per-id steps as the kernel text computes them ([`softmax_terms`]).
#[derive(Clone, Debug)]
pub struct SoftmaxTerms {
    /// The bits of the sum pass's quotient without a division (`sp_quot`), per logit.
    pub quot: Vec<u32>,
    /// The bits of `sp_soft_e`'s quotient without a division (`sp_quot2`), per logit.
    pub quot2: Vec<u32>,
    /// The sum pass's term `floor(exp_p(q - m) 2^64)`, per logit.
    pub terms: Vec<u128>,
    /// The bits of `sp_soft_e(l, t, m)` (`exp_p(RN(l / t) - m)` as every other pass reads it).
    pub e: Vec<u32>,
    /// Whether the passes take those quotients for this row (`rc.ok`; otherwise they divide).
    pub ok: bool,
}

/// The softmax passes' per-id steps, as the kernel text compiled in `mode` computes them, for
/// the logits `l` of a row at temperature `t` whose largest quotient is `m`.
#[must_use]
pub fn softmax_terms(mode: Mode, t: f32, m: f32, l: &[f32]) -> SoftmaxTerms {
    let mut q = vec![0u32; 2 * l.len()];
    let mut w = vec![0u64; 2 * l.len()];
    let mut e = vec![0u32; l.len()];
    let f = match mode {
        Mode::Cuda => specula_host_softmax_terms_cuda,
        Mode::Hip => specula_host_softmax_terms_hip,
    };
    // SAFETY: `l` holds `l.len()` floats, `q` and `w` twice as many u32 / u64, `e` as many u32,
    // each valid and unaliased for the call; the function reads and writes only those.
    let ok = unsafe {
        f(
            t,
            m,
            l.as_ptr(),
            l.len() as u64,
            q.as_mut_ptr(),
            w.as_mut_ptr(),
            e.as_mut_ptr(),
        )
    };
    SoftmaxTerms {
        quot: q.iter().step_by(2).copied().collect(),
        quot2: q.iter().skip(1).step_by(2).copied().collect(),
        terms: w
            .chunks_exact(2)
            .map(|p| (u128::from(p[0]) << 32) + u128::from(p[1]))
            .collect(),
        e,
        ok: ok != 0,
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
        if block == 0 || block > MAX_BLOCK_THREADS || block % warp != 0 {
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
    /// `grid` is the capacity in requests; with [`slices`](Self::slices) > 1 the split entry of
    /// `family` runs on `grid · slices` blocks with scratch sized for `grid` requests and
    /// `shape`'s `k_max`. `a`'s `shape`, `stats`, `scratch` and `slices` are set here (`shape`,
    /// the host's counters and scratch, its slices). Returns the launcher's status (0: ran).
    ///
    /// # Safety
    /// Every other address in `a` must be null or valid for the extent the shape words (and
    /// `grid`) imply, as for a device launch.
    pub unsafe fn launch_raw(
        &mut self,
        grid: u32,
        shape: &[u32; kernels::SHAPE_WORDS],
        family: Family,
        a: ArgBlock,
    ) -> i32 {
        let (blocks, scratch) = self.grid_and_scratch(grid, shape);
        let entry = if self.slices > 1 {
            Entry::Split {
                slices: self.slices,
            }
        } else {
            Entry::Single
        };
        let a = ArgBlock {
            shape: at(shape),
            stats: at_mut(&mut self.stats),
            scratch,
            slices: self.slices,
            ..a
        };
        // SAFETY: the caller guarantees the other addresses; `shape`, `self.stats` and the
        // scratch are live and sized for the kernel (8 shape words; stats_words(K) stats words,
        // with shape[COUNTERS_K] set by the caller to K or less; split_scratch_words per request
        // of `grid`, zero as the kernel leaves them).
        unsafe {
            launch_block(
                self.mode,
                blocks,
                self.block,
                entry.index(family) as u32, // < ENTRY_NAMES.len()
                &a,
            )
        }
    }

    /// Blocks to launch for `grid` requests, and the split entry's scratch (null for one slice).
    fn grid_and_scratch(&mut self, grid: u32, shape: &[u32; kernels::SHAPE_WORDS]) -> (u32, u64) {
        if self.slices > 1 {
            let words = kernels::split_scratch_words(
                shape[kernels::SHAPE_K_MAX] as usize,
                self.slices as usize,
            );
            let len = words.saturating_mul(grid as usize);
            if self.scratch.len() < len {
                self.scratch.resize(len, 0);
            }
            (grid.saturating_mul(self.slices), at_mut(&mut self.scratch))
        } else {
            (grid, 0)
        }
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
        self.launch_verify(method, check, batch, out, at_mut(recovered))
    }

    /// Validates `batch` and `out`, then launches: the ex entries for a batch with none of the
    /// logits entries' inputs, the logits entries otherwise (or when `recovered` is not null).
    fn launch_verify(
        &mut self,
        method: Method,
        check: Check,
        batch: &Batch<'_>,
        out: &mut Outputs<'_>,
        recovered: u64,
    ) -> Result<(), KernelHostError> {
        validate_with::<K>(self.support(), method, check, batch, out)?;
        // Device outputs were refused by the validation above.
        let (AcceptedOut(accepted), TokensOut(tokens), _) = out.host()?;
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
        let opt = |v: Option<&[u32]>| v.map_or(0, at);
        let optf = |v: Option<&[f32]>| v.map_or(0, at);
        // Target logits, binary32 or half (the address then holds u16 elements); the logits
        // entry reads the logits instead of the probabilities (null, as it documents).
        let (target_probs, target_logits) = match batch.target {
            Target::Probs(r) => (optf(r.as_f32()), 0),
            Target::Logits { rows, .. } => (
                0,
                match rows.values {
                    Values::F32(l) => at(l),
                    Values::Half(Half::Bf16(h)) => {
                        shape[kernels::SHAPE_FLAGS] |= kernels::FLAG_TARGET_BF16;
                        at(h)
                    }
                    Values::Half(Half::F16(h)) => {
                        shape[kernels::SHAPE_FLAGS] |= kernels::FLAG_TARGET_F16;
                        at(h)
                    }
                    // Refused by validation (`Support::ALL`: host memory only).
                    Values::Device(_) => 0,
                },
            ),
        };
        let draft_probs = match batch.draft.map(|d| d.rows) {
            Some(Rows {
                values: Values::F32(d),
                ..
            }) => at(d),
            Some(Rows {
                values: Values::Half(h),
                stride,
            }) => {
                shape[kernels::SHAPE_DRAFT_STRIDE] = to_u32(stride)?;
                let (flag, ptr) = match h {
                    Half::Bf16(x) => (kernels::FLAG_DRAFT_BF16, at(x)),
                    Half::F16(x) => (kernels::FLAG_DRAFT_F16, at(x)),
                };
                shape[kernels::SHAPE_FLAGS] |= kernels::FLAG_DRAFT_PROBS | flag;
                ptr
            }
            // Device rows: refused by validation (`Support::ALL`: host memory only).
            Some(Rows {
                values: Values::Device(_),
                ..
            })
            | None => 0,
        };
        let sampling: Option<Vec<u32>> = kernels::has_sampling(batch).then(|| {
            (0..b)
                .flat_map(|r| kernels::sampling_words(batch, r, method))
                .collect()
        });
        let a = ArgBlock {
            k: at(batch.k()),
            draft_ids: at(batch.draft_ids),
            draft_probs,
            target_probs,
            seed: at(batch.seed),
            offset: at(batch.offset),
            eps: at(&eps),
            delta: at(&delta),
            accepted: at_mut(accepted),
            tokens: at_mut(tokens),
            cu_num_draft_tokens: opt(batch.cu_num_draft_tokens()),
            bonus: opt(batch.bonus),
            target_logits,
            temperature: optf(batch.target.temperature()),
            sampling: opt(sampling.as_deref()),
            recovered,
            draft_first_row: opt(batch.draft.and_then(|d| d.first_row)),
            ..ArgBlock::default()
        };
        // The entry the GPU orchestration would pick for the same inputs.
        let family = Inputs::of_block(&a, shape[kernels::SHAPE_FLAGS]).family();
        // SAFETY: `validate` checked every slice length against the shape and the layout (ids
        // B·k_max or num_tokens, probs rows × stride, seeds/offsets/eps/delta/cu/bonus B,
        // outputs B and B·(k_max+1)), the logits (binary32 or half, in the target layout) and
        // the half draft rows against the layout, the temperatures, methods and filter
        // parameters against B; `recovered` is null or was checked against the draft slots by
        // the caller (`validate_recovered`); grid = B.
        let rc = unsafe { self.launch_raw(to_u32(b)?, &shape, family, a) };
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
        let recovered = match out {
            Outputs::Host {
                recovered: Some(r), ..
            } => at_mut(r),
            _ => 0,
        };
        self.launch_verify(method, check, batch, out, recovered)
    }

    fn totals(&mut self) -> Result<Counters<K>, KernelHostError> {
        kernels::counters_from_stats(&self.stats).ok_or(KernelHostError::TooLarge)
    }

    /// Everything: `k = 0`, the ragged layout and caller-supplied bonus tokens (through
    /// `specula_verify` / `specula_verify_split`), and target logits with per-request
    /// temperature, bf16 / f16 inputs, per-request methods, sampling filters and the
    /// recovered-token output (through `specula_verify_logits` / `specula_verify_split_logits`).
    fn support(&self) -> Support {
        Support::ALL
    }
}

// ---------------------------------------------------------------- token trees
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
    /// Launches `specula_verify_tree` (binary32 rows) on `d` WITHOUT host validation, exactly as the raw device
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
        let a = ArgBlock {
            shape: at(&shape),
            k: at(&d.nodes),
            draft_ids: at(&d.tokens),
            first_child: at(&d.first_child),
            next_sibling: at(&d.next_sibling),
            draft_probs: d.draft.as_deref().map_or(0, at),
            target_probs: if lg.is_some() { 0 } else { at(&d.target) },
            seed: at(&d.seed),
            offset: at(&d.offset),
            eps: at(&d.eps),
            delta: at(&d.delta),
            accepted: at_mut(&mut out.accepted),
            path: at_mut(&mut out.path),
            tokens: at_mut(&mut out.tokens),
            stats: at_mut(&mut self.stats),
            target_logits: if lg.is_some() { at(&d.target) } else { 0 },
            temperature: lg.map_or(0, at),
            slices: 1,
            ..ArgBlock::default()
        };
        // SAFETY: the lengths were checked above against the shape words (B requests, B·N node
        // slots and rows of stride V, B·(max_depth + 1) outputs, stats_words(K) stats words);
        // the kernel reads and writes nothing else, whatever the nodes and links hold.
        let rc = unsafe { launch_block(self.mode, u(b)?, self.block, TREE_ENTRY_INDEX, &a) };
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
