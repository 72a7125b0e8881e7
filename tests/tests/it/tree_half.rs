//! Token trees of bf16 / f16 rows (issue 31): target logits, target probabilities and draft
//! rows, in host or device memory, through the shared GPU orchestration over the host driver
//! (the tree entry of the kernel text, executed by the C++ shim) and through the CPU backend:
//! exactly the outputs and counters of the binary32 tree over the widened rows (the
//! reference), at small vocabularies and at V = 32000. The reference itself reads binary32
//! rows only: a typed refusal, nothing written or counted.

use specula::cpu::CpuVerifier;
use specula_core::Counters;
use specula_core::gpu::kernels::{
    self, ERR_SHAPE, FLAG_DRAFT_BF16, FLAG_DRAFT_F16, FLAG_DRAFT_PROBS, FLAG_TARGET_BF16,
    FLAG_TARGET_F16, TREE_ENTRY, TREE_HALF_ENTRY,
};
use specula_core::gpu::{GpuVerifier, Staging, TreeStep, View, tree_shape};
use specula_core::verify::tree::{TreeBatch, validate_tree_with, verify_tree_batch};
use specula_core::verify::{
    Check, Device, Feature, Format, Half, Method, Reference, Support, Values, Verifier,
    VerifyError, bf16_to_f32, f16_to_f32,
};
use specula_tests::conformance::{Gen, K, METHODS};
use specula_tests::host_driver::{Buf, HostDriver};
use specula_tests::kernel_host::Mode;
use specula_tests::tree::{TreeData, TreeOut, TreeSpec, full_tree, random_tree_batch, with_values};

/// `x` rounded to `f`: its patterns (empty for binary32) and the binary32 values they widen to.
fn round(x: &[f32], f: Format) -> (Vec<u16>, Vec<f32>) {
    let bits: Vec<u16> = match f {
        Format::F32 => return (Vec::new(), x.to_vec()),
        Format::Bf16 => x
            .iter()
            .map(|&v| half::bf16::from_f32(v).to_bits())
            .collect(),
        Format::F16 => x
            .iter()
            .map(|&v| half::f16::from_f32(v).to_bits())
            .collect(),
    };
    let wide = bits
        .iter()
        .map(|&b| match f {
            Format::Bf16 => bf16_to_f32(b),
            _ => f16_to_f32(b),
        })
        .collect();
    (bits, wide)
}

/// Host values of `f`: the patterns, or the binary32 rows.
fn host_values<'a>(bits: &'a [u16], wide: &'a [f32], f: Format) -> Values<'a> {
    match f {
        Format::F32 => Values::F32(wide),
        Format::Bf16 => Values::Half(Half::Bf16(bits)),
        Format::F16 => Values::Half(Half::F16(bits)),
    }
}

/// The same values in `buf`, the host driver's memory.
fn device_values(buf: &Buf, f: Format) -> Values<'_> {
    Values::Device(match f {
        Format::F32 => Device::f32(View::<HostDriver, f32>::new(buf)),
        Format::Bf16 => Device::bf16(View::<HostDriver, u16>::new(buf)),
        Format::F16 => Device::f16(View::<HostDriver, u16>::new(buf)),
    })
}

/// `d`'s rows rounded: the target's to `tf`, the draft's (if any) to `df`.
struct Rounded {
    /// `d` with the widened rows: the reference's batch.
    wide: TreeData,
    target: Vec<u16>,
    draft: Vec<u16>,
    formats: (Format, Format),
}

impl Rounded {
    fn of(d: &TreeData, tf: Format, df: Format) -> Self {
        let (target, tw) = round(&d.target, tf);
        let (draft, dw) = match &d.draft {
            Some(q) => {
                let (b, w) = round(q, df);
                (b, Some(w))
            }
            None => (Vec::new(), None),
        };
        let wide = TreeData {
            target: tw,
            draft: dw,
            ..d.clone()
        };
        Self {
            wide,
            target,
            draft,
            formats: (tf, df),
        }
    }

