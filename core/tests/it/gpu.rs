//! The GPU orchestration (`specula_core::gpu`) over the fake driver (`fake_driver.rs`):
//! streams are queues the test drains step by step, so every pending/ready state, ordering and
//! fault is under the test's control. (The host driver of `specula-tests` runs the same code
//! with real threads and the kernel text; this one is what the mutation tests judge.)

use specula_core::gpu::kernels;
use specula_core::gpu::{
    Driver, ENTRY_NAMES, Element, Entry, Family, GpuError, GpuReadback, GpuVerifier, Inputs,
    MAX_SLICES, OutOfBounds, RowsView, SUPPORT, Staging, VerifyArgs, View, ViewMut,
};
use specula_core::verify::{
    AcceptedOut, Batch, Check, DEFAULT_DELTA, DEFAULT_EPS, Device, DeviceOut, DeviceOutputs, Dims,
    Draft, Drafts, Filter, Method, NO_DRAFT_ROWS, Outputs, Param, Produce, Rows, Streams, Target,
    TokensOut, Verifier, VerifyError,
};
use specula_core::{Counters, ErrorKind, HasKind, Misuse, Readback};
use std::rc::Rc;
use std::task::Poll;

use crate::fake_driver::*;

/// An owned batch of `b` requests, `k_max` 2, vocabulary 3, one-hot target rows.
struct Owned {
    k: Vec<u32>,
    ids: Vec<u32>,
    target: Vec<f32>,
    seed: Vec<u64>,
    offset: Vec<u64>,
    draft: Option<Vec<f32>>,
}

impl Owned {
    fn new(b: usize) -> Self {
        let mut target = vec![0.0; b * 3 * 3];
        for r in 0..b * 3 {
            target[r * 3] = 1.0;
        }
        Self {
            k: (0..b).map(|i| 1 + (i % 2) as u32).collect(),
            ids: vec![0; b * 2],
            target,
            seed: (0..b as u64).collect(),
            offset: vec![7; b],
            draft: None,
        }
    }
    fn view(&self) -> Batch<'_> {
        let mut batch = Batch::dense(
            Dims { vocab: 3, k_max: 2 },
            Drafts {
                k: &self.k,
                ids: &self.ids,
            },
            &self.target,
            Streams {
                seed: &self.seed,
                offset: &self.offset,
            },
        );
        batch.draft = self.draft.as_deref().map(|d| Rows::f32(d, 3).into());
        batch
    }
}

fn outputs(b: usize) -> (Vec<u32>, Vec<u32>) {
    (vec![0; b], vec![0; b * 3])
}

#[test]
fn verify_stages_launches_and_downloads_with_one_sync() {
    let drv = Fake::new(1);
    let mut v = GpuVerifier::<Fake, K>::new(drv.clone()).unwrap();
    let d = Owned::new(5);
    let (mut acc, mut tok) = outputs(5);
    v.verify(
        Method::Greedy,
        Check::Cheap,
        &d.view(),
        &mut Outputs::new(
            specula_core::verify::AcceptedOut(&mut acc),
            specula_core::verify::TokensOut(&mut tok),
        ),
    )
    .unwrap();
    assert_eq!(
        acc,
        vec![101, 102, 101, 102, 101],
        "the fake kernel's outputs came back"
    );
    assert_eq!(v.sync_calls(), 1);
    assert_eq!(drv.st.syncs.get(), 1);
    let l = drv.launches();
    assert_eq!(l.len(), 1);
    assert_eq!((l[0].entry, l[0].grid, l[0].block), (Entry::Single, 5, 96));
    assert_eq!(l[0].stats, v.stats().id);
    assert!(l[0].scratch.is_none() && !l[0].draft_probs);
    assert_eq!(v.totals().unwrap().drafts, 5);
    assert_eq!(v.sync_calls(), 2);
    assert_eq!(v.support(), SUPPORT);
    assert_eq!(
        (l[0].family, l[0].name),
        (Family::Plain, kernels::VERIFY_ENTRY)
    );
    let a = l[0].args;
    assert_eq!(
        [
            a.scratch,
            a.cu_num_draft_tokens,
            a.bonus,
            a.target_logits,
            a.temperature,
            a.sampling,
            a.recovered,
            a.draft_first_row,
            a.first_child,
            a.next_sibling,
            a.path,
        ],
        [0; 11],
        "the plain entry: every later field null"
    );
    assert_eq!((a.slices, a.reserved), (1, 0));
    // A second, smaller batch reuses the staging buffers (same ids), and the page-locked
    // buffer of the copy down (no buffer allocated at all).
    let allocated = drv.st.next_id.get();
    let d2 = Owned::new(3);
    let (mut acc2, mut tok2) = outputs(3);
    v.verify(
        Method::Rejection,
        Check::Cheap,
        &d2.view(),
        &mut Outputs::new(
            specula_core::verify::AcceptedOut(&mut acc2),
            specula_core::verify::TokensOut(&mut tok2),
        ),
    )
    .unwrap();
    let l = drv.launches();
    assert_eq!(
        (l[1].shape, l[1].k, l[1].accepted),
        (l[0].shape, l[0].k, l[0].accepted)
    );
    assert_eq!(l[1].grid, 3);
    assert_eq!(acc2, vec![101, 102, 101]);
    assert_eq!(tok2, (200..209).collect::<Vec<u32>>());
    assert_eq!(v.totals().unwrap().drafts, 8);
    assert_eq!(drv.st.next_id.get(), allocated);
    // A larger batch than any before: the host buffer grows.
    let d3 = Owned::new(9);
    let (mut acc3, mut tok3) = outputs(9);
    v.verify(
        Method::Greedy,
        Check::Cheap,
        &d3.view(),
        &mut Outputs::new(
            specula_core::verify::AcceptedOut(&mut acc3),
            specula_core::verify::TokensOut(&mut tok3),
        ),
    )
    .unwrap();
    assert_eq!(acc3[8], 101);
    assert_eq!(tok3, (200..227).collect::<Vec<u32>>());
    assert_eq!(v.driver().multiprocessors(), 1);
    // On the caller's stream: the launch is queued there.
    let theirs = drv.stream().unwrap();
    let w = GpuVerifier::<Fake, K>::with_stream(drv.clone(), theirs.clone()).unwrap();
    assert!(Rc::ptr_eq(w.stream(), &theirs));
}

#[test]
fn totals_read_every_counter_word_on_a_fresh_verifier() {
    let drv = Fake::new(1);
    let mut v = GpuVerifier::<Fake, K>::new(drv.clone()).unwrap();
    let mut want = Counters::<K>::ZERO;
    for i in 0..4 + 2 * K {
        (1000 + i as u64).write_ne(&mut v.stats().data.lock().unwrap()[i * 8..]);
    }
    want.drafts = 1000;
    want.draft_tokens = 1001;
    want.accepted_tokens = 1002;
    want.emitted_tokens = 1003;
    for j in 0..K {
        want.accepted_per_position[j] = 1004 + j as u64;
        want.drafted_per_position[j] = 1004 + (K + j) as u64;
    }
    assert_eq!(v.totals().unwrap(), want);
    assert_eq!(v.sync_calls(), 1);
}

#[test]
fn a_refused_batch_enqueues_nothing() {
    let drv = Fake::new(1);
    let mut v = GpuVerifier::<Fake, K>::new(drv.clone()).unwrap();
    let mut d = Owned::new(2);
    d.ids[0] = 9; // ≥ V
    let (mut acc, mut tok) = outputs(2);
    let e = v
        .verify(
            Method::Greedy,
            Check::Cheap,
            &d.view(),
            &mut Outputs::new(
                specula_core::verify::AcceptedOut(&mut acc),
                specula_core::verify::TokensOut(&mut tok),
            ),
        )
        .unwrap_err();
    assert!(
        matches!(e, GpuError::Verify(VerifyError::TokenOutOfRange { .. })),
        "{e:?}"
    );
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
    assert!(drv.launches().is_empty() && drv.pending_ops() == 0);
}

#[test]
fn device_flags_are_reported_once() {
    let drv = Fake::new(1);
    let mut v = GpuVerifier::<Fake, K>::new(drv.clone()).unwrap();
    // The fake kernel does not set flags; poke the error word as a kernel would.
    let w = kernels::error_word(K) * 8;
    kernels::ERR_TOKEN.write_ne(&mut v.stats().data.lock().unwrap()[w..]);
    let d = Owned::new(1);
    let run = |v: &mut GpuVerifier<Fake, K>| {
        let (mut acc, mut tok) = outputs(1);
        v.verify(
            Method::Greedy,
            Check::Cheap,
            &d.view(),
            &mut Outputs::new(
                specula_core::verify::AcceptedOut(&mut acc),
                specula_core::verify::TokensOut(&mut tok),
            ),
        )
    };
    let e = run(&mut v).unwrap_err();
    assert_eq!(e, GpuError::DeviceFlags(kernels::ERR_TOKEN));
    assert_eq!(e.kind(), ErrorKind::Device);
    assert_eq!(run(&mut v), Ok(()), "the same flags are not reported again");
}

#[test]
fn split_entry_below_one_request_per_multiprocessor() {
    let drv = Fake::new(16);
    let mut v = GpuVerifier::<Fake, K>::new(drv.clone()).unwrap();
    assert_eq!(v.slices_for(4), 1, "nothing reserved");
    v.reserve_split(0).unwrap();
    v.reserve_split(16).unwrap();
    assert_eq!(
        v.slices_for(4),
        1,
        "capacity 16 needs no split: nothing reserved"
    );
    v.reserve_split(4).unwrap();
    assert_eq!(v.slices_for(4), 8);
    assert_eq!(v.slices_for(3), 11);
    assert_eq!(v.slices_for(1), 32);
    assert_eq!(v.slices_for(5), 1, "reserved for 4 only");
    assert_eq!(v.slices_for(16), 1);
    let d = Owned::new(2);
    let (mut acc, mut tok) = outputs(2);
    v.verify(
        Method::Greedy,
        Check::Cheap,
        &d.view(),
        &mut Outputs::new(
            specula_core::verify::AcceptedOut(&mut acc),
            specula_core::verify::TokensOut(&mut tok),
        ),
    )
    .unwrap();
    let l = drv.launches();
    let slices = 16;
    assert_eq!(l[0].entry, Entry::Split { slices });
    assert_eq!(l[0].grid, 2 * slices);
    // Reserved for capacity 4, the scratch holds what every capacity up to 4 launches with
    // (2 requests split 16 ways need more than 4 split 8 ways... or less: the most of all).
    let need = |c: usize, s: usize| kernels::split_scratch_words(K, s) * c * 8;
    let most = [need(1, 32), need(2, 16), need(3, 11), need(4, 8)]
        .into_iter()
        .max()
        .unwrap();
    assert_eq!(l[0].scratch.map(|s| s.1), Some(most));
    assert!(
        need(3, 11) > need(4, 8),
        "sizing for the reserved capacity alone would overflow"
    );
    assert_eq!(acc, vec![101, 102]);
    // A staged batch larger than the reserved split capacity (still below 16): one block per
    // request, no scratch.
    let mut staging = Staging::<Fake>::new();
    let d8 = Owned::new(8);
    staging.reserve(&drv, &d8.view(), Produce::TOKENS).unwrap();
    let a = staging
        .write::<K>(
            &drv,
            v.stream(),
            Method::Greedy,
            &d8.view(),
            Produce::TOKENS,
        )
        .unwrap();
    // SAFETY: staged views; nothing else writes the staging buffers.
    unsafe { v.launch_staged(&a) }.unwrap();
    drv.run();
    let l = drv.launches();
    assert_eq!(
        (l[1].entry, l[1].grid, l[1].scratch),
        (Entry::Single, 8, None)
    );
    // A large device: the slice count is capped.
    let mut big = GpuVerifier::<Fake, K>::new(Fake::new(1000)).unwrap();
    big.reserve_split(1).unwrap();
    assert_eq!(big.slices_for(1), MAX_SLICES);
    assert_eq!(big.slices_for(0), 1);
}

