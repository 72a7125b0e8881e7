//! Token trees whose target and draft rows live in device memory ([`Values::Device`], issues 28
//! and 31), and whose outputs do ([`TreeOutputs::on_device`], issue 31), through
//! [`Verifier::verify_tree`] of the shared GPU orchestration over the host driver (whose
//! "device" memory is host memory it allocated): the host rows' outputs and counters, bit for
//! bit, with the one wait of the host outputs and none with device outputs; and the refusals,
//! each a typed error with nothing launched, written or counted: another device's or API's
//! memory (rows, binary32 or half, or outputs), strict checks over device rows, device outputs
//! of the wrong length, device rows or outputs on the host verifiers, device rows in
//! `Staging::<_, TreeStep>::write`. (Half rows: `tree_half.rs`.)

use specula::cpu::CpuVerifier;
use specula_core::Counters;
use specula_core::gpu::{Driver, GpuError, GpuVerifier, Memory, Staging, TreeStep, View, ViewMut};
use specula_core::verify::tree::{DeviceTreeOutputs, TreeBatch, TreeOutputs};
use specula_core::verify::{
    Check, Device, DeviceOut, Feature, Method, Param, Reference, Values, Verifier, VerifyError,
};
use specula_tests::conformance::{Gen, K, METHODS};
use specula_tests::host_driver::{Buf, HostDriver};
use specula_tests::kernel_host::Mode;
use specula_tests::tree::{TreeData, TreeOut, TreeSpec, random_tree_batch, with_values};
use std::sync::Arc;

fn verifier(drv: &HostDriver) -> GpuVerifier<HostDriver, K> {
    GpuVerifier::new(drv.clone()).unwrap()
}

fn spec(draft: bool, logits: bool) -> TreeSpec {
    TreeSpec {
        max_requests: 5,
        max_nodes: 12,
        max_depth: 5,
        vocab: 37,
        draft,
        logits,
        garbage: false,
    }
}

fn f32_device(buf: &Buf) -> Values<'_> {
    Values::Device(Device::f32(View::<HostDriver, f32>::new(buf)))
}

/// `d` verified from host rows on one fresh verifier and from the same rows in `drv`'s memory
/// (the target's, the draft's, or both) on another: the same outputs and counters, and one
/// synchronising call each (the tree outputs are host slices, copied down once).
fn same_as_host_rows(drv: &HostDriver, method: Method, d: &TreeData, what: &str) -> TreeOut {
    let host = d.view();
    let mut a = verifier(drv);
    let mut want = TreeOut::new(d.requests(), d.max_depth);
    a.verify_tree(method, Check::Cheap, &host, &mut want.view())
        .unwrap_or_else(|e| panic!("{what}: host rows: {e}"));
    assert_eq!(a.sync_calls(), 1, "{what}: host rows");
    let target = drv.buffer_from(&d.target);
    let draft = d.draft.as_ref().map(|x| drv.buffer_from(x));
    let draft_dev = draft.as_ref().map(f32_device);
    let host_target = host.target.rows().values;
    let host_draft = host.draft.map(|r| r.values);
    // The target rows 5 values into a larger buffer (NaN around them): the view's offset is
    // what the launch reads from.
    let padded: Vec<f32> = [&[f32::NAN; 5][..], &d.target, &[f32::NAN; 3]].concat();
    let padded = drv.buffer_from(&padded);
    let inner = View::<HostDriver, f32>::range(&padded, 5, d.target.len()).unwrap();
    let mut cases = vec![
        ("target and draft", f32_device(&target), draft_dev),
        (
            "target at an offset",
            Values::Device(Device::f32(inner)),
            host_draft,
        ),
    ];
    if draft_dev.is_some() {
        cases.push(("target", f32_device(&target), host_draft));
        cases.push(("draft", host_target, draft_dev));
    }
    for (rows, t, q) in cases {
        let dev = with_values(host, t, q);
        assert!(dev.has_device());
        let mut v = verifier(drv);
        let launches = drv.launches();
        let mut got = TreeOut::new(d.requests(), d.max_depth);
        v.verify_tree(method, Check::Cheap, &dev, &mut got.view())
            .unwrap_or_else(|e| panic!("{what}: device {rows}: {e}"));
        assert_eq!(drv.launches(), launches + 1, "{what}: device {rows}");
        assert_eq!(v.sync_calls(), 1, "{what}: device {rows}: one wait");
        assert_eq!(got, want, "{what} {method:?}: device {rows}: outputs");
        assert_eq!(
            v.totals().unwrap(),
            a.totals().unwrap(),
            "{what} {method:?}: device {rows}: counters"
        );
    }
    want
}

