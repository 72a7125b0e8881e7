//! [`GpuError`]: every failure of the shared GPU orchestration, one name per concept for every
//! driver (CUDA, ROCm, the host driver).

use crate::error_kind::{ErrorKind, HasKind};
use crate::metrics::Misuse;
use crate::verify::{Param, VerifyError};

/// Why a GPU verification or readback failed; `E` is the driver's error.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum GpuError<E> {
    /// A driver call failed.
    Driver(E),
    /// The batch (chains or trees) failed the reference's validation; nothing ran and nothing
    /// was counted.
    Verify(VerifyError),
    /// A size does not fit the kernel's 32-bit shape words, or a buffer size overflows.
    TooLarge,
    /// A device view is shorter than the launch's capacity needs (an absent view the launch
    /// needs counts as empty: target logits without temperatures, or the reverse).
    ViewTooShort,
    /// A device tensor of the batch or outputs ([`Values::Device`](crate::verify::Values::Device),
    /// [`DeviceOut`](crate::verify::DeviceOut)) is not memory of this verifier's driver and
    /// device (another GPU API's buffer, or another device's): nothing was enqueued, written or
    /// counted.
    ForeignMemory {
        /// Which tensor.
        param: Param,
    },
    /// A graph replay on views whose optional inputs (draft probabilities, ragged layout, bonus
    /// tokens, logits) differ from the ones it was captured with, or whose batch exceeds its
    /// capacity: nothing was enqueued.
    GraphMismatch,
    /// The kernel raised error flags (`kernels::ERR_*` bits): some request was skipped.
    DeviceFlags(u64),
    /// A readback was misused (the same answer from every [`Readback`](crate::Readback)).
    Misuse(Misuse),
    /// Every readback slot is held by an abandoned copy that has not completed: the device is
    /// not making progress.
    Stalled,
}

impl<E> From<VerifyError> for GpuError<E> {
    fn from(e: VerifyError) -> Self {
        Self::Verify(e)
    }
}

impl<E> From<Misuse> for GpuError<E> {
    fn from(e: Misuse) -> Self {
        Self::Misuse(e)
    }
}

impl<E: HasKind> HasKind for GpuError<E> {
    fn kind(&self) -> ErrorKind {
        match self {
            Self::Driver(e) => e.kind(),
            Self::Verify(_)
            | Self::TooLarge
            | Self::ViewTooShort
            | Self::GraphMismatch
            | Self::ForeignMemory { .. } => ErrorKind::InvalidInput,
            Self::DeviceFlags(_) | Self::Stalled => ErrorKind::Device,
            Self::Misuse(_) => ErrorKind::Misuse,
        }
    }
}

impl<E: HasKind> GpuError<E> {
    /// The kind of this failure (same as [`HasKind::kind`]).
    #[must_use]
    pub fn kind(&self) -> ErrorKind {
        HasKind::kind(self)
    }
}

impl<E: core::fmt::Display> core::fmt::Display for GpuError<E> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Driver(e) => write!(f, "driver: {e}"),
            Self::Verify(e) => write!(f, "invalid batch: {e:?}"),
            Self::TooLarge => f.write_str("a size does not fit the kernel's 32-bit shape words"),
            Self::ViewTooShort => f.write_str("a device view is shorter than the launch needs"),
            Self::ForeignMemory { param } => write!(
                f,
                "{param:?} is not device memory of this verifier's driver and device"
            ),
            Self::GraphMismatch => {
                f.write_str("the views differ from the ones the graph was captured with")
            }
            Self::DeviceFlags(bits) => write!(f, "kernel error flags {bits:#x}"),
            Self::Misuse(m) => write!(f, "{m}"),
            Self::Stalled => f.write_str("every readback slot is held by a stalled copy"),
        }
    }
}
