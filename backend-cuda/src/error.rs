//! [`CudaError`]: every way the CUDA backend can fail, as a value (cudarc would panic on a
//! missing library; this crate checks first).

use cudarc::driver::DriverError;
use specula_core::gpu::GpuError;
use specula_core::verify::VerifyError;
use specula_core::{ErrorKind, HasKind, Misuse};

/// Why a CUDA backend operation failed.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum CudaError {
    /// The CUDA driver library (`libcuda.so` / `nvcuda.dll`) could not be loaded.
    NoDriver,
    /// The driver loaded but reports no usable device (or not the ordinal asked for).
    NoDevice,
    /// No NVRTC library could be loaded (`SPECULA_NVRTC`, `libnvrtc.so`, `.so.13`, `.so.12`, ...).
    NoNvrtc,
    /// NVRTC refused the kernel text; `log` is its compile log.
    Nvrtc {
        /// The NVRTC program log (or the failing step when there is no log).
        log: String,
    },
    /// A driver call failed.
    Driver {
        /// The driver function.
        call: &'static str,
        /// The driver's error.
        error: DriverError,
    },
    /// The batch failed validation (same error as the reference); nothing ran or was counted.
    Verify(VerifyError),
    /// A size does not fit the kernel's 32-bit shape words.
    TooLarge,
    /// The kernel raised error flags (`specula_core::gpu::kernels::ERR_*` bits).
    DeviceFlags(u64),
    /// A device view is shorter than a launch's capacity needs.
    ViewTooShort,
    /// A graph replay on views whose optional inputs (ragged layout, bonus tokens, logits,
    /// draft probabilities) or capacity do not match the graph's; nothing was enqueued.
    GraphMismatch,
    /// A device tensor of the batch or outputs is not memory of this verifier's device (or
    /// of this GPU API); nothing was enqueued, written or counted.
    ForeignMemory {
        /// Which tensor.
        param: specula_core::verify::Param,
    },
    /// Every readback slot is held by an abandoned copy that has not completed.
    Stalled,
    /// A failure of the shared GPU orchestration that this crate does not name yet (a newer
    /// `GpuError` variant), with its kind and text, rather than a guess.
    Unmapped {
        /// Its kind.
        kind: ErrorKind,
        /// Its text.
        message: String,
    },
    /// A readback was misused (poll with none in flight, start with too many): the answer
    /// every [`Readback`](specula_core::Readback) gives.
    Misuse(Misuse),
}

impl CudaError {
    /// What the failure means to a runtime, in the kind every backend shares.
    #[must_use]
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::NoDriver => ErrorKind::NoDriver,
            Self::NoDevice => ErrorKind::NoDevice,
            Self::NoNvrtc => ErrorKind::NoCompiler,
            Self::Nvrtc { .. } => ErrorKind::Compile,
            Self::Verify(_)
            | Self::TooLarge
            | Self::ViewTooShort
            | Self::GraphMismatch
            | Self::ForeignMemory { .. } => ErrorKind::InvalidInput,
            Self::Stalled => ErrorKind::Device,
            Self::Unmapped { kind, .. } => *kind,
            Self::Misuse(_) => ErrorKind::Misuse,
            Self::Driver { .. } | Self::DeviceFlags(_) => ErrorKind::Device,
        }
    }
}

impl HasKind for CudaError {
    fn kind(&self) -> ErrorKind {
        CudaError::kind(self)
    }
}

impl From<GpuError<CudaError>> for CudaError {
    fn from(e: GpuError<CudaError>) -> Self {
        match e {
            GpuError::Driver(e) => e,
            GpuError::Verify(v) => Self::Verify(v),
            GpuError::TooLarge => Self::TooLarge,
            GpuError::ViewTooShort => Self::ViewTooShort,
            GpuError::GraphMismatch => Self::GraphMismatch,
            GpuError::ForeignMemory { param } => Self::ForeignMemory { param },
            GpuError::DeviceFlags(bits) => Self::DeviceFlags(bits),
            GpuError::Misuse(m) => Self::Misuse(m),
            GpuError::Stalled => Self::Stalled,
            // `GpuError` is non-exhaustive: a variant added after this match keeps its kind
            // and text.
            other => Self::Unmapped {
                kind: other.kind(),
                message: other.to_string(),
            },
        }
    }
}

impl From<Misuse> for CudaError {
    fn from(e: Misuse) -> Self {
        Self::Misuse(e)
    }
}

impl From<VerifyError> for CudaError {
    fn from(e: VerifyError) -> Self {
        Self::Verify(e)
    }
}

impl core::fmt::Display for CudaError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::NoDriver => f.write_str("CUDA driver library not found"),
            Self::NoDevice => f.write_str("no CUDA device"),
            Self::NoNvrtc => f.write_str(
                "NVRTC library not found (put libnvrtc on the loader path or name it in SPECULA_NVRTC)",
            ),
            Self::Nvrtc { log } => write!(f, "NVRTC compilation failed:\n{log}"),
            Self::Driver { call, error } => write!(f, "{call} failed: {error:?}"),
            Self::Verify(e) => write!(f, "invalid batch: {e:?}"),
            Self::TooLarge => f.write_str("a size does not fit the kernel's 32-bit shape words"),
            Self::DeviceFlags(bits) => write!(f, "kernel error flags {bits:#x}"),
            Self::Misuse(m) => write!(f, "{m}"),
            Self::ViewTooShort => f.write_str("a device view is shorter than the launch needs"),
            Self::GraphMismatch => {
                f.write_str("the views differ from the ones the graph was captured with")
            }
            Self::ForeignMemory { param } => write!(
                f,
                "{param:?} is not device memory of this verifier's device"
            ),
            Self::Stalled => f.write_str("every readback slot is held by a stalled copy"),
            Self::Unmapped { message, .. } => f.write_str(message),
        }
    }
}

impl std::error::Error for CudaError {}