#[test]
fn staging_writes_defaults_and_draft_probs_and_refuses_unreserved_batches() {
    let drv = Fake::new(1);
    let mut v = GpuVerifier::<Fake, K>::new(drv.clone()).unwrap();
    let mut staging = Staging::<Fake>::new();
    let b = 70; // more than one 64-value chunk of default ε/δ
    let mut d = Owned::new(b);
    d.draft = Some(vec![0.25; b * 2 * 3]);
    let (mut acc, mut tok) = outputs(b);
    assert_eq!(
        staging
            .write::<K>(
                &drv,
                v.stream(),
                Method::Typical,
                &d.view(),
                Produce::TOKENS
            )
            .unwrap_err(),
        GpuError::ViewTooShort,
        "not reserved"
    );
    let o = Outputs::new(
        specula_core::verify::AcceptedOut(&mut acc),
        specula_core::verify::TokensOut(&mut tok),
    );
    v.stage(&mut staging, Method::Typical, Check::Cheap, &d.view(), &o)
        .unwrap();
    let args = staging
        .write::<K>(
            &drv,
            v.stream(),
            Method::Typical,
            &d.view(),
            Produce::TOKENS,
        )
        .unwrap();
    drv.run();
    assert_eq!(args.step.capacity, b as u32);
    assert_eq!(args.k.len(), b);
    assert_eq!(args.step.tokens.len(), b * 3);
    assert_eq!(args.step.accepted.len(), b);
    assert_eq!(args.step.draft_probs.map(|p| p.len()), Some(b * 6));
    let read_f32 = |view: View<'_, Fake, f32>, i: usize| {
        f32::read_ne(&view.buffer().data.lock().unwrap()[view.byte_offset() + 4 * i..])
    };
    for i in [0, 63, 64, 69] {
        assert_eq!(read_f32(args.step.eps, i), DEFAULT_EPS);
        assert_eq!(read_f32(args.step.delta, i), DEFAULT_DELTA);
    }
    let shape: Vec<u32> = (0..kernels::SHAPE_WORDS)
        .map(|i| u32::read_ne(&args.step.shape.buffer().data.lock().unwrap()[4 * i..]))
        .collect();
    assert_eq!(
        shape,
        kernels::batch_shape::<K>(Method::Typical, &d.view()).unwrap()
    );
    // Given ε/δ are copied as they are.
    let eps = vec![0.5f32; b];
    let mut batch = d.view();
    batch.eps = Some(&eps);
    batch.delta = Some(&eps);
    let args = staging
        .write::<K>(&drv, v.stream(), Method::Typical, &batch, Produce::TOKENS)
        .unwrap();
    drv.run();
    assert_eq!(read_f32(args.step.eps, 69), 0.5);
    assert_eq!(read_f32(args.step.delta, 0), 0.5);
    // A batch whose slices are shorter than its shape: refused, nothing enqueued (a launch
    // would read past the views).
    let mut short = Owned::new(b);
    short.target.pop();
    assert!(matches!(
        staging.write::<K>(
            &drv,
            v.stream(),
            Method::Typical,
            &short.view(),
            Produce::TOKENS
        ),
        Err(GpuError::Verify(_))
    ));
    assert_eq!(drv.pending_ops(), 0);
    // A larger batch than reserved: refused before anything is enqueued.
    let d2 = Owned::new(b + 1);
    assert_eq!(drv.pending_ops(), 0);
    assert_eq!(
        staging
            .write::<K>(
                &drv,
                v.stream(),
                Method::Typical,
                &d2.view(),
                Produce::TOKENS
            )
            .unwrap_err(),
        GpuError::ViewTooShort
    );
    assert_eq!(drv.pending_ops(), 0, "no partial write");
    // Staging grows for it, with new buffers.
    let old = args.k.buffer().id;
    staging.reserve(&drv, &d2.view(), Produce::TOKENS).unwrap();
    let args = staging
        .write::<K>(
            &drv,
            v.stream(),
            Method::Typical,
            &d2.view(),
            Produce::TOKENS,
        )
        .unwrap();
    assert_ne!(args.k.buffer().id, old);
    assert_eq!(args.step.capacity, b as u32 + 1);
}

#[test]
fn launch_checks_every_per_request_view_against_the_capacity() {
    let drv = Fake::new(1);
    let mut v = GpuVerifier::<Fake, K>::new(drv.clone()).unwrap();
    let mut staging = Staging::<Fake>::new();
    let d = Owned::new(4);
    let (mut acc, mut tok) = outputs(4);
    let o = Outputs::new(
        specula_core::verify::AcceptedOut(&mut acc),
        specula_core::verify::TokensOut(&mut tok),
    );
    v.stage(&mut staging, Method::Greedy, Check::Cheap, &d.view(), &o)
        .unwrap();
    for field in 0..8 {
        let mut a = staging
            .write::<K>(&drv, v.stream(), Method::Greedy, &d.view(), Produce::TOKENS)
            .unwrap()
            .into_args();
        match field {
            0 => a.step.shape = View::range(a.step.shape.buffer(), 0, 7).unwrap(),
            1 => a.k = short(a.k),
            2 => a.step.seed = short(a.step.seed),
            3 => a.step.offset = short(a.step.offset),
            4 => a.step.eps = short(a.step.eps),
            5 => a.step.delta = short(a.step.delta),
            6 => a.step.capacity = 5,  // accepted holds 4
            _ => a.step.capacity = 13, // tokens hold 12
        }
        // SAFETY: refused before anything is enqueued.
        let e = unsafe { v.launch(&a) }.unwrap_err();
        assert_eq!(e, GpuError::ViewTooShort, "field {field}");
        // SAFETY: as above.
        let e = unsafe { v.capture(&a) }.unwrap_err();
        assert_eq!(e, GpuError::ViewTooShort, "field {field}");
    }
    drv.run();
    assert!(drv.launches().is_empty());
    let a = staging
        .write::<K>(&drv, v.stream(), Method::Greedy, &d.view(), Produce::TOKENS)
        .unwrap();
    // SAFETY: staged views; nothing else writes the staging buffers.
    unsafe { v.launch_staged(&a) }.unwrap();
    drv.run();
    assert_eq!(drv.launches().len(), 1);
    // Download into host slices longer than the views is refused.
    let (mut acc, mut tok) = (vec![0; 5], vec![0; 12]);
    assert_eq!(
        v.download_outputs(
            &a,
            &mut Outputs::new(AcceptedOut(&mut acc), TokensOut(&mut tok))
        ),
        Err(GpuError::ViewTooShort)
    );
    let (mut acc, mut tok) = (vec![0; 4], vec![0; 13]);
    assert_eq!(
        v.download_outputs(
            &a,
            &mut Outputs::new(AcceptedOut(&mut acc), TokensOut(&mut tok))
        ),
        Err(GpuError::ViewTooShort)
    );
    let (mut acc, mut tok) = (vec![0; 4], vec![0; 12]);
    assert_eq!(
        v.download_outputs(
            &a,
            &mut Outputs::new(AcceptedOut(&mut acc), TokensOut(&mut tok))
        ),
        Ok(0)
    );
    assert_eq!(acc, vec![101, 102, 101, 102]);
}

#[test]
fn views_are_bounded_and_typed() {
    let drv = Fake::new(1);
    let mut buf = drv.alloc(40).unwrap();
    let v = View::<Fake, u32>::new(&buf);
    assert_eq!((v.len(), v.byte_offset(), v.is_empty()), (10, 0, false));
    let w = View::<Fake, u64>::range(&buf, 2, 3).unwrap();
    assert_eq!((w.len(), w.byte_offset()), (3, 16));
    assert_eq!(
        View::<Fake, u64>::range(&buf, 2, 4).unwrap_err(),
        OutOfBounds
    );
    assert_eq!(
        View::<Fake, u64>::range(&buf, usize::MAX, 1).unwrap_err(),
        OutOfBounds
    );
    assert_eq!(
        View::<Fake, u64>::range(&buf, 1, usize::MAX / 8).unwrap_err(),
        OutOfBounds
    );
    assert!(View::<Fake, f32>::range(&buf, 10, 0).unwrap().is_empty());
    let odd = drv.alloc(7).unwrap();
    assert_eq!(
        View::<Fake, u32>::new(&odd).len(),
        1,
        "a partial element is left out"
    );
    {
        let m = ViewMut::<Fake, u32>::range(&mut buf, 1, 2).unwrap();
        assert_eq!((m.len(), m.byte_offset(), m.is_empty()), (2, 4, false));
        assert_eq!(m.as_view().len(), 2);
        assert_eq!(m.buffer().id, buf_id(&m));
        assert!(format!("{m:?}").contains("len: 2"));
    }
    assert!(ViewMut::<Fake, u32>::range(&mut buf, 9, 2).is_err());
    assert!(
        ViewMut::<Fake, u32>::range(&mut buf, 10, 0)
            .unwrap()
            .is_empty()
    );
    let m = ViewMut::<Fake, u64>::new(&mut buf);
    assert_eq!(m.len(), 5);
    assert!(format!("{:?}", View::<Fake, u32>::new(&odd)).contains("len: 1"));
    // The element codecs.
    let mut b = [0u8; 8];
    0x0102_0304u32.write_ne(&mut b);
    assert_eq!(u32::read_ne(&b), 0x0102_0304);
    1.5f32.write_ne(&mut b);
    assert_eq!(f32::read_ne(&b), 1.5);
    u64::MAX.write_ne(&mut b);
    assert_eq!(u64::read_ne(&b), u64::MAX);
    assert_eq!((u32::BYTES, u64::BYTES, f32::BYTES), (4, 8, 4));
}

