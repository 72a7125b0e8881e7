//! One way to open a verification backend, whatever features this build has.
//!
//! A runtime names the backend at run time (`"cpu"`, `"cpu:8"`, `"reference"`, `"cuda"`,
//! `"cuda:1"`, `"rocm:0"`), opens it with [`Backend::open`] and holds a [`Backend`] without
//! knowing which one it got: it implements [`Verifier`], and [`Backend::readback`] gives the
//! matching [`Readback`] for a [`Collector`](specula_core::Collector). Every variant name exists
//! under every feature set; one that is not compiled in fails with
//! [`ErrorKind::NotCompiledIn`], so the runtime's code is the same whatever the features.
//! Failures carry an [`ErrorKind`] shared by all backends: match on kinds, not variant lists.
//!
//! ```
//! use specula::backend::{Backend, BackendSpec};
//! use specula::specula_core::verify::{
//!     AcceptedOut, Batch, Check, Dims, Drafts, Method, Outputs, Streams, TokensOut, Verifier,
//! };
//!
//! // From a command line or a configuration file; fall back to the CPU when no GPU is here.
//! let spec: BackendSpec = "cuda:0".parse()?;
//! let mut backend = Backend::<8>::open_or(&spec, &"cpu".parse()?)?;
//! let mut readback = backend.readback()?; // for the Collector
//! let target = [0.1, 0.6, 0.3, /* bonus row */ 0.0, 0.0, 1.0];
//! let batch = Batch::dense(Dims { vocab: 3, k_max: 1 }, Drafts { k: &[1], ids: &[1] }, &target, Streams { seed: &[7], offset: &[0] });
//! let (mut accepted, mut tokens) = ([0u32; 1], [0u32; 2]);
//! let mut out = Outputs::new(AcceptedOut(&mut accepted), TokensOut(&mut tokens));
//! backend.verify(Method::Greedy, Check::Cheap, &batch, &mut out)?;
//! assert_eq!((accepted, tokens), ([1], [1, 2]));
//! # let _ = &mut readback;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::cpu::{CpuReadback, CpuReadbackError, CpuVerifier};
use specula_core::verify::tree::{TreeBatch, TreeOutputs};
use specula_core::verify::{Batch, Check, Method, Outputs, Verifier, VerifyError};
use specula_core::{Counters, ErrorKind, Readback};
use std::fmt;
use std::str::FromStr;
use std::task::Poll;

/// Which backend: every name exists whatever the features (see [`compiled_in`](Self::compiled_in)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BackendKind {
    /// The multithreaded, vectorised CPU backend.
    Cpu,
    /// The core reference (plain loops, one thread): same bits, for cross-checks.
    Reference,
    /// The CUDA backend (feature `cuda`).
    Cuda,
    /// The ROCm backend (feature `rocm`).
    Rocm,
}

impl BackendKind {
    /// Every kind, in the order names are listed to users.
    pub const ALL: [Self; 4] = [Self::Cpu, Self::Reference, Self::Cuda, Self::Rocm];

