// shim.hpp: just enough of the CUDA / HIP programming model to run core/kernels/specula_verify.cu
// unchanged on the host, one fiber (a stack of its own, switched in user space) per GPU thread.
//
// * `__global__` / `__device__` functions become `static` functions of the including translation
//   unit (each mode is its own TU, so the CUDA-mode and HIP-mode copies never merge).
// * A launch runs on the calling OS thread: a block's threads are fibers, resumed one after
//   another by a scheduler; `__syncthreads` switches back to it. A round resumes every fiber once,
//   up to its next barrier (or its end), so each round is one barrier phase. The first version
//   used one OS thread per GPU thread and a std::barrier: on two cores, more than half of a
//   kernel test's time went to the kernel's scheduler (sched_yield in the barrier's wait); a
//   user-space switch costs a few nanoseconds.
// * Rounds alternate between ascending and descending thread order, so a read of another
//   thread's write that lacks a barrier between them can see the stale value whichever thread
//   is the writer, and always the same way: a run is reproducible. (Attacked in
//   tests/tests/it/kernel_host_shim.rs: skipping one of the first 40 barriers at a time, the
//   conformance batches catch 15 (CUDA) and 13 (HIP); one fixed order catches about as many.)
//   A barrier some threads of a block skip (they
//   return while others wait) stops the launch with a message and an error (the launcher
//   returns 2): on a GPU it is undefined.
// * threadIdx is the running fiber's; blockIdx, blockDim, gridDim are per-TU globals, set by
//   `launch` while it holds the TU's launch mutex (launches of one mode run one at a time).
//   Blocks run one after another, so `__shared__` (function-local statics) is exactly per-block
//   storage.
// * warp shuffles go through per-block exchange arrays, one barrier each: every thread of the
//   block must call them together, which the kernel guarantees (its reductions are block-uniform).
// * atomics use std::atomic_ref on the caller's memory.
// Define SPECULA_HIP before including this header for HIP mode (wave size 64, `__shfl_down`).
// The switch is a few lines of assembly on x86-64 (callee-saved registers and the stack
// pointer, as the System V ABI defines them); elsewhere, or with SPECULA_SHIM_UCONTEXT defined,
// it is POSIX ucontext (portable, but a system call per switch for the signal mask).
#pragma once

#include <atomic>
#include <bit>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <type_traits>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

#if defined(__x86_64__) && !defined(SPECULA_SHIM_UCONTEXT)
#define SPECULA_SHIM_ASM 1
// Distinct symbols per mode: both modes' objects are linked into one test binary.
#if defined(SPECULA_HIP)
#define SP_FIBER_SWITCH specula_shim_fiber_switch_hip
#define SP_FIBER_ENTRY specula_shim_fiber_entry_hip
#else
#define SP_FIBER_SWITCH specula_shim_fiber_switch_cuda
#define SP_FIBER_ENTRY specula_shim_fiber_entry_cuda
#endif
#define SP_STR2(x) #x
#define SP_STR(x) SP_STR2(x)
// SP_FIBER_SWITCH(save, to): pushes the callee-saved registers, stores the stack pointer in
// *save, loads `to` as the stack pointer and pops the registers saved there. SP_FIBER_ENTRY is
// where a new fiber's first switch returns to: it calls r13(r12) on the fiber's stack (16-byte
// aligned at the call), which never returns.
extern "C" void SP_FIBER_SWITCH(void** save, void* to);
extern "C" void SP_FIBER_ENTRY();
asm(".text\n"
    ".p2align 4\n"
    ".globl " SP_STR(SP_FIBER_SWITCH) "\n"
    ".hidden " SP_STR(SP_FIBER_SWITCH) "\n"
    ".type " SP_STR(SP_FIBER_SWITCH) ",@function\n"
    SP_STR(SP_FIBER_SWITCH) ":\n"
    "    pushq %rbp\n"
    "    pushq %rbx\n"
    "    pushq %r12\n"
    "    pushq %r13\n"
    "    pushq %r14\n"
    "    pushq %r15\n"
    "    movq %rsp, (%rdi)\n"
    "    movq %rsi, %rsp\n"
    "    popq %r15\n"
    "    popq %r14\n"
    "    popq %r13\n"
    "    popq %r12\n"
    "    popq %rbx\n"
    "    popq %rbp\n"
    "    ret\n"
    ".size " SP_STR(SP_FIBER_SWITCH) ",.-" SP_STR(SP_FIBER_SWITCH) "\n"
    ".p2align 4\n"
    ".globl " SP_STR(SP_FIBER_ENTRY) "\n"
    ".hidden " SP_STR(SP_FIBER_ENTRY) "\n"
    ".type " SP_STR(SP_FIBER_ENTRY) ",@function\n"
    SP_STR(SP_FIBER_ENTRY) ":\n"
    "    movq %r12, %rdi\n"
    "    callq *%r13\n"
    "    ud2\n"
    ".size " SP_STR(SP_FIBER_ENTRY) ",.-" SP_STR(SP_FIBER_ENTRY) "\n");
