// launch.cpp: compiles core/kernels/specula_verify.cu on the host over shim.hpp and exposes one
// extern "C" launcher. build.rs compiles this file twice: once as is (CUDA-macro mode, exported
// as specula_host_verify_cuda) and once with -DSPECULA_HIP (HIP-macro mode, wave size 64,
// exported as specula_host_verify_hip).
#include "shim.hpp"

// The kernel's own extern "C" name would be the same in both modes: rename it per mode.
#if defined(SPECULA_HIP)
#define specula_verify specula_kernel_body_hip
#define specula_verify_split specula_kernel_split_hip
#define specula_verify_ex specula_kernel_ex_hip
#define specula_verify_split_ex specula_kernel_split_ex_hip
#define SPECULA_HOST_LAUNCHER specula_host_verify_hip
#define SPECULA_HOST_LAUNCHER_EX specula_host_verify_ex_hip
#define specula_verify_logits specula_kernel_logits_hip
#define specula_verify_split_logits specula_kernel_split_logits_hip
#define SPECULA_HOST_LAUNCHER_LOGITS specula_host_verify_logits_hip
#define specula_verify_tree specula_kernel_tree_hip
#define SPECULA_HOST_LAUNCHER_TREE specula_host_verify_tree_hip
#define SPECULA_HOST_SKIP_BARRIER specula_host_skip_barrier_hip
#else
#define specula_verify specula_kernel_body_cuda
#define specula_verify_split specula_kernel_split_cuda
#define specula_verify_ex specula_kernel_ex_cuda
#define specula_verify_split_ex specula_kernel_split_ex_cuda
#define SPECULA_HOST_LAUNCHER specula_host_verify_cuda
#define SPECULA_HOST_LAUNCHER_EX specula_host_verify_ex_cuda
#define specula_verify_logits specula_kernel_logits_cuda
#define specula_verify_split_logits specula_kernel_split_logits_cuda
#define SPECULA_HOST_LAUNCHER_LOGITS specula_host_verify_logits_cuda
#define specula_verify_tree specula_kernel_tree_cuda
#define SPECULA_HOST_LAUNCHER_TREE specula_host_verify_tree_cuda
#define SPECULA_HOST_SKIP_BARRIER specula_host_skip_barrier_cuda
#endif

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

// Launches the kernel on `grid` blocks of `block` threads: specula_verify when `slices` is 1,
// else specula_verify_split (grid = capacity x slices; `scratch` as its contract sizes it). Returns 0 on success, 1 when
// `block` is 0, above SPECULA_BLOCK_THREADS, or not a multiple of the warp size (nothing ran).
extern "C" int SPECULA_HOST_LAUNCHER(unsigned int grid, unsigned int block,
                                     const std::uint32_t* shape, const std::uint32_t* k,
                                     const std::uint32_t* draft_ids, const float* draft_probs,
                                     const float* target_probs, const std::uint64_t* seed,
                                     const std::uint64_t* offset, const float* eps,
                                     const float* delta, std::uint32_t* accepted,
                                     std::uint32_t* tokens, std::uint64_t* stats,
                                     std::uint64_t* scratch, unsigned int slices) {
    if (block == 0 || block > SPECULA_BLOCK_THREADS || block % specula_shim::kWarpSize != 0) {
        return 1;
    }
    static_assert(sizeof(unsigned long long) == sizeof(std::uint64_t), "64-bit words");
    auto* seed_ = reinterpret_cast<const unsigned long long*>(seed);
    auto* offset_ = reinterpret_cast<const unsigned long long*>(offset);
    auto* stats_ = reinterpret_cast<unsigned long long*>(stats);
    auto* scratch_ = reinterpret_cast<unsigned long long*>(scratch);
    // One slice: the one-block-per-request entry; more: the split entry (grid = capacity x
    // slices blocks, run one after another, so the last ticket is the last block).
    if (slices == 1) {
        return specula_shim::launch(grid, block, [&] {
            specula_verify(shape, k, draft_ids, draft_probs, target_probs, seed_, offset_, eps,
                           delta, accepted, tokens, stats_);
        });
    }
    return specula_shim::launch(grid, block, [&] {
        specula_verify_split(shape, k, draft_ids, draft_probs, target_probs, seed_, offset_, eps,
                             delta, accepted, tokens, stats_, scratch_, slices);
    });
}

