//! `specula::candle` (feature `candle`): tensors in every accepted dtype and layout verify
//! exactly as the same values given as slices; everything else is a typed error naming the
//! tensor; outputs as tensors.

use specula::OutputBuffers;
use specula::candle::{
    Request, Role, Sampling, Step, StepError, TargetTensor, TensorErrorKind, ids, rows,
};
use specula::candle_core::{DType, Device, Tensor};
use specula::cpu::CpuVerifier;
use specula::half::{bf16, f16};
use specula::half_tensors;
use specula::specula_core::verify::{
    Batch, Check, Filter, Method, Param, RaggedDrafts, Rows, SENTINEL, Streams, Target, VerifyError,
};

const V: usize = 6;

/// Three requests with k = 3, 2, 0, their drafts and sampling.
fn requests() -> [(Vec<u32>, Sampling, u64); 3] {
    let s = |temperature, top_k, top_p, min_p| Sampling {
        temperature,
        filter: Filter::NONE
            .with_top_k(top_k)
            .with_top_p(top_p)
            .with_min_p(min_p),
    };
    [
        (vec![1, 2, 3], s(0.8, 0, 0.9, 0.0), 11),
        (vec![4, 0], s(1.3, 4, 1.0, 0.05), 22),
        (vec![], s(0.0, 0, 1.0, 0.0), 33),
    ]
}

/// `n` rows of `V` pseudo-random logits in [-4, 4) (a fixed LCG: the same every run).
fn logits(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed;
    (0..n * V)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 40) as f32 / (1u64 << 24) as f32) * 8.0 - 4.0
        })
        .collect()
}

/// `n` probability rows (a softmax of some logits, normalised in f32).
fn probs(n: usize, seed: u64) -> Vec<f32> {
    let mut p = logits(n, seed);
    for row in p.chunks_mut(V) {
        let sum: f32 = row.iter().map(|x| x.exp()).sum();
        row.iter_mut().for_each(|x| *x = x.exp() / sum);
    }
    p
}

fn step_of(offset: u64) -> Step {
    let mut step = Step::new().with_recovered();
    for (drafts, sampling, seed) in &requests() {
        step.push(Request {
            drafts,
            sampling: *sampling,
            seed: *seed,
            offset,
            draft_rows: true,
        });
    }
    step
}

/// What a verification wrote: accepted, tokens, recovered.
type Written = (Vec<u32>, Vec<u32>, Vec<u32>);

/// The same step verified from plain slices.
fn by_hand(target: Rows<'_>, draft: Option<Rows<'_>>, offset: u64) -> Written {
    let reqs = requests();
    let mut cu = Vec::new();
    let mut ids = Vec::new();
    for (d, _, _) in &reqs {
        ids.extend_from_slice(d);
        cu.push(ids.len() as u32);
    }
    let t: Vec<f32> = reqs.iter().map(|r| r.1.temperature).collect();
    let filters: Vec<Filter> = reqs.iter().map(|r| r.1.filter).collect();
    let seed: Vec<u64> = reqs.iter().map(|r| r.2).collect();
    let offsets = [offset; 3];
    let mut batch = Batch::ragged(
        V,
        RaggedDrafts {
            cu_num_draft_tokens: &cu,
            ids: &ids,
        },
        &[],
        Streams {
            seed: &seed,
            offset: &offsets,
        },
    )
    .with_target(Target::Logits {
        rows: target,
        temperature: &t,
    })
    .with_filters(&filters);
    if let Some(d) = draft {
        batch = batch.with_draft(d);
    }
    let mut out = OutputBuffers::new().with_recovered();
    CpuVerifier::<4>::new(1)
        .unwrap()
        .verify(
            Method::Rejection,
            Check::STRICT,
            &batch,
            &mut out.fit(&batch),
        )
        .unwrap();
    let recovered = out.recovered().unwrap().to_vec();
    (out.accepted().to_vec(), out.tokens().to_vec(), recovered)
}

fn cpu() -> CpuVerifier<4> {
    CpuVerifier::<4>::new(1).unwrap()
}

/// Verifies `step` on `target` (logits) and `draft`.
fn verify(step: &mut Step, target: &Tensor, draft: Option<&Tensor>) -> Written {
    step.verify(
        &mut cpu(),
        Method::Rejection,
        Check::STRICT,
        TargetTensor::Logits(target),
        draft,
    )
    .unwrap();
    let width = 4; // k_max + 1
    let tokens = step
        .tokens_tensor(&Device::Cpu)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<u32>()
        .unwrap();
    assert_eq!(tokens.len(), 3 * width);
    let recovered = step.recovered().unwrap().to_vec();
    assert_eq!(recovered.len(), 5, "one per draft token");
    (step.accepted().to_vec(), tokens, recovered)
}

