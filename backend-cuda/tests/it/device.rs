//! The CUDA backend on a real device: the shared conformance suite, the step path's call
//! counts and the asynchronous readback. Every test prints SKIPPED and passes when the machine
//! has no CUDA driver or device (CI), unless `SPECULA_REQUIRE_DEVICE` is set, as
//! `scripts/gpu-check.sh` does when it runs them on a GPU host.

use crate::support::{device, download, upload};
use specula_core::Readback;
use specula_core::gpu::Staging;
use specula_core::verify::Produce;
use specula_core::verify::{AcceptedOut, Outputs, TokensOut};
use specula_core::verify::{Check, Method, Reference, Verifier};
use specula_cuda::{CudaDevice, CudaError, CudaReadback, CudaVerifier, call_counts};
use specula_tests::conformance::{self, K};
use std::sync::Arc;
use std::task::Poll;

#[test]
fn construction_without_a_device_is_a_typed_error() {
    // Runs everywhere: on a machine without CUDA this is the path under test.
    match CudaDevice::new(usize::MAX) {
        Err(CudaError::NoDriver) => assert!(!specula_cuda::driver_present()),
        Err(CudaError::NoDevice) => {}
        other => panic!("ordinal usize::MAX must not open: {other:?}"),
    }
    match CudaDevice::new(0) {
        Ok(d) => println!("device present: {}", d.arch()),
        Err(e) => assert!(
            matches!(
                e,
                CudaError::NoDriver | CudaError::NoDevice | CudaError::NoNvrtc
            ),
            "unexpected error without a device: {e:?}"
        ),
    }
}

#[test]
fn conformance_on_device() {
    let Some(dev) = device() else { return };
    conformance::run_all(|| dev.verifier::<K>().unwrap());
    // The recovered-token output, written by the logits entries in the same launch.
    conformance::recovered_output(|| dev.verifier::<K>().unwrap(), 0xDE_0013, 40);
}

/// Also the caller's own stream: verification ordered on a stream the backend did not make.
#[test]
fn works_on_the_callers_stream() {
    let Some(dev) = device() else { return };
    let stream = dev.context().new_stream().unwrap();
    let theirs = Arc::new(CudaDevice::with_stream(stream).unwrap());
    conformance::exact_cases(|| theirs.verifier::<K>().unwrap());
}

/// The decode step (launch, readback start, poll) makes no synchronising driver call, and the
/// readbacks it completes are consistent snapshots that end at the exact totals.
#[test]
fn step_path_never_synchronises_and_readback_is_exact() {
    let Some(dev) = device() else { return };
    let mut g = conformance::Gen(0xC0DA);
    let (d, _) = conformance::random_batch(&mut g, conformance::RandomSpec::default());
    let per_step = conformance::reference(Method::Rejection, Check::Cheap, &d)
        .unwrap()
        .1;
    let mut v = dev.verifier::<K>().unwrap();
    let mut staging = Staging::new();
    let mut out = conformance::OutData::new(d.requests(), d.k_max);
    v.stage(
        &mut staging,
        Method::Rejection,
        Check::Cheap,
        &d.view(),
        &out.view(),
    )
    .unwrap();
    let args = staging
        .write::<K>(
            v.driver(),
            v.stream(),
            Method::Rejection,
            &d.view(),
            Produce::TOKENS,
        )
        .unwrap();
    let mut rb = CudaReadback::new(&v).unwrap();
    let steps = 200u64;
    let mut completed = Vec::new();
    let before = call_counts();
    rb.start().unwrap();
    for _ in 0..steps {
        // SAFETY: views `Staging::write` returned; nothing else writes the staging buffers.
        unsafe { v.launch(&args).unwrap() };
        match rb.poll() {
            Poll::Pending => {}
            Poll::Ready(r) => {
                completed.push(r.unwrap());
                rb.start().unwrap();
            }
        }
    }
    let after = call_counts();
    assert_eq!(
        after.synchronizing - before.synchronizing,
        0,
        "the step path made a synchronising call"
    );
    assert!(after.calls > before.calls, "calls are counted");
    let fin = rb.flush().unwrap();
    assert_eq!(rb.error_flags(), 0);
    let mut want = per_step;
    for _ in 1..steps {
        want.add(&per_step);
    }
    assert_eq!(fin, want, "flush returns the exact totals");
    assert_eq!(v.totals().unwrap(), want);
    // Every snapshot is a whole number of steps (consistent) and they never decrease.
    let mut prev = specula_core::Counters::<K>::ZERO;
    for c in &completed {
        assert_eq!(c.drafts % per_step.drafts, 0, "torn snapshot {c:?}");
        assert!(c.dominates(&prev));
        prev = *c;
    }
    println!(
        "{} readbacks completed during {steps} steps",
        completed.len()
    );
}

