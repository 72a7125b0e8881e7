//! Verification steps from candle tensors (feature `candle`): a candle engine hands over its
//! target logits (or probabilities) and draft probabilities as [`Tensor`]s and gets its tokens
//! back as tensors, without flattening strides, dtypes or per-request fields itself.
//!
//! Two levels:
//!
//! - [`Step`], owned and reusable (keep one in the engine's struct): [`push`](Step::push) each
//!   request's drafts, sampling parameters and random stream, [`verify`](Step::verify) the
//!   step's tensors in vLLM's ragged layout, read the tokens per request
//!   ([`emitted`](Step::emitted)) or as a tensor ([`vllm_tokens`](Step::vllm_tokens)).
//! - [`rows`] and [`ids`], for a [`Batch`] built by hand: each borrows a tensor's storage
//!   (candle keeps it behind a lock) for as long as the returned view lives, and lends its data
//!   as the [`Rows`] / `&[u32]` a [`Batch`] takes. Drop the views after the verify call.
//!
//! Tensors are in f32, bf16 or f16 (ids: u32), row-major with any row stride (`[rows, V]`, or
//! `[B, k_max + 1, V]` and other shapes whose leading dimensions merge into rows of one stride),
//! on the CPU, or, with the `candle-cuda` feature, a step's target and draft rows on the CUDA
//! device of a CUDA verifier (`TensorVerifier::cuda_driver`: `Backend::Cuda`, a
//! `CudaVerifier`), which reads them in place: no host copy of the rows; the outputs (a few
//! words per request) come back to the host as with CPU tensors, one wait per step. Any other
//! placement (Metal, a CUDA tensor for a host verifier or without that feature) is refused with
//! [`TensorErrorKind::NotOnCpu`]; copy such a tensor with `to_device(&Device::Cpu)`.
//!
//! ```
//! use specula::candle::{Request, Sampling, Step, TargetTensor};
//! use specula::candle_core::{DType, Device, Tensor};
//! use specula::cpu::CpuVerifier;
//! use specula::specula_core::verify::{Check, Method};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut verifier = CpuVerifier::<4>::new(1)?;
//! let mut step = Step::new();
//! // Two requests: one drafts [2, 0], the other had no draft this step (k = 0).
//! step.push(Request { drafts: &[2, 0], sampling: Sampling::GREEDY, seed: 7, offset: 0, draft_rows: true });
//! step.push(Request { drafts: &[], sampling: Sampling::GREEDY, seed: 8, offset: 0, draft_rows: true });
//! // vLLM's ragged target rows: num_tokens + B = 4 rows of V = 4 bf16 logits.
//! let logits = Tensor::new(
//!     &[[0f32, 0., 5., 0.], [5., 0., 0., 0.], [0., 0., 0., 5.], [0., 5., 0., 0.]],
//!     &Device::Cpu,
//! )?
//! .to_dtype(DType::BF16)?;
//! step.verify(&mut verifier, Method::Greedy, Check::Cheap, TargetTensor::Logits(&logits), None)?;
//! let emitted: Vec<&[u32]> = step.emitted().collect();
//! assert_eq!(emitted, [&[2, 0, 3][..], &[1][..]]);
//! let vllm = step.vllm_tokens(&Device::Cpu)?; // [B, k_max + 1] i32, -1-padded
//! assert_eq!(vllm.to_vec2::<i32>()?, [[2, 0, 3], [1, -1, -1]]);
//! # Ok(())
//! # }
//! ```

use crate::OutputBuffers;
use crate::backend::Backend;
use crate::cpu::CpuVerifier;
use crate::half_tensors;
use candle_core::{CpuStorage, DType, Device, DeviceLocation, Shape, Storage, Tensor};
use specula_core::verify::{
    Batch, Check, Filter, Method, NO_DRAFT_ROWS, RaggedDrafts, Rows, SENTINEL, Streams, Target,
    Verifier, VerifyError, to_vllm_tokens,
};
use std::fmt;
use std::sync::RwLockReadGuard;

/// Which tensor a [`TensorError`] is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Role {
    /// The target model's logits.
    TargetLogits,
    /// The target model's probabilities.
    TargetProbs,
    /// The draft model's probabilities.
    DraftProbs,
    /// Draft token ids.
    DraftIds,
    /// vLLM's `cu_num_draft_tokens`.
    CuNumDraftTokens,
    /// The accepted counts, as an output tensor.
    Accepted,
    /// The emitted tokens, as an output tensor.
    Tokens,
    /// The recovered tokens, as an output tensor.
    Recovered,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::TargetLogits => "target logits",
            Self::TargetProbs => "target probabilities",
            Self::DraftProbs => "draft probabilities",
            Self::DraftIds => "draft ids",
            Self::CuNumDraftTokens => "cu_num_draft_tokens",
            Self::Accepted => "accepted counts",
            Self::Tokens => "output tokens",
            Self::Recovered => "recovered tokens",
        })
    }
}

