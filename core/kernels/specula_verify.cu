// specula_verify.cu: the speculative-decoding verification kernel of Specula.
//
// ONE source for every GPU backend and for the host-executed tests:
//   * CUDA: compiled at run time with NVRTC (`--fmad=false`, device arch) by `specula-cuda`;
//   * HIP:  compiled with hipRTC / hipcc (define SPECULA_HIP or let __HIPCC__ select it);
//   * host: compiled with g++ on top of tests/kernel_host/shim.hpp, in CUDA-macro and HIP-macro
//           mode, so CI runs this exact text on the CPU and compares it bit for bit with the Rust
//           reference (`specula_core::verify`).
// It implements core/DETERMINISM.md exactly; read that page, not this file, for the rules.
// Only the common subset of CUDA and HIP is used: no cooperative groups, no headers, no libm.
//
// Launch contract (see core/src/kernels.rs for the same text on the Rust side):
//   grid  = (capacity, 1, 1), capacity >= shape.batch; blocks past the batch exit at once, so one
//           launch configuration serves every batch size up to the capacity (graph capturable).
//   block = (SPECULA_BLOCK_THREADS, 1, 1) or fewer threads, a multiple of the warp size.
//   Every per-call value (shape, k, ids, seeds, offsets, eps, delta) is read from device memory.
//   `stats` holds Counters<K> as 4 + 2K unsigned 64-bit words followed by one error-flag word.
//   Every entry takes one parameter, the argument block `sp_args` (below), by value.
// A second entry, specula_verify_split (at the end), splits each request's rows over several
// blocks for small batches; its contract is written above it. The _logits entries read the
// engine inputs too: two instances of the same bodies, so the probability path runs only the
// code it needs.

#if defined(SPECULA_HIP) || defined(__HIP_PLATFORM_AMD__) || defined(__HIPCC__) || defined(__HIPCC_RTC__)
#define SPECULA_IS_HIP 1
#else
#define SPECULA_IS_HIP 0
#endif

#if SPECULA_IS_HIP && defined(__clang__)
// hipcc contracts a * b + c into an FMA by default (-ffp-contract=fast); the rules forbid it.
// The pragma makes the text safe whatever flags the HIP build passes (NVRTC: --fmad=false).
#pragma clang fp contract(off)
#endif

#ifndef SPECULA_BLOCK_THREADS
#define SPECULA_BLOCK_THREADS 256
#endif
// CUDA: at least SPECULA_MIN_BLOCKS blocks per SM, i.e. at most 64 registers per thread at 256
// threads and 4 blocks: the occupancy that keeps >= 32 KB of loads in flight per SM (with the
// row passes' unrolling below). ptxas fits the whole kernel in 64 registers without a spill
// (scripts/kernel-report.py checks). HIP's second argument means something else: not used there.
#ifndef SPECULA_MIN_BLOCKS
#define SPECULA_MIN_BLOCKS 4
#endif
// The split entry keeps more state across its row passes: 3 blocks per SM (80 registers).
#ifndef SPECULA_SPLIT_MIN_BLOCKS
#define SPECULA_SPLIT_MIN_BLOCKS 3
#endif
// specula_verify_logits too: its race (sp_race_part_any, every row kind and format chosen at run
// time) needs more than 64 registers; at 64 its row loops reloaded spilled values from local
// memory on their hot path (scripts/kernel-report.py counts them; docs/PERFORMANCE.md). The cap
// binds only above 3 requests per SM: specula-cuda launches this entry (one block per request)
// from one request per SM up and the split entry below, so up to 3 per SM every block is
// resident at once either way; above, 3 instead of 4 blocks per SM hold loads in flight.
#ifndef SPECULA_LOGITS_MIN_BLOCKS
#define SPECULA_LOGITS_MIN_BLOCKS 3
#endif
#if SPECULA_IS_HIP
#define SP_LAUNCH_BOUNDS __launch_bounds__(SPECULA_BLOCK_THREADS)
#define SP_LAUNCH_BOUNDS_SPLIT __launch_bounds__(SPECULA_BLOCK_THREADS)
#define SP_LAUNCH_BOUNDS_LOGITS __launch_bounds__(SPECULA_BLOCK_THREADS)
#else
#define SP_LAUNCH_BOUNDS __launch_bounds__(SPECULA_BLOCK_THREADS, SPECULA_MIN_BLOCKS)
#define SP_LAUNCH_BOUNDS_SPLIT __launch_bounds__(SPECULA_BLOCK_THREADS, SPECULA_SPLIT_MIN_BLOCKS)
#define SP_LAUNCH_BOUNDS_LOGITS __launch_bounds__(SPECULA_BLOCK_THREADS, SPECULA_LOGITS_MIN_BLOCKS)
#endif
// Warps per block at the smallest warp size any target has (32); sizes the cross-warp scratch.
#define SPECULA_MAX_WARPS (SPECULA_BLOCK_THREADS / 32)

#if SPECULA_IS_HIP
// HIP: wave size 64 on CDNA, 32 on RDNA; `warpSize` is right on both. No mask argument.
#define SPECULA_SHFL_DOWN(v, d) __shfl_down((v), (d))
#else
// CUDA: every lane of the warp takes part in each shuffle (reductions are block-uniform).
#define SPECULA_SHFL_DOWN(v, d) __shfl_down_sync(0xFFFFFFFFu, (v), (d))
#endif
#define SPECULA_WARP_SIZE ((unsigned int)warpSize)

// Marks the start of a rarely taken region inside a hot loop. Empty in every real build;
// scripts/kernel-report.py defines it (before this text) as a PTX `pmevent` so that it can tell
// the hot path of each loop from the cold one in the SASS.
#ifndef SP_COLD_MARK
#define SP_COLD_MARK()
#endif
// Counts the filters' exact weights in their sparse passes (sp_filter_sparse): empty in every
// real build; the host tests define it to count how rare that cold region is on real rows.
#ifndef SP_FILTER_EXACT
#define SP_FILTER_EXACT()
#endif

typedef unsigned int sp_u32;
typedef int sp_i32;
typedef unsigned long long sp_u64;
typedef long long sp_i64;

// ---------------------------------------------------------------- the argument block
// Every entry point (the four chain entries below, specula_tree.cu's specula_verify_tree and
// specula_verify_tree_half) takes this one struct by value: its definition in Rust is `specula_core::gpu::ArgBlock` (core/src/gpu/block.rs), field
// for field, and a test there reads the SP_ARGS_AT lines below and checks them against the Rust
// offsets. Every field is 8 bytes wide and 8-aligned (pointers; the two u32 at the end share one
// word), so no target pads between them; the static_asserts check that on every compile (NVRTC,
// hipRTC / hipcc, the host shim in both macro modes). A null pointer is an input not given.
// The entry (which template instance runs) is chosen by the host from the same flags, so the
// plain probability path keeps its own code.
struct sp_args {
    const sp_u32* shape;        // the shape words (SP_SHAPE_*; the tree's SP_TREE_SHAPE_WORDS)
    const sp_u32* k;            // k[b]: drafted tokens of request b (a tree: its node count)
    const sp_u32* draft_ids;    // drafted ids (a tree: node tokens, N slots per request)
    const float* draft_probs;   // draft rows (f32, or bf16 / f16 by the shape's flags); null: one-hot
    const float* target_probs;  // target probability rows (not read with target_logits)
    const sp_u64* seed;         // per-request stream keys
    const sp_u64* offset;       // per-request stream offsets
    const float* eps;           // typical acceptance epsilon
    const float* delta;         // typical acceptance delta
    sp_u32* accepted;           // out: accepted counts (a tree: path lengths)
    sp_u32* tokens;             // out: tokens
    sp_u64* stats;              // counters, error word (and the tree's words)
    sp_u64* scratch;            // the split entries' scratch; null elsewhere
    const sp_u32* cu_num_draft_tokens; // ragged layout; null: padded (k is read)
    const sp_u32* bonus;        // caller's bonus tokens; null: sampled
    const float* target_logits; // target logits (f32, or bf16 / f16 by the flags); null: probs
    const float* temperature;   // per-request temperature, with target_logits
    const sp_u32* sampling;     // per-request sampling words (SP_SAMPLING_WORDS each: method
                                // code, then the filter, sp_filter); null: the shape word's
                                // method, no filter
    sp_u32* recovered;          // out: vLLM's recovered tokens; null: not written
    const sp_u32* draft_first_row; // mixed drafters: request b's first draft row, SP_SENTINEL
                                   // for none (a one-hot drafter); null: the layout's rows
    const sp_i32* first_child;  // a tree's first-child links (-1 none); null for a chain
    const sp_i32* next_sibling; // a tree's next-sibling links (-1 none); null for a chain
    sp_u32* path;               // out: a tree's accepted node indices; null for a chain
    sp_u32 slices;              // the split entries' blocks per request; 1 elsewhere
    sp_u32 reserved;            // zero
};
static_assert(sizeof(void*) == 8, "64-bit device pointers");
static_assert(sizeof(sp_args) == 192, "sp_args: 23 pointers and two u32, no padding");
#if defined(__clang__) || defined(__GNUC__)
#define SP_ARGS_AT(field, at) static_assert(__builtin_offsetof(sp_args, field) == (at), #field);
#else
#define SP_ARGS_AT(field, at)
#endif
SP_ARGS_AT(shape, 0)
SP_ARGS_AT(k, 8)
SP_ARGS_AT(draft_ids, 16)
SP_ARGS_AT(draft_probs, 24)
SP_ARGS_AT(target_probs, 32)
SP_ARGS_AT(seed, 40)
SP_ARGS_AT(offset, 48)
SP_ARGS_AT(eps, 56)
SP_ARGS_AT(delta, 64)
SP_ARGS_AT(accepted, 72)
SP_ARGS_AT(tokens, 80)
SP_ARGS_AT(stats, 88)
SP_ARGS_AT(scratch, 96)
SP_ARGS_AT(cu_num_draft_tokens, 104)
SP_ARGS_AT(bonus, 112)
SP_ARGS_AT(target_logits, 120)
SP_ARGS_AT(temperature, 128)
SP_ARGS_AT(sampling, 136)
SP_ARGS_AT(recovered, 144)
SP_ARGS_AT(draft_first_row, 152)
SP_ARGS_AT(first_child, 160)
SP_ARGS_AT(next_sibling, 168)
SP_ARGS_AT(path, 176)
SP_ARGS_AT(slices, 184)
SP_ARGS_AT(reserved, 188)
#undef SP_ARGS_AT

// Shape words (device memory, 8 x u32).
// A device function compiled once and called (not inlined at every call site): the logits
// entries' row passes, each instantiated for every row kind and format (sp_*_any), would
// otherwise be copied into every call site, and ptxas time grows with the copies (134 s and 3 GB
// for one entry on sm_90 before this). The host shim defines it as nothing.
#ifndef SP_NOINLINE
#define SP_NOINLINE __noinline__
#endif
#define SP_SHAPE_BATCH 0
#define SP_SHAPE_K_MAX 1
#define SP_SHAPE_VOCAB 2
#define SP_SHAPE_DRAFT_STRIDE 3
#define SP_SHAPE_TARGET_STRIDE 4
#define SP_SHAPE_METHOD 5
#define SP_SHAPE_COUNTERS_K 6
#define SP_SHAPE_FLAGS 7
#define SP_FLAG_DRAFT_PROBS 1u
// Half-precision inputs (the logits entries only; a plain entry refuses them with SP_ERR_SHAPE):
// the target tensor the entry reads (target logits, else target probabilities) or the draft
// probabilities hold bf16 / f16 bit patterns (u16 elements, strides in elements), widened
// exactly to binary32 on read (DETERMINISM.md, "Half-precision inputs"). At most one of each pair.
#define SP_FLAG_TARGET_BF16 2u
#define SP_FLAG_TARGET_F16 4u
#define SP_FLAG_DRAFT_BF16 8u
#define SP_FLAG_DRAFT_F16 16u
#define SP_FLAGS_ALL 31u

#define SP_METHOD_REJECTION 0u
#define SP_METHOD_GREEDY 1u
#define SP_METHOD_TYPICAL 2u

// Error-flag bits (the word after the counters); ORed, never cleared by the kernel.
#define SP_ERR_SHAPE 1u     // shape words invalid (or batch > grid): the whole launch did nothing
#define SP_ERR_DRAFT_LEN 2u // some request had k > k_max: it was skipped
#define SP_ERR_TOKEN 4u     // some request had a draft id >= V: it was skipped
// (8 is specula_tree.cu's SP_ERR_TREE.)
#define SP_ERR_PARAM 16u    // some request had a per-request input the kernel refuses (a method
                            // code above 2, top_p outside (0, 1], min_p outside [0, 1], NaN
                            // included): it was skipped

#define SP_SENTINEL 0xFFFFFFFFu

// ---------------------------------------------------------------- exact numerics
__device__ __forceinline__ float sp_f(sp_u32 bits) { return __uint_as_float(bits); }

// float -> i32 / i64 as Rust's `as`: truncation, saturating, NaN -> 0 (C++ leaves these undefined).
__device__ __forceinline__ sp_i32 sp_f2i32(float x) {
    if (!(x == x)) return 0;
    if (x >= 2147483648.0f) return 2147483647;
    if (x < -2147483648.0f) return (sp_i32)(-2147483647 - 1);
    return (sp_i32)x;
}
// sp_f2i32 in one instruction on CUDA devices: PTX cvt.rzi.s32.f32 is exactly Rust's `as`
// (truncation, saturation, NaN -> 0; see sp_f2i64). Elsewhere sp_f2i32 itself.
__device__ __forceinline__ sp_i32 sp_f2i32_fast(float x) {
#if defined(__CUDA_ARCH__)
    return __float2int_rz(x);
#else
    return sp_f2i32(x);
#endif
}
// RN(a b + c), one rounding (IEEE fusedMultiplyAdd). Only where a comment proves the fused
// result is the one the rules' separate operations give (DETERMINISM.md: no contraction). The
// kernel is compiled with contraction off everywhere (NVRTC --fmad=false, the host shim
// -ffp-contract=off); this is the one way in. On CUDA devices an inline-asm block of the one
// instruction: backend-cuda's toolchain test allows FMAs in the PTX only inside such blocks
// (and ln_p's series division), so a contraction anywhere else still fails it.
__device__ __forceinline__ float sp_fma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
    float r;
    asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(r) : "f"(a), "f"(b), "f"(c));
    return r;
#else
    return __builtin_fmaf(a, b, c);
#endif
}
// float -> u64 for x >= 0 (not NaN): truncation, 2^64 - 1 from 2^64 up (PTX cvt.rzi.u64.f32 on
// CUDA devices, which saturates; an explicit test elsewhere, where C++ leaves it undefined).
__device__ __forceinline__ sp_u64 sp_f2u64_sat(float x) {
#if defined(__CUDA_ARCH__)
    return __float2ull_rz(x);
#else
    return x >= 18446744073709551616.0f ? 0xFFFFFFFFFFFFFFFFull : (sp_u64)x;
#endif
}
__device__ __forceinline__ sp_i64 sp_f2i64(float x) {
#if defined(__CUDA_ARCH__)
    // PTX cvt.rzi.s64.f32 is exactly Rust's `as`: truncation, saturation to the i64 range, and
    // NaN -> 0 (PTX ISA, "cvt": float-to-integer conversions clamp, NaN converts to 0). One
    // instruction instead of three compares and branches in the entropy's hot loop.
    return __float2ll_rz(x);
#else
    if (!(x == x)) return 0;
    if (x >= 9223372036854775808.0f) return 9223372036854775807LL;
    if (x < -9223372036854775808.0f) return (sp_i64)(-9223372036854775807LL - 1);
    return (sp_i64)x;
#endif
}

// ln_p(x) for normal, positive, finite x (DETERMINISM.md). The sign bit of such an x is 0, so
// bits >> 23 is the biased exponent itself (the rule's "& 0xFF" changes nothing).
__device__ __forceinline__ float sp_ln(float x) {
    sp_u32 bits = __float_as_uint(x);
    sp_i32 e = (sp_i32)(bits >> 23) - 127;
    float m = __uint_as_float((bits & 0x007FFFFFu) | 0x3F800000u);
    if (m > sp_f(0x3FB504F3u)) {
        m = m * 0.5f;
        e = e + 1;
    }
    float s = (m - 1.0f) / (m + 1.0f);
    float z = s * s;
    float q = sp_f(0x3E638E39u);
    float t;
    t = z * q; q = sp_f(0x3E924925u) + t;
    t = z * q; q = sp_f(0x3ECCCCCDu) + t;
    t = z * q; q = sp_f(0x3F2AAAABu) + t;
    t = z * q; q = 2.0f + t;
    float a = (float)e * sp_f(0x3F317218u);
    float b = s * q;
    return a + b;
}

// exp_p(x) for x <= 0 (DETERMINISM.md). Integer steps wrap like Rust release builds.
// Written without branches, the same value as the rules' early returns: every step is computed
// for any x (float operations and the saturating conversion are defined for every input, and
// the power of two's integer steps wrap), then the range cases select their results in the
// rules' order of precedence (!(x > -87) first, then x > 88). The rules' third case, n < -126,
// needs no select: x > -87 (so x >= -86.999992) gives t >= -125.5145, t - 0.5 >= -126.0145 and
// n >= -126, so n < -126 only where !(x > -87) already gives 0. The rules' `t - 0.5` is
// `t + (-0.5)` exactly (IEEE subtraction is the addition of the negation), and the sign of +-0.5
// is t's sign bit (one bit operation): the two differ from `t < 0` only at t = -0, where both
// sums truncate to n = 0. With the early returns ptxas branched six times per element (the
// range tests and sp_f2i32's).
// The rules' (x - n C1) - n C2 takes one fused step for its first half: n C1 is exact wherever
// the result is used (x in (-87, 88], so |n| <= 127: 7 bits times C1's 15 significant bits,
// 0x3F317200), so RN(x - RN(n C1)) = RN(x - n C1) = fma(-n, C1, x); elsewhere the range cases
// replace the result.
// exp_p's steps up to the polynomial: n and p, exp_p(x) = p 2^n in its range. hb holds the bits
// of 0.5 (0x3F000000; a register the caller keeps makes the +-0.5 one logic operation).
__device__ __forceinline__ float sp_exp_poly(float x, sp_u32 hb, sp_i32& n) {
    const float t = x * sp_f(0x3FB8AA3Bu);
    const float half = __uint_as_float(hb | (__float_as_uint(t) & 0x80000000u)); // +-0.5
    n = sp_f2i32_fast(t + half);
    const float nf = (float)n;
    const float r2 = nf * sp_f(0x35BFBE8Eu);
    const float r = sp_fma(-nf, sp_f(0x3F317200u), x) - r2;
    float p = sp_f(0x3AB60B61u);
    float t2;
    t2 = r * p; p = sp_f(0x3C088889u) + t2;
    t2 = r * p; p = sp_f(0x3D2AAAABu) + t2;
    t2 = r * p; p = sp_f(0x3E2AAAABu) + t2;
    t2 = r * p; p = 0.5f + t2;
    t2 = r * p; p = 1.0f + t2;
    t2 = r * p; p = 1.0f + t2;
    return p;
}
__device__ __forceinline__ float sp_exp(float x) {
    sp_i32 n;
    const float p = sp_exp_poly(x, 0x3F000000u, n);
    float v = p * __uint_as_float(((sp_u32)n + 127u) << 23);
    // Not in DETERMINISM.md (which defines x <= 0 only) but in the Rust reference: above 88 the
    // power of two would not be a normal float. Only reachable with a negative "entropy", i.e.
    // target rows that are not probabilities.
    v = x > 88.0f ? sp_f(0x7F800000u) : v;
    return x > -87.0f ? v : 0.0f; // also NaN -> 0
}
// exp_p(x) 2^64 for the sum pass, for x <= 0 or NaN (there x = z - m with z <= m: m is the row's
// largest quotient): the value whose floor sp_soft_fixed_w takes, p 2^(n + 64) in one multiply.
// The same floor as floor(exp_p(x) 2^64), and >= 2^64 exactly when exp_p(x) >= 1: for x in
// (-87, 0], n is in [-126, 0] (t <= 0 gives t +- 0.5 <= 0.5, see sp_exp for the lower end), so
// 2^(n + 64) is normal and p 2^(n + 64) (p in [0.7, 1.5]) is p exactly scaled; when p 2^n is
// normal it is exp_p(x) exactly scaled, and when it is not (exp_p(x) < 2^-126 or its rounding
// up to 2^-126) both values are below 2^-61 and floor to 0. !(x > -87) (NaN too) gives 0, as
// exp_p does; the rules' x > 88 case cannot occur.
__device__ __forceinline__ float sp_exp_w(float x, sp_u32 hb) {
    sp_i32 n;
    const float p = sp_exp_poly(x, hb, n);
    const float v = p * __uint_as_float(((sp_u32)n + 191u) << 23);
    return x > -87.0f ? v : 0.0f;
}

// An empty asm that takes x and gives it back: the compiler can no longer recompute x from what
// it was made of, so a loop-invariant value stays in a register instead of being recomputed in
// every iteration (ptxas otherwise re-adds the Weyl constants to the seed per block of 4 draws).
// No effect on any value; CUDA device code only.
#if defined(__CUDA_ARCH__)
#define SP_KEEP_IN_REGISTER(x) asm volatile("" : "+r"(x))
#else
#define SP_KEEP_IN_REGISTER(x) ((void)0)
#endif