#else
#include <ucontext.h>
#endif

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

[[noreturn]] inline void fail(const char* why) {
    std::fprintf(stderr, "kernel_host shim: %s\n", why);
    std::fflush(stderr);
    std::abort();
}

// A fiber's stack: mapped, with an inaccessible page below it so that an overflow faults
// instead of overwriting the next stack. The kernel's frames are small (a few KB: no large
// local arrays); 256 KB leaves room for a debug C++ build.
constexpr std::size_t kStackBytes = 256 * 1024;

struct Stack {
    char* base = nullptr;  // the guard page
    std::size_t bytes = 0; // guard + stack
    char* top() const { return base + bytes; }
};

inline Stack map_stack() {
    const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    const std::size_t bytes = kStackBytes + page;
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) fail("cannot map a fiber stack");
    if (mprotect(p, page, PROT_NONE) != 0) fail("cannot protect a fiber stack's guard page");
    return Stack{static_cast<char*>(p), bytes};
}

struct Fiber {
#if defined(SPECULA_SHIM_ASM)
    void* sp = nullptr;
#else
    ucontext_t ctx;
#endif
    unsigned int tid = 0;
    unsigned int exchange_phase = 0; // which exchange array its next shuffle writes
    unsigned int barriers = 0;       // barriers reached in this block
    bool done = false;
};

dim3 g_thread_idx; // the running fiber's
dim3 g_block_idx;
dim3 g_block_dim;
dim3 g_grid_dim;
// Two exchange arrays used alternately by successive shuffles (see shfl_down).
std::vector<std::uint64_t> g_exchange[2];
std::mutex g_launch_mutex;
// The attack of tests/tests/it/kernel_host_shim.rs: when n > 0, every thread of every block passes
// its n-th barrier (a `__syncthreads` or a shuffle's) without waiting, as if the kernel text
// lacked it. 0 (the default): every barrier holds.
std::atomic<unsigned int> g_skip_barrier{0};
// The same test's control: true runs every round in ascending thread order (what the attack
// compares the alternating orders with).
std::atomic<bool> g_ascending_only{false};

// The scheduler's state, owned by the launch holding g_launch_mutex.
std::vector<Stack> g_stacks; // kept between launches
std::vector<Fiber> g_fibers;
Fiber* g_current = nullptr;
void (*g_body)(void*) = nullptr; // the kernel of this launch, called with g_body_arg
void* g_body_arg = nullptr;
#if defined(SPECULA_SHIM_ASM)
void* g_scheduler_sp = nullptr;
#else
ucontext_t g_scheduler_ctx;
#endif

// Back to the scheduler; returns when the scheduler resumes this fiber.
inline void yield_to_scheduler() {
#if defined(SPECULA_SHIM_ASM)
    SP_FIBER_SWITCH(&g_current->sp, g_scheduler_sp);
#else
    if (swapcontext(&g_current->ctx, &g_scheduler_ctx) != 0) fail("swapcontext failed");
#endif
}

inline void resume(Fiber& f) {
    g_current = &f;
    g_thread_idx = dim3{f.tid, 0, 0};
#if defined(SPECULA_SHIM_ASM)
    SP_FIBER_SWITCH(&g_scheduler_sp, f.sp);
#else
    if (swapcontext(&g_scheduler_ctx, &f.ctx) != 0) fail("swapcontext failed");
#endif
}

// A fiber's whole life: the kernel once, then back to the scheduler for good.
void fiber_main() {
    g_body(g_body_arg);
    g_current->done = true;
    yield_to_scheduler();
    fail("a finished fiber was resumed");
}

#if defined(SPECULA_SHIM_ASM)
void fiber_entry(void*) { fiber_main(); }
#else
void fiber_entry_ucontext() { fiber_main(); }
#endif

// Makes fiber `t` start the kernel from the top of `stack` on its next resume.
inline void start(Fiber& f, unsigned int t, const Stack& stack) {
    f.tid = t;
    f.exchange_phase = 0;
    f.barriers = 0;
    f.done = false;
#if defined(SPECULA_SHIM_ASM)
    // What SP_FIBER_SWITCH pops, from the lowest address: r15, r14, r13, r12, rbx, rbp, then
    // the return address; the stack pointer after the return (&w[7]) is 16-byte aligned, as
    // the ABI wants it at the entry's call.
    auto top = reinterpret_cast<std::uintptr_t>(stack.top()) & ~std::uintptr_t{15};
    auto* w = reinterpret_cast<void**>(top) - 9;
    w[0] = nullptr;                                          // r15
    w[1] = nullptr;                                          // r14
    w[2] = reinterpret_cast<void*>(&fiber_entry);            // r13: what the entry calls
    w[3] = nullptr;                                          // r12: its argument
    w[4] = nullptr;                                          // rbx
    w[5] = nullptr;                                          // rbp
    w[6] = reinterpret_cast<void*>(&SP_FIBER_ENTRY);         // the return address
    w[7] = nullptr;                                          // (alignment)
    w[8] = nullptr;
    f.sp = w;
#else
    if (getcontext(&f.ctx) != 0) fail("getcontext failed");
    f.ctx.uc_stack.ss_sp = stack.base + (stack.bytes - kStackBytes);
    f.ctx.uc_stack.ss_size = kStackBytes;
    f.ctx.uc_link = nullptr;
    makecontext(&f.ctx, &fiber_entry_ucontext, 0);
#endif
}

