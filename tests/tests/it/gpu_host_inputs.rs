//! The engine inputs of issue 13 through the shared GPU orchestration (`specula_core::gpu`) on
//! the host driver: `k = 0`, the ragged layout (vLLM's `cu_num_draft_tokens`), caller-supplied
//! bonus tokens and f32 target logits with per-request temperature (0 = greedy for that
//! request), through the kernel text's plain and `_logits` entries, one block per request and
//! rows split; graph capture and replay over changing batches of each kind; no synchronising
//! call on the step path. Everything bit for bit against the reference.

use specula_core::Readback;
use specula_core::gpu::kernels::{
    VERIFY_ENTRY, VERIFY_LOGITS_ENTRY, VERIFY_SPLIT_ENTRY, VERIFY_SPLIT_LOGITS_ENTRY,
};
use specula_core::gpu::{GpuVerifier, SUPPORT, Staging};
use specula_core::verify::Produce;
use specula_core::verify::{Check, Method, Verifier};
use specula_tests::conformance::{self as c, Gen, K, OutData};
use specula_tests::gpu_inputs::{self, Step, kinds, reference};
use specula_tests::host_driver::HostDriver;
use specula_tests::kernel_host::Mode;
use std::task::Poll;

/// 16 multiprocessors: batches below 16 requests take the split entries.
const SMS: u32 = 16;

/// The two configurations: CUDA macros, one block per request; HIP macros, rows split.
const CONFIGS: [(Mode, u32); 2] = [(Mode::Cuda, 1), (Mode::Hip, SMS)];

fn verifier(drv: &HostDriver) -> GpuVerifier<HostDriver, K> {
    GpuVerifier::new(drv.clone()).unwrap()
}

/// The entry names a configuration runs: (plain, `_logits`).
fn names(sms: u32) -> [&'static str; 2] {
    if sms > 1 {
        [VERIFY_SPLIT_ENTRY, VERIFY_SPLIT_LOGITS_ENTRY]
    } else {
        [VERIFY_ENTRY, VERIFY_LOGITS_ENTRY]
    }
}

/// The conformance suite's cases for `k = 0`, the ragged layout, bonus tokens, logits (mixed
/// temperatures), the sampling filters, a method per request, bf16 / f16 tensors and the
/// recovered-token output (against the reference), through the orchestration in both configurations; the plain
/// and `_logits` entries really ran.
#[test]
fn conformance_of_the_engine_inputs() {
    for (i, (mode, sms)) in CONFIGS.into_iter().enumerate() {
        let drv = HostDriver::new(mode, 64, sms);
        let make = || verifier(&drv);
        assert_eq!(make().support(), SUPPORT);
        let seed = 0x13_0000 + 16 * i as u64;
        c::ragged_layout(make, seed, 30);
        c::target_logits(make, seed + 1, 30);
        c::sampling_inputs(make, seed + 2, 24);
        c::mixed_drafters(make, seed + 4, 24);
        // The recovered-token output, written by the same launch: the reference's bits.
        c::recovered_output(make, seed + 3, 6);
        if i == 0 {
            c::empty_drafts(make); // 300 random batches: once
        }
        let [plain, logits] = names(sms);
        for name in [plain, logits] {
            assert!(drv.launches_of(name) > 0, "{mode:?}: {name} never ran");
        }
        if sms == 1 {
            for name in names(SMS) {
                assert_eq!(drv.launches_of(name), 0, "one multiprocessor: {name} ran");
            }
        }
    }
}

/// A graph captured once per kind (ragged with `k = 0` requests, bonus tokens, logits with
/// mixed temperatures, all three) replays 6 changing batches of that kind, bit for bit against
/// the reference, with no synchronising call (the driver's own count); a batch of another kind
/// is refused before anything runs (`specula_tests::gpu_inputs::graph_replays`). The plain and
/// `_logits` entries ran 6 times per kind that needs them.
#[test]
fn graphs_replay_changing_batches_of_each_kind() {
    for (i, (mode, sms)) in CONFIGS.into_iter().enumerate() {
        let drv = HostDriver::new(mode, 64, sms);
        let mut v = verifier(&drv);
        gpu_inputs::graph_replays(&mut v, 0x13_6A00 + i as u64, 6, || drv.sync_calls());
        let [plain, logits] = names(sms);
        // Kinds: ragged (plain), bonus (plain), logits, all three (logits); 6 replays each,
        // and no launch of the mismatched ones.
        assert_eq!(drv.launches_of(plain), 12, "{mode:?}");
        assert_eq!(drv.launches_of(logits), 12, "{mode:?}");
    }
}

