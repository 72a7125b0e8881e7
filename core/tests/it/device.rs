//! Device tensors in the batch and outputs (`verify::Device`, `DeviceOut`, `Outputs::on_device`):
//! their windows and downcasts, and validation (host verifiers refuse them, strict checks over
//! them are refused, lengths are checked as the host ones').

use specula_core::Counters;
use specula_core::gpu::{Memory, SUPPORT, View, ViewMut};
use specula_core::verify::tree::{
    DeviceTreeOutputs, PathOut, Tree, TreeBatch, TreeDims, TreeOutputs, validate_tree,
    validate_tree_with, verify_tree_batch,
};
use specula_core::verify::{
    AcceptedOut, Batch, Check, Device, DeviceOut, DeviceOutputs, Dims, Drafts, Feature, Format,
    Half, Method, Outputs, Param, Rows, Streams, Support, Target, TokensOut, Values, VerifyError,
    validate_with, verify_batch,
};
use std::sync::Arc;

/// A driver's memory: plain bytes.
struct Mem;
impl Memory for Mem {
    type Buffer = Arc<Vec<u8>>;
    fn bytes(buf: &Arc<Vec<u8>>) -> usize {
        buf.len()
    }
}

/// Another API's memory, of another buffer type.
struct Other;
impl Memory for Other {
    type Buffer = Arc<Vec<u32>>;
    fn bytes(buf: &Arc<Vec<u32>>) -> usize {
        buf.len() * 4
    }
}

fn bytes(n: usize) -> Arc<Vec<u8>> {
    Arc::new(vec![0; n])
}

#[test]
fn device_values_keep_their_window_and_downcast_only_to_their_driver() {
    let buf = bytes(40); // 10 f32
    let d = Device::f32(View::<Mem, f32>::range(&buf, 2, 5).unwrap());
    assert_eq!((d.len(), d.format()), (5, Format::F32));
    let sub = d.get(1, 3).unwrap();
    let v = sub.view::<Mem, f32>().unwrap();
    assert_eq!((v.byte_offset(), v.len()), (12, 3));
    assert!(core::ptr::eq(v.buffer(), &buf));
    assert!(d.get(3, 3).is_none(), "past the window");
    assert!(d.get(usize::MAX, 2).is_none(), "overflow");
    assert!(
        d.view::<Mem, u16>().is_none(),
        "f32 values read as 16-bit patterns"
    );
    assert!(d.view::<Other, f32>().is_none(), "another API's buffer");
    // Half formats: 16-bit views only, the format kept.
    let h = Device::bf16(View::<Mem, u16>::new(&buf));
    assert_eq!((h.len(), h.format()), (20, Format::Bf16));
    assert!(h.view::<Mem, u16>().is_some() && h.view::<Mem, f32>().is_none());
    assert_eq!(
        Device::f16(View::<Mem, u16>::new(&buf)).format(),
        Format::F16
    );
    // Through `Values` and `Rows`.
    let values = Values::Device(d);
    assert!(values.is_device());
    assert_eq!((values.len(), values.format()), (5, Format::F32));
    assert!(matches!(values.get(4, 1), Some(Values::Device(x)) if x.len() == 1));
    let rows = Rows::device(h, 4);
    assert!(rows.as_f32().is_none() && rows.as_half().is_none());
    assert_eq!(rows.as_device().map(|x| x.len()), Some(20));
    assert_eq!(rows.format(), Format::Bf16);
}

#[test]
#[should_panic(expected = "device values are not readable on the host")]
fn device_values_are_not_read_on_the_host() {
    let buf = bytes(8);
    let _ = Values::Device(Device::f32(View::<Mem, f32>::new(&buf))).at(0);
}

#[test]
fn device_outputs_keep_their_window_and_downcast_only_to_their_driver() {
    let mut buf = bytes(24); // 6 u32
    let mut out = DeviceOut::new(ViewMut::<Mem, u32>::range(&mut buf, 1, 4).unwrap());
    assert_eq!(out.len(), 4);
    assert!(out.view_mut::<Other>().is_none());
    let v = out.view_mut::<Mem>().unwrap();
    assert_eq!((v.byte_offset(), v.len()), (4, 4));
}

