//! The verification batch's builders and accessors: what each one sets, and only that.

use specula_core::verify::tree::{Tree, TreeBatch, TreeDims};
use specula_core::verify::{
    Batch, Dims, Drafts, Format, Half, HalfLogits, Logits, NO_DRAFT_ROWS, Rows, Streams, Strides,
    Target, advance_offsets,
};

const V: usize = 2;

fn batch<'a>(target: &'a [f32]) -> Batch<'a> {
    Batch::dense(
        Dims { vocab: V, k_max: 1 },
        Drafts { k: &[1], ids: &[0] },
        target,
        Streams {
            seed: &[1],
            offset: &[0],
        },
    )
}

#[test]
fn offsets_advance_by_one_and_wrap() {
    let mut offset = [0u64, 41, u64::MAX];
    advance_offsets(&mut offset);
    assert_eq!(offset, [1, 42, 0]);
    advance_offsets(&mut offset[..1]);
    assert_eq!(offset, [2, 42, 0], "only the slice given");
}

#[test]
fn rows_say_their_format() {
    let bits = [0x3F80u16, 0x4000];
    let half = Rows::half(Half::Bf16(&bits), 3);
    assert!(half.as_f32().is_none());
    match half.as_half() {
        Some(Half::Bf16(h)) => assert_eq!(h, &bits),
        other => panic!("bf16 rows answer {other:?}"),
    }
    assert_eq!(half.stride, 3);
    let values = [0.5f32, 0.5];
    let f = Rows::f32(&values, 2);
    assert!(f.as_half().is_none());
    assert_eq!(f.as_f32(), Some(&values[..]));
}

#[test]
fn a_target_takes_a_new_stride_and_keeps_the_rest() {
    let values = [0.25f32; 8];
    let probs = Target::Probs(Rows::f32(&values, 2)).with_stride(4);
    assert_eq!(probs.rows().stride, 4);
    assert!(probs.temperature().is_none());
    let temperature = [0.7f32];
    let logits = Target::Logits {
        rows: Rows::f32(&values, 2),
        temperature: &temperature,
    }
    .with_stride(3);
    assert_eq!(logits.rows().stride, 3);
    assert_eq!(logits.rows().as_f32(), Some(&values[..]));
    assert_eq!(logits.temperature(), Some(&temperature[..]));
    // Other rows, the kind and the temperatures kept.
    let other = [0.5f32; 4];
    let moved = logits.with_rows(Rows::f32(&other, 2));
    assert_eq!(moved.rows().as_f32(), Some(&other[..]));
    assert_eq!(
        (moved.rows().stride, moved.temperature()),
        (2, Some(&temperature[..]))
    );
    let moved = probs.with_rows(Rows::f32(&other, 1));
    assert_eq!(moved.rows().stride, 1);
    assert!(matches!(moved, Target::Probs(_)));
}

#[test]
fn strides_reach_the_target_and_the_draft_rows() {
    let target = [0.5f32; 12];
    let draft = [0.5f32; 6];
    // Without draft rows: only the target's stride changes, and no draft appears.
    let b = batch(&target).with_strides(Strides {
        draft: 5,
        target: 6,
    });
    assert_eq!(b.target.rows().stride, 6);
    assert!(b.draft.is_none());
    // With them: both, each to its own.
    let b = batch(&target)
        .with_draft_probs(&draft)
        .with_strides(Strides {
            draft: 3,
            target: 4,
        });
    assert_eq!(b.target.rows().stride, 4);
    assert_eq!(b.draft.map(|d| d.rows.stride), Some(3));
    assert_eq!(b.draft.and_then(|d| d.rows.as_f32()), Some(&draft[..]));
    // Logits keep their temperatures through it.
    let temperature = [0.0f32];
    let b = batch(&[])
        .with_target_logits(Logits {
            values: &target,
            temperature: &temperature,
        })
        .with_strides(Strides {
            draft: 2,
            target: 6,
        });
    assert_eq!(b.target.rows().stride, 6);
    assert_eq!(b.target.temperature(), Some(&temperature[..]));
}

#[test]
fn half_rows_are_seen_in_the_target_or_the_draft() {
    let target = [0.5f32; 4];
    let bits = [0x3F00u16; 4];
    assert!(!batch(&target).has_half());
    assert!(!batch(&target).with_draft_probs(&target[..2]).has_half());
    let half_target = batch(&target).with_target(Target::Probs(Rows::half(Half::F16(&bits), V)));
    assert!(half_target.has_half(), "half target rows");
    let half_draft = batch(&target).with_draft_probs_half(Half::Bf16(&bits[..2]));
    assert!(half_draft.has_half(), "half draft rows only");
}

#[test]
fn strides_keep_the_mixed_drafters_rows() {
    let target = [0.5f32; 4];
    let draft = [0.5f32; 6];
    let b = batch(&target)
        .with_mixed_drafters(Rows::f32(&draft, 2), &[NO_DRAFT_ROWS])
        .with_strides(Strides {
            draft: 3,
            target: 2,
        });
    let d = b.draft.expect("draft rows");
    assert_eq!(
        (d.rows.stride, d.first_row),
        (3, Some(&[NO_DRAFT_ROWS][..]))
    );
    assert!(!b.has_draft_rows(0));
}