/// The step path on the `_logits` entry with the ragged layout and bonus tokens (launches,
/// replays, readback start/poll) makes no synchronising call, counted by the driver; the totals
/// are the reference's.
#[test]
fn no_synchronising_call_on_the_step_path_of_the_new_entries() {
    for (mode, sms) in CONFIGS {
        let drv = HostDriver::new(mode, 64, sms);
        let mut v = verifier(&drv);
        let mut g = Gen(0x13_5C00 + u64::from(sms));
        let mut d = c::full_layout_batch(&mut g, 5);
        d.k[1] = 0;
        let s = Step::new(&mut g, d, kinds()[3]);
        let batch = s.view();
        let mut staging = Staging::new();
        let mut o = OutData::new(batch.requests(), batch.k_max);
        v.stage(
            &mut staging,
            Method::Typical,
            Check::Cheap,
            &batch,
            &o.view(),
        )
        .unwrap();
        let mut rb = v.readback().unwrap();
        let args = staging
            .write::<K>(&drv, v.stream(), Method::Typical, &batch, Produce::TOKENS)
            .unwrap();
        // SAFETY: staged views; nothing else writes the staging buffers.
        let graph = unsafe { v.capture_staged(&args) }.unwrap();
        let before = (drv.sync_calls(), v.sync_calls(), rb.sync_calls());
        for step in 0..20 {
            if step % 2 == 0 {
                // SAFETY: staged views; nothing else writes the staging buffers.
                unsafe { v.launch_staged(&args) }.unwrap();
            } else {
                v.replay_staged(&graph, &args).unwrap();
            }
            if rb.in_flight() < rb.max_in_flight() {
                rb.start().unwrap();
            }
            if let Poll::Ready(r) = rb.poll() {
                r.unwrap();
            }
        }
        assert_eq!(
            (drv.sync_calls(), v.sync_calls(), rb.sync_calls()),
            before,
            "{mode:?}: no synchronising call on the step path"
        );
        let total = rb.flush().unwrap();
        let (_, one) = reference(Method::Typical, &batch);
        assert_eq!(total.drafts, 20 * one.drafts);
        assert_eq!(total.accepted_tokens, 20 * one.accepted_tokens);
        assert_eq!(drv.launches_of(names(sms)[1]), 20);
        drop(graph);
        let _ = o.view();
    }
}

/// Real vocabularies: the ragged layout against the padded one (with and without bonus
/// tokens, `k = 0` included) at V = 32 000, and logits with temperatures 0, 0.7 and 1.3 at
/// V = 151 936 (ragged, misaligned stride), split and one block per request, through the
/// orchestration; bit for bit against the reference.
#[test]
fn real_vocabularies_through_the_orchestration() {
    let drv = HostDriver::new(Mode::Cuda, 128, SMS);
    let mut v = verifier(&drv);
    c::ragged_matches_padded_at(&mut v, 0x13_7D00, 32_000, 1);
    assert!(drv.launches_of(VERIFY_SPLIT_ENTRY) > 0);
    gpu_inputs::ragged_logits_at_151936(&mut v);
    let mut one = GpuVerifier::<HostDriver, K>::new(HostDriver::new(Mode::Hip, 128, 1)).unwrap();
    gpu_inputs::ragged_logits_at_151936(&mut one);
    assert_eq!(drv.launches_of(VERIFY_SPLIT_LOGITS_ENTRY), 3);
    assert_eq!(one.driver().launches_of(VERIFY_LOGITS_ENTRY), 3);
}

/// A method per request and each sampling filter (alone and together), over probabilities and
/// logits, and bf16 / f16 logits and draft probabilities, at V = 32 000 through the orchestration, CUDA macros one block per request and HIP
/// macros rows split; bit for bit against the reference, counts included; the `_logits`
/// entries ran for every batch (methods and filters are their trailing parameters).
#[test]
fn methods_and_filters_through_the_orchestration() {
    for (i, (mode, sms)) in CONFIGS.into_iter().enumerate() {
        let drv = HostDriver::new(mode, 128, sms);
        let mut v = verifier(&drv);
        gpu_inputs::methods_and_filters_at(&mut v, 0x13_F100 + i as u64, 32_000);
        let [plain, logits] = names(sms);
        assert_eq!(drv.launches_of(logits), 12, "{mode:?}");
        assert_eq!(drv.launches_of(plain), 0, "{mode:?}");
    }
}