    /// The name a [`BackendSpec`] uses.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Cpu => "cpu",
            Self::Reference => "reference",
            Self::Cuda => "cuda",
            Self::Rocm => "rocm",
        }
    }

    /// The Cargo feature of `specula` that compiles this backend in (`None`: always there).
    #[must_use]
    pub fn feature(self) -> Option<&'static str> {
        match self {
            Self::Cpu | Self::Reference => None,
            Self::Cuda => Some("cuda"),
            Self::Rocm => Some("rocm"),
        }
    }

    /// Whether this build contains the backend.
    #[must_use]
    pub fn compiled_in(self) -> bool {
        match self {
            Self::Cpu | Self::Reference => true,
            Self::Cuda => cfg!(feature = "cuda"),
            Self::Rocm => cfg!(feature = "rocm"),
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A backend and its one number: the device ordinal of a GPU backend (default 0), the thread
/// count of the CPU backend (default 0 = one per CPU). Parsed from `name` or `name:number`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BackendSpec {
    /// Which backend.
    pub kind: BackendKind,
    /// Device ordinal (GPU) or thread count (CPU); `None` for the default. The reference has no
    /// number.
    pub index: Option<usize>,
}

impl BackendSpec {
    /// `kind` with its default number.
    #[must_use]
    pub fn new(kind: BackendKind) -> Self {
        Self { kind, index: None }
    }
}

impl FromStr for BackendSpec {
    type Err = BackendError;

    fn from_str(s: &str) -> Result<Self, BackendError> {
        let bad = |why: String| BackendError::new(None, ErrorKind::InvalidInput, why);
        let (name, number) = match s.split_once(':') {
            Some((n, i)) => (n, Some(i)),
            None => (s, None),
        };
        let kind = BackendKind::ALL
            .into_iter()
            .find(|k| k.name().eq_ignore_ascii_case(name.trim()))
            .ok_or_else(|| {
                bad(format!(
                    "unknown backend {name:?}: expected one of cpu, reference, cuda, rocm \
                     (optionally with :N)"
                ))
            })?;
        let index = match number {
            None => None,
            Some(_) if kind == BackendKind::Reference => {
                return Err(bad("the reference backend takes no number".into()));
            }
            Some(i) => Some(i.trim().parse::<usize>().map_err(|_| {
                bad(format!(
                    "{s:?}: the number after ':' must be a device ordinal or thread count"
                ))
            })?),
        };
        Ok(Self { kind, index })
    }
}

impl fmt::Display for BackendSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.index {
            Some(i) => write!(f, "{}:{i}", self.kind),
            None => write!(f, "{}", self.kind),
        }
    }
}

/// A backend failure: its [`ErrorKind`], the backend it came from (when known) and a message.
/// The batch errors keep their [`VerifyError`].
#[derive(Clone, Debug, PartialEq)]
pub struct BackendError {
    backend: Option<BackendKind>,
    kind: ErrorKind,
    verify: Option<VerifyError>,
    message: String,
}

impl BackendError {
    fn new(backend: Option<BackendKind>, kind: ErrorKind, message: String) -> Self {
        Self {
            backend,
            kind,
            verify: None,
            message,
        }
    }

    /// What the failure means (shared by every backend).
    #[must_use]
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The backend it came from, when known.
    #[must_use]
    pub fn backend(&self) -> Option<BackendKind> {
        self.backend
    }

    /// The validation error, for a refused batch.
    #[must_use]
    pub fn verify_error(&self) -> Option<&VerifyError> {
        self.verify.as_ref()
    }

    /// The error for a backend this build does not contain.
    #[must_use]
    pub fn not_compiled_in(kind: BackendKind) -> Self {
        let feature = kind.feature().unwrap_or("(none)");
        Self::new(
            Some(kind),
            ErrorKind::NotCompiledIn,
            format!(
                "the {kind} backend is not compiled in: enable the `{feature}` feature of `specula`"
            ),
        )
    }

    fn at(mut self, backend: BackendKind) -> Self {
        self.backend = Some(backend);
        self
    }
}

impl From<VerifyError> for BackendError {
    fn from(e: VerifyError) -> Self {
        Self {
            backend: None,
            kind: ErrorKind::InvalidInput,
            message: format!("batch refused: {e}"),
            verify: Some(e),
        }
    }
}

impl From<CpuReadbackError> for BackendError {
    fn from(e: CpuReadbackError) -> Self {
        Self::new(Some(BackendKind::Cpu), ErrorKind::Misuse, e.to_string())
    }
}

/// A GPU backend's errors, and its verifier's (the shared orchestration's `GpuError`),
/// flattened as the backend's own: its kind, its `Verify` variant's [`VerifyError`].
#[cfg(any(feature = "cuda", feature = "rocm"))]
macro_rules! from_gpu_error {
    ($backend:ident, $krate:ident::$error:ident) => {
        impl From<$krate::$error> for BackendError {
            fn from(e: $krate::$error) -> Self {
                let verify = match &e {
                    $krate::$error::Verify(v) => Some(*v),
                    _ => None,
                };
                Self {
                    backend: Some(BackendKind::$backend),
                    kind: e.kind(),
                    verify,
                    message: e.to_string(),
                }
            }
        }

        impl From<specula_core::gpu::GpuError<$krate::$error>> for BackendError {
            fn from(e: specula_core::gpu::GpuError<$krate::$error>) -> Self {
                $krate::$error::from(e).into()
            }
        }
    };
}

