// specula_probes.cu: one __global__ wrapper per row pass of specula_verify.cu, so that
// scripts/kernel-report.py can read each pass's hot loop in the SASS on its own. Compiled only by
// that script, appended to the kernel text (backend-cuda/examples/kernel_ptx.rs), never shipped.
// Each wrapper runs one pass over one row per block and stores its result, so nothing is
// optimised away; the launch bounds are the kernel's (SP_LAUNCH_BOUNDS: the same register cap).

extern "C" __global__ void SP_LAUNCH_BOUNDS
specula_probe_argmax(const float* __restrict__ rows, sp_u32 vocab, sp_u32 stride, sp_u32* __restrict__ out) {
    __shared__ sp_u64 s_red[SPECULA_MAX_WARPS];
    const sp_u32 r = sp_argmax(rows + (sp_u64)blockIdx.x * stride, vocab, s_red);
    if (threadIdx.x == 0u) out[blockIdx.x] = r;
}

extern "C" __global__ void SP_LAUNCH_BOUNDS
specula_probe_entropy(const float* __restrict__ rows, sp_u32 vocab, sp_u32 stride, float* __restrict__ out) {
    __shared__ sp_u64 s_red[SPECULA_MAX_WARPS];
    const float h = sp_entropy(rows + (sp_u64)blockIdx.x * stride, vocab, s_red);
    if (threadIdx.x == 0u) out[blockIdx.x] = h;
}

// The race over a target row (typical acceptance's emission and every bonus token).
extern "C" __global__ void SP_LAUNCH_BOUNDS
specula_probe_race(const float* __restrict__ rows, sp_u32 vocab, sp_u32 stride, sp_u64 seed,
                   sp_u64 offset, sp_u64* __restrict__ out) {
    __shared__ sp_u64 s_red[SPECULA_MAX_WARPS];
    const sp_u64 w = sp_race(rows + (sp_u64)blockIdx.x * stride, 0, false, 0u, vocab, 1u,
                             (sp_u32)seed, (sp_u32)(seed >> 32), (sp_u32)offset,
                             (sp_u32)(offset >> 32), s_red);
    if (threadIdx.x == 0u) out[blockIdx.x] = w;
}

// The race over a residual target - draft (rejection sampling after a rejection).
extern "C" __global__ void SP_LAUNCH_BOUNDS
specula_probe_residual(const float* __restrict__ trows, const float* __restrict__ drows,
                       sp_u32 vocab, sp_u32 stride, sp_u64 seed, sp_u64 offset,
                       sp_u64* __restrict__ out) {
    __shared__ sp_u64 s_red[SPECULA_MAX_WARPS];
    const sp_u64 w = sp_race(trows + (sp_u64)blockIdx.x * stride, drows + (sp_u64)blockIdx.x * stride,
                             true, 0u, vocab, 1u, (sp_u32)seed, (sp_u32)(seed >> 32),
                             (sp_u32)offset, (sp_u32)(offset >> 32), s_red);
    if (threadIdx.x == 0u) out[blockIdx.x] = w;
}

// One acceptance test of rejection sampling (its Philox block and the binary64 comparison), as
// the kernel runs it for each draft position: the report counts this function's instructions.
extern "C" __global__ void SP_LAUNCH_BOUNDS
specula_probe_accept(const float* __restrict__ pt, const float* __restrict__ pd, sp_u64 seed,
                     sp_u64 offset, sp_u32* __restrict__ out) {
    const sp_u32 j = blockIdx.x;
    sp_u32 c[4] = {0u, (j << 2) | 0u, (sp_u32)offset, (sp_u32)(offset >> 32)};
    sp_philox(c, (sp_u32)seed, (sp_u32)(seed >> 32));
    const bool a = sp_accepts(((sp_u64)c[0] << 32) | (sp_u64)c[1], pt[j], pd[j]);
    if (threadIdx.x == 0u) out[j] = a ? 1u : 0u;
}

// The softmax's maximum pass over a logit row (target logits, T > 0).
extern "C" __global__ void SP_LAUNCH_BOUNDS
specula_probe_softmax_max(const float* __restrict__ rows, sp_u32 vocab, sp_u32 stride, float t,
                          sp_u32 fmt, sp_u32* __restrict__ out) {
    __shared__ sp_u64 s_red[SPECULA_MAX_WARPS];
    // The logits entries' code: the row's format chosen at run time (binary32 path measured).
    const sp_u32 key = sp_softmax_max_part<SP_FX_ANY>(rows + (sp_u64)blockIdx.x * stride, vocab, t,
                                                      threadIdx.x, blockDim.x, s_red, fmt);
    if (threadIdx.x == 0u) out[blockIdx.x] = key;
}