/// What is wrong with a tensor (see [`TensorError`]).
#[derive(Debug)]
#[non_exhaustive]
pub enum TensorErrorKind {
    /// The tensor lives where this call cannot read it in place: on a Metal device, or on a
    /// CUDA device for a [`rows`] view, a host verifier or a build without the `candle-cuda`
    /// feature ([`Step::verify`] reads CUDA rows with a CUDA verifier of that device). Copy the
    /// tensor to the CPU first (`to_device(&Device::Cpu)`).
    NotOnCpu(DeviceLocation),
    /// The element type is not one this input takes (rows: f32, bf16, f16; ids: u32).
    DType {
        /// The tensor's element type.
        got: DType,
        /// The element types accepted.
        expected: &'static [DType],
    },
    /// The tensor has the wrong number of dimensions (rows: at least 1; ids: exactly 1).
    Rank {
        /// The tensor's dimensions.
        dims: Vec<usize>,
    },
    /// The tensor is not rows of unit-stride values at one row stride `≥ V` (a transposed or
    /// broadcast tensor, say): call `contiguous()` on it first.
    NotRowMajor {
        /// The tensor's dimensions.
        dims: Vec<usize>,
        /// Its strides, in elements.
        stride: Vec<usize>,
    },
    /// The rows at their stride (`rows × stride` values from the tensor's start, the span a
    /// [`Batch`] reads) run past the end of the tensor's storage: the last row's padding is
    /// not there. Call `contiguous()` on it first.
    OutsideStorage {
        /// Values needed from the tensor's start offset.
        needed: usize,
        /// Values the storage holds from that offset.
        available: usize,
    },
    /// The draft probabilities' last dimension is not the target's vocabulary size.
    VocabMismatch {
        /// The target's vocabulary size.
        target: usize,
        /// The draft's.
        draft: usize,
    },
    /// No step has been verified since the last [`Step::clear`] or refused verification (or,
    /// for recovered tokens, the step has no such output), so there is nothing to read.
    NotVerified,
    /// A token does not fit vLLM's `i32` layout ([`VerifyError::VllmTokenRange`]).
    Vllm(VerifyError),
    /// candle refused to make the output tensor (on the device asked for, say).
    Candle(candle_core::Error),
}

/// A tensor that cannot be verified as given, or an output tensor that could not be made:
/// which tensor ([`Role`]) and why ([`TensorErrorKind`]).
///
/// ```
/// use specula::candle::{Role, TensorErrorKind, rows};
/// use specula::candle_core::{Device, Tensor};
/// let ids = Tensor::new(&[1u32, 2], &Device::Cpu).unwrap();
/// let err = rows(&ids, Role::TargetLogits).unwrap_err();
/// assert_eq!(err.role, Role::TargetLogits);
/// assert!(matches!(err.kind, TensorErrorKind::DType { .. }));
/// assert!(err.to_string().starts_with("target logits: element type U32"));
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub struct TensorError {
    /// Which tensor.
    pub role: Role,
    /// What is wrong with it.
    pub kind: TensorErrorKind,
}

impl TensorError {
    fn new(role: Role, kind: TensorErrorKind) -> Self {
        Self { role, kind }
    }
}

impl fmt::Display for TensorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.role)?;
        match &self.kind {
            TensorErrorKind::NotOnCpu(at) => write!(
                f,
                "the tensor is on {at:?}, which this call does not read in place (CUDA rows: \
                 Step::verify with a CUDA verifier and the candle-cuda feature); copy it with \
                 to_device(&Device::Cpu)"
            ),
            TensorErrorKind::DType { got, expected } => {
                write!(f, "element type {got:?}, expected one of {expected:?}")
            }
            TensorErrorKind::Rank { dims } => write!(f, "wrong number of dimensions: {dims:?}"),
            TensorErrorKind::NotRowMajor { dims, stride } => write!(
                f,
                "dimensions {dims:?} with strides {stride:?} are not rows of one stride ≥ the \
                 last dimension with unit-stride values; call contiguous() first"
            ),
            TensorErrorKind::OutsideStorage { needed, available } => write!(
                f,
                "its rows at their stride need {needed} values from its start, the storage \
                 holds {available}; call contiguous() first"
            ),
            TensorErrorKind::VocabMismatch { target, draft } => write!(
                f,
                "vocabulary size {draft} differs from the target's, {target}"
            ),
            TensorErrorKind::NotVerified => f.write_str("no verified step to read"),
            TensorErrorKind::Vllm(e) => write!(f, "{e}"),
            TensorErrorKind::Candle(e) => write!(f, "candle: {e}"),
        }
    }
}

