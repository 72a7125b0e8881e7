//! The verification batch's builders and accessors: what each one sets, and only that.

use specula_core::verify::{
    Batch, Dims, Drafts, Half, Logits, Rows, Streams, Strides, Target, advance_offsets,
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