/// Random trees, probabilities and logits (T = 0 and T > 0), with and without draft rows,
/// every method, both macro forms: device rows give the host rows' bits and counts.
#[test]
fn tree_device_rows_match_the_host_rows() {
    let mut accepted = 0;
    for (i, mode) in [Mode::Cuda, Mode::Hip].into_iter().enumerate() {
        let drv = HostDriver::new(mode, 64, 1);
        let mut g = Gen(0x28_3100 + i as u64);
        for n in 0..8 {
            let d = random_tree_batch(&mut g, spec(n % 2 == 1, n % 4 >= 2));
            for m in METHODS {
                let out = same_as_host_rows(&drv, m, &d, &format!("{mode:?} batch {n}"));
                accepted += out.accepted.iter().filter(|&&a| a > 0).count();
            }
        }
    }
    assert!(accepted > 10, "{accepted} accepted paths: a weak test");
}

/// A GPU API that is not the host driver: its buffers downcast to nothing else.
struct Other;

impl Memory for Other {
    type Buffer = Arc<Vec<u8>>;
    fn bytes(buf: &Arc<Vec<u8>>) -> usize {
        buf.len()
    }
}

/// Asserts `v` refused `batch` with `want`: nothing launched, written or counted.
fn refused(
    drv: &HostDriver,
    v: &mut GpuVerifier<HostDriver, K>,
    batch: &TreeBatch<'_>,
    check: Check,
    want: GpuError<<HostDriver as Driver>::Error>,
) {
    let launches = drv.launches();
    let mut out = TreeOut::new(batch.requests(), batch.max_depth);
    let got = v.verify_tree(Method::Rejection, check, batch, &mut out.view());
    assert_eq!(got, Err(want.clone()));
    assert_eq!(drv.launches(), launches, "{want:?}: launched");
    assert_eq!(
        out,
        TreeOut::new(batch.requests(), batch.max_depth),
        "{want:?}: written"
    );
    assert_eq!(v.totals().unwrap(), Counters::ZERO, "{want:?}: counted");
}

/// The 16-bit patterns of `x` in bf16.
fn bf16(x: &[f32]) -> Vec<u16> {
    x.iter()
        .map(|&v| half::bf16::from_f32(v).to_bits())
        .collect()
}

