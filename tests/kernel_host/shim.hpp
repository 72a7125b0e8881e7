// shim.hpp: just enough of the CUDA / HIP programming model to run core/kernels/specula_verify.cu
// unchanged on the host, one OS thread per GPU thread.
//
// * `__global__` / `__device__` functions become `static` functions of the including translation
//   unit (each mode is its own TU, so the CUDA-mode and HIP-mode copies never merge).
// * threadIdx / blockIdx are thread_local; blockDim / gridDim / warpSize are per-TU globals, set by
//   `launch` while it holds the TU's launch mutex (launches of one mode run one at a time).
// * `__syncthreads` is a std::barrier over the block's threads; blocks run one after another with
//   the same threads, so `__shared__` (function-local statics) is exactly per-block storage.
// * warp shuffles go through per-block exchange arrays, one barrier each: every thread of the
//   block must call them together, which the kernel guarantees (its reductions are block-uniform).
// * atomics use std::atomic_ref on the caller's memory.
// Define SPECULA_HIP before including this header for HIP mode (wave size 64, `__shfl_down`).
#pragma once

#include <atomic>
#include <barrier>
#include <bit>
#include <cstdint>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace {
namespace specula_shim {

struct dim3 {
    unsigned int x = 1, y = 1, z = 1;
};

#if defined(SPECULA_HIP)
constexpr int kWarpSize = 64;
#else
constexpr int kWarpSize = 32;
#endif

thread_local dim3 tl_thread_idx;
thread_local dim3 tl_block_idx;
dim3 g_block_dim;
dim3 g_grid_dim;
std::barrier<>* g_barrier = nullptr;
// Two exchange arrays used alternately by successive shuffles (see shfl_down).
std::vector<std::uint64_t> g_exchange[2];
thread_local unsigned int tl_exchange_phase = 0;
std::mutex g_launch_mutex;

inline void sync_block() { g_barrier->arrive_and_wait(); }

// Value of lane (lane + delta) of the caller's warp, or the caller's own value past the warp end.
template <class T>
T shfl_down(T v, unsigned int delta) {
    static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "shuffle of <= 8 bytes");
    const unsigned int tid = tl_thread_idx.x;
    std::uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    // Alternating arrays need one barrier per shuffle instead of two: the next shuffle writes
    // the other array, and the one after that can only start once every thread has passed the
    // next shuffle's barrier, i.e. has finished reading this array.
    std::vector<std::uint64_t>& ex = g_exchange[tl_exchange_phase];
    tl_exchange_phase ^= 1u;
    ex[tid] = bits;
    sync_block();
    const unsigned int lane = tid % kWarpSize;
    T r = v;
    if (lane + delta < static_cast<unsigned int>(kWarpSize) && tid + delta < g_block_dim.x) {
        std::uint64_t o = ex[tid + delta];
        std::memcpy(&r, &o, sizeof(T));
    }
    return r;
}

// Runs `kernel` on a grid of `grid` blocks of `block` threads. Returns 0, or -1 when threads
// could not be started (the launch then did nothing).
template <class F>
int launch(unsigned int grid, unsigned int block, F&& kernel) {
    std::lock_guard<std::mutex> guard(g_launch_mutex);
    try {
        std::barrier<> bar(static_cast<std::ptrdiff_t>(block));
        g_barrier = &bar;
        g_block_dim = dim3{block, 1, 1};
        g_grid_dim = dim3{grid, 1, 1};
        g_exchange[0].assign(block, 0);
        g_exchange[1].assign(block, 0);
        std::vector<std::thread> threads;
        threads.reserve(block);
        for (unsigned int t = 0; t < block; ++t) {
            threads.emplace_back([&, t] {
                tl_thread_idx = dim3{t, 0, 0};
                tl_exchange_phase = 0;
                for (unsigned int b = 0; b < grid; ++b) {
                    tl_block_idx = dim3{b, 0, 0};
                    kernel();
                    // End of block: the next block may reuse __shared__ storage only after all
                    // threads of this one are done.
                    bar.arrive_and_wait();
                }
            });
        }
        for (auto& th : threads) th.join();
        g_barrier = nullptr;
        return 0;
    } catch (...) {
        // std::thread failed to start (std::system_error). Threads already started would wait
        // forever on the barrier, so this cannot be recovered from: stop the process loudly
        // rather than return into Rust with threads blocked on a stack object.
        std::terminate();
    }
}

}  // namespace specula_shim
}  // namespace

#define threadIdx (specula_shim::tl_thread_idx)
#define blockIdx (specula_shim::tl_block_idx)
#define blockDim (specula_shim::g_block_dim)
#define gridDim (specula_shim::g_grid_dim)
#define warpSize (specula_shim::kWarpSize)

// The kernel keeps its extern "C" linkage; launch.cpp renames it per mode.
#define __global__
#define __device__ static
#define __forceinline__ inline
#define SP_NOINLINE
#define __shared__ static
#define __launch_bounds__(...)
#define __restrict__ __restrict

struct alignas(16) float4 {
    float x, y, z, w;
};

static inline void __syncthreads() { specula_shim::sync_block(); }

static inline unsigned int __float_as_uint(float f) { return std::bit_cast<unsigned int>(f); }
static inline float __uint_as_float(unsigned int u) { return std::bit_cast<float>(u); }
static inline long long __double_as_longlong(double d) { return std::bit_cast<long long>(d); }
static inline double __longlong_as_double(long long u) { return std::bit_cast<double>(u); }

static inline unsigned int __umulhi(unsigned int a, unsigned int b) {
    return static_cast<unsigned int>((static_cast<unsigned long long>(a) * b) >> 32);
}

static inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
    return std::atomic_ref<unsigned long long>(*p).fetch_add(v);
}
static inline unsigned long long atomicMax(unsigned long long* p, unsigned long long v) {
    std::atomic_ref<unsigned long long> a(*p);
    unsigned long long old = a.load();
    while (old < v && !a.compare_exchange_weak(old, v)) {
    }
    return old;
}
// Blocks run one after another on the same threads, so a device-wide fence is a plain one.
static inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
static inline unsigned long long atomicOr(unsigned long long* p, unsigned long long v) {
    return std::atomic_ref<unsigned long long>(*p).fetch_or(v);
}

#if defined(SPECULA_HIP)
template <class T>
static inline T __shfl_down(T v, unsigned int delta) {
    return specula_shim::shfl_down(v, delta);
}
#else
template <class T>
static inline T __shfl_down_sync(unsigned int mask, T v, unsigned int delta) {
    // The kernel always shuffles with the whole warp; a partial mask would be a kernel bug.
    if (mask != 0xFFFFFFFFu) std::terminate();
    return specula_shim::shfl_down(v, delta);
}
#endif
