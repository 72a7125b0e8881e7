//! The kernel launch contract (`gpu::kernels`): method codes, shape words, batch shapes
//! and their limits, the stats layout.

use specula_core::Counters;
use specula_core::gpu::kernels::{
    FLAG_DRAFT_PROBS, SHAPE_WORDS, ShapeTooLarge, batch_shape, counters_from_stats, error_word,
    method_code, shape_words, stats_words, tree_draft_tokens_word, tree_drafts_word,
};
use specula_core::verify::Draft;
use specula_core::verify::{Batch, Dims, Drafts, Method, Rows, Streams};

#[test]
fn method_codes_and_shape_words() {
    assert_eq!(
        [Method::Rejection, Method::Greedy, Method::Typical].map(method_code),
        [0, 1, 2]
    );
    assert_eq!(
        shape_words(3, 4, 5, Some(6), 7, 2, 9),
        [3, 4, 5, 6, 7, 2, 9, FLAG_DRAFT_PROBS]
    );
    assert_eq!(
        shape_words(3, 4, 5, None, 7, 1, 9),
        [3, 4, 5, 0, 7, 1, 9, 0]
    );
    assert_eq!(SHAPE_WORDS, 8);
}

#[test]
fn batch_shapes_and_their_limits() {
    let target = [0.0f32; 3 * 2 * 6];
    let draft = [0.0f32; 3 * 5];
    let b = Batch::dense(
        Dims { vocab: 5, k_max: 1 },
        Drafts {
            k: &[1, 1, 1],
            ids: &[0, 0, 0],
        },
        &target,
        Streams {
            seed: &[0; 3],
            offset: &[0; 3],
        },
    );
    let b = {
        let mut x = b;
        x.target = x.target.with_stride(6);
        x
    };
    assert_eq!(
        batch_shape::<4>(Method::Typical, &b),
        Ok([3, 1, 5, 0, 6, 2, 4, 0])
    );
    let with = b.with_draft_probs(&draft);
    assert_eq!(
        batch_shape::<4>(Method::Greedy, &with),
        Ok([3, 1, 5, 5, 6, 1, 4, FLAG_DRAFT_PROBS])
    );
    assert_eq!(
        batch_shape::<{ u32::MAX as usize }>(Method::Greedy, &b).map(|s| s[6]),
        Ok(u32::MAX)
    );
    #[cfg(target_pointer_width = "64")]
    {
        let big = u32::MAX as usize + 1;
        assert_eq!(
            batch_shape::<{ u32::MAX as usize + 1 }>(Method::Greedy, &b),
            Err(ShapeTooLarge)
        );
        for wide in [
            {
                let mut x = b;
                x.vocab = big;
                x
            },
            {
                let mut x = b;
                x.k_max = big;
                x
            },
            {
                let mut x = b;
                x.target = x.target.with_stride(big);
                x
            },
            {
                let mut x = with;
                x.draft = x.draft.map(|d| Draft {
                    rows: Rows {
                        stride: big,
                        ..d.rows
                    },
                    ..d
                });
                x
            },
        ] {
            assert_eq!(batch_shape::<4>(Method::Greedy, &wide), Err(ShapeTooLarge));
        }
        // A draft stride is not part of the shape without draft probabilities.
        let ignored = {
            let mut x = b;
            x.draft = x.draft.map(|d| Draft {
                rows: Rows {
                    stride: big,
                    ..d.rows
                },
                ..d
            });
            x
        };
        assert!(batch_shape::<4>(Method::Greedy, &ignored).is_ok());
    }
}

#[test]
fn stats_layout() {
    assert_eq!((stats_words(0), error_word(0)), (7, 4));
    assert_eq!((stats_words(3), error_word(3)), (13, 10));
    assert_eq!((tree_drafts_word(3), tree_draft_tokens_word(3)), (11, 12));
    let stats: [u64; 11] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11];
    let mut want = Counters::<2>::ZERO;
    want.drafts = 1;
    want.draft_tokens = 2;
    want.accepted_tokens = 3;
    want.emitted_tokens = 4;
    want.accepted_per_position = [5, 6];
    want.drafted_per_position = [7, 8];
    want.tree_drafts = 10;
    want.tree_draft_tokens = 11;
    assert_eq!(
        counters_from_stats::<2>(&stats),
        Some(want),
        "9 is the flag word"
    );
    assert_eq!(counters_from_stats::<2>(&stats[..10]), None);
    assert_eq!(
        counters_from_stats::<0>(&stats[..7]).map(|c| (c.drafts, c.tree_draft_tokens)),
        Some((1, 7))
    );
}