fn short<T: Element>(view: View<'_, Fake, T>) -> View<'_, Fake, T> {
    View::range(view.buffer(), 0, 3).unwrap()
}

fn buf_id(m: &ViewMut<'_, Fake, u32>) -> usize {
    m.buffer().id
}

#[test]
fn a_graph_runs_nothing_until_replayed_and_replays_new_values() {
    let drv = Fake::new(1);
    let mut v = GpuVerifier::<Fake, K>::new(drv.clone()).unwrap();
    let mut staging = Staging::<Fake>::new();
    let d = Owned::new(4);
    let (mut acc, mut tok) = outputs(4);
    let o = Outputs::new(
        specula_core::verify::AcceptedOut(&mut acc),
        specula_core::verify::TokensOut(&mut tok),
    );
    v.stage(&mut staging, Method::Greedy, Check::Cheap, &d.view(), &o)
        .unwrap();
    let a = staging
        .write::<K>(&drv, v.stream(), Method::Greedy, &d.view(), Produce::TOKENS)
        .unwrap();
    // SAFETY: staged views.
    let g = unsafe { v.capture(&a) }.unwrap();
    assert_eq!(g.capacity(), 4);
    drv.run();
    assert!(drv.launches().is_empty(), "capture runs nothing");
    v.replay(&g).unwrap();
    v.replay(&g).unwrap();
    drv.run();
    assert_eq!(drv.launches().len(), 2);
    // New values in the same buffers: 2 requests, k = 2, 1.
    let mut d2 = Owned::new(2);
    d2.k = vec![2, 1];
    staging
        .write::<K>(
            &drv,
            v.stream(),
            Method::Greedy,
            &d2.view(),
            Produce::TOKENS,
        )
        .unwrap();
    v.replay(&g).unwrap();
    let (mut acc, mut tok) = (vec![0; 2], vec![0; 6]);
    v.download_outputs(
        &a,
        &mut Outputs::new(AcceptedOut(&mut acc), TokensOut(&mut tok)),
    )
    .unwrap();
    assert_eq!(acc, vec![102, 101]);
    assert_eq!(v.totals().unwrap().drafts, 4 + 4 + 2);
    assert_eq!(v.sync_calls(), 2);
}

#[test]
fn a_failing_capture_still_ends_the_capture() {
    let drv = Fake::new(1);
    let mut v = GpuVerifier::<Fake, K>::new(drv.clone()).unwrap();
    let mut staging = Staging::<Fake>::new();
    let d = Owned::new(1);
    let (mut acc, mut tok) = outputs(1);
    let o = Outputs::new(
        specula_core::verify::AcceptedOut(&mut acc),
        specula_core::verify::TokensOut(&mut tok),
    );
    v.stage(&mut staging, Method::Greedy, Check::Cheap, &d.view(), &o)
        .unwrap();
    let a = staging
        .write::<K>(&drv, v.stream(), Method::Greedy, &d.view(), Produce::TOKENS)
        .unwrap();
    drv.st.fail_calls.set(true);
    // SAFETY: staged views.
    let e = unsafe { v.capture(&a) }.unwrap_err();
    assert_eq!(e, GpuError::Driver(FakeError(ErrorKind::Device)));
    assert!(v.stream().capture.borrow().is_none(), "capture ended");
    assert_eq!(
        // SAFETY: staged views; the failure injected is the driver's.
        unsafe { v.launch_staged(&a) },
        Err(GpuError::Driver(FakeError(ErrorKind::Device)))
    );
    assert!(GpuVerifier::<Fake, K>::new(drv.clone()).is_err());
    assert!(v.readback().is_err());
    drv.st.fail_calls.set(false);
}

/// A verifier, a readback of it, and a step that counts `n` drafts.
fn rig(n: usize) -> (Fake, GpuVerifier<Fake, K>, Staging<Fake>, Owned) {
    let drv = Fake::new(1);
    let mut v = GpuVerifier::<Fake, K>::new(drv.clone()).unwrap();
    let mut staging = Staging::<Fake>::new();
    let d = Owned::new(n);
    let (mut acc, mut tok) = outputs(n);
    let o = Outputs::new(
        specula_core::verify::AcceptedOut(&mut acc),
        specula_core::verify::TokensOut(&mut tok),
    );
    v.stage(&mut staging, Method::Greedy, Check::Cheap, &d.view(), &o)
        .unwrap();
    (drv, v, staging, d)
}

fn step(v: &GpuVerifier<Fake, K>, s: &Staging<Fake>, d: &Owned) {
    let a = s
        .write::<K>(
            v.driver(),
            v.stream(),
            Method::Greedy,
            &d.view(),
            Produce::TOKENS,
        )
        .unwrap();
    // SAFETY: staged views; nothing else writes the staging buffers.
    unsafe { v.launch_staged(&a) }.unwrap();
}

#[test]
fn readbacks_snapshot_in_stream_order_and_complete_in_start_order() {
    let (drv, v, s, d) = rig(3);
    let mut rb = v.readback().unwrap();
    assert_eq!(rb.max_in_flight(), 4);
    assert_eq!(
        rb.poll(),
        Poll::Ready(Err(GpuError::Misuse(Misuse::NothingInFlight)))
    );
    for _ in 0..4 {
        step(&v, &s, &d);
        rb.start().unwrap();
    }
    assert_eq!(rb.in_flight(), 4);
    assert_eq!(rb.start(), Err(GpuError::Misuse(Misuse::AlreadyInFlight)));
    assert_eq!(rb.in_flight(), 4, "a refused start changes nothing");
    step(&v, &s, &d); // after the last snapshot: not in any of them
    assert!(rb.poll().is_pending(), "nothing ran yet");
    // Run the compute stream only: the snapshots are taken, the host copies are not.
    drv.run_stream(v.stream());
    assert!(rb.poll().is_pending());
    drv.run_stream(rb.copy_stream());
    for i in 1..=4u64 {
        let c = match rb.poll() {
            Poll::Ready(r) => r.unwrap(),
            Poll::Pending => panic!("copy {i} ran"),
        };
        assert_eq!(c.drafts, 3 * i, "snapshot as of start {i}");
    }
    assert_eq!(rb.in_flight(), 0);
    assert!(matches!(rb.poll(), Poll::Ready(Err(GpuError::Misuse(_)))));
    assert_eq!(rb.sync_calls(), 0);
    assert_eq!(drv.st.syncs.get(), 0, "start and poll never synchronise");
    let total = rb.flush().unwrap();
    assert_eq!(total.drafts, 15);
    assert_eq!(rb.sync_calls(), 1);
    assert_eq!(rb.error_flags(), 0);
    assert!(format!("{rb:?}").contains("in_flight: 0"));
}

#[test]
fn the_error_word_comes_back_with_the_counters() {
    let (drv, v, s, d) = rig(1);
    let mut rb = v.readback().unwrap();
    step(&v, &s, &d);
    let w = kernels::error_word(K) * 8;
    drv.run();
    kernels::ERR_DRAFT_LEN.write_ne(&mut v.stats().data.lock().unwrap()[w..]);
    let mut c = Counters::<K>::ZERO;
    c.drafts = 1;
    for j in 0..K {
        let (a, dr) = (4 + j, 4 + K + j);
        (10 + j as u64).write_ne(&mut v.stats().data.lock().unwrap()[a * 8..]);
        (20 + j as u64).write_ne(&mut v.stats().data.lock().unwrap()[dr * 8..]);
        c.accepted_per_position[j] = 10 + j as u64;
        c.drafted_per_position[j] = 20 + j as u64;
    }
    for (i, x) in [(1, 5u64), (2, 6), (3, 7)] {
        x.write_ne(&mut v.stats().data.lock().unwrap()[i * 8..]);
    }
    c.draft_tokens = 5;
    c.accepted_tokens = 6;
    c.emitted_tokens = 7;
    // The tree words, after the error word, come back too.
    for (i, x) in [
        (kernels::tree_drafts_word(K), 30u64),
        (kernels::tree_draft_tokens_word(K), 31),
    ] {
        x.write_ne(&mut v.stats().data.lock().unwrap()[i * 8..]);
    }
    c.tree_drafts = 30;
    c.tree_draft_tokens = 31;
    rb.start().unwrap();
    drv.run();
    assert_eq!(rb.poll(), Poll::Ready(Ok(c)));
    assert_eq!(rb.error_flags(), kernels::ERR_DRAFT_LEN);
}

#[test]
fn a_failed_copy_is_one_error_and_frees_its_slot() {
    let (drv, v, s, d) = rig(2);
    let mut rb = GpuReadback::<Fake, K, 1>::new(&v).unwrap();
    assert_eq!(rb.max_in_flight(), 1);
    step(&v, &s, &d);
    drv.st.fail_downloads.set(1);
    rb.start().unwrap();
    drv.run();
    let e = match rb.poll() {
        Poll::Ready(Err(e)) => e,
        other => panic!("{other:?}"),
    };
    assert_eq!(e.kind(), ErrorKind::Device);
    rb.start().unwrap();
    drv.run();
    assert_eq!(rb.poll().map(|r| r.map(|c| c.drafts)), Poll::Ready(Ok(2)));
    // A failing enqueue leaves the slot free.
    drv.st.fail_calls.set(true);
    assert!(matches!(rb.start(), Err(GpuError::Driver(_))));
    drv.st.fail_calls.set(false);
    assert_eq!(rb.in_flight(), 0);
    rb.start().unwrap();
    // Flush fails when the final copy fails.
    drv.st.fail_downloads.set(2);
    assert!(matches!(rb.flush(), Err(GpuError::Driver(_))));
}

#[test]
fn abandoned_slots_wait_for_their_copy_before_reuse() {
    let (drv, v, s, d) = rig(1);
    let mut rb = GpuReadback::<Fake, K, 2>::new(&v).unwrap();
    assert!(!rb.abandon(), "nothing in flight");
    step(&v, &s, &d);
    rb.start().unwrap();
    rb.start().unwrap();
    assert!(rb.abandon());
    assert_eq!(rb.in_flight(), 1);
    // One slot abandoned and pending, one in flight: no free slot, but room in flight.
    assert_eq!(rb.start(), Err(GpuError::Stalled));
    assert!(rb.abandon());
    assert_eq!(rb.start(), Err(GpuError::Stalled));
    assert!(matches!(rb.poll(), Poll::Ready(Err(GpuError::Misuse(_)))));
    // The copies land: the slots come back.
    drv.run();
    rb.start().unwrap();
    rb.start().unwrap();
    drv.run();
    assert_eq!(rb.poll().map(|r| r.map(|c| c.drafts)), Poll::Ready(Ok(1)));
    // A failed abandoned copy also frees its slot.
    assert!(rb.abandon());
    rb.start().unwrap();
    assert!(rb.abandon());
    drv.st.fail_downloads.set(1);
    drv.run();
    rb.start().unwrap();
    rb.start().unwrap();
    assert_eq!(rb.start(), Err(GpuError::Misuse(Misuse::AlreadyInFlight)));
    assert_eq!(rb.sync_calls(), 0);
}

#[test]
fn flush_waits_for_abandoned_copies_when_no_slot_is_free() {
    let (drv, v, s, d) = rig(2);
    let mut rb = GpuReadback::<Fake, K, 1>::new(&v).unwrap();
    step(&v, &s, &d);
    rb.start().unwrap();
    assert!(rb.abandon());
    step(&v, &s, &d);
    let total = rb.flush().unwrap();
    assert_eq!(total.drafts, 4);
    assert_eq!(rb.sync_calls(), 2, "the abandoned copy, then the final one");
    // And when copies are in flight, it retires them first.
    rb.start().unwrap();
    step(&v, &s, &d);
    assert_eq!(rb.flush().unwrap().drafts, 6);
    assert_eq!(rb.sync_calls(), 4);
    assert_eq!(rb.in_flight(), 0);
    // A failing wait is reported.
    rb.start().unwrap();
    drv.st.fail_downloads.set(1);
    assert!(matches!(rb.flush(), Err(GpuError::Driver(_))));
}

/// `Element::read_slice_ne`, what the CUDA and ROCm `read_host` read with: consecutive
/// native-endian elements from a byte offset, up to the last that fits; the rest kept.
#[test]
fn read_slice_ne_reads_whole_elements_from_the_offset() {
    use specula_core::gpu::Element;
    let bytes: Vec<u8> = [7u32, 8, 9].iter().flat_map(|w| w.to_ne_bytes()).collect();
    let mut out = [0u32; 4];
    u32::read_slice_ne(&bytes, 4, &mut out);
    assert_eq!(out, [8, 9, 0, 0]);
    let mut out = [1u32; 2];
    u32::read_slice_ne(&bytes, 6, &mut out); // 6 bytes left: one whole element
    assert_eq!(
        out,
        [
            u32::from_ne_bytes([bytes[6], bytes[7], bytes[8], bytes[9]]),
            1
        ]
    );
    let mut out = [5u32; 2];
    u32::read_slice_ne(&bytes, 13, &mut out); // past the end: nothing read
    assert_eq!(out, [5, 5]);
    let mut wide = [0u64; 1];
    u64::read_slice_ne(&bytes, 0, &mut wide);
    assert_eq!(wide[0].to_ne_bytes(), bytes[..8]);
}

/// Dropping a readback hands its copy stream to `Driver::drain_copies`, whose default waits for
/// it (one synchronising call): copies in flight and abandoned ones land before the page-locked
/// buffers are freed. Nothing else waits.
#[test]
fn drop_waits_for_the_copy_stream() {
    let (drv, v, s, d) = rig(1);
    let mut rb = v.readback().unwrap();
    step(&v, &s, &d);
    rb.start().unwrap();
    rb.start().unwrap();
    assert!(rb.abandon());
    let copy = rb.copy_stream().clone();
    assert!(!copy.queue.borrow().is_empty(), "two copies queued");
    assert_eq!(drv.st.syncs.get(), 0);
    drop(rb);
    assert_eq!(drv.st.syncs.get(), 1, "one wait, for the copy stream");
    assert!(copy.queue.borrow().is_empty(), "every copy landed");
}

#[test]
fn errors_have_one_kind_per_concept() {
    type E = GpuError<FakeError>;
    let cases: [(E, ErrorKind, &str); 8] = [
        (
            GpuError::Driver(FakeError(ErrorKind::NoDevice)),
            ErrorKind::NoDevice,
            "driver: fake no device",
        ),
        (
            GpuError::Verify(VerifyError::EmptyBatch),
            ErrorKind::InvalidInput,
            "invalid batch: EmptyBatch",
        ),
        (GpuError::TooLarge, ErrorKind::InvalidInput, "32-bit"),
        (GpuError::ViewTooShort, ErrorKind::InvalidInput, "shorter"),
        (
            GpuError::GraphMismatch,
            ErrorKind::InvalidInput,
            "captured with",
        ),
        (GpuError::DeviceFlags(4), ErrorKind::Device, "0x4"),
        (
            Misuse::NothingInFlight.into(),
            ErrorKind::Misuse,
            "no readback in flight",
        ),
        (GpuError::Stalled, ErrorKind::Device, "stalled"),
    ];
    for (e, kind, text) in cases {
        assert_eq!(e.kind(), kind, "{e:?}");
        assert_eq!(HasKind::kind(&e), kind);
        assert!(e.to_string().contains(text), "{e}");
    }
    let e: E = VerifyError::EmptyBatch.into();
    assert_eq!(e, GpuError::Verify(VerifyError::EmptyBatch));
    assert_eq!(HasKind::kind(&Misuse::AlreadyInFlight), ErrorKind::Misuse);
    assert!(Misuse::AlreadyInFlight.to_string().contains("in flight"));
    assert_ne!(
        Misuse::AlreadyInFlight.to_string(),
        Misuse::NothingInFlight.to_string()
    );
    assert_eq!(
        E::from(Misuse::AlreadyInFlight).to_string(),
        Misuse::AlreadyInFlight.to_string()
    );
}

/// `d`'s requests with the optional inputs of issue 13: the ragged layout (packed ids and
/// rows), caller-supplied bonus tokens (the bonus rows then absent) and f32 target logits with
/// temperatures (0 and 0.7 alternating) instead of probabilities.
struct Var {
    ragged: bool,
    cu: Vec<u32>,
    ids: Vec<u32>,
    rows: Vec<f32>,
    bonus: Option<Vec<u32>>,
    temps: Option<Vec<f32>>,
    d: Owned,
}

impl Var {
    fn new(d: Owned, ragged: bool, bonus: bool, logits: bool) -> Self {
        let b = d.k.len();
        let (mut cu, mut ids, mut rows) = (vec![], vec![], vec![]);
        if ragged {
            let mut at = 0;
            for r in 0..b {
                let k = d.k[r] as usize;
                at += d.k[r];
                cu.push(at);
                ids.extend_from_slice(&d.ids[r * 2..r * 2 + k]);
                let n = if bonus { k } else { k + 1 };
                rows.extend_from_slice(&d.target[r * 9..r * 9 + 3 * n]);
            }
        } else {
            rows = d.target.clone();
        }
        Self {
            ragged,
            cu,
            ids,
            rows,
            bonus: bonus.then(|| (0..b as u32).map(|i| i % 3).collect()),
            temps: logits.then(|| (0..b).map(|i| [0.0, 0.7][i % 2]).collect()),
            d,
        }
    }

    fn view(&self) -> Batch<'_> {
        let streams = Streams {
            seed: &self.d.seed,
            offset: &self.d.offset,
        };
        let rows: &[f32] = if self.temps.is_some() {
            &[]
        } else {
            &self.rows
        };
        let mut batch = if self.ragged {
            Batch::ragged(
                3,
                specula_core::verify::RaggedDrafts {
                    cu_num_draft_tokens: &self.cu,
                    ids: &self.ids,
                },
                rows,
                streams,
            )
        } else {
            let mut b = self.d.view();
            b.target = Target::Probs(Rows::f32(rows, b.target.rows().stride));
            b
        };
        if let Some(x) = &self.bonus {
            batch = batch.with_bonus(x);
        }
        if let Some(t) = &self.temps {
            batch = batch.with_target_logits(specula_core::verify::Logits {
                values: &self.rows,
                temperature: t,
            });
        }
        batch
    }

    fn inputs(&self) -> Inputs {
        Inputs {
            draft_probs: false,
            ragged: self.ragged,
            bonus: self.bonus.is_some(),
            logits: self.temps.is_some(),
            ..Inputs::default()
        }
    }
}

