//! The shared GPU orchestration (`specula_core::gpu`) executed end to end over the host driver
//! (`specula_tests::host_driver`): the kernel text on worker-thread streams, events as
//! completion flags, graph capture and replay, the readback ring under injected faults, the
//! count of synchronising calls, and shutdown.

use specula_core::gpu::{GpuError, GpuReadback, GpuVerifier, Staging};
use specula_core::verify::Produce;
use specula_core::verify::{AcceptedOut, Outputs, TokensOut};
use specula_core::verify::{Check, Method, Verifier};
use specula_core::{Counters, ErrorKind, HasKind, Misuse, Readback};
use specula_tests::conformance::{self as c, BatchData, Gen, K, OutData};
use specula_tests::host_driver::HostDriver;
use specula_tests::kernel_host::Mode;
use std::task::Poll;

/// 16 multiprocessors: batches below 16 requests take the split entry.
const SMS: u32 = 16;

fn verifier(mode: Mode, sms: u32) -> GpuVerifier<HostDriver, K> {
    GpuVerifier::new(HostDriver::new(mode, 64, sms)).unwrap()
}

fn quick(make: impl FnMut() -> GpuVerifier<HostDriver, K> + Copy, seed: u64) {
    c::exact_cases(make);
    c::error_cases(make);
    c::batch_invariance(make, seed);
    c::matches_reference_on_random_batches(make, seed + 1, 300);
}

/// The conformance suite through the shared orchestration, CUDA-macro kernel, one block per
/// request (1 multiprocessor: never split).
#[test]
fn conformance_cuda_macros_single_entry() {
    quick(|| verifier(Mode::Cuda, 1), 0x6B0_0001);
}

/// The same, HIP-macro kernel, small batches split over several blocks.
#[test]
fn conformance_hip_macros_split_entry() {
    quick(|| verifier(Mode::Hip, SMS), 0x6B0_0011);
}

/// The split entry is really taken below one request per multiprocessor, and not above.
#[test]
fn small_batches_take_the_split_entry() {
    let mut v = verifier(Mode::Cuda, SMS);
    assert_eq!(v.slices_for(4), 1, "nothing reserved yet");
    v.reserve_split(4).unwrap();
    assert_eq!(v.slices_for(4), 8);
    assert_eq!(v.slices_for(16), 1);
    assert_eq!(v.slices_for(5), 1, "reserved for 4 only");
}

/// Polls until ready, yielding; bounded so a bug fails instead of hanging.
fn poll_ready<R: Readback<K>>(r: &mut R) -> Result<Counters<K>, R::Error> {
    for _ in 0..200_000 {
        match r.poll() {
            Poll::Ready(x) => return x,
            Poll::Pending => std::thread::sleep(std::time::Duration::from_micros(200)),
        }
    }
    panic!("readback never completed");
}

fn random_batch(g: &mut Gen, n: usize) -> BatchData {
    c::full_layout_batch(g, n)
}

