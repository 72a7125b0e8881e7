//! [`RocmError`]: everything that can go wrong in this backend, as values.

use core::fmt;
use specula_core::gpu::GpuError;
use specula_core::verify::VerifyError;
use specula_core::{ErrorKind, HasKind, Misuse};

/// Why a ROCm operation failed. Nothing in this crate panics; every failure is one of these.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum RocmError {
    /// The HIP runtime (`libamdhip64`) could not be loaded, or lacks an entry point this crate
    /// needs: ROCm is not installed, or not on the library path.
    NoRuntime {
        /// What was tried and why each attempt failed.
        reason: String,
    },
    /// hiprtc (`libhiprtc`, or the copy inside ROCm 5's `libamdhip64`) could not be loaded.
    NoHiprtc {
        /// What was tried and why each attempt failed.
        reason: String,
    },
    /// The runtime loaded but reports no usable ROCm device (`hipGetDeviceCount` failed with
    /// `hipErrorNoDevice` or `hipErrorInsufficientDriver`, or counted zero devices).
    NoDevice {
        /// The HIP status `hipGetDeviceCount` returned (0 when it succeeded with no devices).
        code: i32,
    },
    /// A device ordinal at or past the number of devices.
    InvalidDevice {
        /// The ordinal asked for.
        ordinal: usize,
        /// How many devices there are.
        count: usize,
    },
    /// A HIP runtime call failed.
    Hip {
        /// The HIP function.
        call: &'static str,
        /// Its `hipError_t` status.
        code: i32,
        /// `hipGetErrorString` of the status.
        message: String,
    },
    /// hiprtc rejected the kernel source: the compiler's log says why.
    Hiprtc {
        /// The program log (diagnostics from the device compiler).
        log: String,
    },
    /// A hiprtc call other than the compilation itself failed.
    HiprtcCall {
        /// The hiprtc function.
        call: &'static str,
        /// Its `hiprtcResult` status.
        code: i32,
        /// `hiprtcGetErrorString` of the status.
        message: String,
    },
    /// An argument that is passed to the device compiler or runtime as a C string (target name,
    /// kernel name, source) contains a NUL byte, or a target name has characters no AMD target
    /// ID has.
    InvalidName {
        /// The rejected text.
        name: String,
    },
    /// A size computation overflowed `usize`, or a size does not fit a HIP launch parameter or
    /// the kernel's 32-bit shape words (the same name as in every backend).
    TooLarge,
    /// A buffer's length does not match what the operation needs.
    LengthMismatch {
        /// What the buffer is.
        what: &'static str,
        /// Elements needed.
        expected: usize,
        /// Elements given.
        actual: usize,
    },
    /// The batch was refused by validation ([`specula_core::verify::validate`]); nothing was
    /// launched or counted.
    Verify(VerifyError),
    /// An operation this backend does not provide yet (named).
    Unsupported(&'static str),
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

impl fmt::Display for RocmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoRuntime { reason } => write!(f, "HIP runtime not available: {reason}"),
            Self::NoHiprtc { reason } => write!(f, "hiprtc not available: {reason}"),
            Self::NoDevice { code: 0 } => {
                f.write_str("no ROCm device: hipGetDeviceCount found none")
            }
            Self::NoDevice { code: 35 } => f.write_str(
                "no ROCm device: hipGetDeviceCount returned 35 (hipErrorInsufficientDriver: no \
                 amdgpu kernel driver, or no access to /dev/kfd)",
            ),
            Self::NoDevice { code: 100 } => {
                f.write_str("no ROCm device: hipGetDeviceCount returned 100 (hipErrorNoDevice)")
            }
            Self::NoDevice { code } => {
                write!(f, "no ROCm device: hipGetDeviceCount returned {code}")
            }
            Self::InvalidDevice { ordinal, count } => {
                write!(f, "ROCm device {ordinal} requested, {count} present")
            }
            Self::Hip {
                call,
                code,
                message,
            } => write!(f, "{call} failed: {message} ({code})"),
            Self::Hiprtc { log } => write!(f, "kernel compilation failed:\n{log}"),
            Self::HiprtcCall {
                call,
                code,
                message,
            } => write!(f, "{call} failed: {message} ({code})"),
            Self::InvalidName { name } => write!(f, "invalid name for HIP: {name:?}"),
            Self::TooLarge => f.write_str("size overflow"),
            Self::LengthMismatch {
                what,
                expected,
                actual,
            } => write!(f, "{what}: {actual} elements given, {expected} needed"),
            Self::Verify(e) => write!(f, "batch refused: {e}"),
            Self::Misuse(m) => write!(f, "{m}"),
            Self::Unsupported(what) => write!(f, "not supported by the ROCm backend yet: {what}"),
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

impl std::error::Error for RocmError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Verify(e) => Some(e),
            _ => None,
        }
    }
}

impl RocmError {
    /// What the failure means to a runtime, in the kind every backend shares.
    #[must_use]
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::NoRuntime { .. } => ErrorKind::NoDriver,
            Self::NoHiprtc { .. } => ErrorKind::NoCompiler,
            Self::NoDevice { .. } | Self::InvalidDevice { .. } => ErrorKind::NoDevice,
            Self::Hiprtc { .. } => ErrorKind::Compile,
            Self::InvalidName { .. }
            | Self::TooLarge
            | Self::LengthMismatch { .. }
            | Self::Verify(_) => ErrorKind::InvalidInput,
            Self::Misuse(_) | Self::Unsupported(_) => ErrorKind::Misuse,
            Self::ViewTooShort | Self::GraphMismatch | Self::ForeignMemory { .. } => {
                ErrorKind::InvalidInput
            }
            Self::Stalled => ErrorKind::Device,
            Self::Unmapped { kind, .. } => *kind,
            Self::Hip { .. } | Self::HiprtcCall { .. } => ErrorKind::Device,
        }
    }
}

impl HasKind for RocmError {
    fn kind(&self) -> ErrorKind {
        RocmError::kind(self)
    }
}

impl From<GpuError<RocmError>> for RocmError {
    fn from(e: GpuError<RocmError>) -> Self {
        match e {
            GpuError::Driver(e) => e,
            GpuError::Verify(v) => Self::Verify(v),
            GpuError::TooLarge => Self::TooLarge,
            GpuError::ViewTooShort => Self::ViewTooShort,
            GpuError::GraphMismatch => Self::GraphMismatch,
            GpuError::ForeignMemory { param } => Self::ForeignMemory { param },
            GpuError::DeviceFlags(bits) => Self::Hip {
                call: "specula_verify (kernel error flags)",
                code: i32::try_from(bits).unwrap_or(i32::MAX),
                message: format!("kernel error flags {bits:#x}"),
            },
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

impl From<Misuse> for RocmError {
    fn from(e: Misuse) -> Self {
        Self::Misuse(e)
    }
}

impl From<VerifyError> for RocmError {
    fn from(e: VerifyError) -> Self {
        Self::Verify(e)
    }
}
