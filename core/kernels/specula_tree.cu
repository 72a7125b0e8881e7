// specula_tree.cu: token-tree verification (EAGLE / Medusa / SpecInfer trees), the kernel text.
//
// Implements core/DETERMINISM.md "Token trees" bit for bit (the reference is
// core/src/verify/tree.rs). It reuses the device helpers of specula_verify.cu (Philox, the
// argmax / entropy / race row passes, the block reductions) by including that file when it is
// compiled on its own; core/src/kernels.rs (`TREE_SOURCE`) and the host shim place the two texts
// in one translation unit instead, and the guard below then skips the include.
//
// Launch contract (core/src/gpu/kernels.rs, `TREE_ENTRY`, has the same text):
//   grid  = (capacity, 1, 1), capacity >= shape[0]; one block per request, blocks past the batch
//           exit at once (graph capturable: every per-call value is read from device memory).
//   block = (SPECULA_BLOCK_THREADS or fewer, a multiple of the warp size).
//   One parameter, specula_verify.cu's argument block `sp_args`: node counts in `k`, node
//   tokens in `draft_ids`, the links in `first_child` / `next_sibling`, the output `path`.
//   shape = SP_TREE_SHAPE_WORDS u32 words: batch, max_depth, vocab, draft stride, target stride,
//           method, counters K, flags (SP_FLAG_DRAFT_PROBS; SP_FLAG_TARGET_BF16 / _F16: the
//           target rows, probabilities or logits, hold bf16 / f16 patterns; SP_FLAG_DRAFT_BF16 /
//           _F16 with SP_FLAG_DRAFT_PROBS: the draft rows do; at most one per tensor, strides in
//           elements), node slots N per request.
//   Two entry points, one contract: specula_verify_tree (binary32 rows; a half flag sets
//   SP_ERR_SHAPE) and specula_verify_tree_half (rows of the flags' formats). Half rows are read
//   as the logits entries read them (sp_widen: exact), so the outputs and counters are those of
//   the binary32 rows they widen to; the half entry runs the logits entries' any-format passes
//   (sp_argmax_any, ...), the binary32 entry the binary32 passes only (sp_tree_*_f32).
//   target_logits (f32, null: probabilities): the layout of target_probs, which is then not
//           read; temperature (f32 x B, read only with logits): 0 greedy on the logit rows,
//           > 0 every target value through the row's softmax (sp_softmax_state, sp_soft_p:
//           DETERMINISM.md "Target logits and temperature"), computed on the fly per node row.
//   Outputs per request b, W = max_depth + 1: accepted[b], path[b W + j], tokens[b W + j].
//   Counters: Counters<K>::record_tree(depth, n - 1, accepted) per request of depth >= 1, 64-bit
//   atomics: stats = 4 + 2K chain words, the error word, then tree drafts and tree draft nodes.
//   A malformed tree (node count outside 1..=N, a link out of range, a root sibling, a second
//   visit, an unreachable node, depth > max_depth) sets SP_ERR_TREE, a node token >= V sets
//   SP_ERR_TOKEN; that request is skipped (not counted, outputs = sentinel).
#ifndef SP_SENTINEL
#include "specula_verify.cu"
#endif

typedef unsigned short sp_u16;

#define SP_TREE_SHAPE_WORDS 9
#define SP_TREE_SHAPE_NODES 8
#define SP_TREE_MAX_NODES 512u
#define SP_ERR_TREE 8u

// ---------------------------------------------------------------- the generic binary64 race
// The race of DETERMINISM.md over weights W::w(v) (binary64), keys w / E for w > 0, ties to the
// lowest id: the same draws as sp_race, without its f32 skip test (the weights here are not a
// difference of two f32 rows). Returns (1 << 32) | winner, or 0 when no weight is > 0.
template <class W>
__device__ sp_u64 sp_tree_race(const W& wf, sp_u32 vocab, sp_u32 position, sp_u32 k0, sp_u32 k1,
                               sp_u32 off_lo, sp_u32 off_hi, sp_u64* s_red) {
    double best = -1.0;
    sp_u32 best_id = SP_SENTINEL;
    const sp_u32 groups = (vocab + 3u) / 4u;
    for (sp_u32 g = threadIdx.x; g < groups; g += blockDim.x) {
        double w[4];
        bool any = false;
        for (sp_u32 i = 0; i < 4u; ++i) {
            const sp_u32 v = g * 4u + i;
            w[i] = v < vocab ? sp_tree_w(wf, v) : 0.0;
            any = any || w[i] > 0.0;
        }
        if (!any) continue;
        sp_u32 c[4] = {g, (position << 2) | 1u, off_lo, off_hi};
        sp_philox(c, k0, k1);
        sp_u32 c2[4] = {g, (position << 2) | 2u, off_lo, off_hi};
        sp_philox(c2, k0, k1);
        for (sp_u32 i = 0; i < 4u; ++i) {
            if (!(w[i] > 0.0)) continue;
            const double e = sp_exponential(((sp_u64)c[i] << 32) | (sp_u64)c2[i]);
            const double key = w[i] / e;
            if (key > best) {
                best = key;
                best_id = g * 4u + i;
            }
        }
    }
    const sp_u64 mine = best > 0.0 ? (sp_u64)__double_as_longlong(best) : 0ull;
    const sp_u64 top = sp_block_reduce(mine, true, s_red);
    if (top == 0ull) return 0ull;
    const sp_u64 lowest = sp_block_reduce(mine == top ? (sp_u64)(~best_id) : 0ull, true, s_red);
    return (1ull << 32) | (sp_u64)(~(sp_u32)lowest);
}

