//! What the device modules share.

use specula_rocm::{RocmDevice, RocmVerifier};
use specula_tests::conformance::K;

/// A verifier on device 0, or `None` after printing SKIPPED when this machine has no usable ROCm
/// device; with `SPECULA_REQUIRE_DEVICE` set (a GPU host) that is a failure instead.
pub fn verifier() -> Option<RocmVerifier<K>> {
    match RocmDevice::new(0).and_then(|d| d.verifier::<K>()) {
        Ok(v) => Some(v),
        Err(e) => {
            assert!(
                std::env::var_os("SPECULA_REQUIRE_DEVICE").is_none(),
                "SPECULA_REQUIRE_DEVICE is set but no ROCm device opened: {e}"
            );
            println!("SKIPPED: no usable ROCm device ({e})");
            None
        }
    }
}
