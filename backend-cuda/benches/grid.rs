//! Throughput grid of the verification kernel on a real device (run by `scripts/gpu-check.sh`).
//!
//! For each method, batch 1/16/64/256, vocabulary 32k/128k/152k and k 1/4/8 it times
//! verification of constant target rows (and, for rejection sampling, draft rows equal to them),
//! where every request accepts all k drafts: for greedy and typical acceptance the worst case for
//! bytes read (all k + 1 rows in full), for rejection sampling the cheap path (k scalar tests and
//! one bonus row). Next to each it times a device-to-device copy of the same number of bytes in
//! the same run. It prints µs per call, the GB/s of probability data the algorithm needs (rows
//! read in full, counted from the accepted lengths the kernel returned) and the copy's GB/s as
//! the yardstick. Then, at batch 1, µs per call of a plain launch against a replay of the same
//! launch captured in a CUDA graph. Without a device it prints SKIPPED and exits 0 (1 when
//! `SPECULA_REQUIRE_DEVICE` is set).

use cudarc::driver::result;
use cudarc::driver::sys::{CUdeviceptr, CUevent_flags};
use specula_core::kernels;
use specula_core::verify::Method;
use specula_cuda::{CudaDevice, CudaVerifier, DeviceArgs};

/// Rows of `vocab` floats a request that accepted `a` of `k` drafts needs read in full.
fn rows_needed(method: Method, a: usize, k: usize) -> usize {
    match method {
        // Argmax / entropy of rows 0..=a (row k is the bonus row when all are accepted).
        Method::Greedy | Method::Typical => a + 1,
        // The bonus row when all are accepted; otherwise the residual of one row pair.
        Method::Rejection if a == k => 1,
        Method::Rejection => 2,
        // A method added later: count nothing rather than guess.
        _ => 0,
    }
}
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
            // On the GPU host (scripts/gpu-check.sh sets this) a skip is a failure.
            if std::env::var_os("SPECULA_REQUIRE_DEVICE").is_some() {
                std::process::exit(1);
            }
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
    let mut replay_rows = Vec::new();
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
        "{:>9} {:>5} {:>7} {:>2} {:>10} {:>9} {:>10} {:>6}",
        "method", "batch", "vocab", "k", "us/call", "GB/s", "copy GB/s", "ratio"
    );
    for method in [Method::Greedy, Method::Typical, Method::Rejection] {
        for &b in &batches {
            for &vocab in &vocabs {
                for &k in &ks {
                    let with_draft = method == Method::Rejection;
                    let shape = kernels::shape_words(
                        b as u32,
                        k as u32,
                        vocab as u32,
                        with_draft.then_some(vocab as u32),
                        vocab as u32,
                        kernels::method_code(method),
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
                        // Draft rows equal to the target rows (the buffer holds more than
                        // b * k rows): every rejection-sampling test accepts.
                        draft_probs: if with_draft { target } else { 0 },
                        target_probs: target,
                        seed: bufs[3],
                        offset: bufs[4],
                        eps: bufs[5],
                        delta: bufs[6],
                        accepted: bufs[7],
                        tokens: bufs[8],
                    };
                    let n = if b == 1 { 500 } else { 30 };
                    // SAFETY: every buffer above is sized for this (b, k, vocab).
                    let mut launch = || unsafe { v.launch(&args).expect("launch") };
                    time(3, &mut launch); // warm-up
                    let us = time(n, &mut launch);
                    let mut accepted = vec![0u32; b];
                    let mut tokens = vec![0u32; b * (k + 1)];
                    v.download_outputs(&args, &mut accepted, &mut tokens)
                        .expect("download");
                    let rows: usize = accepted
                        .iter()
                        .map(|&a| rows_needed(method, a as usize, k))
                        .sum();
                    let bytes = rows * vocab * 4;
                    let mut copy = || {
                        // SAFETY: both buffers hold `max_floats` ≥ bytes / 4 floats.
                        unsafe { result::memcpy_dtod_async(copy_dst, target, bytes, stream) }
                            .expect("copy");
                    };
                    time(3, &mut copy);
                    let copy_us = time(n, &mut copy);
                    let gbs = bytes as f64 / us / 1e3;
                    let copy_gbs = bytes as f64 / copy_us / 1e3;
                    let all = if accepted.iter().all(|&a| a as usize == k) {
                        ""
                    } else {
                        "  (not all accepted)"
                    };
                    println!(
                        "{:>9} {b:>5} {vocab:>7} {k:>2} {us:>10.2} {gbs:>9.1} {copy_gbs:>10.1} {:>6.2}{all}",
                        format!("{method:?}"),
                        gbs / copy_gbs
                    );
                    if b == 1 && k == 4 {
                        // SAFETY: as for `launch`; the buffers outlive the graph (freed below).
                        let graph = unsafe { v.capture(&args) }.expect("capture");
                        // SAFETY: as above.
                        let mut replay = || unsafe { graph.replay().expect("replay") };
                        time(3, &mut replay);
                        replay_rows.push((method, vocab, us, time(n, &mut replay)));
                    }
                    for p in bufs {
                        free(p);
                    }
                }
            }
        }
    }
    println!("\nbatch 1, k 4: plain launch vs CUDA-graph replay (us per call)");
    println!(
        "{:>9} {:>7} {:>10} {:>10}",
        "method", "vocab", "launch", "replay"
    );
    for (method, vocab, launch, replay) in replay_rows {
        println!(
            "{:>9} {vocab:>7} {launch:>10.2} {replay:>10.2}",
            format!("{method:?}")
        );
    }
    free(target);
    free(copy_dst);
}
