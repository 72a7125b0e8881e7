//! Device tensors through the one API (issue 31): batches whose target and draft rows live in
//! device memory ([`Values::Device`]) and outputs on the device ([`Outputs::on_device`]),
//! through [`Verifier::verify`] of the shared GPU orchestration over the host driver (whose
//! "device" memory is host memory it allocated). Against the host-slice path of the same
//! orchestration: the same outputs and counters, bit for bit, and no synchronising call; and the
//! refusals: another device's or driver's memory, strict checks, host verifiers.

use specula::cpu::CpuVerifier;
use specula_core::gpu::{Driver, GpuError, GpuVerifier, Memory, Staging, View, ViewMut};
use specula_core::verify::{
    Batch, Check, Device, DeviceOut, DeviceOutputs, Draft, Feature, Half, Method, Outputs, Param,
    Produce, Reference, Rows, Target, Values, Verifier, VerifyError, draft_slots,
};
use specula_tests::conformance::{self as c, Gen, K, OutData, RandomSpec};
use specula_tests::gpu_inputs::{Step, kinds};
use specula_tests::host_driver::{Buf, HostDriver};
use specula_tests::kernel_host::Mode;
use std::sync::Arc;

/// Which element format a test puts the rows in.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fmt {
    F32,
    Bf16,
    F16,
}

const FORMATS: [Fmt; 3] = [Fmt::F32, Fmt::Bf16, Fmt::F16];

fn bits(x: &[f32], f: Fmt) -> Vec<u16> {
    x.iter()
        .map(|&v| match f {
            Fmt::Bf16 => half::bf16::from_f32(v).to_bits(),
            _ => half::f16::from_f32(v).to_bits(),
        })
        .collect()
}

/// Host rows converted to a format: binary32 as they are, or 16-bit patterns.
enum HostRows {
    F32(Vec<f32>),
    Half(Vec<u16>, Fmt),
}

impl HostRows {
    fn new(x: &[f32], f: Fmt) -> Self {
        match f {
            Fmt::F32 => Self::F32(x.to_vec()),
            _ => Self::Half(bits(x, f), f),
        }
    }

    fn values(&self) -> Values<'_> {
        match self {
            Self::F32(x) => Values::F32(x),
            Self::Half(x, Fmt::Bf16) => Values::Half(Half::Bf16(x)),
            Self::Half(x, _) => Values::Half(Half::F16(x)),
        }
    }

    /// The same values in a buffer of `drv`.
    fn upload(&self, drv: &HostDriver) -> DevRows {
        match self {
            Self::F32(x) => DevRows(drv.buffer_from(x), Fmt::F32),
            Self::Half(x, f) => DevRows(drv.buffer_from(x), *f),
        }
    }
}

/// Rows in the host driver's device memory.
struct DevRows(Buf, Fmt);

impl DevRows {
    fn device(&self) -> Device<'_> {
        match self.1 {
            Fmt::F32 => Device::f32(View::<HostDriver, f32>::new(&self.0)),
            Fmt::Bf16 => Device::bf16(View::<HostDriver, u16>::new(&self.0)),
            Fmt::F16 => Device::f16(View::<HostDriver, u16>::new(&self.0)),
        }
    }
}

/// `host` with its target (and draft) rows replaced by `target` (and `draft`), same strides.
fn with_rows<'a>(host: Batch<'a>, target: Values<'a>, draft: Option<Values<'a>>) -> Batch<'a> {
    let t = host.target.with_rows(Rows {
        values: target,
        ..host.target.rows()
    });
    let mut b = host.with_target(t);
    if let (Some(d), Some(values)) = (host.draft, draft) {
        b.draft = Some(Draft {
            rows: Rows { values, ..d.rows },
            ..d
        });
    }
    b
}

/// Device output buffers of `drv` for `batch`, filled with a marker no verifier writes.
struct DevOut {
    accepted: Buf,
    tokens: Buf,
    recovered: Option<Buf>,
    lens: (usize, usize, usize),
}

const MARK: u32 = 0xDEAD_BEEF;