#[test]
fn every_dtype_verifies_as_the_same_values_given_as_slices() {
    // num_tokens + B = 5 + 3 target rows, 5 draft rows.
    let (t, d) = (logits(8, 1), probs(5, 2));
    let target = Tensor::from_slice(&t, (8, V), &Device::Cpu).unwrap();
    let draft = Tensor::from_slice(&d, (5, V), &Device::Cpu).unwrap();
    for offset in 0..4 {
        let f32_hand = by_hand(Rows::f32(&t, V), Some(Rows::f32(&d, V)), offset);
        assert_eq!(
            verify(&mut step_of(offset), &target, Some(&draft)),
            f32_hand,
            "f32, offset {offset}"
        );
        // bf16 and f16 logits (rounded once, as the engine's model emits them).
        let tb: Vec<bf16> = t.iter().copied().map(bf16::from_f32).collect();
        let th: Vec<f16> = t.iter().copied().map(f16::from_f32).collect();
        let bf16_hand = by_hand(
            Rows::half(half_tensors::bf16(&tb), V),
            Some(Rows::f32(&d, V)),
            offset,
        );
        let f16_hand = by_hand(Rows::half(half_tensors::f16(&th), V), None, offset);
        let as_bf16 = target.to_dtype(DType::BF16).unwrap();
        let as_f16 = target.to_dtype(DType::F16).unwrap();
        assert_eq!(
            verify(&mut step_of(offset), &as_bf16, Some(&draft)),
            bf16_hand,
            "bf16, offset {offset}"
        );
        assert_eq!(
            verify(&mut step_of(offset), &as_f16, None),
            f16_hand,
            "f16 without draft probabilities, offset {offset}"
        );
    }
}

#[test]
fn row_strided_and_offset_tensors_are_read_in_place() {
    let (t, d) = (logits(8, 3), probs(5, 4));
    let target = Tensor::from_slice(&t, (8, V), &Device::Cpu).unwrap();
    let draft = Tensor::from_slice(&d, (5, V), &Device::Cpu).unwrap();
    let want = verify(&mut step_of(0), &target, Some(&draft));
    // The same rows as the first V columns of a wider tensor (row stride V + 2) ...
    let pad = Tensor::zeros((8, 2), DType::F32, &Device::Cpu).unwrap();
    let wide = Tensor::cat(&[&target, &pad], 1).unwrap();
    let narrowed = wide.narrow(1, 0, V).unwrap();
    let view = rows(&narrowed, Role::TargetLogits).unwrap();
    assert_eq!((view.len(), view.vocab(), view.stride()), (8, V, V + 2));
    drop(view);
    assert_eq!(verify(&mut step_of(0), &narrowed, Some(&draft)), want);
    // ... and as rows 2.. of a taller one (a start offset), bf16 draft probabilities too.
    let tall = Tensor::cat(&[&target.narrow(0, 0, 2).unwrap(), &target], 0).unwrap();
    let shifted = tall.narrow(0, 2, 8).unwrap();
    assert_eq!(verify(&mut step_of(0), &shifted, Some(&draft)), want);
    let draft_bf16 = draft.to_dtype(DType::BF16).unwrap();
    let db: Vec<bf16> = d.iter().copied().map(bf16::from_f32).collect();
    assert_eq!(
        verify(&mut step_of(0), &target, Some(&draft_bf16)),
        by_hand(
            Rows::f32(&t, V),
            Some(Rows::half(half_tensors::bf16(&db), V)),
            0
        )
    );
}

#[test]
fn leading_dimensions_merge_into_rows() {
    // A padded target [B, k_max + 1, V] is B·(k_max + 1) rows; size-1 dimensions are free.
    let t = Tensor::from_slice(&logits(6, 5), (2, 3, V), &Device::Cpu).unwrap();
    let v = rows(&t, Role::TargetProbs).unwrap();
    assert_eq!((v.len(), v.stride()), (6, V));
    assert_eq!(v.rows().as_f32().map(<[f32]>::len), Some(6 * V));
    drop(v);
    let one = t.narrow(0, 1, 1).unwrap().narrow(1, 2, 1).unwrap(); // [1, 1, V]
    let v = rows(&one, Role::TargetProbs).unwrap();
    assert_eq!((v.len(), v.stride()), (1, V));
    assert_eq!(v.rows().as_f32(), Some(&logits(6, 5)[5 * V..][..V]));
    drop(v);
    // A single row given as a vector, and no rows at all.
    let row = Tensor::from_slice(&logits(1, 6), V, &Device::Cpu).unwrap();
    assert_eq!(rows(&row, Role::DraftProbs).unwrap().len(), 1);
    let empty = Tensor::zeros((0, V), DType::BF16, &Device::Cpu).unwrap();
    let v = rows(&empty, Role::DraftProbs).unwrap();
    assert!(v.is_empty());
    assert_eq!(v.rows().as_half().map(|h| h.len()), Some(0));
}

