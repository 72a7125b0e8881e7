//! [`ErrorKind`]: what a backend failure means to the runtime, one name per concept across
//! backends (CPU, CUDA, ROCm), so a runtime matches kinds, never variant lists.

/// The kind of a backend failure. Each backend's error type has a `kind()` returning this.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum ErrorKind {
    /// The backend was asked for but is not compiled into this build (enable its feature).
    NotCompiledIn,
    /// The backend's driver or runtime library could not be loaded.
    NoDriver,
    /// The driver loaded but there is no usable device (or not the ordinal asked for).
    NoDevice,
    /// The run-time kernel compiler (NVRTC, hiprtc) could not be loaded.
    NoCompiler,
    /// The kernel compiler refused the kernel text.
    Compile,
    /// The caller's input was refused: a batch that failed validation, a size the kernel's shape
    /// words cannot hold, a buffer of the wrong length, a malformed backend name.
    InvalidInput,
    /// An API was used out of order (a readback polled with none in flight, or started twice).
    Misuse,
    /// The device, its driver or the kernel failed while running.
    Device,
    /// The host could not provide a resource (threads, memory).
    Resource,
}

impl ErrorKind {
    /// The backend cannot run here at all (not compiled in, or no driver, device or compiler):
    /// a runtime would fall back to another backend; retrying cannot help.
    #[must_use]
    pub fn is_unavailable(self) -> bool {
        matches!(
            self,
            Self::NotCompiledIn | Self::NoDriver | Self::NoDevice | Self::NoCompiler
        )
    }

    /// A short lowercase name (`"no device"`, `"invalid input"`, ...), for logs and exit messages.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotCompiledIn => "not compiled in",
            Self::NoDriver => "no driver",
            Self::NoDevice => "no device",
            Self::NoCompiler => "no kernel compiler",
            Self::Compile => "kernel compilation failed",
            Self::InvalidInput => "invalid input",
            Self::Misuse => "misuse",
            Self::Device => "device failure",
            Self::Resource => "resource exhausted",
        }
    }
}

/// An error with an [`ErrorKind`]: what generic code (the GPU orchestration, the conformance
/// suites) needs of a backend's or driver's error type.
pub trait HasKind {
    /// The kind of this failure.
    fn kind(&self) -> ErrorKind;
}

impl HasKind for core::convert::Infallible {
    fn kind(&self) -> ErrorKind {
        match *self {}
    }
}

impl core::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::ErrorKind;

    #[test]
    fn unavailable_kinds_are_the_ones_a_retry_cannot_fix() {
        for k in [
            ErrorKind::NotCompiledIn,
            ErrorKind::NoDriver,
            ErrorKind::NoDevice,
            ErrorKind::NoCompiler,
        ] {
            assert!(k.is_unavailable(), "{k}");
        }
        for k in [
            ErrorKind::Compile,
            ErrorKind::InvalidInput,
            ErrorKind::Misuse,
            ErrorKind::Device,
            ErrorKind::Resource,
        ] {
            assert!(!k.is_unavailable(), "{k}");
        }
        assert_eq!(ErrorKind::NoDevice.as_str(), "no device");
    }
}