impl std::error::Error for TensorError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            TensorErrorKind::Candle(e) => Some(e),
            TensorErrorKind::Vllm(e) => Some(e),
            _ => None,
        }
    }
}

const FLOATS: &[DType] = &[DType::F32, DType::BF16, DType::F16];

/// Refuses a tensor that is not on the CPU, or (`cuda`) on a CUDA device (checked first:
/// where a tensor lives is the first thing to fix, and a refused tensor's storage is never
/// locked).
fn placed(t: &Tensor, role: Role, cuda: bool) -> Result<(), TensorError> {
    match t.device() {
        Device::Cpu => Ok(()),
        Device::Cuda(_) if cuda => Ok(()),
        d => Err(TensorError::new(
            role,
            TensorErrorKind::NotOnCpu(d.location()),
        )),
    }
}

/// Number of values in a storage of a float type this module reads (0 for any other).
fn float_len(s: &Storage) -> usize {
    match s {
        Storage::Cpu(CpuStorage::F32(v)) => v.len(),
        Storage::Cpu(CpuStorage::BF16(v)) => v.len(),
        Storage::Cpu(CpuStorage::F16(v)) => v.len(),
        #[cfg(feature = "candle-cuda")]
        Storage::Cuda(c) => cuda::float_len(c),
        _ => 0,
    }
}

/// A tensor's rows, borrowed from its storage (see [`rows`]); the storage stays read-locked
/// while this lives.
pub struct TensorRows<'t> {
    storage: RwLockReadGuard<'t, Storage>,
    start: usize,
    rows: usize,
    stride: usize,
    vocab: usize,
}

impl fmt::Debug for TensorRows<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TensorRows")
            .field("rows", &self.rows)
            .field("vocab", &self.vocab)
            .field("stride", &self.stride)
            .finish_non_exhaustive()
    }
}

impl TensorRows<'_> {
    /// The rows as a [`Batch`] takes them: f32 as binary32, bf16 / f16 as [`Half`] (no copy),
    /// starting at the tensor's first value, `rows × stride` values long.
    ///
    /// [`Half`]: specula_core::verify::Half
    #[must_use]
    pub fn rows(&self) -> Rows<'_> {
        // The function `rows` checked the span against this storage, and a read-locked storage
        // cannot change: `get` never fails here, and an empty slice (refused by validation as
        // too short) stands in rather than a panic if it somehow did.
        let span = self.start..self.start + self.rows * self.stride;
        match &*self.storage {
            Storage::Cpu(CpuStorage::BF16(v)) => Rows::half(
                half_tensors::bf16(v.get(span).unwrap_or_default()),
                self.stride,
            ),
            Storage::Cpu(CpuStorage::F16(v)) => Rows::half(
                half_tensors::f16(v.get(span).unwrap_or_default()),
                self.stride,
            ),
            Storage::Cpu(CpuStorage::F32(v)) => {
                Rows::f32(v.get(span).unwrap_or_default(), self.stride)
            }
            _ => Rows::f32(&[], self.stride),
        }
    }

    /// Number of rows (the product of the leading dimensions).
    #[must_use]
    pub fn len(&self) -> usize {
        self.rows
    }

    /// Whether there are no rows.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// The vocabulary size `V`: the last dimension.
    #[must_use]
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// The row stride, in values (`V` for a contiguous tensor).
    #[must_use]
    pub fn stride(&self) -> usize {
        self.stride
    }
}

/// Borrows `t`'s rows for a [`Batch`]: a CPU tensor of f32, bf16 or f16, whose last dimension
/// is the vocabulary (unit stride) and whose leading dimensions merge into rows of one stride
/// `≥ V` (`[rows, V]`, `[B, k_max + 1, V]`, a column slice of a wider tensor, …). `role` names
/// the tensor in errors. The storage stays read-locked until the view is dropped (a write to
/// the tensor, on any thread, waits until then): drop it after the verify call.
///
/// ```
/// use specula::candle::{Role, rows};
/// use specula::candle_core::{Device, Tensor};
/// // The first 3 of 4 columns: rows of 3 values at stride 4, no copy.
/// let wide = Tensor::arange(0f32, 8., &Device::Cpu)?.reshape((2, 4))?;
/// let first_three = wide.narrow(1, 0, 3)?;
/// let view = rows(&first_three, Role::TargetProbs)?;
/// assert_eq!((view.len(), view.vocab(), view.stride()), (2, 3, 4));
/// assert_eq!(view.rows().as_f32(), Some(&[0f32, 1., 2., 3., 4., 5., 6., 7.][..]));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// A [`TensorError`] naming `role`: not on the CPU, another dtype, no dimension, not
/// row-major, or rows whose span runs past the storage.
pub fn rows(t: &Tensor, role: Role) -> Result<TensorRows<'_>, TensorError> {
    rows_on(t, role, false)
}