#[test]
fn tensors_that_cannot_be_read_in_place_are_typed_errors() {
    let t = Tensor::from_slice(&logits(4, 7), (4, V), &Device::Cpu).unwrap();
    let kind = |x: &Tensor| rows(x, Role::TargetLogits).map(drop).unwrap_err().kind;
    // Another dtype: named, with what is accepted.
    let e = rows(&t.to_dtype(DType::F64).unwrap(), Role::DraftProbs).unwrap_err();
    assert_eq!(e.role, Role::DraftProbs);
    assert!(
        matches!(e.kind, TensorErrorKind::DType { got: DType::F64, expected } if expected.contains(&DType::BF16))
    );
    assert!(
        e.to_string()
            .starts_with("draft probabilities: element type F64")
    );
    // No dimension.
    let scalar = Tensor::new(1f32, &Device::Cpu).unwrap();
    assert!(matches!(kind(&scalar), TensorErrorKind::Rank { dims } if dims.is_empty()));
    // Transposed: values are not unit-stride.
    let transposed = t.t().unwrap();
    assert!(matches!(
        kind(&transposed),
        TensorErrorKind::NotRowMajor { dims, stride } if dims == [V, 4] && stride == [1, V]
    ));
    // Broadcast: every row at stride 0, overlapping.
    let broadcast = t.narrow(0, 0, 1).unwrap().broadcast_as((3, V)).unwrap();
    assert!(matches!(
        kind(&broadcast),
        TensorErrorKind::NotRowMajor { .. }
    ));
    // Leading dimensions that do not merge: [2, 2, V] taken from every other row.
    let every_other = Tensor::from_slice(&logits(8, 8), (2, 4, V), &Device::Cpu)
        .unwrap()
        .narrow(1, 0, 2)
        .unwrap();
    assert!(matches!(
        kind(&every_other),
        TensorErrorKind::NotRowMajor { .. }
    ));
    // Columns 1..V+1 of a wider tensor: the last row's padding lies past the storage.
    let wide = Tensor::from_slice(&logits(4, 9)[..4 * V], (4, V), &Device::Cpu).unwrap();
    let inner = wide.narrow(1, 1, V - 2).unwrap();
    let e = rows(&inner, Role::TargetLogits).unwrap_err();
    assert!(matches!(
        e.kind,
        TensorErrorKind::OutsideStorage { needed, available } if needed == 4 * V && available == 4 * V - 1
    ));
    assert!(e.to_string().contains("contiguous()"), "{e}");
    // ... which contiguous() makes readable.
    let fixed = inner.contiguous().unwrap();
    let v = rows(&fixed, Role::TargetLogits).unwrap();
    assert_eq!((v.len(), v.stride()), (4, V - 2));
}

#[test]
fn id_tensors_are_u32_vectors() {
    let cu = Tensor::new(&[3u32, 5, 5], &Device::Cpu).unwrap();
    assert_eq!(
        ids(&cu, Role::CuNumDraftTokens).unwrap().as_slice(),
        [3, 5, 5]
    );
    let offset = Tensor::new(&[0u32, 1, 2, 3, 4], &Device::Cpu)
        .unwrap()
        .narrow(0, 2, 3)
        .unwrap();
    assert_eq!(ids(&offset, Role::DraftIds).unwrap().as_slice(), [2, 3, 4]);
    let e = ids(&cu.to_dtype(DType::I64).unwrap(), Role::DraftIds).unwrap_err();
    assert_eq!(e.role, Role::DraftIds);
    assert!(matches!(
        e.kind,
        TensorErrorKind::DType {
            got: DType::I64,
            ..
        }
    ));
    let square = Tensor::new(&[[1u32, 2], [3, 4]], &Device::Cpu).unwrap();
    assert!(matches!(
        ids(&square, Role::DraftIds).unwrap_err().kind,
        TensorErrorKind::Rank { dims } if dims == [2, 2]
    ));
    let column = square.narrow(1, 0, 1).unwrap().squeeze(1).unwrap();
    assert_eq!(column.dims(), [2]);
    assert!(matches!(
        ids(&column, Role::DraftIds).unwrap_err().kind,
        TensorErrorKind::NotRowMajor { .. }
    ));
}