/// Capture once, replay many times with new inputs: batch size, `k`, seeds, offsets and the
/// method all change between replays and every replay equals the reference, because the kernel
/// reads every per-call value from device buffers. Replays make no synchronising call, and the
/// counters read back at the end are the exact sum over all replays.
#[test]
fn graph_capture_and_replay_with_new_inputs() {
    let Some(dev) = device() else { return };
    let mut g = conformance::Gen(0x6_7A9);
    let pool = conformance::full_layout_batch(&mut g, 8);
    let mut v = dev.verifier::<K>().unwrap();
    let drv = v.driver().clone();
    let mut staging = Staging::new();
    let mut out = conformance::OutData::new(pool.requests(), pool.k_max);
    v.stage(
        &mut staging,
        Method::Rejection,
        Check::Cheap,
        &pool.view(),
        &out.view(),
    )
    .unwrap();
    let first = staging
        .write::<K>(
            &drv,
            v.stream(),
            Method::Rejection,
            &pool.view(),
            Produce::TOKENS,
        )
        .unwrap();
    // SAFETY: views `Staging::write` returned; later batches are written by it alone, into the
    // same buffers (the graph borrows them, so they cannot grow or be freed meanwhile).
    let graph = unsafe { v.capture(&first).unwrap() };
    let mut want = specula_core::Counters::<K>::ZERO;
    let replays = 60;
    for i in 0..replays {
        let d = conformance::vary(&mut g, &pool);
        let n = d.requests();
        let m = conformance::METHODS[i % 3];
        let args = staging
            .write::<K>(&drv, v.stream(), m, &d.view(), Produce::TOKENS)
            .unwrap();
        let before = call_counts();
        v.replay(&graph).unwrap();
        let after = call_counts();
        assert_eq!(
            after.synchronizing, before.synchronizing,
            "replay synchronised"
        );
        let (ref_out, c) = conformance::reference(m, Check::Cheap, &d).unwrap();
        let mut out = conformance::OutData::new(n, d.k_max);
        let flags = v
            .download_outputs(
                &args,
                &mut Outputs::new(AcceptedOut(&mut out.accepted), TokensOut(&mut out.tokens)),
            )
            .unwrap();
        assert_eq!(flags, 0, "replay {i}: kernel error flags");
        assert_eq!(
            out.accepted, ref_out.accepted,
            "replay {i} ({m:?}, {n} requests)"
        );
        assert_eq!(
            out.tokens, ref_out.tokens,
            "replay {i} ({m:?}, {n} requests)"
        );
        want.add(&c);
    }
    drop(graph);
    let mut rb = CudaReadback::new(&v).unwrap();
    assert_eq!(
        rb.flush().unwrap(),
        want,
        "counters after {replays} replays"
    );
    assert_eq!(rb.error_flags(), 0);
    println!("{replays} graph replays matched the reference");
}

/// A reference run and a device run of the same batches agree on the totals (cheap sanity on
/// top of the suite, through the Readback seam rather than `totals`).
#[test]
fn readback_flush_equals_reference_totals() {
    let Some(dev) = device() else { return };
    let mut g = conformance::Gen(0xF1_0511);
    let mut v = dev.verifier::<K>().unwrap();
    let mut r = Reference::<K>::new();
    for i in 0..30 {
        let (d, _) = conformance::random_batch(&mut g, conformance::RandomSpec::default());
        let m = conformance::METHODS[i % 3];
        conformance::run(&mut v, m, Check::Cheap, &d).unwrap();
        conformance::run(&mut r, m, Check::Cheap, &d).unwrap();
    }
    let mut rb = CudaReadback::new(&v).unwrap();
    assert_eq!(rb.flush().unwrap(), r.totals().unwrap());
}

/// The readback conformance suite every implementation passes (misuse included), on the device.
#[test]
fn readback_conformance_on_device() {
    use specula_tests::readback_conformance::{Rig, run_all};
    struct Cuda {
        v: CudaVerifier<K>,
        r: specula_cuda::CudaReadback<K>,
        d: conformance::BatchData,
    }
    impl Rig<K> for Cuda {
        type R = specula_cuda::CudaReadback<K>;
        fn readback(&mut self) -> &mut Self::R {
            &mut self.r
        }
        fn step(&mut self) {
            conformance::run(&mut self.v, Method::Greedy, Check::Cheap, &self.d).unwrap();
        }
        fn totals(&mut self) -> specula_core::Counters<K> {
            self.v.totals().unwrap()
        }
    }
    let Some(dev) = device() else { return };
    let d = conformance::full_layout_batch(&mut conformance::Gen(0x2EAD), 3);
    run_all(|| {
        let v = dev.verifier::<K>().unwrap();
        let r = CudaReadback::new(&v).unwrap();
        Cuda { v, r, d: d.clone() }
    });
}