/// [`rows`], also of a CUDA tensor with `cuda` (whose [`TensorRows::rows`] are then empty: a
/// CUDA verifier reads them in place, `cuda::Placed`).
fn rows_on(t: &Tensor, role: Role, cuda: bool) -> Result<TensorRows<'_>, TensorError> {
    let err = |kind| TensorError::new(role, kind);
    placed(t, role, cuda)?;
    if !FLOATS.contains(&t.dtype()) {
        return Err(err(TensorErrorKind::DType {
            got: t.dtype(),
            expected: FLOATS,
        }));
    }
    let storage = t.storage_and_layout().0;
    let layout = t.layout();
    let (dims, stride) = (layout.dims(), layout.stride());
    let not_row_major = || {
        err(TensorErrorKind::NotRowMajor {
            dims: dims.to_vec(),
            stride: stride.to_vec(),
        })
    };
    let Some((&vocab, lead)) = dims.split_last() else {
        return Err(err(TensorErrorKind::Rank {
            dims: dims.to_vec(),
        }));
    };
    if vocab > 1 && stride.last() != Some(&1) {
        return Err(not_row_major());
    }
    // The leading dimensions merge into rows of one stride when each (of size > 1) steps over
    // all the rows inside it; a dimension of size 1 is never stepped over, so its stride is
    // free (candle keeps whatever a narrow left there).
    let mut row_stride = None;
    let mut span = 0usize; // rows × row stride over the dimensions seen so far
    for (&d, &s) in lead.iter().zip(stride).rev() {
        if d == 1 {
            continue;
        }
        match row_stride {
            None => {
                if s < vocab {
                    return Err(not_row_major());
                }
                row_stride = Some(s);
            }
            Some(_) if s != span => return Err(not_row_major()),
            Some(_) => {}
        }
        span = s.checked_mul(d).ok_or_else(not_row_major)?;
    }
    let n_rows: usize = lead.iter().product();
    // One row (or none): its stride is never used, the values are packed.
    let row_stride = row_stride.unwrap_or(vocab);
    let needed = n_rows.checked_mul(row_stride).ok_or_else(not_row_major)?;
    let start = layout.start_offset();
    let available = float_len(&storage).saturating_sub(start);
    if needed > available {
        return Err(err(TensorErrorKind::OutsideStorage { needed, available }));
    }
    Ok(TensorRows {
        storage,
        start,
        rows: n_rows,
        stride: row_stride,
        vocab,
    })
}

/// A tensor's u32 values, borrowed from its storage (see [`ids`]).
pub struct TensorIds<'t> {
    storage: RwLockReadGuard<'t, Storage>,
    start: usize,
    len: usize,
}

impl fmt::Debug for TensorIds<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

impl TensorIds<'_> {
    /// The values.
    #[must_use]
    pub fn as_slice(&self) -> &[u32] {
        match &*self.storage {
            // The function `ids` checked the span against this read-locked storage (see
            // `TensorRows::rows`).
            Storage::Cpu(CpuStorage::U32(v)) => {
                v.get(self.start..self.start + self.len).unwrap_or_default()
            }
            _ => &[],
        }
    }
}

/// Borrows a one-dimensional u32 CPU tensor (draft ids, `cu_num_draft_tokens`) as a slice;
/// `role` names it in errors. Its storage stays read-locked while the view lives.
///
/// ```
/// use specula::candle::{Role, ids};
/// use specula::candle_core::{Device, Tensor};
/// let cu = Tensor::new(&[3u32, 5, 5], &Device::Cpu)?;
/// assert_eq!(ids(&cu, Role::CuNumDraftTokens)?.as_slice(), [3, 5, 5]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// A [`TensorError`] naming `role`: not on the CPU, not u32, not one-dimensional, or strided.
pub fn ids(t: &Tensor, role: Role) -> Result<TensorIds<'_>, TensorError> {
    let err = |kind| TensorError::new(role, kind);
    placed(t, role, false)?;
    if t.dtype() != DType::U32 {
        return Err(err(TensorErrorKind::DType {
            got: t.dtype(),
            expected: &[DType::U32],
        }));
    }
    let storage = t.storage_and_layout().0;
    let layout = t.layout();
    let &[len] = layout.dims() else {
        return Err(err(TensorErrorKind::Rank {
            dims: layout.dims().to_vec(),
        }));
    };
    if len > 1 && layout.stride() != [1] {
        return Err(err(TensorErrorKind::NotRowMajor {
            dims: layout.dims().to_vec(),
            stride: layout.stride().to_vec(),
        }));
    }
    let start = layout.start_offset();
    let available = match &*storage {
        Storage::Cpu(CpuStorage::U32(v)) => v.len().saturating_sub(start),
        _ => 0,
    };
    if len > available {
        return Err(err(TensorErrorKind::OutsideStorage {
            needed: len,
            available,
        }));
    }
    Ok(TensorIds {
        storage,
        start,
        len,
    })
}