/// One valid batch: V = 4, two requests, `k = [2, 1]`, logits at 12 rows of stride 4.
fn batch<'a>(target: Values<'a>) -> Batch<'a> {
    Batch::dense(
        Dims { vocab: 4, k_max: 2 },
        Drafts {
            k: &[2, 1],
            ids: &[1, 2, 3, 0],
        },
        &[],
        Streams {
            seed: &[1, 2],
            offset: &[0, 0],
        },
    )
    .with_target(Target::Logits {
        rows: Rows {
            values: target,
            stride: 4,
        },
        temperature: &[0.5, 0.0],
    })
}

#[test]
fn validation_of_device_rows_and_outputs() {
    let logits = bytes(2 * 3 * 4 * 4);
    let dev = batch(Values::Device(Device::f32(View::<Mem, f32>::new(&logits))));
    assert!(dev.has_device() && !dev.has_half());
    let (mut accepted, mut tokens) = ([7u32; 2], [7u32; 6]);
    let host_out = Outputs::new(AcceptedOut(&mut accepted), TokensOut(&mut tokens));
    let unsupported = |feature| Err(VerifyError::Unsupported { feature });
    // A host verifier refuses them; the GPU support takes them with the cheap checks only.
    const { assert!(!Support::ALL.device && SUPPORT.device) };
    let cheap = Check::Cheap;
    let got = validate_with::<4>(Support::ALL, Method::Rejection, cheap, &dev, &host_out);
    assert_eq!(got, unsupported(Feature::Device));
    assert_eq!(
        validate_with::<4>(SUPPORT, Method::Rejection, cheap, &dev, &host_out),
        Ok(())
    );
    let strict = Check::STRICT;
    assert_eq!(
        validate_with::<4>(SUPPORT, Method::Rejection, strict, &dev, &host_out),
        unsupported(Feature::DeviceCheck)
    );
    // Refused before any row is read: failing host draft rows (each sums to 2) next to the
    // device target rows give the refusal, not the draft rows' error.
    let bad = [0.5f32; 16];
    let mixed = dev.with_draft_probs(&bad);
    assert_eq!(
        validate_with::<4>(SUPPORT, Method::Rejection, strict, &mixed, &host_out),
        unsupported(Feature::DeviceCheck)
    );
    // Their length is checked as host rows' are.
    let short = batch(Values::Device(Device::f32(
        View::<Mem, f32>::range(&logits, 0, 20).unwrap(),
    )));
    assert_eq!(
        validate_with::<4>(SUPPORT, Method::Rejection, cheap, &short, &host_out),
        Err(VerifyError::Length {
            param: Param::TargetLogits,
            len: 20,
            expected: 24
        })
    );
    // The reference writes and counts nothing.
    let mut counters = Counters::<4>::ZERO;
    let mut out = host_out;
    let got = verify_batch(Method::Greedy, cheap, &dev, &mut out, &mut counters);
    assert_eq!(got, unsupported(Feature::Device));
    assert_eq!(
        (accepted, tokens, counters),
        ([7; 2], [7; 6], Counters::ZERO)
    );

    // Device outputs: lengths as the host ones', host verifiers refuse.
    let host_logits = [0.0f32; 24];
    let host = batch(Values::F32(&host_logits));
    let (mut a, mut t, mut r) = (bytes(8), bytes(24), bytes(16));
    let mut outs = |acc: usize, tok: usize, rec: Option<usize>| {
        let a = DeviceOut::new(ViewMut::<Mem, u32>::range(&mut a, 0, acc).unwrap());
        let t = DeviceOut::new(ViewMut::<Mem, u32>::range(&mut t, 0, tok).unwrap());
        let r = rec.map(|n| DeviceOut::new(ViewMut::<Mem, u32>::range(&mut r, 0, n).unwrap()));
        let out = Outputs::on_device(DeviceOutputs {
            accepted: a,
            tokens: t,
            recovered: r,
        });
        let got = [
            validate_with::<4>(SUPPORT, Method::Greedy, cheap, &host, &out),
            validate_with::<4>(Support::ALL, Method::Greedy, cheap, &host, &out),
        ];
        (got, out.produce().recovered)
    };
    assert_eq!(
        outs(2, 6, None),
        ([Ok(()), unsupported(Feature::Device)], false)
    );
    assert_eq!(outs(2, 6, Some(4)).0[0], Ok(())); // padded: B · k_max slots
    assert!(outs(2, 6, Some(4)).1, "recovered on the device is produced");
    let len = |param, len, expected| {
        Err(VerifyError::Length {
            param,
            len,
            expected,
        })
    };
    assert_eq!(outs(1, 6, None).0[0], len(Param::Accepted, 1, 2));
    assert_eq!(outs(2, 5, None).0[0], len(Param::Tokens, 5, 6));
    assert_eq!(outs(2, 6, Some(3)).0[0], len(Param::Recovered, 3, 4));

    // `with_recovered` on device outputs gives host outputs holding `recovered` alone (host
    // and device outputs never mix): refused as host outputs of the wrong lengths.
    let (mut d1, mut d2) = (bytes(8), bytes(24));
    let mut rec = [0u32; 4];
    let mixed = Outputs::on_device(DeviceOutputs {
        accepted: DeviceOut::new(ViewMut::<Mem, u32>::range(&mut d1, 0, 2).unwrap()),
        tokens: DeviceOut::new(ViewMut::<Mem, u32>::range(&mut d2, 0, 6).unwrap()),
        recovered: None,
    })
    .with_recovered(&mut rec);
    assert!(matches!(mixed, Outputs::Host { .. }));
    assert_eq!(
        validate_with::<4>(SUPPORT, Method::Greedy, cheap, &host, &mixed),
        len(Param::Accepted, 0, 2)
    );
}