/// A graph captured on the largest batch replays smaller batches written into the same staging
/// buffers (batch size, k, seeds, offsets, method change through device memory): outputs and
/// counters match the reference, with no synchronising call between the replays.
#[test]
fn graph_replays_with_changing_inputs() {
    for (i, (mode, sms)) in [(Mode::Cuda, 1), (Mode::Hip, SMS)].into_iter().enumerate() {
        let mut v = verifier(mode, sms);
        let drv = v.driver().clone();
        let mut g = Gen(0x6A_0000 + i as u64);
        let pool = random_batch(&mut g, 8);
        let cap = pool.requests();
        let mut staging = Staging::new();
        let out = OutData::new(cap, pool.k_max);
        let mut out_view = out.clone();
        v.stage(
            &mut staging,
            Method::Rejection,
            Check::Cheap,
            &pool.view(),
            &out_view.view(),
        )
        .unwrap();
        let args = staging
            .write::<K>(
                &drv,
                v.stream(),
                Method::Rejection,
                &pool.view(),
                Produce::TOKENS,
            )
            .unwrap();
        // SAFETY: staged views of a validated batch.
        let graph = unsafe { v.capture(&args) }.unwrap();
        assert_eq!(drv.launches(), 0, "capturing runs nothing");
        let mut expected = Counters::<K>::ZERO;
        for step in 0..12 {
            let method = c::METHODS[step % 3];
            let mut d = pool.empty_like();
            let n = 1 + g.below(cap);
            for _ in 0..n {
                d.push_from(&pool, g.below(cap));
            }
            for o in &mut d.offset {
                *o += step as u64;
            }
            let Ok((want, counted)) = c::reference(method, Check::Cheap, &d) else {
                continue;
            };
            expected.add(&counted);
            // Same buffers: every size fits the capacity's.
            let step_args = staging
                .write::<K>(&drv, v.stream(), method, &d.view(), Produce::TOKENS)
                .unwrap();
            let syncs = drv.sync_calls();
            v.replay(&graph).unwrap();
            assert_eq!(drv.sync_calls(), syncs, "a replay never synchronises");
            let mut got = OutData::new(n, d.k_max);
            let flags = v
                .download_outputs(
                    &step_args,
                    &mut Outputs::new(AcceptedOut(&mut got.accepted), TokensOut(&mut got.tokens)),
                )
                .unwrap();
            assert_eq!(flags, 0);
            assert_eq!(got, want, "{mode:?} step {step} {method:?}");
        }
        assert_eq!(
            v.totals().unwrap(),
            expected,
            "counted exactly the live requests"
        );
        drop(graph);
    }
}

/// The step path (stage once, then launches, replays and readback start/poll) makes no
/// synchronising call, counted by the driver itself; flush makes them.
#[test]
fn no_synchronising_call_on_the_step_path() {
    let mut v = verifier(Mode::Cuda, SMS);
    let drv = v.driver().clone();
    let mut g = Gen(0x5_1C0);
    let d = random_batch(&mut g, 6);
    let mut staging = Staging::new();
    let mut o = OutData::new(d.requests(), d.k_max);
    v.stage(
        &mut staging,
        Method::Greedy,
        Check::Cheap,
        &d.view(),
        &o.view(),
    )
    .unwrap();
    let mut rb = v.readback().unwrap();
    let args = staging
        .write::<K>(&drv, v.stream(), Method::Greedy, &d.view(), Produce::TOKENS)
        .unwrap();
    // SAFETY: staged views of a validated batch.
    let graph = unsafe { v.capture(&args) }.unwrap();
    let before = (drv.sync_calls(), v.sync_calls(), rb.sync_calls());
    let mut seen = Counters::<K>::ZERO;
    for step in 0..40 {
        if step % 2 == 0 {
            // SAFETY: staged views; nothing else writes the staging buffers.
            unsafe { v.launch_staged(&args) }.unwrap();
        } else {
            v.replay(&graph).unwrap();
        }
        if rb.in_flight() < rb.max_in_flight() {
            rb.start().unwrap();
        }
        if let Poll::Ready(r) = rb.poll() {
            let c = r.unwrap();
            assert!(c.drafts >= seen.drafts, "monotone");
            seen = c;
        }
    }
    assert_eq!(
        (drv.sync_calls(), v.sync_calls(), rb.sync_calls()),
        before,
        "no synchronising call on the step path"
    );
    let total = rb.flush().unwrap();
    assert!(
        drv.sync_calls() > before.0,
        "flush synchronises (and is counted)"
    );
    let (_, one) = c::reference(Method::Greedy, Check::Cheap, &d).unwrap();
    assert_eq!(total.drafts, 40 * one.drafts);
    assert_eq!(v.totals().unwrap(), total);
    let _ = o.view();
}