    /// The batch with the rows in their formats, on the host.
    fn host(&self) -> TreeBatch<'_> {
        let (tf, df) = self.formats;
        let w = &self.wide;
        let draft = w.draft.as_deref().map(|q| host_values(&self.draft, q, df));
        with_values(w.view(), host_values(&self.target, &w.target, tf), draft)
    }

    /// The rows in `drv`'s memory (target, draft).
    fn buffers(&self, drv: &HostDriver) -> (Buf, Option<Buf>) {
        let (tf, df) = self.formats;
        let w = &self.wide;
        let buf = |bits: &[u16], wide: &[f32], f: Format| match f {
            Format::F32 => drv.buffer_from(wide),
            _ => drv.buffer_from(bits),
        };
        let target = buf(&self.target, &w.target, tf);
        let draft = w.draft.as_deref().map(|q| buf(&self.draft, q, df));
        (target, draft)
    }

    /// The reference over the widened rows: outputs and counts.
    fn reference(&self, method: Method) -> (TreeOut, Counters<K>) {
        let w = &self.wide;
        let mut out = TreeOut::new(w.requests(), w.max_depth);
        let mut counted = Counters::ZERO;
        verify_tree_batch(
            method,
            Check::Cheap,
            &w.view(),
            &mut out.view(),
            &mut counted,
        )
        .unwrap();
        (out, counted)
    }
}

/// Which of the three paths a case runs.
#[derive(Clone, Copy)]
struct Paths {
    gpu_host: bool,
    gpu_device: bool,
    cpu: bool,
    /// The reference on the half rows themselves (read in place by its walk).
    reference: bool,
}

const ALL_PATHS: Paths = Paths {
    gpu_host: true,
    gpu_device: true,
    cpu: true,
    reference: true,
};

/// `d`'s rows rounded to `(tf, df)` verified on each path of `paths`, each on a fresh verifier:
/// the reference's outputs over the widened rows, and its counts. Returns the accepted paths.
fn same_as_widened(
    drv: &HostDriver,
    cpu: &CpuVerifier<K>,
    d: &TreeData,
    (tf, df): (Format, Format),
    paths: Paths,
    what: &str,
) -> usize {
    let r = Rounded::of(d, tf, df);
    let host = r.host();
    let (target, draft) = r.buffers(drv);
    let device = with_values(
        r.wide.view(),
        device_values(&target, tf),
        draft.as_ref().map(|q| device_values(q, df)),
    );
    let mut accepted = 0;
    for m in METHODS {
        let (want, counted) = r.reference(m);
        accepted += want.accepted.iter().filter(|&&a| a > 0).count();
        let what = format!("{what} {m:?} target {tf:?} draft {df:?}");
        let mut batches = Vec::new();
        if paths.gpu_host {
            batches.push(("host rows", &host));
        }
        if paths.gpu_device {
            batches.push(("device rows", &device));
        }
        // Half rows launch the half entry, binary32 rows (a draft format without draft rows
        // included) the binary32 one.
        let half = tf != Format::F32 || (df != Format::F32 && draft.is_some());
        let (entry, other) = if half {
            (TREE_HALF_ENTRY, TREE_ENTRY)
        } else {
            (TREE_ENTRY, TREE_HALF_ENTRY)
        };
        for (rows, b) in batches {
            let mut v = GpuVerifier::<HostDriver, K>::new(drv.clone()).unwrap();
            let launches = drv.launches();
            let (ran, not) = (drv.launches_of(entry), drv.launches_of(other));
            let mut got = TreeOut::new(d.requests(), d.max_depth);
            v.verify_tree(m, Check::Cheap, b, &mut got.view())
                .unwrap_or_else(|e| panic!("{what}: GPU {rows}: {e}"));
            assert_eq!(drv.launches(), launches + 1, "{what}: GPU {rows}");
            assert_eq!(
                drv.launches_of(entry),
                ran + 1,
                "{what}: GPU {rows}: {entry}"
            );
            assert_eq!(drv.launches_of(other), not, "{what}: GPU {rows}: {other}");
            assert_eq!(got, want, "{what}: GPU {rows}: outputs");
            assert_eq!(v.totals().unwrap(), counted, "{what}: GPU {rows}: counters");
        }
        if paths.cpu {
            let before = cpu.totals();
            let mut got = TreeOut::new(d.requests(), d.max_depth);
            cpu.verify_tree(m, Check::Cheap, &host, &mut got.view())
                .unwrap_or_else(|e| panic!("{what}: CPU: {e}"));
            assert_eq!(got, want, "{what}: CPU: outputs");
            let mut expected = before;
            expected.add(&counted);
            assert_eq!(cpu.totals(), expected, "{what}: CPU: counters");
        }
        if paths.reference {
            // Cheap, as the other paths: rounded rows need not sum to 1 within the strict
            // tolerance (the strict checks of half rows: `tree_half_rows_strict_check_on_the_cpu`).
            let mut reference = Reference::<K>::new();
            let mut got = TreeOut::new(d.requests(), d.max_depth);
            reference
                .verify_tree(m, Check::Cheap, &host, &mut got.view())
                .unwrap_or_else(|e| panic!("{what}: reference: {e}"));
            assert_eq!(got, want, "{what}: reference: outputs");
            assert_eq!(
                reference.totals().unwrap(),
                counted,
                "{what}: reference: counters"
            );
        }
    }
    accepted
}