/// Emptiness and the debug text of device values and outputs: what they say of their window,
/// never of the memory (which the host cannot read).
#[test]
fn device_values_and_outputs_say_their_size() {
    let mut buf = bytes(16); // 4 f32 / u32
    let d = Device::f32(View::<Mem, f32>::range(&buf, 1, 2).unwrap());
    assert!(!d.is_empty());
    assert!(d.get(2, 0).is_some_and(|e| e.is_empty()));
    assert_eq!(
        d.get(1, 1).map(|e| (e.is_empty(), e.len())),
        Some((false, 1))
    );
    let text = format!("{d:?}");
    assert!(
        text.contains("F32") && text.contains("offset: 1") && text.contains("len: 2"),
        "{text}"
    );
    let empty = DeviceOut::new(ViewMut::<Mem, u32>::range(&mut buf, 4, 0).unwrap());
    assert!(empty.is_empty());
    let out = DeviceOut::new(ViewMut::<Mem, u32>::range(&mut buf, 1, 3).unwrap());
    assert!(!out.is_empty());
    let text = format!("{out:?}");
    assert!(
        text.contains("offset: 1") && text.contains("len: 3"),
        "{text}"
    );
}

/// `RequestPlan::plain`: only binary32 host rows verified as stored (probabilities without a
/// filter, logits at T = 0) are plain; half rows and device rows never are.
#[test]
fn only_binary32_host_rows_are_plain() {
    let host = [0.25f32; 48];
    let f32_batch = batch(Values::F32(&host)); // temperatures [0.5, 0.0]
    assert_eq!(
        [0, 1].map(|b| f32_batch.plan(b, Method::Greedy).plain),
        [false, true]
    );
    let probs = f32_batch.with_target(Target::Probs(Rows::f32(&host, 4)));
    assert_eq!(
        [0, 1].map(|b| probs.plan(b, Method::Greedy).plain),
        [true, true]
    );
    let half = [0u16; 48];
    let half_batch = batch(Values::Half(specula_core::verify::Half::Bf16(&half)));
    assert_eq!(
        [0, 1].map(|b| half_batch.plan(b, Method::Greedy).plain),
        [false, false]
    );
    let buf = bytes(48 * 4);
    let on_device = batch(Values::Device(Device::f32(View::<Mem, f32>::new(&buf))));
    assert_eq!(
        [0, 1].map(|b| on_device.plan(b, Method::Greedy).plain),
        [false, false]
    );
    let device_probs = probs.with_target(Target::Probs(Rows::device(
        Device::f32(View::<Mem, f32>::new(&buf)),
        4,
    )));
    assert_eq!(
        [0, 1].map(|b| device_probs.plan(b, Method::Greedy).plain),
        [false, false]
    );
}

/// A tree batch (two requests of a root and one child, V = 4) whose target and draft rows are
/// `target` and `draft`.
fn tree_batch<'a>(target: Values<'a>, draft: Values<'a>) -> TreeBatch<'a> {
    TreeBatch::new(
        TreeDims {
            vocab: 4,
            max_nodes: 2,
            max_depth: 1,
        },
        Tree {
            nodes: &[2, 2],
            tokens: &[0, 1, 0, 2],
            first_child: &[1, -1, 1, -1],
            next_sibling: &[-1, -1, -1, -1],
        },
        &[],
        Streams {
            seed: &[1, 2],
            offset: &[0, 0],
        },
    )
    .with_target(Target::Probs(Rows {
        values: target,
        stride: 4,
    }))
    .with_draft(Rows {
        values: draft,
        stride: 4,
    })
}