/// A request's sampling parameters: its temperature and its [`Filter`] (top-k, top-p, min-p,
/// see [`Batch::with_filters`]). The default samples at temperature 1 without a filter.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// Temperature applied to the target logits (`0`: greedy); ignored for probabilities.
    pub temperature: f32,
    /// The sampling filter ([`Filter::NONE`]: off).
    pub filter: Filter,
}

impl Sampling {
    /// Temperature 1, no filter.
    pub const DEFAULT: Self = Self {
        temperature: 1.0,
        filter: Filter::NONE,
    };

    /// Temperature 0: greedy on the logits, whatever the method.
    pub const GREEDY: Self = Self {
        temperature: 0.0,
        ..Self::DEFAULT
    };
}

impl Default for Sampling {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// One request of a [`Step`].
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    /// This step's draft tokens (may be empty: the request only gets its bonus token).
    pub drafts: &'a [u32],
    /// Its sampling parameters.
    pub sampling: Sampling,
    /// Its random seed.
    pub seed: u64,
    /// Its random offset: the step counter of its stream, advanced by one after each verified
    /// step.
    pub offset: u64,
    /// Whether its drafter gave probability rows (a draft model: `true`; an n-gram or other
    /// drafter without probabilities: `false`, verified as a one-hot drafter). Mixed drafters
    /// need no synthetic rows: the step's draft tensor holds only the rows of the requests
    /// that have them, request after request.
    pub draft_rows: bool,
}

/// The target tensor of a [`Step`]: logits (sampled at each request's temperature) or
/// probabilities (verified as given).
#[derive(Clone, Copy, Debug)]
pub enum TargetTensor<'t> {
    /// Target logits.
    Logits(&'t Tensor),
    /// Target probabilities.
    Probs(&'t Tensor),
}

/// Why [`Step::verify`] failed: a tensor it could not take, or the verifier's refusal (a
/// malformed step, with nothing written or counted).
#[derive(Debug)]
#[non_exhaustive]
pub enum StepError<E> {
    /// A tensor could not be taken as given.
    Tensor(TensorError),
    /// The verifier refused the step.
    Verify(E),
}

impl<E> From<TensorError> for StepError<E> {
    fn from(e: TensorError) -> Self {
        Self::Tensor(e)
    }
}

impl<E: fmt::Display> fmt::Display for StepError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Tensor(e) => write!(f, "{e}"),
            Self::Verify(e) => write!(f, "verification refused the step: {e}"),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for StepError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Tensor(e) => Some(e),
            Self::Verify(e) => Some(e),
        }
    }
}

/// A verifier a [`Step`] hands candle tensors to: any host verifier (the CPU backend, and the
/// GPU backends, which copy host rows up), and with the `candle-cuda` feature the CUDA ones,
/// which read a CUDA tensor's rows in place.
pub trait TensorVerifier<const K: usize>: Verifier<K> {
    /// The CUDA driver whose device's tensors this verifier reads in place (`None`: CPU
    /// tensors only, the default).
    #[cfg(feature = "candle-cuda")]
    fn cuda_driver(&self) -> Option<&specula_cuda::CudaDriver> {
        None
    }
}

impl<const K: usize> TensorVerifier<K> for CpuVerifier<K> {}

impl<const K: usize> TensorVerifier<K> for Backend<K> {
    #[cfg(feature = "candle-cuda")]
    fn cuda_driver(&self) -> Option<&specula_cuda::CudaDriver> {
        match self {
            Self::Cuda(v) => Some(v.driver()),
            _ => None,
        }
    }
}

#[cfg(feature = "cuda")]
impl<const K: usize> TensorVerifier<K> for specula_cuda::CudaVerifier<K> {
    #[cfg(feature = "candle-cuda")]
    fn cuda_driver(&self) -> Option<&specula_cuda::CudaDriver> {
        Some(self.driver())
    }
}

#[cfg(feature = "rocm")]
impl<const K: usize> TensorVerifier<K> for specula_rocm::RocmVerifier<K> {}

/// candle's CUDA storage, read in place by a CUDA verifier (feature `candle-cuda`).
#[cfg(feature = "candle-cuda")]
mod cuda {
    use super::TensorRows;
    use candle_core::cuda_backend::CudaStorageSlice;
    use candle_core::{CudaStorage, Storage};
    use specula_core::verify::Rows;
    use specula_cuda::cudarc::driver::CudaView;
    use specula_cuda::{CudaDriver, CudaRows};

    /// Values in a CUDA storage of a float type this module reads (0 for any other).
    pub(super) fn float_len(c: &CudaStorage) -> usize {
        match &c.slice {
            CudaStorageSlice::F32(v) => v.len(),
            CudaStorageSlice::BF16(v) => v.len(),
            CudaStorageSlice::F16(v) => v.len(),
            _ => 0,
        }
    }