/// Every pairing of a target format with a draft format in which some row is half.
const FORMATS: [(Format, Format); 5] = [
    (Format::Bf16, Format::F32),
    (Format::F16, Format::F32),
    (Format::F32, Format::Bf16),
    (Format::Bf16, Format::F16),
    (Format::F16, Format::Bf16),
];

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

/// Random trees (probabilities, logits at T = 0 and T > 0; with and without draft rows), every
/// method, every half pairing, both macro forms of the kernel text, host and device rows, and
/// the CPU backend (on the calling thread and over a pool): the widened rows' bits and counts,
/// half rows through the half tree entry, binary32 rows through the binary32 one.
#[test]
fn tree_half_rows_match_the_widened_tree() {
    let mut accepted = 0;
    for (i, mode) in [Mode::Cuda, Mode::Hip].into_iter().enumerate() {
        let drv = HostDriver::new(mode, 64, 1);
        let cpu = CpuVerifier::<K>::new(1 + i).unwrap();
        let mut g = Gen(0x31_4a1f + i as u64);
        for n in 0..8 {
            let d = random_tree_batch(&mut g, spec(n % 2 == 1, n % 4 >= 2));
            // Binary32 rows too (and a half draft format without draft rows): the control,
            // through the binary32 entry.
            for formats in [(Format::F32, Format::F32)].into_iter().chain(FORMATS) {
                let what = format!("{mode:?} batch {n}");
                accepted += same_as_widened(&drv, &cpu, &d, formats, ALL_PATHS, &what);
            }
        }
    }
    assert!(accepted > 20, "{accepted} accepted paths: a weak test");
}

/// A 64-node tree at V = 32000 (EAGLE-2's budget at a Llama vocabulary): probabilities with
/// and without draft rows, and logits at T = 0 and T = 0.8 with draft rows; bf16 and f16.
#[test]
fn tree_half_rows_at_v_32000() {
    let drv = HostDriver::new(Mode::Cuda, 64, 1);
    let cpu = CpuVerifier::<K>::new(2).unwrap();
    let mut g = Gen(0x31_3200);
    let mut accepted = 0;
    for draft in [false, true] {
        let d = full_tree(&mut g, 64, 7, 32_000, draft);
        let (tf, df) = if draft {
            (Format::F16, Format::Bf16)
        } else {
            (Format::Bf16, Format::F32)
        };
        let what = format!("V=32000 draft={draft}");
        accepted += same_as_widened(&drv, &cpu, &d, (tf, df), ALL_PATHS, &what);
    }
    // Logits: the same tree twice, request 0 at T = 0, request 1 at T = 0.8.
    let one = full_tree(&mut g, 64, 7, 32_000, true);
    let two = |x: &[f32]| [x, x].concat();
    let d = TreeData {
        nodes: [&one.nodes[..], &one.nodes[..]].concat(),
        tokens: [&one.tokens[..], &one.tokens[..]].concat(),
        first_child: two_i32(&one.first_child),
        next_sibling: two_i32(&one.next_sibling),
        draft: one.draft.as_deref().map(two),
        target: two(&one.target).iter().map(|&p| (p + 1e-6).ln()).collect(),
        temperature: Some(vec![0.0, 0.8]),
        seed: vec![one.seed[0], one.seed[0] ^ 0x5EED],
        offset: vec![one.offset[0]; 2],
        eps: two(&one.eps),
        delta: two(&one.delta),
        ..one
    };
    let paths = Paths {
        gpu_device: false,
        ..ALL_PATHS
    };
    accepted += same_as_widened(
        &drv,
        &cpu,
        &d,
        (Format::Bf16, Format::F16),
        paths,
        "V=32000 logits",
    );
    assert!(accepted > 0, "no accepted path at V = 32000: a weak test");
}

fn two_i32(x: &[i32]) -> Vec<i32> {
    [x, x].concat()
}