/// The argument block has one definition in Rust (`ArgBlock`) and one in the kernel text
/// (`sp_args`): the same fields in the same order, and the offsets the text's `SP_ARGS_AT` lines
/// state (which the C compilers check on every compile, NVRTC through the size and the uniform
/// 8-byte fields) are the Rust ones.
#[test]
#[cfg_attr(miri, ignore = "a scan of the kernel text; too slow under Miri")]
fn the_argument_block_is_one_layout() {
    use specula_core::gpu::ArgBlock;
    let text = specula_core::gpu::kernels::SOURCE;
    let body = &text[text.find("struct sp_args {").expect("sp_args") + 16..];
    let body = &body[..body.find("};").unwrap()];
    let fields: Vec<&str> = body
        .lines()
        .map(|l| l.split("//").next().unwrap().trim())
        .filter(|l| !l.is_empty())
        .map(|l| {
            let name = l.trim_end_matches(';').rsplit([' ', '*']).next().unwrap();
            name.trim()
        })
        .collect();
    let rust: Vec<&str> = ArgBlock::LAYOUT.iter().map(|(n, _)| *n).collect();
    assert_eq!(fields, rust, "field order");
    let stated: Vec<(String, usize)> = text
        .lines()
        .filter_map(|l| l.strip_prefix("SP_ARGS_AT("))
        .map(|l| {
            let (name, at) = l.trim_end_matches(')').split_once(", ").unwrap();
            (name.to_string(), at.parse().unwrap())
        })
        .collect();
    let want: Vec<(String, usize)> = ArgBlock::LAYOUT
        .iter()
        .map(|(n, at)| ((*n).to_string(), *at))
        .collect();
    assert_eq!(stated, want, "offsets");
    let size = format!(
        "static_assert(sizeof(sp_args) == {}",
        core::mem::size_of::<ArgBlock>()
    );
    assert!(text.contains(&size), "{size}");
    // Every field 8 bytes apart but the last word's two u32: nothing for a compiler to pad.
    for w in ArgBlock::LAYOUT.windows(2) {
        let step = w[1].1 - w[0].1;
        assert!(step == 8 || (w[1].0 == "reserved" && step == 4), "{w:?}");
    }
}

/// A block filled from views that pass some optional inputs names exactly those inputs
/// (`Inputs::of_block`), so the host shim's launches pick the orchestration's entry, and each
/// entry index is the position of its name.
#[test]
fn a_block_names_the_inputs_it_was_filled_from() {
    use specula_core::gpu::kernels::{
        FLAG_DRAFT_BF16, FLAG_DRAFT_F16, FLAG_TARGET_BF16, FLAG_TARGET_F16,
    };
    use specula_core::gpu::{ArgBlock, Entry, Family, Inputs};
    let mut seen = 0;
    for bits in 0u32..1 << 9 {
        let on = |i: u32| bits & (1 << i) != 0;
        let x = Inputs {
            draft_probs: on(0),
            ragged: on(1),
            bonus: on(2),
            logits: on(3),
            sampling: on(4),
            logits_half: on(5),
            draft_probs_half: on(6),
            recovered: on(7),
            draft_first_row: on(8),
        };
        // One view each: f32 and half rows exclude each other.
        if (x.logits && x.logits_half) || (x.draft_probs && x.draft_probs_half) {
            continue;
        }
        let addr = |set: bool, a: u64| if set { a } else { 0 };
        let block = ArgBlock {
            draft_probs: addr(x.draft_probs || x.draft_probs_half, 0x100),
            cu_num_draft_tokens: addr(x.ragged, 0x200),
            bonus: addr(x.bonus, 0x300),
            target_logits: addr(x.logits || x.logits_half, 0x400),
            sampling: addr(x.sampling, 0x500),
            recovered: addr(x.recovered, 0x600),
            draft_first_row: addr(x.draft_first_row, 0x700),
            ..ArgBlock::default()
        };
        for (target, draft) in [
            (FLAG_TARGET_BF16, FLAG_DRAFT_F16),
            (FLAG_TARGET_F16, FLAG_DRAFT_BF16),
        ] {
            let flags = addr(x.logits_half, u64::from(target)) as u32
                | addr(x.draft_probs_half, u64::from(draft)) as u32
                | FLAG_DRAFT_PROBS;
            assert_eq!(Inputs::of_block(&block, flags), x, "{bits:09b}");
        }
        seen += 1;
    }
    assert_eq!(seen, 2 * 2 * 2 * 2 * 2 * 3 * 3);
    for (family, first) in [(Family::Plain, 0), (Family::Logits, 2)] {
        assert_eq!(Entry::Single.index(family), first);
        assert_eq!(Entry::Split { slices: 2 }.index(family), first + 1);
        assert_eq!(Entry::Split { slices: 5 }.index(family), first + 1);
    }
}