#[test]
fn entry_names_and_families() {
    use kernels::*;
    let split = Entry::Split { slices: 2 };
    let want = [
        (Entry::Single, Family::Plain, VERIFY_ENTRY),
        (split, Family::Plain, VERIFY_SPLIT_ENTRY),
        (Entry::Single, Family::Logits, VERIFY_LOGITS_ENTRY),
        (split, Family::Logits, VERIFY_SPLIT_LOGITS_ENTRY),
    ];
    for (i, (entry, family, name)) in want.into_iter().enumerate() {
        assert_eq!(ENTRY_NAMES[entry.index(family)], name);
        assert_eq!(ENTRY_NAMES[i], name);
        // Defined by the kernel text, where drivers load it by this name, taking the one
        // argument block. (Not under Miri: a scan of 160 KB of text, over a minute there, in
        // safe code; the debug run checks it.)
        assert!(
            cfg!(miri) || SOURCE.contains(&format!("\n{name}(const sp_args a) {{")),
            "{name}"
        );
    }
    // The tree entries: binary32 rows, then half rows (`TreeLaunch::entry_index`), each
    // defined by the tree text with the same one argument block (scans: not under Miri).
    assert_eq!(TREE_ENTRY_NAMES, [TREE_ENTRY, TREE_HALF_ENTRY]);
    for name in TREE_ENTRY_NAMES.into_iter().filter(|_| !cfg!(miri)) {
        assert!(
            TREE_SOURCE.contains(&format!("\n{name}(const sp_args a) {{")),
            "{name}"
        );
        assert!(
            !SOURCE.contains(&format!("\n{name}(")),
            "{name} in the chain text"
        );
    }
    let none = Inputs::default();
    assert_eq!(none.family(), Family::Plain);
    let with = |f: fn(&mut Inputs)| {
        let mut i = none;
        f(&mut i);
        i.family()
    };
    assert_eq!(with(|i| i.draft_probs = true), Family::Plain);
    // The ragged layout and bonus tokens: the plain entries read them (null tests per request).
    assert_eq!(with(|i| i.ragged = true), Family::Plain);
    assert_eq!(with(|i| i.bonus = true), Family::Plain);
    assert_eq!(with(|i| i.logits = true), Family::Logits);
    // Methods and filters are the logits entries' sampling words (over probabilities too).
    assert_eq!(with(|i| i.sampling = true), Family::Logits);
    assert_eq!(with(|i| i.draft_first_row = true), Family::Logits);
    assert_eq!(with(|i| i.logits_half = true), Family::Logits);
    assert_eq!(with(|i| i.draft_probs_half = true), Family::Logits);
    assert_eq!(with(|i| i.recovered = true), Family::Logits);
    let s = SUPPORT;
    assert_eq!(
        [
            s.empty_drafts,
            s.ragged,
            s.bonus,
            s.logits,
            s.filters,
            s.methods,
            s.half,
            s.recovered
        ],
        [true; 8],
        "what the entries take"
    );
}