    /// The span of a [`TensorRows`] in its CUDA storage, typed.
    pub(super) enum Span<'s> {
        F32(CudaView<'s, f32>),
        Bf16(CudaView<'s, half::bf16>),
        F16(CudaView<'s, half::f16>),
    }

    impl TensorRows<'_> {
        /// The rows' span when they live in CUDA memory (`None` on the CPU). `rows_on`
        /// checked the span against the storage, so the window is inside it.
        pub(super) fn cuda_span(&self) -> Option<Span<'_>> {
            let Storage::Cuda(c) = &*self.storage else {
                return None;
            };
            let span = self.start..self.start + self.rows * self.stride;
            match &c.slice {
                CudaStorageSlice::F32(v) => v.try_slice(span).map(Span::F32),
                CudaStorageSlice::BF16(v) => v.try_slice(span).map(Span::Bf16),
                CudaStorageSlice::F16(v) => v.try_slice(span).map(Span::F16),
                _ => None,
            }
        }
    }

    /// The span borrowed for `drv`'s stream (which waits for the tensor's last write).
    pub(super) fn borrow<'a>(
        span: Option<&'a Span<'_>>,
        drv: Option<&'a CudaDriver>,
    ) -> Option<CudaRows<'a>> {
        Some(match (span?, drv?) {
            (Span::F32(v), d) => d.borrow_rows(v),
            (Span::Bf16(v), d) => d.borrow_rows(v),
            (Span::F16(v), d) => d.borrow_rows(v),
        })
    }

    /// The rows a batch takes: the borrowed CUDA span, else the host rows.
    pub(super) fn rows<'a>(
        host: Rows<'a>,
        device: Option<&'a CudaRows<'_>>,
        stride: usize,
    ) -> Rows<'a> {
        device.map_or(host, |d| d.rows(stride))
    }
}

/// One decode step in vLLM's ragged layout, owned: the per-request inputs gathered by
/// [`push`](Self::push), verified against candle tensors by [`verify`](Self::verify), and the
/// outputs. Keep one in the engine and [`clear`](Self::clear) it each step: its buffers only
/// grow, so a steady state allocates nothing.
#[derive(Clone, Debug, Default)]
pub struct Step {
    cu: Vec<u32>,
    ids: Vec<u32>,
    temperature: Vec<f32>,
    filters: Vec<Filter>,
    seed: Vec<u64>,
    offset: Vec<u64>,
    /// Each request's first row in the draft tensor, [`NO_DRAFT_ROWS`] for none.
    first_row: Vec<u32>,
    /// Draft rows of the requests pushed so far.
    draft_rows: u32,
    out: OutputBuffers,
    /// `k_max + 1` of the last verified step, `None` when there is none to read.
    width: Option<usize>,
}

impl Step {
    /// An empty step.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The same step with vLLM's recovered tokens as an output too: for every draft token,
    /// the token its request emits if that position is the first rejected one
    /// ([`recovered`](Self::recovered), [`vllm_recovered`](Self::vllm_recovered)), from the
    /// same verify call.
    #[must_use]
    pub fn with_recovered(mut self) -> Self {
        self.out = self.out.with_recovered();
        self
    }

    /// Forgets the requests and outputs, keeping the buffers.
    pub fn clear(&mut self) {
        self.cu.clear();
        self.ids.clear();
        self.temperature.clear();
        self.filters.clear();
        self.seed.clear();
        self.offset.clear();
        self.first_row.clear();
        self.draft_rows = 0;
        self.width = None;
    }

    /// Appends a request (its rows in the target tensor follow the previous request's).
    pub fn push(&mut self, r: Request<'_>) -> &mut Self {
        self.ids.extend_from_slice(r.drafts);
        // Beyond u32::MAX draft tokens the count saturates, and validation refuses the step
        // (the ids' length no longer matches it): a typed error, not a panic.
        self.cu
            .push(u32::try_from(self.ids.len()).unwrap_or(u32::MAX));
        self.temperature.push(r.sampling.temperature);
        self.filters.push(r.sampling.filter);
        self.seed.push(r.seed);
        self.offset.push(r.offset);
        if r.draft_rows {
            self.first_row.push(self.draft_rows);
            // Saturates like `cu`; validation then refuses the rows past the tensor.
            let k = u32::try_from(r.drafts.len()).unwrap_or(u32::MAX);
            self.draft_rows = self.draft_rows.saturating_add(k);
        } else {
            self.first_row.push(NO_DRAFT_ROWS);
        }
        self.width = None;
        self
    }

    /// Number of requests pushed.
    #[must_use]
    pub fn requests(&self) -> usize {
        self.cu.len()
    }

    /// vLLM's `cu_num_draft_tokens` of the requests pushed.
    #[must_use]
    pub fn cu_num_draft_tokens(&self) -> &[u32] {
        &self.cu
    }

