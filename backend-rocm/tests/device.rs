//! The ROCm backend on a real device: the shared conformance suite and the readback
//! conformance suite. Every test prints SKIPPED and passes without a ROCm device (CI has none),
//! unless `SPECULA_REQUIRE_DEVICE` is set (a GPU host, where a skip would hide a failure).

use specula_core::Counters;
use specula_core::verify::{Check, Method, Verifier};
use specula_rocm::{RocmReadback, RocmVerifier};
use specula_tests::conformance::{self, BatchData, K};
use specula_tests::readback_conformance::{Rig, run_all};

fn verifier() -> Option<RocmVerifier<K>> {
    match RocmVerifier::<K>::new(0) {
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

#[test]
fn conformance_on_device() {
    if verifier().is_none() {
        return;
    }
    conformance::run_all(|| verifier().unwrap());
}

struct Rocm {
    v: RocmVerifier<K>,
    r: RocmReadback<K>,
    d: BatchData,
}

impl Rig<K> for Rocm {
    type R = RocmReadback<K>;
    fn readback(&mut self) -> &mut RocmReadback<K> {
        &mut self.r
    }
    fn step(&mut self) {
        conformance::run(&mut self.v, Method::Greedy, Check::Cheap, &self.d).unwrap();
    }
    fn totals(&mut self) -> Counters<K> {
        self.v.totals().unwrap()
    }
}

/// The readback conformance suite every implementation passes (misuse included).
#[test]
fn readback_conformance_on_device() {
    if verifier().is_none() {
        return;
    }
    let d = conformance::full_layout_batch(&mut conformance::Gen(0x20C3), 3);
    run_all(|| {
        let v = verifier().unwrap();
        let r = v.readback().unwrap();
        Rocm { v, r, d: d.clone() }
    });
}