/// On the GPU tree path: another device's memory (binary32 or half rows), another API's memory
/// (target and draft rows), strict checks over device rows: typed errors, nothing launched,
/// written or counted. `Staging::<_, TreeStep>::write` (whose views outlive the batch)
/// takes host rows only. The same device rows, valid, then verify.
#[test]
fn tree_device_rows_refusals_on_the_gpu_path() {
    let drv = HostDriver::new(Mode::Cuda, 64, 1);
    let other_device = HostDriver::new(Mode::Cuda, 64, 1);
    let mut g = Gen(0x28_3101);
    let probs = random_tree_batch(&mut g, spec(true, false));
    let logits = random_tree_batch(&mut g, spec(true, true));
    let mut v = verifier(&drv);
    let foreign = |param| GpuError::ForeignMemory { param };
    let unsupported = |feature| GpuError::Verify(VerifyError::Unsupported { feature });
    for (d, target_param) in [(&probs, Param::TargetProbs), (&logits, Param::TargetLogits)] {
        let host = d.view();
        let draft = d.draft.as_deref().unwrap();
        let (mine, mine_draft) = (drv.buffer_from(&d.target), drv.buffer_from(draft));
        let theirs = other_device.buffer_from(&d.target);
        let theirs_draft = other_device.buffer_from(draft);
        let alien: Arc<Vec<u8>> = Arc::new(vec![0; d.target.len() * 4]);
        let alien_rows = Values::Device(Device::f32(View::<Other, f32>::new(&alien)));
        let good = with_values(host, f32_device(&mine), Some(f32_device(&mine_draft)));

        let b = with_values(host, f32_device(&theirs), None);
        refused(&drv, &mut v, &b, Check::Cheap, foreign(target_param));
        let b = with_values(host, alien_rows, None);
        refused(&drv, &mut v, &b, Check::Cheap, foreign(target_param));
        let b = with_values(host, f32_device(&mine), Some(f32_device(&theirs_draft)));
        refused(&drv, &mut v, &b, Check::Cheap, foreign(Param::DraftProbs));
        let strict = unsupported(Feature::DeviceCheck);
        refused(&drv, &mut v, &good, Check::STRICT, strict);

        // Half rows of another device: the same refusal as binary32 ones.
        let half_target = bf16(&d.target);
        let half_draft = bf16(draft);
        let theirs_half = other_device.buffer_from(&half_target);
        let theirs_half = Values::Device(Device::bf16(View::<HostDriver, u16>::new(&theirs_half)));
        let b = with_values(host, theirs_half, None);
        refused(&drv, &mut v, &b, Check::Cheap, foreign(target_param));
        let theirs_draft_half = other_device.buffer_from(&half_draft);
        let theirs_draft_half = Values::Device(Device::f16(View::<HostDriver, u16>::new(
            &theirs_draft_half,
        )));
        let b = with_values(host, f32_device(&mine), Some(theirs_draft_half));
        refused(&drv, &mut v, &b, Check::Cheap, foreign(Param::DraftProbs));

        // `Staging::<_, TreeStep>::write` returns views that outlive the batch: host rows only.
        let mut staging = Staging::<HostDriver, TreeStep>::default();
        staging.reserve(&drv, &good, ()).unwrap();
        let got = staging.write::<K>(&drv, v.stream(), Method::Greedy, &good, ());
        assert_eq!(got.err(), Some(unsupported(Feature::Device)));

        // The same device rows, valid: the step runs, with the host rows' bits.
        let mut want = TreeOut::new(d.requests(), d.max_depth);
        verifier(&drv)
            .verify_tree(Method::Rejection, Check::Cheap, &host, &mut want.view())
            .unwrap();
        let mut got = TreeOut::new(d.requests(), d.max_depth);
        let mut w = verifier(&drv);
        w.verify_tree(Method::Rejection, Check::Cheap, &good, &mut got.view())
            .unwrap();
        assert_eq!(got, want);
    }
}

