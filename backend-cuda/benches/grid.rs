//! Throughput and latency of the verification kernel on a real device (run by
//! `scripts/gpu-check.sh`), built so that the first GPU run answers every question of issue 17.
//!
//! 1. **Grid**: greedy, typical acceptance and rejection sampling in three draft set-ups — drafts
//!    equal to the targets (every test accepts: k scalar tests and the bonus race), *mixed*
//!    (draft probability twice the target's at even ids and half of it at odd ids: each test
//!    accepts with probability ½, and a rejection runs the residual race, whose candidates are the
//!    odd ids) and *fallback* (draft twice the target everywhere: accepted with probability ½, and
//!    a rejection finds no residual candidate, so the race over the target row runs too) — for
//!    batch 1/16/64/256, vocabulary 32k/128k/152k and k 1/4/8. For each: µs per call, the GB/s of
//!    probability data the algorithm needs (rows read in full, counted from the accepted lengths
//!    the kernel returned), and two yardsticks over the same number of bytes in the same run: a
//!    device-to-device copy (which also writes them: counted once, as the issue's "× copy") and a
//!    read-only kernel (`specula_read_baseline`, compiled here with the crate's NVRTC options), the
//!    real ceiling for a kernel that only reads.
//!    Below one request per multiprocessor the verifier splits each request's rows over S
//!    blocks (column S); the `1-block` column times the same case with one block per request.
//! 2. **L2**: at batch 1 and 16, µs per call with the rows resident in L2 (calls back to back)
//!    and with L2 flushed before every call (a 512 MB memset; only the launch is timed).
//! 3. **Latency at batch 1** (V 128k, k 4): p50/p90/p99 of single calls timed one by one with
//!    events, for a plain launch and for a CUDA-graph replay.
//!
//! Without a device it prints SKIPPED and exits 0 (1 when `SPECULA_REQUIRE_DEVICE` is set).

use specula_core::gpu::kernels;
use specula_core::gpu::{Driver, RowsView, StepViews, VerifyArgs, View, ViewMut};
use specula_core::verify::Method;
use specula_core::verify::{AcceptedOut, Outputs, TokensOut};
use specula_cuda::cudarc::driver::result;
use specula_cuda::cudarc::driver::sys::{
    CUdeviceptr, CUevent, CUevent_flags, CUfunction, CUstream,
};
use specula_cuda::{CudaDevice, CudaDeviceBuffer, CudaDriver};
use std::ffi::{CString, c_void};
use std::sync::Arc;

const K: usize = 8;
const L2_FLUSH_BYTES: usize = 512 << 20;

/// How the draft rows of a rejection-sampling case relate to the target rows (all constant
/// 1e-5, so the draft id 0 has target probability 1e-5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Drafts {
    /// No draft rows (greedy, typical acceptance).
    None,
    /// Draft rows equal to the targets: every test accepts.
    Equal,
    /// 2e-5 at even ids, 0.5e-5 at odd ids: tests accept with probability ½; the residual race
    /// has candidates (the odd ids).
    Mixed,
    /// 2e-5 everywhere: tests accept with probability ½; the residual has no candidate, so the
    /// race over the target row runs as the fallback.
    Fallback,
}

/// Rows of `vocab` floats a request that accepted `a` of `k` drafts needs read in full.
fn rows_needed(method: Method, drafts: Drafts, a: usize, k: usize) -> usize {
    match method {
        // Argmax / entropy of rows 0..=a (row k is the bonus row when all are accepted).
        Method::Greedy | Method::Typical => a + 1,
        // The bonus row when all are accepted.
        Method::Rejection if a == k => 1,
        // The residual of one (target, draft) row pair, and the target row again when the
        // residual had no candidate.
        Method::Rejection if drafts == Drafts::Fallback => 3,
        Method::Rejection => 2,
        // A method added later: count nothing rather than guess.
        _ => 0,
    }
}

/// A read-only kernel over the same bytes: every float4 is loaded and summed; one value per
/// block is stored only if the sum is an impossible value, so the loads stay.
const READ_BASELINE: &str = r#"
extern "C" __global__ void __launch_bounds__(256)
specula_read_baseline(const float4* __restrict__ p, unsigned long long n4, float* __restrict__ out) {
    float acc = 0.0f;
    const unsigned long long stride = (unsigned long long)gridDim.x * 256ull;
#pragma unroll 4
    for (unsigned long long i = blockIdx.x * 256ull + threadIdx.x; i < n4; i += stride) {
        const float4 q = p[i];
        acc += (q.x + q.y) + (q.z + q.w);
    }
    if (acc == -1.0f) out[blockIdx.x] = acc;
}
"#;

fn alloc(bytes: usize) -> CUdeviceptr {
    // SAFETY: the context is current; a plain allocation.
    unsafe { result::malloc_sync(bytes) }.expect("cuMemAlloc")
}