// The softmax's exact-sum pass over a logit row.
extern "C" __global__ void SP_LAUNCH_BOUNDS
specula_probe_softmax_sum(const float* __restrict__ rows, sp_u32 vocab, sp_u32 stride, float t,
                          float m, sp_u32 fmt, double* __restrict__ out) {
    __shared__ sp_u64 s_red[SPECULA_MAX_WARPS];
    sp_u64 h, l;
    sp_softmax_sum_part<SP_FX_ANY>(rows + (sp_u64)blockIdx.x * stride, vocab, t, m, threadIdx.x,
                                   blockDim.x, s_red, h, l, fmt);
    if (threadIdx.x == 0u) out[blockIdx.x] = sp_soft_sum(h, l);
}

// The race over a logit row's probabilities, computed on the fly (typical acceptance's emission
// and the bonus token with target logits).
extern "C" __global__ void SP_LAUNCH_BOUNDS
specula_probe_race_logits(const float* __restrict__ rows, sp_u32 vocab, sp_u32 stride, float t,
                          float m, double s, sp_u32 fmt, sp_u64 seed, sp_u64 offset,
                          sp_u64* __restrict__ out) {
    __shared__ sp_u64 s_red[SPECULA_MAX_WARPS];
    const sp_soft st = sp_soft_of(t, m, s, 0u, SP_P_SOFT, fmt, SP_FMT_F32);
    // SP_P_ANY with the kind SP_P_SOFT: what the logits entries run for logits at T > 0.
    const sp_u64 w = sp_race<SP_P_ANY, SP_FX_ANY>(rows + (sp_u64)blockIdx.x * stride, 0, false, 0u, vocab, 1u,
                                   (sp_u32)seed, (sp_u32)(seed >> 32), (sp_u32)offset,
                                   (sp_u32)(offset >> 32), s_red, &st);
    if (threadIdx.x == 0u) out[blockIdx.x] = w;
}

// ---- the logits entries' new passes (engine inputs, issue 13)

// The softmax's exact-sum pass over a bf16 logit row (the half path alone: format fixed).
extern "C" __global__ void SP_LAUNCH_BOUNDS
specula_probe_softmax_sum_bf16(const float* __restrict__ rows, sp_u32 vocab, sp_u32 stride,
                               float t, float m, double* __restrict__ out) {
    __shared__ sp_u64 s_red[SPECULA_MAX_WARPS];
    sp_u64 h, l;
    sp_softmax_sum_part<SP_FMT_BF16>(sp_at(rows, (sp_u64)blockIdx.x * stride, SP_FMT_BF16), vocab,
                                     t, m, threadIdx.x, blockDim.x, s_red, h, l);
    if (threadIdx.x == 0u) out[blockIdx.x] = sp_soft_sum(h, l);
}

// The race over an f16 logit row's probabilities: what the logits entries run for a half row
// (sp_race_part_any_half: SP_P_ANY, HALF), with the kind and format as constants, so that only
// its loop for f16 logits (sp_race_scan_half) is compiled here.
extern "C" __global__ void SP_LAUNCH_BOUNDS
specula_probe_race_logits_f16(const float* __restrict__ rows, sp_u32 vocab, sp_u32 stride,
                              float t, float m, double s, sp_u64 seed, sp_u64 offset,
                              sp_u64* __restrict__ out) {
    __shared__ sp_u64 s_red[SPECULA_MAX_WARPS];
    const sp_soft st = sp_soft_of(t, m, s, 0u, SP_P_SOFT, SP_FMT_F16, SP_FMT_F16);
    const sp_u64 w = sp_race<SP_P_ANY, SP_FX_ANY, true>(
        sp_at(rows, (sp_u64)blockIdx.x * stride, SP_FMT_F16), 0, false, 0u, vocab, 1u,
        (sp_u32)seed, (sp_u32)(seed >> 32), (sp_u32)offset, (sp_u32)(offset >> 32), s_red, &st);
    if (threadIdx.x == 0u) out[blockIdx.x] = w;
}

// The race over a filtered logit row (top-k / top-p / min-p threshold theta, kept mass s).
extern "C" __global__ void SP_LAUNCH_BOUNDS
specula_probe_race_cut(const float* __restrict__ rows, sp_u32 vocab, sp_u32 stride, float t,
                       float m, double s, sp_u32 theta, sp_u32 fmt, sp_u64 seed, sp_u64 offset,
                       sp_u64* __restrict__ out) {
    __shared__ sp_u64 s_red[SPECULA_MAX_WARPS];
    const sp_soft st = sp_soft_of(t, m, s, theta, SP_P_SOFT_CUT, fmt, SP_FMT_F32);
    // SP_P_ANY: the instantiation the logits entries run for every row kind.
    const sp_u64 w = sp_race<SP_P_ANY, SP_FX_ANY>(rows + (sp_u64)blockIdx.x * stride, 0, false,
                                                       0u, vocab, 1u, (sp_u32)seed,
                                                       (sp_u32)(seed >> 32), (sp_u32)offset,
                                                       (sp_u32)(offset >> 32), s_red, &st);
    if (threadIdx.x == 0u) out[blockIdx.x] = w;
}