    /// Verifies the step: `target` has `num_tokens + B` rows (request `b`'s `k_b + 1` rows
    /// after those of the requests before it), `draft_probs` (if a drafter has them) the `k_b`
    /// rows of each request pushed with [`Request::draft_rows`], request after request (all
    /// `num_tokens` rows when every request has them), both of the same vocabulary size.
    /// Without `draft_probs` every request is verified as a one-hot drafter's. Counts into the verifier as every
    /// verify call does; the outputs are then read with [`emitted`](Self::emitted),
    /// [`accepted`](Self::accepted) or as tensors. The tensors' storage is read-locked for the
    /// duration of the call only.
    ///
    /// # Errors
    /// [`StepError::Tensor`] for a tensor that cannot be taken (nothing verified);
    /// [`StepError::Verify`] with the verifier's error for a refused step (row counts that do
    /// not match the requests, a draft id `≥ V`, a bad temperature, …; nothing written or
    /// counted). Either way the outputs read as not verified.
    pub fn verify<V, const K: usize>(
        &mut self,
        verifier: &mut V,
        method: Method,
        check: Check,
        target: TargetTensor<'_>,
        draft_probs: Option<&Tensor>,
    ) -> Result<(), StepError<V::Error>>
    where
        V: TensorVerifier<K>,
    {
        self.width = None;
        let (t, role) = match target {
            TargetTensor::Logits(t) => (t, Role::TargetLogits),
            TargetTensor::Probs(t) => (t, Role::TargetProbs),
        };
        // A CUDA verifier reads CUDA rows in place (a clone of its driver: the verify call
        // below borrows the verifier mutably).
        #[cfg(feature = "candle-cuda")]
        let drv = verifier.cuda_driver().cloned();
        #[cfg(feature = "candle-cuda")]
        let cuda = drv.is_some();
        #[cfg(not(feature = "candle-cuda"))]
        let cuda = false;
        let target_rows = rows_on(t, role, cuda)?;
        let draft_rows = draft_probs
            .map(|d| rows_on(d, Role::DraftProbs, cuda))
            .transpose()?;
        let vocab = target_rows.vocab();
        if let Some(d) = draft_rows.as_ref().filter(|d| d.vocab() != vocab) {
            return Err(TensorError::new(
                Role::DraftProbs,
                TensorErrorKind::VocabMismatch {
                    target: vocab,
                    draft: d.vocab(),
                },
            )
            .into());
        }
        let (t_rows, d_rows) = (
            target_rows.rows(),
            draft_rows.as_ref().map(TensorRows::rows),
        );
        #[cfg(feature = "candle-cuda")]
        let spans = (
            target_rows.cuda_span(),
            draft_rows.as_ref().and_then(TensorRows::cuda_span),
        );
        #[cfg(feature = "candle-cuda")]
        let borrowed = (
            cuda::borrow(spans.0.as_ref(), drv.as_ref()),
            cuda::borrow(spans.1.as_ref(), drv.as_ref()),
        );
        #[cfg(feature = "candle-cuda")]
        let (t_rows, d_rows) = (
            cuda::rows(t_rows, borrowed.0.as_ref(), target_rows.stride()),
            d_rows
                .zip(draft_rows.as_ref())
                .map(|(r, d)| cuda::rows(r, borrowed.1.as_ref(), d.stride())),
        );
        let target = match target {
            TargetTensor::Logits(_) => Target::Logits {
                rows: t_rows,
                temperature: &self.temperature,
            },
            TargetTensor::Probs(_) => Target::Probs(t_rows),
        };
        let mut batch = Batch::ragged(
            vocab,
            RaggedDrafts {
                cu_num_draft_tokens: &self.cu,
                ids: &self.ids,
            },
            &[],
            Streams {
                seed: &self.seed,
                offset: &self.offset,
            },
        )
        .with_target(target)
        .with_filters(&self.filters);
        if let Some(d) = d_rows {
            batch = if self.first_row.contains(&NO_DRAFT_ROWS) {
                batch.with_mixed_drafters(d, &self.first_row)
            } else {
                batch.with_draft(d)
            };
        }
        verifier
            .verify(method, check, &batch, &mut self.out.fit(&batch))
            .map_err(StepError::Verify)?;
        self.width = Some(batch.k_max + 1);
        Ok(())
    }

    /// Accepted draft tokens per request, from the last verified step (empty if none).
    #[must_use]
    pub fn accepted(&self) -> &[u32] {
        match self.width {
            Some(_) => self.out.accepted(),
            None => &[],
        }
    }

