//! The readback conformance suite (`specula_tests::readback_conformance`) on every readback
//! that runs without a device: the host readback, the CPU backend's, and the GPU
//! orchestration's ring over the host driver (prompt and slow copies). CUDA and ROCm run the
//! same suite in their own tests when a device is present.

use specula::HostReadback;
use specula::cpu::{CpuReadback, CpuVerifier};
use specula_core::Counters;
use specula_core::gpu::{GpuReadback, GpuVerifier, Staging};
use specula_core::verify::Produce;
use specula_core::verify::{Check, Method, Verifier};
use specula_tests::conformance::{self as c, BatchData, Gen, K, OutData};
use specula_tests::host_driver::HostDriver;
use specula_tests::kernel_host::Mode;
use specula_tests::readback_conformance::{Rig, run_all};

struct Host(HostReadback<K>);

impl Rig<K> for Host {
    type R = HostReadback<K>;
    fn readback(&mut self) -> &mut HostReadback<K> {
        &mut self.0
    }
    fn step(&mut self) {
        self.0.record(2, 1).unwrap();
    }
    fn totals(&mut self) -> Counters<K> {
        *self.0.counters()
    }
}

#[test]
fn host_readback() {
    run_all(|| Host(HostReadback::default()));
}

fn batch(seed: u64) -> BatchData {
    c::full_layout_batch(&mut Gen(seed), 3)
}

struct Cpu {
    v: CpuVerifier<K>,
    r: CpuReadback<K>,
    d: BatchData,
}

impl Rig<K> for Cpu {
    type R = CpuReadback<K>;
    fn readback(&mut self) -> &mut CpuReadback<K> {
        &mut self.r
    }
    fn step(&mut self) {
        let mut o = OutData::new(self.d.requests(), self.d.k_max);
        Verifier::verify(
            &mut self.v,
            Method::Greedy,
            Check::Cheap,
            &self.d.view(),
            &mut o.view(),
        )
        .unwrap();
    }
    fn totals(&mut self) -> Counters<K> {
        Verifier::totals(&mut self.v).unwrap()
    }
}

#[test]
fn cpu_readback() {
    run_all(|| {
        let v = CpuVerifier::<K>::new(1).unwrap();
        let r = v.readback();
        Cpu {
            v,
            r,
            d: batch(0xC9),
        }
    });
}

struct Gpu {
    v: GpuVerifier<HostDriver, K>,
    r: GpuReadback<HostDriver, K>,
    s: Staging<HostDriver>,
    d: BatchData,
}

impl Rig<K> for Gpu {
    type R = GpuReadback<HostDriver, K>;
    fn readback(&mut self) -> &mut GpuReadback<HostDriver, K> {
        &mut self.r
    }
    fn step(&mut self) {
        let a = self
            .s
            .write::<K>(
                self.v.driver(),
                self.v.stream(),
                Method::Greedy,
                &self.d.view(),
                Produce::TOKENS,
            )
            .unwrap();
        // SAFETY: staged views; nothing else writes the staging buffers.
        unsafe { self.v.launch_staged(&a) }.unwrap();
    }
    fn totals(&mut self) -> Counters<K> {
        Verifier::totals(&mut self.v).unwrap()
    }
}

fn gpu(delay_ms: u64) -> Gpu {
    let mut v = GpuVerifier::new(HostDriver::new(Mode::Cuda, 32, 1)).unwrap();
    let d = batch(0x69);
    let mut s = Staging::new();
    let mut o = OutData::new(d.requests(), d.k_max);
    v.stage(&mut s, Method::Greedy, Check::Cheap, &d.view(), &o.view())
        .unwrap();
    let r = v.readback().unwrap();
    let drv = v.driver();
    drv.faults().target(drv.stream_id(r.copy_stream()));
    drv.faults()
        .set_delay(std::time::Duration::from_millis(delay_ms));
    Gpu { v, r, s, d }
}

#[test]
fn gpu_ring_over_the_host_driver() {
    run_all(|| gpu(0));
}

#[test]
fn gpu_ring_over_the_host_driver_with_slow_copies() {
    run_all(|| gpu(5));
}