#[test]
fn a_refused_step_is_typed_and_leaves_no_outputs() {
    let target = Tensor::from_slice(&logits(8, 10), (8, V), &Device::Cpu).unwrap();
    let mut step = step_of(0);
    // Before any verification there is nothing to read.
    assert_eq!(step.emitted().count(), 0);
    assert!(matches!(
        step.vllm_tokens(&Device::Cpu).unwrap_err().kind,
        TensorErrorKind::NotVerified
    ));
    verify(&mut step, &target, None);
    assert_eq!(step.emitted().count(), 3);
    // One target row short: the verifier's length error, nothing to read afterwards.
    let short = target.narrow(0, 0, 7).unwrap();
    let e = step
        .verify(
            &mut cpu(),
            Method::Rejection,
            Check::STRICT,
            TargetTensor::Logits(&short),
            None,
        )
        .unwrap_err();
    assert!(
        matches!(
            e,
            StepError::Verify(VerifyError::Length {
                param: Param::TargetLogits,
                len,
                expected
            }) if len == 7 * V && expected == 8 * V
        ),
        "{e:?}"
    );
    assert_eq!((step.emitted().count(), step.accepted()), (0, &[][..]));
    assert!(step.accepted_tensor(&Device::Cpu).is_err());
    // Draft probabilities over another vocabulary.
    let other = Tensor::from_slice(&probs(5, 11)[..5 * (V - 1)], (5, V - 1), &Device::Cpu).unwrap();
    let e = step
        .verify(
            &mut cpu(),
            Method::Rejection,
            Check::STRICT,
            TargetTensor::Logits(&target),
            Some(&other),
        )
        .unwrap_err();
    assert!(matches!(
        e,
        StepError::Tensor(ref t) if t.role == Role::DraftProbs
            && matches!(t.kind, TensorErrorKind::VocabMismatch { target: V, draft } if draft == V - 1)
    ));
    assert!(e.to_string().contains("vocabulary size 5"), "{e}");
    // A bad top-p is the verifier's parameter error, for that request.
    let mut bad = Step::new();
    bad.push(Request {
        drafts: &[1],
        sampling: Sampling {
            filter: Filter::NONE.with_top_p(0.0),
            ..Sampling::DEFAULT
        },
        seed: 1,
        offset: 0,
        draft_rows: true,
    });
    let two = target.narrow(0, 0, 2).unwrap();
    assert!(matches!(
        bad.verify(
            &mut cpu(),
            Method::Rejection,
            Check::STRICT,
            TargetTensor::Logits(&two),
            None
        ),
        Err(StepError::Verify(VerifyError::BadParam {
            request: 0,
            param: Param::TopP
        }))
    ));
}

#[test]
fn outputs_as_tensors_and_per_request() {
    // Probabilities with one clear top id per row: greedy verification is fixed.
    // Rows: request 0 (k = 3) tops 1, 2, 5, 0; request 1 (k = 2) tops 4, 0, 3; request 2: 2.
    let tops = [1usize, 2, 5, 0, 4, 0, 3, 2];
    let mut p = vec![0.02f32; 8 * V];
    for (row, &top) in p.chunks_mut(V).zip(&tops) {
        row[top] = 0.9;
    }
    let target = Tensor::from_slice(&p, (8, V), &Device::Cpu).unwrap();
    let mut step = step_of(0);
    assert_eq!(step.requests(), 3);
    assert_eq!(step.cu_num_draft_tokens(), [3, 5, 5]);
    step.verify(
        &mut cpu(),
        Method::Greedy,
        Check::STRICT,
        TargetTensor::Probs(&target),
        None,
    )
    .unwrap();
    // Request 0 accepts 1, 2, rejects 3 (top 5); request 1 accepts 4, 0 and gets the bonus 3.
    assert_eq!(step.accepted(), [2, 2, 0]);
    let emitted: Vec<&[u32]> = step.emitted().collect();
    assert_eq!(emitted, [&[1, 2, 5][..], &[4, 0, 3], &[2]]);
    let tokens = step.tokens_tensor(&Device::Cpu).unwrap();
    assert_eq!((tokens.dims(), tokens.dtype()), (&[3, 4][..], DType::U32));
    assert_eq!(
        tokens.to_vec2::<u32>().unwrap()[2],
        [2, SENTINEL, SENTINEL, SENTINEL]
    );
    let vllm = step.vllm_tokens(&Device::Cpu).unwrap();
    assert_eq!(vllm.dtype(), DType::I32);
    assert_eq!(
        vllm.to_vec2::<i32>().unwrap(),
        [[1, 2, 5, -1], [4, 0, 3, -1], [2, -1, -1, -1]]
    );
    let accepted = step.accepted_tensor(&Device::Cpu).unwrap();
    assert_eq!(accepted.to_vec1::<u32>().unwrap(), [2, 2, 0]);
    // Recovered, one per draft token: greedy recovers each draft row's top id.
    assert_eq!(step.recovered(), Some(&[1, 2, 5, 4, 0][..]));
    let recovered = step.vllm_recovered(&Device::Cpu).unwrap();
    assert_eq!(recovered.to_vec1::<i32>().unwrap(), [1, 2, 5, 4, 0]);
    // Cleared and refilled, the step is reused: the same answer again.
    step.clear();
    assert_eq!((step.requests(), step.emitted().count()), (0, 0));
    assert_eq!(step.recovered(), None, "cleared: nothing to read");
    for (drafts, _, seed) in &requests() {
        step.push(Request {
            drafts,
            sampling: Sampling::GREEDY,
            seed: *seed,
            offset: 1,
            draft_rows: true,
        });
    }
    step.verify(
        &mut cpu(),
        Method::Greedy,
        Check::STRICT,
        TargetTensor::Probs(&target),
        None,
    )
    .unwrap();
    assert_eq!(step.accepted(), [2, 2, 0]);
}