impl DevOut {
    fn new(drv: &HostDriver, batch: &Batch<'_>, recovered: bool) -> Self {
        let (b, slots) = (batch.requests(), batch.requests() * (batch.k_max + 1));
        let r = draft_slots(batch);
        Self {
            accepted: drv.buffer_from(&vec![MARK; b]),
            tokens: drv.buffer_from(&vec![MARK; slots]),
            recovered: recovered.then(|| drv.buffer_from(&vec![MARK; r.max(1)])),
            lens: (b, slots, r),
        }
    }

    fn outputs(&mut self) -> Outputs<'_> {
        let r = self.lens.2;
        Outputs::on_device(DeviceOutputs {
            accepted: DeviceOut::new(ViewMut::<HostDriver, u32>::new(&mut self.accepted)),
            tokens: DeviceOut::new(ViewMut::<HostDriver, u32>::new(&mut self.tokens)),
            recovered: self
                .recovered
                .as_mut()
                .map(|buf| DeviceOut::new(ViewMut::<HostDriver, u32>::range(buf, 0, r).unwrap())),
        })
    }

    /// (accepted, tokens, recovered) once `stream` has drained.
    fn read(
        &self,
        drv: &HostDriver,
        stream: &<HostDriver as Driver>::Stream,
    ) -> (Vec<u32>, Vec<u32>, Option<Vec<u32>>) {
        let (b, slots, r) = self.lens;
        (
            drv.read_after(stream, &self.accepted, b),
            drv.read_after(stream, &self.tokens, slots),
            self.recovered
                .as_ref()
                .map(|buf| drv.read_after(stream, buf, r)),
        )
    }
}

fn verifier(drv: &HostDriver) -> GpuVerifier<HostDriver, K> {
    GpuVerifier::new(drv.clone()).unwrap()
}

/// `host` (host rows in `f`'s format) through the host-slice path and the same rows on the
/// device with device outputs, on two fresh verifiers of `drv`: identical outputs (recovered
/// tokens included) and counters, and the device step made no synchronising call.
fn same_as_host_path(
    drv: &HostDriver,
    method: Method,
    host: Batch<'_>,
    f: Fmt,
    recovered: bool,
) -> (Vec<u32>, Vec<u32>) {
    let target = HostRows::new(&widened(host.target.rows().values), f);
    let draft = host
        .draft
        .map(|d| HostRows::new(&widened(d.rows.values), f));
    let host = with_rows(host, target.values(), draft.as_ref().map(HostRows::values));
    // The host-slice path.
    let mut a = verifier(drv);
    let mut want = OutData::new(host.requests(), host.k_max);
    let mut want_rec = vec![MARK; draft_slots(&host)];
    {
        let mut out = want.view();
        if recovered {
            out = out.with_recovered(&mut want_rec);
        }
        a.verify(method, Check::Cheap, &host, &mut out).unwrap();
    }
    // The device path.
    let dt = target.upload(drv);
    let dd = draft.as_ref().map(|d| d.upload(drv));
    let dev = with_rows(
        host,
        Values::Device(dt.device()),
        dd.as_ref().map(|d| Values::Device(d.device())),
    );
    assert!(dev.has_device());
    let mut v = verifier(drv);
    let mut outs = DevOut::new(drv, &dev, recovered);
    let (syncs, launches) = (drv.sync_calls(), drv.launches());
    v.verify(method, Check::Cheap, &dev, &mut outs.outputs())
        .unwrap();
    assert_eq!(v.sync_calls(), 0, "the device step waited");
    assert_eq!(drv.sync_calls(), syncs, "the device step waited");
    let (accepted, tokens, rec) = outs.read(drv, v.stream());
    assert!(drv.launches() > launches, "nothing was launched");
    assert_eq!(
        (&accepted, &tokens),
        (&want.accepted, &want.tokens),
        "{f:?} {method:?}"
    );
    if recovered {
        assert_eq!(rec.as_ref(), Some(&want_rec), "{f:?} {method:?}: recovered");
    }
    assert_eq!(
        v.totals().unwrap(),
        a.totals().unwrap(),
        "{f:?} {method:?}: counters"
    );
    (accepted, tokens)
}

/// Host values as binary32 (the generators' rows are binary32).
fn widened(v: Values<'_>) -> Vec<f32> {
    let mut w = vec![0.0; v.len()];
    v.widen_into(&mut w);
    w
}