/// Trees have the chain's builders and accessors over the same fields.
#[test]
fn tree_batches_build_their_rows_as_chains_do() {
    let target = [0.5f32; 8];
    let bits = [0x3F00u16; 8];
    let temperature = [0.5f32];
    let tree = TreeBatch::new(
        TreeDims {
            vocab: V,
            max_nodes: 2,
            max_depth: 1,
        },
        Tree {
            nodes: &[2],
            tokens: &[0, 1],
            first_child: &[1, -1],
            next_sibling: &[-1, -1],
        },
        &target,
        Streams {
            seed: &[1],
            offset: &[0],
        },
    );
    assert!(!tree.has_half() && !tree.has_logits() && !tree.has_device());
    let b = tree.with_draft_probs_half(Half::F16(&bits[..4]));
    assert_eq!(
        b.draft.map(|d| (d.stride, d.format())),
        Some((V, Format::F16))
    );
    assert!(b.has_half() && !b.has_logits());
    let b = tree
        .with_strides(Strides {
            draft: 3,
            target: 4,
        })
        .with_target_logits_half(HalfLogits {
            values: Half::Bf16(&bits),
            temperature: &temperature,
        });
    assert_eq!(b.target.rows().stride, 4, "the target rows' stride kept");
    assert_eq!(b.target.temperature(), Some(&temperature[..]));
    assert!(b.has_half() && b.has_logits() && b.draft.is_none());
}

/// Mixed drafters: each request's draft rows where `first_row` says (packed in any order),
/// none for [`NO_DRAFT_ROWS`]; every request verified exactly as in a batch of its own drafter
/// (with the same rows, or one-hot), the counts summed.
#[test]
fn mixed_drafters_read_each_request_s_own_rows() {
    use specula_core::Counters;
    use specula_core::verify::{
        AcceptedOut, Check, Method, NO_DRAFT_ROWS, Outputs, TokensOut, verify_batch,
    };
    const V: usize = 4;
    let (k, ids) = ([2u32, 2, 1], [1u32, 2, 3, 0, 2, 0]);
    // Target rows: request b's rows b·3 .. b·3 + 2 (k_max + 1 = 3 each).
    let target: Vec<f32> = (0..9)
        .flat_map(|r| {
            let a = 0.1 + 0.05 * (r % 4) as f32;
            [a, 0.5 - a, 0.3, 0.2]
        })
        .collect();
    // Full rows for the three requests, padded: request b's row j at b·2 + j.
    let full: Vec<f32> = (0..6)
        .flat_map(|r| {
            let a = 0.6 - 0.1 * (r % 3) as f32;
            [a, 0.1, 0.9 - a, 0.0]
        })
        .collect();
    // Packed: request 2's row first, then request 0's two; request 1 has none.
    let packed: Vec<f32> = [&full[4 * V..5 * V], &full[..2 * V]].concat();
    let first = [1u32, NO_DRAFT_ROWS, 0];
    let streams = |o: &'static [u64]| Streams {
        seed: &[7, 8, 9],
        offset: o,
    };
    let dims = Dims { vocab: V, k_max: 2 };
    for (step, offset) in [&[0u64, 0, 0], &[1, 1, 1], &[5, 9, 2]]
        .into_iter()
        .enumerate()
    {
        let base = Batch::dense(dims, Drafts { k: &k, ids: &ids }, &target, streams(offset));
        let mixed = base.with_mixed_drafters(Rows::f32(&packed, V), &first);
        assert_eq!(
            [0, 1, 2].map(|b| mixed.has_draft_rows(b)),
            [true, false, true]
        );
        let all = base.with_draft_probs(&full);
        assert!([0, 1, 2].map(|b| all.has_draft_rows(b)) == [true; 3]);
        assert!(!base.has_draft_rows(0), "no draft rows at all");
        for (b, j) in [(0, 0), (0, 1), (2, 0)] {
            assert!(all.draft_row_checked(b, j).is_some(), "row ({b}, {j})");
            assert_eq!(
                mixed.draft_row_checked(b, j),
                all.draft_row_checked(b, j),
                "row ({b}, {j})"
            );
            // The target rows do not move with the draft's.
            assert!(mixed.target_row_checked(b, j).is_some(), "row ({b}, {j})");
            assert_eq!(
                mixed.target_row_checked(b, j),
                base.target_row_checked(b, j)
            );
        }
        assert_eq!(mixed.draft_values_checked(1, 0).map(|_| ()), None);
        assert_eq!(mixed.draft_row_checked(1, 1), None);
        let run = |batch: &Batch<'_>| {
            let (mut acc, mut tok) = ([0u32; 3], [0u32; 9]);
            let mut c = Counters::<4>::ZERO;
            verify_batch(
                Method::Rejection,
                Check::STRICT,
                batch,
                &mut Outputs::new(AcceptedOut(&mut acc), TokensOut(&mut tok)),
                &mut c,
            )
            .unwrap();
            (acc, tok, c)
        };
        let (got_acc, got_tok, got_c) = run(&mixed);
        let (all_acc, all_tok, _) = run(&all);
        let (none_acc, none_tok, _) = run(&base);
        let pick = |b: usize| {
            if b == 1 {
                (&none_acc, &none_tok)
            } else {
                (&all_acc, &all_tok)
            }
        };
        let mut want_c = Counters::<4>::ZERO;
        for b in 0..3 {
            let (acc, tok) = pick(b);
            assert_eq!(got_acc[b], acc[b], "step {step} request {b}");
            assert_eq!(
                got_tok[b * 3..b * 3 + 3],
                tok[b * 3..b * 3 + 3],
                "step {step} {b}"
            );
            want_c.record(k[b] as usize, acc[b] as usize).unwrap();
        }
        assert_eq!(got_c, want_c, "step {step}");
    }
}
