//! Without an AMD GPU (every CI machine and developer machine of this project), constructing the
//! backend must return a typed error, never panic or abort.

use specula_core::gpu::GpuError;
use specula_core::verify::Verifier;
use specula_rocm::{RocmDevice, RocmError, RocmVerifier, device_count};
use specula_tests::skip::skipped;
use std::path::Path;

/// What this machine has: `Some(true)` with a ROCm device, `Some(false)` with the runtime but no
/// device, `None` without the runtime.
fn machine() -> Option<bool> {
    match device_count() {
        Ok(_) => Some(true),
        Err(RocmError::NoDevice { .. }) => Some(false),
        Err(RocmError::NoRuntime { .. }) => None,
        Err(other) => panic!("device_count: unexpected error {other:?}"),
    }
}

#[test]
fn constructing_without_a_device_is_a_typed_error() {
    match machine() {
        Some(true) => {
            // Not a missing tool: this machine has what the test cannot use.
            println!("SKIPPED: a ROCm device is present; the no-device path cannot be tested here");
        }
        Some(false) => {
            // The runtime loaded and answered; with no /dev/kfd it must say "no device".
            let err = RocmDevice::new(0)
                .and_then(|d| d.verifier::<4>())
                .expect_err("no device, yet construction succeeded");
            assert!(
                matches!(err, RocmError::NoDevice { code } if code != 0 || !Path::new("/dev/kfd").exists()),
                "{err:?}"
            );
            assert!(err.to_string().contains("no ROCm device"), "{err}");
            assert!(matches!(
                RocmDevice::new(0),
                Err(RocmError::NoDevice { .. })
            ));
            assert!(matches!(
                RocmDevice::new(7),
                Err(RocmError::NoDevice { .. })
            ));
        }
        None => {
            skipped(
                "specula-rocm",
                "constructing_without_a_device_is_a_typed_error (partly)",
                "no HIP runtime; checked the NoRuntime error instead (run scripts/rocm-tools.sh)",
            );
            let err = RocmDevice::new(0)
                .and_then(|d| d.verifier::<4>())
                .expect_err("no runtime, yet construction succeeded");
            assert!(matches!(err, RocmError::NoRuntime { .. }), "{err:?}");
        }
    }
}

#[test]
fn runtime_version_is_reported_when_the_runtime_loads() {
    if machine().is_none() {
        skipped(
            "specula-rocm",
            "runtime_version_is_reported_when_the_runtime_loads",
            "no HIP runtime (run scripts/rocm-tools.sh)",
        );
        return;
    }
    // hipRuntimeGetVersion works without a device: major·10⁷ + minor·10⁵ + patch.
    let v = specula_rocm::runtime_version().expect("hipRuntimeGetVersion");
    assert!(v >= 50_000_000, "implausible HIP runtime version {v}");
}

#[test]
fn the_verifier_type_implements_the_core_trait() {
    fn is_verifier<V: Verifier<4, Error = GpuError<RocmError>>>() {}
    is_verifier::<RocmVerifier<4>>();
}