/// Host verifiers (the reference, the CPU backend) refuse device rows of a tree batch as
/// unsupported (before anything else is read), writing and counting nothing; the host rows then
/// verify. (Half rows they take: `tree_half.rs`.)
#[test]
fn tree_device_rows_are_refused_by_host_verifiers() {
    let drv = HostDriver::new(Mode::Cuda, 64, 1);
    let mut g = Gen(0x28_3102);
    let d = random_tree_batch(&mut g, spec(true, false));
    let host = d.view();
    let draft = d.draft.as_deref().unwrap();
    let dev_target = drv.buffer_from(&d.target);
    let dev_draft = drv.buffer_from(draft);
    let cases: [(&str, TreeBatch<'_>); 2] = [
        (
            "device target",
            with_values(host, f32_device(&dev_target), None),
        ),
        (
            "device draft",
            with_values(
                host,
                host.target.rows().values,
                Some(f32_device(&dev_draft)),
            ),
        ),
    ];
    let mut cpu = CpuVerifier::<K>::new(2).unwrap();
    let mut reference = Reference::<K>::new();
    let verifiers: [&mut dyn Verifier<K, Error = VerifyError>; 2] = [&mut cpu, &mut reference];
    for v in verifiers {
        assert!(v.support().trees && v.support().tree_half && !v.support().device);
        for (what, b) in &cases {
            for check in [Check::Cheap, Check::STRICT] {
                let mut out = TreeOut::new(d.requests(), d.max_depth);
                let got = v.verify_tree(Method::Rejection, check, b, &mut out.view());
                assert_eq!(
                    got,
                    Err(VerifyError::Unsupported {
                        feature: Feature::Device
                    }),
                    "{what}"
                );
                assert_eq!(
                    out,
                    TreeOut::new(d.requests(), d.max_depth),
                    "{what}: written"
                );
            }
        }
        assert_eq!(v.totals().unwrap(), Counters::ZERO, "counted");
        let mut out = TreeOut::new(d.requests(), d.max_depth);
        v.verify_tree(Method::Rejection, Check::STRICT, &host, &mut out.view())
            .unwrap();
        assert_ne!(v.totals().unwrap(), Counters::ZERO);
    }
}

/// Device tree outputs of `drv` for `b` requests of `max_depth`, filled with a marker no
/// verifier writes.
struct DevTreeOut {
    accepted: Buf,
    path: Buf,
    tokens: Buf,
}

const MARK: u32 = 0xDEAD_BEEF;

impl DevTreeOut {
    fn new(drv: &HostDriver, b: usize, max_depth: usize) -> Self {
        let w = b * (max_depth + 1);
        Self {
            accepted: drv.buffer_from(&vec![MARK; b]),
            path: drv.buffer_from(&vec![MARK; w]),
            tokens: drv.buffer_from(&vec![MARK; w]),
        }
    }

    fn outputs(&mut self) -> TreeOutputs<'_> {
        TreeOutputs::on_device(DeviceTreeOutputs {
            accepted: DeviceOut::new(ViewMut::<HostDriver, u32>::new(&mut self.accepted)),
            path: DeviceOut::new(ViewMut::<HostDriver, u32>::new(&mut self.path)),
            tokens: DeviceOut::new(ViewMut::<HostDriver, u32>::new(&mut self.tokens)),
        })
    }

    /// The outputs (whole buffers) once `stream` has drained (synchronising calls of the
    /// driver's).
    fn read(&self, drv: &HostDriver, stream: &<HostDriver as Driver>::Stream) -> TreeOut {
        let all = |buf: &Buf| drv.read_after(stream, buf, HostDriver::bytes(buf) / 4);
        TreeOut {
            accepted: all(&self.accepted),
            path: all(&self.path),
            tokens: all(&self.tokens),
        }
    }

    /// Whether every value still holds the marker (nothing written).
    fn untouched(&self, drv: &HostDriver, stream: &<HostDriver as Driver>::Stream) -> bool {
        let o = self.read(drv, stream);
        o.accepted
            .iter()
            .chain(&o.path)
            .chain(&o.tokens)
            .all(|&x| x == MARK)
    }
}

/// `d` verified from host rows into host outputs on one fresh verifier, then into device
/// outputs on others, from host rows and from the same rows on the device: the same outputs
/// and counters, one launch each, and no synchronising call on the device-output steps (the
/// driver's own count unchanged until the test reads the outputs back).
fn device_outputs_same_as_host(drv: &HostDriver, method: Method, d: &TreeData, what: &str) {
    let host = d.view();
    let mut a = verifier(drv);
    let mut want = TreeOut::new(d.requests(), d.max_depth);
    a.verify_tree(method, Check::Cheap, &host, &mut want.view())
        .unwrap_or_else(|e| panic!("{what}: host outputs: {e}"));
    let want_counters = a.totals().unwrap();
    let target = drv.buffer_from(&d.target);
    let draft = d.draft.as_ref().map(|x| drv.buffer_from(x));
    let dev_rows = with_values(host, f32_device(&target), draft.as_ref().map(f32_device));
    for (rows, batch) in [("host rows", host), ("device rows", dev_rows)] {
        let mut v = verifier(drv);
        let mut outs = DevTreeOut::new(drv, d.requests(), d.max_depth);
        let (syncs, launches) = (drv.sync_calls(), drv.launches());
        v.verify_tree(method, Check::Cheap, &batch, &mut outs.outputs())
            .unwrap_or_else(|e| panic!("{what}: {rows}, device outputs: {e}"));
        assert_eq!(v.sync_calls(), 0, "{what}: {rows}: the device step waited");
        assert_eq!(
            drv.sync_calls(),
            syncs,
            "{what}: {rows}: the device step waited"
        );
        let got = outs.read(drv, v.stream());
        // Counted as it runs: after the read, which drains the stream.
        assert_eq!(drv.launches(), launches + 1, "{what}: {rows}: one launch");
        assert_eq!(got, want, "{what} {method:?}: {rows}, device outputs");
        assert_eq!(
            v.totals().unwrap(),
            want_counters,
            "{what} {method:?}: {rows}, device outputs: counters"
        );
    }
}