/// The launch takes the plain entry (also for the ragged layout and bonus tokens) unless a
/// logits entry's input is set; one block per request or split (with the scratch sized as for
/// the plain entry); the argument block holds the staged views, null where not set. `k = 0`
/// requests go through every entry.
#[test]
fn the_entry_follows_the_optional_inputs() {
    for sms in [1, 16] {
        let drv = Fake::new(sms);
        let mut v = GpuVerifier::<Fake, K>::new(drv.clone()).unwrap();
        for (i, bits) in (0..8u8).enumerate() {
            let (ragged, bonus, logits) = (bits & 1 != 0, bits & 2 != 0, bits & 4 != 0);
            let mut d = Owned::new(3);
            d.k = vec![1, 0, 2]; // request 1 has no draft
            let x = Var::new(d, ragged, bonus, logits);
            let (mut acc, mut tok) = outputs(3);
            v.verify(
                Method::Greedy,
                Check::Cheap,
                &x.view(),
                &mut Outputs::new(
                    specula_core::verify::AcceptedOut(&mut acc),
                    specula_core::verify::TokensOut(&mut tok),
                ),
            )
            .unwrap();
            assert_eq!(acc, vec![101, 100, 102], "{bits:03b}: k from k or cu");
            let l = drv.launches();
            assert_eq!(l.len(), i + 1);
            let last = &l[i];
            let family = x.inputs().family();
            let want = match family {
                Family::Plain => [kernels::VERIFY_ENTRY, kernels::VERIFY_SPLIT_ENTRY],
                Family::Logits => [
                    kernels::VERIFY_LOGITS_ENTRY,
                    kernels::VERIFY_SPLIT_LOGITS_ENTRY,
                ],
            };
            let split = sms > 1;
            assert_eq!(last.family, family, "{bits:03b}");
            assert_eq!(last.name, want[usize::from(split)], "{bits:03b}");
            let scratch = split.then(|| specula_core::gpu::split_scratch_bytes::<K>(sms, 3));
            assert_eq!(last.scratch.map(|s| s.1), scratch.flatten(), "{bits:03b}");
            // The argument block: every field the staged views set, null elsewhere.
            let p = last.args;
            assert_eq!(at(p.shape), Some(last.shape));
            assert_eq!(at(p.k), Some(last.k), "k is passed (unread when ragged)");
            assert_eq!(at(p.accepted), Some(last.accepted));
            assert_eq!(at(p.stats), Some((last.stats, 0)));
            assert_eq!(p.draft_probs, 0, "one-hot drafter: null draft_probs");
            assert_ne!(p.draft_ids, 0, "{bits:03b}");
            assert_eq!(
                (p.target_probs != 0, p.target_logits != 0),
                (!logits, logits),
                "the target rows in the field of their kind, the other null: {bits:03b}"
            );
            assert_eq!(
                (p.cu_num_draft_tokens != 0, p.bonus != 0),
                (ragged, bonus),
                "{bits:03b}"
            );
            assert_eq!(
                (p.target_logits != 0, p.temperature != 0),
                (logits, logits),
                "{bits:03b}"
            );
            if logits {
                assert_ne!(at(p.target_logits).unwrap().0, at(p.temperature).unwrap().0);
            }
            match last.entry {
                Entry::Split { slices } => {
                    assert_eq!(at(p.scratch).map(|s| s.1), Some(0));
                    assert_eq!(at(p.scratch).map(|s| s.0), last.scratch.map(|s| s.0));
                    assert_eq!(p.slices, slices);
                }
                Entry::Single => assert_eq!((p.scratch, p.slices), (0, 1)),
            }
            let rest = [
                p.sampling,
                p.recovered,
                p.draft_first_row,
                p.first_child,
                p.next_sibling,
                p.path,
                p.reserved.into(),
            ];
            assert_eq!(rest, [0; 7], "{bits:03b}");
            let ids: Vec<usize> = [
                p.cu_num_draft_tokens,
                p.bonus,
                p.target_logits,
                p.temperature,
            ]
            .into_iter()
            .filter_map(at)
            .map(|p| p.0)
            .collect();
            let mut distinct = ids.clone();
            distinct.sort_unstable();
            distinct.dedup();
            assert_eq!(ids.len(), distinct.len(), "one buffer per optional view");
        }
    }
}

#[test]
fn staging_writes_the_optional_inputs() {
    let drv = Fake::new(1);
    let mut v = GpuVerifier::<Fake, K>::new(drv.clone()).unwrap();
    let mut staging = Staging::<Fake>::new();
    let x = Var::new(Owned::new(4), true, true, true);
    let (mut acc, mut tok) = outputs(4);
    let o = Outputs::new(
        specula_core::verify::AcceptedOut(&mut acc),
        specula_core::verify::TokensOut(&mut tok),
    );
    v.stage(&mut staging, Method::Rejection, Check::Cheap, &x.view(), &o)
        .unwrap();
    let a = staging
        .write::<K>(
            &drv,
            v.stream(),
            Method::Rejection,
            &x.view(),
            Produce::TOKENS,
        )
        .unwrap();
    drv.run();
    fn words<T: Element>(view: View<'_, Fake, T>) -> Vec<T> {
        let data = view.buffer().data.lock().unwrap();
        (0..view.len())
            .map(|i| T::read_ne(&data[view.byte_offset() + i * T::BYTES..]))
            .collect()
    }
    assert_eq!(a.inputs(), x.inputs());
    assert_eq!(words(a.cu_num_draft_tokens.unwrap()), x.cu);
    assert_eq!(Some(words(a.bonus.unwrap())), x.bonus);
    assert_eq!(words(f32_rows(a.step.target).unwrap()), x.rows);
    assert_eq!(Some(words(a.step.temperature.unwrap())), x.temps);
    assert!(a.k.is_empty(), "the ragged layout has no k");
    assert_eq!(words(a.draft_ids), x.ids);
    assert_eq!(
        words(a.step.shape).as_slice(),
        kernels::batch_shape::<K>(Method::Rejection, &x.view()).unwrap()
    );
    // A padded batch without them: none set, the plain entry's views (its `k` needs room the
    // ragged batch did not reserve).
    let p = Var::new(Owned::new(4), false, false, false);
    assert_eq!(
        staging
            .write::<K>(
                &drv,
                v.stream(),
                Method::Rejection,
                &p.view(),
                Produce::TOKENS
            )
            .unwrap_err(),
        GpuError::ViewTooShort
    );
    staging.reserve(&drv, &p.view(), Produce::TOKENS).unwrap();
    let a = staging
        .write::<K>(
            &drv,
            v.stream(),
            Method::Rejection,
            &p.view(),
            Produce::TOKENS,
        )
        .unwrap();
    assert_eq!(a.inputs(), Inputs::default());
    assert!(a.cu_num_draft_tokens.is_none() && a.bonus.is_none());
    assert!(a.step.temperature.is_none(), "probabilities");
    assert_eq!(a.k.len(), 4);
    // A runtime that never passes the optional inputs never allocates their buffers.
    let mut fresh = Staging::<Fake>::new();
    let ids = drv.st.next_id.get();
    fresh.reserve(&drv, &p.view(), Produce::TOKENS).unwrap();
    assert_eq!(
        drv.st.next_id.get() - ids,
        11,
        "the plain entry's buffers only"
    );
    // A batch with them is refused there before anything is enqueued (no partial write).
    drv.run();
    assert_eq!(
        fresh
            .write::<K>(
                &drv,
                v.stream(),
                Method::Rejection,
                &x.view(),
                Produce::TOKENS
            )
            .unwrap_err(),
        GpuError::ViewTooShort
    );
    assert_eq!(drv.pending_ops(), 0, "nothing enqueued");
    fresh.reserve(&drv, &x.view(), Produce::TOKENS).unwrap();
    assert_eq!(
        drv.st.next_id.get() - ids,
        14,
        "then the three optional ones (the logits go to the target rows' buffer)"
    );
    let a = fresh
        .write::<K>(
            &drv,
            v.stream(),
            Method::Rejection,
            &p.view(),
            Produce::TOKENS,
        )
        .unwrap();
    assert_eq!(a.inputs(), Inputs::default());
}

#[test]
fn launch_checks_the_optional_views() {
    let drv = Fake::new(1);
    let mut v = GpuVerifier::<Fake, K>::new(drv.clone()).unwrap();
    let mut staging = Staging::<Fake>::new();
    let x = Var::new(Owned::new(4), true, true, true);
    let (mut acc, mut tok) = outputs(4);
    let o = Outputs::new(
        specula_core::verify::AcceptedOut(&mut acc),
        specula_core::verify::TokensOut(&mut tok),
    );
    v.stage(&mut staging, Method::Greedy, Check::Cheap, &x.view(), &o)
        .unwrap();
    for field in 0..3 {
        let mut a = staging
            .write::<K>(&drv, v.stream(), Method::Greedy, &x.view(), Produce::TOKENS)
            .unwrap()
            .into_args();
        match field {
            0 => a.cu_num_draft_tokens = a.cu_num_draft_tokens.map(short),
            1 => a.bonus = a.bonus.map(short),
            _ => a.step.temperature = a.step.temperature.map(short),
        }
        // SAFETY: refused before anything is enqueued.
        let e = unsafe { v.launch(&a) }.unwrap_err();
        assert_eq!(e, GpuError::ViewTooShort, "field {field}");
        // SAFETY: as above.
        let e = unsafe { v.capture(&a) }.unwrap_err();
        assert_eq!(e, GpuError::ViewTooShort, "field {field}");
    }
    drv.run();
    assert!(drv.launches().is_empty());
    // The ragged layout never reads `k`: its (empty) view is no reason to refuse.
    let a = staging
        .write::<K>(&drv, v.stream(), Method::Greedy, &x.view(), Produce::TOKENS)
        .unwrap();
    assert!(a.k.is_empty());
    // SAFETY: staged views; nothing else writes the staging buffers.
    unsafe { v.launch_staged(&a) }.unwrap();
    drv.run();
    assert_eq!(drv.launches().len(), 1);
    // A padded batch's `k` is read: a short one is refused.
    let p = Var::new(Owned::new(4), false, true, true);
    staging.reserve(&drv, &p.view(), Produce::TOKENS).unwrap();
    let mut a = staging
        .write::<K>(&drv, v.stream(), Method::Greedy, &p.view(), Produce::TOKENS)
        .unwrap()
        .into_args();
    a.k = short(a.k);
    // SAFETY: refused before anything is enqueued.
    assert_eq!(unsafe { v.launch(&a) }, Err(GpuError::ViewTooShort));
}