fn free(p: CUdeviceptr) {
    // SAFETY: `p` came from `up` / `alloc` and is freed once.
    unsafe { result::free_sync(p) }.expect("cuMemFree");
}

/// Sets every `step`-th float from float `first` on, `count` floats in all, to `value`.
fn fill(p: CUdeviceptr, first: usize, step: usize, count: usize, value: f32) {
    // SAFETY: the caller's buffer holds at least first + step * count floats.
    unsafe {
        specula_cuda::cudarc::driver::sys::cuMemsetD2D32_v2(
            p + (first * 4) as u64,
            step * 4,
            value.to_bits(),
            1,
            count,
        )
        .result()
        .expect("memset2D");
    }
}

struct Timer {
    stream: CUstream,
    ev0: CUevent,
    ev1: CUevent,
}

impl Timer {
    /// Mean µs per call of `n` calls back to back.
    fn mean(&self, n: usize, f: &mut dyn FnMut()) -> f64 {
        // SAFETY: live events and stream of the current context.
        unsafe {
            result::event::record(self.ev0, self.stream).expect("record");
            for _ in 0..n {
                f();
            }
            result::event::record(self.ev1, self.stream).expect("record");
            result::event::synchronize(self.ev1).expect("sync");
            f64::from(result::event::elapsed(self.ev0, self.ev1).expect("elapsed")) * 1e3 / n as f64
        }
    }

    /// µs of each of `n` calls timed alone (events around the call only; `before` runs first,
    /// untimed), sorted.
    fn each(&self, n: usize, before: &mut dyn FnMut(), f: &mut dyn FnMut()) -> Vec<f64> {
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            before();
            // SAFETY: as in `mean`.
            unsafe {
                result::event::record(self.ev0, self.stream).expect("record");
                f();
                result::event::record(self.ev1, self.stream).expect("record");
                result::event::synchronize(self.ev1).expect("sync");
                v.push(
                    f64::from(result::event::elapsed(self.ev0, self.ev1).expect("elapsed")) * 1e3,
                );
            }
        }
        v.sort_by(f64::total_cmp);
        v
    }
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// One benchmark case's device buffers (freed with their handles).
struct Case {
    with_draft: bool,
    b: usize,
    bufs: Vec<Arc<CudaDeviceBuffer>>,
    out: [Arc<CudaDeviceBuffer>; 2],
}

/// A device buffer holding `data`, uploaded on the driver's stream.
fn dev_up<T: specula_core::gpu::Element>(drv: &CudaDriver, data: &[T]) -> Arc<CudaDeviceBuffer> {
    let buf = drv.alloc(std::mem::size_of_val(data)).expect("alloc");
    drv.upload(drv.device().stream(), &buf, 0, data)
        .expect("upload");
    buf
}

impl Case {
    #[allow(clippy::too_many_arguments)]
    fn new(
        drv: &CudaDriver,
        method: Method,
        drafts: Drafts,
        b: usize,
        vocab: usize,
        k: usize,
        seed: u64,
    ) -> Self {
        let with_draft = drafts != Drafts::None;
        let shape = kernels::shape_words(
            b as u32,
            k as u32,
            vocab as u32,
            with_draft.then_some(vocab as u32),
            vocab as u32,
            kernels::method_code(method),
            K as u32,
        );
        let seeds: Vec<u64> = (0..b as u64).map(|i| seed + i).collect();
        let bufs = vec![
            dev_up(drv, &shape),
            dev_up(drv, &vec![k as u32; b]),
            dev_up(drv, &vec![0u32; b * k]),
            dev_up(drv, &seeds),
            dev_up(drv, &vec![0u64; b]),
            dev_up(drv, &vec![0.09f32; b]),
            dev_up(drv, &vec![0.3f32; b]),
        ];
        let out = [
            dev_up(drv, &vec![0u32; b]),
            dev_up(drv, &vec![0u32; b * (k + 1)]),
        ];
        Self {
            with_draft,
            b,
            bufs,
            out,
        }
    }