/// Random trees, probabilities and logits (T = 0 and T > 0), with and without draft rows,
/// every method, both macro forms: outputs on the device, from host rows or device rows, hold
/// the host outputs' bits, with the same counts and no wait.
#[test]
fn tree_device_outputs_match_the_host_outputs() {
    for (i, mode) in [Mode::Cuda, Mode::Hip].into_iter().enumerate() {
        let drv = HostDriver::new(mode, 64, 1);
        let mut g = Gen(0x31_3100 + i as u64);
        let mut accepted = 0;
        for n in 0..8 {
            let d = random_tree_batch(&mut g, spec(n % 2 == 1, n % 4 >= 2));
            for m in METHODS {
                device_outputs_same_as_host(&drv, m, &d, &format!("{mode:?} batch {n}"));
            }
            let mut out = TreeOut::new(d.requests(), d.max_depth);
            verifier(&drv)
                .verify_tree(Method::Rejection, Check::Cheap, &d.view(), &mut out.view())
                .unwrap();
            accepted += out.accepted.iter().filter(|&&a| a > 0).count();
        }
        assert!(
            accepted > 5,
            "{mode:?}: {accepted} accepted paths: a weak test"
        );
    }
}

/// Device tree outputs refused on the GPU path: too short or too long (each of the three),
/// another device's or another API's buffer (each of the three), strict checks over device
/// rows into device outputs: typed errors, nothing launched, written or counted. The same
/// outputs, valid, then take the step.
#[test]
fn tree_device_outputs_refusals_on_the_gpu_path() {
    let drv = HostDriver::new(Mode::Cuda, 64, 1);
    let other_device = HostDriver::new(Mode::Cuda, 64, 1);
    let mut g = Gen(0x31_3101);
    let d = random_tree_batch(&mut g, spec(true, false));
    let host = d.view();
    let (b, depth) = (d.requests(), d.max_depth);
    let w = b * (depth + 1);
    let mut v = verifier(&drv);
    let nothing_happened = |v: &mut GpuVerifier<HostDriver, K>, outs: &DevTreeOut, what: &str| {
        assert!(outs.untouched(&drv, v.stream()), "{what}: written");
        assert_eq!(v.totals().unwrap(), Counters::ZERO, "{what}: counted");
    };
    let launches = drv.launches();

    // Lengths: one value short or one too many, in each output.
    let len = |param, len, expected| {
        GpuError::Verify(VerifyError::Length {
            param,
            len,
            expected,
        })
    };
    for (param, want, pick) in [
        (Param::Accepted, b, 0),
        (Param::Path, w, 1),
        (Param::Tokens, w, 2),
    ] {
        for n in [want - 1, want + 1] {
            let mut outs = DevTreeOut::new(&drv, b, depth);
            let wrong = drv.buffer_from(&vec![MARK; n]);
            match pick {
                0 => outs.accepted = wrong,
                1 => outs.path = wrong,
                _ => outs.tokens = wrong,
            }
            let got = v.verify_tree(Method::Rejection, Check::Cheap, &host, &mut outs.outputs());
            assert_eq!(got, Err(len(param, n, want)), "{param:?} of {n}");
            nothing_happened(&mut v, &outs, &format!("{param:?} of {n}"));
        }
    }

    // Another device's buffer, or another API's: each of the three.
    let alien: Arc<Vec<u8>> = Arc::new(vec![0; w * 4]);
    for (param, pick) in [(Param::Accepted, 0), (Param::Path, 1), (Param::Tokens, 2)] {
        let mut outs = DevTreeOut::new(&drv, b, depth);
        let theirs = DevTreeOut::new(&other_device, b, depth);
        let mut mixed = DevTreeOut::new(&drv, b, depth);
        let swapped = match pick {
            0 => std::mem::replace(&mut mixed.accepted, theirs.accepted),
            1 => std::mem::replace(&mut mixed.path, theirs.path),
            _ => std::mem::replace(&mut mixed.tokens, theirs.tokens),
        };
        let got = v.verify_tree(Method::Rejection, Check::Cheap, &host, &mut mixed.outputs());
        assert_eq!(got, Err(GpuError::ForeignMemory { param }), "{param:?}");
        // Put this device's buffer back to read every output (the other device's is unwritten:
        // it still holds its marker, read through its own driver).
        let foreign = match pick {
            0 => std::mem::replace(&mut mixed.accepted, swapped),
            1 => std::mem::replace(&mut mixed.path, swapped),
            _ => std::mem::replace(&mut mixed.tokens, swapped),
        };
        nothing_happened(&mut v, &mixed, &format!("{param:?} of another device"));
        let len = if pick == 0 { b } else { w };
        let s = other_device.stream().unwrap();
        let theirs_now: Vec<u32> = other_device.read_after(&s, &foreign, len);
        assert!(theirs_now.iter().all(|&x| x == MARK), "{param:?}: written");

        // Another API's memory (its buffer type is not the host driver's).
        let mut alien_buf = alien.clone();
        let alien_out =
            DeviceOut::new(ViewMut::<Other, u32>::range(&mut alien_buf, 0, len).unwrap());
        let mut dev = outs.outputs();
        let TreeOutputs::Device {
            outputs: device, ..
        } = &mut dev
        else {
            panic!("device outputs")
        };
        match pick {
            0 => device.accepted = alien_out,
            1 => device.path = alien_out,
            _ => device.tokens = alien_out,
        }
        let got = v.verify_tree(Method::Rejection, Check::Cheap, &host, &mut dev);
        assert_eq!(
            got,
            Err(GpuError::ForeignMemory { param }),
            "{param:?}: another API"
        );
        nothing_happened(&mut v, &outs, &format!("{param:?} of another API"));
    }

    // Strict checks over device rows, into device outputs.
    let target = drv.buffer_from(&d.target);
    let dev_rows = with_values(host, f32_device(&target), None);
    let mut outs = DevTreeOut::new(&drv, b, depth);
    let got = v.verify_tree(
        Method::Rejection,
        Check::STRICT,
        &dev_rows,
        &mut outs.outputs(),
    );
    assert_eq!(
        got,
        Err(GpuError::Verify(VerifyError::Unsupported {
            feature: Feature::DeviceCheck
        }))
    );
    nothing_happened(&mut v, &outs, "strict");
    assert_eq!(drv.launches(), launches, "a refused step launched");

    // The same outputs, valid: the step runs, with the host outputs' bits.
    let mut want = TreeOut::new(b, depth);
    verifier(&drv)
        .verify_tree(Method::Rejection, Check::Cheap, &host, &mut want.view())
        .unwrap();
    v.verify_tree(
        Method::Rejection,
        Check::Cheap,
        &dev_rows,
        &mut outs.outputs(),
    )
    .unwrap();
    assert_eq!(outs.read(&drv, v.stream()), want);
}

/// Host verifiers (the reference, the CPU backend) refuse tree outputs on the device, whatever
/// the rows, with `Unsupported { Device }`: nothing written or counted.
#[test]
fn tree_device_outputs_are_refused_by_host_verifiers() {
    let drv = HostDriver::new(Mode::Cuda, 64, 1);
    let stream = drv.stream().unwrap();
    let mut g = Gen(0x31_3102);
    let d = random_tree_batch(&mut g, spec(true, true));
    let host = d.view();
    let mut cpu = CpuVerifier::<K>::new(2).unwrap();
    let mut reference = Reference::<K>::new();
    let verifiers: [&mut dyn Verifier<K, Error = VerifyError>; 2] = [&mut cpu, &mut reference];
    for v in verifiers {
        for check in [Check::Cheap, Check::STRICT] {
            let mut outs = DevTreeOut::new(&drv, d.requests(), d.max_depth);
            let got = v.verify_tree(Method::Rejection, check, &host, &mut outs.outputs());
            assert_eq!(
                got,
                Err(VerifyError::Unsupported {
                    feature: Feature::Device
                })
            );
            assert!(outs.untouched(&drv, &stream), "written");
        }
        assert_eq!(v.totals().unwrap(), Counters::ZERO, "counted");
    }
}