fn step(v: &GpuVerifier<HostDriver, K>, staging: &Staging<HostDriver>, d: &BatchData) {
    let args = staging
        .write::<K>(
            v.driver(),
            v.stream(),
            Method::Rejection,
            &d.view(),
            Produce::TOKENS,
        )
        .unwrap();
    // SAFETY: staged views; nothing else writes the staging buffers.
    unsafe { v.launch_staged(&args) }.unwrap();
}

fn setup(
    seed: u64,
) -> (
    GpuVerifier<HostDriver, K>,
    Staging<HostDriver>,
    BatchData,
    u64,
) {
    let mut v = verifier(Mode::Hip, 1);
    let mut g = Gen(seed);
    let d = random_batch(&mut g, 4);
    let mut staging = Staging::new();
    let mut o = OutData::new(d.requests(), d.k_max);
    v.stage(
        &mut staging,
        Method::Rejection,
        Check::Cheap,
        &d.view(),
        &o.view(),
    )
    .unwrap();
    let (_, one) = c::reference(Method::Rejection, Check::Cheap, &d).unwrap();
    (v, staging, d, one.drafts)
}

/// A readback whose copy fails reports a device error once; the next one works.
#[test]
fn failing_readback_is_a_device_error_then_recovers() {
    let (v, staging, d, per_step) = setup(0xFA11);
    let mut rb = v.readback().unwrap();
    v.driver()
        .faults()
        .target(v.driver().stream_id(rb.copy_stream()));
    step(&v, &staging, &d);
    v.driver().faults().fail_next(1);
    rb.start().unwrap();
    let e = poll_ready(&mut rb).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Device, "{e}");
    rb.start().unwrap();
    assert_eq!(poll_ready(&mut rb).unwrap().drafts, per_step);
}

/// A slow readback: several in flight, each completes in start order with the snapshot as of
/// its start.
#[test]
fn slow_readbacks_complete_in_order_with_their_snapshots() {
    let (v, staging, d, per_step) = setup(0x510);
    let mut rb = v.readback().unwrap();
    v.driver()
        .faults()
        .target(v.driver().stream_id(rb.copy_stream()));
    v.driver()
        .faults()
        .set_delay(std::time::Duration::from_millis(3));
    for _ in 0..rb.max_in_flight() {
        step(&v, &staging, &d);
        rb.start().unwrap();
    }
    let e = rb.start().unwrap_err();
    assert_eq!(e, GpuError::Misuse(Misuse::AlreadyInFlight));
    for i in 1..=rb.max_in_flight() as u64 {
        assert_eq!(poll_ready(&mut rb).unwrap().drafts, i * per_step);
    }
    assert_eq!(
        rb.poll(),
        Poll::Ready(Err(GpuError::Misuse(Misuse::NothingInFlight)))
    );
}