#[cfg(feature = "cuda")]
from_gpu_error!(Cuda, specula_cuda::CudaError);
#[cfg(feature = "rocm")]
from_gpu_error!(Rocm, specula_rocm::RocmError);

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.backend {
            Some(b) => write!(f, "{b} backend: {} ({})", self.message, self.kind),
            None => write!(f, "{} ({})", self.message, self.kind),
        }
    }
}

impl std::error::Error for BackendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.verify
            .as_ref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// An open backend. It verifies (the [`Verifier`] trait, errors as [`BackendError`]) and hands
/// out its [`readback`](Self::readback).
#[derive(Debug)]
#[non_exhaustive]
pub enum Backend<const K: usize> {
    /// The CPU backend, or the reference ([`CpuVerifier::reference`]).
    Cpu(CpuVerifier<K>),
    /// The CUDA backend.
    ///
    /// Its [`verify`](Verifier::verify) takes the engine's device tensors as they are: rows
    /// borrowed from cudarc memory ([`CudaDriver::borrow_rows`](specula_cuda::CudaDriver::borrow_rows):
    /// `f32`, `bf16`, `f16`) and outputs written in place
    /// ([`Outputs::on_device`](specula_core::verify::Outputs::on_device)): no host copy of the
    /// rows, no copy down, no wait (the small per-request values are still copied up). The
    /// results are ordered on the device's compute stream, before the engine's next use of the
    /// borrowed tensors.
    ///
    /// ```no_run
    /// use specula::backend::Backend;
    /// use specula::cuda::cudarc::driver::CudaSlice;
    /// use specula::half::bf16;
    /// use specula::specula_core::verify::{
    ///     Batch, Check, DeviceOutputs, Dims, Drafts, Method, Outputs, Streams, Target, Verifier,
    /// };
    ///
    /// /// One step: `logits` is `[B · (k_max+1), V]` bf16 on the GPU; `accepted` (`B`) and
    /// /// `tokens` (`B · (k_max+1)`) are written there.
    /// fn step(
    ///     backend: &mut Backend<8>,
    ///     logits: &CudaSlice<bf16>,
    ///     accepted: &mut CudaSlice<u32>,
    ///     tokens: &mut CudaSlice<u32>,
    ///     (k, ids, temperature): (&[u32], &[u32], &[f32]),
    ///     (seed, offset): (&[u64], &[u64]),
    ///     dims: Dims,
    /// ) -> Result<(), Box<dyn std::error::Error>> {
    ///     let Backend::Cuda(gpu) = &*backend else { return Err("not CUDA".into()) };
    ///     let drv = gpu.driver().clone();
    ///     let rows = drv.borrow_rows(logits);
    ///     let (mut acc, mut tok) = (drv.borrow_mut(accepted), drv.borrow_mut(tokens));
    ///     let batch = Batch::dense(dims, Drafts { k, ids }, &[], Streams { seed, offset })
    ///         .with_target(Target::Logits { rows: rows.rows(dims.vocab), temperature });
    ///     let mut out = Outputs::on_device(DeviceOutputs {
    ///         accepted: acc.output(),
    ///         tokens: tok.output(),
    ///         recovered: None,
    ///     });
    ///     backend.verify(Method::Rejection, Check::Cheap, &batch, &mut out)?;
    ///     Ok(())
    /// }
    /// ```
    #[cfg(feature = "cuda")]
    Cuda(specula_cuda::CudaVerifier<K>),
    /// The ROCm backend; its [`verify`](Verifier::verify) takes the caller's HIP buffers as
    /// they are ([`RocmDriver::borrow_rows`](specula_rocm::RocmDriver::borrow_rows),
    /// [`borrow_out`](specula_rocm::RocmDriver::borrow_out)), as the CUDA backend's does.
    #[cfg(feature = "rocm")]
    Rocm(specula_rocm::RocmVerifier<K>),
}

