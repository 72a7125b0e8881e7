//! Throughput grid of the verification kernel on a real device (run by `scripts/gpu-check.sh`).
//!
//! For batch 1/16/64/256, vocabulary 32k/128k/152k and k 1/4/8 it times greedy verification of
//! constant target rows (argmax 0 = every draft id, so every request accepts all k and the kernel
//! reads all k + 1 rows in full: the worst case for bytes read), and a device-to-device copy of
//! the same number of bytes in the same run. Prints µs per call and GB/s of probability data
//! read, and the copy's GB/s as the yardstick. Without a device it prints SKIPPED and exits 0.

use cudarc::driver::result;
use cudarc::driver::sys::{CUdeviceptr, CUevent_flags};
use specula_core::kernels;
use specula_core::verify::Method;
use specula_cuda::{CudaDevice, CudaVerifier, DeviceArgs};
use std::sync::Arc;

const K: usize = 8;

fn up<T>(data: &[T]) -> CUdeviceptr {
    let bytes = core::mem::size_of_val(data).max(16);
    // SAFETY: the context is current (bound in main); `bytes` > 0; the copy fits the allocation.
    unsafe {
        let p = result::malloc_sync(bytes).expect("cuMemAlloc");
        result::memcpy_htod_sync(p, data).expect("cuMemcpyHtoD");
        p
    }
}

fn free(p: CUdeviceptr) {
    // SAFETY: `p` came from `up` / malloc_sync and is freed once.
    unsafe { result::free_sync(p) }.expect("cuMemFree");
}

fn main() {
    let dev = match CudaDevice::new(0) {
        Ok(d) => Arc::new(d),
        Err(e) => {
            println!("SKIPPED: no usable CUDA device ({e})");
            return;
        }
    };
    dev.context().bind_to_thread().expect("bind");
    let mut v = CudaVerifier::<K>::new(dev.clone()).expect("verifier");
    let stream = dev.stream().cu_stream();
    let (batches, vocabs, ks) = (
        [1usize, 16, 64, 256],
        [32_000usize, 128_256, 152_064],
        [1usize, 4, 8],
    );
    let max_floats = 256 * 9 * 152_064;
    // SAFETY: plain allocations and a memset of their full size, in the current context.
    let (target, copy_dst) = unsafe {
        let t = result::malloc_sync(max_floats * 4).expect("alloc target");
        let d = result::malloc_sync(max_floats * 4).expect("alloc copy");
        // Any constant row has argmax 0; 1e-5 keeps it a plausible (unnormalised) probability.
        let bits = 1e-5f32.to_bits();
        cudarc::driver::sys::cuMemsetD32_v2(t, bits, max_floats)
            .result()
            .expect("memset");
        (t, d)
    };
    let ev0 = result::event::create(CUevent_flags::CU_EVENT_DEFAULT).expect("event");
    let ev1 = result::event::create(CUevent_flags::CU_EVENT_DEFAULT).expect("event");
    let time = |n: usize, f: &mut dyn FnMut()| -> f64 {
        // SAFETY: live events and stream of the current context.
        unsafe {
            result::event::record(ev0, stream).expect("record");
            for _ in 0..n {
                f();
            }
            result::event::record(ev1, stream).expect("record");
            result::event::synchronize(ev1).expect("sync");
            f64::from(result::event::elapsed(ev0, ev1).expect("elapsed")) * 1e3 / n as f64
        }
    };
    println!(
        "{:>5} {:>7} {:>2} {:>10} {:>9} {:>12} {:>6}",
        "batch", "vocab", "k", "us/call", "GB/s", "copy GB/s", "ratio"
    );
    for &b in &batches {
        for &vocab in &vocabs {
            for &k in &ks {
                let shape = kernels::shape_words(
                    b as u32,
                    k as u32,
                    vocab as u32,
                    None,
                    vocab as u32,
                    kernels::method_code(Method::Greedy),
                    K as u32,
                );
                let bufs = [
                    up(&shape),
                    up(&vec![k as u32; b]),
                    up(&vec![0u32; b * k]),
                    up(&vec![1u64; b]),
                    up(&vec![0u64; b]),
                    up(&vec![0.09f32; b]),
                    up(&vec![0.3f32; b]),
                    up(&vec![0u32; b]),
                    up(&vec![0u32; b * (k + 1)]),
                ];
                let args = DeviceArgs {
                    capacity: b as u32,
                    shape: bufs[0],
                    k: bufs[1],
                    draft_ids: bufs[2],
                    draft_probs: 0,
                    target_probs: target,
                    seed: bufs[3],
                    offset: bufs[4],
                    eps: bufs[5],
                    delta: bufs[6],
                    accepted: bufs[7],
                    tokens: bufs[8],
                };
                let bytes = b * (k + 1) * vocab * 4;
                let n = if b == 1 { 500 } else { 30 };
                // SAFETY: every buffer above is sized for this (b, k, vocab).
                let mut launch = || unsafe { v.launch(&args).expect("launch") };
                time(3, &mut launch); // warm-up
                let us = time(n, &mut launch);
                let mut copy = || {
                    // SAFETY: both buffers hold `max_floats` ≥ bytes / 4 floats.
                    unsafe { result::memcpy_dtod_async(copy_dst, target, bytes, stream) }
                        .expect("copy");
                };
                time(3, &mut copy);
                let copy_us = time(n, &mut copy);
                let mut accepted = vec![0u32; b];
                let mut tokens = vec![0u32; b * (k + 1)];
                v.download_outputs(&args, &mut accepted, &mut tokens)
                    .expect("download");
                assert!(accepted.iter().all(|&a| a as usize == k), "all accepted");
                let gbs = bytes as f64 / us / 1e3;
                let copy_gbs = bytes as f64 / copy_us / 1e3;
                println!(
                    "{b:>5} {vocab:>7} {k:>2} {us:>10.2} {gbs:>9.1} {copy_gbs:>12.1} {:>6.2}",
                    gbs / copy_gbs
                );
                for p in bufs {
                    free(p);
                }
            }
        }
    }
    free(target);
    free(copy_dst);
}