inline void sync_block() {
    if (++g_current->barriers == g_skip_barrier.load(std::memory_order_relaxed)) return;
    yield_to_scheduler();
}

// Value of lane (lane + delta) of the caller's warp, or the caller's own value past the warp end.
template <class T>
T shfl_down(T v, unsigned int delta) {
    static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "shuffle of <= 8 bytes");
    const unsigned int tid = g_thread_idx.x;
    std::uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    // Alternating arrays need one barrier per shuffle instead of two: the next shuffle writes
    // the other array, and the one after that can only start once every thread has passed the
    // next shuffle's barrier, i.e. has finished reading this array.
    std::vector<std::uint64_t>& ex = g_exchange[g_current->exchange_phase];
    g_current->exchange_phase ^= 1u;
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

// Runs `kernel` on a grid of `grid` blocks of `block` threads, blocks one after another, on the
// calling thread. Returns 0, or 2 when some threads of a block reached a barrier that others
// never did (they returned): the launch stops there. (The launchers refuse a `block` of 0 or
// above the block size, with 1, before they get here.)
template <class F>
int launch(unsigned int grid, unsigned int block, F&& kernel) {
    std::lock_guard<std::mutex> guard(g_launch_mutex);
    using K = std::remove_reference_t<F>;
    g_body = [](void* k) { (*static_cast<K*>(k))(); };
    g_body_arg = const_cast<void*>(static_cast<const void*>(&kernel));
    g_block_dim = dim3{block, 1, 1};
    g_grid_dim = dim3{grid, 1, 1};
    g_exchange[0].assign(block, 0);
    g_exchange[1].assign(block, 0);
    while (g_stacks.size() < block) g_stacks.push_back(map_stack());
    g_fibers.resize(block);
    int rc = 0;
    for (unsigned int b = 0; b < grid; ++b) {
        g_block_idx = dim3{b, 0, 0};
        for (unsigned int t = 0; t < block; ++t) start(g_fibers[t], t, g_stacks[t]);
        // One round per barrier phase, until every fiber has returned from the kernel.
        const bool ascending_only = g_ascending_only.load(std::memory_order_relaxed);
        for (unsigned int round = 0;; ++round) {
            unsigned int finished = 0;
            for (unsigned int i = 0; i < block; ++i) {
                const bool up = ascending_only || round % 2 == 0;
                Fiber& f = g_fibers[up ? i : block - 1 - i];
                resume(f);
                finished += f.done ? 1u : 0u;
            }
            if (finished == block) break;
            if (finished != 0) {
                // The waiting fibers are abandoned (never resumed; their stacks are reused
                // from the top by the next launch) and the launch fails.
                std::fprintf(stderr, "kernel_host shim: a barrier reached by only some threads "
                                     "of block %u\n", b);
                rc = 2;
                break;
            }
        }
        if (rc != 0) break;
    }
    g_current = nullptr;
    g_body = nullptr;
    g_body_arg = nullptr;
    return rc;
}

}  // namespace specula_shim
}  // namespace

#define threadIdx (specula_shim::g_thread_idx)
#define blockIdx (specula_shim::g_block_idx)
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

// CUDA's and HIP's leading-zero count of a 64-bit word (64 for 0).
static inline int __clzll(long long x) { return std::countl_zero(static_cast<unsigned long long>(x)); }
// The 1-based position of the lowest set bit, 0 for 0 (CUDA and HIP alike).
static inline int __ffs(int x) { return x == 0 ? 0 : std::countr_zero(static_cast<unsigned int>(x)) + 1; }

static inline unsigned int __umulhi(unsigned int a, unsigned int b) {
    return static_cast<unsigned int>((static_cast<unsigned long long>(a) * b) >> 32);
}

static inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
    return std::atomic_ref<unsigned long long>(*p).fetch_add(v);
}
static inline unsigned int atomicAdd(unsigned int* p, unsigned int v) {
    return std::atomic_ref<unsigned int>(*p).fetch_add(v);
}
static inline unsigned long long atomicMax(unsigned long long* p, unsigned long long v) {
    std::atomic_ref<unsigned long long> a(*p);
    unsigned long long old = a.load();
    while (old < v && !a.compare_exchange_weak(old, v)) {
    }
    return old;
}
// Blocks run one after another on one thread, so a device-wide fence is a plain one.
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