// Philox4x32-10's key schedule: the round keys of key (k0, k1), computed once per row pass (the
// keys are the request's seed, the same for every id) instead of once per block of 4 draws.
struct sp_keys {
    sp_u32 k0[10];
    sp_u32 k1[10];
};
__device__ __forceinline__ sp_keys sp_key_schedule(sp_u32 k0, sp_u32 k1) {
    sp_keys ks;
    for (int round = 0; round < 10; ++round) {
        ks.k0[round] = k0;
        ks.k1[round] = k1;
        // Only the k0 half: keeping all 20 round keys costs ptxas ~25 registers and an SM
        // block of occupancy (measured with scripts/kernel-report.py), k0 alone fits.
        SP_KEEP_IN_REGISTER(ks.k0[round]);
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    return ks;
}

// Philox4x32-10 on counter c with a precomputed key schedule; c is replaced by the output block.
// The high and low words of each product come from __umulhi and a 32-bit multiply (one wide
// multiply on the device), not from a 64-bit product the compiler would widen and split again.
__device__ __forceinline__ void sp_philox_ks(sp_u32 c[4], const sp_keys& ks) {
    for (int round = 0; round < 10; ++round) {
        const sp_u32 hi0 = __umulhi(0xD2511F53u, c[0]), lo0 = 0xD2511F53u * c[0];
        const sp_u32 hi1 = __umulhi(0xCD9E8D57u, c[2]), lo1 = 0xCD9E8D57u * c[2];
        sp_u32 n0 = hi1 ^ c[1] ^ ks.k0[round];
        sp_u32 n2 = hi0 ^ c[3] ^ ks.k1[round];
        c[0] = n0; c[1] = lo1; c[2] = n2; c[3] = lo0;
    }
}

// The race's draws: Philox4x32-10 on counter (g, (position << 2) | stream, off_lo, off_hi) with
// the key schedule ks; c receives the output block.
__device__ __forceinline__ void sp_race_words(sp_u32 c[4], const sp_keys& ks, sp_u32 g,
                                              sp_u32 position, sp_u32 stream, sp_u32 off_lo,
                                              sp_u32 off_hi) {
    c[0] = g;
    c[1] = (position << 2) | stream;
    c[2] = off_lo;
    c[3] = off_hi;
    sp_philox_ks(c, ks);
}
__device__ __forceinline__ void sp_keys_init(sp_keys& ks, sp_u32 k0, sp_u32 k1, sp_u32 position,
                                             sp_u32 off_lo, sp_u32 off_hi, sp_u32 g_step,
                                             sp_u32 groups = 0u, sp_u32 full = 0u) {
    (void)g_step;
    (void)groups;
    (void)full;
    (void)position;
    (void)off_lo;
    (void)off_hi;
    ks = sp_key_schedule(k0, k1);
}
// The same draws for a row loop without registers to spare (the any-format race,
// sp_race_part_any, compiled inside each logits entry under its register cap): the words that
// are the same for every id (key, stream position, offset) in shared memory, read where each draw
// needs them (volatile: not hoisted out of the loop into registers), and the round keys added on
// the way. Without this the loop kept the 20 round keys and those words in local memory and
// reloaded them for every draw (docs/PERFORMANCE.md, "The logits entries' spills").
struct sp_key_shared {
    // key k0, k1, position << 2, off_lo, off_hi, the row loop's g_step, and for a half row's loop
    // (sp_race_scan's HALF) its groups and whole groups (sp_keys_groups, sp_keys_full)
    const volatile sp_u32* w;
};
__device__ __forceinline__ void sp_keys_init(sp_key_shared& ks, sp_u32 k0, sp_u32 k1,
                                             sp_u32 position, sp_u32 off_lo, sp_u32 off_hi,
                                             sp_u32 g_step, sp_u32 groups = 0u, sp_u32 full = 0u) {
    // Written by thread 0 after every thread's last read of the previous race (the block
    // reductions that end it have barriers), read after this barrier.
    __shared__ sp_u32 s_words[8];
    if (threadIdx.x == 0) {
        s_words[0] = k0;
        s_words[1] = k1;
        s_words[2] = position << 2;
        s_words[3] = off_lo;
        s_words[4] = off_hi;
        s_words[5] = g_step; // the same for every thread of the block
        s_words[6] = groups;
        s_words[7] = full;
    }
    __syncthreads();
    ks.w = s_words;
}
__device__ __forceinline__ void sp_race_words(sp_u32 c[4], const sp_key_shared& ks, sp_u32 g,
                                              sp_u32 position, sp_u32 stream, sp_u32 off_lo,
                                              sp_u32 off_hi) {
    (void)position;
    (void)off_lo;
    (void)off_hi;
    sp_u32 k0 = ks.w[0], k1 = ks.w[1];
    c[0] = g;
    c[1] = ks.w[2] | stream;
    c[2] = ks.w[3];
    c[3] = ks.w[4];
    // sp_philox_ks's rounds with the keys added here (its text, not a shared helper: a helper
    // changed the plain entries' PTX).
    for (int round = 0; round < 10; ++round) {
        const sp_u32 hi0 = __umulhi(0xD2511F53u, c[0]), lo0 = 0xD2511F53u * c[0];
        const sp_u32 hi1 = __umulhi(0xCD9E8D57u, c[2]), lo1 = 0xCD9E8D57u * c[2];
        sp_u32 n0 = hi1 ^ c[1] ^ k0;
        sp_u32 n2 = hi0 ^ c[3] ^ k1;
        c[0] = n0; c[1] = lo1; c[2] = n2; c[3] = lo0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
}

// The row loop's group step (the same for every thread of the block), read where the loop
// needs it: for the any-format race (sp_race_scan) from shared memory, so that it is not one more value kept
// live through the loop (it was the value the loop spilled and reloaded per tile, on sm_90).
__device__ __forceinline__ sp_u32 sp_keys_step(const sp_keys&, sp_u32 g_step) { return g_step; }
__device__ __forceinline__ sp_u32 sp_keys_step(const sp_key_shared& ks, sp_u32 g_step) {
    (void)g_step;
    return ks.w[5];
}
// A half row's loop bounds (sp_race_scan's HALF: the row's groups, and its whole groups `full`),
// read where the loop tests them: from shared memory for the any-format race (in the logits
// entries ptxas kept both in local memory and reloaded them at every tile).
__device__ __forceinline__ sp_u32 sp_keys_groups(const sp_keys&, sp_u32 groups) { return groups; }
__device__ __forceinline__ sp_u32 sp_keys_groups(const sp_key_shared& ks, sp_u32 groups) {
    (void)groups;
    return ks.w[6];
}
__device__ __forceinline__ sp_u32 sp_keys_full(const sp_keys&, sp_u32 full) { return full; }
__device__ __forceinline__ sp_u32 sp_keys_full(const sp_key_shared& ks, sp_u32 full) {
    (void)full;
    return ks.w[7];
}
// Whether the race's cold region draws its stream-1 words again (sp_race_group): for the
// shared-key race only (and of it the any-format race, sp_race_group), whose loop has no
// registers to keep them in.
__device__ __forceinline__ bool sp_keys_redraw(const sp_keys&) { return false; }
__device__ __forceinline__ bool sp_keys_redraw(const sp_key_shared&) { return true; }

// Philox4x32-10 on counter c, key (k0, k1); c is replaced by the output block.
__device__ __forceinline__ void sp_philox(sp_u32 c[4], sp_u32 k0, sp_u32 k1) {
    const sp_keys ks = sp_key_schedule(k0, k1);
    sp_philox_ks(c, ks);
}

// ---------------------------------------------------------------- random variates (binary64)
__device__ __forceinline__ double sp_d(sp_u64 bits) { return __longlong_as_double((long long)bits); }

// E = -ln(1 - v), v = (x + 1/2) 2^-64: the race's exponential variate of the 64-bit draw x
// (DETERMINISM.md, "Race draws"). Positive and finite for every x.
__device__ __forceinline__ double sp_exponential(sp_u64 x) {
    double t;
    if (x < (1ull << 62)) {
        const double v = ((double)x + 0.5) * sp_d(0x3BF0000000000000ull); // 2^-64
        const double s = v / (2.0 - v);
        const double z = s * s;
        double q = sp_d(0x3FAE1E1E1E1E1E1Eull); // 1/17
        t = z * q; q = sp_d(0x3FB1111111111111ull) + t; // 1/15
        t = z * q; q = sp_d(0x3FB3B13B13B13B14ull) + t; // 1/13
        t = z * q; q = sp_d(0x3FB745D1745D1746ull) + t; // 1/11
        t = z * q; q = sp_d(0x3FBC71C71C71C71Cull) + t; // 1/9
        t = z * q; q = sp_d(0x3FC2492492492492ull) + t; // 1/7
        t = z * q; q = sp_d(0x3FC999999999999Aull) + t; // 1/5
        t = z * q; q = sp_d(0x3FD5555555555555ull) + t; // 1/3
        t = z * q; q = 1.0 + t;
        return (s + s) * q;
    }
    const double u = ((double)(~x) + 0.5) * sp_d(0x3BF0000000000000ull);
    const sp_u64 bits = (sp_u64)__double_as_longlong(u);
    sp_i32 e = (sp_i32)((bits >> 52) & 0x7FFull) - 1023;
    double m = sp_d((bits & 0x000FFFFFFFFFFFFFull) | 0x3FF0000000000000ull);
    if (m > sp_d(0x3FF6A09E667F3BCDull)) { // sqrt(2)
        m = m * 0.5;
        e = e + 1;
    }
    const double s = (m - 1.0) / (m + 1.0);
    const double z = s * s;
    double q = sp_d(0x3FAAF286BCA1AF28ull); // 1/19
    t = z * q; q = sp_d(0x3FAE1E1E1E1E1E1Eull) + t;
    t = z * q; q = sp_d(0x3FB1111111111111ull) + t;
    t = z * q; q = sp_d(0x3FB3B13B13B13B14ull) + t;
    t = z * q; q = sp_d(0x3FB745D1745D1746ull) + t;
    t = z * q; q = sp_d(0x3FBC71C71C71C71Cull) + t;
    t = z * q; q = sp_d(0x3FC2492492492492ull) + t;
    t = z * q; q = sp_d(0x3FC999999999999Aull) + t;
    t = z * q; q = sp_d(0x3FD5555555555555ull) + t;
    t = z * q; q = 1.0 + t;
    const double ln_m = (s + s) * q;
    const double ef = (double)e;
    const double hi = ef * sp_d(0x3FE62E42FEE00000ull); // ln 2, high part (exact product)
    const double lo = ef * sp_d(0x3DEA39EF35793C76ull); // ln 2, low part
    const double rest = lo + ln_m;
    const double ln_u = hi + rest;
    return -ln_u;
}

// Rejection sampling's test: U = ((x >> 11) | 1) 2^-53 from the 64-bit stream-0 draw; accept iff
// U pd < pt in binary64 (NaN rejects).
__device__ __forceinline__ bool sp_accepts(sp_u64 x, float pt, float pd) {
    const double u = (double)((x >> 11) | 1ull) * sp_d(0x3CA0000000000000ull); // 2^-53
    return u * (double)pd < (double)pt;
}

// ---------------------------------------------------------------- softmax (target logits)
// The softmax of one logit row at temperature T > 0 (DETERMINISM.md, "Target logits and
// temperature"): z = l / T, m = max z (NaN never wins), e = exp_p(z - m), F = the exact integer
// sum of floor(e 2^64), S = (F as f64) 2^-64, p = ((e as f64) / S) as f32 (0 when F = 0).
// The row is never materialised: every pass that reads a target value calls sp_soft_p on it.
struct sp_soft {
    float t;  // temperature, > 0
    float m;  // max over the row of l / t
    double s; // S (with a sampling filter: the kept mass, DETERMINISM.md "Sampling filters")
    // The logits entries only (the plain entries and the report's probes leave them unset):
    sp_u32 theta; // the filter's threshold on the weights' keys (0: every id kept)
    sp_u32 kind;  // how the row is processed: SP_P_* below
    sp_u32 tf;    // target format (SP_FMT_*)
    sp_u32 df;    // draft format
};
// ---- the quotient RN(l / t) without a division per id (the softmax's sum pass)
// Per row (sp_rcp_of): y = RN(1 / t), one IEEE division, and y_lo = RN(fma(-t, y, 1) y). Per id
// (sp_quot), four operations:
//   p = RN(l y_lo),  q0 = RN(l y + p),  r = RN(l - t q0),  q = RN(q0 + r y)   (the last three fused)
// Claim: when rc.ok (2^-16 <= t <= 2^16 and |m| <= 2^80, NaN failing both) and m is the row's
// largest quotient (RN(l / t) <= m for every l of the row, as sp_softmax_max_part gives m),
// exp_p(q - m) = exp_p(RN(l / t) - m) for every l of the row, NaN and infinities included, and
// q = RN(l / t) itself where 2^-70 <= |l / t| <= 2^100. Proof (binary32: p = 24, emin = -126;
// Q = l / t, the real quotient; u = 2^-24):
// (1) 2^-70 <= |Q| <= 2^100: q = RN(Q). y is normal and within half an ulp of 1 / t, so
//     |1 - t y| <= u. rho = 1 - t y is exactly representable (the residual of a correctly rounded
//     reciprocal, e_t + e_y >= -1 >= emin + p - 1), so fma(-t, y, 1) = rho, and y + rho / t = 1 / t.
//     y_lo = rho y (1 + d1) with |d1| <= 2u (the roundings of y and of the product; rho = 0 when t
//     is a power of two: y_lo = 0, y = 1 / t exactly). Hence l y + l y_lo = Q (1 + d) with |d| <=
//     |rho| 2u <= 2u^2, and p = RN(l y_lo) adds at most |l y_lo| u + 2^-150 <= |Q| 1.01 u^2 + 2^-150
//     (2^-150: p subnormal). So |l y + p - Q| <= 3.01 u^2 |Q| + 2^-150 < 2^-20 ulp(Q) (ulp(Q) >
//     u |Q| and ulp(Q) >= 2^-93), and q0 = RN(l y + p) is within ulp(Q) / 2 + 2^-20 ulp(Q) of Q: one
//     of the two binary32 numbers around Q (faithful), and normal. Markstein's theorem (P.
//     Markstein, IBM J. Res. Dev. 34(1), 1990; machine-checked by D. Russinoff, ACL2 "markstein",
//     and J. Harrison for the IA-64 division): |1 - t y| <= 2^-p and q0 faithful give r = l - t q0
//     exactly representable and RN(q0 + r y) = RN(l / t), barring underflow and overflow: r's
//     exactness needs e_t + e_q0 >= emin + p - 1 = -103 (here >= -16 - 71 = -87); |r| <= t ulp(Q)
//     and |r y| <= 2 ulp(Q) are far from overflow (|Q| <= 2^100, t <= 2^16), and the fused
//     q0 + r y rounds once, so q = fma(r, y, q0) = RN(Q).
// (2) |Q| < 2^-70 (zeros included): |z| <= 2^-70 for z = RN(Q), and |q| < 2^-69 (as in (1), q0
//     is within 2^-20 |Q| + 2^-149 of Q, |r y| within 1.01 times that plus 2^-133). If |m| >=
//     2^-40, RN(x - m) = -m for |x| < 2^-67, a quarter of the smallest gap around m (ulp(m) / 2 >=
//     2^-65), so z - m and q - m both round to -m. If |m| < 2^-40, both differences have magnitude
//     below 2^-39, where exp_p is 1 (|x| < 2^-25: n = 0, r = x, the polynomial's last step RN(1 + x
//     (1 + ..)) = 1, whatever the sign of a zero). Either way the same exp_p.
// (3) Q > 2^100 cannot happen: RN(Q) <= m <= 2^80. Q < -2^100 (finite l): z - m < -2^99 and exp_p
//     gives 0; q is -inf, or NaN (an infinite intermediate: l y overflows to -inf, then r = +inf
//     and q = +inf - inf), or finite within 2^-20 relatively of Q as in (1), below -2^99: exp_p of
//     q - m is 0 (NaN and anything below -87 give 0).
// (4) l = -inf: z - m = -inf, exp_p 0; q is NaN (p is NaN when y_lo = 0, else +-inf; q0 is -inf or
//     NaN; r = fma(+inf, t, -inf) = NaN), exp_p 0. l = NaN: both NaN, 0. l = +inf: RN(+inf / t) =
//     +inf > m, excluded by the premise (q would be NaN, 0, where exp_p(+inf - m) is +inf).
// Attacked on the host (tests/tests/it/kernel_host_softmax.rs): sp_quot against the IEEE division
// bit for bit over whole binades of logits and near-midpoint quotients at temperatures across
// the range and at its edges, the pass's terms against the rules' for hostile logits, and the
// cases that fail outside the range (a subnormal temperature, whose y overflows; l = +inf).
struct sp_rcp {
    float y;   // RN(1 / t)
    float ylo; // RN(RN(1 - t y) y)
    bool ok;   // the row is in the range of the proof above
};
__device__ __forceinline__ sp_rcp sp_rcp_of(float t, float m) {
    sp_rcp rc;
    rc.y = 1.0f / t;
    rc.ylo = sp_fma(-t, rc.y, 1.0f) * rc.y;
    const float am = __uint_as_float(__float_as_uint(m) & 0x7FFFFFFFu); // |m|; NaN stays NaN
    rc.ok = t >= sp_f(0x37800000u) && t <= sp_f(0x47800000u) && am <= sp_f(0x67800000u); // 2^-16, 2^16, 2^80
    return rc;
}
__device__ __forceinline__ float sp_quot(float l, float t, const sp_rcp& rc) {
    const float p = l * rc.ylo;
    const float q0 = sp_fma(l, rc.y, p);
    const float r = sp_fma(-q0, t, l);
    return sp_fma(r, rc.y, q0);
}
// The same quotient from y alone (no y_lo: for loops that take e per id through sp_soft_e, where
// ptxas recomputes y_lo's fused step per id instead of once per tile), five operations:
//   q0 = RN(l y),  q1 = RN(q0 + RN(l - t q0) y),  q = RN(q1 + (l - t q1) y)   (the last three fused)
// Under the same premises, the same claim. In (1), q0 = RN(l y) is within ulp(Q) / 2 + |Q| u <
// 1.5 ulp(Q) of Q (not always faithful); r0 = RN(l - t q0) = -t e0 (1 + d), e0 = q0 - Q, |d| <= u
// (r0 subnormal: within 2^-150 instead, which adds at most 2^-134 below), so q0 + r0 y = Q +
// e0 (1 - t y (1 + d)) with |1 - t y (1 + d)| <= 2.01 u: within 2^-21 ulp(Q) of Q, and q1, its
// rounding, is faithful; Markstein's theorem then gives q = RN(Q) (r1 exact: e_t + e_q1 >= -87).
// (2) to (4) as above: |q| < 2^-69 for |Q| < 2^-70 (each step adds at most 2^-20 relatively and
// 2^-134); for Q < -2^100 and l = -inf, q0 = -inf gives r0 = +inf and q1 = NaN, anything finite
// stays within 2^-20 of Q relatively.
__device__ __forceinline__ float sp_quot2(float l, float t, float y) {
    const float q0 = l * y;
    const float q1 = sp_fma(sp_fma(-q0, t, l), y, q0);
    return sp_fma(sp_fma(-q1, t, l), y, q1);
}
// e = exp_p(RN(l / t) - m) for a logit l of the row whose largest quotient is m (every caller's
// m: the row's softmax state). The quotient without a division in the proven range, sp_quot2:
// the reciprocal and the range test depend on t and m only, the same for every id of a row
// pass, and the compiler computes the reciprocal once per row (hoisted out of the loops).
__device__ __forceinline__ float sp_soft_e(float l, float t, float m) {
    const sp_rcp rc = sp_rcp_of(t, m);
    if (rc.ok) return sp_exp(sp_quot2(l, t, rc.y) - m);
    SP_COLD_MARK(); // rows outside the proven range: the division
    return sp_exp(l / t - m);
}
__device__ __forceinline__ float sp_soft_p(float l, const sp_soft& st) {
    const float e = sp_soft_e(l, st.t, st.m);
    return st.s == 0.0 ? 0.0f : (float)((double)e / st.s);
}
// How a stored target row becomes the probabilities the method reads (the passes' template
// parameter P, DETERMINISM.md "Sampling filters", renormalisation):
//   SP_P_RAW      the stored values (probabilities without a filter, logits at T = 0);
//   SP_P_SOFT     logits at T > 0, every id kept: sp_soft_p (the code the filters predate);
//   SP_P_SOFT_CUT logits at T > 0 with a threshold: e = exp_p(l / T - m); 0 if the key of e
//                 (its bits: e >= 0) is below theta, else (e / S) with S the kept mass;
//   SP_P_CUT      probabilities with a filter: the same on the stored value w, key(w) = bits of
//                 w if w > 0, else 0.
#define SP_P_RAW 0u
#define SP_P_SOFT 1u
#define SP_P_SOFT_CUT 2u
#define SP_P_CUT 3u
// SP_P_ANY: the kind read from the row's state at run time (st.kind, one of the four above),
// the only instantiation the logits entries use: one per kind multiplied the passes' code and
// the compile time (ptxas 134 s for one logits entry with four kinds; sm_90, whole module:
// 39 s with SP_P_SOFT kept apart, 24 s with SP_P_ANY alone, 20 s without the engine inputs).
// The numerics are the same either way: SP_P_ANY runs the kind's own operations. The tree
// kernel and the report's probes still instantiate single kinds.
#define SP_P_ANY 4u
// A state with every field given: the one initialiser of sp_soft.
__device__ __forceinline__ sp_soft sp_soft_of(float t, float m, double s, sp_u32 theta,
                                              sp_u32 kind, sp_u32 tf, sp_u32 df) {
    sp_soft st;
    st.t = t;
    st.m = m;
    st.s = s;
    st.theta = theta;
    st.kind = kind;
    st.tf = tf;
    st.df = df;
    return st;
}
// The state of a stored row (SP_P_RAW): the passes read only its formats.
__device__ __forceinline__ sp_soft sp_soft_raw(sp_u32 tf, sp_u32 df) {
    return sp_soft_of(1.0f, 0.0f, 0.0, 0u, SP_P_RAW, tf, df);
}
// Whether the row holds logits at T > 0 (its pad past the row's end is -inf, e = 0).
template <sp_u32 P>
__device__ __forceinline__ bool sp_lg(const sp_soft* st) {
    return P == SP_P_ANY ? (st->kind == SP_P_SOFT || st->kind == SP_P_SOFT_CUT)
                         : (P == SP_P_SOFT || P == SP_P_SOFT_CUT);
}
__device__ __forceinline__ sp_u32 sp_wkey(float w) { return w > 0.0f ? __float_as_uint(w) : 0u; }
template <sp_u32 P>
__device__ __forceinline__ float sp_proc(float x, const sp_soft& st) {
    if (P == SP_P_RAW) return x;
    if (P == SP_P_SOFT) return sp_soft_p(x, st);
    const sp_u32 kind = P == SP_P_ANY ? st.kind : P;
    if (kind == SP_P_RAW) return x;
    const bool lg = kind == SP_P_SOFT || kind == SP_P_SOFT_CUT;
    const float w = lg ? sp_soft_e(x, st.t, st.m) : x;
    // SP_P_SOFT's theta is 0: nothing is cut, and e / S is sp_soft_p's value.
    const bool cut = (lg ? __float_as_uint(w) : sp_wkey(w)) < st.theta;
    return cut || st.s == 0.0 ? 0.0f : (float)((double)w / st.s);
}
// sp_proc with the kind chosen at run time (single values: the acceptance tests).
__device__ __forceinline__ float sp_proc_any(float x, const sp_soft& st) { return sp_proc<SP_P_ANY>(x, st); }
// The order key of z for the maximum (unsigned order = float order; NaN as -inf; -0 as +0, the
// sign of a zero maximum changes nothing) and back.
__device__ __forceinline__ sp_u32 sp_max_key(float z) {
    sp_u32 b = __float_as_uint(z);
    if (!(z == z)) b = 0xFF800000u;
    if ((b & 0x7FFFFFFFu) == 0u) b = 0u;
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float sp_max_of_key(sp_u32 key) {
    return __uint_as_float((key & 0x80000000u) ? (key & 0x7FFFFFFFu) : ~key);
}
// floor(e 2^64) for e in [0, 1] (and +inf, which counts as 1: e = exp_p(..) is never NaN) as
// h 2^32 + l, the words of one 64-bit conversion: e < 1 gives W = floor(e 2^64) < 2^64 (e 2^64
// is exact in binary32, a power-of-two scaling of a normal or subnormal value, below 2^64, and
// the conversion truncates, so W is the floor), h += W >> 32 and l += W mod 2^32; e >= 1
// saturates the conversion to 2^64 - 1, and the 1 added to l makes it 2^64. Per-thread and
// per-block sums of h (each < 2^32) and of l (each <= 2^32) stay below 2^64 for any V < 2^32,
// so each is an exact, order-free u64 sum (plain or atomicAdd), and F = H 2^32 + L. The same
// F as the split by binary32 steps it replaces (2026-12-07), in one conversion instead of three.
__device__ __forceinline__ void sp_soft_fixed_w(float ew, sp_u64& h, sp_u64& l) {
    const sp_u64 w = sp_f2u64_sat(ew);
    h += w >> 32;
    l += (w & 0xFFFFFFFFull) + (ew >= 18446744073709551616.0f ? 1ull : 0ull);
}
// S = (F as f64) 2^-64 with F = H 2^32 + L as a 128-bit integer converted to nearest (ties to
// even), as Rust's `u128 as f64`: the top 64 bits with the lost bits ORed into the lowest one
// (a sticky bit well below the 53-bit rounding point), converted to nearest, times 2^n.
__device__ __forceinline__ double sp_soft_sum(sp_u64 hsum, sp_u64 lsum) {
    const sp_u64 lo = (hsum << 32) + lsum;
    const sp_u64 hi = (hsum >> 32) + (lo < lsum ? 1ull : 0ull);
    if (hi == 0ull) return (double)lo * sp_d(0x3BF0000000000000ull); // 2^-64
    sp_u32 n = 0u; // bits of hi: the shift that brings F into 64 bits
    for (sp_u64 t = hi; t != 0ull; t >>= 1) ++n;
    const sp_u64 top = (hi << (64u - n)) | (lo >> n) | ((lo & ((1ull << n) - 1ull)) != 0ull ? 1ull : 0ull);
    // 2^(n - 64) exactly: n <= 64.
    return (double)top * sp_d((sp_u64)(1023u + n - 64u) << 52);
}

// ---------------------------------------------------------------- reduction keys
// (key, id) packed in one u64 whose unsigned order is the order of DETERMINISM.md: larger key
// first, then LOWER id (the low word holds ~id). 0 is below every packed value: "none".
// -0.0 and +0.0 compare equal, so both map to +0.0 first.
__device__ __forceinline__ sp_u64 sp_pack(float key, sp_u32 id) {
    sp_u32 b = __float_as_uint(key);
    if ((b & 0x7FFFFFFFu) == 0u) b = 0u; // on the bits: no compiler may fold "-0 -> +0" away
    sp_u32 ord = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return ((sp_u64)ord << 32) | (sp_u64)(~id);
}
__device__ __forceinline__ sp_u32 sp_unpack_id(sp_u64 p) { return ~(sp_u32)p; }

// Block-wide max (is_max) or wrapping sum of one u64 per thread; every thread gets the result.
// Called by every thread of the block (block-uniform control flow).
__device__ __forceinline__ sp_u64 sp_block_reduce(sp_u64 v, bool is_max, sp_u64* s_red) {
    const sp_u32 ws = SPECULA_WARP_SIZE;
    for (sp_u32 d = ws / 2u; d > 0u; d >>= 1) {
        sp_u64 o = SPECULA_SHFL_DOWN(v, d);
        v = is_max ? (o > v ? o : v) : v + o;
    }
    const sp_u32 lane = threadIdx.x % ws;
    const sp_u32 warp = threadIdx.x / ws;
    const sp_u32 warps = (blockDim.x + ws - 1u) / ws;
    if (lane == 0u) s_red[warp] = v;
    __syncthreads();
    sp_u64 r = s_red[0];
    for (sp_u32 w = 1u; w < warps; ++w) {
        sp_u64 o = s_red[w];
        r = is_max ? (o > r ? o : r) : r + o;
    }
    __syncthreads(); // s_red is reused by the next reduction
    return r;
}

// ---------------------------------------------------------------- row passes
// Groups of 4 ids each thread loads before computing on any of them (loads hoisted ahead of the
// compute, so that many bytes are in flight per thread). Any value gives the same results; these
// are sized by scripts/kernel-report.py against the register budget (no spills in the loops).
// Fully unrolled loops over those groups keep their arrays in registers.
#if defined(__CUDACC__) || defined(__CUDACC_RTC__) || defined(__HIPCC__) || defined(__HIPCC_RTC__)
#define SP_UNROLLED _Pragma("unroll")
#elif defined(__GNUC__) && !defined(__clang__)
#define SP_UNROLLED _Pragma("GCC unroll 16")
#else
#define SP_UNROLLED
#endif
#ifndef SP_UNROLL_ARGMAX
#define SP_UNROLL_ARGMAX 4u
#endif
#ifndef SP_UNROLL_ENTROPY
#define SP_UNROLL_ENTROPY 4u
#endif
#ifndef SP_UNROLL_RACE
#define SP_UNROLL_RACE 2u
#endif
// The any-format race over a half row without a draft row (sp_race_part_any_half: the logits
// entries' races over half logits, filtered half rows and stored half values; the tree's half
// entry): tiles of SP_UNROLL_RACE_HALF groups of 8 bytes, 32 B per thread as the binary32
// race's SP_UNROLL_RACE groups of 16 (with 2 groups, 16 B: 12 KB per SM at the logits entries'
// 3 blocks). 6 groups (36 KB) spilled in the report's probe (docs/PERFORMANCE.md).
#ifndef SP_UNROLL_RACE_HALF
#define SP_UNROLL_RACE_HALF 4u
#endif
#ifndef SP_UNROLL_SOFTMAX
#define SP_UNROLL_SOFTMAX 4u
#endif
#ifndef SP_UNROLL_SOFTMAX_HALF
#define SP_UNROLL_SOFTMAX_HALF 8u
#endif
// A row is visited in groups of 4 ids (one Philox block each for the race): thread t takes groups
// t, t + blockDim, ...; a group is loaded as one float4 when the row is 16-byte aligned and the
// group is whole, else as scalars. Each result is order-independent, so the split never matters.

// A request the kernel skips (and does not count): its error bit, 0 when it is valid. k = 0 is
// valid (only the bonus token); k > k_max or a draft id outside the vocabulary is not. Both
// entry points check requests with this one function.
// `ids` is the request's first draft id; `bonus` its caller-supplied bonus token or null. In the
// ragged layout a decreasing cumulative count makes kb wrap far above k_max: DRAFT_LEN too.
__device__ __forceinline__ sp_u32 sp_request_error(const sp_u32* ids, sp_u32 kb, sp_u32 k_max,
                                                   sp_u32 vocab, const sp_u32* bonus) {
    if (kb > k_max) return SP_ERR_DRAFT_LEN;
    sp_u32 bad = 0u;
    for (sp_u32 j = 0; j < kb; ++j) {
        if (ids[j] >= vocab) bad = SP_ERR_TOKEN;
    }
    if (bonus != 0 && *bonus >= vocab) bad = SP_ERR_TOKEN;
    return bad;
}

// Where request b's inputs start (DETERMINISM.md, "Empty drafts and the ragged layout"): padded
// when cu is null (k[b] drafts, draft slot b k_max, target row b (k_max + 1)); ragged otherwise
// (k = cu[b] - cu[b - 1], draft slot cu[b - 1], target row cu[b - 1] + b, or cu[b - 1] when
// bonus tokens are given: the bonus rows are absent). Draft ids and draft rows start at the
// draft slot in both layouts.
// `sp_slot(lay, b, k_max)` is recomputed where used rather than kept (the padded entries then keep no
// more live registers than before the ragged layout existed).
struct sp_layout {
    sp_u32 kb;
    sp_u32 start; // ragged: cu[b - 1]
    bool ragged;
    sp_u64 trow;
};
__device__ __forceinline__ sp_u64 sp_slot(const sp_layout& l, sp_u32 b, sp_u32 k_max) {
    return l.ragged ? (sp_u64)l.start : (sp_u64)b * k_max;
}
__device__ __forceinline__ sp_layout sp_layout_of(const sp_u32* k, const sp_u32* cu,
                                                  const sp_u32* bonus, sp_u32 b, sp_u32 k_max) {
    sp_layout l;
    l.ragged = cu != 0;
    if (cu == 0) {
        l.kb = k[b];
        l.start = 0u;
        l.trow = (sp_u64)b * (k_max + 1u);
    } else {
        l.start = b == 0u ? 0u : cu[b - 1u];
        l.kb = cu[b] - l.start;
        l.trow = bonus != 0 ? (sp_u64)l.start : (sp_u64)l.start + b;
    }
    return l;
}

__device__ __forceinline__ bool sp_aligned16(const float* p) {
    return (((unsigned long long)(const void*)p) & 15ull) == 0ull;
}

// ---------------------------------------------------------------- half-precision inputs
// Element formats of a tensor (the logits entries' shape flags): 0 binary32, 1 bf16, 2 f16.
// A half row is addressed through the same `const float*` as a binary32 one, pointing at its
// first u16 element (sp_at); every value is widened exactly when read (DETERMINISM.md,
// "Half-precision inputs"), so everything after the read is the binary32 code.
#define SP_FMT_F32 0u
#define SP_FMT_BF16 1u
#define SP_FMT_F16 2u
// Compile-time format of a pass (template parameter FX): 0 binary32 only (the plain entries,
// unchanged code), 1 / 2 bf16 / f16 only (the report's probes), 3 any, chosen at run time.
#define SP_FX_ANY 3u
__device__ __forceinline__ sp_u32 sp_target_fmt(sp_u32 flags) {
    return (flags & SP_FLAG_TARGET_BF16) ? SP_FMT_BF16 : (flags & SP_FLAG_TARGET_F16) ? SP_FMT_F16 : SP_FMT_F32;
}
__device__ __forceinline__ sp_u32 sp_draft_fmt(sp_u32 flags) {
    return (flags & SP_FLAG_DRAFT_BF16) ? SP_FMT_BF16 : (flags & SP_FLAG_DRAFT_F16) ? SP_FMT_F16 : SP_FMT_F32;
}
// bf16: the high half of the binary32 pattern. f16: rebias 15 -> 127 for normal values, the
// all-ones exponent for infinities and NaN (payload kept), and a subnormal m 2^-24 as the exact
// product (float)m x 2^-24 (an integer below 2^10 times a power of two: a normal binary32, the
// same bits as DETERMINISM.md's leading-zero shift); then the sign.
__device__ __forceinline__ float sp_widen(sp_u32 h, sp_u32 fmt) {
    if (fmt == SP_FMT_BF16) return __uint_as_float(h << 16);
    const sp_u32 e = (h >> 10) & 0x1Fu;
    const sp_u32 m = h & 0x3FFu;
    sp_u32 r = e == 0x1Fu ? (0x7F800000u | (m << 13)) : (((e + 112u) << 23) | (m << 13));
    if (e == 0u) r = __float_as_uint((float)m * sp_f(0x33800000u)); // 2^-24; m = 0 gives +0
    return __uint_as_float(((h & 0x8000u) << 16) | r);
}
// Element idx of a tensor of format fmt, and value idx widened.
__device__ __forceinline__ const float* sp_at(const float* base, sp_u64 idx, sp_u32 fmt) {
    return fmt == SP_FMT_F32 ? base + idx
                             : reinterpret_cast<const float*>(reinterpret_cast<const unsigned short*>(base) + idx);
}
__device__ __forceinline__ float sp_rd(const float* base, sp_u64 idx, sp_u32 fmt) {
    return fmt == SP_FMT_F32 ? base[idx]
                             : sp_widen(reinterpret_cast<const unsigned short*>(base)[idx], fmt);
}
// Whole 4-id groups a vector load may read (16 bytes of binary32, 8 of half), 0 if misaligned.
__device__ __forceinline__ sp_u32 sp_full(const float* row, sp_u32 vocab, sp_u32 fmt) {
    const unsigned long long a = (unsigned long long)(const void*)row;
    return (a & (fmt == SP_FMT_F32 ? 15ull : 7ull)) == 0ull ? vocab / 4u : 0u;
}
// The 4 half values of one 8-byte load, widened (little-endian: id v0 in the low 16 bits).
__device__ __forceinline__ void sp_widen4(sp_u64 q, sp_u32 fmt, float out[4]) {
    for (sp_u32 i = 0; i < 4u; ++i) out[i] = sp_widen((sp_u32)(q >> (16u * i)) & 0xFFFFu, fmt);
}

// Ids past the row's end read as `pad`, a value chosen per pass so that it can never count
// (argmax: NaN, never above anything; entropy: 0, no term; race: 0, not a candidate): the hot
// loops then need no per-element bounds checks.
__device__ __forceinline__ void sp_load4(const float* row, sp_u32 v0, sp_u32 vocab, bool vec,
                                         float pad, float out[4]) {
    if (vec && v0 + 3u < vocab) {
        float4 q = *reinterpret_cast<const float4*>(row + v0);
        out[0] = q.x; out[1] = q.y; out[2] = q.z; out[3] = q.w;
    } else {
        for (sp_u32 i = 0; i < 4u; ++i) out[i] = (v0 + i < vocab) ? row[v0 + i] : pad;
    }
}
// sp_load4 for a row of any format (vec: the row is aligned for its format's vector load).
__device__ __forceinline__ void sp_load4_fmt(const float* row, sp_u32 v0, sp_u32 vocab, bool vec,
                                             float pad, float out[4], sp_u32 fmt) {
    if (fmt == SP_FMT_F32) {
        sp_load4(row, v0, vocab, vec, pad, out);
        return;
    }
    const unsigned short* h = reinterpret_cast<const unsigned short*>(row);
    if (vec && v0 + 3u < vocab) {
        sp_widen4(*reinterpret_cast<const sp_u64*>(h + v0), fmt, out);
    } else {
        for (sp_u32 i = 0; i < 4u; ++i) out[i] = (v0 + i < vocab) ? sp_widen(h[v0 + i], fmt) : pad;
    }
}

// One tile of a row pass: groups g0 + u g_step (u < U) into w[u][0..3]. `full` is the number of
// whole groups a float4 may load (vocab / 4 when the row is 16-byte aligned, else 0): when the
// tile's last group is below it, the whole tile is U float4 loads with one test (the hot path),
// else each group goes through sp_load4 (a row's tail). (U - 1) g_step + g0 stays far below 2^32
// (g0 < 2^30 groups, g_step <= blocks per request x block size).
// FX != 0 and fmt a half format: the same with 8-byte loads of 4 u16 (full from sp_full).
template <sp_u32 U, sp_u32 FX = 0u>
__device__ __forceinline__ void sp_load_tile(const float* row, sp_u32 g0, sp_u32 g_step,
                                             sp_u32 vocab, sp_u32 full, float pad, float w[U][4],
                                             sp_u32 fmt = SP_FMT_F32) {
    if (FX != 0u && fmt != SP_FMT_F32) {
        if (g0 + (U - 1u) * g_step < full) {
            const sp_u64* p = reinterpret_cast<const sp_u64*>(row) + g0;
            SP_UNROLLED
            for (sp_u32 u = 0; u < U; ++u) sp_widen4(p[(sp_u64)u * g_step], fmt, w[u]);
        } else {
            SP_COLD_MARK();
            SP_UNROLLED
            for (sp_u32 u = 0; u < U; ++u)
                sp_load4_fmt(row, (g0 + u * g_step) * 4u, vocab, full != 0u, pad, w[u], fmt);
        }
        return;
    }
    if (g0 + (U - 1u) * g_step < full) {
        const float4* p = reinterpret_cast<const float4*>(row) + g0;
        SP_UNROLLED
        for (sp_u32 u = 0; u < U; ++u) {
            const float4 q = p[(sp_u64)u * g_step];
            w[u][0] = q.x; w[u][1] = q.y; w[u][2] = q.z; w[u][3] = q.w;
        }
    } else {
        SP_COLD_MARK(); // at most one tile per thread and row: the row's end
        SP_UNROLLED
        for (sp_u32 u = 0; u < U; ++u)
            sp_load4(row, (g0 + u * g_step) * 4u, vocab, full != 0u, pad, w[u]);
    }
}

// sp_load_tile for two rows at once (the residual race's target and draft rows), one test.
// FX != 0 and either row in a half format: each row through its own format (full: both rows
// aligned for theirs).
template <sp_u32 U, sp_u32 FX = 0u>
__device__ __forceinline__ void sp_load_tile2(const float* row, const float* row2, sp_u32 g0,
                                              sp_u32 g_step, sp_u32 vocab, sp_u32 full,
                                              float pad, float w[U][4], float w2[U][4],
                                              sp_u32 fmt = SP_FMT_F32, sp_u32 fmt2 = SP_FMT_F32) {
    if (FX != 0u && (fmt | fmt2) != SP_FMT_F32) {
        if (g0 + (U - 1u) * g_step < full) {
            SP_UNROLLED
            for (sp_u32 u = 0; u < U; ++u) {
                sp_load4_fmt(row, (g0 + u * g_step) * 4u, vocab, true, pad, w[u], fmt);
                sp_load4_fmt(row2, (g0 + u * g_step) * 4u, vocab, true, 0.0f, w2[u], fmt2);
            }
        } else {
            SP_COLD_MARK();
            SP_UNROLLED
            for (sp_u32 u = 0; u < U; ++u) {
                sp_load4_fmt(row, (g0 + u * g_step) * 4u, vocab, full != 0u, pad, w[u], fmt);
                sp_load4_fmt(row2, (g0 + u * g_step) * 4u, vocab, full != 0u, 0.0f, w2[u], fmt2);
            }
        }
        return;
    }
    if (g0 + (U - 1u) * g_step < full) {
        const float4* p = reinterpret_cast<const float4*>(row) + g0;
        const float4* p2 = reinterpret_cast<const float4*>(row2) + g0;
        SP_UNROLLED
        for (sp_u32 u = 0; u < U; ++u) {
            const float4 q = p[(sp_u64)u * g_step];
            const float4 q2 = p2[(sp_u64)u * g_step];
            w[u][0] = q.x; w[u][1] = q.y; w[u][2] = q.z; w[u][3] = q.w;
            w2[u][0] = q2.x; w2[u][1] = q2.y; w2[u][2] = q2.z; w2[u][3] = q2.w;
        }
    } else {
        SP_COLD_MARK(); // at most one tile per thread and row: the row's end
        SP_UNROLLED
        for (sp_u32 u = 0; u < U; ++u) {
            sp_load4(row, (g0 + u * g_step) * 4u, vocab, full != 0u, pad, w[u]);
            sp_load4(row2, (g0 + u * g_step) * 4u, vocab, full != 0u, 0.0f, w2[u]);
        }
    }
}

// Processed rows (P != 0, see sp_proc): the loaded values of a tile become the probabilities the
// method reads. Logits past the row's end were loaded as -inf (e = 0, p = 0), which no pass
// counts: no candidate in a race, no entropy term, and never strictly above an earlier id's
// p >= 0 in the argmax.
template <sp_u32 P, sp_u32 U>
__device__ __forceinline__ void sp_soft_tile(float w[U][4], const sp_soft* st) {
    if (P != SP_P_RAW) {
        SP_UNROLLED
        for (sp_u32 u = 0; u < U; ++u)
            for (sp_u32 i = 0; i < 4u; ++i) w[u][i] = sp_proc<P>(w[u][i], *st);
    }
}
#define SP_NEG_INF sp_f(0xFF800000u)

// The softmax's two row passes, each over groups g_first, g_first + g_step, ... and reduced over
// the block (every thread gets the block's result). The maximum: the order key (sp_max_key) of
// the largest l / t; ids past the row's end read as -inf (no effect). Computed as the key of
// (the largest l) / t, one division per row instead of one per id (as the CPU backend does):
// for t > 0, x -> RN(x / t) is monotone non-decreasing, sp_max_key orders by value (NaN as
// -inf, -0 as +0, on both sides: NaN / t is NaN, -inf / t is -inf, +-0 / t is +-0), so the key
// of the largest quotient is the key of the largest logit's quotient (19.7 -> 9.1 instructions
// per id on sm_90 in the logits entries). The binary32 instance, once inlined into the tree
// entry, kept the division per id there (ptxas spilled more with it); since the tree entry calls
// its softmax state out of line (sp_tree_state_f32) it takes the same one division per row.
// FX as for sp_load_tile: the row's format is `fmt` (the softmax probes: FX = 0, binary32).
// One thread's tiles of U groups (fmt as FX allows) into its largest key.
template <sp_u32 U, sp_u32 FX>
__device__ __forceinline__ sp_u32 sp_softmax_max_tiles(const float* row, sp_u32 vocab, sp_u32 g_first,
                                                       sp_u32 g_step, sp_u32 fmt) {
    const sp_u32 groups = (vocab + 3u) / 4u;
    const sp_u32 full = sp_full(row, vocab, fmt);
    const sp_u32 step = g_step * U;
    sp_u32 key = sp_max_key(SP_NEG_INF);
    for (sp_u32 g0 = g_first; g0 < groups; g0 += step) {
        float w[U][4];
        sp_load_tile<U, FX>(row, g0, g_step, vocab, full, SP_NEG_INF, w, fmt);
        SP_UNROLLED
        for (sp_u32 n = 0; n < U * 4u; ++n) {
            const float z = w[n / 4u][n % 4u];
            const sp_u32 kz = sp_max_key(z);
            key = kz > key ? kz : key;
        }
    }
    return key;
}
// Half rows take tiles of SP_UNROLL_SOFTMAX_HALF groups, as in the sum pass (the same bytes in
// flight per thread as a binary32 tile).
template <sp_u32 FX = 0u>
__device__ sp_u32 sp_softmax_max_part(const float* row, sp_u32 vocab, float t, sp_u32 g_first,
                                      sp_u32 g_step, sp_u64* s_red, sp_u32 fmt = SP_FMT_F32) {
    fmt = FX == SP_FX_ANY ? fmt : FX;
    const sp_u32 key = fmt == SP_FMT_F32
                           ? sp_softmax_max_tiles<SP_UNROLL_SOFTMAX, 0u>(row, vocab, g_first, g_step, SP_FMT_F32)
                           : sp_softmax_max_tiles<SP_UNROLL_SOFTMAX_HALF, FX>(row, vocab, g_first, g_step, fmt);
    const sp_u32 top = (sp_u32)sp_block_reduce((sp_u64)key, true, s_red);
    return sp_max_key(sp_max_of_key(top) / t);
}
// The exact sum: the two u64 sums of sp_soft_fixed_w (h, l) of e = exp_p(l / t - m); ids past the
// row's end read as -inf (e = 0).
// Its quotients z = RN(l / t) come from a reciprocal computed once per row (sp_rcp_of) and four
// operations per id (sp_quot) where the row allows it (rc.ok, see the proof there), else from
// the division, one uniform branch per tile.
// One thread's tiles of U groups (fmt as FX allows, see sp_load_tile) into its (h, l).
template <sp_u32 U, sp_u32 FX>
__device__ __forceinline__ void sp_softmax_sum_tiles(const float* row, sp_u32 vocab, float t, float m,
                                                     sp_u32 g_first, sp_u32 g_step, sp_u32 fmt,
                                                     const sp_rcp& rc, sp_u32 hb, sp_u64& h, sp_u64& l) {
    const sp_u32 groups = (vocab + 3u) / 4u;
    const sp_u32 full = sp_full(row, vocab, fmt);
    const sp_u32 step = g_step * U;
    for (sp_u32 g0 = g_first; g0 < groups; g0 += step) {
        float w[U][4];
        sp_load_tile<U, FX>(row, g0, g_step, vocab, full, SP_NEG_INF, w, fmt);
        if (rc.ok) {
            SP_UNROLLED
            for (sp_u32 n = 0; n < U * 4u; ++n) w[n / 4u][n % 4u] = sp_quot(w[n / 4u][n % 4u], t, rc);
        } else {
            SP_COLD_MARK(); // rows outside the proven range: the division
            SP_UNROLLED
            for (sp_u32 n = 0; n < U * 4u; ++n) w[n / 4u][n % 4u] = w[n / 4u][n % 4u] / t;
        }
        SP_UNROLLED
        for (sp_u32 n = 0; n < U * 4u; ++n) sp_soft_fixed_w(sp_exp_w(w[n / 4u][n % 4u] - m, hb), h, l);
    }
}
// Half rows take tiles of SP_UNROLL_SOFTMAX_HALF groups (8-byte loads: twice the groups of a
// binary32 tile for the same bytes in flight per thread).
template <sp_u32 FX = 0u>
__device__ void sp_softmax_sum_part(const float* row, sp_u32 vocab, float t, float m,
                                    sp_u32 g_first, sp_u32 g_step, sp_u64* s_red, sp_u64& hsum,
                                    sp_u64& lsum, sp_u32 fmt = SP_FMT_F32) {
    fmt = FX == SP_FX_ANY ? fmt : FX;
    const sp_rcp rc = sp_rcp_of(t, m);
    sp_u32 hb = 0x3F000000u; // 0.5, kept in a register (sp_exp_poly)
    SP_KEEP_IN_REGISTER(hb);
    sp_u64 h = 0ull, l = 0ull;
    if (fmt == SP_FMT_F32)
        sp_softmax_sum_tiles<SP_UNROLL_SOFTMAX, 0u>(row, vocab, t, m, g_first, g_step, SP_FMT_F32, rc, hb, h, l);
    else
        sp_softmax_sum_tiles<SP_UNROLL_SOFTMAX_HALF, FX>(row, vocab, t, m, g_first, g_step, fmt, rc, hb, h, l);
    hsum = sp_block_reduce(h, false, s_red);
    lsum = sp_block_reduce(l, false, s_red);
}

// The softmax state of a logit row at temperature t > 0 over the whole row (every thread of the
// block takes part; every thread gets the state): the maximum pass, then the sum pass. FX and
// fmt as for the passes (the tree entry's half rows: FX = SP_FX_ANY).
template <sp_u32 FX = 0u>
__device__ sp_soft sp_softmax_state(const float* row, sp_u32 vocab, float t, sp_u32 g_first,
                                    sp_u32 g_step, sp_u64* s_red, sp_u32 fmt = SP_FMT_F32) {
    sp_soft st;
    st.t = t;
    st.m = sp_max_of_key(sp_softmax_max_part<FX>(row, vocab, t, g_first, g_step, s_red, fmt));
    sp_u64 h, l;
    sp_softmax_sum_part<FX>(row, vocab, t, st.m, g_first, g_step, s_red, h, l, fmt);
    st.s = sp_soft_sum(h, l);
    return st;
}

// argmax with NaN as -inf, ties to the lowest id. Each thread visits its ids in increasing
// order and keeps a strictly larger value only, so it holds the lowest id among its equal
// largest values (IEEE `>`: -0 and +0 tie, NaN never replaces anything, so a NaN or -inf id
// stands only when nothing before it in the thread was larger, exactly as a -inf key would).
// The packed (key, id) of that one element then enters the block-wide maximum.
// This block's part of the argmax: threads take groups g_first, g_first + g_step, ... (every
// group exactly once over the g_step threads that share the row: the block's threads, or those
// of every block the row is split over). Returns the block-wide maximum of the packed
// (key, id), 0 when the block holds no id.
template <sp_u32 P = 0u, sp_u32 FX = 0u>
__device__ sp_u64 sp_argmax_packed(const float* row, sp_u32 vocab, sp_u32 g_first, sp_u32 g_step,
                                   sp_u64* s_red, const sp_soft* st = 0) {
    const sp_u32 fmt = FX == SP_FX_ANY ? st->tf : FX;
    const sp_u32 groups = (vocab + 3u) / 4u;
    const bool vec = FX == 0u ? sp_aligned16(row) : sp_full(row, 4u, fmt) != 0u;
    float best = sp_f(0xFF800000u); // -inf
    sp_u32 best_id = g_first * 4u;
    const sp_u32 step = g_step * SP_UNROLL_ARGMAX;
    for (sp_u32 g0 = g_first; g0 < groups; g0 += step) {
        float w[SP_UNROLL_ARGMAX][4];
        SP_UNROLLED
        for (sp_u32 u = 0; u < SP_UNROLL_ARGMAX; ++u) // every load first, then the compares
            sp_load4_fmt(row, (g0 + u * g_step) * 4u, vocab, vec, sp_lg<P>(st) ? SP_NEG_INF : sp_f(0x7FC00000u),
                         w[u], fmt);
        sp_soft_tile<P, SP_UNROLL_ARGMAX>(w, st);
        SP_UNROLLED
        for (sp_u32 u = 0; u < SP_UNROLL_ARGMAX; ++u) {
            const sp_u32 v0 = (g0 + u * g_step) * 4u;
            for (sp_u32 i = 0; i < 4u; ++i) {
                const bool up = w[u][i] > best;
                best = up ? w[u][i] : best;
                best_id = up ? v0 + i : best_id;
            }
        }
    }
    const sp_u64 mine = g_first < groups ? sp_pack(best, best_id) : 0ull;
    return sp_block_reduce(mine, true, s_red);
}

template <sp_u32 P = 0u, sp_u32 FX = 0u>
__device__ sp_u32 sp_argmax(const float* row, sp_u32 vocab, sp_u64* s_red, const sp_soft* st = 0) {
    return sp_unpack_id(sp_argmax_packed<P, FX>(row, vocab, threadIdx.x, blockDim.x, s_red, st));
}

// s = n / d, correctly rounded, for the operands of ln_p's series only: n = m - 1, d = m + 1 with
// m in [sqrt(1/2), sqrt(2)] (n in [-0.3, 0.42], d in [1.7, 2.42]). On CUDA devices this is the
// sequence ptxas emits for an IEEE division (div.rn.f32: MUFU.RCP, one Newton step on the
// reciprocal, a quotient and one remainder correction, all FMAs rounded once) without its
// FCHK range check and out-of-line slow path: FCHK looks at the operands' exponents only
// (denormals, overflow and underflow of the quotient) and cannot fire on these operands, so the
// result is the same correctly rounded quotient with 6 instructions instead of 10 and no branch.
// tests/tests/entropy_exact.rs replays the sequence on the host for every m against every
// reciprocal within 2^-23 (relative) of 1/d. Elsewhere (HIP, host) the division is written as
// such. The FMAs here are explicit, never contractions: the rounding of each is part of the
// division's proof, not a change of the rules' arithmetic.
__device__ __forceinline__ float sp_div_series(float n, float d) {
#if defined(__CUDA_ARCH__)
    // One inline-asm block, so that these are the only FMAs and the only .ftz in the PTX
    // (backend-cuda/tests/nvrtc.rs checks that, and that the block is exactly this sequence).
    float s;
    asm("{\n\t"
        ".reg .f32 r, nd, e, r2, q0, nq, rem;\n\t"
        "rcp.approx.ftz.f32 r, %2;\n\t"
        "neg.f32 nd, %2;\n\t"
        "fma.rn.f32 e, nd, r, 0f3F800000;\n\t"
        "fma.rn.f32 r2, r, e, r;\n\t"
        "mul.rn.f32 q0, %1, r2;\n\t"
        "neg.f32 nq, q0;\n\t"
        "fma.rn.f32 rem, nq, %2, %1;\n\t"
        "fma.rn.f32 %0, rem, r2, q0;\n\t"
        "}"
        : "=f"(s)
        : "f"(n), "f"(d));
    return s;
#else
    return n / d;
#endif
}

// The entropy's exponent table, 512 floats in shared memory: entry k < 256 is
// (k - 127) x LN2 x 2^40 (the `e x LN2` of ln_p, scaled), entries k >= 256 are NaN (the sign
// bit of p was set). Filled by every thread of the block (block-uniform call), then a barrier.
#define SP_LN_TABLE 512u
__device__ __forceinline__ void sp_ln_table_fill(float* tab) {
    for (sp_u32 i = threadIdx.x; i < SP_LN_TABLE; i += blockDim.x)
        tab[i] = i < 256u ? (float)((sp_i32)i - 127) * sp_f(0x53317218u) : sp_f(0x7FC00000u);
    __syncthreads();
}

// One entropy term in fixed point (DETERMINISM.md, "Entropy"): (-(p x ln_p(p)) x 2^40) as i64
// for p >= MIN_POSITIVE (+inf included), 0 for anything else, computed the same bits cheaper:
//   * ln_p's `m > sqrt2` test and exponent bump are one integer add: a mantissa >= 0x3504F4
//     carries into the exponent field of t = bits + 0x4AFB0C, so k = t >> 23 is the bumped
//     biased exponent and bits - (t & 0xFF800000) is m's mantissa with the right exponent;
//   * every constant of the series and LN2 are scaled by 2^40 (exact: a power of two, and no
//     intermediate comes near the subnormal or overflow range), so the series gives
//     ln_p(p) x 2^40 and the product needs no separate scaling (a product whose magnitude
//     would overflow saturates the conversion either way);
//   * (e as f32) x LN2 x 2^40 comes from the table by k, and k >= 256 (p negative) gives NaN,
//     which converts to 0; zero and subnormal p give |p x ln| < 1, which truncates to 0; NaN
//     p gives NaN. So no value needs a test or a select.
__device__ __forceinline__ sp_u64 sp_entropy_fixed(float p, const float* ln_tab) {
    const sp_u32 bits = __float_as_uint(p);
    const sp_u32 t = bits + 0x004AFB0Cu;
    const float a = ln_tab[t >> 23];
    const float m = __uint_as_float(bits - (t & 0xFF800000u) + 0x3F800000u);
    const float s = sp_div_series(m - 1.0f, m + 1.0f);
    const float z = s * s;
    float q = sp_f(0x52638E39u); // C9 x 2^40
    float u;
    u = z * q; q = sp_f(0x52924925u) + u; // C7 x 2^40
    u = z * q; q = sp_f(0x52CCCCCDu) + u; // C5 x 2^40
    u = z * q; q = sp_f(0x532AAAABu) + u; // C3 x 2^40
    u = z * q; q = sp_f(0x54000000u) + u; // 2 x 2^40
    const float b = s * q;
    const float ln = a + b; // ln_p(p) x 2^40 (NaN for negative p)
    const float x = -(p * ln);
    return (sp_u64)sp_f2i64(x);
}

// Entropy in fixed point, summed as wrapping 64-bit integers (exact, order-free): this block's
// part of the sum (groups g_first, g_first + g_step, ..., as in sp_argmax_packed).
template <sp_u32 P = 0u, sp_u32 FX = 0u>
__device__ sp_u64 sp_entropy_sum(const float* row, sp_u32 vocab, sp_u32 g_first, sp_u32 g_step,
                                 sp_u64* s_red, const sp_soft* st = 0) {
    __shared__ float ln_tab[SP_LN_TABLE];
    sp_ln_table_fill(ln_tab);
    const sp_u32 fmt = FX == SP_FX_ANY ? st->tf : FX;
    const sp_u32 groups = (vocab + 3u) / 4u;
    const sp_u32 full = sp_full(row, vocab, fmt);
    sp_u64 sum = 0ull;
    const sp_u32 step = g_step * SP_UNROLL_ENTROPY;
    for (sp_u32 g0 = g_first; g0 < groups; g0 += step) {
        float ws[SP_UNROLL_ENTROPY][4];
        // Every load first, then the terms; past the end: 0.
        sp_load_tile<SP_UNROLL_ENTROPY, FX>(row, g0, g_step, vocab, full, sp_lg<P>(st) ? SP_NEG_INF : 0.0f,
                                            ws, fmt);
        sp_soft_tile<P, SP_UNROLL_ENTROPY>(ws, st);
        SP_UNROLLED
        for (sp_u32 n = 0; n < SP_UNROLL_ENTROPY * 4u; ++n)
            sum += sp_entropy_fixed(ws[n / 4u][n % 4u], ln_tab);
    }
    return sp_block_reduce(sum, false, s_red);
}

// H from the whole row's fixed-point sum: (sum as f32) x 2^-40.
__device__ __forceinline__ float sp_entropy_of_sum(sp_u64 sum) {
    return (float)(sp_i64)sum * sp_f(0x2B800000u); // 2^-40
}

template <sp_u32 P = 0u, sp_u32 FX = 0u>
__device__ float sp_entropy(const float* row, sp_u32 vocab, sp_u64* s_red, const sp_soft* st = 0) {
    return sp_entropy_of_sum(sp_entropy_sum<P, FX>(row, vocab, threadIdx.x, blockDim.x, s_red, st));
}

// The skip test's f32 stand-in for a thread's best key: at most the key (within one rounding)
// and at most FLT_MAX. Only an optimisation: a skipped id provably has a smaller key.
__device__ __forceinline__ float sp_skip_key(double key) {
    const double c = key < 3.4028234663852886e38 ? key : 3.4028234663852886e38;
    return (float)c;
}

// The race over processed rows (P != SP_P_RAW) without the binary64 division e / S per id on the
// hot path, nor (logits) the exact weight: the row loop holds an upper bound of each id's weight
// before that division (sp_weight_ub: at least sp_weight's e, the stored value itself for stored
// values; 0 where it proves the weight 0) and the skip test reads the f32 product bound x sinv,
// which is never below the exact p = sp_scale(sp_weight(x)) (RN32 is monotone), so it rules out
// no id the exact test would keep. The ids it keeps get their exact weight and p (in the cold
// region, where the keys are computed) and the exact test. Same winner, same key: a skipped id
// still provably has the smaller key.
//
// sp_weight then sp_scale is sp_proc, except that a cut id's p is (float)(0.0 / S) instead of
// +0: -0 when S < 0, which only ever enters `w > 0` (false either way) and w - d (a zero of
// either sign minus d: the same value unless d is a zero too, and then a zero, never > 0).
template <sp_u32 P>
__device__ __forceinline__ float sp_weight(float x, const sp_soft& st) {
    if (P == SP_P_RAW) return x;
    if (P == SP_P_SOFT) return sp_soft_e(x, st.t, st.m);
    const sp_u32 kind = P == SP_P_ANY ? st.kind : P;
    if (kind == SP_P_RAW) return x;
    const bool lg = kind == SP_P_SOFT || kind == SP_P_SOFT_CUT;
    const float w = lg ? sp_soft_e(x, st.t, st.m) : x;
    return (lg ? __float_as_uint(w) : sp_wkey(w)) < st.theta ? 0.0f : w;
}
template <sp_u32 P>
__device__ __forceinline__ float sp_scale(float w, const sp_soft& st) {
    if (P == SP_P_RAW || (P == SP_P_ANY && st.kind == SP_P_RAW)) return w;
    return st.s == 0.0 ? 0.0f : (float)((double)w / st.s);
}
// The row's sinv, so that for every weight w of the row RN32(w x sinv) >= p = sp_scale(w) (or
// NaN: "unknown", every such id goes to the exact test). Proof, for rows whose weights are all
// in [0, +inf] (logits: e = exp_p(..) is never NaN; stored values with a threshold: a value
// <= 0 or NaN has key 0 and is cut) and 0 < S with d below in [2^-126, FLT_MAX): each of the
// three roundings to d and sinv is within 2^-53, 2^-53, 2^-24 (relative, normal ranges), so
// sinv >= (1 / S)(1 + 2^-16)(1 - 2^-53)^2 (1 - 2^-24) >= (1 / S)(1 + 2^-17). For w in (0, inf)
// the exact x = w / S is a normal binary64 (2^-149 / 2^127 and up), RN64(x) <= x (1 + 2^-53) <=
// w x sinv, and RN32 is monotone: RN32(w x sinv) >= RN32(RN64(x)) = p. w = 0 gives +0 both ways,
// w = +inf +inf both ways. S == 0: p = 0 and sinv = 0 (a product 0, or NaN for w = +inf).
// Raw rows: sinv = 1 (w x 1 is w). Any other row (stored values without a threshold, which may
// be negative, or S out of that range): NaN. For the residual, RN32(pu - d) >= RN32(p - d)
// likewise (or NaN), so the race's test `w > 0 && !(w < bound)` on the upper value, with NaN
// counted as passing, keeps every id the exact test keeps. The race multiplies sinv by a
// bound u >= w instead (sp_weight_ub, u in [0, 4.6] for logits): RN32(u x sinv) >= RN32(w x
// sinv) >= p (or NaN), the same conclusion.
template <sp_u32 P>
__device__ __forceinline__ float sp_race_sinv(const sp_soft* st) {
    if (P == SP_P_RAW) return 1.0f;
    const sp_u32 kind = P == SP_P_ANY ? st->kind : P;
    if (kind == SP_P_RAW) return 1.0f;
    const bool nonneg = kind == SP_P_SOFT || kind == SP_P_SOFT_CUT || st->theta != 0u;
    const double s = st->s;
    if (nonneg && s == 0.0) return 0.0f;
    if (!nonneg || !(s > 0.0)) return sp_f(0x7FC00000u);
    const double d = (1.0 / s) * sp_d(0x3FF0001000000000ull); // 1 + 2^-16
    return d >= sp_d(0x3810000000000000ull) && d < 3.4028234663852886e38 ? (float)d : sp_f(0x7FC00000u);
}

// ---- the skip test's upper bound of a logit's weight (issue 30)
// The race's row loop does not compute a logit's weight e = exp_p(RN(RN(l / T) - m)) (an IEEE
// division and exp_p: ~32 instructions) for the skip test: it computes u >= e in 6 (sp_exp2_ub
// of y = RN(RN(l c) - b), with the row's c and b below), and the skip test reads u where it read
// e. Only an id the bound cannot rule out (sp_race_group's cold region) gets its exact e, its
// exact p and the exact test, so the winner and its key are the exact path's. Proof that u >= e
// for every id of a row whose softmax maximum is m (the state's m: sp_softmax_state's maximum
// of RN(l / T) over the row, NaN aside), L = log2 e, every step binary32 with one rounding
// (no FMA contraction: NVRTC --fmad=false, hipcc/g++ -ffp-contract=off; 2^-24 relative per
// rounding in the normal range, 2^-150 absolute below it):
//   * e = 0 (l NaN or -inf, x = RN(z - m) <= -87, or no finite maximum): u >= 0 always.
//   * Otherwise x in (-87, 0] (z <= m), and exp_p(x) <= e^x (1 + 2^-21.9) there (checked on
//     every such binary32 x), so e <= 2^(xL + 2^-21.3). Bounded rows (c a normal binary32,
//     |m| <= 2^20): with w = l / T exact, z = w(1 + e1) (+ 2^-150), x = (z - m)(1 + e2),
//     c = (L / T)(1 + e3) (LOG2E's own rounding, 2^-26.2, included: |e3| <= 1.25 2^-24),
//     RN(l c) = wL(1 + e3)(1 + e4), y = (RN(l c) - b)(1 + e5): y - xL = (mL - b) + wL(e3 + e4
//     + e3 e4) - L(w e1 + (z - m) e2) + (RN(l c) - b) e5, and |z - m| <= 87.01,
//     |w| <= |m| + 88, |RN(l c) - b| <= 128 give |y - xL - (mL - b)| <= 2^-24 (4.8 |m| + 680).
//     b = RN(RN(m LOG2E) - d), d = RN(|m| 2^-20 + 2^-14), so mL - b >= d - 2^-24 (3.4 |m| + 1)
//     >= 2^-24 (12.5 |m| + 1020): y >= xL + 2^-24 (7.7 |m| + 340) > xL + 2^-21.3, e <= 2^y.
//     Off rows (c not normal, m not finite or |m| > 2^20): c = 0, b = -1, y = 1 for every
//     finite l (u > 2 > 1.000001 >= e), NaN for l infinite or NaN (then e = 0: l = +inf only
//     where m = +inf, x NaN).
//   * sp_exp2_ub(y) >= 2^max(y, -126) >= 2^y where y <= 64 (its comment), with NaN as -126.
// (y <= xL + (mL - b) + 2^-24 (4.8 |m| + 680) <= 2^-24 (24.2 |m| + 1706) < 1.6 on bounded rows,
// and off rows' y <= 1: sp_exp2_ub's clamp at 64 never binds there, except on the finite values
// sp_f16_scaled gives f16 infinities and NaN, whose e is 0.) A row's state whose m is not its maximum (x > 0) would break the proof: every state
// the race reads comes from sp_softmax_state or the split entries' maximum pass over the row.
// The threshold: a cut id (key(e) < theta) has weight 0. u >= e >= 0 gives key(u) >= key(e),
// so key(u) < theta proves the cut; and every nonzero e is at least 0x1.666dcp-126 (exp_p's
// least nonzero value, x just above -87), so key(u) below that of 1.25 2^-126 proves e = 0:
// the row's bound threshold is max(theta, that key), and ids below it are no candidate (their
// groups skip the draws, as when e = 0: the pad, -inf masks).
struct sp_race_ub {
    float c;      // RN(LOG2E / T), or 0 (off rows)
    float b;      // RN(RN(m LOG2E) - d), or -1 (off rows)
    sp_u32 theta; // the bound's threshold (logit rows), or the row's own theta (stored values)
};
#define SP_UB_EMIN_KEY 0x00A00000u // key of 1.25 2^-126 < exp_p's least nonzero value
// lg16: the row's values are read as sp_f16_scaled's l 2^-112, so c is RN(LOG2E / T) 2^112
// (exact where finite: the products l c and (l 2^-112)(c 2^112) are the same real number, and so
// round to the same binary32); an infinite one makes the row an off row.
template <sp_u32 P>
__device__ __forceinline__ sp_race_ub sp_race_ub_of(const sp_soft* st, bool lg16) {
    sp_race_ub r;
    r.c = 0.0f;
    r.b = -1.0f;
    r.theta = 0u;
    if (P == SP_P_RAW) return r;
    const sp_u32 kind = P == SP_P_ANY ? st->kind : P;
    const bool lg = kind == SP_P_SOFT || kind == SP_P_SOFT_CUT;
    const sp_u32 theta = P == SP_P_SOFT ? 0u : st->theta;
    r.theta = kind == SP_P_RAW ? 0u : lg && theta < SP_UB_EMIN_KEY ? SP_UB_EMIN_KEY : theta;
    const float m = st->m;
    const float c = sp_f(0x3FB8AA3Bu) / st->t; // LOG2E / T
    const float cs = lg16 ? c * sp_f(0x77800000u) : c; // 2^112
    const float am = m < 0.0f ? -m : m;
    if (c >= sp_f(0x00800000u) && cs <= sp_f(0x7F7FFFFFu) && am <= 1048576.0f) {
        const float d = am * sp_f(0x35800000u) + sp_f(0x38800000u); // |m| 2^-20 + 2^-14
        r.c = cs;
        r.b = m * sp_f(0x3FB8AA3Bu) - d;
    }
    return r;
}
// An upper bound of 2^y where y <= 64 (and of 1 where y > 64): u >= 2^Y, Y = min(max(y, -126),
// 64) (NaN as -126), a normal binary32. k = RN(Y + 1.5 2^15) lies in [2^15, 2^16), whose
// spacing is 2^-8: k = 1.5 2^15 + N / 256 with
// N = round(256 Y) (so N + 1 >= 256 Y + 1/2), and bits(k) = bits(1.5 2^15) + N. The result's
// bits are (N + 1) 2^15 + 127 2^23 (wrapping u32 arithmetic, bits(1.5 2^15) 2^15 = 0 mod 2^32):
// with N + 1 = 256 q + r, 0 <= r < 256, that is 2^q (1 + r / 256) >= 2^q 2^(r / 256)
// (1 + f >= 2^f on [0, 1]) = 2^((N + 1) / 256) > 2^Y, q in [-126, 64]. At most 1.091 times
// 2^Y (the linear interpolation's 1.0861, the rounding's 2^(3/512)): the skip test still rules
// out nearly every id.
__device__ __forceinline__ float sp_exp2_ub(float y) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
    const float yc = fminf(fmaxf(y, -126.0f), 64.0f); // max.f32: NaN -> -126
#else
    const float yc = y > -126.0f ? (y < 64.0f ? y : 64.0f) : -126.0f;
#endif
    const float k = yc + 49152.0f; // 1.5 2^15
    return __uint_as_float(__float_as_uint(k) * 32768u + 0x3F808000u);
}
// The weight the skip test reads, before the threshold: the stored value itself (raw rows and
// stored values), or for logits an upper bound u >= e (the cut is sp_race_wcut's test).
template <sp_u32 P>
__device__ __forceinline__ float sp_weight_ub(float x, const sp_soft& st, const sp_race_ub& ub) {
    if (P == SP_P_RAW) return x;
    const sp_u32 kind = P == SP_P_ANY ? st.kind : P;
    const bool lg = kind == SP_P_SOFT || kind == SP_P_SOFT_CUT;
    return lg ? sp_exp2_ub(x * ub.c - ub.b) : x;
}
// The threshold on the scaled bound pu = RN32(u x sinv) below which an id's p is provably <= 0
// (so it is no candidate, and 0 is an upper value of its p for the residual): W = the larger of
// RN32(thr x sinv), thr the binary32 of bits ub.theta (0 for raw rows), and 2^-149. Proof that
// pu < W gives p <= 0: (1) pu < 2^-149 is pu <= 0, and pu >= p (sp_race_sinv). (2) pu <
// RN32(thr x sinv) with sinv in (0, +inf): RN32 is monotone, so u sinv < thr sinv and u < thr
// (u >= 0 for logits, u = x for stored values); for a logit row key(u) = bits(u) < ub.theta
// proves the weight 0 (sp_race_ub), p = +-0; for stored values with a threshold, u <= 0 has key
// 0 < theta and 0 < u < thr has key below theta: cut, p = +-0; raw rows: u < 0, p = u. Any other
// sinv (0, NaN) or thr (NaN: theta above +inf's bits) gives RN32(thr x sinv) = 0 or NaN and so
// W = 2^-149, case (1). Ids below W are no candidate: a group of them (the pad, -inf masks,
// weights below the threshold) skips its draws, as before.
template <sp_u32 P>
__device__ __forceinline__ float sp_race_wcut(const sp_race_ub& ub, float sinv) {
    if (P == SP_P_RAW) return 0.0f;
    const float w = __uint_as_float(ub.theta) * sinv;
    return w > sp_f(0x00000001u) ? w : sp_f(0x00000001u);
}

// An f16 value's bits h (low 16 bits) as the binary32 l 2^-112, exactly, for every finite h: the
// sign, exponent and significand moved to their binary32 places (an arithmetic shift by 3 of
// h << 16 puts the sign at bit 31 and the rest at bits 27..13; the mask clears the sign's
// copies), i.e. a binary32 of exponent field e16 and significand m16 2^13: 2^(e16 - 127)(1 + m16
// 2^-10) = l 2^-112 for e16 >= 1, m16 2^-136 = (m16 2^-24) 2^-112 for e16 = 0. Infinities and
// NaN give finite values (as if l were +-2^16 (1 + m16 2^-10), above any finite f16 and so
// possibly above the row's maximum, where sp_exp2_ub's clamp at 64 keeps its result a bound):
// only ever fed to sp_weight_ub on logit rows, where their e is 0 (a NaN or -inf logit) or the
// row is an off row (+inf: m = +inf), so any value bounds it.
__device__ __forceinline__ float sp_f16_scaled(sp_u32 h) {
    return __uint_as_float((sp_u32)((sp_i32)(h << 16) >> 3) & 0x8FFFE000u);
}
// The any-format race's tile of a half row (sp_race_scan, SP_P_ANY): the U 8-byte words as
// loaded, widened group by group where they are used, so that a tile holds half the registers
// of its widened values. Past the row's end (the tail tile) the pattern `pad`: for a logit row
// -inf's (bf16: widened, the pass's pad itself; f16 logits: sp_f16_scaled's finite value, a
// -inf logit's, whose weight is 0 as the pad's), else +0 (widened: the pad 0).
template <sp_u32 U>
__device__ __forceinline__ void sp_race_load_half(const float* row, sp_u32 g0, sp_u32 g_step,
                                                  sp_u32 vocab, sp_u32 full, sp_u32 pad,
                                                  sp_u64 q[U]) {
    if (g0 + (U - 1u) * g_step < full) {
        const sp_u64* p = reinterpret_cast<const sp_u64*>(row) + g0;
        SP_UNROLLED
        for (sp_u32 u = 0; u < U; ++u) q[u] = p[(sp_u64)u * g_step];
    } else {
        SP_COLD_MARK(); // at most one tile per thread and row: the row's end
        const unsigned short* h = reinterpret_cast<const unsigned short*>(row);
        SP_UNROLLED
        for (sp_u32 u = 0; u < U; ++u) {
            const sp_u32 v0 = (g0 + u * g_step) * 4u;
            sp_u64 w = 0ull;
            for (sp_u32 i = 0; i < 4u; ++i)
                w |= (sp_u64)(v0 + i < vocab ? (sp_u32)h[v0 + i] : pad) << (16u * i);
            q[u] = w;
        }
    }
}
// The race's tile (sp_load_tile), except that the values of an f16 logit row (lg16) come as
// sp_f16_scaled's l 2^-112, the pad as is (-inf): 2 or 3 instructions per value instead of the
// exact widening's case analysis. The cold region reads the exact values again (sp_race_group).
template <sp_u32 U, sp_u32 FX>
__device__ __forceinline__ void sp_race_load(const float* row, sp_u32 g0, sp_u32 g_step,
                                             sp_u32 vocab, sp_u32 full, float pad, float w[U][4],
                                             sp_u32 fmt, bool lg16) {
    if (FX == 0u || FX == SP_FMT_BF16 || !lg16) {
        sp_load_tile<U, FX>(row, g0, g_step, vocab, full, pad, w, fmt);
        return;
    }
    const unsigned short* h = reinterpret_cast<const unsigned short*>(row);
    if (g0 + (U - 1u) * g_step < full) {
        const sp_u64* p = reinterpret_cast<const sp_u64*>(row) + g0;
        SP_UNROLLED
        for (sp_u32 u = 0; u < U; ++u) {
            const sp_u64 q = p[(sp_u64)u * g_step];
            for (sp_u32 i = 0; i < 4u; ++i) w[u][i] = sp_f16_scaled((sp_u32)(q >> (16u * i)) & 0xFFFFu);
        }
    } else {
        SP_COLD_MARK(); // at most one tile per thread and row: the row's end
        SP_UNROLLED
        for (sp_u32 u = 0; u < U; ++u) {
            const sp_u32 v0 = (g0 + u * g_step) * 4u;
            for (sp_u32 i = 0; i < 4u; ++i) w[u][i] = v0 + i < vocab ? sp_f16_scaled(h[v0 + i]) : pad;
        }
    }
}

// One group of 4 ids (g*4 .. g*4+3) of the race, visited in increasing order; updates the thread's
// best (key, f32 skip bound, id). d holds zeros for the plain race. P != SP_P_RAW: t holds upper
// bounds of the weights (sp_weight_ub), sinv and wcut the row's (sp_race_sinv, sp_race_wcut),
// and the cold region reads the ids' values again from trow (vocab ids of format tf; past the
// end: the pad), so that the hot loop need not keep them in registers (nor widen f16 logits
// exactly: sp_race_load).
template <sp_u32 P, class KS>
__device__ __forceinline__ void sp_race_group(const float t[4], const float d[4], bool residual,
                                              sp_u32 g, sp_u32 position, sp_u32 off_lo,
                                              sp_u32 off_hi, const KS& ks, double& best,
                                              float& best_skip, sp_u32& best_id,
                                              const sp_soft* st, float sinv, float wcut,
                                              const float* trow, sp_u32 vocab, sp_u32 tf) {
    float w[4];
    bool cand[4];
    bool any = false;
    for (sp_u32 i = 0; i < 4u; ++i) {
        if (P == SP_P_RAW) {
            w[i] = residual ? t[i] - d[i] : t[i];
            cand[i] = w[i] > 0.0f;
        } else {
            // pu < wcut proves p <= 0 (sp_race_wcut): 0 is then an upper value of p too.
            const float pu = t[i] * sinv;
            const bool none = pu < wcut;
            w[i] = residual ? (none ? 0.0f : pu) - d[i] : pu;
            cand[i] = residual ? !(w[i] <= 0.0f) : !none; // NaN: unknown, a candidate
        }
        any = any || cand[i];
    }
    if (!any) return; // no candidate here: the random words are not needed
    sp_u32 c[4];
    sp_race_words(c, ks, g, position, 1u, off_lo, off_hi);
    bool open[4];
    float bound[4];
    bool need = false;
    for (sp_u32 i = 0; i < 4u; ++i) {
        const float floor_e = (float)(c[i] >> 8) * sp_f(0x33800000u); // 2^-24
        const float p = best_skip * floor_e;
        bound[i] = p * sp_f(0x3F7FFFF0u); // 1 - 2^-20
        open[i] = cand[i] && !(w[i] < bound[i]);
        need = need || open[i];
    }
    if (!need) return;
    SP_COLD_MARK();
    float tp[4];
    for (sp_u32 i = 0; i < 4u; ++i) tp[i] = t[i];
    if (P != SP_P_RAW) {
        // The exact weight and p of the ids the upper bound kept, and the exact test.
        need = false;
        for (sp_u32 i = 0; i < 4u; ++i) {
            if (!open[i]) continue;
            const sp_u32 v = g * 4u + i;
            const float xv = v < vocab ? sp_rd(trow, v, tf) : sp_lg<P>(st) ? SP_NEG_INF : 0.0f;
            tp[i] = sp_scale<P>(sp_weight<P>(xv, *st), *st);
            const float wi = residual ? tp[i] - d[i] : tp[i];
            open[i] = wi > 0.0f && !(wi < bound[i]);
            need = need || open[i];
        }
        if (!need) return;
    }
    // The any-format race (sp_race_part_any, shared keys, under its register cap) draws its
    // stream-1 words again here rather than keep them live through the exact re-read above: the same words (the
    // same counter and key), so the same bits, and no spill of them on the hot path.
    if (P == SP_P_ANY && sp_keys_redraw(ks)) sp_race_words(c, ks, g, position, 1u, off_lo, off_hi);
    sp_u32 c2[4];
    sp_race_words(c2, ks, g, position, 2u, off_lo, off_hi);
    for (sp_u32 i = 0; i < 4u; ++i) {
        if (!open[i]) continue;
        const double wx = residual ? (double)tp[i] - (double)d[i] : (double)tp[i];
        const double e = sp_exponential(((sp_u64)c[i] << 32) | (sp_u64)c2[i]);
        const double key = wx / e;
        if (key > best) {
            best = key;
            best_skip = sp_skip_key(key);
            best_id = g * 4u + i;
        }
    }
}

// Exponential race over w_v = t_v - d_v (residual, d = draft row, or one-hot at onehot_id when
// draft is null) or over w_v = t_v (plain), keys w / E in binary64 (DETERMINISM.md). Returns
// (1 << 32) | winner, or 0 when there is no candidate.
//
// Each thread visits its ids in increasing order and keeps a strictly larger key only, so it holds
// its lowest id among equal keys. Stream-2 words and the binary64 map are computed only for ids
// the f32 test cannot rule out: w < (best * floor) * SHRINK, floor = (hi >> 8) 2^-24 <= E, proves
// w / E < best (see host-std/src/cpu/kernels.rs for the margin).
// This block's part of the race (groups g_first, g_first + g_step, ... as in sp_argmax_packed):
// the largest key's bits (0: no candidate in the block) and the lowest id holding it.
// The row loop of the race, for a draft row (ROW: residual t - d) or none (plain, or residual
// with a one-hot draft): two loops, so that neither branches on the kind of draft per tile.
// U: groups per tile. L16: whether the row is f16 logits (read as sp_f16_scaled's values):
// 0 no, 1 yes (the caller tested it), 2 tested here.
template <bool ROW, sp_u32 P, sp_u32 FX, class KS, sp_u32 U = SP_UNROLL_RACE, sp_u32 L16 = 2u>
__device__ __forceinline__ void sp_race_scan(const float* trow, const float* drow, bool residual,
                                             sp_u32 onehot_id, sp_u32 vocab, sp_u32 position,
                                             const KS& ks, sp_u32 off_lo, sp_u32 off_hi,
                                             sp_u32 g_first, sp_u32 g_step_in, double& best,
                                             float& best_skip, sp_u32& best_id, const sp_soft* st) {
    const sp_u32 groups = (vocab + 3u) / 4u;
    const sp_u32 tf = FX == SP_FX_ANY ? st->tf : FX;
    const sp_u32 df = FX == SP_FX_ANY ? st->df : FX;
    const sp_u32 full = FX == 0u ? (sp_aligned16(trow) && (!ROW || sp_aligned16(drow)) ? vocab / 4u : 0u)
                                 : (ROW && sp_full(drow, vocab, df) == 0u ? 0u : sp_full(trow, vocab, tf));
    const float sinv = sp_race_sinv<P>(st);
    // f16 logits without a draft row: read scaled by 2^-112 (sp_race_load), c scaled by 2^112.
    const bool lg16 = L16 != 2u ? L16 == 1u
                                : P != SP_P_RAW && !ROW && FX != 0u && tf == SP_FMT_F16 && sp_lg<P>(st);
    // The any-format race's half rows (sp_race_scan_half): tiles of 8-byte words (sp_race_load_half).
    const bool HALF = !ROW && P == SP_P_ANY && (FX == SP_FMT_BF16 || FX == SP_FMT_F16);
    const sp_race_ub ub = sp_race_ub_of<P>(st, lg16);
    const float wcut = sp_race_wcut<P>(ub, sinv);
    for (sp_u32 g0 = g_first; g0 < (HALF ? sp_keys_groups(ks, groups) : groups);) {
        // The any-format race reads it from shared memory (sp_keys_step); the others keep it.
        const sp_u32 g_step = P != SP_P_ANY ? g_step_in : sp_keys_step(ks, g_step_in);
        float t[U][4];
        float d[U][4];
        sp_u64 q[U]; // HALF: the tile's words, widened group by group below
        // Every load first, then the draws; past the end: 0, never a candidate.
        if (ROW) {
            sp_load_tile2<U, FX>(trow, drow, g0, g_step, vocab, full,
                                 sp_lg<P>(st) ? SP_NEG_INF : 0.0f, t, d, tf, df);
        } else if (HALF) {
            sp_race_load_half<U>(trow, g0, g_step, vocab, sp_keys_full(ks, full),
                                 sp_lg<P>(st) ? (FX == SP_FMT_BF16 ? 0xFF80u : 0xFC00u) : 0u, q);
        } else {
            sp_race_load<U, FX>(trow, g0, g_step, vocab, full, sp_lg<P>(st) ? SP_NEG_INF : 0.0f, t,
                                tf, lg16);
            SP_UNROLLED
            for (sp_u32 u = 0; u < U; ++u) {
                if (HALF) break; // below, group by group
                const sp_u32 v0 = (g0 + u * g_step) * 4u;
                for (sp_u32 i = 0; i < 4u; ++i)
                    d[u][i] = (residual && v0 + i == onehot_id) ? 1.0f : 0.0f;
            }
        }
        if (P != SP_P_RAW && !HALF) {
            SP_UNROLLED
            for (sp_u32 u = 0; u < U; ++u)
                for (sp_u32 i = 0; i < 4u; ++i) t[u][i] = sp_weight_ub<P>(t[u][i], *st, ub);
        }
        SP_UNROLLED
        for (sp_u32 u = 0; u < U; ++u) {
            // A half row's tile (HALF): each group's values widened, their one-hot draft words and
            // bounds just before its draws, so that only the tile's loaded words, not also their
            // widened values, are live across the draws of the groups before it.
            // HALF: the group's index from the shared step again (sp_keys_step), not kept live
            // through the draws of the groups before it (in the logits entries ptxas spilled the
            // tile's indices and reloaded them on the hot path).
            const sp_u32 gu = HALF ? g0 + u * sp_keys_step(ks, g_step_in) : g0 + u * g_step;
            if (HALF) {
                const sp_u32 v0 = gu * 4u;
                for (sp_u32 i = 0; i < 4u; ++i) {
                    const sp_u32 h = (sp_u32)(q[u] >> (16u * i)) & 0xFFFFu;
                    t[u][i] = sp_weight_ub<P>(lg16 ? sp_f16_scaled(h) : sp_widen(h, FX), *st, ub);
                    d[u][i] = (residual && v0 + i == onehot_id) ? 1.0f : 0.0f;
                }
            }
            sp_race_group<P>(t[u], d[u], residual, gu, position, off_lo, off_hi, ks, best,
                             best_skip, best_id, st, sinv, wcut, trow, vocab, tf);
        }
        g0 += g_step * U;
    }
}

// The any-format race over a half row without a draft row (P = SP_P_ANY, HALF of
// sp_race_part): one loop per half format, each in tiles of SP_UNROLL_RACE_HALF groups of
// 8-byte words (sp_race_load_half), so that a half row's tile holds as many bytes as a binary32
// one's (SP_UNROLL_RACE groups of 16 bytes); f16 rows take two loops, logits (read as
// sp_f16_scaled's values) and stored values (widened exactly). The tile changes only which
// groups a thread holds at once, not the groups it visits nor their order (g_first, g_first +
// g_step, ...): the same keys, the same winner. Binary32 rows and draft rows take the loops
// they always took (sp_race_part_any), compiled apart from these (sp_race_part_any_half).
template <class KS>
__device__ __forceinline__ void sp_race_scan_half(const float* trow, bool residual, sp_u32 onehot_id,
                                                  sp_u32 vocab, sp_u32 position, const KS& ks,
                                                  sp_u32 off_lo, sp_u32 off_hi, sp_u32 g_first,
                                                  sp_u32 g_step, double& best, float& best_skip,
                                                  sp_u32& best_id, const sp_soft* st) {
    if (st->tf == SP_FMT_BF16)
        sp_race_scan<false, SP_P_ANY, SP_FMT_BF16, KS, SP_UNROLL_RACE_HALF, 0u>(
            trow, 0, residual, onehot_id, vocab, position, ks, off_lo, off_hi, g_first, g_step,
            best, best_skip, best_id, st);
    else if (sp_lg<SP_P_ANY>(st))
        sp_race_scan<false, SP_P_ANY, SP_FMT_F16, KS, SP_UNROLL_RACE_HALF, 1u>(
            trow, 0, residual, onehot_id, vocab, position, ks, off_lo, off_hi, g_first, g_step,
            best, best_skip, best_id, st);
    else
        sp_race_scan<false, SP_P_ANY, SP_FMT_F16, KS, SP_UNROLL_RACE_HALF, 0u>(
            trow, 0, residual, onehot_id, vocab, position, ks, off_lo, off_hi, g_first, g_step,
            best, best_skip, best_id, st);
}

// HALF (P = SP_P_ANY only): the row is a half row without a draft row (sp_race_scan_half).
template <sp_u32 P = 0u, sp_u32 FX = 0u, class KS = sp_keys, bool HALF = false>
__device__ void sp_race_part(const float* trow, const float* drow, bool residual, sp_u32 onehot_id,
                             sp_u32 vocab, sp_u32 position, sp_u32 k0, sp_u32 k1, sp_u32 off_lo,
                             sp_u32 off_hi, sp_u32 g_first, sp_u32 g_step, sp_u64* s_red,
                             sp_u64& top, sp_u32& lowest_id, const sp_soft* st = 0) {
    double best = -1.0;
    float best_skip = -1.0f;
    sp_u32 best_id = SP_SENTINEL;
    KS ks;
    // HALF: the half row's loop bounds (sp_race_scan reads them through ks).
    if (HALF)
        sp_keys_init(ks, k0, k1, position, off_lo, off_hi, g_step, (vocab + 3u) / 4u,
                     sp_full(trow, vocab, st->tf));
    else
        sp_keys_init(ks, k0, k1, position, off_lo, off_hi, g_step);
    if (residual && drow != 0)
        sp_race_scan<true, P, FX>(trow, drow, true, onehot_id, vocab, position, ks, off_lo, off_hi,
                               g_first, g_step, best, best_skip, best_id, st);
    else if (P == SP_P_ANY && HALF)
        sp_race_scan_half(trow, residual, onehot_id, vocab, position, ks, off_lo, off_hi, g_first,
                          g_step, best, best_skip, best_id, st);
    else
        sp_race_scan<false, P, FX>(trow, 0, residual, onehot_id, vocab, position, ks, off_lo, off_hi,
                                g_first, g_step, best, best_skip, best_id, st);
    // Candidate keys are positive (or +inf), so their bit patterns order as unsigned integers;
    // "none" is 0. First the largest key, then the lowest id holding it.
    const sp_u64 mine = best > 0.0 ? (sp_u64)__double_as_longlong(best) : 0ull;
    top = sp_block_reduce(mine, true, s_red);
    lowest_id = SP_SENTINEL;
    if (top == 0ull) return;
    const sp_u64 lowest = sp_block_reduce(mine == top ? (sp_u64)(~best_id) : 0ull, true, s_red);
    lowest_id = ~(sp_u32)lowest;
}

// The whole race in one block: (1 << 32) | winner, or 0 when there is no candidate.
template <sp_u32 P = 0u, sp_u32 FX = 0u, bool HALF = false>
__device__ sp_u64 sp_race(const float* trow, const float* drow, bool residual, sp_u32 onehot_id,
                          sp_u32 vocab, sp_u32 position, sp_u32 k0, sp_u32 k1, sp_u32 off_lo,
                          sp_u32 off_hi, sp_u64* s_red, const sp_soft* st = 0) {
    sp_u64 top;
    sp_u32 id;
    sp_race_part<P, FX, sp_keys, HALF>(trow, drow, residual, onehot_id, vocab, position, k0, k1,
                                       off_lo, off_hi, threadIdx.x, blockDim.x, s_red, top, id, st);
    return top == 0ull ? 0ull : (1ull << 32) | (sp_u64)id;
}

// ---------------------------------------------------------------- the any-format passes
// The passes with the row's processing (st.kind) and formats chosen at run time, compiled once
// each (SP_NOINLINE) and called from every site of both logits entries
// (sp_verify_body<true>, sp_verify_split_body<true>) and, for its half rows, of the tree entry.
SP_NOINLINE __device__ sp_u64 sp_argmax_any(const float* row, sp_u32 vocab, sp_u32 g_first,
                                                sp_u32 g_step, sp_u64* s_red, const sp_soft& st) {
    const sp_soft l = st; // in registers (see sp_race_part_any)
    return sp_argmax_packed<SP_P_ANY, SP_FX_ANY>(row, vocab, g_first, g_step, s_red, &l);
}
SP_NOINLINE __device__ sp_u64 sp_entropy_any(const float* row, sp_u32 vocab, sp_u32 g_first,
                                                 sp_u32 g_step, sp_u64* s_red, const sp_soft& st) {
    const sp_soft l = st; // in registers (see sp_race_part_any)
    return sp_entropy_sum<SP_P_ANY, SP_FX_ANY>(row, vocab, g_first, g_step, s_red, &l);
}
SP_NOINLINE __device__ void sp_race_part_any(const float* trow, const float* drow, bool residual,
                                                 sp_u32 onehot_id, sp_u32 vocab, sp_u32 position,
                                                 sp_u32 k0, sp_u32 k1, sp_u32 off_lo, sp_u32 off_hi,
                                                 sp_u32 g_first, sp_u32 g_step, sp_u64* s_red,
                                                 sp_u64& top, sp_u32& id, const sp_soft& st) {
    // A copy the row loop reads from registers: through the caller's reference (its stack, as
    // the state's address leaves the caller) every id would reload the state's fields.
    const sp_soft l = st;
    sp_race_part<SP_P_ANY, SP_FX_ANY, sp_key_shared>(trow, drow, residual, onehot_id, vocab,
                                                   position, k0, k1, off_lo, off_hi, g_first,
                                                   g_step, s_red, top, id, &l);
}
// sp_race_part_any for a half row without a draft row (sp_race_scan_half), a function of its
// own: in sp_race_part_any's, ptxas kept values of its loops in local memory on their hot paths.
SP_NOINLINE __device__ void sp_race_part_any_half(const float* trow, bool residual,
                                                  sp_u32 onehot_id, sp_u32 vocab, sp_u32 position,
                                                  sp_u32 k0, sp_u32 k1, sp_u32 off_lo, sp_u32 off_hi,
                                                  sp_u32 g_first, sp_u32 g_step, sp_u64* s_red,
                                                  sp_u64& top, sp_u32& id, const sp_soft& st) {
    const sp_soft l = st; // in registers (see sp_race_part_any)
    sp_race_part<SP_P_ANY, SP_FX_ANY, sp_key_shared, true>(trow, 0, residual, onehot_id, vocab,
                                                         position, k0, k1, off_lo, off_hi, g_first,
                                                         g_step, s_red, top, id, &l);
}
// The any-format race's part, by row: a half row without a draft row in its own function.
__device__ __forceinline__ void sp_race_part_any_of(const float* trow, const float* drow,
                                                    bool residual, sp_u32 onehot_id, sp_u32 vocab,
                                                    sp_u32 position, sp_u32 k0, sp_u32 k1,
                                                    sp_u32 off_lo, sp_u32 off_hi, sp_u32 g_first,
                                                    sp_u32 g_step, sp_u64* s_red, sp_u64& top,
                                                    sp_u32& id, const sp_soft& st) {
    if (st.tf != SP_FMT_F32 && !(residual && drow != 0))
        sp_race_part_any_half(trow, residual, onehot_id, vocab, position, k0, k1, off_lo, off_hi,
                              g_first, g_step, s_red, top, id, st);
    else
        sp_race_part_any(trow, drow, residual, onehot_id, vocab, position, k0, k1, off_lo, off_hi,
                         g_first, g_step, s_red, top, id, st);
}
// The whole race in one block (as sp_race): (1 << 32) | winner, or 0.
__device__ __forceinline__ sp_u64 sp_race_any(const float* trow, const float* drow, bool residual,
                                              sp_u32 onehot_id, sp_u32 vocab, sp_u32 position,
                                              sp_u32 k0, sp_u32 k1, sp_u32 off_lo, sp_u32 off_hi,
                                              sp_u64* s_red, const sp_soft& st) {
    sp_u64 top;
    sp_u32 id;
    sp_race_part_any_of(trow, drow, residual, onehot_id, vocab, position, k0, k1, off_lo, off_hi,
                        threadIdx.x, blockDim.x, s_red, top, id, st);
    return top == 0ull ? 0ull : (1ull << 32) | (sp_u64)id;
}

// ---------------------------------------------------------------- what every entry shares
// The rules every entry (the chain's four, the tree's two) applies to its shape words and to
// each request before and after its rows, written once here.

// The shape words (SP_SHAPE_*; for a tree, k_max is its max_depth).
struct sp_shape {
    sp_u32 batch, k_max, vocab, dstride, tstride, method, ck, flags;
    bool draft; // SP_FLAG_DRAFT_PROBS: the request has draft rows
};
__device__ __forceinline__ sp_shape sp_shape_of(const sp_u32* shape) {
    sp_shape sh;
    sh.batch = shape[SP_SHAPE_BATCH];
    sh.k_max = shape[SP_SHAPE_K_MAX];
    sh.vocab = shape[SP_SHAPE_VOCAB];
    sh.dstride = shape[SP_SHAPE_DRAFT_STRIDE];
    sh.tstride = shape[SP_SHAPE_TARGET_STRIDE];
    sh.method = shape[SP_SHAPE_METHOD];
    sh.ck = shape[SP_SHAPE_COUNTERS_K];
    sh.flags = shape[SP_SHAPE_FLAGS];
    sh.draft = (sh.flags & SP_FLAG_DRAFT_PROBS) != 0u;
    return sh;
}
// The checks every entry makes of its shape words and block (each entry adds its own: the batch
// against its grid, ...). Uniform over the block, so an early return cannot split a barrier.
__device__ __forceinline__ bool sp_shape_ok(const sp_shape& sh) {
    return sh.k_max <= sh.ck && sh.vocab >= 1u && sh.tstride >= sh.vocab &&
           (!sh.draft || sh.dstride >= sh.vocab) && sh.method <= SP_METHOD_TYPICAL &&
           blockDim.x <= SPECULA_BLOCK_THREADS && blockDim.x % SPECULA_WARP_SIZE == 0u;
}
// The shape's flags an entry takes: the binary32 entries the draft flag only; the others the
// half-precision flags too, at most one per tensor.
__device__ __forceinline__ bool sp_flags_ok(sp_u32 flags, bool x) {
    if (!x) return (flags & ~SP_FLAG_DRAFT_PROBS) == 0u;
    const sp_u32 t = SP_FLAG_TARGET_BF16 | SP_FLAG_TARGET_F16;
    const sp_u32 d = SP_FLAG_DRAFT_BF16 | SP_FLAG_DRAFT_F16;
    return (flags & ~SP_FLAGS_ALL) == 0u && (flags & t) != t && (flags & d) != d;
}
// The error word, after the 4 + 2 ck counter words.
__device__ __forceinline__ sp_u64* sp_err_word(sp_u64* stats, sp_u32 ck) {
    return stats + 4u + 2u * (sp_u64)ck;
}
// A launch refused for its shape: SP_ERR_SHAPE, once (block 0, thread 0); nothing else is written.
__device__ __forceinline__ void sp_refuse_launch(sp_u64* err) {
    if (threadIdx.x == 0u && blockIdx.x == 0u) atomicOr(err, (sp_u64)SP_ERR_SHAPE);
}
// A skipped request (error bit bad): "nothing accepted" and the error bit; not counted. The entry
// writes its token outputs' sentinels.
__device__ __forceinline__ void sp_refuse_request(sp_u32* accepted, sp_u32 b, sp_u64* err, sp_u32 bad) {
    if (threadIdx.x == 0u) {
        accepted[b] = SP_SENTINEL;
        atomicOr(err, (sp_u64)bad);
    }
}

// A request's draws and how its target rows are read (DETERMINISM.md): its Philox key (seed[b])
// and offset words; `lg`: target logits, `temp` their temperature (0 without logits), `soft`:
// logits at T > 0, every target value through the row's softmax; `meth`: the method it runs,
// greedy on logits at T = 0, else the request's own (`own`: its sampling words, whose first is
// the method code) or the shape's.
struct sp_request {
    sp_u32 k0, k1, off_lo, off_hi;
    bool lg, soft;
    float temp;
    sp_u32 meth;
};
__device__ __forceinline__ sp_request sp_request_of(const sp_u64* seed, const sp_u64* offset,
                                                    const float* logits, const float* temperature,
                                                    sp_u32 b, sp_u32 method, const sp_u32* own) {
    sp_request rq;
    const sp_u64 s = seed[b];
    const sp_u64 o = offset[b];
    rq.k0 = (sp_u32)s;
    rq.k1 = (sp_u32)(s >> 32);
    rq.off_lo = (sp_u32)o;
    rq.off_hi = (sp_u32)(o >> 32);
    rq.lg = logits != 0;
    rq.temp = rq.lg ? temperature[b] : 0.0f;
    rq.soft = rq.lg && rq.temp > 0.0f;
    rq.meth = rq.lg && !rq.soft ? SP_METHOD_GREEDY : (own != 0 ? own[0] : method);
    return rq;
}
// Typical acceptance's threshold for a row of entropy h: min(eps, delta exp(-h)).
__device__ __forceinline__ float sp_typical_threshold(float h, float eps, float delta) {
    const float e = sp_exp(-h);
    const float bb = delta * e;
    return eps < bb ? eps : bb;
}

// The row passes as an entry's instance runs them (every thread of the block; block-uniform
// calls): ANY (the logits entries, the tree's half entry) the any-format passes (SP_NOINLINE,
// compiled once: the kind and formats read from st); otherwise the binary32 instances, inlined,
// P = SP_P_SOFT for softmax rows (`soft`), else SP_P_RAW (the stored values: no state read).
// The whole row in one block (argmax: the id; entropy: H; race: (1 << 32) | winner, or 0), or
// this block's part of it (_part: threads take groups g_first, g_first + g_step, ...). Each
// calls the pass the entries always called (sp_argmax or sp_argmax_packed, ...): ptxas's
// inlining, and with it the registers, follow the call sites.
template <bool ANY>
__device__ __forceinline__ sp_u32 sp_pass_argmax(const float* row, sp_u32 vocab, sp_u64* s_red,
                                                 const sp_soft& st, bool soft) {
    if (ANY) return sp_unpack_id(sp_argmax_any(row, vocab, threadIdx.x, blockDim.x, s_red, st));
    return soft ? sp_argmax<SP_P_SOFT>(row, vocab, s_red, &st) : sp_argmax(row, vocab, s_red);
}
template <bool ANY>
__device__ __forceinline__ sp_u64 sp_pass_argmax_part(const float* row, sp_u32 vocab, sp_u32 g_first,
                                                      sp_u32 g_step, sp_u64* s_red,
                                                      const sp_soft& st, bool soft) {
    if (ANY) return sp_argmax_any(row, vocab, g_first, g_step, s_red, st);
    return soft ? sp_argmax_packed<SP_P_SOFT>(row, vocab, g_first, g_step, s_red, &st)
                : sp_argmax_packed(row, vocab, g_first, g_step, s_red);
}
template <bool ANY>
__device__ __forceinline__ float sp_pass_entropy(const float* row, sp_u32 vocab, sp_u64* s_red,
                                                 const sp_soft& st, bool soft) {
    if (ANY) return sp_entropy_of_sum(sp_entropy_any(row, vocab, threadIdx.x, blockDim.x, s_red, st));
    return soft ? sp_entropy<SP_P_SOFT>(row, vocab, s_red, &st) : sp_entropy(row, vocab, s_red);
}
template <bool ANY>
__device__ __forceinline__ sp_u64 sp_pass_entropy_part(const float* row, sp_u32 vocab, sp_u32 g_first,
                                                       sp_u32 g_step, sp_u64* s_red,
                                                       const sp_soft& st, bool soft) {
    if (ANY) return sp_entropy_any(row, vocab, g_first, g_step, s_red, st);
    return soft ? sp_entropy_sum<SP_P_SOFT>(row, vocab, g_first, g_step, s_red, &st)
                : sp_entropy_sum(row, vocab, g_first, g_step, s_red);
}
template <bool ANY>
__device__ __forceinline__ void sp_pass_race_part(const float* trow, const float* drow, bool residual,
                                                  sp_u32 onehot_id, sp_u32 vocab, sp_u32 position,
                                                  const sp_request& rq, sp_u32 g_first, sp_u32 g_step,
                                                  sp_u64* s_red, sp_u64& top, sp_u32& id,
                                                  const sp_soft& st, bool soft) {
    if (ANY)
        sp_race_part_any_of(trow, drow, residual, onehot_id, vocab, position, rq.k0, rq.k1,
                            rq.off_lo, rq.off_hi, g_first, g_step, s_red, top, id, st);
    else if (soft)
        sp_race_part<SP_P_SOFT>(trow, drow, residual, onehot_id, vocab, position, rq.k0, rq.k1,
                                rq.off_lo, rq.off_hi, g_first, g_step, s_red, top, id, &st);
    else
        sp_race_part(trow, drow, residual, onehot_id, vocab, position, rq.k0, rq.k1, rq.off_lo,
                     rq.off_hi, g_first, g_step, s_red, top, id);
}
template <bool ANY>
__device__ __forceinline__ sp_u64 sp_pass_race(const float* trow, const float* drow, bool residual,
                                               sp_u32 onehot_id, sp_u32 vocab, sp_u32 position,
                                               const sp_request& rq, sp_u64* s_red,
                                               const sp_soft& st, bool soft) {
    if (ANY)
        return sp_race_any(trow, drow, residual, onehot_id, vocab, position, rq.k0, rq.k1,
                           rq.off_lo, rq.off_hi, s_red, st);
    return soft ? sp_race<SP_P_SOFT>(trow, drow, residual, onehot_id, vocab, position, rq.k0, rq.k1,
                                     rq.off_lo, rq.off_hi, s_red, &st)
                : sp_race(trow, drow, residual, onehot_id, vocab, position, rq.k0, rq.k1, rq.off_lo,
                          rq.off_hi, s_red);
}

// Counters<K>::record(drafted, acc), fused, and accepted[b]: the head words, then the
// per-position words; a request with nothing drafted is not counted (vLLM counts no draft for a
// request without draft tokens).
__device__ __forceinline__ void sp_count(sp_u64* stats, sp_u32 ck, sp_u32* accepted, sp_u32 b,
                                         sp_u32 drafted, sp_u32 acc) {
    sp_u64* const acc_pos = stats + 4u;
    sp_u64* const drafted_pos = stats + 4u + ck;
    if (threadIdx.x == 0u) accepted[b] = acc;
    if (threadIdx.x == 0u && drafted > 0u) {
        atomicAdd(stats + 0, 1ull);
        atomicAdd(stats + 1, (sp_u64)drafted);
        atomicAdd(stats + 2, (sp_u64)acc);
        atomicAdd(stats + 3, (sp_u64)acc + 1ull);
    }
    for (sp_u32 j = threadIdx.x; j < drafted; j += blockDim.x) {
        atomicAdd(drafted_pos + j, 1ull);
        if (j < acc) atomicAdd(acc_pos + j, 1ull);
    }
}

// Everything below is the chain kernel's own (its entry points and what only they call). The
// tree module (kernels::TREE_SOURCE, compiled on first tree use) defines SPECULA_TREE_MODULE
// and leaves it out: compiling the chain's four entries again there doubled the tree module's
// compile time for nothing.
#ifndef SPECULA_TREE_MODULE
// Everything below up to "the kernel" is used by specula_verify_logits and
// specula_verify_split_logits only.

// ---------------------------------------------------------------- sampling filters
// top-k, top-p, min-p as DETERMINISM.md defines them ("Sampling filters"): the kept ids are
// those whose key (sp_wkey of the weight) is >= theta; theta found by the radix descent over the
// key bits, 8 at a time, with exact integer counts and masses (the reference's Cut::of, the
// same passes in the same order, so the same theta and kept mass whatever the block or slice
// count). The weights: e = exp_p(l / T - m) for logits (T > 0), the stored values otherwise.
// Masses are sums of fix(w) = floor(w 2^64) (saturating at 2^128 - 1), exact 128-bit integers
// kept as four 32-bit limbs, each limb summed in 64 bits (below 2^64 for any V < 2^32; the
// tree kernel's Z uses the same scheme) and carried together at the end: any order, same bits.
struct sp_u128 {
    sp_u64 lo, hi;
};
__device__ __forceinline__ sp_u128 sp_add128(sp_u128 a, sp_u128 b) {
    sp_u128 r;
    r.lo = a.lo + b.lo;
    r.hi = a.hi + b.hi + (r.lo < a.lo ? 1ull : 0ull);
    return r;
}
// s0 + s1 2^32 + s2 2^64 + s3 2^96 (mod 2^128) from the four limb sums.
__device__ __forceinline__ sp_u128 sp_from_limbs(sp_u64 s0, sp_u64 s1, sp_u64 s2, sp_u64 s3) {
    sp_u128 r;
    r.lo = s0 + (s1 << 32);
    r.hi = s2 + (s1 >> 32) + (s3 << 32) + (r.lo < s0 ? 1ull : 0ull);
    return r;
}
// x << s (mod 2^128) of a u64 x, s < 128.
__device__ __forceinline__ sp_u128 sp_shl128(sp_u64 x, sp_u32 s) {
    sp_u128 r;
    r.lo = s >= 64u ? 0ull : x << s;
    r.hi = s >= 64u ? x << (s - 64u) : s == 0u ? 0ull : x >> (64u - s);
    return r;
}
// (x as f64), to nearest, ties to even (Rust's u128 as f64): the top 64 bits with the lost bits
// ORed into the lowest one (far below the 53-bit rounding point), converted, times 2^n.
__device__ __forceinline__ double sp_u128_f64(sp_u128 x) {
    if (x.hi == 0ull) return (double)x.lo;
    // bits of hi (1..64): one leading-zero count; the descent converts up to 256 bins a level on
    // one thread, where a loop over the bits took up to 64 iterations each.
    const sp_u32 n = 64u - (sp_u32)__clzll((long long)x.hi);
    const sp_u64 top = n == 64u ? x.hi | (x.lo != 0ull ? 1ull : 0ull)
                                : (x.hi << (64u - n)) | (x.lo >> n) |
                                      ((x.lo & ((1ull << n) - 1ull)) != 0ull ? 1ull : 0ull);
    return (double)top * sp_d((sp_u64)(1023u + n) << 52);
}
// fix(w) = floor(w 2^64) of a weight, as its 32-bit limbs: w = M 2^(E) (M the integer
// significand, below 2^24), fix(w) = floor(M 2^sh), sh = E + 64. For sh < 105 it has at most two
// nonzero limbs, j and j + 1: sh >= 0 gives M << (sh % 32) (below 2^55) at limb j = sh / 32
// (j = 3 only for sh <= 104: the shifted M is then below 2^32 and hi is 0); sh < 0 gives
// M >> -sh in limb 0 (0 for sh <= -32, M having 24 bits). w >= 2^64 (+inf included): sat, every
// limb 0xFFFFFFFF (saturation at 2^128 - 1). w <= 0 or NaN: no limb (lo = hi = 0, not sat).
// The same limbs as the four shifts of each limb this replaced (limb i = t >= 32 or t <= -32 ?
// 0 : t >= 0 ? M << t : M >> -t, t = sh - 32 i): for i < j, t >= 32; i = j, t = sh % 32; i = j + 1,
// t = sh % 32 - 32 and M >> (32 - sh % 32) is the high word of M << (sh % 32) (0 when sh % 32 = 0);
// i > j + 1, t <= -32.
struct sp_fix {
    sp_u32 j, lo, hi;
    bool sat;
};
__device__ __forceinline__ sp_fix sp_fix_of(float w) {
    const sp_u32 bits = __float_as_uint(w);
    const sp_u32 e = bits >> 23;
    const sp_i32 sh = (sp_i32)(e == 0u ? 1u : e) - 86;
    const sp_u64 m = (sp_u64)((bits & 0x007FFFFFu) | (e == 0u ? 0u : 0x00800000u));
    const sp_u64 v = sh < 0 ? (sh <= -32 ? 0ull : m >> (sp_u32)(-sh)) : m << ((sp_u32)sh & 31u);
    const bool pos = w > 0.0f;
    sp_fix f;
    f.j = sh < 0 ? 0u : (sp_u32)sh >> 5;
    f.lo = pos ? (sp_u32)v : 0u;
    f.hi = pos ? (sp_u32)(v >> 32) : 0u;
    f.sat = pos && sh >= 105;
    return f;
}
// Adds v to a u64 limb sum of the histogram in shared memory, as 32-bit atomics: the low word
// (little-endian: at the u64's address), and 1 to the high word when that addition wrapped. The
// final u64 is the exact sum whatever the order (each wrap of the low word is counted once, by
// the addition that made it). A u64 atomicAdd on shared memory is a compare-and-swap loop in
// SASS (no 64-bit ATOMS.ADD); this is one ATOMS.ADD and a compare.
__device__ __forceinline__ void sp_hist_add(sp_u64* bin, sp_u32 v) {
    unsigned int* w = reinterpret_cast<unsigned int*>(bin);
    const sp_u32 old = atomicAdd(w, v);
    if (old + v < old) atomicAdd(w + 1, 1u);
}
// fix(w) of a weight 0 < w < 1 as its two low limbs: fix(w) = hi 2^32 + lo, both below 2^32
// (fix(w) < 2^64). Exact in binary32: x = w 2^32 is a power-of-two scaling (w >= 2^-149 gives
// x >= 2^-117, normal; x < 2^32); hi = floor(x) (truncation, x >= 0) is x itself when x >= 2^23
// and below 2^23 otherwise, representable either way; x - hi is x's fraction, whose bits are
// some of x's, exact; (x - hi) 2^32 < 2^32 is exact again and truncates to floor(x 2^32) - hi 2^32.
// sp_fix_of's limbs j = 0 and 1 for such a w (its sh <= 63), as integers: the same fix(w).
__device__ __forceinline__ void sp_fix_small(float w, sp_u32& lo, sp_u32& hi) {
    const float x = w * 4294967296.0f;
    hi = (sp_u32)x;
    lo = (sp_u32)((x - (float)hi) * 4294967296.0f);
}
// The mass histogram's one value per weight: fix(w) = v 2^s exactly, v < 2^25, with the scale s
// a function of the key's top digit t = key >> 24 alone (sp_fix_scale), so a bin's mass is its
// sum of v shifted once. For 0 < w < 2^64 (key < 0x5F800000, t <= 95): t' = max(t, 43);
// v = trunc(w 2^(150 - 2t')), s = 2t' - 86. Proof: w's biased exponent field is 2t or 2t + 1
// and w = M' 2^(2t - 150) with M' < 2^25 an integer (the significand, times 2 for the odd
// exponent, and for t = 0 a subnormal's field is read as exponent 1: M' = 2 x its mantissa).
// t >= 43: w 2^(150 - 2t) = M' exactly (a power-of-two scaling to a 24-bit integer), and
// fix(w) = floor(M' 2^(2t - 86)) = M' << s, s >= 0. t < 43: w < 2^-41, w 2^64 < 2^23 is exact
// (scaling up) and truncates to floor(w 2^64) = fix(w), s = 0. The multiplier 2^(150 - 2t') has
// the biased exponent 277 - 2t' in [87, 191]: a normal binary32. The sum of v over a bin's ids
// is below V 2^25 < 2^57 (u64), and (sum v) << s = sum (v << s) = sum fix (mod 2^128).
__device__ __forceinline__ sp_u32 sp_fix_scale(sp_u32 top) { return top > 43u ? 2u * top - 86u : 0u; }
__device__ __forceinline__ sp_u32 sp_fix_scaled(float w, sp_u32 key) {
    // (277 - 2t') << 23 = (277 << 23) - (t' << 24), and t' << 24 = max(key's top byte, 43 << 24).
    const sp_u32 top = key & 0xFF000000u;
    return (sp_u32)(w * __uint_as_float(0x8A800000u - (top > 0x2B000000u ? top : 0x2B000000u)));
}

// The filters' shared memory: 256 bins of 2 words, then 6 words the deciding thread hands to
// the block. Declared by the logits entries only. A bin's words: the count (mode 1), or the sum
// of sp_fix_scaled's v (mode 2) and the number of saturated weights (w >= 2^64, fix 2^128 - 1):
// its mass is (sum << s) - saturated (mod 2^128), sp_bin_mass.
#define SP_HIST_BIN_WORDS 2u
#define SP_HIST_WORDS (256u * SP_HIST_BIN_WORDS + 6u)
#define SP_HIST_HAND (256u * SP_HIST_BIN_WORDS)
// One pass of the filters over the whole row (every thread of the block; the result in every
// thread): mode 0 the largest key; 3 the kept mass (key >= floor_) as limb sums in out[0..3];
// 1 / 2 the histogram (count / mass) by key digit (key >> shift) & 0xFF of the keys >= floor_
// whose higher digits equal prefix's (level 0: every key), into hist (zero before the pass).
//
// Which ids a pass adds, as one unsigned range test: key - lo_key <= hi_key - lo_key, with
// [lo_key, hi_key] the keys >= floor_ with prefix's higher digits, and key 0 left out: ids of key
// 0 change nothing. Their fix is 0 (no mass, modes 2 and 3; no key above the largest, mode 0 has
// its own test); in a count (mode 1, top-k) they are in bin 0 at level 0 and then only below a
// prefix of zeros, so they could only change the descent's choice where it chooses digit 0 at
// every level down to the last key-0 bin, i.e. theta_k = 0 or "none": with them, #{key >= 0} = V
// (theta_k = 0 if top_k <= V, none otherwise), without them the descent finds no digit (false).
// Either way sp_row_state keeps theta as it was (theta = max(theta, 0)). When theta_k > 0, the
// ids of key >= theta_k are all counted in every bin the descent chooses, so it chooses the same
// digits. The padded ids past the row's end (read as NaN: e = 0 for logits, key 0 for stored
// values) are left out by the same test, so the hot loop has no bounds test. Attacked by
// kernel_host_inputs.rs filter_key_zero_and_row_end_cases (top-k at the number of positive
// weights and above, rows ending inside a tile); a pad of 0 (e > 0 for logits) fails the
// logits conformance cases. (Leaving out key 1 as well would give theta 0 for top-k at the
// count of keys >= 1 where the rule gives 1: a difference in the key-0 ids only, whose weights
// are <= 0 or NaN, which no output shows.)
#define SP_FP_MAX 0u
#define SP_FP_COUNT 1u
#define SP_FP_MASS_HIST 2u
#define SP_FP_MASS 3u
// One id of a filter pass, its weight w and key sp_wkey(w) known: what mode adds of it (the
// pass's comment above; the ranges are sp_filter_pass's).
__device__ __forceinline__ void sp_filter_elem(sp_u32 mode, float w, sp_u32 key, sp_u32 lo_key,
                                               sp_u32 span, sp_u32 hot_lo, sp_u32 hot_span,
                                               sp_u32 shift, sp_u64* hist, sp_u64 acc[4], sp_u32& mx) {
    if (mode == SP_FP_MAX) {
        mx = key > mx ? key : mx;
        return;
    }
    if (mode == SP_FP_MASS_HIST && key - hot_lo > hot_span) {
        // Outside the hot range: out of the pass's range, or w >= 2^64 (stored values that are
        // not probabilities), counted as saturated.
        if (key - lo_key <= span) {
            SP_COLD_MARK();
            sp_u64* bin = hist + SP_HIST_BIN_WORDS * ((key >> shift) & 0xFFu);
            atomicAdd(reinterpret_cast<unsigned int*>(bin + 1u), 1u); // < V, no wrap
        }
        return;
    }
    // (The hot range is inside the pass's: the mass histogram needs no second test.)
    if (mode != SP_FP_MASS_HIST && key - lo_key > span) return; // also key 0, pads
    // w > 0 here: key is w's bits.
    sp_u64* bin = hist + SP_HIST_BIN_WORDS * ((key >> shift) & 0xFFu);
    if (mode == SP_FP_COUNT) {
        // A count: at most V < 2^32 in a bin's low word, which never wraps.
        atomicAdd(reinterpret_cast<unsigned int*>(bin), 1u);
    } else if (mode == SP_FP_MASS_HIST) {
        sp_hist_add(bin, sp_fix_scaled(w, key)); // w < 2^64 (the hot range)
    } else if (key >= 0x3F800000u) {
        // The kept mass, w >= 1: the largest weight of a logit row (e = 1) and stored values
        // of 1 or more; sp_fix_of's general limbs.
        SP_COLD_MARK();
        const sp_fix f = sp_fix_of(w);
        SP_UNROLLED
        for (sp_u32 q = 0; q < 4u; ++q)
            acc[q] += f.sat ? 0xFFFFFFFFull : (sp_u64)(q == f.j ? f.lo : q == f.j + 1u ? f.hi : 0u);
    } else {
        sp_u32 lo, hi;
        sp_fix_small(w, lo, hi);
        acc[0] += lo;
        acc[1] += hi;
    }
}
// ---- sp_filter_sparse: the histogram passes over few ids without every id's exact weight
// (issue 30). A count or mass histogram pass (modes 1, 2) adds only the ids whose key lies in
// [lo_key, hi_key]. At a descent level >= 1 that range is one bin of the level above (two
// octaves of weights at level 1, 2^-7 of that at level 2, 2^-15 at level 3), and with a floor
// (top-p's descent after top-k or min-p) the keys above the threshold: few ids on real rows.
// kernel_host_inputs.rs filter_sparse_passes_are_rare_on_real_rows counts them on 128256
// logits at T 0.8, one token of p ~ 0.7 over a 2 randn background ("peaked") and that
// background alone ("flat"): the exact weights a pass takes are 0.005-0.06 % of the ids in
// top-k 50's levels 1-3 and in top-p's first level above top-k 50's threshold, 0.14-0.55 % in
// top-p 0.9's levels 2-3, and 4.3 % (peaked) / 11.2 % (flat) in top-p 0.9's level 1 (the ids
// of the two octaves around the threshold). Those passes read a bound of each id's key first,
// and compute the exact weight (sp_soft_e: the quotient and exp_p, ~30 instructions) only for
// the ids the bound cannot place outside the range, in a cold region; the others are skipped,
// as the exact path skips them. Level 0 without a floor (every id with a weight is in range),
// the maximum and the kept mass keep the dense loop. Same adds, same bins, same bits.
// The bound, for logit rows (lg): u = sp_weight_ub (the race's, with the
// row's c and b: sp_race_ub_of), ku = bits(u) (u is a positive normal binary32, sp_exp2_ub).
//   * Below: u >= e >= 0 (sp_race_ub's proof: every row, bounded or off, whose m is the row's
//     softmax maximum, as sp_row_state's is), so key(e) <= ku (key(e) = bits(e), or 0 for
//     e = 0), and ku < lo_key proves key(e) < lo_key.
//   * Above (bounded rows only: c != 0, so c is normal and |m| <= 2^20): ku > sk_hi =
//     hi_key + C (saturating) with C = 2^23 (|m| 2^-19 + 2^-13 + 0.0920) proves key(e) > hi_key
//     or e = 0 (key 0, below lo_key >= 1). Proof, for e > 0 (x = RN(z - m) > -87): sp_exp2_ub
//     builds bits(u) = 2^23 (127 + (N + 1) / 256) exactly with N <= 256 Y + 1/2, Y = min(max(y,
//     -126), 64), so ku <= 2^23 (127 + Y + 3/512). Here Y = y: sp_race_ub's proof gives y >= x
//     log2(e) > -125.6 (its d outweighs the roundings) and y < 1.6. e is normal (exp_p's least
//     nonzero value is 0x1.666dcp-126), and for a normal v = 2^E (1 + f), bits(v) = 2^23 (127 +
//     E + f) >= 2^23 (127 + log2 v - 0.08608) (log2(1 + f) - f <= log2(1 / ln 2) - 1 / ln 2 + 1
//     < 0.08608 on [0, 1)). exp_p is within 2^-20 of e^x on (-87, 0] (relative; checked on
//     every binary32 argument, host-std sum_bound's exp_rough_is_within_its_bound), so log2 e
//     >= x log2(e) - 1.5e-6, and sp_race_ub's proof gives |y - x log2(e) - (m log2(e) - b)| <=
//     2^-24 (4.8 |m| + 680) with m log2(e) - b <= d + 2^-24 (3.4 |m| + 1) (the same roundings
//     as its lower bound), d <= |m| 2^-20 + 2^-14 + 2^-150: y - log2 e <= |m| 2^-20 + 2^-14 +
//     2^-24 (8.2 |m| + 681) + 1.5e-6 < |m| 2^-19 + 2^-13 + 1.5e-6. So ku - key(e) <= 2^23 (y -
//     log2 e + 3/512 + 0.08608) < 2^23 (|m| 2^-19 + 2^-13 + 0.09195) <= C, and key(e) >= ku - C
//     > sk_hi - C >= hi_key. C as computed: |m| 16 is exact (|m| <= 2^20), its truncation loses
//     less than 1, and 0xBD000 = 774144 >= 2^23 (2^-13 + 0.09195) + 1 = 772348.
//     Off rows (c = 0): sk_hi = ~0, no claim above.
// Stored values (!lg): ku is the key itself and sk_hi = hi_key: the test is the exact one.
// One unsigned test ku - lo_key > sk_hi - lo_key skips both sides (lo_key <= hi_key <= sk_hi
// whenever the pass has any range, !none). Attacked by kernel_host_inputs.rs
// filter_sparse_passes_are_exact (the passes against their definition on hostile rows: ids at
// the ranges' edges, |m| up to and past 2^20, off rows, NaN, infinities).
__device__ __forceinline__ sp_u32 sp_filter_skip_hi(bool lg, const sp_race_ub& rub, float m,
                                                    sp_u32 hi_key) {
    if (!lg) return hi_key;
    if (rub.c == 0.0f) return 0xFFFFFFFFu;
    const float am = m < 0.0f ? -m : m; // |m| <= 2^20 on a bounded row
    const sp_u32 c = (sp_u32)(am * 16.0f) + 0xBD000u;
    return hi_key > 0xFFFFFFFFu - c ? 0xFFFFFFFFu : hi_key + c;
}
template <sp_u32 FX>
SP_NOINLINE __device__ void sp_filter_pass(const float* row, sp_u32 vocab, const sp_soft& st, bool lg,
                               sp_u32 mode, sp_u32 level, sp_u32 prefix, sp_u32 floor_,
                               sp_u64* hist, sp_u64* s_red, sp_u64 out[4]) {
    const sp_u32 fmt = FX == SP_FX_ANY ? st.tf : FX;
    const sp_u32 groups = (vocab + 3u) / 4u;
    const sp_u32 full = sp_full(row, vocab, fmt);
    const sp_u32 shift = 24u - 8u * level;
    const sp_u32 step = blockDim.x * SP_UNROLL_RACE;
    // The keys a histogram or mass pass adds: [lo_key, lo_key + span]. 256 << 24 wraps to 0 in
    // u32: at level 0 the prefix's digits are none and the span every key.
    const sp_u32 width = (256u << shift) - 1u; // the keys under one prefix, less one
    const sp_u32 base = prefix & ~width; // 0 at level 0
    const sp_u32 lo_key = base > floor_ ? (base > 1u ? base : 1u) : (floor_ > 1u ? floor_ : 1u);
    const sp_u32 hi_key = base + width;
    const sp_u32 span = hi_key - lo_key;
    // No key in range (floor_ above the prefix's keys): the pass adds nothing.
    const bool none = mode != SP_FP_MAX && lo_key > hi_key;
    // The mass histogram's hot range: its keys below 2^64 ([hot_lo, hot_lo + hot_span], empty
    // as [~0, ~0] when every key in range is saturated: no key reaches ~0); the saturated ones
    // are tested only for the ids outside it.
    const sp_u32 hot_hi = hi_key < 0x5F800000u ? hi_key : 0x5F7FFFFFu;
    const sp_u32 hot_lo = lo_key <= hot_hi ? lo_key : 0xFFFFFFFFu;
    const sp_u32 hot_span = lo_key <= hot_hi ? hot_hi - lo_key : 0u;
    // The state's values in registers: read through the reference inside the loop they are
    // reloaded from the caller's stack at every id (the histogram's atomics may alias it).
    const float st_t = st.t, st_m = st.m;
    sp_u32 mx = 0u;
    sp_u64 acc[4] = {0ull, 0ull, 0ull, 0ull};
    // The histogram passes whose range [lo_key, hi_key] holds few ids on real rows (a descent
    // level >= 1, or a floor from top-k / min-p): each id's bound first, its exact weight only
    // where the bound cannot place it outside the range (sp_filter_skip_hi's comment). The
    // tile's values die with their bounds: the few ids left are read again, one at a time, in
    // the cold region (ptxas spilled on a race loop's hot path in the logits entries while this
    // loop kept its tile for the cold region).
    const bool sparse = (mode == SP_FP_COUNT || mode == SP_FP_MASS_HIST) && (level != 0u || floor_ != 0u);
    if (sparse) {
        const sp_race_ub rub = sp_race_ub_of<SP_P_SOFT>(&st, false);
        const sp_u32 sk_span = sp_filter_skip_hi(lg, rub, st_m, hi_key) - lo_key; // lo_key <= hi_key
        for (sp_u32 g0 = threadIdx.x; !none && g0 < groups; g0 += step) {
            float x[SP_UNROLL_RACE][4];
            sp_load_tile<SP_UNROLL_RACE, FX>(row, g0, blockDim.x, vocab, full, sp_f(0x7FC00000u), x, fmt);
            // Bit 4 u + i: id i of group u may lie in the range. The bound's key: sp_weight_ub (a
            // positive normal binary32 for logits: its bits are its key; the pad's NaN gives
            // 2^-126), or the stored value's own key (the pad's NaN: 0, never in the range).
            sp_u32 may = 0u;
            SP_UNROLLED
            for (sp_u32 u = 0; u < SP_UNROLL_RACE; ++u) {
                SP_UNROLLED
                for (sp_u32 i = 0; i < 4u; ++i) {
                    const sp_u32 ku = lg ? __float_as_uint(sp_weight_ub<SP_P_SOFT>(x[u][i], st, rub))
                                         : sp_wkey(x[u][i]);
                    may |= (ku - lo_key <= sk_span ? 1u : 0u) << (4u * u + i);
                }
            }
            if (may == 0u) continue; // every id provably outside [lo_key, hi_key]
            SP_COLD_MARK(); // the few ids in or near the range
            do {
                const sp_u32 j = (sp_u32)__ffs((int)may) - 1u;
                may &= may - 1u;
                const sp_u32 v = (g0 + (j >> 2) * blockDim.x) * 4u + (j & 3u);
                const float xv = v < vocab ? sp_rd(row, v, fmt) : sp_f(0x7FC00000u);
                SP_FILTER_EXACT();
                const float w = lg ? sp_soft_e(xv, st_t, st_m) : xv;
                sp_filter_elem(mode, w, sp_wkey(w), lo_key, span, hot_lo, hot_span, shift, hist, acc, mx);
            } while (may != 0u);
        }
        // Returned from here, the other modes' acc and mx are not live across this loop.
        __syncthreads(); // the histogram is complete
        return;
    } else {
        for (sp_u32 g0 = threadIdx.x; !none && g0 < groups; g0 += step) {
            float x[SP_UNROLL_RACE][4];
            // Past the row's end: NaN, whose weight has key 0 (e = 0 for logits), which no pass adds.
            sp_load_tile<SP_UNROLL_RACE, FX>(row, g0, blockDim.x, vocab, full, sp_f(0x7FC00000u), x, fmt);
            SP_UNROLLED
            for (sp_u32 u = 0; u < SP_UNROLL_RACE; ++u) {
                // Unrolled, as every loop over a tile's or a mass's 4 elements here: an index known
                // at compile time keeps x, l and acc in registers (a loop left rolled indexes them
                // in local memory).
                SP_UNROLLED
                for (sp_u32 i = 0; i < 4u; ++i) {
                    const float w = lg ? sp_soft_e(x[u][i], st_t, st_m) : x[u][i];
                    sp_filter_elem(mode, w, sp_wkey(w), lo_key, span, hot_lo, hot_span, shift, hist, acc, mx);
                }
            }
        }
    }
    if (mode == SP_FP_MAX) {
        out[0] = sp_block_reduce((sp_u64)mx, true, s_red);
    } else if (mode == SP_FP_MASS) {
        SP_UNROLLED
        for (sp_u32 q = 0; q < 4u; ++q) out[q] = sp_block_reduce(acc[q], false, s_red);
    } else {
        __syncthreads(); // the histogram is complete
    }
}
// A mass histogram bin's mass (sp_fix_scaled), u128: (sum << s) - saturated, s of the bin's keys'
// top digit; s >= 128 only for keys >= 2^64, all saturated (sum 0).
__device__ __forceinline__ sp_u128 sp_bin_mass(const sp_u64* bin, sp_u32 top) {
    const sp_u32 s = sp_fix_scale(top);
    sp_u128 m = s < 128u ? sp_shl128(bin[0], s) : sp_shl128(0ull, 0u);
    const sp_u64 sat = bin[1];
    m.hi -= m.lo < sat ? 1ull : 0ull;
    m.lo -= sat;
    return m;
}
// The kept mass of the keys >= floor_.
template <sp_u32 FX>
__device__ sp_u128 sp_filter_mass(const float* row, sp_u32 vocab, const sp_soft& st, bool lg,
                                  sp_u32 floor_, sp_u64* hist, sp_u64* s_red) {
    sp_u64 o[4];
    sp_filter_pass<FX>(row, vocab, st, lg, SP_FP_MASS, 0u, 0u, floor_, hist, s_red, o);
    return sp_from_limbs(o[0], o[1], o[2], o[3]);
}
// The radix descent (the reference's `descend`): the largest theta >= floor_ whose F(theta)
// (count, or mass when `mass`, of the keys >= theta) satisfies the predicate (count >= topk, or
// (F as f64) >= target); false if F(floor_) does not. Four histogram passes; thread 0 scans the
// 256 bins from the top and hands the digit to the block through hist[SP_HIST_HAND..].
template <sp_u32 FX>
__device__ bool sp_descend(const float* row, sp_u32 vocab, const sp_soft& st, bool lg,
                           sp_u32 floor_, bool mass, sp_u32 topk, double target, sp_u64* hist,
                           sp_u64* s_red, sp_u32& theta, sp_u128& f) {
    sp_u32 prefix = 0u;
    sp_u128 above;
    above.lo = above.hi = 0ull;
    for (sp_u32 level = 0; level < 4u; ++level) {
        for (sp_u32 i = threadIdx.x; i < SP_HIST_HAND; i += blockDim.x) hist[i] = 0ull;
        __syncthreads();
        sp_u64 unused[4];
        sp_filter_pass<FX>(row, vocab, st, lg, mass ? SP_FP_MASS_HIST : SP_FP_COUNT, level, prefix,
                           floor_, hist, s_red, unused);
        if (threadIdx.x == 0u) {
            sp_u128 acc = above, with = above;
            sp_u64 chosen = 256ull; // none
            for (sp_u32 n = 0; n < 256u; ++n) {
                const sp_u32 d = 255u - n;
                const sp_u64* bin = hist + SP_HIST_BIN_WORDS * d;
                sp_u128 g;
                if (mass) {
                    // The ids' top key digit: the bin's at level 0, the prefix's below.
                    g = sp_bin_mass(bin, level == 0u ? d : prefix >> 24);
                } else {
                    g.lo = bin[0];
                    g.hi = 0ull;
                }
                with = sp_add128(acc, g);
                const bool ok = mass ? sp_u128_f64(with) >= target
                                     : (with.hi != 0ull || with.lo >= (sp_u64)topk);
                if (ok) {
                    chosen = d;
                    break;
                }
                acc = with;
            }
            hist[SP_HIST_HAND + 0u] = chosen;
            hist[SP_HIST_HAND + 1u] = acc.lo;
            hist[SP_HIST_HAND + 2u] = acc.hi;
            hist[SP_HIST_HAND + 3u] = with.lo;
            hist[SP_HIST_HAND + 4u] = with.hi;
        }
        __syncthreads();
        const sp_u64 chosen = hist[SP_HIST_HAND + 0u];
        sp_u128 acc, with;
        acc.lo = hist[SP_HIST_HAND + 1u];
        acc.hi = hist[SP_HIST_HAND + 2u];
        with.lo = hist[SP_HIST_HAND + 3u];
        with.hi = hist[SP_HIST_HAND + 4u];
        __syncthreads(); // read by every thread before the next level clears and writes
        if (chosen == 256ull) return false;
        above = acc;
        prefix |= (sp_u32)chosen << (24u - 8u * level);
        if (level == 3u) {
            theta = prefix > floor_ ? prefix : floor_;
            f = with;
        }
    }
    return true;
}

// A request's sampling filter (core/src/verify/filter.rs, `Filter`; DETERMINISM.md "Sampling
// filters"): the one value a sampling parameter lives in, read from the request's sampling
// words (u32 x SP_SAMPLING_WORDS: the method code, then `Filter::words`: top_k (0 off), top_p's
// bits (in (0, 1], 1 off), min_p's bits (in [0, 1], 0 off)).
#define SP_SAMPLING_WORDS 4u
#define SP_SAMPLING_METHOD 0u
#define SP_SAMPLING_TOP_K 1u
#define SP_SAMPLING_TOP_P 2u
#define SP_SAMPLING_MIN_P 3u
struct sp_filter {
    sp_u32 top_k;
    float top_p;
    float min_p;
};
__device__ __forceinline__ sp_filter sp_filter_none() {
    sp_filter f;
    f.top_k = 0u;
    f.top_p = 1.0f;
    f.min_p = 0.0f;
    return f;
}
__device__ __forceinline__ sp_filter sp_filter_from(const sp_u32* w) {
    sp_filter f;
    f.top_k = w[SP_SAMPLING_TOP_K];
    f.top_p = sp_f(w[SP_SAMPLING_TOP_P]);
    f.min_p = sp_f(w[SP_SAMPLING_MIN_P]);
    return f;
}
// Whether any part is on (`Filter::is_active`).
__device__ __forceinline__ bool sp_filter_on(const sp_filter& f) {
    return f.top_k != 0u || f.top_p < 1.0f || f.min_p > 0.0f;
}
// Whether every part is in its range, NaN failing (`Filter::out_of_range` is none).
__device__ __forceinline__ bool sp_filter_ok(const sp_filter& f) {
    return f.top_p > 0.0f && f.top_p <= 1.0f && f.min_p >= 0.0f && f.min_p <= 1.0f;
}

// The state of one target row as the method reads it (sp_soft, computed over the whole row by
// every thread of the block, every thread gets it): logits at T > 0, the softmax maximum and
// either the exact sum (no filter: SP_P_SOFT, the code without filters) or the filter's
// threshold and kept mass; probabilities with a filter, the threshold and kept mass
// (SP_P_CUT); otherwise the stored values (SP_P_RAW). lg: logits at T = t > 0.
template <sp_u32 FX>
SP_NOINLINE __device__ sp_soft sp_row_state(const float* row, sp_u32 vocab, bool lg, float t,
                                sp_u32 top_k, float top_p, float min_p, sp_u32 tf, sp_u32 df,
                                sp_u64* hist, sp_u64* s_red) {
    // The filter's parts come as scalars: passed whole (by value, or as the sampling words'
    // address) ptxas spilled more around this call in specula_verify_split_logits (300+460
    // spill bytes became 320+660 / 300+624 on sm_90, kernel-report.py).
    sp_filter flt;
    flt.top_k = top_k;
    flt.top_p = top_p;
    flt.min_p = min_p;
    sp_soft st = sp_soft_of(lg ? t : 1.0f, 0.0f, 0.0, 0u, SP_P_RAW, tf, df);
    const bool filt = sp_filter_on(flt);
    if (!lg && !filt) return st;
    if (lg) {
        st.m = sp_max_of_key(sp_softmax_max_part<FX>(row, vocab, t, threadIdx.x, blockDim.x, s_red, tf));
        if (!filt) {
            sp_u64 h, l;
            sp_softmax_sum_part<FX>(row, vocab, t, st.m, threadIdx.x, blockDim.x, s_red, h, l, tf);
            st.s = sp_soft_sum(h, l);
            st.kind = SP_P_SOFT;
            return st;
        }
    }
    sp_u32 theta = 0u;
    if (flt.min_p > 0.0f) {
        sp_u64 o[4];
        sp_filter_pass<FX>(row, vocab, st, lg, SP_FP_MAX, 0u, 0u, 0u, hist, s_red, o);
        theta = sp_wkey(flt.min_p * __uint_as_float((sp_u32)o[0]));
    }
    sp_u128 f;
    if (flt.top_k != 0u) {
        sp_u32 tk = 0u;
        if (sp_descend<FX>(row, vocab, st, lg, 0u, false, flt.top_k, 0.0, hist, s_red, tk, f))
            theta = tk > theta ? tk : theta;
    }
    sp_u128 kept = sp_filter_mass<FX>(row, vocab, st, lg, theta, hist, s_red);
    if (flt.top_p < 1.0f && (kept.lo | kept.hi) != 0ull) {
        const double target = (double)flt.top_p * sp_u128_f64(kept);
        sp_u32 tp = 0u;
        if (sp_descend<FX>(row, vocab, st, lg, theta, true, 0u, target, hist, s_red, tp, f)) {
            theta = tp;
            kept = f;
        }
    }
    st.theta = theta;
    st.s = sp_u128_f64(kept) * sp_d(0x3BF0000000000000ull); // 2^-64
    st.kind = lg ? (theta == 0u ? SP_P_SOFT : SP_P_SOFT_CUT) : SP_P_CUT;
    return st;
}

// ---------------------------------------------------------------- the kernel
// The logits entries' trailing inputs (core/src/kernels.rs, VERIFY_LOGITS_ENTRY), all null in
// the other entries (the compiler then removes every path that reads them):
//   sampling  (u32 x SP_SAMPLING_WORDS x B): request b's words at b * SP_SAMPLING_WORDS: its
//             method code (SP_METHOD_*), then its filter (sp_filter); null: the shape word's
//             method, no filter;
//   recovered (u32, one per draft slot): vLLM's recovered_token_ids (DETERMINISM.md); null: not
//             written;
//   draft_first_row (u32 x B): mixed drafters, request b's first draft row, SP_SENTINEL for a
//             one-hot drafter's request; null: the layout's rows.
struct sp_inputs {
    const sp_u32* sampling;
    sp_u32* recovered;
    const sp_u32* draft_first_row;
    sp_u64* hist; // the filters' shared memory (SP_HIST_WORDS), the logits entries only
};
__device__ __forceinline__ sp_inputs sp_no_inputs() {
    sp_inputs in;
    in.sampling = 0;
    in.recovered = 0;
    in.draft_first_row = 0;
    in.hist = 0;
    return in;
}
// The logits entries' inputs from the argument block; `hist`: their shared memory.
__device__ __forceinline__ sp_inputs sp_inputs_of(const sp_args& a, sp_u64* hist) {
    sp_inputs in;
    in.sampling = a.sampling;
    in.recovered = a.recovered;
    in.draft_first_row = a.draft_first_row;
    in.hist = hist;
    return in;
}
// Request b's sampling words (null without them).
__device__ __forceinline__ const sp_u32* sp_sampling_of(const sp_inputs& in, sp_u32 b) {
    return in.sampling != 0 ? in.sampling + (sp_u64)b * SP_SAMPLING_WORDS : 0;
}
// The argument block's fields every body takes first.
#define SP_COMMON(a)                                                                              \
    (a).shape, (a).k, (a).draft_ids, (a).draft_probs, (a).target_probs, (a).seed, (a).offset,    \
        (a).eps, (a).delta, (a).accepted, (a).tokens, (a).stats
// A request's error bit from the logits entries' inputs (0: fine): a method code above 2 or a
// filter out of its range (sp_filter_ok) skip the request (SP_ERR_PARAM).
__device__ __forceinline__ sp_u32 sp_inputs_error(const sp_inputs& in, sp_u32 b) {
    const sp_u32* const w = sp_sampling_of(in, b);
    if (w == 0) return 0u;
    if (w[SP_SAMPLING_METHOD] > SP_METHOD_TYPICAL) return SP_ERR_PARAM;
    return sp_filter_ok(sp_filter_from(w)) ? 0u : SP_ERR_PARAM;
}
// Request b's filter (none where the entry has no sampling words).
__device__ __forceinline__ sp_filter sp_filter_of(const sp_inputs& in, sp_u32 b) {
    const sp_u32* const w = sp_sampling_of(in, b);
    return w != 0 ? sp_filter_from(w) : sp_filter_none();
}
// A skipped request's recovered slots: the sentinel, padded (k_max slots) or ragged (its kb
// slots, when kb is within k_max: a decreasing cumulative count leaves them alone).
__device__ __forceinline__ void sp_recovered_skip(sp_u32* rec, const sp_layout& lay, sp_u32 b,
                                                  sp_u32 k_max) {
    if (rec == 0) return;
    const sp_u32 n = lay.ragged ? (lay.kb <= k_max ? lay.kb : 0u) : k_max;
    for (sp_u32 j = threadIdx.x; j < n; j += blockDim.x) rec[sp_slot(lay, b, k_max) + j] = SP_SENTINEL;
}

// Whether request b has draft rows, and the first one (*row): where the layout puts them, or
// (mixed drafters, the logits entries) where draft_first_row says; none, a one-hot drafter's,
// for SP_SENTINEL.
template <bool X>
__device__ __forceinline__ bool sp_draft_rows(const sp_inputs& in, const sp_layout& lay, sp_u32 b,
                                              sp_u32 k_max, bool draft_flag, sp_u64* row) {
    *row = sp_slot(lay, b, k_max);
    if (!X || in.draft_first_row == 0) return draft_flag;
    const sp_u32 f = in.draft_first_row[b];
    *row = f;
    return draft_flag && f != SP_SENTINEL;
}

// Request b of a chain entry before its rows (both bodies): its layout, the caller's bonus token
// (null: sampled), its token outputs (k_max + 1 words), its error bit (0: valid; the logits
// entries add sp_inputs_error's).
struct sp_chain_req {
    sp_layout lay;
    const sp_u32* bon;
    sp_u32* out;
    sp_u32 bad;
};
template <bool X>
__device__ __forceinline__ sp_chain_req sp_chain_req_of(const sp_shape& sh, const sp_u32* k,
                                                        const sp_u32* cu, const sp_u32* bonus,
                                                        const sp_u32* draft_ids, sp_u32* tokens,
                                                        const sp_inputs& in, sp_u32 b) {
    sp_chain_req cr;
    cr.lay = sp_layout_of(k, cu, bonus, b, sh.k_max);
    cr.bon = bonus != 0 ? bonus + b : 0;
    cr.bad = sp_request_error(draft_ids + sp_slot(cr.lay, b, sh.k_max), cr.lay.kb, sh.k_max,
                              sh.vocab, cr.bon);
    if (X && cr.bad == 0u) cr.bad = sp_inputs_error(in, b);
    cr.out = tokens + (sp_u64)b * (sh.k_max + 1u);
    return cr;
}
// A skipped request: its outputs read "nothing accepted, nothing emitted"; not counted.
template <bool X>
__device__ __forceinline__ void sp_chain_skip(const sp_chain_req& cr, sp_u32 k_max,
                                              const sp_inputs& in, sp_u32 b, sp_u32* accepted,
                                              sp_u64* err) {
    for (sp_u32 j = threadIdx.x; j <= k_max; j += blockDim.x) cr.out[j] = SP_SENTINEL;
    if (X) sp_recovered_skip(in.recovered, cr.lay, b, k_max);
    sp_refuse_request(accepted, b, err, cr.bad);
}

// How a chain entry reads request b's rows: the first target row (the logits when given) and
// draft row (null without draft rows), strides and element formats (binary32 unless the logits
// entry's flags say otherwise); the logits entry's filter (none at T = 0: greedy on the logits);
// `proc`: the rows need a state (softmax and / or filter) before any value.
struct sp_chain_rows {
    const float* tbase;
    const float* dbase;
    sp_u32 tstride, dstride, tf, df;
    bool has_draft, proc;
    sp_filter flt;
};
template <bool X>
__device__ __forceinline__ sp_chain_rows sp_chain_rows_of(const sp_shape& sh, const sp_chain_req& cr,
                                                          const sp_request& rq, const sp_inputs& in,
                                                          sp_u32 b, const float* target_probs,
                                                          const float* logits,
                                                          const float* draft_probs) {
    sp_chain_rows rw;
    rw.tstride = sh.tstride;
    rw.dstride = sh.dstride;
    rw.tf = X ? sp_target_fmt(sh.flags) : SP_FMT_F32;
    rw.df = X ? sp_draft_fmt(sh.flags) : SP_FMT_F32;
    rw.flt = X ? sp_filter_of(in, b) : sp_filter_none();
    rw.proc = X ? rq.soft || (!rq.lg && sp_filter_on(rw.flt)) : rq.soft;
    rw.tbase = sp_at(rq.lg ? logits : target_probs, cr.lay.trow * sh.tstride, rw.tf);
    sp_u64 frow = 0;
    rw.has_draft = sp_draft_rows<X>(in, cr.lay, b, sh.k_max, sh.draft, &frow);
    rw.dbase = rw.has_draft ? sp_at(draft_probs, frow * sh.dstride, rw.df) : 0;
    return rw;
}
// Target row j, and draft row j (null without draft rows).
__device__ __forceinline__ const float* sp_trow(const sp_chain_rows& rw, sp_u32 j) {
    return sp_at(rw.tbase, (sp_u64)j * rw.tstride, rw.tf);
}
__device__ __forceinline__ const float* sp_drow(const sp_chain_rows& rw, sp_u32 j) {
    return rw.has_draft ? sp_at(rw.dbase, (sp_u64)j * rw.dstride, rw.df) : 0;
}
// The state of target row trow, in every thread (block-uniform call): the logits entries'
// sp_row_state (softmax and / or filter), else the softmax (softmax rows only).
template <bool X>
__device__ __forceinline__ sp_soft sp_chain_state(const float* trow, sp_u32 vocab,
                                                  const sp_request& rq, const sp_chain_rows& rw,
                                                  const sp_inputs& in, sp_u64* s_red) {
    if (X)
        return sp_row_state<SP_FX_ANY>(trow, vocab, rq.soft, rq.temp, rw.flt.top_k, rw.flt.top_p,
                                       rw.flt.min_p, rw.tf, rw.df, in.hist, s_red);
    return sp_softmax_state(trow, vocab, rq.temp, threadIdx.x, blockDim.x, s_red);
}
// The target probability of id x in row trow (state st): the logits entries' any kind, else
// the softmax's (soft) or the stored value.
template <bool X>
__device__ __forceinline__ float sp_chain_p(const float* trow, sp_u32 x, const sp_chain_rows& rw,
                                            const sp_soft& st, bool soft) {
    if (X) return sp_proc_any(sp_rd(trow, x, rw.tf), st);
    return soft ? sp_soft_p(trow[x], st) : trow[x];
}
// Rejection sampling's acceptance test of draft position j (stream 0, one Philox block).
__device__ __forceinline__ bool sp_accept_at(const sp_request& rq, sp_u32 j, float pt, float pd) {
    sp_u32 c[4] = {0u, (j << 2) | 0u, rq.off_lo, rq.off_hi};
    sp_philox(c, rq.k0, rq.k1);
    return sp_accepts(((sp_u64)c[0] << 32) | (sp_u64)c[1], pt, pd);
}
// The request's token outputs: the accepted draft ids (ids: its first), the emitted token, then
// sentinels (k_max + 1 words).
__device__ __forceinline__ void sp_chain_outputs(sp_u32* out, const sp_u32* ids, sp_u32 k_max,
                                                 sp_u32 acc, sp_u32 emitted) {
    for (sp_u32 j = threadIdx.x; j <= k_max; j += blockDim.x)
        out[j] = j < acc ? ids[j] : (j == acc ? emitted : SP_SENTINEL);
}

// The body of specula_verify (X = false: cu (ragged layout) and bonus (caller's bonus tokens)
// null for the padded layout with sampled bonus tokens; logits and `in` null) and of
// specula_verify_logits (X = true: every input of the logits entry). The X paths are separate
// code.
template <bool X>
__device__ __forceinline__ void
sp_verify_body(const sp_u32* __restrict__ shape, const sp_u32* __restrict__ k,
               const sp_u32* __restrict__ draft_ids, const float* __restrict__ draft_probs,
               const float* __restrict__ target_probs, const sp_u64* __restrict__ seed,
               const sp_u64* __restrict__ offset, const float* __restrict__ eps,
               const float* __restrict__ delta, sp_u32* __restrict__ accepted,
               sp_u32* __restrict__ tokens, sp_u64* __restrict__ stats,
               const sp_u32* __restrict__ cu, const sp_u32* __restrict__ bonus,
               const float* __restrict__ logits, const float* __restrict__ temperature,
               const sp_inputs& in, sp_u64* s_red) {

    const sp_shape sh = sp_shape_of(shape);
    const sp_u32 b = blockIdx.x;
    if (b >= sh.batch) return;
    sp_u64* const err = sp_err_word(stats, sh.ck);
    // batch <= gridDim.x: a batch above the launch's capacity would leave requests without a
    // block, silently; the whole launch refuses it instead.
    if (!(sh.batch <= gridDim.x && sp_shape_ok(sh) && sp_flags_ok(sh.flags, X))) {
        sp_refuse_launch(err);
        return;
    }
    const sp_chain_req cr = sp_chain_req_of<X>(sh, k, cu, bonus, draft_ids, tokens, in, b);
    if (cr.bad != 0u) {
        sp_chain_skip<X>(cr, sh.k_max, in, b, accepted, err);
        return;
    }
    // Target logits (DETERMINISM.md): T = 0 is greedy on the logit rows; T > 0 reads every
    // target value through the row's softmax (sp_soft_p), computed on the fly. The logits entry:
    // request b's own method and filter.
    const sp_request rq = sp_request_of(seed, offset, logits, temperature, b, sh.method,
                                        X ? sp_sampling_of(in, b) : 0);
    const sp_chain_rows rw = sp_chain_rows_of<X>(sh, cr, rq, in, b, target_probs, logits, draft_probs);
    const sp_u32 kb = cr.lay.kb;
    const sp_u32 vocab = sh.vocab;
    // Draft id j (the slot recomputed where used: no more live registers).
    auto id_at = [&](sp_u32 j) { return draft_ids[sp_slot(cr.lay, b, sh.k_max) + j]; };
    sp_soft st = sp_soft_raw(rw.tf, rw.df);
    // Row trow's state, in every thread (block-uniform call).
    auto row_state = [&](const float* trow) { st = sp_chain_state<X>(trow, vocab, rq, rw, in, s_red); };
    // The token emitted if position j (row trow) is the first rejected one (state of the row
    // in st): the method's rule at j (rejection: the residual race, then the plain race).
    auto recover = [&](sp_u32 j, const float* trow, sp_u32 x) -> sp_u32 {
        if (rq.meth == SP_METHOD_GREEDY)
            return sp_pass_argmax<X>(trow, vocab, s_red, st, rq.soft);
        sp_u64 win = 0ull;
        if (rq.meth == SP_METHOD_REJECTION)
            win = sp_pass_race<X>(trow, sp_drow(rw, j), true, x, vocab, j, rq, s_red, st, rq.soft);
        if (win == 0ull) win = sp_pass_race<X>(trow, 0, false, 0u, vocab, j, rq, s_red, st, rq.soft);
        return (sp_u32)win; // 0 when none
    };

    sp_u32 acc = 0u;
    sp_u32 emitted = 0u;
    bool rejected = false;
    for (sp_u32 j = 0; j < kb && !rejected; ++j) {
        const sp_u32 x = id_at(j);
        const float* trow = sp_trow(rw, j);
        if (rw.proc) row_state(trow);
        const float pt = sp_chain_p<X>(trow, x, rw, st, rq.soft);
        bool accept;
        if (rq.meth == SP_METHOD_REJECTION) {
            const float pd = rw.has_draft ? sp_rd(sp_drow(rw, j), x, rw.df) : 1.0f;
            accept = sp_accept_at(rq, j, pt, pd);
            if (!accept) emitted = recover(j, trow, x);
        } else if (rq.meth == SP_METHOD_GREEDY) {
            const sp_u32 am = sp_pass_argmax<X>(trow, vocab, s_red, st, rq.soft);
            accept = x == am;
            emitted = am;
        } else {
            const float h = sp_pass_entropy<X>(trow, vocab, s_red, st, rq.soft);
            accept = pt > sp_typical_threshold(h, eps[b], delta[b]);
            if (!accept) emitted = recover(j, trow, x);
        }
        if (accept) ++acc; else rejected = true;
    }
    if (!rejected && cr.bon != 0) {
        emitted = *cr.bon; // the caller's bonus token: row kb is never read
    } else if (!rejected) {
        const float* trow = sp_trow(rw, kb);
        if (rw.proc) row_state(trow);
        emitted = rq.meth == SP_METHOD_GREEDY
                      ? sp_pass_argmax<X>(trow, vocab, s_red, st, rq.soft)
                      : (sp_u32)sp_pass_race<X>(trow, 0, false, 0u, vocab, kb, rq, s_red, st, rq.soft);
    }
    // vLLM's recovered tokens (the logits entry): every draft slot's token at a first rejection
    // there; the rejected position's is the emitted token, the others are computed here.
    if (X && in.recovered != 0) {
        sp_u32* const rec = in.recovered + sp_slot(cr.lay, b, sh.k_max);
        for (sp_u32 j = 0; j < kb; ++j) {
            sp_u32 r = emitted;
            if (!(rejected && j == acc)) {
                const float* trow = sp_trow(rw, j);
                if (rw.proc) row_state(trow);
                r = recover(j, trow, id_at(j));
            }
            if (threadIdx.x == 0u) rec[j] = r;
        }
        if (!cr.lay.ragged)
            for (sp_u32 j = kb + threadIdx.x; j < sh.k_max; j += blockDim.x) rec[j] = SP_SENTINEL;
    }

    sp_chain_outputs(cr.out, draft_ids + sp_slot(cr.lay, b, sh.k_max), sh.k_max, acc, emitted);
    sp_count(stats, sh.ck, accepted, b, kb, acc);
}

// specula_verify reads `cu_num_draft_tokens` (u32 x B: the ragged layout, `k` is then not read;
// null: padded) and `bonus` (u32 x B: the caller's bonus tokens, row k of each request is then
// not read and absent from a ragged target; null: sampled) too: two tests per request, nothing
// per element (ptxas gave the former specula_verify_ex the plain entry's registers and
// spills). A bonus token >= V skips its request with SP_ERR_TOKEN, a decreasing cumulative
// count with SP_ERR_DRAFT_LEN.
extern "C" __global__ void SP_LAUNCH_BOUNDS
specula_verify(const sp_args a) {
    __shared__ sp_u64 s_red[SPECULA_MAX_WARPS];
    sp_verify_body<false>(SP_COMMON(a), a.cu_num_draft_tokens, a.bonus, 0, 0, sp_no_inputs(),
                          s_red);
}

// specula_verify_logits: specula_verify, reading also `target_logits` (f32, in exactly the
// layout of target_probs, which is then not read) and `temperature` (f32 x B; 0: greedy on the
// logits, > 0: the softmax of DETERMINISM.md computed on the fly), the engine inputs
// `sampling` (methods and filters) and `draft_first_row` (mixed drafters), and the output
// `recovered` (sp_inputs above; each null when not used). The shape's half-precision flags apply here only. With every one of those null and no
// half flag it is specula_verify. Same launch contract.
extern "C" __global__ void SP_LAUNCH_BOUNDS_LOGITS
specula_verify_logits(const sp_args a) {
    __shared__ sp_u64 s_red[SPECULA_MAX_WARPS];
    __shared__ sp_u64 s_hist[SP_HIST_WORDS];
    const sp_inputs in = sp_inputs_of(a, s_hist);
    sp_verify_body<true>(SP_COMMON(a), a.cu_num_draft_tokens, a.bonus, a.target_logits,
        a.temperature, in, s_red);
}

// ---------------------------------------------------------------- the kernel, rows split
// specula_verify_split: the same verification with each request's rows split over `slices`
// blocks, so that a small batch still spreads over the whole GPU (core/src/kernels.rs, "Rows
// split across blocks"). Launch contract: specula_verify's, reading also `scratch`
// (kernels::split_scratch_words(k_max, slices) u64 words per request of the capacity, all zero
// before the first launch; the kernel leaves them zero again) and `slices` (>= 1);
// grid = (capacity x slices, 1, 1), block as for specula_verify. Block x works on request
// x / slices, slice x % slices: threads take groups g_first, g_first + g_step, ... of every row
// the request may need (all rows are read at once instead of one pass after another), combine
// their part into the request's scratch words (argmax: packed 64-bit atomicMax; entropy: 64-bit
// wrapping atomicAdd of the fixed-point sums; races: one (key, id) slot per slice), and the block
// that draws the last ticket decides, writes the request and its counters, and clears the words.
// Same results as specula_verify, bit for bit: every reduction is order-free.
// The body of specula_verify_split and specula_verify_split_logits (cu, bonus as in
// sp_verify_body).
template <bool X>
__device__ __forceinline__ void
sp_verify_split_body(const sp_u32* __restrict__ shape, const sp_u32* __restrict__ k,
                     const sp_u32* __restrict__ draft_ids, const float* __restrict__ draft_probs,
                     const float* __restrict__ target_probs, const sp_u64* __restrict__ seed,
                     const sp_u64* __restrict__ offset, const float* __restrict__ eps,
                     const float* __restrict__ delta, sp_u32* __restrict__ accepted,
                     sp_u32* __restrict__ tokens, sp_u64* __restrict__ stats,
                     sp_u64* __restrict__ scratch, sp_u32 slices, const sp_u32* __restrict__ cu,
                     const sp_u32* __restrict__ bonus, const float* __restrict__ logits,
                     const float* __restrict__ temperature, const sp_inputs& in,
                     sp_u64* s_red, sp_u32* s_last_p) {
    sp_u32& s_last = *s_last_p;

    // The shape words read and tested here, not through sp_shape_of / sp_shape_ok (the same
    // tests): with them ptxas spilled in both split entries (sm_90: specula_verify_split 0+0
    // bytes became 28+84, specula_verify_split_logits 300+460 became 376+1044).
    const sp_u32 batch = shape[SP_SHAPE_BATCH];
    const sp_u32 nsl = slices == 0u ? 1u : slices; // 0 is refused below
    const sp_u32 b = blockIdx.x / nsl;
    const sp_u32 sl = blockIdx.x % nsl;
    if (b >= batch) return;
    const sp_u32 k_max = shape[SP_SHAPE_K_MAX];
    const sp_u32 vocab = shape[SP_SHAPE_VOCAB];
    const sp_u32 dstride = shape[SP_SHAPE_DRAFT_STRIDE];
    const sp_u32 tstride = shape[SP_SHAPE_TARGET_STRIDE];
    const sp_u32 method = shape[SP_SHAPE_METHOD];
    const sp_u32 ck = shape[SP_SHAPE_COUNTERS_K];
    const bool draft_flag = (shape[SP_SHAPE_FLAGS] & SP_FLAG_DRAFT_PROBS) != 0u;
    sp_u64* const err = stats + 4u + 2u * (sp_u64)ck;

    const bool shape_ok = batch <= gridDim.x / nsl && slices >= 1u && scratch != 0 &&
                          k_max <= ck && vocab >= 1u && tstride >= vocab &&
                          (!draft_flag || dstride >= vocab) && method <= SP_METHOD_TYPICAL &&
                          blockDim.x <= SPECULA_BLOCK_THREADS && blockDim.x % SPECULA_WARP_SIZE == 0u &&
                          sp_flags_ok(shape[SP_SHAPE_FLAGS], X);
    if (!shape_ok) {
        if (threadIdx.x == 0u && blockIdx.x == 0u) atomicOr(err, (sp_u64)SP_ERR_SHAPE);
        return;
    }

    const sp_u32 tf = X ? sp_target_fmt(shape[SP_SHAPE_FLAGS]) : SP_FMT_F32;
    const sp_u32 df = X ? sp_draft_fmt(shape[SP_SHAPE_FLAGS]) : SP_FMT_F32;
    const sp_shape sh = sp_shape_of(shape);
    const sp_chain_req cr = sp_chain_req_of<X>(sh, k, cu, bonus, draft_ids, tokens, in, b);
    if (cr.bad != 0u) {
        if (sl == 0u) sp_chain_skip<X>(cr, sh.k_max, in, b, accepted, err); // one block of the request
        return;
    }
    const sp_layout& lay = cr.lay;
    const sp_u32 kb = lay.kb;
    const sp_u32* const bon = cr.bon;
    sp_u32* const out = cr.out;

    const sp_request rq = sp_request_of(seed, offset, logits, temperature, b, method,
                                        X ? sp_sampling_of(in, b) : 0);
    // Target logits: T = 0 greedy on the logits; T > 0 through the softmax. The softmax state
    // (row maximum, then the exact sum; with a filter its threshold and kept mass) needs the
    // whole row before any probability, so every block computes it for the rows it works on
    // over the whole row (the same integers in every block), and splits only the passes after it.
    const sp_chain_rows rw = sp_chain_rows_of<X>(sh, cr, rq, in, b, target_probs, logits, draft_probs);
    const bool soft = rq.soft;
    const bool proc = rw.proc;
    const sp_u32 meth = rq.meth;
    const float* const tbase = rw.tbase;
    const bool has_draft = rw.has_draft;
    const float* const dbase = rw.dbase;
    sp_soft st = sp_soft_raw(tf, df);
    auto row_state = [&](const float* trow) { st = sp_chain_state<X>(trow, vocab, rq, rw, in, s_red); };
    // Rows read: 0..kb, or 0..kb-1 when the caller gives the bonus token (row kb is absent).
    const sp_u32 rows = bon != 0 ? kb : kb + 1u;
    // Recovered tokens (the logits entry) with rejection sampling: the residual race of every
    // row j < kb runs in every slice (race slot j), the plain race of the first rejected row
    // in slot kb; without them, slots 0 and 1.
    const bool rec = X && in.recovered != 0;
    const sp_u32 pr_slot = rec ? kb : 1u; // the plain race of the first rejected row

    // Scratch words of this request: [0] the ticket; [1 + j] argmax of row j (greedy) or the
    // entropy sum of row j (typical); from `base`, race slots: race r's key of slice q at
    // base + 2 r nsl + q, its id at base + (2 r + 1) nsl + q (typical: race r = row r;
    // rejection: r = 0 the residual race, r = 1 the plain race).
    const sp_u32 base = 1u + k_max;
    const sp_u64 words = (sp_u64)base + 2ull * nsl * (k_max + 1u);
    sp_u64* const scr = scratch + (sp_u64)b * words;
    const sp_u32 g_first = sl * blockDim.x + threadIdx.x;
    const sp_u32 g_step = nsl * blockDim.x;
    // This block's part of race slot r: its key and its id word.
    auto race_slot = [&](sp_u32 r, sp_u64 top, sp_u64 id) {
        if (threadIdx.x == 0u) {
            scr[base + 2u * r * nsl + sl] = top;
            scr[base + (2u * r + 1u) * nsl + sl] = id;
        }
    };
    sp_u32 jr = kb; // rejection sampling: the first rejected position (kb: none)
    if (meth == SP_METHOD_GREEDY) {
        for (sp_u32 j = 0; j < rows; ++j) {
            const float* trow = sp_at(tbase, (sp_u64)j * tstride, tf);
            if (proc) row_state(trow);
            const sp_u64 p = sp_pass_argmax_part<X>(trow, vocab, g_first, g_step, s_red, st, soft);
            if (threadIdx.x == 0u) atomicMax(scr + 1u + j, p);
        }
    } else if (meth == SP_METHOD_TYPICAL) {
        // Entropies of rows 0..k-1 and, since the rejection position is not known yet, the race
        // of every row 0..k.
        for (sp_u32 j = 0; j < rows; ++j) {
            const float* trow = sp_at(tbase, (sp_u64)j * tstride, tf);
            if (proc) row_state(trow);
            if (j < kb) {
                const sp_u64 h = sp_pass_entropy_part<X>(trow, vocab, g_first, g_step, s_red, st, soft);
                if (threadIdx.x == 0u) atomicAdd(scr + 1u + j, h);
            }
            sp_u64 top;
            sp_u32 id;
            sp_pass_race_part<X>(trow, 0, false, 0u, vocab, j, rq, g_first, g_step, s_red, top, id,
                                 st, soft);
            // With logits (or a filter) the deciding block needs p of the draft id, which only
            // the row's state gives: its bits ride in the high word of the race's id slots
            // (race_winner reads the low word only).
            const sp_u32 xj = j < kb ? draft_ids[sp_slot(lay, b, k_max) + j] : 0u;
            const sp_u64 ptw = proc && j < kb
                ? (sp_u64)__float_as_uint(sp_chain_p<X>(trow, xj, rw, st, soft)) << 32
                : 0ull;
            race_slot(j, top, ptw | id);
        }
    } else {
        // The k acceptance tests at once, one per thread (each a Philox block and two loads),
        // in every block: the first rejection is the smallest rejecting position, a block-wide
        // maximum of ~j (positions past it are tested too, never used).
        // With logits (T > 0) or a filter the tests run one row after another (each needs its
        // row's state, computed by every thread of the block), up to the first rejection.
        for (sp_u32 j = proc ? kb : threadIdx.x; j < kb; j += blockDim.x) {
            const sp_u32 x = draft_ids[sp_slot(lay, b, k_max) + j];
            const float pt = sp_rd(tbase, (sp_u64)j * tstride + x, tf);
            const float pd = has_draft ? sp_rd(dbase, (sp_u64)j * dstride + x, df) : 1.0f;
            if (!sp_accept_at(rq, j, pt, pd) && j < jr) jr = j;
        }
        for (sp_u32 j = 0; proc && j < rows; ++j) {
            const float* trow = sp_at(tbase, (sp_u64)j * tstride, tf);
            row_state(trow);
            if (j == kb) break; // all accepted: row kb's state for the plain race
            const sp_u32 x = draft_ids[sp_slot(lay, b, k_max) + j];
            const float pt = sp_chain_p<X>(trow, x, rw, st, soft);
            const float pd = has_draft ? sp_rd(dbase, (sp_u64)j * dstride + x, df) : 1.0f;
            if (!sp_accept_at(rq, j, pt, pd)) {
                jr = j;
                break;
            }
        }
        jr = ~(sp_u32)sp_block_reduce((sp_u64)(~jr), true, s_red);
        // With recovered tokens every row j < kb's residual race (slot j); the state of row jr
        // (kept in st when proc) is recomputed after them for its plain race.
        for (sp_u32 j = rec ? 0u : jr; rec ? j < kb : j == jr && j < kb; ++j) {
            const float* trow = sp_at(tbase, (sp_u64)j * tstride, tf);
            if (rec && proc) row_state(trow);
            const sp_u32 x = draft_ids[sp_slot(lay, b, k_max) + j];
            const float* drow = has_draft ? sp_at(dbase, (sp_u64)j * dstride, df) : 0;
            sp_u64 top;
            sp_u32 id;
            sp_pass_race_part<X>(trow, drow, true, x, vocab, j, rq, g_first, g_step, s_red, top, id,
                                 st, soft);
            race_slot(rec ? j : 0u, top, id);
        }
        if (jr < rows) { // the plain race (not needed after all accepted with a bonus given)
            const float* trow = sp_at(tbase, (sp_u64)jr * tstride, tf);
            if (rec && proc && kb > 0u) row_state(trow);
            sp_u64 top;
            sp_u32 id;
            sp_pass_race_part<X>(trow, 0, false, 0u, vocab, jr, rq, g_first, g_step, s_red, top, id,
                                 st, soft);
            race_slot(pr_slot, top, id);
        }
    }

    // Last-block ticket (the classic threadfence reduction): the parts first, then the ticket.
    if (threadIdx.x == 0u) {
        __threadfence();
        s_last = atomicAdd(scr, 1ull) == (sp_u64)(nsl - 1u) ? 1u : 0u;
    }
    __syncthreads();
    if (s_last == 0u) return;
    __threadfence();
    const volatile sp_u64* const parts = scr;
    sp_u32 acc = 0u;
    sp_u32 emitted = 0u;
    // The winner of race slot set r: the largest key over the slices, then the lowest id
    // holding it; (1 << 32) | id, or 0 when no slice had a candidate.
    auto race_winner = [&](sp_u32 r) -> sp_u64 {
        sp_u64 top = 0ull;
        for (sp_u32 q = 0; q < nsl; ++q) {
            const sp_u64 t = parts[base + 2u * r * nsl + q];
            top = t > top ? t : top;
        }
        if (top == 0ull) return 0ull;
        sp_u32 id = SP_SENTINEL;
        for (sp_u32 q = 0; q < nsl; ++q) {
            const sp_u32 i = (sp_u32)parts[base + (2u * r + 1u) * nsl + q];
            if (parts[base + 2u * r * nsl + q] == top && i < id) id = i;
        }
        return (1ull << 32) | (sp_u64)id;
    };
    if (meth == SP_METHOD_REJECTION) {
        acc = jr;
        sp_u64 win = jr < kb ? race_winner(rec ? jr : 0u) : 0ull;
        if (win == 0ull && jr < rows) win = race_winner(pr_slot);
        emitted = jr < rows ? (sp_u32)win : *bon; // 0 when none
    } else {
        bool rejected = false;
        for (sp_u32 j = 0; j < kb && !rejected; ++j) {
            const sp_u32 x = draft_ids[sp_slot(lay, b, k_max) + j];
            if (meth == SP_METHOD_GREEDY) {
                const sp_u32 am = sp_unpack_id(parts[1u + j]);
                rejected = x != am;
                if (rejected) emitted = am;
            } else {
                const float pt = proc ? __uint_as_float((sp_u32)(parts[base + (2u * j + 1u) * nsl] >> 32))
                                      : sp_rd(tbase, (sp_u64)j * tstride + x, tf);
                const float h = sp_entropy_of_sum(parts[1u + j]);
                rejected = !(pt > sp_typical_threshold(h, eps[b], delta[b]));
                if (rejected) emitted = (sp_u32)race_winner(j);
            }
            if (!rejected) ++acc;
        }
        if (!rejected && bon != 0) {
            emitted = *bon;
        } else if (!rejected) {
            emitted = meth == SP_METHOD_GREEDY ? sp_unpack_id(parts[1u + kb])
                                                 : (sp_u32)race_winner(kb);
        }
    }
    // Recovered tokens: greedy, row j's argmax; typical, row j's race; rejection, row j's
    // residual race, else (no candidate) the plain race of row j: the first rejected row's is
    // in its slot, another row's this block computes over the whole row (rare: the target is
    // nowhere above the draft).
    if (rec) {
        sp_u32* const rv = in.recovered + sp_slot(lay, b, k_max);
        for (sp_u32 j = 0; j < kb; ++j) {
            sp_u32 r;
            if (meth == SP_METHOD_GREEDY) {
                r = sp_unpack_id(parts[1u + j]);
            } else if (meth == SP_METHOD_TYPICAL) {
                r = (sp_u32)race_winner(j);
            } else {
                sp_u64 win = race_winner(j);
                if (win == 0ull && j == jr) win = race_winner(pr_slot);
                if (win == 0ull && j != jr) {
                    const float* trow = sp_at(tbase, (sp_u64)j * tstride, tf);
                    if (proc) row_state(trow);
                    win = sp_race_any(trow, 0, false, 0u, vocab, j, rq.k0, rq.k1, rq.off_lo, rq.off_hi,
                                      s_red, st);
                }
                r = (sp_u32)win;
            }
            if (threadIdx.x == 0u) rv[j] = r;
        }
        if (!lay.ragged)
            for (sp_u32 j = kb + threadIdx.x; j < k_max; j += blockDim.x) rv[j] = SP_SENTINEL;
    }
    __syncthreads(); // every thread has read the parts: clear them for the next launch
    for (sp_u64 w = threadIdx.x; w < words; w += blockDim.x) scr[w] = 0ull;

    sp_chain_outputs(out, draft_ids + sp_slot(lay, b, k_max), k_max, acc, emitted);
    sp_count(stats, ck, accepted, b, kb, acc);
}

extern "C" __global__ void SP_LAUNCH_BOUNDS_SPLIT
specula_verify_split(const sp_args a) {
    __shared__ sp_u64 s_red[SPECULA_MAX_WARPS];
    __shared__ sp_u32 s_last;
    sp_verify_split_body<false>(SP_COMMON(a), a.scratch, a.slices, a.cu_num_draft_tokens,
                                a.bonus, 0, 0, sp_no_inputs(), s_red, &s_last);
}

// specula_verify_split_logits: specula_verify_split, reading also `target_logits`,
// `temperature`, `sampling`, `draft_first_row` and `recovered` as specula_verify_logits does.
extern "C" __global__ void SP_LAUNCH_BOUNDS_SPLIT
specula_verify_split_logits(const sp_args a) {
    __shared__ sp_u64 s_red[SPECULA_MAX_WARPS];
    __shared__ sp_u32 s_last;
    __shared__ sp_u64 s_hist[SP_HIST_WORDS];
    const sp_inputs in = sp_inputs_of(a, s_hist);
    sp_verify_split_body<true>(SP_COMMON(a), a.scratch, a.slices, a.cu_num_draft_tokens,
        a.bonus, a.target_logits, a.temperature, in, s_red, &s_last);
}
#endif // SPECULA_TREE_MODULE
