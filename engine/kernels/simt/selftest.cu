// Kernels that test the SIMT harness itself (engine/kernels/simt/tests/harness.rs): a correct
// block reduction, the same with its barrier missing, a warp collective in divergent code, an
// early return before a barrier, an off-by-one write, and a schedule trace. Compiled into the
// host harness only (not GPU kernels: not in the NVRTC gate).
#include "port.cuh"

// out[blockIdx.x] = Σ x[blockIdx.x·blockDim.x + t] through shared memory, tree-wise. `sync` = 0
// drops the barrier between the writes and the first reads. x: (G·B); out: (G)
ORT_KERNEL(selftest_tree_sum)(const float* x, float* out, int sync) {
    __shared__ float s[1024];
    const int t = threadIdx.x;
    s[t] = x[blockIdx.x * blockDim.x + t];
    if (sync) __syncthreads();
    for (int h = blockDim.x / 2; h > 0; h >>= 1) {
        const float v = t < h ? s[t] + s[t + h] : 0.0f;
        __syncthreads();
        if (t < h) s[t] = v;
        __syncthreads();
    }
    if (t == 0) out[blockIdx.x] = s[0];
}
ORT_REGISTER(selftest_tree_sum)

// out[blockIdx.x] = block_sum(x) — warp shuffles and a cross-warp step. x: (G·B); out: (G)
ORT_KERNEL(selftest_block_sum)(const float* x, float* out) {
    __shared__ float scratch[32];
    const float v = block_sum(x[blockIdx.x * blockDim.x + threadIdx.x], scratch);
    if (threadIdx.x == 0) out[blockIdx.x] = v;
}
ORT_REGISTER(selftest_block_sum)

// A warp reduction that only the first half of each warp calls: a deadlock on the GPU too.
ORT_KERNEL(selftest_divergent_shuffle)(const float* x, float* out) {
    float v = x[threadIdx.x];
    if (lane_id() < warpSize / 2) v = warp_sum(v);
    out[threadIdx.x] = v;
}
ORT_REGISTER(selftest_divergent_shuffle)

// out[i + 1] = x[i] for every thread: the last thread writes one element past the end. x, out: (B)
ORT_KERNEL(selftest_off_by_one)(const float* x, float* out) {
    out[threadIdx.x + 1] = x[threadIdx.x];
}
ORT_REGISTER(selftest_off_by_one)

// y[i] = x[i] over a grid-stride loop (the launch geometry's own check). x, y: (N)
ORT_KERNEL(selftest_copy)(const float* x, float* y, long long n) {
    GRID_STRIDE(i, n) y[i] = x[i];
}
ORT_REGISTER(selftest_copy)

// Two rows reduced through the same shared scratch: out[row] = Σ x[row·B + t], written by the
// block's last thread. `guard` = 0 drops the barrier that keeps an early warp from writing
// row 1's partial while later warps still read row 0's. x: (2·B); out: (2)
ORT_KERNEL(selftest_two_rows)(const float* x, float* out, int guard) {
    __shared__ float s[32];
    const int nwarps = (int)blockDim.x / warpSize;
    for (int row = 0; row < 2; ++row) {
        const float v = warp_sum(x[row * blockDim.x + threadIdx.x]);
        if (lane_id() == 0) s[warp_id()] = v;
        __syncthreads();
        float t = 0.0f;
        for (int w = 0; w < nwarps; ++w) t += s[w];
        if (guard) __syncthreads();
        if (threadIdx.x == blockDim.x - 1) out[row] = t;
    }
}
ORT_REGISTER(selftest_two_rows)

// y[i] = x[i] after a barrier that thread 0 of block `bad` never reaches (it returns early): a
// deadlock in that block on the GPU too. x, y: (G·B)
ORT_KERNEL(selftest_early_return)(const float* x, float* y, int bad) {
    if ((int)blockIdx.x == bad && threadIdx.x == 0) return;
    __syncthreads();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    y[i] = x[i];
}
ORT_REGISTER(selftest_early_return)

// Records the schedule: each thread appends blockIdx.x·4096 + threadIdx.x to log[1..] before
// every barrier and collective and once at its end (log[0] counts; one thread runs at a time, so
// plain increments). Barriers, shuffles and bare warp syncs alternate; then warp w does w more
// shuffles on its own and leaves, so later warps run on after earlier ones exited. log: (1 + ...)
ORT_KERNEL(selftest_trace)(int* log, int rounds) {
    const int me = (int)blockIdx.x * 4096 + (int)threadIdx.x;
    float v = (float)threadIdx.x;
    for (int r = 0; r < rounds; ++r) {
        log[1 + log[0]++] = me;
        if (r % 3 == 0) __syncthreads();
        else if (r % 3 == 1) v = warp_sum(v);
        else port_syncwarp();
    }
    for (int k = 0; k < warp_id(); ++k) {
        log[1 + log[0]++] = me;
        v = port_shfl_xor(v, 1);
    }
    log[1 + log[0]++] = v == v ? me : -1;
}
ORT_REGISTER(selftest_trace)