// A node row's target value p(v): the stored value (of format fmt, widened), or its softmax
// probability when st is set (target logits at T > 0).
__device__ __forceinline__ float sp_tree_p(const float* row, const sp_soft* st, sp_u32 v, sp_u32 fmt) {
    const float x = sp_rd(row, v, fmt);
    return st != 0 ? sp_soft_p(x, *st) : x;
}

// The softmax state of a half logit row (the chain's two passes of format tf), compiled once.
SP_NOINLINE __device__ sp_soft sp_tree_state_any(const float* row, sp_u32 vocab, float t,
                                                 sp_u64* s_red, sp_u32 tf) {
    return sp_softmax_state<SP_FX_ANY>(row, vocab, t, threadIdx.x, blockDim.x, s_red, tf);
}

// The binary32 entry's row passes, each compiled once in that entry and called (SP_NOINLINE), as
// the half entry calls the any-format passes. Inlined into the tree body (21 row loops), their
// loops shared the entry's 64 registers with the body's own state, and ptxas reloaded some of it
// from local memory on their hot paths (30 local-memory instructions, sm_80 and sm_90); a
// callee's loops hold only its own values (none left: docs/PERFORMANCE.md, "The binary32 tree
// entry's spills"). Under that cap the races draw through sp_key_shared, as the any-format race
// does (with sp_keys the callee reloaded the round keys for every draw), and the argmax and the
// race are one function per row kind (softmax, stored values): one function for both kept the
// softmax loops' tiles in local memory. The softmax state travels as its words (t, m, s: what the
// binary32 passes read of it), not by reference (through the caller's stack).
SP_NOINLINE __device__ sp_soft sp_tree_state_f32(const float* row, sp_u32 vocab, float t,
                                                 sp_u64* s_red) {
    return sp_softmax_state(row, vocab, t, threadIdx.x, blockDim.x, s_red);
}
__device__ __forceinline__ sp_soft sp_tree_soft_f32(float t, float m, double s) {
    return sp_soft_of(t, m, s, 0u, SP_P_SOFT, SP_FMT_F32, SP_FMT_F32);
}
SP_NOINLINE __device__ sp_u32 sp_tree_argmax_soft_f32(const float* row, sp_u32 vocab,
                                                      sp_u64* s_red, float t, float m, double s) {
    const sp_soft st = sp_tree_soft_f32(t, m, s);
    return sp_argmax<SP_P_SOFT>(row, vocab, s_red, &st);
}
SP_NOINLINE __device__ sp_u32 sp_tree_argmax_raw_f32(const float* row, sp_u32 vocab, sp_u64* s_red) {
    return sp_argmax(row, vocab, s_red);
}
SP_NOINLINE __device__ float sp_tree_entropy_f32(const float* row, sp_u32 vocab, sp_u64* s_red,
                                                 float t, float m, double s, bool soft) {
    return sp_pass_entropy<false>(row, vocab, s_red, sp_tree_soft_f32(t, m, s), soft);
}
// The race over a softmax row (P = SP_P_SOFT) and over stored values (P = SP_P_RAW).
SP_NOINLINE __device__ sp_u64 sp_tree_race_soft_f32(const float* trow, const float* drow,
                                                    bool residual, sp_u32 onehot_id, sp_u32 vocab,
                                                    sp_u32 position, sp_u32 k0, sp_u32 k1,
                                                    sp_u32 off_lo, sp_u32 off_hi, sp_u64* s_red,
                                                    float t, float m, double s) {
    const sp_soft st = sp_tree_soft_f32(t, m, s);
    sp_u64 top;
    sp_u32 id;
    sp_race_part<SP_P_SOFT, 0u, sp_key_shared>(trow, drow, residual, onehot_id, vocab, position,
                                                k0, k1, off_lo, off_hi, threadIdx.x, blockDim.x,
                                                s_red, top, id, &st);
    return top == 0ull ? 0ull : (1ull << 32) | (sp_u64)id;
}
SP_NOINLINE __device__ sp_u64 sp_tree_race_raw_f32(const float* trow, const float* drow,
                                                   bool residual, sp_u32 onehot_id, sp_u32 vocab,
                                                   sp_u32 position, sp_u32 k0, sp_u32 k1,
                                                   sp_u32 off_lo, sp_u32 off_hi, sp_u64* s_red) {
    sp_u64 top;
    sp_u32 id;
    sp_race_part<SP_P_RAW, 0u, sp_key_shared>(trow, drow, residual, onehot_id, vocab, position,
                                               k0, k1, off_lo, off_hi, threadIdx.x, blockDim.x,
                                               s_red, top, id);
    return top == 0ull ? 0ull : (1ull << 32) | (sp_u64)id;
}