    /// Each request's emitted tokens (its accepted drafts, then the correction or bonus
    /// token), in push order, from the last verified step (nothing if none).
    pub fn emitted(&self) -> impl Iterator<Item = &[u32]> {
        let tokens = if self.width.is_some() {
            self.out.tokens()
        } else {
            &[]
        };
        tokens.chunks(self.width.unwrap_or(1)).map(|row| {
            let n = row.iter().position(|&t| t == SENTINEL).unwrap_or(row.len());
            &row[..n]
        })
    }

    /// The recovered tokens of the last verified step, one per draft token in push order
    /// (`num_tokens` values); `None` without [`with_recovered`](Self::with_recovered) or a
    /// verified step.
    #[must_use]
    pub fn recovered(&self) -> Option<&[u32]> {
        self.width?;
        self.out.recovered()
    }

    /// The recovered tokens as vLLM's `recovered_token_ids`: a `[num_tokens]` i32 tensor on
    /// `device`.
    ///
    /// # Errors
    /// [`TensorErrorKind::NotVerified`] without a verified step or without
    /// [`with_recovered`](Self::with_recovered); otherwise as
    /// [`vllm_tokens`](Self::vllm_tokens).
    pub fn vllm_recovered(&self, device: &Device) -> Result<Tensor, TensorError> {
        let r = self
            .recovered()
            .ok_or_else(|| TensorError::new(Role::Recovered, TensorErrorKind::NotVerified))?;
        // The ragged layout's recovered tokens already are vLLM's order, and every slot is a
        // token (no sentinel): the conversion is the tokens' checked one.
        vllm_tensor(r, r.len(), device, Role::Recovered)
    }

    fn verified(&self, role: Role) -> Result<usize, TensorError> {
        self.width
            .ok_or_else(|| TensorError::new(role, TensorErrorKind::NotVerified))
    }

    /// The accepted counts as a `[B]` u32 tensor on `device`.
    ///
    /// # Errors
    /// [`TensorErrorKind::NotVerified`] without a verified step; candle's error if it cannot
    /// make the tensor there.
    pub fn accepted_tensor(&self, device: &Device) -> Result<Tensor, TensorError> {
        self.verified(Role::Accepted)?;
        let a = self.out.accepted();
        Tensor::from_slice(a, a.len(), device)
            .map_err(|e| TensorError::new(Role::Accepted, TensorErrorKind::Candle(e)))
    }

    /// The emitted tokens as a `[B, k_max + 1]` u32 tensor on `device`, [`SENTINEL`]-padded.
    ///
    /// # Errors
    /// As [`accepted_tensor`](Self::accepted_tensor).
    pub fn tokens_tensor(&self, device: &Device) -> Result<Tensor, TensorError> {
        let width = self.verified(Role::Tokens)?;
        let t = self.out.tokens();
        Tensor::from_slice(t, (t.len() / width, width), device)
            .map_err(|e| TensorError::new(Role::Tokens, TensorErrorKind::Candle(e)))
    }

    /// The emitted tokens in vLLM's `output_token_ids` layout: a `[B, k_max + 1]` i32 tensor
    /// on `device`, `-1`-padded.
    ///
    /// # Errors
    /// As [`accepted_tensor`](Self::accepted_tensor), and [`TensorErrorKind::Vllm`] for a
    /// token above `i32::MAX`.
    pub fn vllm_tokens(&self, device: &Device) -> Result<Tensor, TensorError> {
        let width = self.verified(Role::Tokens)?;
        let t = self.out.tokens();
        vllm_tensor(t, (t.len() / width, width), device, Role::Tokens)
    }
}

/// `tokens` in vLLM's i32 layout ([`to_vllm_tokens`]), as a tensor of `shape` on `device`;
/// `role` names it in errors.
fn vllm_tensor(
    tokens: &[u32],
    shape: impl Into<Shape>,
    device: &Device,
    role: Role,
) -> Result<Tensor, TensorError> {
    let err = |kind| TensorError::new(role, kind);
    let mut vllm = vec![0i32; tokens.len()];
    to_vllm_tokens(tokens, &mut vllm).map_err(|e| err(TensorErrorKind::Vllm(e)))?;
    Tensor::from_vec(vllm, shape, device).map_err(|e| err(TensorErrorKind::Candle(e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    // A device tensor cannot be made without candle's `cuda` or `metal` feature (not built
    // here): the refusal's wording is checked on the error itself.
    #[test]
    fn a_device_tensor_is_refused_with_what_to_do() {
        let e = TensorError::new(
            Role::TargetLogits,
            TensorErrorKind::NotOnCpu(DeviceLocation::Cuda { gpu_id: 1 }),
        );
        let text = e.to_string();
        assert!(text.starts_with("target logits: the tensor is on Cuda { gpu_id: 1 }"));
        assert!(
            text.contains("does not read in place")
                && text.contains("candle-cuda")
                && text.contains("to_device(&Device::Cpu)")
        );
        assert!(std::error::Error::source(&e).is_none());
    }
}