#[test]
fn tree_validation_of_device_and_half_rows() {
    let (rows, draft) = (bytes(4 * 4 * 4), bytes(4 * 4 * 4));
    let device = |b| Values::Device(Device::f32(View::<Mem, f32>::new(b)));
    let host = [0.25f32; 16];
    let dev = tree_batch(device(&rows), device(&draft));
    assert!(dev.has_device());
    let (mut accepted, mut path, mut tokens) = ([7u32; 2], [7u32; 4], [7u32; 4]);
    let out = TreeOutputs::new(
        AcceptedOut(&mut accepted),
        PathOut(&mut path),
        TokensOut(&mut tokens),
    );
    let unsupported = |feature| Err(VerifyError::Unsupported { feature });
    let (cheap, strict, m) = (Check::Cheap, Check::STRICT, Method::Rejection);
    // Host verifiers refuse device rows (target or draft); the GPU support takes them with the
    // cheap checks only.
    assert_eq!(
        validate_tree::<4>(m, cheap, &dev, &out),
        unsupported(Feature::Device)
    );
    let dev_draft = tree_batch(Values::F32(&host), device(&draft));
    assert_eq!(
        validate_tree::<4>(m, cheap, &dev_draft, &out),
        unsupported(Feature::Device)
    );
    assert_eq!(
        validate_tree_with::<4>(SUPPORT, m, cheap, &dev, &out),
        Ok(())
    );
    assert_eq!(
        validate_tree_with::<4>(SUPPORT, m, strict, &dev, &out),
        unsupported(Feature::DeviceCheck)
    );
    // Refused before any row is read: host draft rows that would fail (each sums to 2) next to
    // device target rows give the refusal, not the draft rows' error.
    let bad = [0.5f32; 16];
    let mixed = tree_batch(device(&rows), Values::F32(&bad));
    assert_eq!(
        validate_tree_with::<4>(SUPPORT, m, strict, &mixed, &out),
        unsupported(Feature::DeviceCheck)
    );
    // Lengths through `Values::len`, on the device as on the host.
    let short = View::<Mem, f32>::range(&rows, 0, 15).unwrap();
    let short = tree_batch(Values::Device(Device::f32(short)), device(&draft));
    assert_eq!(
        validate_tree_with::<4>(SUPPORT, m, cheap, &short, &out),
        Err(VerifyError::Length {
            param: Param::TargetProbs,
            len: 15,
            expected: 16
        })
    );
    // Half rows, host or device: a support without tree_half refuses them with their feature;
    // the reference and the CPU backend (Support::ALL, host rows) and the GPU support (device
    // rows too) take them.
    let bits = [0x3E80u16; 16]; // bf16 0.25
    let half = Values::Half(Half::Bf16(&bits));
    let dev_half = View::<Mem, u16>::range(&rows, 0, 16).unwrap();
    let dev_half = Values::Device(Device::bf16(dev_half));
    let logits = |values| {
        tree_batch(Values::F32(&host), Values::F32(&host)).with_target(Target::Logits {
            rows: Rows { values, stride: 4 },
            temperature: &[0.5, 0.5],
        })
    };
    let cases = [
        (
            tree_batch(half, Values::F32(&host)),
            Feature::HalfProbs,
            false,
        ),
        (
            tree_batch(dev_half, Values::F32(&host)),
            Feature::HalfProbs,
            true,
        ),
        (tree_batch(Values::F32(&host), half), Feature::Half, false),
        (logits(half), Feature::Half, false),
        (logits(dev_half), Feature::Half, true),
    ];
    const { assert!(Support::ALL.tree_half && Support::CPU.tree_half && SUPPORT.tree_half) };
    let mut no_half = Support::ALL;
    no_half.tree_half = false;
    for (b, feature, on_device) in cases {
        assert_eq!(
            validate_tree_with::<4>(no_half, m, cheap, &b, &out),
            unsupported(feature)
        );
        let host = if on_device {
            unsupported(Feature::Device)
        } else {
            Ok(())
        };
        for support in [Support::ALL, Support::CPU] {
            assert_eq!(validate_tree_with::<4>(support, m, cheap, &b, &out), host);
        }
        assert_eq!(validate_tree_with::<4>(SUPPORT, m, cheap, &b, &out), Ok(()));
    }
    // The reference writes and counts nothing; the host rows verify.
    let mut counters = Counters::<4>::ZERO;
    let mut out = out;
    let got = verify_tree_batch(m, cheap, &dev, &mut out, &mut counters);
    assert_eq!(got, unsupported(Feature::Device));
    let TreeOutputs::Host { accepted, path, .. } = &out else {
        panic!("host outputs")
    };
    assert_eq!(
        (&accepted[..], &path[..], counters),
        (&[7u32; 2][..], &[7u32; 4][..], Counters::ZERO)
    );
    let ok = tree_batch(Values::F32(&host), Values::F32(&host));
    verify_tree_batch(m, strict, &ok, &mut out, &mut counters).unwrap();
    assert_eq!(counters.tree_drafts, 2);
}