// The softmax state of a node row at t > 0, with what the any-format passes read of it for a
// half row (kind SP_P_SOFT, no threshold, the row formats).
__device__ __forceinline__ sp_soft sp_tree_state(const float* row, sp_u32 vocab, float t,
                                                 sp_u64* s_red, sp_u32 tf, sp_u32 df, bool half) {
    if (!half) return sp_tree_state_f32(row, vocab, t, s_red);
    const sp_soft st = sp_tree_state_any(row, vocab, t, s_red, tf);
    return sp_soft_of(st.t, st.m, st.s, 0u, SP_P_SOFT, tf, df);
}
// The row passes as instance H of the tree body runs them (block-uniform calls): the half
// instance the chain's any-format passes (sp_pass_*<true>), the binary32 one the calls above.
// st: the row's state (read only with soft in the binary32 instance).
template <bool H>
__device__ __forceinline__ sp_u32 sp_tree_argmax(const float* row, sp_u32 vocab, sp_u64* s_red,
                                                 const sp_soft& st, bool soft) {
    if (H) return sp_pass_argmax<true>(row, vocab, s_red, st, soft);
    return soft ? sp_tree_argmax_soft_f32(row, vocab, s_red, st.t, st.m, st.s)
                : sp_tree_argmax_raw_f32(row, vocab, s_red);
}
template <bool H>
__device__ __forceinline__ float sp_tree_entropy(const float* row, sp_u32 vocab, sp_u64* s_red,
                                                 const sp_soft& st, bool soft) {
    if (H) return sp_pass_entropy<true>(row, vocab, s_red, st, soft);
    return sp_tree_entropy_f32(row, vocab, s_red, st.t, st.m, st.s, soft);
}
template <bool H>
__device__ __forceinline__ sp_u64 sp_tree_pass_race(const float* trow, const float* drow,
                                                    bool residual, sp_u32 onehot_id, sp_u32 vocab,
                                                    sp_u32 position, const sp_request& rq,
                                                    sp_u64* s_red, const sp_soft& st, bool soft) {
    if (H) return sp_pass_race<true>(trow, drow, residual, onehot_id, vocab, position, rq, s_red, st, soft);
    if (soft)
        return sp_tree_race_soft_f32(trow, drow, residual, onehot_id, vocab, position, rq.k0,
                                     rq.k1, rq.off_lo, rq.off_hi, s_red, st.t, st.m, st.s);
    return sp_tree_race_raw_f32(trow, drow, residual, onehot_id, vocab, position, rq.k0, rq.k1,
                                rq.off_lo, rq.off_hi, s_red);
}

// Target-only rule's residual: w_v = (p(v) as f64) - (1.0 if v is a tried token).
struct sp_tree_excl {
    const float* row;
    const sp_soft* st; // null: probabilities
    const sp_u32* tried;
    sp_u32 m;
    sp_u32 tf; // the row's format (SP_FMT_*)
};
// (Free functions, not members: the host shim makes every __device__ function static.)
__device__ __forceinline__ double sp_tree_w(const sp_tree_excl& f, sp_u32 v) {
    bool hit = false;
    for (sp_u32 r = 0; r < f.m; ++r) hit = hit || f.tried[r] == v;
    return (double)sp_tree_p(f.row, f.st, v, f.tf) - (hit ? 1.0 : 0.0);
}

// SpecInfer's residual R_i(v) (DETERMINISM.md): p(v), then for each rejected sibling j < i
// R = R - Z_j q_j(v), kept only when > 0 (NaN -> 0).
struct sp_tree_resid {
    const float* row;
    const sp_soft* st;    // null: probabilities
    const float* draft;   // the request's draft rows (slot b N)
    const sp_u16* kids;   // the children of u in sibling order
    const double* z;      // Z_0 ... Z_{i-1}
    sp_u64 dstride;
    sp_u32 i;
    sp_u32 tf, df; // the target's and the draft rows' formats (SP_FMT_*)
};
__device__ __forceinline__ double sp_tree_w(const sp_tree_resid& f, sp_u32 v) {
    double r = (double)sp_tree_p(f.row, f.st, v, f.tf);
    for (sp_u32 j = 0; j < f.i; ++j) {
        const float* q = sp_at(f.draft, (sp_u64)f.kids[j] * f.dstride, f.df);
        r = r - f.z[j] * (double)sp_rd(q, v, f.df);
        r = r > 0.0 ? r : 0.0;
    }
    return r;
}