/// A graph replays batches with its own optional inputs; another kind (which would read stale
/// views) or a batch above its capacity is refused before anything is enqueued.
#[test]
fn replay_staged_checks_the_inputs_and_the_capacity() {
    let drv = Fake::new(1);
    let mut v = GpuVerifier::<Fake, K>::new(drv.clone()).unwrap();
    let mut staging = Staging::<Fake>::new();
    let big = Var::new(Owned::new(6), true, true, false);
    let (mut acc, mut tok) = outputs(6);
    let o = Outputs::new(
        specula_core::verify::AcceptedOut(&mut acc),
        specula_core::verify::TokensOut(&mut tok),
    );
    v.stage(&mut staging, Method::Greedy, Check::Cheap, &big.view(), &o)
        .unwrap();
    // Room for every kind of batch (the graph will borrow the staging: no growing then).
    for bits in 0..8u8 {
        let y = Var::new(Owned::new(6), bits & 1 != 0, bits & 2 != 0, bits & 4 != 0);
        staging.reserve(&drv, &y.view(), Produce::TOKENS).unwrap();
    }
    let x = Var::new(Owned::new(4), true, true, false);
    let a = staging
        .write::<K>(&drv, v.stream(), Method::Greedy, &x.view(), Produce::TOKENS)
        .unwrap();
    // SAFETY: staged views; every replay below follows a write with the graph's inputs.
    let g = unsafe { v.capture_staged(&a) }.unwrap();
    assert_eq!((g.inputs(), g.capacity()), (x.inputs(), 4));
    drv.run();
    for (bits, n, ok) in [(0b011u8, 3, true), (0b011, 4, true), (0b011, 5, false)]
        .into_iter()
        .chain([(0b001, 3, false), (0b010, 3, false), (0b111, 3, false)])
        .chain([(0b000, 3, false)])
    {
        let mut d = Owned::new(n);
        d.k[0] = 2;
        let y = Var::new(d, bits & 1 != 0, bits & 2 != 0, bits & 4 != 0);
        let s = staging
            .write::<K>(&drv, v.stream(), Method::Greedy, &y.view(), Produce::TOKENS)
            .unwrap();
        drv.run();
        let before = drv.launches().len();
        let r = v.replay_staged(&g, &s);
        if !ok {
            assert_eq!(drv.pending_ops(), 0, "{bits:03b} {n}: nothing enqueued");
        }
        drv.run();
        if ok {
            assert_eq!(r, Ok(()));
            assert_eq!(drv.launches().len(), before + 1);
            let (mut acc, mut tok) = (vec![0; n], vec![0; n * 3]);
            v.download_outputs(
                &s,
                &mut Outputs::new(AcceptedOut(&mut acc), TokensOut(&mut tok)),
            )
            .unwrap();
            assert_eq!(acc[..2], [102, 102], "the new cumulative counts were read");
        } else {
            assert_eq!(r, Err(GpuError::GraphMismatch), "{bits:03b} {n}");
            assert_eq!(drv.launches().len(), before);
        }
    }
    assert_eq!(
        GpuError::<FakeError>::GraphMismatch.kind(),
        ErrorKind::InvalidInput
    );
    drop(g);
}

/// bf16 / f16 target logits and draft probabilities: staged as their u16 patterns, the shape
/// flags set (target and draft format, the draft stride and `FLAG_DRAFT_PROBS` for half
/// drafts), passed as `target_logits` / `draft_probs` through the logits entries; their buffers
/// allocated only once a batch has them; a graph replays only batches of the same formats.
#[test]
fn half_inputs_are_staged_with_their_flags() {
    use specula_core::verify::{Half, HalfLogits};
    fn words<T: Element>(view: View<'_, Fake, T>) -> Vec<T> {
        let data = view.buffer().data.lock().unwrap();
        (0..view.len())
            .map(|i| T::read_ne(&data[view.byte_offset() + i * T::BYTES..]))
            .collect()
    }
    let drv = Fake::new(1);
    let v = GpuVerifier::<Fake, K>::new(drv.clone()).unwrap();
    let mut staging = Staging::<Fake>::new();
    let d = Owned::new(2);
    let logits: Vec<u16> = (0..18).map(|i| 0x3F80 + i).collect();
    let drafts: Vec<u16> = (0..12).map(|i| 0x3C00 + i).collect();
    let temps = [0.5f32, 0.0];
    let ids = drv.st.next_id.get();
    staging.reserve(&drv, &d.view(), Produce::TOKENS).unwrap();
    assert_eq!(drv.st.next_id.get() - ids, 11, "no half buffers");
    let flags = kernels::SHAPE_FLAGS;
    for (t, dr) in [(0u8, 1u8), (1, 0), (0, 0), (1, 1), (2, 1), (1, 2)] {
        let mut batch = match t {
            0 => d.view().with_target_logits_half(HalfLogits {
                values: Half::Bf16(&logits),
                temperature: &temps,
            }),
            1 => d.view().with_target_logits_half(HalfLogits {
                values: Half::F16(&logits),
                temperature: &temps,
            }),
            _ => d.view(),
        };
        match dr {
            0 => batch = batch.with_draft_probs_half(Half::Bf16(&drafts)),
            1 => batch = batch.with_draft_probs_half(Half::F16(&drafts)),
            _ => {}
        }
        batch.draft = batch.draft.map(|d| Draft {
            rows: Rows {
                stride: 3,
                ..d.rows
            },
            ..d
        });
        staging.reserve(&drv, &batch, Produce::TOKENS).unwrap();
        let a = staging
            .write::<K>(&drv, v.stream(), Method::Rejection, &batch, Produce::TOKENS)
            .unwrap();
        drv.run();
        let what = format!("target {t} draft {dr}");
        assert_eq!(a.inputs().family(), Family::Logits, "{what}");
        assert_eq!(
            half_rows(a.step.target).map(words),
            (t < 2).then(|| logits.clone())
        );
        assert_eq!(
            a.step.draft_probs.and_then(half_rows).map(words),
            (dr < 2).then(|| drafts.clone())
        );
        assert_eq!(a.step.temperature.is_some(), t < 2, "{what}");
        assert_eq!(a.step.draft_probs.is_some(), dr < 2, "{what}");
        let shape = words(a.step.shape);
        let want_t = [kernels::FLAG_TARGET_BF16, kernels::FLAG_TARGET_F16, 0][usize::from(t)];
        let want_d = [
            kernels::FLAG_DRAFT_PROBS | kernels::FLAG_DRAFT_BF16,
            kernels::FLAG_DRAFT_PROBS | kernels::FLAG_DRAFT_F16,
            0,
        ][usize::from(dr)];
        assert_eq!(shape[flags], want_t | want_d, "{what}");
        if dr < 2 {
            assert_eq!(shape[kernels::SHAPE_DRAFT_STRIDE], 3, "{what}");
        }
        // SAFETY: staged views; nothing else writes the staging buffers.
        unsafe { v.launch_staged(&a) }.unwrap();
        drv.run();
        let l = drv.launches();
        let last = l.last().unwrap();
        let view_at = |p: Option<View<'_, Fake, u16>>| p.map(|v| (v.buffer().id, v.byte_offset()));
        assert_eq!(
            at(last.args.target_logits),
            view_at(half_rows(a.step.target)),
            "{what}"
        );
        assert_eq!(
            at(last.args.draft_probs),
            view_at(a.step.draft_probs.and_then(half_rows)),
            "{what}"
        );
    }
    assert_eq!(
        drv.st.next_id.get() - ids,
        13,
        "then the temperatures' and the draft rows' (grown for the half drafts; half rows go to \
         the buffer of their tensor)"
    );
}

/// `d`'s batch with a method per request and each filter, as the GPU path takes them.
struct Filtered {
    d: Owned,
    methods: Vec<Method>,
    top_k: Vec<u32>,
    top_p: Vec<f32>,
    min_p: Vec<f32>,
    /// The filters with the parts of `bits >> 1` on (index 0: none).
    filters: Vec<Vec<Filter>>,
}

impl Filtered {
    fn new(b: usize) -> Self {
        let all = [Method::Rejection, Method::Greedy, Method::Typical];
        let top_k: Vec<u32> = (0..b as u32).map(|i| i % 3).collect();
        let top_p: Vec<f32> = (0..b).map(|i| [1.0, 0.5][i % 2]).collect();
        let min_p: Vec<f32> = (0..b).map(|i| [0.0, 0.25][i % 2]).collect();
        let filters = (0..8u8)
            .map(|parts| {
                (0..b)
                    .map(|i| {
                        let f = Filter::NONE;
                        f.with_top_k(if parts & 1 != 0 { top_k[i] } else { 0 })
                            .with_top_p(if parts & 2 != 0 { top_p[i] } else { 1.0 })
                            .with_min_p(if parts & 4 != 0 { min_p[i] } else { 0.0 })
                    })
                    .collect()
            })
            .collect();
        Self {
            d: Owned::new(b),
            methods: (0..b).map(|i| all[i % 3]).collect(),
            top_k,
            top_p,
            min_p,
            filters,
        }
    }
    /// Bits 0..4: methods, top-k, top-p, min-p.
    fn view(&self, bits: u8) -> Batch<'_> {
        let mut b = self.d.view();
        if bits & 1 != 0 {
            b = b.with_methods(&self.methods);
        }
        let parts = usize::from((bits >> 1) & 7);
        if parts != 0 {
            b = b.with_filters(&self.filters[parts]);
        }
        b
    }
    fn inputs(bits: u8) -> Inputs {
        Inputs {
            sampling: bits != 0,
            ..Inputs::default()
        }
    }
    /// The sampling words the kernel reads for `view(bits)` under `call`: each request's
    /// method code (the call's without methods), then top-k, top-p and min-p (neutral where
    /// not set), as bits.
    fn words(&self, bits: u8, call: Method) -> Vec<u32> {
        let b = self.methods.len();
        (0..b)
            .flat_map(|i| {
                [
                    kernels::method_code(if bits & 1 != 0 { self.methods[i] } else { call }),
                    if bits & 2 != 0 { self.top_k[i] } else { 0 },
                    if bits & 4 != 0 { self.top_p[i] } else { 1.0 }.to_bits(),
                    if bits & 8 != 0 { self.min_p[i] } else { 0.0 }.to_bits(),
                ]
            })
            .collect()
    }
}