/// Tree outputs on the device (`TreeOutputs::on_device`): lengths checked as the host ones',
/// host verifiers (the reference) refuse them with nothing written or counted.
#[test]
fn tree_validation_of_device_outputs() {
    let host = [0.25f32; 16];
    let batch = tree_batch(Values::F32(&host), Values::F32(&host));
    let (cheap, m) = (Check::Cheap, Method::Rejection);
    let unsupported = |feature| Err(VerifyError::Unsupported { feature });
    let (mut a, mut p, mut t) = (bytes(16), bytes(16), bytes(16));
    // B = 2, max_depth = 1: 2 counts, 4 path and 4 token slots.
    let mut outs = |acc: usize, path: usize, tok: usize| {
        let out = TreeOutputs::on_device(DeviceTreeOutputs {
            accepted: DeviceOut::new(ViewMut::<Mem, u32>::range(&mut a, 0, acc).unwrap()),
            path: DeviceOut::new(ViewMut::<Mem, u32>::range(&mut p, 0, path).unwrap()),
            tokens: DeviceOut::new(ViewMut::<Mem, u32>::range(&mut t, 0, tok).unwrap()),
        });
        [
            validate_tree_with::<4>(SUPPORT, m, cheap, &batch, &out),
            validate_tree::<4>(m, cheap, &batch, &out),
        ]
    };
    assert_eq!(outs(2, 4, 4), [Ok(()), unsupported(Feature::Device)]);
    let len = |param, len, expected| {
        Err(VerifyError::Length {
            param,
            len,
            expected,
        })
    };
    assert_eq!(outs(1, 4, 4)[0], len(Param::Accepted, 1, 2));
    assert_eq!(outs(2, 3, 4)[0], len(Param::Path, 3, 4));
    assert_eq!(outs(2, 4, 3)[0], len(Param::Tokens, 3, 4));
    assert_eq!(outs(3, 4, 4)[0], len(Param::Accepted, 3, 2), "too long");

    // The reference refuses them (nothing counted).
    let (mut d1, mut d2, mut d3) = (bytes(8), bytes(16), bytes(16));
    let mut counters = Counters::<4>::ZERO;
    let mut dev = TreeOutputs::on_device(DeviceTreeOutputs {
        accepted: DeviceOut::new(ViewMut::<Mem, u32>::new(&mut d1)),
        path: DeviceOut::new(ViewMut::<Mem, u32>::new(&mut d2)),
        tokens: DeviceOut::new(ViewMut::<Mem, u32>::new(&mut d3)),
    });
    let got = verify_tree_batch(m, cheap, &batch, &mut dev, &mut counters);
    assert_eq!(got, unsupported(Feature::Device));
    assert_eq!(counters, Counters::ZERO);
    // Device outputs say their size, never their memory.
    let mut buf = bytes(16);
    let out = TreeOutputs::on_device(DeviceTreeOutputs {
        accepted: DeviceOut::new(ViewMut::<Mem, u32>::range(&mut buf, 0, 1).unwrap()),
        path: DeviceOut::new(ViewMut::<Mem, u32>::range(&mut d2, 1, 2).unwrap()),
        tokens: DeviceOut::new(ViewMut::<Mem, u32>::range(&mut d3, 0, 0).unwrap()),
    });
    let text = format!("{out:?}");
    assert!(
        text.contains("Device { outputs: DeviceTreeOutputs"),
        "{text}"
    );
    assert!(text.contains("offset: 1, len: 2"), "{text}");
}

