//! The ROCm backend on a real device: the shared conformance suite and the readback
//! conformance suite. Every test prints SKIPPED and passes without a ROCm device (CI has none),
//! unless `SPECULA_REQUIRE_DEVICE` is set (a GPU host, where a skip would hide a failure).

use crate::support::verifier;
use specula_core::Counters;
use specula_core::gpu::GpuError;
use specula_core::verify::Produce;
use specula_core::verify::{AcceptedOut, Outputs, TokensOut};
use specula_core::verify::{Check, Method, Verifier};
use specula_rocm::{RocmReadback, RocmVerifier};
use specula_tests::conformance::{self, BatchData, K};
use specula_tests::readback_conformance::{Rig, run_all};

#[test]
fn conformance_on_device() {
    if verifier().is_none() {
        return;
    }
    conformance::run_all(|| verifier().unwrap());
    // The recovered-token output, written by the logits entries in the same launch.
    conformance::recovered_output(|| verifier().unwrap(), 0xDE_0013, 40);
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
        let r = RocmReadback::new(&v).unwrap();
        Rocm { v, r, d: d.clone() }
    });
}

/// The step path on typed views: staged once, then launches and graph replays of batches that
/// change size, `k`, seeds, offsets and method through device memory, with readbacks started and
/// polled, and no synchronising call in between; outputs and counters equal the reference.
#[test]
fn step_path_and_graph_replay_on_device() {
    use specula_core::Readback;
    use specula_core::gpu::Staging;
    let Some(mut v) = verifier() else { return };
    let drv = v.driver().clone();
    let mut g = conformance::Gen(0x005E_ED0C);
    let pool = conformance::full_layout_batch(&mut g, 8);
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
    // same buffers (the graph borrows them).
    let graph = match unsafe { v.capture(&first) } {
        Ok(graph) => Some(graph),
        Err(GpuError::Driver(specula_rocm::RocmError::Unsupported(what))) => {
            println!("SKIPPED graph replay: {what}");
            None
        }
        Err(e) => panic!("capture: {e}"),
    };
    let mut rb = RocmReadback::new(&v).unwrap();
    let mut want = Counters::<K>::ZERO;
    for i in 0..40 {
        let d = conformance::vary(&mut g, &pool);
        let m = conformance::METHODS[i % 3];
        let args = staging
            .write::<K>(&drv, v.stream(), m, &d.view(), Produce::TOKENS)
            .unwrap();
        let syncs = v.sync_calls();
        match (&graph, i % 2) {
            (Some(graph), 0) => v.replay(graph).unwrap(),
            // SAFETY: views `Staging::write` returned just above.
            _ => unsafe { v.launch(&args) }.unwrap(),
        }
        if i == 0 {
            rb.start().unwrap();
        } else if let std::task::Poll::Ready(r) = rb.poll() {
            r.unwrap();
            rb.start().unwrap();
        }
        assert_eq!(v.sync_calls(), syncs, "step {i} synchronised");
        let (ref_out, c) = conformance::reference(m, Check::Cheap, &d).unwrap();
        let mut o = conformance::OutData::new(d.requests(), d.k_max);
        let flags = v
            .download_outputs(
                &args,
                &mut Outputs::new(AcceptedOut(&mut o.accepted), TokensOut(&mut o.tokens)),
            )
            .unwrap();
        assert_eq!(flags, 0, "step {i}: kernel error flags");
        assert_eq!(o.accepted, ref_out.accepted, "step {i} ({m:?})");
        assert_eq!(o.tokens, ref_out.tokens, "step {i} ({m:?})");
        want.add(&c);
    }
    drop(graph);
    assert_eq!(rb.flush().unwrap(), want, "counters after 40 steps");
}

/// The engine inputs of issue 13 on the device (plain and `_logits` entries, split below 128
/// requests): a graph per kind (ragged with `k = 0`, bonus tokens, logits with mixed
/// temperatures, all three) replaying changing batches with no synchronising call; ragged
/// against padded at V = 32 000 and 151 936; ragged logits at V = 151 936. Bit for bit against
/// the reference (the conformance suite of `conformance_on_device` covers the rest).
#[test]
fn engine_inputs_on_device() {
    use specula_tests::gpu_inputs;
    let Some(mut v) = verifier() else { return };
    assert_eq!(v.support(), specula_core::gpu::SUPPORT);
    let probe = conformance::full_layout_batch(&mut conformance::Gen(1), 2);
    let mut staging = specula_core::gpu::Staging::new();
    let mut out = conformance::OutData::new(2, probe.k_max);
    v.stage(
        &mut staging,
        Method::Greedy,
        Check::Cheap,
        &probe.view(),
        &out.view(),
    )
    .unwrap();
    let args = staging
        .write::<K>(
            v.driver(),
            v.stream(),
            Method::Greedy,
            &probe.view(),
            Produce::TOKENS,
        )
        .unwrap();
    // SAFETY: staged views; dropped at once (probing for graph support).
    match unsafe { v.capture(&args) } {
        Ok(_) => gpu_inputs::graph_replays(&mut v, 0x13_A3D0, 12, || 0),
        Err(GpuError::Driver(specula_rocm::RocmError::Unsupported(what))) => {
            println!("SKIPPED graphs: {what}")
        }
        Err(e) => panic!("capture: {e}"),
    }
    gpu_inputs::ragged_logits_at_151936(&mut v);
    conformance::ragged_matches_padded_at(&mut v, 0x13_A3D1, 32_000, 2);
    conformance::ragged_matches_padded_at(&mut v, 0x13_A3D2, 151_936, 1);
}
