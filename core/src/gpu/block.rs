//! [`ArgBlock`]: the one parameter of every entry point of the kernel text.

/// Declares [`ArgBlock`] and its [`LAYOUT`](ArgBlock::LAYOUT) from one field list, so the
/// names and offsets a test compares with the kernel text cannot drift from the struct.
macro_rules! arg_block {
    ($($(#[$doc:meta])* $name:ident: $ty:ty,)*) => {
        /// The one parameter every entry point of the kernel text takes, by value: `sp_args` in
        /// `core/kernels/specula_verify.cu`, field for field (the chain entries and the tree
        /// entry alike). Pointers are device addresses (`0`: null, an input not given); a
        /// driver fills them from its buffers with [`Launch::arg_block`](super::Launch::arg_block)
        /// or [`TreeLaunch::arg_block`](super::TreeLaunch::arg_block) and passes the block as
        /// the launch's only parameter.
        ///
        /// Every field is 8 bytes wide and 8-aligned (the two `u32` at the end share one word),
        /// so no target pads between them: the layout is the same in Rust, in NVRTC, hipRTC and
        /// hipcc, and in the host shim, and each of those compilers checks the size (and the
        /// offsets where it has `__builtin_offsetof`) against the numbers the kernel text's
        /// `SP_ARGS_AT` lines state, which a test compares with [`LAYOUT`](Self::LAYOUT).
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
        pub struct ArgBlock {
            $($(#[$doc])* pub $name: $ty,)*
        }

        impl ArgBlock {
            /// Every field's name and byte offset, in declaration order.
            pub const LAYOUT: &'static [(&'static str, usize)] =
                &[$((stringify!($name), core::mem::offset_of!(ArgBlock, $name)),)*];
        }
    };
}

arg_block! {
    /// The shape words ([`shape_words`](super::kernels::shape_words); a tree's
    /// [`tree_shape`](super::tree_shape)).
    shape: u64,
    /// `k[b]`: request `b`'s draft tokens (a tree: its node count).
    k: u64,
    /// Draft ids (a tree: its node tokens).
    draft_ids: u64,
    /// Draft rows (f32, or bf16 / f16 by the shape's flags); null for a one-hot drafter.
    draft_probs: u64,
    /// Target probability rows (not read with [`target_logits`](Self::target_logits)).
    target_probs: u64,
    /// Per-request stream keys.
    seed: u64,
    /// Per-request stream offsets.
    offset: u64,
    /// Typical acceptance `ε`.
    eps: u64,
    /// Typical acceptance `δ`.
    delta: u64,
    /// Output: accepted counts (a tree: path lengths).
    accepted: u64,
    /// Output: tokens.
    tokens: u64,
    /// The counters and error word ([`stats_words`](super::kernels::stats_words)).
    stats: u64,
    /// The split entries' scratch; null elsewhere.
    scratch: u64,
    /// The ragged layout's cumulative draft counts; null: padded (`k` is read).
    cu_num_draft_tokens: u64,
    /// Caller-supplied bonus tokens; null: sampled.
    bonus: u64,
    /// Target logits (f32, or bf16 / f16 by the shape's flags); null: probabilities.
    target_logits: u64,
    /// Per-request temperature, with [`target_logits`](Self::target_logits).
    temperature: u64,
    /// Per-request sampling words ([`sampling_words`](super::kernels::sampling_words)); null:
    /// the shape word's method, no filter.
    sampling: u64,
    /// Output: vLLM's recovered tokens; null: not written.
    recovered: u64,
    /// Mixed drafters: each request's first draft row (or none); null: the layout's rows.
    draft_first_row: u64,
    /// A tree's first-child links; null for a chain.
    first_child: u64,
    /// A tree's next-sibling links; null for a chain.
    next_sibling: u64,
    /// Output: a tree's accepted node indices; null for a chain.
    path: u64,
    /// The split entries' blocks per request; `1` elsewhere.
    slices: u32,
    /// Zero.
    reserved: u32,
}

/// The size the kernel text states (`static_assert(sizeof(sp_args) == 192)`).
const _: () = assert!(core::mem::size_of::<ArgBlock>() == 192);