const METHODS: [Method; 3] = [Method::Rejection, Method::Greedy, Method::Typical];

/// Random padded batches, probabilities (binary32: no kernel entry reads half probabilities)
/// and logits in each format, with and without draft rows, one and split blocks per request:
/// the device path gives the host-slice path's bits.
#[test]
fn gpu_device_rows_and_outputs_match_the_host_path() {
    let mut accepted_any = false;
    for (mode, sms) in [(Mode::Cuda, 1), (Mode::Hip, 16)] {
        let drv = HostDriver::new(mode, 64, sms);
        let mut g = Gen(0x31_0001 + u64::from(sms));
        for i in 0..24 {
            let spec = RandomSpec {
                garbage: false,
                ..RandomSpec::default()
            };
            let (d, _) = c::random_batch(&mut g, spec);
            let method = METHODS[i % 3];
            let (acc, _) = same_as_host_path(&drv, method, d.view(), Fmt::F32, i % 2 == 0);
            accepted_any |= acc.iter().any(|&a| a > 0);
            let (logits, temps) = c::random_logits(&mut g, &d);
            let host = d.view().with_target(Target::Logits {
                rows: Rows::f32(&logits, d.target_stride),
                temperature: &temps,
            });
            for f in FORMATS {
                same_as_host_path(&drv, method, host, f, i % 2 == 1);
            }
        }
    }
    assert!(
        accepted_any,
        "no draft token was ever accepted: a weak test"
    );
}

/// The engine inputs (ragged layout, `k = 0`, bonus tokens, logits with mixed temperatures) on
/// the device, in each format.
#[test]
fn gpu_device_engine_inputs_match_the_host_path() {
    let drv = HostDriver::new(Mode::Cuda, 64, 1);
    let mut g = Gen(0x31_0002);
    for inputs in kinds() {
        for i in 0..6 {
            let (d, _) = c::random_batch(
                &mut g,
                RandomSpec {
                    garbage: false,
                    ..RandomSpec::default()
                },
            );
            let step = Step::new(&mut g, d, inputs);
            let formats: &[Fmt] = if inputs.logits { &FORMATS } else { &[Fmt::F32] };
            for &f in formats {
                same_as_host_path(&drv, METHODS[i % 3], step.view(), f, true);
            }
        }
    }
}

/// One small valid batch: V = 4, two requests, two drafts each, f32 logits and draft rows.
struct Small {
    logits: Vec<f32>,
    draft: Vec<f32>,
}

impl Small {
    fn new() -> Self {
        let mut g = Gen(0x31_0003);
        Self {
            logits: (0..2 * 3 * 4).map(|_| 4.0 * g.unit()).collect(),
            draft: (0..2 * 2 * 4).map(|_| 0.25).collect(),
        }
    }

    fn host(&self) -> Batch<'_> {
        Batch::dense(
            specula_core::verify::Dims { vocab: 4, k_max: 2 },
            specula_core::verify::Drafts {
                k: &[2, 1],
                ids: &[1, 2, 3, 0],
            },
            &[],
            specula_core::verify::Streams {
                seed: &[1, 2],
                offset: &[0, 0],
            },
        )
        .with_target(Target::Logits {
            rows: Rows::f32(&self.logits, 4),
            temperature: &[0.7, 1.0],
        })
        .with_draft(Rows::f32(&self.draft, 4))
    }
}

/// A GPU API that is not the host driver: its buffers downcast to nothing else.
struct Other;

impl Memory for Other {
    type Buffer = Arc<Vec<u8>>;
    fn bytes(buf: &Arc<Vec<u8>>) -> usize {
        buf.len()
    }
}

/// Asserts `v` refused the step with `want`, launched and wrote nothing and counted nothing.
fn refused(
    drv: &HostDriver,
    v: &mut GpuVerifier<HostDriver, K>,
    batch: &Batch<'_>,
    check: Check,
    want: &GpuError<<HostDriver as Driver>::Error>,
    outs: &mut DevOut,
) {
    let launches = drv.launches();
    let got = v.verify(Method::Rejection, check, batch, &mut outs.outputs());
    assert_eq!(got.as_ref(), Err(want));
    assert_eq!(drv.launches(), launches, "{want:?}: launched");
    let (a, t, r) = outs.read(drv, v.stream());
    assert!(
        a.iter()
            .chain(&t)
            .chain(r.iter().flatten())
            .all(|&x| x == MARK),
        "{want:?}: written"
    );
    assert_eq!(
        v.totals().unwrap(),
        specula_core::Counters::ZERO,
        "{want:?}: counted"
    );
}