/// Interop without copies: the step path on the caller's cudarc buffers and stream, through
/// typed views borrowed from the `CudaSlice`s (what candle's CUDA storage holds), with no
/// synchronising call; outputs and counters equal the reference.
#[test]
fn step_path_on_the_callers_cudarc_buffers() {
    use specula_core::gpu::kernels;
    use specula_core::gpu::{GpuVerifier, RowsView, StepViews, VerifyArgs};
    use specula_core::verify::{DEFAULT_DELTA, DEFAULT_EPS};
    use specula_cuda::CudaDriver;
    let Some(dev) = device() else { return };
    let mut g = conformance::Gen(0x001A_7E40);
    let d = conformance::full_layout_batch(&mut g, 5);
    let (want, counted) = conformance::reference(Method::Rejection, Check::Cheap, &d).unwrap();
    let b = d.requests();
    let s = dev.stream().clone();
    // The caller's buffers, made the way an engine makes them.
    let shape = kernels::batch_shape::<K>(Method::Rejection, &d.view()).unwrap();
    let shape = upload(&s, &shape);
    let k = upload(&s, &d.k);
    let ids = upload(&s, &d.draft_ids);
    let dp = d.draft_probs.as_ref().map(|p| upload(&s, p));
    let tp = upload(&s, &d.target_probs);
    let seed = upload(&s, &d.seed);
    let offset = upload(&s, &d.offset);
    let eps = upload(&s, &vec![DEFAULT_EPS; b]);
    let delta = upload(&s, &vec![DEFAULT_DELTA; b]);
    let mut accepted = s.alloc_zeros::<u32>(b).unwrap();
    let mut tokens = s.alloc_zeros::<u32>(b * (d.k_max + 1)).unwrap();
    let drv = CudaDriver::new(dev.clone());
    let mut v = GpuVerifier::<CudaDriver, K>::with_stream(drv.clone(), s.clone()).unwrap();
    {
        let (sh, kk, ii, tt, se, of, ep, de) = (
            drv.borrow(&shape),
            drv.borrow(&k),
            drv.borrow(&ids),
            drv.borrow(&tp),
            drv.borrow(&seed),
            drv.borrow(&offset),
            drv.borrow(&eps),
            drv.borrow(&delta),
        );
        let dd = dp.as_ref().map(|p| drv.borrow(p));
        let (mut acc, mut tok) = (drv.borrow_mut(&mut accepted), drv.borrow_mut(&mut tokens));
        let args = VerifyArgs {
            step: StepViews {
                capacity: u32::try_from(b).unwrap(),
                shape: sh.view(),
                draft_probs: dd.as_ref().map(|x| RowsView::F32(x.view())),
                target: RowsView::F32(tt.view()),
                seed: se.view(),
                offset: of.view(),
                eps: ep.view(),
                delta: de.view(),
                accepted: acc.view_mut(),
                tokens: tok.view_mut(),
                temperature: None,
            },
            k: kk.view(),
            draft_ids: ii.view(),
            cu_num_draft_tokens: None,
            bonus: None,
            sampling: None,
            recovered: None,
            draft_first_row: None,
        };
        let before = call_counts();
        // SAFETY: the shape words were computed from this batch, whose buffers these are.
        unsafe { v.launch(&args) }.unwrap();
        let after = call_counts();
        assert_eq!(
            after.synchronizing, before.synchronizing,
            "no synchronising call"
        );
    }
    assert_eq!(download(&s, &accepted), want.accepted);
    assert_eq!(download(&s, &tokens), want.tokens);
    assert_eq!(v.totals().unwrap(), counted);
}

/// The engine inputs of issue 13 on the device (plain and `_logits` entries, split below one
/// request per SM): a graph per kind (ragged with `k = 0`, bonus tokens, logits with mixed
/// temperatures, all three) replaying changing batches with no synchronising driver call;
/// ragged against padded at V = 32 000 and 151 936; ragged logits at V = 151 936. Bit for bit
/// against the reference (the conformance suite of `conformance_on_device` covers the rest).
#[test]
fn engine_inputs_on_device() {
    use specula_tests::gpu_inputs;
    let Some(dev) = device() else { return };
    let mut v = dev.verifier::<K>().unwrap();
    assert_eq!(v.support(), specula_core::gpu::SUPPORT);
    gpu_inputs::graph_replays(&mut v, 0x13_C0DA, 12, || call_counts().synchronizing);
    gpu_inputs::ragged_logits_at_151936(&mut v);
    conformance::ragged_matches_padded_at(&mut v, 0x13_C0DB, 32_000, 2);
    conformance::ragged_matches_padded_at(&mut v, 0x13_C0DC, 151_936, 1);
}