/// Methods and filters: staged as the kernel reads them (one block of sampling words per
/// request: method code, top-k, top-p and min-p bits, the neutral values where a batch has
/// none), their one buffer allocated only once a batch has any, passed as the logits entries'
/// `sampling` (null without them; `recovered` null), a short view refused at launch, and a
/// graph replayed only with the same inputs.
#[test]
fn methods_and_filters_are_staged_and_passed() {
    fn words<T: Element>(view: View<'_, Fake, T>) -> Vec<T> {
        let data = view.buffer().data.lock().unwrap();
        (0..view.len())
            .map(|i| T::read_ne(&data[view.byte_offset() + i * T::BYTES..]))
            .collect()
    }
    let drv = Fake::new(1);
    let v = GpuVerifier::<Fake, K>::new(drv.clone()).unwrap();
    // 70 requests: the method codes go up in more than one stack chunk.
    let b = 70;
    let x = Filtered::new(b);
    let mut staging = Staging::<Fake>::new();
    let ids = drv.st.next_id.get();
    staging.reserve(&drv, &x.view(0), Produce::TOKENS).unwrap();
    assert_eq!(
        drv.st.next_id.get() - ids,
        11,
        "none of the optional buffers"
    );
    staging
        .reserve(&drv, &x.view(0b1111), Produce::TOKENS)
        .unwrap();
    assert_eq!(
        drv.st.next_id.get() - ids,
        12,
        "then the sampling words' one"
    );
    // Under Miri, each input alone and all of them (every combination goes through the same
    // unsafe launch; each write of 70 requests takes Miri seconds): the debug run takes all.
    let combos: Vec<u8> = if cfg!(miri) {
        vec![0b0001, 0b0010, 0b0100, 0b1000, 0b1111]
    } else {
        (1..16).collect()
    };
    for bits in combos {
        let a = staging
            .write::<K>(
                &drv,
                v.stream(),
                Method::Rejection,
                &x.view(bits),
                Produce::TOKENS,
            )
            .unwrap();
        drv.run();
        assert_eq!(a.inputs(), Filtered::inputs(bits), "{bits:04b}");
        assert_eq!(a.inputs().family(), Family::Logits);
        assert_eq!(
            a.sampling.map(words),
            Some(x.words(bits, Method::Rejection))
        );
        assert_eq!(
            a.sampling.map(|v| v.len()),
            Some(b * kernels::SAMPLING_WORDS)
        );
        // SAFETY: staged views; nothing else writes the staging buffers.
        unsafe { v.launch_staged(&a) }.unwrap();
        drv.run();
        let l = drv.launches();
        let last = l.last().unwrap();
        assert_eq!(last.name, kernels::VERIFY_LOGITS_ENTRY);
        let p = last.args;
        assert_eq!(
            at(p.sampling),
            a.sampling.map(|v| (v.buffer().id, v.byte_offset())),
            "{bits:04b}"
        );
        assert_eq!(
            [
                p.cu_num_draft_tokens,
                p.bonus,
                p.target_logits,
                p.temperature
            ],
            [0; 4],
            "no ragged, bonus, logits"
        );
        assert_eq!(p.recovered, 0, "recovered not passed");
    }
    // A short view is refused before anything is enqueued.
    {
        let mut a = staging
            .write::<K>(
                &drv,
                v.stream(),
                Method::Rejection,
                &x.view(0b1111),
                Produce::TOKENS,
            )
            .unwrap()
            .into_args();
        drv.run();
        a.sampling = a.sampling.map(short);
        let before = drv.launches().len();
        // SAFETY: refused before anything is enqueued.
        let r = unsafe { v.launch(&a) };
        assert_eq!(r, Err(GpuError::ViewTooShort));
        assert_eq!(drv.pending_ops(), 0);
        assert_eq!(drv.launches().len(), before);
    }
    // A graph captured with sampling words replays only batches that have them (whichever).
    let a = staging
        .write::<K>(
            &drv,
            v.stream(),
            Method::Rejection,
            &x.view(0b0011),
            Produce::TOKENS,
        )
        .unwrap();
    // SAFETY: staged views; every replay below follows a write with the graph's inputs.
    let g = unsafe { v.capture_staged(&a) }.unwrap();
    drv.run();
    // Under Miri: none (refused), the graph's own, one other and all.
    let replays: Vec<u8> = if cfg!(miri) {
        vec![0, 0b0011, 0b0100, 0b1111]
    } else {
        (0..16).collect()
    };
    for bits in replays {
        let s = staging
            .write::<K>(
                &drv,
                v.stream(),
                Method::Rejection,
                &x.view(bits),
                Produce::TOKENS,
            )
            .unwrap();
        drv.run();
        let r = v.replay_staged(&g, &s);
        assert_eq!(drv.pending_ops(), usize::from(bits != 0), "{bits:04b}");
        drv.run();
        let want = if bits != 0 {
            Ok(())
        } else {
            Err(GpuError::GraphMismatch)
        };
        assert_eq!(r, want, "{bits:04b}");
    }
    drop(g);
    assert_eq!(v.sync_calls(), 0);
}

/// The recovered-token output (`Outputs::with_recovered`): its buffer allocated only once a
/// call asks for it, one value per draft slot, passed as the logits entries' `recovered`
/// (the logits family, even over probabilities), downloaded in the same single wait; a short
/// slice is refused before anything runs; without it nothing changes (plain entry, no buffer).
#[test]
fn recovered_output_is_staged_passed_and_downloaded() {
    let drv = Fake::new(1);
    let mut v = GpuVerifier::<Fake, K>::new(drv.clone()).unwrap();
    let d = Owned::new(2);
    let batch = d.view();
    let (mut acc, mut tok) = outputs(2);
    v.verify(
        Method::Greedy,
        Check::Cheap,
        &batch,
        &mut Outputs::new(
            specula_core::verify::AcceptedOut(&mut acc),
            specula_core::verify::TokensOut(&mut tok),
        ),
    )
    .unwrap();
    let ids = drv.st.next_id.get();
    let l = drv.launches();
    assert_eq!(
        l[0].family,
        Family::Plain,
        "no recovered output: plain entry"
    );
    // With it: 2 requests x k_max 2 slots.
    let (mut acc, mut tok) = outputs(2);
    let mut rec = [7u32; 4];
    v.verify(
        Method::Greedy,
        Check::Cheap,
        &batch,
        &mut Outputs::new(
            specula_core::verify::AcceptedOut(&mut acc),
            specula_core::verify::TokensOut(&mut tok),
        )
        .with_recovered(&mut rec),
    )
    .unwrap();
    assert_eq!(
        rec,
        [300, 301, 302, 303],
        "the fake kernel's recovered tokens came back"
    );
    assert_eq!(acc, vec![101, 102]);
    assert_eq!(
        drv.st.next_id.get() - ids,
        2,
        "the recovered output's buffer, and a larger host buffer to download it"
    );
    let l = drv.launches();
    assert_eq!(l.len(), 2);
    assert_eq!(
        (l[1].family, l[1].name),
        (Family::Logits, kernels::VERIFY_LOGITS_ENTRY)
    );
    let p = l[1].args;
    let r = at(p.recovered).expect("recovered passed");
    assert_eq!(
        [
            p.cu_num_draft_tokens,
            p.bonus,
            p.target_logits,
            p.temperature,
            p.sampling,
            p.draft_first_row
        ],
        [0; 6],
        "nothing else set"
    );
    assert_eq!(r.1, 0);
    assert_eq!(v.sync_calls(), 2, "one wait per call");
    // Too short: refused with the reference's error, nothing launched or written.
    let (mut acc, mut tok) = outputs(2);
    let mut short = [7u32; 3];
    let r = v.verify(
        Method::Greedy,
        Check::Cheap,
        &batch,
        &mut Outputs::new(
            specula_core::verify::AcceptedOut(&mut acc),
            specula_core::verify::TokensOut(&mut tok),
        )
        .with_recovered(&mut short),
    );
    assert!(
        matches!(
            r,
            Err(GpuError::Verify(VerifyError::Length {
                param: specula_core::verify::Param::Recovered,
                ..
            }))
        ),
        "{r:?}"
    );
    assert_eq!(short, [7; 3]);
    assert_eq!((acc, tok), outputs(2));
    assert_eq!(drv.launches().len(), 2);
    assert_eq!(v.sync_calls(), 2);
    // The staged path: stage() reserves it, write(.., WITH_RECOVERED) gives the view, a capture
    // remembers it (a replay without it is refused).
    let mut staging = Staging::<Fake>::new();
    let (acc, tok) = &mut outputs(2);
    let mut rec = [0u32; 4];
    let o = Outputs::new(
        specula_core::verify::AcceptedOut(acc),
        specula_core::verify::TokensOut(tok),
    )
    .with_recovered(&mut rec);
    v.stage(&mut staging, Method::Greedy, Check::Cheap, &batch, &o)
        .unwrap();
    let a = staging
        .write::<K>(
            &drv,
            v.stream(),
            Method::Greedy,
            &batch,
            Produce::WITH_RECOVERED,
        )
        .unwrap();
    assert_eq!(a.recovered.as_ref().map(|r| r.len()), Some(4));
    assert!(a.inputs().recovered);
    // SAFETY: staged views; nothing else writes the staging buffers.
    let g = unsafe { v.capture_staged(&a) }.unwrap();
    let plain = staging
        .write::<K>(&drv, v.stream(), Method::Greedy, &batch, Produce::TOKENS)
        .unwrap();
    assert_eq!(v.replay_staged(&g, &plain), Err(GpuError::GraphMismatch));
    v.replay_staged(&g, &a).unwrap();
    let (mut acc, mut tok) = outputs(2);
    let mut rec = [0u32; 4];
    v.download_outputs(
        &a,
        &mut Outputs::new(AcceptedOut(&mut acc), TokensOut(&mut tok)).with_recovered(&mut rec),
    )
    .unwrap();
    assert_eq!(rec, [300, 301, 302, 303]);
    let mut long = [0u32; 5];
    assert_eq!(
        v.download_outputs(
            &a,
            &mut Outputs::new(AcceptedOut(&mut acc), TokensOut(&mut tok)).with_recovered(&mut long)
        ),
        Err(GpuError::ViewTooShort),
        "more recovered values than the view holds"
    );
    assert_eq!(long, [0; 5]);
    assert_eq!(
        v.download_outputs(
            &plain,
            &mut Outputs::new(AcceptedOut(&mut acc), TokensOut(&mut tok)).with_recovered(&mut rec)
        ),
        Err(GpuError::ViewTooShort),
        "no recovered view to download from"
    );
}