/// Another device's memory (another host driver), another API's memory, device outputs of
/// another device, and strict checks over device rows: typed errors, with nothing launched,
/// written or counted. `Staging::write` (whose views outlive the batch) takes host tensors only.
#[test]
fn gpu_device_foreign_memory_and_strict_checks_are_refused() {
    let drv = HostDriver::new(Mode::Cuda, 64, 1);
    let other_device = HostDriver::new(Mode::Cuda, 64, 1);
    let small = Small::new();
    let host = small.host();
    let mine = DevRows(drv.buffer_from(&small.logits), Fmt::F32);
    let theirs = DevRows(other_device.buffer_from(&small.logits), Fmt::F32);
    let draft = DevRows(drv.buffer_from(&small.draft), Fmt::F32);
    let theirs_draft = DevRows(other_device.buffer_from(&small.draft), Fmt::F32);
    let alien: Arc<Vec<u8>> = Arc::new(vec![0; small.logits.len() * 4]);
    let alien_rows = Device::f32(View::<Other, f32>::new(&alien));
    let mut v = verifier(&drv);
    let mut outs = DevOut::new(&drv, &host, true);
    let foreign = |param| GpuError::ForeignMemory { param };

    let other = with_rows(host, Values::Device(theirs.device()), None);
    refused(
        &drv,
        &mut v,
        &other,
        Check::Cheap,
        &foreign(Param::TargetLogits),
        &mut outs,
    );
    let other = with_rows(host, Values::Device(alien_rows), None);
    refused(
        &drv,
        &mut v,
        &other,
        Check::Cheap,
        &foreign(Param::TargetLogits),
        &mut outs,
    );
    let other = with_rows(
        host,
        Values::Device(mine.device()),
        Some(Values::Device(theirs_draft.device())),
    );
    refused(
        &drv,
        &mut v,
        &other,
        Check::Cheap,
        &foreign(Param::DraftProbs),
        &mut outs,
    );

    let good = with_rows(
        host,
        Values::Device(mine.device()),
        Some(Values::Device(draft.device())),
    );
    let strict = GpuError::Verify(VerifyError::Unsupported {
        feature: Feature::DeviceCheck,
    });
    refused(&drv, &mut v, &good, Check::STRICT, &strict, &mut outs);

    // Outputs on another device: each of the three.
    let mut theirs_out = DevOut::new(&other_device, &host, true);
    let launches = drv.launches();
    for (param, pick) in [
        (Param::Accepted, 0),
        (Param::Tokens, 1),
        (Param::Recovered, 2),
    ] {
        let mut mixed = DevOut::new(&drv, &host, true);
        match pick {
            0 => std::mem::swap(&mut mixed.accepted, &mut theirs_out.accepted),
            1 => std::mem::swap(&mut mixed.tokens, &mut theirs_out.tokens),
            _ => std::mem::swap(&mut mixed.recovered, &mut theirs_out.recovered),
        }
        let got = v.verify(Method::Greedy, Check::Cheap, &good, &mut mixed.outputs());
        assert_eq!(got, Err(foreign(param)));
        let (a, t, r) = mixed.read(&drv, v.stream());
        assert!(
            a.iter()
                .chain(&t)
                .chain(r.iter().flatten())
                .all(|&x| x == MARK)
        );
        match pick {
            0 => std::mem::swap(&mut mixed.accepted, &mut theirs_out.accepted),
            1 => std::mem::swap(&mut mixed.tokens, &mut theirs_out.tokens),
            _ => std::mem::swap(&mut mixed.recovered, &mut theirs_out.recovered),
        }
    }
    assert_eq!(drv.launches(), launches);
    assert_eq!(v.totals().unwrap(), specula_core::Counters::ZERO);

    // Staging::write returns views that outlive the batch: host tensors only.
    let mut staging = Staging::<HostDriver>::new();
    staging.reserve(&drv, &good, Produce::TOKENS).unwrap();
    let got = staging.write::<K>(&drv, v.stream(), Method::Greedy, &good, Produce::TOKENS);
    assert_eq!(
        got.err(),
        Some(GpuError::Verify(VerifyError::Unsupported {
            feature: Feature::Device
        }))
    );

    // The same rows and outputs, valid: the step runs, and gives the host path's bits.
    let mut want = OutData::new(2, 2);
    verifier(&drv)
        .verify(Method::Rejection, Check::Cheap, &host, &mut want.view())
        .unwrap();
    v.verify(Method::Rejection, Check::Cheap, &good, &mut outs.outputs())
        .unwrap();
    let (a, t, _) = outs.read(&drv, v.stream());
    assert_eq!((a, t), (want.accepted, want.tokens));
}

