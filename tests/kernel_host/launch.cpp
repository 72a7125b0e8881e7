// launch.cpp: compiles core/kernels/specula_verify.cu on the host over shim.hpp and exposes one
// extern "C" launcher. build.rs compiles this file twice: once as is (CUDA-macro mode, exported
// as specula_host_verify_cuda) and once with -DSPECULA_HIP (HIP-macro mode, wave size 64,
// exported as specula_host_verify_hip).
#include "shim.hpp"

// The kernel's own extern "C" name would be the same in both modes: rename it per mode.
#if defined(SPECULA_HIP)
#define specula_verify specula_kernel_body_hip
#define specula_verify_split specula_kernel_split_hip
#define SPECULA_HOST_LAUNCHER specula_host_verify_hip
#define specula_verify_logits specula_kernel_logits_hip
#define specula_verify_split_logits specula_kernel_split_logits_hip
#define specula_verify_tree specula_kernel_tree_hip
#define specula_verify_tree_half specula_kernel_tree_half_hip
#define SPECULA_HOST_SKIP_BARRIER specula_host_skip_barrier_hip
#define SPECULA_HOST_RACE_BOUND specula_host_race_bound_hip
#define SPECULA_HOST_SOFTMAX_TERMS specula_host_softmax_terms_hip
#define SPECULA_HOST_FILTER_PASS specula_host_filter_pass_hip
#else
#define specula_verify specula_kernel_body_cuda
#define specula_verify_split specula_kernel_split_cuda
#define SPECULA_HOST_LAUNCHER specula_host_verify_cuda
#define specula_verify_logits specula_kernel_logits_cuda
#define specula_verify_split_logits specula_kernel_split_logits_cuda
#define specula_verify_tree specula_kernel_tree_cuda
#define specula_verify_tree_half specula_kernel_tree_half_cuda
#define SPECULA_HOST_SKIP_BARRIER specula_host_skip_barrier_cuda
#define SPECULA_HOST_RACE_BOUND specula_host_race_bound_cuda
#define SPECULA_HOST_SOFTMAX_TERMS specula_host_softmax_terms_cuda
#define SPECULA_HOST_FILTER_PASS specula_host_filter_pass_cuda
#endif

#include <atomic>
// The exact weights the filters' sparse passes take (their cold region, sp_filter_sparse),
// counted for SPECULA_HOST_FILTER_PASS.
static std::atomic<unsigned long long> g_filter_exact{0};
#define SP_FILTER_EXACT() g_filter_exact.fetch_add(1, std::memory_order_relaxed)

#include "../../core/kernels/specula_verify.cu"
// The tree kernel text; its own include of specula_verify.cu is skipped (already here).
#include "../../core/kernels/specula_tree.cu"

#include <cstdint>

// The shim's fault injection (see g_skip_barrier): every thread passes its n-th barrier of each
// block without waiting; 0 restores every barrier.
// `ascending_only`: every round in ascending thread order instead of alternating (the control).
extern "C" void SPECULA_HOST_SKIP_BARRIER(unsigned int n, bool ascending_only) {
    specula_shim::g_skip_barrier.store(n, std::memory_order_relaxed);
    specula_shim::g_ascending_only.store(ascending_only, std::memory_order_relaxed);
}

// The race's skip-test values of n ids of one logit row (temperature t > 0, softmax maximum m,
// threshold theta, kept mass s), as sp_race_scan computes them: out[4 i ..] = the bound u
// (sp_weight_ub), the exact weight e before the threshold (sp_soft_e), the scaled bound pu =
// u x sinv, and 1 where pu is below the row's wcut (the claim "p <= 0"), else 0; p[i] the exact p
// (sp_scale of sp_weight). f16: the ids are f16 bit patterns in bits[] (the row read as
// sp_f16_scaled's l 2^-112), else binary32 values in l[].
extern "C" void SPECULA_HOST_RACE_BOUND(const float* l, const unsigned short* bits, unsigned int n,
                                        float t, float m, unsigned int theta, double s, bool f16,
                                        float* out, float* p) {
    const sp_u32 fmt = f16 ? SP_FMT_F16 : SP_FMT_F32;
    const sp_soft st = sp_soft_of(t, m, s, theta, SP_P_SOFT_CUT, fmt, SP_FMT_F32);
    const sp_race_ub ub = sp_race_ub_of<SP_P_ANY>(&st, f16);
    const float sinv = sp_race_sinv<SP_P_ANY>(&st);
    const float wcut = sp_race_wcut<SP_P_ANY>(ub, sinv);
    for (unsigned int i = 0; i < n; ++i) {
        const float x = f16 ? sp_widen(bits[i], SP_FMT_F16) : l[i];
        const float u = sp_weight_ub<SP_P_ANY>(f16 ? sp_f16_scaled(bits[i]) : x, st, ub);
        const float pu = u * sinv;
        out[4 * i] = u;
        out[4 * i + 1] = sp_soft_e(x, t, m);
        out[4 * i + 2] = pu;
        out[4 * i + 3] = pu < wcut ? 1.0f : 0.0f;
        p[i] = sp_scale<SP_P_ANY>(sp_weight<SP_P_ANY>(x, st), st);
    }
}