// floor(min(w, 2^32) 2^64) as a 128-bit integer (hi, lo), for w >= 0 and not NaN.
__device__ __forceinline__ void sp_residual_fixed(double w, sp_u64& hi, sp_u64& lo) {
    const double c = w > 4294967296.0 ? 4294967296.0 : w;
    const double x = c * 18446744073709551616.0; // exact: a power of two
    hi = 0ull;
    lo = 0ull;
    if (!(x >= 1.0)) return;
    const sp_u64 bits = (sp_u64)__double_as_longlong(x);
    const sp_i32 e = (sp_i32)((bits >> 52) & 0x7FFull) - 1075;
    const sp_u64 mant = (bits & 0x000FFFFFFFFFFFFFull) | 0x0010000000000000ull;
    if (e <= 0) {
        lo = mant >> (sp_u32)(-e);
    } else {
        lo = mant << (sp_u32)e;
        hi = mant >> (sp_u32)(64 - e);
    }
}

// A 128-bit unsigned integer as f64, rounded to nearest, ties to even (Rust's `u128 as f64`).
__device__ __forceinline__ double sp_u128_to_f64(sp_u64 hi, sp_u64 lo) {
    if (hi == 0ull) return (double)lo;
    sp_u32 lz = 0u;
    while (((hi << lz) >> 63) == 0ull) ++lz;
    const sp_u64 top = (hi << lz) | (lz ? lo >> (64u - lz) : 0ull);
    const bool sticky = (lz ? lo << lz : lo) != 0ull;
    sp_u64 m = top >> 11;
    const sp_u64 r = top & 0x7FFull;
    if (r > 0x400ull || (r == 0x400ull && (sticky || (m & 1ull)))) m += 1ull;
    sp_i32 nb = 128 - (sp_i32)lz; // bits of the integer; value = m 2^(nb - 53)
    if (m == (1ull << 53)) {
        m >>= 1;
        nb += 1;
    }
    const double scale = sp_d((sp_u64)(nb - 53 + 1023) << 52);
    return (double)m * scale;
}

// Z = (sum over v of fx(R_i(v))) 2^-64: an exact wrapping 128-bit sum (order-free), reduced over
// the block as four 32-bit limbs in 64-bit words.
__device__ double sp_tree_mass(const sp_tree_resid& rf, sp_u32 vocab, sp_u64* s_red) {
    sp_u64 hi = 0ull, lo = 0ull;
    for (sp_u32 v = threadIdx.x; v < vocab; v += blockDim.x) {
        sp_u64 h, l;
        sp_residual_fixed(sp_tree_w(rf, v), h, l);
        lo += l;
        hi += h + (lo < l ? 1ull : 0ull);
    }
    const sp_u64 s0 = sp_block_reduce(lo & 0xFFFFFFFFull, false, s_red);
    const sp_u64 s1 = sp_block_reduce(lo >> 32, false, s_red);
    const sp_u64 s2 = sp_block_reduce(hi & 0xFFFFFFFFull, false, s_red);
    const sp_u64 s3 = sp_block_reduce(hi >> 32, false, s_red);
    const sp_u64 r1 = s1 + (s0 >> 32);
    const sp_u64 r2 = s2 + (r1 >> 32);
    const sp_u64 r3 = s3 + (r2 >> 32);
    const sp_u64 L = (s0 & 0xFFFFFFFFull) | (r1 << 32);
    const sp_u64 H = (r2 & 0xFFFFFFFFull) | (r3 << 32);
    return sp_u128_to_f64(H, L) * sp_d(0x3BF0000000000000ull); // 2^-64
}

// The 64-bit acceptance draw of the sibling of rank `rank` of node u (stream 0).
__device__ __forceinline__ double sp_sibling_uniform(sp_u32 u, sp_u32 rank, const sp_request& rq) {
    sp_u32 c[4] = {rank, (u << 2) | 0u, rq.off_lo, rq.off_hi};
    sp_philox(c, rq.k0, rq.k1);
    const sp_u64 x = ((sp_u64)c[0] << 32) | (sp_u64)c[1];
    return (double)((x >> 11) | 1ull) * sp_d(0x3CA0000000000000ull); // 2^-53
}

// ---------------------------------------------------------------- the kernel
// The block's shared arrays, declared once in the entry (an instance of the body declaring its
// own would double them).
struct sp_tree_smem {
    sp_u64* red;
    sp_u16* stack;
    sp_u16* sdep;
    sp_u16* spar;
    unsigned char* seen;
    sp_u16* kids;
    sp_u32* tried;
    sp_u16* parent;
    float* thr;
    double* z;
    float* tm;
    sp_u32* word;
};