// One histogram pass of the filters' radix descent: counts (top-k), or masses (top-p), by key
// digit, of a logit row's softmax weights. sp_filter_pass is SP_NOINLINE; each probe's call has
// its mode, level and (count) floor as constants, which ptxas propagates into the probe's copy,
// so each reports one loop: at level 1 (filter_count, filter_mass) the sparse loop that every
// level >= 1 and every pass with a floor runs (sp_filter_sparse: the bound's test on the hot
// path, the exact weight in its cold region), at level 0 without a floor (filter_count0,
// filter_mass0) the dense loop (every id's exact weight), which the top-k descent's first
// pass and a top-p descent without a floor run. The logits entries run one copy with the mode,
// level and floor read at run time: both loops, chosen by a uniform branch.
extern "C" __global__ void SP_LAUNCH_BOUNDS
specula_probe_filter_count(const float* __restrict__ rows, sp_u32 vocab, sp_u32 stride, float t,
                           float m, sp_u32 fmt, sp_u32 prefix, sp_u64* __restrict__ out) {
    __shared__ sp_u64 s_red[SPECULA_MAX_WARPS];
    __shared__ sp_u64 s_hist[SP_HIST_WORDS];
    const sp_soft st = sp_soft_of(t, m, 0.0, 0u, SP_P_SOFT, fmt, SP_FMT_F32);
    sp_u64 o[4];
    sp_filter_pass<SP_FX_ANY>(rows + (sp_u64)blockIdx.x * stride, vocab, st, true, SP_FP_COUNT, 1u,
                              prefix, 0u, s_hist, s_red, o);
    if (threadIdx.x == 0u) out[blockIdx.x] = s_hist[blockIdx.x & (SP_HIST_HAND - 1u)];
}
extern "C" __global__ void SP_LAUNCH_BOUNDS
specula_probe_filter_mass(const float* __restrict__ rows, sp_u32 vocab, sp_u32 stride, float t,
                          float m, sp_u32 fmt, sp_u32 prefix, sp_u32 floor_,
                          sp_u64* __restrict__ out) {
    __shared__ sp_u64 s_red[SPECULA_MAX_WARPS];
    __shared__ sp_u64 s_hist[SP_HIST_WORDS];
    const sp_soft st = sp_soft_of(t, m, 0.0, 0u, SP_P_SOFT, fmt, SP_FMT_F32);
    sp_u64 o[4];
    sp_filter_pass<SP_FX_ANY>(rows + (sp_u64)blockIdx.x * stride, vocab, st, true, SP_FP_MASS_HIST,
                              1u, prefix, floor_, s_hist, s_red, o);
    if (threadIdx.x == 0u) out[blockIdx.x] = s_hist[blockIdx.x & (SP_HIST_HAND - 1u)];
}
extern "C" __global__ void SP_LAUNCH_BOUNDS
specula_probe_filter_count0(const float* __restrict__ rows, sp_u32 vocab, sp_u32 stride, float t,
                            float m, sp_u32 fmt, sp_u64* __restrict__ out) {
    __shared__ sp_u64 s_red[SPECULA_MAX_WARPS];
    __shared__ sp_u64 s_hist[SP_HIST_WORDS];
    const sp_soft st = sp_soft_of(t, m, 0.0, 0u, SP_P_SOFT, fmt, SP_FMT_F32);
    sp_u64 o[4];
    sp_filter_pass<SP_FX_ANY>(rows + (sp_u64)blockIdx.x * stride, vocab, st, true, SP_FP_COUNT, 0u,
                              0u, 0u, s_hist, s_red, o);
    if (threadIdx.x == 0u) out[blockIdx.x] = s_hist[blockIdx.x & (SP_HIST_HAND - 1u)];
}
extern "C" __global__ void SP_LAUNCH_BOUNDS
specula_probe_filter_mass0(const float* __restrict__ rows, sp_u32 vocab, sp_u32 stride, float t,
                           float m, sp_u32 fmt, sp_u64* __restrict__ out) {
    __shared__ sp_u64 s_red[SPECULA_MAX_WARPS];
    __shared__ sp_u64 s_hist[SP_HIST_WORDS];
    const sp_soft st = sp_soft_of(t, m, 0.0, 0u, SP_P_SOFT, fmt, SP_FMT_F32);
    sp_u64 o[4];
    sp_filter_pass<SP_FX_ANY>(rows + (sp_u64)blockIdx.x * stride, vocab, st, true, SP_FP_MASS_HIST,
                              0u, 0u, 0u, s_hist, s_red, o);
    if (threadIdx.x == 0u) out[blockIdx.x] = s_hist[blockIdx.x & (SP_HIST_HAND - 1u)];
}