/// Host verifiers (the reference, the CPU backend) refuse device rows and device outputs as
/// unsupported, writing and counting nothing.
#[test]
fn gpu_device_tensors_are_refused_by_host_verifiers() {
    let drv = HostDriver::new(Mode::Cuda, 64, 1);
    let small = Small::new();
    let host = small.host();
    let rows = DevRows(drv.buffer_from(&small.logits), Fmt::F32);
    let dev = with_rows(host, Values::Device(rows.device()), None);
    let unsupported = VerifyError::Unsupported {
        feature: Feature::Device,
    };
    let mut cpu = CpuVerifier::<K>::new(2).unwrap();
    let mut reference = Reference::<K>::new();
    let verifiers: [&mut dyn Verifier<K, Error = VerifyError>; 2] = [&mut cpu, &mut reference];
    for v in verifiers {
        assert!(!v.support().device);
        let mut out = OutData::new(2, 2);
        let got = v.verify(Method::Rejection, Check::Cheap, &dev, &mut out.view());
        assert_eq!(got, Err(unsupported));
        assert_eq!(out, OutData::new(2, 2), "written");
        let mut outs = DevOut::new(&drv, &host, false);
        let got = v.verify(Method::Rejection, Check::Cheap, &host, &mut outs.outputs());
        assert_eq!(got, Err(unsupported));
        assert_eq!(v.totals().unwrap(), specula_core::Counters::ZERO, "counted");
    }
}

/// Device rows with host outputs (copied down: the one wait of the host outputs), and host
/// rows with device outputs (no wait): the host-slice path's bits either way.
#[test]
fn gpu_device_rows_or_outputs_alone_match_the_host_path() {
    let drv = HostDriver::new(Mode::Cuda, 64, 1);
    let mut g = Gen(0x31_0004);
    for i in 0..8 {
        let spec = RandomSpec {
            garbage: false,
            ..RandomSpec::default()
        };
        let (d, _) = c::random_batch(&mut g, spec);
        let (logits, temps) = c::random_logits(&mut g, &d);
        let host = d.view().with_target(Target::Logits {
            rows: Rows::f32(&logits, d.target_stride),
            temperature: &temps,
        });
        let method = METHODS[i % 3];
        let mut want = OutData::new(host.requests(), host.k_max);
        verifier(&drv)
            .verify(method, Check::Cheap, &host, &mut want.view())
            .unwrap();
        // Device rows, host outputs.
        let rows = DevRows(drv.buffer_from(&logits), Fmt::F32);
        let dev = with_rows(host, Values::Device(rows.device()), None);
        let mut v = verifier(&drv);
        let mut got = OutData::new(host.requests(), host.k_max);
        v.verify(method, Check::Cheap, &dev, &mut got.view())
            .unwrap();
        assert_eq!(got, want);
        assert_eq!(v.sync_calls(), 1, "host outputs are waited for once");
        // Host rows, device outputs.
        let mut w = verifier(&drv);
        let mut outs = DevOut::new(&drv, &host, false);
        w.verify(method, Check::Cheap, &host, &mut outs.outputs())
            .unwrap();
        assert_eq!(w.sync_calls(), 0, "device outputs are not waited for");
        let (a, t, _) = outs.read(&drv, w.stream());
        assert_eq!((&a, &t), (&want.accepted, &want.tokens));
    }
}