/// The staging's views of half host rows launch as the host-slice path does: the step path
/// (`Staging::<_, TreeStep>::write`, `launch_staged`) gives the widened rows' bits.
#[test]
fn tree_half_rows_on_the_step_path() {
    let drv = HostDriver::new(Mode::Hip, 64, 1);
    let mut g = Gen(0x31_57e9);
    let d = random_tree_batch(&mut g, spec(true, true));
    for formats in [(Format::Bf16, Format::F16), (Format::F16, Format::F32)] {
        let r = Rounded::of(&d, formats.0, formats.1);
        let host = r.host();
        for m in METHODS {
            let (want, counted) = r.reference(m);
            let mut v = GpuVerifier::<HostDriver, K>::new(drv.clone()).unwrap();
            let mut staging = Staging::<HostDriver, TreeStep>::default();
            let mut got = TreeOut::new(d.requests(), d.max_depth);
            v.stage(&mut staging, m, Check::Cheap, &host, &got.view())
                .unwrap();
            let args = staging.write::<K>(&drv, v.stream(), m, &host, ()).unwrap();
            // SAFETY: the views `write` returned for this batch, launched as they are.
            unsafe { v.launch_staged(&args) }.unwrap();
            let flags = v.download_outputs(&args, &mut got.view()).unwrap();
            assert_eq!(flags, 0, "{m:?} {formats:?}: error flags");
            assert_eq!(got, want, "{m:?} {formats:?}: outputs");
            assert_eq!(v.totals().unwrap(), counted, "{m:?} {formats:?}: counters");
        }
    }
}

/// Every verifier takes half tree rows (`Support::tree_half`): the reference reads them in
/// place, as a chain's, and gives the bits of the widened tree (`same_as_widened`'s reference
/// path); a verifier without the flag refuses them with the chain's typed errors.
#[test]
fn tree_half_rows_taken_by_every_verifier() {
    let mut g = Gen(0x31_0ef0);
    let probs = random_tree_batch(&mut g, spec(true, false));
    let logits = random_tree_batch(&mut g, spec(true, true));
    let cases = [
        (&probs, (Format::Bf16, Format::F32), Feature::HalfProbs),
        (&probs, (Format::F32, Format::F16), Feature::Half),
        (&logits, (Format::F16, Format::F32), Feature::Half),
        (&logits, (Format::F32, Format::Bf16), Feature::Half),
    ];
    let drv = HostDriver::new(Mode::Cuda, 64, 1);
    let cpu = CpuVerifier::<K>::new(2).unwrap();
    assert!(Reference::<K>::new().support().tree_half);
    assert!(Verifier::<K>::support(&cpu).tree_half);
    let mut no_half = Support::ALL;
    no_half.tree_half = false;
    for (d, formats, feature) in cases {
        let r = Rounded::of(d, formats.0, formats.1);
        let b = r.host();
        let mut out = TreeOut::new(d.requests(), d.max_depth);
        for check in [Check::Cheap, Check::STRICT] {
            assert_eq!(
                validate_tree_with::<K>(no_half, Method::Rejection, check, &b, &out.view()),
                Err(VerifyError::Unsupported { feature }),
                "{formats:?}"
            );
        }
        let paths = Paths {
            gpu_device: false,
            ..ALL_PATHS
        };
        same_as_widened(&drv, &cpu, d, formats, paths, "every verifier");
    }
}

/// Strict validation on the CPU reads the half rows themselves (the walk widens only the rows
/// it reads): the reference's verdict over the widened rows (and the reference's over the half
/// rows), on valid rows (the same outputs and counts) and on rows with NaN, negative, oversized
/// or infinite values (the same error, the first bad value's, and nothing written or counted),
/// target and draft rows, every half pairing, one thread and a pool.
#[test]
fn tree_half_rows_strict_check_on_the_cpu() {
    let mut g = Gen(0x31_5791);
    let (mut ok, mut refused) = (0usize, 0usize);
    for n in 0..24 {
        let d = random_tree_batch(
            &mut g,
            TreeSpec {
                garbage: n % 3 != 0,
                ..spec(n % 2 == 1, n % 4 >= 2)
            },
        );
        let cpu = CpuVerifier::<K>::new(1 + n % 2).unwrap();
        for formats in FORMATS {
            let r = Rounded::of(&d, formats.0, formats.1);
            // Loose enough that some rounded rows pass.
            let check = Check::Strict {
                sum_tolerance: 0.05,
            };
            for m in METHODS {
                let what = format!("batch {n} {m:?} {formats:?}");
                let mut want = TreeOut::new(d.requests(), d.max_depth);
                let mut counted = Counters::<K>::ZERO;
                let want_r =
                    verify_tree_batch(m, check, &r.wide.view(), &mut want.view(), &mut counted);
                let before = cpu.totals();
                let mut got = TreeOut::new(d.requests(), d.max_depth);
                let got_r = cpu.verify_tree(m, check, &r.host(), &mut got.view());
                assert_eq!(got_r, want_r, "{what}");
                assert_eq!(got, want, "{what}: outputs");
                let mut expected = before;
                expected.add(&counted);
                assert_eq!(cpu.totals(), expected, "{what}: counters");
                // The reference on the half rows themselves: the same verdict.
                let mut half = TreeOut::new(d.requests(), d.max_depth);
                let mut half_counted = Counters::<K>::ZERO;
                let half_r =
                    verify_tree_batch(m, check, &r.host(), &mut half.view(), &mut half_counted);
                assert_eq!(half_r, want_r, "{what}: reference on half rows");
                assert_eq!(half, want, "{what}: reference on half rows: outputs");
                assert_eq!(
                    half_counted, counted,
                    "{what}: reference on half rows: counters"
                );
                match got_r {
                    Ok(()) => ok += 1,
                    Err(_) => refused += 1,
                }
            }
        }
    }
    assert!(
        ok > 20 && refused > 20,
        "{ok} passed, {refused} refused: a weak test"
    );
}