impl<const K: usize> Backend<K> {
    /// Opens the backend `spec` names: the CPU backend starts its threads; a GPU backend loads
    /// its driver and kernel compiler, opens the device and compiles the kernel. A backend not
    /// compiled in gives [`ErrorKind::NotCompiledIn`]; no driver, device or compiler gives
    /// [`ErrorKind::NoDriver`], [`ErrorKind::NoDevice`] or [`ErrorKind::NoCompiler`] (all
    /// [`is_unavailable`](ErrorKind::is_unavailable)).
    pub fn open(spec: &BackendSpec) -> Result<Self, BackendError> {
        match spec.kind {
            BackendKind::Cpu => {
                let threads = spec.index.unwrap_or(0);
                CpuVerifier::new(threads).map(Self::Cpu).map_err(|e| {
                    BackendError::new(
                        Some(BackendKind::Cpu),
                        ErrorKind::Resource,
                        format!("cannot start {threads} verifier threads: {e}"),
                    )
                })
            }
            BackendKind::Reference => Ok(Self::Cpu(CpuVerifier::reference())),
            #[cfg(feature = "cuda")]
            BackendKind::Cuda => {
                let device = specula_cuda::CudaDevice::new(spec.index.unwrap_or(0))?;
                Ok(Self::Cuda(std::sync::Arc::new(device).verifier()?))
            }
            #[cfg(feature = "rocm")]
            BackendKind::Rocm => {
                let device = specula_rocm::RocmDevice::new(spec.index.unwrap_or(0))?;
                Ok(Self::Rocm(device.verifier()?))
            }
            #[allow(unreachable_patterns)] // every kind is compiled in under some feature sets
            kind => Err(BackendError::not_compiled_in(kind)),
        }
    }

    /// Opens `spec`'s backend, or `fallback`'s where `spec`'s cannot run here (an error whose
    /// kind [`is_unavailable`](ErrorKind::is_unavailable): not compiled in, no driver, device
    /// or kernel compiler): "the GPU if it can, else the CPU" in one call. Any other failure of
    /// `spec` (a kernel that does not compile, say) is returned as it is, not hidden by the
    /// fallback; a fallback that fails returns its own error.
    ///
    /// ```
    /// use specula::backend::{Backend, BackendKind};
    /// // Without the `cuda` feature (or a driver, or a device) this is the CPU backend.
    /// let b = Backend::<8>::open_or(&"cuda:0".parse()?, &"cpu:1".parse()?)?;
    /// assert!(matches!(b.kind(), BackendKind::Cuda | BackendKind::Cpu));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn open_or(spec: &BackendSpec, fallback: &BackendSpec) -> Result<Self, BackendError> {
        match Self::open(spec) {
            Err(e) if e.kind().is_unavailable() => Self::open(fallback),
            opened => opened,
        }
    }

    /// Which backend this is.
    #[must_use]
    pub fn kind(&self) -> BackendKind {
        match self {
            Self::Cpu(v) if v.is_reference() => BackendKind::Reference,
            Self::Cpu(_) => BackendKind::Cpu,
            #[cfg(feature = "cuda")]
            Self::Cuda(_) => BackendKind::Cuda,
            #[cfg(feature = "rocm")]
            Self::Rocm(_) => BackendKind::Rocm,
        }
    }

    /// A [`Readback`] of this backend's counters, for a [`Collector`](specula_core::Collector)
    /// (it may live on another thread).
    pub fn readback(&self) -> Result<AnyReadback<K>, BackendError> {
        Ok(match self {
            Self::Cpu(v) => AnyReadback::Cpu(v.readback()),
            #[cfg(feature = "cuda")]
            Self::Cuda(v) => AnyReadback::Cuda(specula_cuda::CudaReadback::new(v)?),
            #[cfg(feature = "rocm")]
            Self::Rocm(v) => AnyReadback::Rocm(specula_rocm::RocmReadback::new(v)?),
        })
    }
}