/// The GPU support verifies half logits but not half probabilities (`Feature::HalfProbs`), and
/// host rows widen exactly (`Values::widen_into`, what the CPU backend reads half rows with).
#[test]
fn half_logits_pass_the_gpu_support_and_half_rows_widen_exactly() {
    use specula_core::verify::Half;
    let half = [0u16; 24];
    let logits = batch(Values::Half(Half::Bf16(&half)));
    let (mut accepted, mut tokens) = ([0u32; 2], [0u32; 6]);
    let out = Outputs::new(AcceptedOut(&mut accepted), TokensOut(&mut tokens));
    let cheap = Check::Cheap;
    assert_eq!(
        validate_with::<4>(SUPPORT, Method::Greedy, cheap, &logits, &out),
        Ok(())
    );
    let probs = logits.with_target(Target::Probs(Rows::half(Half::Bf16(&half), 4)));
    assert_eq!(
        validate_with::<4>(SUPPORT, Method::Greedy, cheap, &probs, &out),
        Err(VerifyError::Unsupported {
            feature: Feature::HalfProbs
        })
    );
    // 1.0, -2.0 and 0.5 in bf16 and f16; binary32 copied as is.
    let mut w = [9.0f32; 3];
    Values::Half(Half::Bf16(&[0x3F80, 0xC000, 0x3F00])).widen_into(&mut w);
    assert_eq!(w, [1.0, -2.0, 0.5]);
    w = [9.0; 3];
    Values::Half(Half::F16(&[0x3C00, 0xC000, 0x3800])).widen_into(&mut w);
    assert_eq!(w, [1.0, -2.0, 0.5]);
    Values::F32(&[3.0, 4.0, 5.0]).widen_into(&mut w);
    assert_eq!(w, [3.0, 4.0, 5.0]);
}

/// `host()`: host outputs' slices in their named places, device outputs refused as host
/// verifiers refuse them (`Unsupported { Device }`), chain and tree.
#[test]
fn host_slices_of_outputs_and_the_device_refusal() {
    let device = Err(VerifyError::Unsupported {
        feature: Feature::Device,
    });
    let (mut acc, mut tok, mut rec) = ([1u32; 2], [2u32; 6], [3u32; 4]);
    let mut out = Outputs::new(AcceptedOut(&mut acc), TokensOut(&mut tok)).with_recovered(&mut rec);
    let (AcceptedOut(a), TokensOut(t), r) = out.host().unwrap();
    assert_eq!((a.len(), a[0], t.len(), t[0]), (2, 1, 6, 2));
    assert_eq!(r.map(|r| (r.len(), r[0])), Some((4, 3)));
    let mut out = Outputs::new(AcceptedOut(&mut acc), TokensOut(&mut tok));
    assert!(
        out.host().unwrap().2.is_none(),
        "no recovered tokens asked for"
    );
    let (mut d1, mut d2) = (bytes(8), bytes(24));
    let mut dev = Outputs::on_device(DeviceOutputs {
        accepted: DeviceOut::new(ViewMut::<Mem, u32>::range(&mut d1, 0, 2).unwrap()),
        tokens: DeviceOut::new(ViewMut::<Mem, u32>::range(&mut d2, 0, 6).unwrap()),
        recovered: None,
    });
    assert_eq!(dev.host().map(|_| ()), device);

    let (mut path, mut tokens) = ([4u32; 6], [5u32; 6]);
    let mut out = TreeOutputs::new(
        AcceptedOut(&mut acc),
        PathOut(&mut path),
        TokensOut(&mut tokens),
    );
    let (AcceptedOut(a), PathOut(p), TokensOut(t)) = out.host().unwrap();
    assert_eq!((a[0], p[0], t[0]), (1, 4, 5));
    let (mut d1, mut d2, mut d3) = (bytes(8), bytes(24), bytes(24));
    let mut dev = TreeOutputs::on_device(DeviceTreeOutputs {
        accepted: DeviceOut::new(ViewMut::<Mem, u32>::new(&mut d1)),
        path: DeviceOut::new(ViewMut::<Mem, u32>::new(&mut d2)),
        tokens: DeviceOut::new(ViewMut::<Mem, u32>::new(&mut d3)),
    });
    assert_eq!(dev.host().map(|_| ()), device);
}