// Launches entry point `entry` on `grid` blocks of `block` threads with the argument block `a`:
// 0 to 3 the chain entries in the order of specula_core::gpu::ENTRY_NAMES (specula_verify,
// specula_verify_split, then the _logits pair), 4 and 5 the tree entries in the order of
// specula_core::gpu::kernels::TREE_ENTRY_NAMES (specula_verify_tree, _tree_half). A split
// entry's grid is capacity x slices blocks, run one after another (so the last ticket is the
// last block). Returns 0 on success, 1 when `block` is 0, above SPECULA_BLOCK_THREADS or not a
// multiple of the warp size, or `entry` is none of these (nothing ran).
extern "C" int SPECULA_HOST_LAUNCHER(unsigned int grid, unsigned int block, unsigned int entry,
                                     const sp_args* a) {
    if (block == 0 || block > SPECULA_BLOCK_THREADS || block % specula_shim::kWarpSize != 0) {
        return 1;
    }
    const sp_args args = *a;
    switch (entry) {
    case 0: return specula_shim::launch(grid, block, [&] { specula_verify(args); });
    case 1: return specula_shim::launch(grid, block, [&] { specula_verify_split(args); });
    case 2: return specula_shim::launch(grid, block, [&] { specula_verify_logits(args); });
    case 3: return specula_shim::launch(grid, block, [&] { specula_verify_split_logits(args); });
    case 4: return specula_shim::launch(grid, block, [&] { specula_verify_tree(args); });
    case 5: return specula_shim::launch(grid, block, [&] { specula_verify_tree_half(args); });
    default: return 1;
    }
}

// The softmax passes' per-id steps, for the tests that attack their proofs: for each of the n
// logits l[i] at temperature t with row maximum m, q[2i] = the bits of sp_quot (the sum pass's
// quotient without a division), q[2i + 1] those of sp_quot2 (sp_soft_e's), w[2i], w[2i + 1] the
// sum pass's term floor(exp_p(q - m) 2^64) as it adds it (sp_exp_w then sp_soft_fixed_w: h and
// l, the term h 2^32 + l), e[i] the bits of sp_soft_e(l[i], t, m). Returns the row's rc.ok
// (whether the passes take those quotients for this row).
extern "C" int SPECULA_HOST_SOFTMAX_TERMS(float t, float m, const float* l, unsigned long long n,
                                          unsigned int* q, unsigned long long* w, unsigned int* e) {
    const sp_rcp rc = sp_rcp_of(t, m);
    for (unsigned long long i = 0; i < n; ++i) {
        const float z = sp_quot(l[i], t, rc);
        q[2 * i] = __float_as_uint(z);
        q[2 * i + 1] = __float_as_uint(sp_quot2(l[i], t, rc.y));
        sp_u64 h = 0ull, lo = 0ull;
        sp_soft_fixed_w(sp_exp_w(z - m, 0x3F000000u), h, lo);
        w[2 * i] = h;
        w[2 * i + 1] = lo;
        e[i] = __float_as_uint(sp_soft_e(l[i], t, m));
    }
    return rc.ok ? 1 : 0;
}

// One pass of the filters (sp_filter_pass) over a binary32 logit row of n ids at temperature
// t > 0 with softmax maximum m (the row's largest RN(l / t)), in mode `mode` at descent `level`
// under `prefix` with `floor_`, on one block of `block` threads: hist[0 .. 512) the histogram's
// bins as the pass leaves them (2 words a bin), out[0 .. 4) its result words (modes 0 and 3).
// Returns the number of exact weights the pass computed in its sparse passes' cold region, or
// ~0 when `block` is not a launchable size or the launch failed.
extern "C" unsigned long long SPECULA_HOST_FILTER_PASS(const float* l, unsigned int n, float t,
                                                       float m, unsigned int mode,
                                                       unsigned int level, unsigned int prefix,
                                                       unsigned int floor_, unsigned int block,
                                                       unsigned long long* hist,
                                                       unsigned long long* out) {
    if (block == 0 || block > SPECULA_BLOCK_THREADS || block % specula_shim::kWarpSize != 0) {
        return ~0ull;
    }
    g_filter_exact.store(0, std::memory_order_relaxed);
    const sp_soft st = sp_soft_of(t, m, 0.0, 0u, SP_P_RAW, SP_FMT_F32, SP_FMT_F32);
    const int rc = specula_shim::launch(1, block, [&] {
        __shared__ sp_u64 s_red[SPECULA_MAX_WARPS];
        __shared__ sp_u64 s_hist[SP_HIST_WORDS];
        for (sp_u32 i = threadIdx.x; i < SP_HIST_HAND; i += blockDim.x) s_hist[i] = 0ull;
        __syncthreads();
        sp_u64 o[4];
        sp_filter_pass<SP_FX_ANY>(l, n, st, true, mode, level, prefix, floor_, s_hist, s_red, o);
        if (threadIdx.x == 0u) {
            for (sp_u32 i = 0; i < SP_HIST_HAND; ++i) hist[i] = s_hist[i];
            for (sp_u32 i = 0; i < 4u; ++i) out[i] = mode == SP_FP_MAX || mode == SP_FP_MASS ? o[i] : 0ull;
        }
    });
    return rc == 0 ? g_filter_exact.load(std::memory_order_relaxed) : ~0ull;
}