/// `$body` with `$v` bound to the backend `$self` holds: the same arms for [`Backend`] and
/// [`AnyReadback`], whose variants have the same names under the same features.
macro_rules! each {
    ($self:expr, $v:ident => $body:expr) => {
        match $self {
            Self::Cpu($v) => $body,
            #[cfg(feature = "cuda")]
            Self::Cuda($v) => $body,
            #[cfg(feature = "rocm")]
            Self::Rocm($v) => $body,
        }
    };
}

impl<const K: usize> Verifier<K> for Backend<K> {
    type Error = BackendError;

    fn verify(
        &mut self,
        method: Method,
        check: Check,
        batch: &Batch<'_>,
        out: &mut Outputs<'_>,
    ) -> Result<(), BackendError> {
        let kind = self.kind();
        each!(self, v => Verifier::verify(v, method, check, batch, out).map_err(Into::into))
            .map_err(|e: BackendError| e.at(kind))
    }

    /// Verifies a batch of token trees (`core/DETERMINISM.md`, "Token trees"; bit-identical
    /// to [`verify_tree_batch`](specula_core::verify::tree::verify_tree_batch) on every
    /// backend) and counts every tree in this backend's counters
    /// (`Counters::record_tree`), read back like the chain counts. The CPU backend and the
    /// reference take f32 probabilities or logits in host memory; CUDA and ROCm launch the
    /// tree entry through `specula_core::gpu` (f32 probabilities or logits too, host rows or
    /// device rows of their own device, read in place; outputs on their device,
    /// [`TreeOutputs::on_device`], written in place with no copy down and no wait). A refused
    /// batch is an error of kind
    /// [`ErrorKind::InvalidInput`] (the reference's `VerifyError` in the message), with
    /// nothing written or counted.
    fn verify_tree(
        &mut self,
        method: Method,
        check: Check,
        batch: &TreeBatch<'_>,
        out: &mut TreeOutputs<'_>,
    ) -> Result<(), BackendError> {
        let kind = self.kind();
        each!(self, v => Verifier::verify_tree(v, method, check, batch, out).map_err(Into::into))
            .map_err(|e: BackendError| e.at(kind))
    }

    fn totals(&mut self) -> Result<Counters<K>, BackendError> {
        each!(self, v => Verifier::totals(v).map_err(Into::into))
    }

    /// The backend's own [`Support`](specula_core::verify::Support): everything for the CPU
    /// backend and the reference, what the GPU backend declares otherwise.
    fn support(&self) -> specula_core::verify::Support {
        each!(self, v => Verifier::<K>::support(v))
    }
}

/// The [`Readback`] of a [`Backend`].
#[derive(Debug)]
#[non_exhaustive]
pub enum AnyReadback<const K: usize> {
    /// The CPU backend's (or the reference's).
    Cpu(CpuReadback<K>),
    /// The CUDA backend's.
    #[cfg(feature = "cuda")]
    Cuda(specula_cuda::CudaReadback<K>),
    /// The ROCm backend's.
    #[cfg(feature = "rocm")]
    Rocm(specula_rocm::RocmReadback<K>),
}

impl<const K: usize> Readback<K> for AnyReadback<K> {
    type Error = BackendError;

    fn start(&mut self) -> Result<(), BackendError> {
        each!(self, r => r.start().map_err(Into::into))
    }

    fn poll(&mut self) -> Poll<Result<Counters<K>, BackendError>> {
        each!(self, r => r.poll().map_err(Into::into))
    }

    fn flush(&mut self) -> Result<Counters<K>, BackendError> {
        each!(self, r => r.flush().map_err(Into::into))
    }

    fn max_in_flight(&self) -> usize {
        each!(self, r => r.max_in_flight())
    }

    fn abandon(&mut self) -> bool {
        each!(self, r => r.abandon())
    }
}

#[cfg(test)]
mod tests;