// The same launch through the additive entry points specula_verify_ex / specula_verify_split_ex:
// `cu` (ragged layout) and `bonus` (caller's bonus tokens), each null when not used.
extern "C" int SPECULA_HOST_LAUNCHER_EX(unsigned int grid, unsigned int block,
                                        const std::uint32_t* shape, const std::uint32_t* k,
                                        const std::uint32_t* draft_ids, const float* draft_probs,
                                        const float* target_probs, const std::uint64_t* seed,
                                        const std::uint64_t* offset, const float* eps,
                                        const float* delta, std::uint32_t* accepted,
                                        std::uint32_t* tokens, std::uint64_t* stats,
                                        std::uint64_t* scratch, unsigned int slices,
                                        const std::uint32_t* cu, const std::uint32_t* bonus) {
    if (block == 0 || block > SPECULA_BLOCK_THREADS || block % specula_shim::kWarpSize != 0) {
        return 1;
    }
    auto* seed_ = reinterpret_cast<const unsigned long long*>(seed);
    auto* offset_ = reinterpret_cast<const unsigned long long*>(offset);
    auto* stats_ = reinterpret_cast<unsigned long long*>(stats);
    auto* scratch_ = reinterpret_cast<unsigned long long*>(scratch);
    if (slices == 1) {
        return specula_shim::launch(grid, block, [&] {
            specula_verify_ex(shape, k, draft_ids, draft_probs, target_probs, seed_, offset_, eps,
                              delta, accepted, tokens, stats_, cu, bonus);
        });
    }
    return specula_shim::launch(grid, block, [&] {
        specula_verify_split_ex(shape, k, draft_ids, draft_probs, target_probs, seed_, offset_,
                                eps, delta, accepted, tokens, stats_, scratch_, slices, cu, bonus);
    });
}

// The same launch through specula_verify_logits / specula_verify_split_logits: `logits` (target
// logits in target_probs' layout) and `temperature` (B values), null for the probability path;
// then the engine inputs `methods`, `top_k`, `top_p`, `min_p` and the output `recovered`, each
// null when not used. Half-precision tensors are passed through the same pointers (u16
// elements; the shape's flags say so).
extern "C" int SPECULA_HOST_LAUNCHER_LOGITS(
    unsigned int grid, unsigned int block, const std::uint32_t* shape, const std::uint32_t* k,
    const std::uint32_t* draft_ids, const float* draft_probs, const float* target_probs,
    const std::uint64_t* seed, const std::uint64_t* offset, const float* eps, const float* delta,
    std::uint32_t* accepted, std::uint32_t* tokens, std::uint64_t* stats, std::uint64_t* scratch,
    unsigned int slices, const std::uint32_t* cu, const std::uint32_t* bonus, const float* logits,
    const float* temperature, const std::uint32_t* methods, const std::uint32_t* top_k,
    const float* top_p, const float* min_p, std::uint32_t* recovered) {
    if (block == 0 || block > SPECULA_BLOCK_THREADS || block % specula_shim::kWarpSize != 0) {
        return 1;
    }
    auto* seed_ = reinterpret_cast<const unsigned long long*>(seed);
    auto* offset_ = reinterpret_cast<const unsigned long long*>(offset);
    auto* stats_ = reinterpret_cast<unsigned long long*>(stats);
    auto* scratch_ = reinterpret_cast<unsigned long long*>(scratch);
    if (slices == 1) {
        return specula_shim::launch(grid, block, [&] {
            specula_verify_logits(shape, k, draft_ids, draft_probs, target_probs, seed_, offset_,
                                  eps, delta, accepted, tokens, stats_, cu, bonus, logits,
                                  temperature, methods, top_k, top_p, min_p, recovered);
        });
    }
    return specula_shim::launch(grid, block, [&] {
        specula_verify_split_logits(shape, k, draft_ids, draft_probs, target_probs, seed_, offset_,
                                    eps, delta, accepted, tokens, stats_, scratch_, slices, cu,
                                    bonus, logits, temperature, methods, top_k, top_p, min_p,
                                    recovered);
    });
}

// Tree verification through specula_verify_tree (one block per request; core/kernels/specula_tree.cu).
// Returns 0, or 1 when `block` is not a valid block size (nothing ran).
extern "C" int SPECULA_HOST_LAUNCHER_TREE(unsigned int grid, unsigned int block,
                                          const std::uint32_t* shape, const std::uint32_t* nodes,
                                          const std::uint32_t* tree_tokens,
                                          const std::int32_t* first_child,
                                          const std::int32_t* next_sibling,
                                          const float* draft_probs, const float* target_probs,
                                          const std::uint64_t* seed, const std::uint64_t* offset,
                                          const float* eps, const float* delta,
                                          std::uint32_t* accepted, std::uint32_t* path,
                                          std::uint32_t* tokens, std::uint64_t* stats,
                                          const float* target_logits, const float* temperature) {
    if (block == 0 || block > SPECULA_BLOCK_THREADS || block % specula_shim::kWarpSize != 0) {
        return 1;
    }
    auto* seed_ = reinterpret_cast<const unsigned long long*>(seed);
    auto* offset_ = reinterpret_cast<const unsigned long long*>(offset);
    auto* stats_ = reinterpret_cast<unsigned long long*>(stats);
    return specula_shim::launch(grid, block, [&] {
        specula_verify_tree(shape, nodes, tree_tokens, first_child, next_sibling, draft_probs,
                            target_probs, seed_, offset_, eps, delta, accepted, path, tokens,
                            stats_, target_logits, temperature);
    });
}