    /// Typed views of the case, reading `target` and `draft` (the shared probability rows).
    fn args<'a>(
        &'a mut self,
        target: &'a Arc<CudaDeviceBuffer>,
        draft: &'a Arc<CudaDeviceBuffer>,
    ) -> VerifyArgs<'a, CudaDriver> {
        let [acc, tok] = &mut self.out;
        let bufs = &self.bufs;
        VerifyArgs {
            step: StepViews {
                capacity: self.b as u32,
                shape: View::new(&bufs[0]),
                draft_probs: self.with_draft.then(|| RowsView::F32(View::new(draft))),
                target: RowsView::F32(View::new(target)),
                seed: View::new(&bufs[3]),
                offset: View::new(&bufs[4]),
                eps: View::new(&bufs[5]),
                delta: View::new(&bufs[6]),
                accepted: ViewMut::new(acc),
                tokens: ViewMut::new(tok),
                temperature: None,
            },
            k: View::new(&bufs[1]),
            draft_ids: View::new(&bufs[2]),
            cu_num_draft_tokens: None,
            bonus: None,
            sampling: None,
            recovered: None,
            draft_first_row: None,
        }
    }
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
    let drv = CudaDriver::new(dev.clone());
    let mut v = dev.verifier::<K>().expect("verifier");
    // Never given split scratch: always one block per request, the yardstick for the split
    // launch `v` uses below one request per multiprocessor.
    let v1 = dev.verifier::<K>().expect("verifier");
    v.reserve_split(256).expect("split scratch");
    let stream = dev.stream().cu_stream();
    println!("device arch {}", dev.arch());

    // The read-only baseline kernel, compiled with the same NVRTC options as the verifier.
    let ptx = specula_cuda::compile_source_ptx(READ_BASELINE, "read_baseline.cu", dev.arch())
        .expect("compile the read baseline");
    let ptx = CString::new(ptx).expect("PTX has no NUL");
    // SAFETY: a NUL-terminated PTX image; the context is current.
    let module = unsafe { result::module::load_data(ptx.as_ptr().cast()) }.expect("load module");
    // SAFETY: the module is loaded and outlives every use of the function (never unloaded).
    let read_fn: CUfunction = unsafe {
        result::module::get_function(module, CString::new("specula_read_baseline").unwrap())
    }
    .expect("get function");

    let (batches, vocabs, ks) = (
        [1usize, 16, 64, 256],
        [32_000usize, 128_256, 152_064],
        [1usize, 4, 8],
    );
    let max_floats = 256 * 9 * 152_064;
    let target_buf = drv.alloc(max_floats * 4).expect("alloc");
    let draft_mixed_buf = drv.alloc(max_floats * 4).expect("alloc");
    let draft_fallback_buf = drv.alloc(max_floats * 4).expect("alloc");
    let (target, draft_mixed, draft_fallback) = (
        target_buf.device_ptr(),
        draft_mixed_buf.device_ptr(),
        draft_fallback_buf.device_ptr(),
    );
    let copy_dst = alloc(max_floats * 4);
    let flush = alloc(L2_FLUSH_BYTES);
    let sink = alloc(1 << 20);
    // Constant target rows: argmax 0; 1e-5 keeps it a plausible (unnormalised) probability.
    fill(target, 0, 1, max_floats, 1e-5);
    fill(draft_mixed, 0, 2, max_floats / 2, 2e-5);
    fill(draft_mixed, 1, 2, max_floats / 2, 0.5e-5);
    fill(draft_fallback, 0, 1, max_floats, 2e-5);
    let timer = Timer {
        stream,
        ev0: result::event::create(CUevent_flags::CU_EVENT_DEFAULT).expect("event"),
        ev1: result::event::create(CUevent_flags::CU_EVENT_DEFAULT).expect("event"),
    };
    let mut flush_l2 = || {
        // SAFETY: `flush` holds L2_FLUSH_BYTES bytes; enqueued on the timed stream.
        unsafe {
            specula_cuda::cudarc::driver::sys::cuMemsetD32Async(
                flush,
                0,
                L2_FLUSH_BYTES / 4,
                stream,
            )
            .result()
            .expect("flush memset");
        }
    };
    let read_bytes = |bytes: usize| {
        let mut p = target;
        let mut n4 = (bytes / 16) as u64;
        let mut out = sink;
        let mut params: [*mut c_void; 3] = [
            core::ptr::from_mut(&mut p).cast(),
            core::ptr::from_mut(&mut n4).cast(),
            core::ptr::from_mut(&mut out).cast(),
        ];
        // SAFETY: the baseline kernel takes (const float4*, u64, float*); `target` holds at
        // least `bytes`, `sink` 1 MB (≥ 4 B per block of the 2048).
        unsafe {
            result::launch_kernel(read_fn, (2048, 1, 1), (256, 1, 1), 0, stream, &mut params)
        }
        .expect("launch read baseline");
    };

    let cases = [
        (Method::Greedy, Drafts::None),
        (Method::Typical, Drafts::None),
        (Method::Rejection, Drafts::Equal),
        (Method::Rejection, Drafts::Mixed),
        (Method::Rejection, Drafts::Fallback),
    ];
    println!(
        "{:>9} {:>8} {:>5} {:>7} {:>2} {:>3} {:>9} {:>9} {:>7} {:>8} {:>8} {:>6} {:>6} {:>8} {:>10}",
        "method",
        "drafts",
        "batch",
        "vocab",
        "k",
        "S",
        "us/call",
        "1-block",
        "GB/s",
        "copy",
        "read",
        "×copy",
        "×read",
        "accepted",
        "L2-flushed"
    );
    let mut seed = 1u64;
    for &(method, drafts) in &cases {
        for &b in &batches {
            for &vocab in &vocabs {
                for &k in &ks {
                    let draft = match drafts {
                        Drafts::Mixed => &draft_mixed_buf,
                        Drafts::Fallback => &draft_fallback_buf,
                        _ => &target_buf,
                    };
                    seed += 1_000;
                    let mut case = Case::new(&drv, method, drafts, b, vocab, k, seed);
                    let args = case.args(&target_buf, draft);
                    let n = if b == 1 { 300 } else { 30 };
                    let slices = v.slices_for(b as u32);
                    // SAFETY: every buffer of the case is sized for this (b, k, vocab).
                    let mut launch = || unsafe { v.launch(&args).expect("launch") };
                    timer.mean(3, &mut launch); // warm-up
                    let us = timer.mean(n, &mut launch);
                    let flushed = if b <= 16 {
                        let t = timer.each(20, &mut flush_l2, &mut launch);
                        format!("{:.2}", pct(&t, 0.5))
                    } else {
                        "-".into()
                    };
                    let one_block = if slices > 1 {
                        // SAFETY: as for `launch`.
                        let mut launch1 = || unsafe { v1.launch(&args).expect("launch") };
                        timer.mean(3, &mut launch1);
                        format!("{:.2}", timer.mean(n, &mut launch1))
                    } else {
                        "-".into()
                    };
                    let mut accepted = vec![0u32; b];
                    let mut tokens = vec![0u32; b * (k + 1)];
                    v.download_outputs(
                        &args,
                        &mut Outputs::new(AcceptedOut(&mut accepted), TokensOut(&mut tokens)),
                    )
                    .expect("download");
                    let rows: usize = accepted
                        .iter()
                        .map(|&a| rows_needed(method, drafts, a as usize, k))
                        .sum();
                    let bytes = (rows * vocab * 4).max(16);
                    let mut copy = || {
                        // SAFETY: both buffers hold `max_floats` ≥ bytes / 4 floats.
                        unsafe { result::memcpy_dtod_async(copy_dst, target, bytes, stream) }
                            .expect("copy");
                    };
                    timer.mean(3, &mut copy);
                    let copy_us = timer.mean(n, &mut copy);
                    let mut read = || read_bytes(bytes);
                    timer.mean(3, &mut read);
                    let read_us = timer.mean(n, &mut read);
                    let gbs = bytes as f64 / us / 1e3;
                    let mean_acc = accepted.iter().map(|&a| f64::from(a)).sum::<f64>() / b as f64;
                    println!(
                        "{:>9} {:>8} {b:>5} {vocab:>7} {k:>2} {slices:>3} {us:>9.2} {one_block:>9} {gbs:>7.1} {:>8.1} {:>8.1} {:>6.2} {:>6.2} {mean_acc:>8.2} {flushed:>10}",
                        format!("{method:?}"),
                        format!("{drafts:?}"),
                        bytes as f64 / copy_us / 1e3,
                        bytes as f64 / read_us / 1e3,
                        copy_us / us,
                        read_us / us,
                    );
                }
            }
        }
    }

    println!(
        "\nbatch 1, V 128256, k 4: single calls timed one by one (us): launch vs graph replay"
    );
    println!(
        "{:>9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}",
        "method", "drafts", "p50", "p90", "p99", "graph50", "graph90", "graph99"
    );
    for &(method, drafts) in &cases {
        let draft = match drafts {
            Drafts::Mixed => &draft_mixed_buf,
            Drafts::Fallback => &draft_fallback_buf,
            _ => &target_buf,
        };
        let mut case = Case::new(&drv, method, drafts, 1, 128_256, 4, 7);
        let args = case.args(&target_buf, draft);
        // SAFETY: as above.
        let mut launch = || unsafe { v.launch(&args).expect("launch") };
        let plain = timer.each(300, &mut || {}, &mut launch);
        // SAFETY: as for `launch`; the buffers outlive the graph (dropped first, below).
        let graph = unsafe { v.capture(&args) }.expect("capture");
        let mut replay = || v.replay(&graph).expect("replay");
        let replayed = timer.each(300, &mut || {}, &mut replay);
        drop(graph);
        println!(
            "{:>9} {:>8} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2}",
            format!("{method:?}"),
            format!("{drafts:?}"),
            pct(&plain, 0.5),
            pct(&plain, 0.9),
            pct(&plain, 0.99),
            pct(&replayed, 0.5),
            pct(&replayed, 0.9),
            pct(&replayed, 0.99),
        );
    }
    for p in [copy_dst, flush, sink] {
        free(p);
    }
}