/// A readback that never completes: poll stays pending, the step path goes on without waiting,
/// abandoned slots are not reused while their copy may still land, a start with every slot
/// stalled is a device error (never a hang), and once the copies complete everything recovers.
/// Shutdown with a copy still hung returns.
#[test]
fn never_completing_readback_is_abandoned_and_shutdown_returns() {
    let (v, staging, d, per_step) = setup(0x4A46);
    let drv = v.driver().clone();
    let mut rb = v.readback().unwrap();
    drv.faults().target(drv.stream_id(rb.copy_stream()));
    drv.faults().hang();
    let syncs = drv.sync_calls();
    for _ in 0..rb.max_in_flight() {
        step(&v, &staging, &d);
        rb.start().unwrap();
    }
    for _ in 0..20 {
        assert!(rb.poll().is_pending());
        step(&v, &staging, &d); // the compute stream never waits for the copy stream
    }
    for _ in 0..rb.max_in_flight() {
        assert!(rb.abandon());
    }
    assert!(!rb.abandon(), "nothing left to abandon");
    let e = rb.start().unwrap_err();
    assert_eq!(
        (e.clone(), e.kind()),
        (GpuError::Stalled, ErrorKind::Device)
    );
    assert_eq!(drv.sync_calls(), syncs, "nothing waited");
    drv.faults().release();
    // Abandoned slots come back once their copies have landed.
    let mut started = false;
    for _ in 0..20_000 {
        if rb.start().is_ok() {
            started = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    assert!(started);
    let steps = rb.max_in_flight() as u64 + 20;
    assert_eq!(poll_ready(&mut rb).unwrap().drafts, steps * per_step);

    // Shutdown while a copy hangs: dropping everything returns (the hang is released by the
    // closing stream, never waited for).
    drv.faults().hang();
    rb.start().unwrap();
    assert!(rb.poll().is_pending());
    drop(rb);
    drop(staging);
    drop(v);
    drv.faults().release();
}

/// Flush blocks until a hung copy lands, then returns the final totals.
#[test]
fn flush_waits_for_a_hung_copy_then_returns_totals() {
    let (mut v, staging, d, per_step) = setup(0xF1u64);
    let drv = v.driver().clone();
    let mut rb: GpuReadback<HostDriver, K> = v.readback().unwrap();
    drv.faults().target(drv.stream_id(rb.copy_stream()));
    step(&v, &staging, &d);
    drv.faults().hang();
    rb.start().unwrap();
    let release = {
        let drv = drv.clone();
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            drv.faults().release();
        })
    };
    let total = rb.flush().unwrap();
    release.join().unwrap();
    assert_eq!(total.drafts, per_step);
    assert_eq!(v.totals().unwrap(), total);
    assert!(
        rb.poll().is_ready(),
        "nothing in flight after flush: a misuse answer"
    );
    let _ = drv.sync_calls();
    let _ = HasKind::kind(&GpuError::<specula_tests::host_driver::HostDriverError>::Stalled);
}

/// The collector over the GPU ring with a copy stream that hangs: every step still runs and
/// ticks without a synchronising call, stale copies are reported and abandoned (the ring can),
/// a start with every slot stalled is a reported failure, and once the copies land collection
/// resumes and flush publishes the exact totals.
#[test]
fn collector_over_the_ring_survives_a_hung_copy_stream() {
    use specula_core::{CollectError, Collector, SeqSlot, Snapshot, Tick};
    const S: u64 = 1_000_000_000;
    let (v, staging, d, per_step) = setup(0xC011);
    let drv = v.driver().clone();
    let rb = v.readback().unwrap();
    drv.faults().target(drv.stream_id(rb.copy_stream()));
    drv.faults().hang();
    let mut slot = SeqSlot::new(Snapshot::<K>::ZERO);
    let (writer, _reader) = slot.split();
    let mut col = Collector::new(rb, writer, S, 0).unwrap();
    let syncs = drv.sync_calls();
    let (mut steps, mut failed, mut stalled) = (0u64, 0u32, false);
    for i in 0..300u64 {
        let now = i * S / 10; // 30 s of virtual time, a tick every 100 ms, a step every 500 ms
        if i % 5 == 0 {
            step(&v, &staging, &d);
            steps += 1;
        }
        if col.tick(now) == Tick::Failed {
            failed += 1;
            stalled |= matches!(
                col.last_error(),
                Some(CollectError::Readback(GpuError::Stalled))
            );
        }
    }
    assert_eq!(drv.sync_calls(), syncs, "ticks and steps never waited");
    assert!(failed >= 3, "stale copies reported: {failed}");
    assert!(
        stalled,
        "every slot abandoned and still pending is a reported failure"
    );
    assert!(col.last().readback_errors >= u64::from(failed));
    drv.faults().release();
    // Virtual time now runs at about real speed (1 ms a tick), so a copy is not declared stale
    // before the host threads have had time to land it.
    let mut published = false;
    for i in 0..50_000u64 {
        if let Tick::Published(_) = col.tick(30 * S + i * S / 1000) {
            published = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert!(published, "collection resumed once the copies landed");
    col.flush(30_000 * S).unwrap();
    assert_eq!(col.last().counters.drafts, steps * per_step);
}