// The whole verification of block b's request. H: the rows may be half (the shape's half
// flags), read through the any-format passes (entry specula_verify_tree_half); !H: binary32
// rows only, the formats constant, the binary32 passes called (sp_tree_*_f32; entry
// specula_verify_tree). Each instance has its own entry point: a call from one entry to the
// other instance forced the call ABI (and spills) on the binary32 entry's row loops.
template <bool H>
__device__ __forceinline__ void sp_tree_body(const sp_args& a, const sp_tree_smem& sm) {
    // The chain's argument block: `k` holds the node counts, `draft_ids` the node tokens.
    const sp_u32* __restrict__ const shape = a.shape;
    const sp_u32* __restrict__ const nodes = a.k;
    const sp_u32* __restrict__ const tree_tokens = a.draft_ids;
    const sp_i32* __restrict__ const first_child = a.first_child;
    const sp_i32* __restrict__ const next_sibling = a.next_sibling;
    const float* __restrict__ const draft_probs = a.draft_probs;
    const float* __restrict__ const target_probs = a.target_probs;
    const sp_u64* __restrict__ const seed = a.seed;
    const sp_u64* __restrict__ const offset = a.offset;
    const float* __restrict__ const eps = a.eps;
    const float* __restrict__ const delta = a.delta;
    sp_u32* __restrict__ const accepted = a.accepted;
    sp_u32* __restrict__ const path = a.path;
    sp_u32* __restrict__ const tokens = a.tokens;
    sp_u64* __restrict__ const stats = a.stats;
    const float* __restrict__ const target_logits = a.target_logits;
    const float* __restrict__ const temperature = a.temperature;
    sp_u64* const s_red = sm.red;
    sp_u16* const s_stack = sm.stack;
    sp_u16* const s_sdep = sm.sdep;
    sp_u16* const s_spar = sm.spar;
    unsigned char* const s_seen = sm.seen;
    sp_u16* const s_kids = sm.kids;
    sp_u32* const s_tried = sm.tried;
    sp_u16* const s_parent = sm.parent;
    float* const s_thr = sm.thr;
    double* const s_z = sm.z;
    float* const s_tm = sm.tm;
    sp_u32* const s_word = sm.word;

    const sp_shape sh = sp_shape_of(shape);
    const sp_u32 b = blockIdx.x;
    if (b >= sh.batch) return;
    const sp_u32 max_depth = sh.k_max;
    const sp_u32 vocab = sh.vocab;
    const sp_u32 dstride = sh.dstride;
    const sp_u32 tstride = sh.tstride;
    const bool has_draft = sh.draft;
    const sp_u32 nslots = shape[SP_TREE_SHAPE_NODES];
    // Row formats (SP_FMT_*): half rows only through the any-format passes (H).
    const sp_u32 tf = H ? sp_target_fmt(sh.flags) : SP_FMT_F32;
    const sp_u32 df = H ? sp_draft_fmt(sh.flags) : SP_FMT_F32;
    const sp_u32 both_d = SP_FLAG_DRAFT_BF16 | SP_FLAG_DRAFT_F16;
    sp_u64* const err = sp_err_word(stats, sh.ck);
    const sp_u32 both_t = SP_FLAG_TARGET_BF16 | SP_FLAG_TARGET_F16;
    // The binary32 entry takes no half flag (its instance reads every row as binary32): one test.
    const bool flags_ok = H ? (sh.flags & ~(SP_FLAG_DRAFT_PROBS | both_t | both_d)) == 0u &&
                                  (sh.flags & both_t) != both_t && (sh.flags & both_d) != both_d &&
                                  (has_draft || (sh.flags & both_d) == 0u)
                            : (sh.flags & ~SP_FLAG_DRAFT_PROBS) == 0u;
    // The chain's tests (sp_shape_ok, sp_flags_ok) but in this order: in theirs ptxas spilled
    // twice as much in specula_verify_tree (sm_90: 186+776 bytes became 332+1732).
    const bool shape_ok = sh.batch <= gridDim.x && max_depth <= sh.ck && vocab >= 1u &&
                          tstride >= vocab && (!has_draft || dstride >= vocab) &&
                          sh.method <= SP_METHOD_TYPICAL && nslots >= 1u && flags_ok &&
                          nslots <= SP_TREE_MAX_NODES && blockDim.x <= SPECULA_BLOCK_THREADS &&
                          blockDim.x % SPECULA_WARP_SIZE == 0u;
    if (!shape_ok) {
        sp_refuse_launch(err);
        return;
    }

    const sp_u32 width = max_depth + 1u;
    const sp_u64 base = (sp_u64)b * nslots; // slot of node 0
    const sp_u32 n = nodes[b];

    // Validation by thread 0: a pre-order walk that visits every node once (DETERMINISM.md).
    if (threadIdx.x == 0u) {
        sp_u32 bad = 0u, depth = 0u;
        if (n < 1u || n > nslots || next_sibling[base] != -1) bad = SP_ERR_TREE;
        for (sp_u32 i = 0; i < SP_TREE_MAX_NODES; ++i) s_seen[i] = 0u;
        sp_u32 top = 0u, seen = 0u;
        if (bad == 0u && first_child[base] != -1) {
            s_stack[0] = 0u; // pushed as a link below, checked on pop
            const sp_i32 f = first_child[base];
            if (f < 1 || (sp_u32)f >= n) bad = SP_ERR_TREE;
            else { s_stack[0] = (sp_u16)f; s_sdep[0] = 1u; top = 1u; }
        }
        while (bad == 0u && top > 0u) {
            --top;
            const sp_u32 c = s_stack[top], dep = s_sdep[top];
            if (s_seen[c] != 0u || dep > max_depth) { bad = SP_ERR_TREE; break; }
            s_seen[c] = 1u;
            ++seen;
            depth = dep > depth ? dep : depth;
            if (tree_tokens[base + c] >= vocab) { bad = SP_ERR_TOKEN; break; }
            const sp_i32 s = next_sibling[base + c];
            const sp_i32 f = first_child[base + c];
            if ((s != -1 && (s < 1 || (sp_u32)s >= n)) || (f != -1 && (f < 1 || (sp_u32)f >= n))) {
                bad = SP_ERR_TREE;
                break;
            }
            // At most one pop and two pushes per visit, at most n visits: top <= n + 1.
            if (s != -1) { s_stack[top] = (sp_u16)s; s_sdep[top] = (sp_u16)dep; ++top; }
            if (f != -1) { s_stack[top] = (sp_u16)f; s_sdep[top] = (sp_u16)(dep + 1u); ++top; }
        }
        if (bad == 0u && seen != n - 1u) bad = SP_ERR_TREE; // unreachable nodes
        s_word[0] = bad;
        s_word[1] = depth;
    }
    __syncthreads();
    const sp_u32 bad = s_word[0];
    const sp_u32 depth = s_word[1];
    __syncthreads(); // s_word is reused below
    sp_u32* const out_path = path + (sp_u64)b * width;
    sp_u32* const out_tok = tokens + (sp_u64)b * width;
    if (bad != 0u) {
        for (sp_u32 j = threadIdx.x; j < width; j += blockDim.x) {
            out_path[j] = SP_SENTINEL;
            out_tok[j] = SP_SENTINEL;
        }
        sp_refuse_request(accepted, b, err, bad);
        return;
    }

    // Target logits (DETERMINISM.md, as the chain's logits entries): T = 0 is greedy on the
    // logit rows; T > 0 reads every target value of a node row through that row's softmax
    // (`soft`: its state, computed by the whole block before the row's first value is read).
    const sp_request rq = sp_request_of(seed, offset, target_logits, temperature, b, sh.method, 0);
    const bool soft = rq.soft;
    const float temp = rq.temp;
    const sp_u32 meth = rq.meth;
    const float* const tbase = sp_at(rq.lg ? target_logits : target_probs, base * tstride, tf);
    const float* const dbase = has_draft ? sp_at(draft_probs, base * dstride, df) : 0;
#define SP_TROW(u) sp_at(tbase, (sp_u64)(u) * tstride, tf)
    // The softmax state of a node row (every thread of the block; block-uniform call).
    auto row_state = [&](const float* row) {
        return sp_tree_state(row, vocab, temp, s_red, tf, df, H);
    };
    // The state the passes of a stored row (P = SP_P_RAW) read: only its formats.
    const sp_soft st_raw = sp_soft_raw(tf, df);

    sp_u32 acc = 0u;
    sp_u32 emitted = 0u;
    if (meth == SP_METHOD_TYPICAL) {
        // Medusa: the deepest node whose whole path passes, ties to the first in pre-order.
        const float a = eps[b];
        const float dl = delta[b];
        if (threadIdx.x == 0u) {
            for (sp_u32 i = 0; i < n; ++i) s_thr[i] = -1.0f; // thresholds are >= 0 or NaN
            for (sp_u32 i = 0; i < n; ++i) s_seen[i] = 0u;   // "threshold computed"
            sp_u32 top = 0u;
            const sp_i32 f = first_child[base];
            if (f != -1) { s_stack[0] = (sp_u16)f; s_spar[0] = 0u; s_sdep[0] = 1u; top = 1u; }
            s_word[0] = top;
            s_word[1] = 0u; // best node
            s_word[2] = 0u; // best depth
        }
        __syncthreads();
        for (;;) {
            // Thread 0 pops the next node (pushing its next sibling); everyone reads it.
            if (threadIdx.x == 0u) {
                sp_u32 top = s_word[0];
                if (top == 0u) {
                    s_word[3] = SP_SENTINEL;
                } else {
                    --top;
                    const sp_u32 c = s_stack[top], p = s_spar[top], dep = s_sdep[top];
                    const sp_i32 s = next_sibling[base + c];
                    if (s != -1) { s_stack[top] = (sp_u16)s; s_spar[top] = (sp_u16)p; s_sdep[top] = (sp_u16)dep; ++top; }
                    s_word[0] = top;
                    s_word[3] = c | (p << 10) | (dep << 20);
                }
            }
            __syncthreads();
            const sp_u32 cur = s_word[3];
            if (cur == SP_SENTINEL) break;
            const sp_u32 c = cur & 0x3FFu, p = (cur >> 10) & 0x3FFu, dep = cur >> 20;
            const float* prow = SP_TROW(p);
            if (s_seen[p] == 0u) { // block-uniform: written before the last barrier
                const sp_soft st = soft ? row_state(prow) : st_raw;
                const float h = sp_tree_entropy<H>(prow, vocab, s_red, st, soft);
                const float thr = sp_typical_threshold(h, a, dl);
                __syncthreads();
                if (threadIdx.x == 0u) {
                    s_thr[p] = thr;
                    s_seen[p] = 1u;
                    if (soft) { s_tm[p] = st.m; s_z[p] = st.s; }
                }
            }
            __syncthreads();
            if (threadIdx.x == 0u) {
                const sp_u32 x = tree_tokens[base + c];
                float px = sp_rd(prow, x, tf);
                if (soft) px = sp_soft_p(px, sp_soft_of(temp, s_tm[p], s_z[p], 0u, SP_P_SOFT, tf, df));
                const bool passes = px > s_thr[p]; // NaN never passes
                if (passes) {
                    s_parent[c] = (sp_u16)p;
                    if (dep > s_word[2]) { s_word[1] = c; s_word[2] = dep; }
                    const sp_i32 f = first_child[base + c];
                    sp_u32 top = s_word[0];
                    if (f != -1) { s_stack[top] = (sp_u16)f; s_spar[top] = (sp_u16)c; s_sdep[top] = (sp_u16)(dep + 1u); ++top; }
                    s_word[0] = top;
                }
            }
            __syncthreads();
        }
        const sp_u32 best = s_word[1];
        acc = s_word[2];
        __syncthreads();
        if (threadIdx.x == 0u) {
            sp_u32 x = best;
            for (sp_u32 j = acc; j >= 1u; --j) {
                out_path[j] = x;
                out_tok[j - 1u] = tree_tokens[base + x];
                x = s_parent[x];
            }
        }
        const sp_soft st = soft ? row_state(SP_TROW(best)) : st_raw;
        emitted = (sp_u32)sp_tree_pass_race<H>(SP_TROW(best), 0, false, 0u, vocab, best, rq, s_red, st, soft);
    } else {
        sp_u32 u = 0u;
        for (;;) {
            // Children of u in sibling order (thread 0), then the method's test (block-uniform).
            if (threadIdx.x == 0u) {
                sp_u32 m = 0u;
                for (sp_i32 c = first_child[base + u]; c != -1; c = next_sibling[base + (sp_u32)c]) {
                    s_kids[m] = (sp_u16)c;
                    s_tried[m] = tree_tokens[base + (sp_u32)c];
                    ++m;
                }
                s_word[0] = m;
            }
            __syncthreads();
            const sp_u32 m = s_word[0];
            const float* trow = SP_TROW(u);
            // Read only with logits, or by the half instance's raw passes (the binary32 raw
            // passes read no state, but their calls take its words).
            sp_soft st_u = st_raw;
            if (soft) st_u = row_state(trow);
            const sp_soft* const st = soft ? &st_u : 0;
            // The plain race over p_u (no candidate: 0).
            auto plain_race = [&]() {
                return sp_tree_pass_race<H>(trow, 0, false, 0u, vocab, u, rq, s_red, st_u, soft);
            };
            sp_u32 next = SP_SENTINEL; // the accepted child, or none
            if (meth == SP_METHOD_GREEDY) {
                const sp_u32 am = sp_tree_argmax<H>(trow, vocab, s_red, st_u, soft);
                for (sp_u32 r = 0; r < m && next == SP_SENTINEL; ++r)
                    if (s_tried[r] == am) next = s_kids[r];
                emitted = am;
            } else if (m == 0u) {
                emitted = (sp_u32)plain_race();
            } else if (!has_draft) {
                // The target-only rule: one uniform against the siblings' cumulative mass.
                const double u01 = sp_sibling_uniform(u, 0u, rq);
                double cum = 0.0;
                for (sp_u32 r = 0; r < m && next == SP_SENTINEL; ++r) {
                    const sp_u32 x = s_tried[r];
                    bool dup = false;
                    for (sp_u32 j = 0; j < r; ++j) dup = dup || s_tried[j] == x;
                    if (dup) continue;
                    cum = cum + (double)sp_tree_p(trow, st, x, tf);
                    if (u01 < cum) next = s_kids[r];
                }
                if (next == SP_SENTINEL) {
                    sp_u64 win;
                    if (m == 1u && !soft) {
                        win = sp_tree_pass_race<H>(trow, 0, true, s_tried[0], vocab, u, rq, s_red, st_u, false);
                    } else {
                        // (Softmax rows: the reference's generic race, whatever m.)
                        sp_tree_excl wf;
                        wf.row = trow;
                        wf.st = st;
                        wf.tried = s_tried;
                        wf.m = m;
                        wf.tf = tf;
                        win = sp_tree_race(wf, vocab, u, rq.k0, rq.k1, rq.off_lo, rq.off_hi, s_red);
                    }
                    if (win == 0ull) win = plain_race();
                    emitted = (sp_u32)win;
                }
            } else {
                // SpecInfer's multi-step speculative sampling (DETERMINISM.md).
                sp_tree_resid rf;
                rf.row = trow;
                rf.st = st;
                rf.draft = dbase;
                rf.kids = s_kids;
                rf.z = s_z;
                rf.dstride = dstride;
                rf.tf = tf;
                rf.df = df;
                if (threadIdx.x == 0u) s_z[0] = 1.0;
                __syncthreads();
                for (sp_u32 r = 0; r < m && next == SP_SENTINEL; ++r) {
                    const sp_u32 x = s_tried[r];
                    const float* q = sp_at(dbase, (sp_u64)s_kids[r] * dstride, df);
                    const double den = s_z[r] * (double)sp_rd(q, x, df);
                    const double u01 = sp_sibling_uniform(u, r, rq);
                    rf.i = r;
                    if (u01 * den < sp_tree_w(rf, x)) {
                        next = s_kids[r];
                    } else if (r + 1u < m) {
                        rf.i = r + 1u;
                        const double z = sp_tree_mass(rf, vocab, s_red);
                        if (threadIdx.x == 0u) s_z[r + 1u] = z;
                        __syncthreads();
                    }
                }
                if (next == SP_SENTINEL) {
                    sp_u64 win;
                    if (m == 1u && !soft) {
                        win = sp_tree_pass_race<H>(trow, sp_at(dbase, (sp_u64)s_kids[0] * dstride, df), true,
                                                   s_tried[0], vocab, u, rq, s_red, st_u, false);
                    } else {
                        rf.i = m;
                        win = sp_tree_race(rf, vocab, u, rq.k0, rq.k1, rq.off_lo, rq.off_hi, s_red);
                    }
                    if (win == 0ull) win = plain_race();
                    emitted = (sp_u32)win;
                }
            }
            __syncthreads(); // s_kids / s_tried / s_word are rewritten for the next node
            if (next == SP_SENTINEL) break;
            ++acc;
            if (threadIdx.x == 0u) {
                out_path[acc] = next;
                out_tok[acc - 1u] = tree_tokens[base + next];
            }
            u = next;
        }
    }
#undef SP_TROW
    __syncthreads();
    for (sp_u32 j = threadIdx.x; j < width; j += blockDim.x) {
        if (j == 0u) out_path[0] = 0u;
        if (j == acc) out_tok[j] = emitted;
        if (j > acc) {
            out_path[j] = SP_SENTINEL;
            out_tok[j] = SP_SENTINEL;
        }
    }
    // Counters<K>::record_tree(depth, n - 1, acc), fused as in the chain kernel: the chain words
    // as record(depth, acc), then the two tree words after the error word (err + 1: trees,
    // err + 2: draft nodes, the root excluded); depth 0 is not counted.
    sp_count(stats, sh.ck, accepted, b, depth, acc);
    if (threadIdx.x == 0u && depth > 0u) {
        atomicAdd(err + 1, 1ull);
        atomicAdd(err + 2, (sp_u64)(n - 1u));
    }
}