/// The tree entries' half flags, read from the shape words at run time: two formats for one
/// tensor, a draft format without draft rows, or an unknown flag is `ERR_SHAPE` (the half
/// entry), and so is any half flag on binary32 rows (the binary32 entry), with nothing written
/// or counted (on the raw launch, where the shape words are the caller's).
#[test]
fn tree_entry_refuses_bad_half_flags() {
    let drv = HostDriver::new(Mode::Cuda, 64, 1);
    let mut g = Gen(0x31_f1a6);
    let d = random_tree_batch(&mut g, spec(true, false));
    let m = Method::Rejection;
    type Bad = fn(u32) -> u32;
    let half_bad: [Bad; 4] = [
        |f| f | FLAG_TARGET_F16,
        |f| f | FLAG_DRAFT_BF16,
        |f| f & !FLAG_DRAFT_PROBS,
        |f| f | 32,
    ];
    let f32_bad: [Bad; 3] = [
        |f| f | FLAG_TARGET_BF16,
        |f| f | FLAG_TARGET_F16,
        |f| f | FLAG_DRAFT_F16,
    ];
    let cases: [(Format, Format, u32, &str, &[Bad]); 2] = [
        (
            Format::Bf16,
            Format::F16,
            FLAG_DRAFT_PROBS | FLAG_TARGET_BF16 | FLAG_DRAFT_F16,
            TREE_HALF_ENTRY,
            &half_bad,
        ),
        (
            Format::F32,
            Format::F32,
            FLAG_DRAFT_PROBS,
            TREE_ENTRY,
            &f32_bad,
        ),
    ];
    for (tf, df, staged, entry, bads) in cases {
        let r = Rounded::of(&d, tf, df);
        let host = r.host();
        let words = tree_shape::<K>(m, &host).unwrap();
        let flags = words[kernels::SHAPE_FLAGS];
        assert_eq!(flags, staged, "the staged flags");
        for bad in bads.iter().map(|b| b(flags)) {
            let mut shape = words;
            shape[kernels::SHAPE_FLAGS] = bad;
            let shape = drv.buffer_from(&shape);
            let mut v = GpuVerifier::<HostDriver, K>::new(drv.clone()).unwrap();
            let mut staging = Staging::<HostDriver, TreeStep>::default();
            let mut got = TreeOut::new(d.requests(), d.max_depth);
            v.stage(&mut staging, m, Check::Cheap, &host, &got.view())
                .unwrap();
            let mut args = staging
                .write::<K>(&drv, v.stream(), m, &host, ())
                .unwrap()
                .into_args();
            args.step.shape = View::new(&shape);
            let ran = drv.launches_of(entry);
            // SAFETY: the staged views of this batch; only the flags differ from its shape words.
            unsafe { v.launch(&args) }.unwrap();
            let err = v.download_outputs(&args, &mut got.view()).unwrap();
            assert_eq!(drv.launches_of(entry), ran + 1, "flags {bad:#x}: {entry}");
            assert_eq!(err & ERR_SHAPE, ERR_SHAPE, "flags {bad:#x}");
            // The staging's output buffers as allocated (zeros): a run writes sentinels past
            // each accepted path.
            let mut outputs = got.accepted.iter().chain(&got.path).chain(&got.tokens);
            assert!(outputs.all(|&x| x == 0), "flags {bad:#x}: written");
            assert_eq!(
                v.totals().unwrap(),
                Counters::ZERO,
                "flags {bad:#x}: counted"
            );
        }
    }
}
