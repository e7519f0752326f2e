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

// The tensor-core emulation (simt/tensor_core.cpp) against a plain matrix product: one warp
// computes d = a·b + c for a (16×16 row-major), b (16×8 row-major, k × n), c and d (16×8 f32)
// through MmaA/MmaB/MmaAcc fragments, the fragments built by `mode`:
//  0: read from global memory with the ISA's element-to-lane mapping (port.cuh's comment);
//  1: ldmatrix .x4 for A and .x2.trans for B from row-major tiles in shared memory;
//  2: ldmatrix .x4 for A and .x2 for B from bᵀ (8×16) in shared memory;
//  3: as 0 with A's row and column swapped (a deliberately transposed fragment index);
//  4: as 0, but lanes 0..15 issue the mma from another line than lanes 16..31 (divergent);
//  5: as 1 with lane 3's row address 8 bytes off (misaligned ldmatrix).
// Dynamic shared memory: 16·16 + 16·8 + 8·16 elements of T.
template <typename T>
__device__ void selftest_mma(const T* a, const T* b, const float* c, float* d, int mode) {
    DYN_SHARED(T, sm);
    T* a_s = sm;            // (16, 16)
    T* b_s = a_s + 16 * 16; // (16, 8)
    T* bt_s = b_s + 16 * 8; // (8, 16)
    const int lane = lane_id(), g = lane / 4, t = lane % 4;
    for (int i = lane; i < 16 * 16; i += 32) a_s[i] = a[i];
    for (int i = lane; i < 16 * 8; i += 32) {
        b_s[i] = b[i];
        bt_s[(i % 8) * 16 + i / 8] = b[i];
    }
    __syncthreads();
    auto bits = [](T x) { return (unsigned)x.bits; };
    MmaA fa;
    MmaB fb;
    if (mode == 0 || mode == 3 || mode == 4) {
        for (int r = 0; r < 4; ++r) {
            const int row = g + (r & 1) * 8, col = 2 * t + (r >> 1) * 8;
            fa.r[r] = mode == 3 ? bits(a[col * 16 + row]) | bits(a[(col + 1) * 16 + row]) << 16 : bits(a[row * 16 + col]) | bits(a[row * 16 + col + 1]) << 16;
        }
        for (int r = 0; r < 2; ++r) {
            const int k = 2 * t + r * 8;
            fb.r[r] = bits(b[k * 8 + g]) | bits(b[(k + 1) * 8 + g]) << 16;
        }
    } else {
        const T* arow = a_s + (lane % 16) * 16 + (lane / 16) * 8;
        ldmatrix_x4(fa.r, mode == 5 && lane == 3 ? (const void*)(arow + 4) : (const void*)arow);
        if (mode == 2) ldmatrix_x2(fb.r, bt_s + (lane % 8) * 16 + ((lane / 8) % 2) * 8);
        else ldmatrix_x2_trans(fb.r, b_s + (lane % 16) * 8);
    }
    MmaAcc acc;
    for (int i = 0; i < 4; ++i) acc.c[i] = c[(g + (i >> 1) * 8) * 8 + 2 * t + (i & 1)];
    if (mode == 4 && lane < 16) mma_16816<T>(acc, fa, fb);
    else mma_16816<T>(acc, fa, fb);
    for (int i = 0; i < 4; ++i) d[(g + (i >> 1) * 8) * 8 + 2 * t + (i & 1)] = acc.c[i];
}
ORT_KERNEL(selftest_mma_f16)(const f16_t* a, const f16_t* b, const float* c, float* d, int mode) { selftest_mma<f16_t>(a, b, c, d, mode); }
ORT_REGISTER(selftest_mma_f16)
ORT_KERNEL(selftest_mma_bf16)(const bf16_t* a, const bf16_t* b, const float* c, float* d, int mode) { selftest_mma<bf16_t>(a, b, c, d, mode); }
ORT_REGISTER(selftest_mma_bf16)