/// Mixed drafters: the batch's first rows staged as their own view (B values), passed in the
/// argument block to the logits entries; the draft rows staged as given (only the requests
/// that have them). A first-row view without draft rows, or shorter than the capacity, and a
/// sampling view of fewer than `SAMPLING_WORDS` words per request, are refused at launch.
#[test]
fn mixed_drafters_are_staged_and_passed() {
    let drv = Fake::new(1);
    let v = GpuVerifier::<Fake, K>::new(drv.clone()).unwrap();
    let b = 5;
    let d = Owned::new(b);
    // Requests 0, 2 and 4 have rows (2 each, packed), 1 and 3 are one-hot drafters.
    let rows: Vec<f32> = (0..6).flat_map(|_| [1.0f32, 0.0, 0.0]).collect();
    let first = [0u32, NO_DRAFT_ROWS, 2, NO_DRAFT_ROWS, 4];
    let filters = [Filter::NONE.with_top_k(1); 5];
    let batch = d
        .view()
        .with_mixed_drafters(Rows::f32(&rows, 3), &first)
        .with_filters(&filters);
    let mut staging = Staging::<Fake>::new();
    staging.reserve(&drv, &batch, Produce::TOKENS).unwrap();
    let a = staging
        .write::<K>(&drv, v.stream(), Method::Rejection, &batch, Produce::TOKENS)
        .unwrap();
    drv.run();
    assert!(a.inputs().draft_first_row && a.inputs().draft_probs);
    assert_eq!(a.inputs().family(), Family::Logits);
    let words = |view: View<'_, Fake, u32>| -> Vec<u32> {
        let data = view.buffer().data.lock().unwrap();
        (0..view.len())
            .map(|i| u32::read_ne(&data[view.byte_offset() + i * 4..]))
            .collect()
    };
    assert_eq!(a.draft_first_row.map(words), Some(first.to_vec()));
    assert_eq!(a.step.draft_probs.map(|v| v.len()), Some(rows.len()));
    // SAFETY: staged views; nothing else writes the staging buffers.
    unsafe { v.launch_staged(&a) }.unwrap();
    drv.run();
    let l = drv.launches();
    let p = l.last().unwrap().args;
    assert_eq!(
        at(p.draft_first_row),
        a.draft_first_row.map(|v| (v.buffer().id, v.byte_offset()))
    );
    let refused = |args: &VerifyArgs<'_, Fake>, what: &str| {
        let before = drv.launches().len();
        // SAFETY: refused before anything is enqueued.
        let r = unsafe { v.launch(args) };
        assert_eq!(r, Err(GpuError::ViewTooShort), "{what}");
        assert_eq!(drv.pending_ops(), 0, "{what}");
        assert_eq!(drv.launches().len(), before, "{what}");
    };
    let staged = || {
        let a = staging
            .write::<K>(&drv, v.stream(), Method::Rejection, &batch, Produce::TOKENS)
            .unwrap()
            .into_args();
        drv.run();
        a
    };
    let mut x = staged();
    x.step.draft_probs = None;
    refused(&x, "first rows without draft rows");
    let mut x = staged();
    x.draft_first_row = x.draft_first_row.map(short);
    refused(&x, "first rows for fewer requests than the capacity");
    // Sampling words: one short of SAMPLING_WORDS per request is refused.
    let mut x = staged();
    x.sampling = x
        .sampling
        .map(|s| View::range(s.buffer(), 0, b * kernels::SAMPLING_WORDS - 1).unwrap());
    refused(&x, "sampling words short by one");
}

/// A fake device buffer holding `values` after `pad` zero elements.
fn device_f32(drv: &Fake, pad: usize, values: &[f32]) -> Buf {
    let buf = drv.alloc(4 * (pad + values.len())).unwrap();
    for (i, &x) in values.iter().enumerate() {
        write(&buf, 4 * (pad + i), x);
    }
    buf
}

#[test]
fn device_rows_and_outputs_are_launched_in_place_without_a_wait() {
    let drv = Fake::new(1);
    let mut v = GpuVerifier::<Fake, K>::new(drv.clone()).unwrap();
    let mut d = Owned::new(4);
    d.draft = Some(vec![0.5; 4 * 2 * 3]); // B · k_max rows of V = 3
    // Target and draft rows at an offset inside larger buffers: the launch takes their addresses.
    let target = device_f32(&drv, 3, &d.target);
    let draft = device_f32(&drv, 5, d.draft.as_deref().unwrap());
    let n = d.target.len();
    let m = d.draft.as_ref().unwrap().len();
    let mut batch = d.view();
    batch.target = Target::Probs(Rows::device(
        Device::f32(View::<Fake, f32>::range(&target, 3, n).unwrap()),
        3,
    ));
    batch.draft = Some(
        Rows::device(
            Device::f32(View::<Fake, f32>::range(&draft, 5, m).unwrap()),
            3,
        )
        .into(),
    );
    let (mut acc_buf, mut tok_buf) = (drv.alloc(4 * 6).unwrap(), drv.alloc(4 * 12).unwrap());
    let (acc_id, tok_id) = (acc_buf.id, tok_buf.id);
    let mut out = Outputs::on_device(DeviceOutputs {
        accepted: DeviceOut::new(ViewMut::<Fake, u32>::range(&mut acc_buf, 2, 4).unwrap()),
        tokens: DeviceOut::new(ViewMut::<Fake, u32>::new(&mut tok_buf)),
        recovered: None,
    });
    v.verify(Method::Rejection, Check::Cheap, &batch, &mut out)
        .unwrap();
    // Nothing waited and nothing downloaded: the outputs are in the caller's buffers once the
    // stream runs.
    assert_eq!((v.sync_calls(), drv.st.syncs.get()), (0, 0));
    drv.run();
    let l = drv.launches();
    assert_eq!(l.len(), 1);
    let a = l[0].args;
    assert_eq!(
        at(a.target_probs),
        Some((target.id, 12)),
        "rows read in place"
    );
    assert_eq!(at(a.draft_probs), Some((draft.id, 20)));
    assert!(l[0].draft_probs);
    assert_eq!(l[0].accepted, (acc_id, 8), "outputs written in place");
    assert_eq!(at(a.tokens), Some((tok_id, 0)));
    let acc: Vec<u32> = (0..4).map(|i| read(&acc_buf, 8 + 4 * i)).collect();
    assert_eq!(acc, vec![101, 102, 101, 102]);
    assert_eq!(read::<u32>(&acc_buf, 0), 0, "before the window: untouched");
    assert_eq!(v.totals().unwrap().drafts, 4);
}

#[test]
fn device_rows_of_another_device_or_a_half_draft_are_refused_before_any_work() {
    let drv = Fake::new(1);
    let mut v = GpuVerifier::<Fake, K>::new(drv.clone()).unwrap();
    let d = Owned::new(2);
    let target = device_f32(&drv, 0, &d.target);
    let n = d.target.len();
    let (mut acc, mut tok) = outputs(2);
    let mut batch = d.view();
    batch.target = Target::Probs(Rows::device(
        Device::f32(View::<Fake, f32>::range(&target, 0, n).unwrap()),
        3,
    ));
    drv.st.foreign.set(Some(target.id));
    let e = v
        .verify(
            Method::Greedy,
            Check::Cheap,
            &batch,
            &mut Outputs::new(AcceptedOut(&mut acc), TokensOut(&mut tok)),
        )
        .unwrap_err();
    assert!(matches!(e, GpuError::ForeignMemory { .. }), "{e:?}");
    assert!(drv.launches().is_empty() && acc == vec![0; 2]);
    assert_eq!(v.totals().unwrap().drafts, 0, "nothing counted");
}

#[test]
fn half_device_rows_are_launched_in_place_and_another_device_s_are_refused() {
    let drv = Fake::new(1);
    let d = Owned::new(2);
    // bf16 draft rows (B · k_max rows of V = 3) at an offset of 1 pattern in a device buffer.
    let draft = drv.alloc(2 * (1 + 12)).unwrap();
    for i in 0..12 {
        write(&draft, 2 * (1 + i), 0x3f00u16); // 0.5 in bf16
    }
    let run = |foreign: Option<usize>| {
        drv.st.foreign.set(foreign);
        let mut v = GpuVerifier::<Fake, K>::new(drv.clone()).unwrap();
        let mut batch = d.view();
        batch.draft = Some(
            Rows::device(
                Device::bf16(View::<Fake, u16>::range(&draft, 1, 12).unwrap()),
                3,
            )
            .into(),
        );
        let (mut acc, mut tok) = outputs(2);
        let r = v.verify(
            Method::Rejection,
            Check::Cheap,
            &batch,
            &mut Outputs::new(AcceptedOut(&mut acc), TokensOut(&mut tok)),
        );
        (r, acc, v.totals().unwrap().drafts)
    };
    let (r, acc, drafts) = run(None);
    r.unwrap();
    assert_eq!((acc, drafts), (vec![101, 102], 2));
    let a = drv.launches()[0].args;
    assert_eq!(at(a.draft_probs), Some((draft.id, 2)), "read in place");
    let (r, acc, drafts) = run(Some(draft.id));
    assert!(
        matches!(
            r,
            Err(GpuError::ForeignMemory {
                param: Param::DraftProbs
            })
        ),
        "{r:?}"
    );
    assert_eq!((acc, drafts), (vec![0, 0], 0), "nothing written or counted");
    assert_eq!(drv.launches().len(), 1, "no second launch");
}

#[test]
fn rows_view_reads_as_the_view_it_holds() {
    let drv = Fake::new(1);
    let buf = drv.alloc(64).unwrap();
    let f = View::<Fake, f32>::range(&buf, 2, 3).unwrap();
    let h = View::<Fake, u16>::range(&buf, 6, 0).unwrap();
    let (rf, rh) = (RowsView::F32(f), RowsView::Half(h));
    assert_eq!((rf.len(), rf.is_empty(), rf.is_half()), (3, false, false));
    assert_eq!((rh.len(), rh.is_empty(), rh.is_half()), (0, true, true));
    assert_eq!((rf.byte_offset(), rh.byte_offset()), (8, 12));
    assert_eq!((rf.buffer().id, rh.buffer().id), (buf.id, buf.id));
    assert_eq!(format!("{rf:?}"), format!("F32({f:?})"));
    assert_eq!(format!("{rh:?}"), format!("Half({h:?})"));
}