// One entry's block: its shared memory, then instance H of the body. Each entry point inlines
// exactly one instance, so the binary32 entry calls none of the half instance's code (a call to
// the half instance put the call ABI, and spills, on its row loops) and the half instance's
// registers are its own entry's.
template <bool H>
__device__ __forceinline__ void sp_tree_entry(const sp_args& a) {
    __shared__ sp_u64 s_red[SPECULA_MAX_WARPS];
    __shared__ sp_u16 s_stack[SP_TREE_MAX_NODES + 2u]; // node (validation, typical)
    __shared__ sp_u16 s_sdep[SP_TREE_MAX_NODES + 2u];  // its depth
    __shared__ sp_u16 s_spar[SP_TREE_MAX_NODES + 2u];  // its parent (typical)
    __shared__ unsigned char s_seen[SP_TREE_MAX_NODES];
    __shared__ sp_u16 s_kids[SP_TREE_MAX_NODES];
    __shared__ sp_u32 s_tried[SP_TREE_MAX_NODES];
    __shared__ sp_u16 s_parent[SP_TREE_MAX_NODES];
    __shared__ float s_thr[SP_TREE_MAX_NODES];
    __shared__ double s_z[SP_TREE_MAX_NODES]; // SpecInfer's Z; typical with logits: rows' S
    __shared__ float s_tm[SP_TREE_MAX_NODES];  // typical with logits: rows' softmax maximum
    __shared__ sp_u32 s_word[4]; // thread 0's answers: error / depth, child count, ...
    sp_tree_smem sm;
    sm.red = s_red;
    sm.stack = s_stack;
    sm.sdep = s_sdep;
    sm.spar = s_spar;
    sm.seen = s_seen;
    sm.kids = s_kids;
    sm.tried = s_tried;
    sm.parent = s_parent;
    sm.thr = s_thr;
    sm.z = s_z;
    sm.tm = s_tm;
    sm.word = s_word;
    sp_tree_body<H>(a, sm);
}

// Binary32 rows (a half flag in the shape words sets SP_ERR_SHAPE: half rows take the next entry).
extern "C" __global__ void SP_LAUNCH_BOUNDS
specula_verify_tree(const sp_args a) { sp_tree_entry<false>(a); }

// Rows of any format the shape's flags name (bf16 / f16 or binary32), through the any-format
// passes: the same launch contract and argument block as specula_verify_tree. Their race needs
// the logits entries' registers (SP_LAUNCH_BOUNDS_LOGITS, specula_verify.cu says why).
extern "C" __global__ void SP_LAUNCH_BOUNDS_LOGITS
specula_verify_tree_half(const sp_args a) { sp_tree_entry<true>(a); }