#[test]
fn a_step_without_any_draft_samples_each_bonus_token() {
    // The drafter proposed nothing this step: B target rows, an empty draft tensor.
    let mut step = Step::new();
    for b in 0..2 {
        step.push(Request {
            drafts: &[],
            sampling: Sampling::GREEDY,
            seed: b,
            offset: 0,
            draft_rows: true,
        });
    }
    let mut p = vec![0.0f32; 2 * V];
    p[3] = 1.0;
    p[V + 5] = 1.0;
    let target = Tensor::from_slice(&p, (2, V), &Device::Cpu).unwrap();
    let draft = Tensor::zeros((0, V), DType::BF16, &Device::Cpu).unwrap();
    step.verify(
        &mut cpu(),
        Method::Rejection,
        Check::STRICT,
        TargetTensor::Logits(&target),
        Some(&draft),
    )
    .unwrap();
    assert_eq!(step.accepted(), [0, 0]);
    assert_eq!(step.recovered(), None, "not asked for");
    assert!(matches!(
        step.vllm_recovered(&Device::Cpu).unwrap_err(),
        e if e.role == Role::Recovered && matches!(e.kind, TensorErrorKind::NotVerified)
    ));
    assert_eq!(
        step.vllm_tokens(&Device::Cpu)
            .unwrap()
            .to_vec2::<i32>()
            .unwrap(),
        [[3], [5]]
    );
}

/// Mixed drafters: a request pushed without draft rows (an n-gram drafter) next to requests
/// with them; the draft tensor holds only their rows. Verified exactly as the same step with
/// synthetic one-hot rows for that request (what an engine had to build before), over several
/// offsets.
#[test]
fn mixed_drafters_need_no_synthetic_rows() {
    let reqs = requests();
    let t = logits(8, 5);
    let d = probs(5, 6);
    let target = Tensor::from_slice(&t, (8, V), &Device::Cpu).unwrap();
    // Request 0's 3 rows only (request 1 is the n-gram one, request 2 drafts nothing).
    let packed = Tensor::from_slice(&d[..3 * V], (3, V), &Device::Cpu).unwrap();
    // The same rows with request 1's two one-hot rows where the layout puts them.
    let mut synthetic = d.clone();
    for (j, &x) in reqs[1].0.iter().enumerate() {
        let row = &mut synthetic[(3 + j) * V..(4 + j) * V];
        row.fill(0.0);
        row[x as usize] = 1.0;
    }
    let full = Tensor::from_slice(&synthetic, (5, V), &Device::Cpu).unwrap();
    for offset in 0..6 {
        let mut mixed = Step::new().with_recovered();
        let mut onehot = Step::new().with_recovered();
        for (i, (drafts, sampling, seed)) in reqs.iter().enumerate() {
            let r = Request {
                drafts,
                sampling: *sampling,
                seed: *seed,
                offset,
                draft_rows: i != 1,
            };
            mixed.push(r);
            onehot.push(Request {
                draft_rows: true,
                ..r
            });
        }
        let got = verify(&mut mixed, &target, Some(&packed));
        let want = verify(&mut onehot, &target, Some(&full));
        assert_eq!(got, want, "offset {offset}");
    }
}
