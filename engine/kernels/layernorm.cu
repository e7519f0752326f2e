// LayerNorm over the last dimension, forward (plain and with the residual add fused in, ORT's
// SkipLayerNormalization) and backward. CPU counterparts: engine/src/backend/cpu/kernels/layernorm.rs
// (`layernorm_forward`, `add_layernorm_forward`, `layernorm_backward`); references: llm.c
// layernorm_forward/backward, torch.nn.functional.layer_norm.
//
// One warp per row (rows of a transformer are 768–4096 wide: a warp's lanes stride the row, the
// row stays in L1 between the passes); mean and variance in two passes in f32 as the CPU does
// (not Welford), rstd = 1/sqrt(var + eps) with the biased variance. The weight/bias gradients
// are column sums over all rows: per-chunk partials here, added in order by reduce.cu's
// `column_sum_finish`, so no atomics and the same bits on every run.
#include "port.cuh"

// y = (x − mean)·rstd·w + b per row; mean, rstd saved for the backward.
// y, x: (R, C) T; mean, rstd: (R) f32; w, b: (C) T. Block: rows_per_block = blockDim / warpSize.
template <typename T>
__device__ void layernorm_forward(T* y, float* mean, float* rstd, const T* x, const T* w, const T* b, long long rows, int c, float eps) {
    const long long row = (long long)blockIdx.x * (blockDim.x / warpSize) + warp_id();
    if (row >= rows) return;  // warp-uniform: no collective is skipped by part of a warp
    const T* xr = x + row * c;
    float s = 0.0f;
    for (int i = lane_id(); i < c; i += warpSize) s += to_f32(xr[i]);
    const float m = warp_sum(s) / (float)c;
    float v = 0.0f;
    for (int i = lane_id(); i < c; i += warpSize) {
        const float d = to_f32(xr[i]) - m;
        v = fmaf(d, d, v);
    }
    const float r = 1.0f / sqrtf(warp_sum(v) / (float)c + eps);
    T* yr = y + row * c;
    for (int i = lane_id(); i < c; i += warpSize) yr[i] = from_f32<T>(fmaf((to_f32(xr[i]) - m) * r, to_f32(w[i]), to_f32(b[i])));
    if (lane_id() == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

// sum = a + b, y = LayerNorm(sum): the normalisation reads the f32 sum (recomputed per pass),
// not its rounded copy, as the CPU does. a may alias sum (the plan put the sum over a dying
// operand). sum, y, a, b: (R, C) T; mean, rstd: (R) f32; w, bias: (C) T.
template <typename T>
__device__ void add_layernorm_forward(T* sum, T* y, float* mean, float* rstd, const T* a, const T* b, const T* w, const T* bias, long long rows, int c, float eps) {
    const long long row = (long long)blockIdx.x * (blockDim.x / warpSize) + warp_id();
    if (row >= rows) return;  // warp-uniform
    const long long o = row * c;
    float s = 0.0f;
    for (int i = lane_id(); i < c; i += warpSize) s += to_f32(a[o + i]) + to_f32(b[o + i]);
    const float m = warp_sum(s) / (float)c;
    float v = 0.0f;
    for (int i = lane_id(); i < c; i += warpSize) {
        const float d = to_f32(a[o + i]) + to_f32(b[o + i]) - m;
        v = fmaf(d, d, v);
    }
    const float r = 1.0f / sqrtf(warp_sum(v) / (float)c + eps);
    for (int i = lane_id(); i < c; i += warpSize) {
        const float t = to_f32(a[o + i]) + to_f32(b[o + i]);  // read before the write: a may be sum
        sum[o + i] = from_f32<T>(t);
        y[o + i] = from_f32<T>(fmaf((t - m) * r, to_f32(w[i]), to_f32(bias[i])));
    }
    if (lane_id() == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

// dx = rstd·(dnorm − mean(dnorm) − norm·mean(dnorm·norm)), dnorm = dy·w, norm = (x − mean)·rstd.
// dx may alias dy. dx, dy, x: (R, C) T; w: (C) T; mean, rstd: (R) f32.
template <typename T>
__device__ void layernorm_backward_dx(T* dx, const T* dy, const T* x, const T* w, const float* mean, const float* rstd, long long rows, int c) {
    const long long row = (long long)blockIdx.x * (blockDim.x / warpSize) + warp_id();
    if (row >= rows) return;  // warp-uniform
    const long long o = row * c;
    const float m = mean[row], r = rstd[row];
    float a1 = 0.0f, a2 = 0.0f;
    for (int i = lane_id(); i < c; i += warpSize) {
        const float norm = (to_f32(x[o + i]) - m) * r;
        const float dnorm = to_f32(dy[o + i]) * to_f32(w[i]);
        a1 += dnorm;
        a2 = fmaf(dnorm, norm, a2);
    }
    const float inv_c = 1.0f / (float)c;
    const float dnorm_mean = warp_sum(a1) * inv_c;
    const float dnorm_norm_mean = warp_sum(a2) * inv_c;
    for (int i = lane_id(); i < c; i += warpSize) {
        const float norm = (to_f32(x[o + i]) - m) * r;
        const float dnorm = to_f32(dy[o + i]) * to_f32(w[i]);
        dx[o + i] = from_f32<T>(r * (dnorm - dnorm_mean - norm * dnorm_norm_mean));
    }
}

// Partial weight/bias gradients per chunk of rows: ws[k, j] = Σ_{r in chunk k} dy·norm and
// ws[chunks + k, j] = Σ dy (then column_sum_finish_f32 twice gives dw and db). Grid as
// reduce.cu's column_sum_partial: chunks × ceil(C / blockDim) blocks.
// ws: (2, chunks, C) f32; dy, x: (R, C) T; mean, rstd: (R) f32.
template <typename T>
__device__ void layernorm_backward_dwdb(float* ws, const T* dy, const T* x, const float* mean, const float* rstd, long long rows, int c, int rows_per_chunk, int chunks) {
    const ColumnChunk k = column_chunk(rows, c, rows_per_chunk);
    if (k.j >= c) return;
    float dw = 0.0f, db = 0.0f;
    for (long long r = k.r0; r < k.r1; ++r) {
        const float g = to_f32(dy[r * c + k.j]);
        dw = fmaf(g, (to_f32(x[r * c + k.j]) - mean[r]) * rstd[r], dw);
        db += g;
    }
    ws[k.chunk * c + k.j] = dw;
    ws[((long long)chunks + k.chunk) * c + k.j] = db;
}

#define LAYERNORM(S, T)                                                                                                        \
    ORT_KERNEL(layernorm_forward_##S)(T * y, float* mean, float* rstd, const T* x, const T* w, const T* b, long long rows, int c, float eps) { \
        layernorm_forward<T>(y, mean, rstd, x, w, b, rows, c, eps);                                                            \
    }                                                                                                                          \
    ORT_REGISTER(layernorm_forward_##S)                                                                                        \
    ORT_KERNEL(add_layernorm_forward_##S)(T * sum, T * y, float* mean, float* rstd, const T* a, const T* b, const T* w, const T* bias, \
                                          long long rows, int c, float eps) {                                                  \
        add_layernorm_forward<T>(sum, y, mean, rstd, a, b, w, bias, rows, c, eps);                                             \
    }                                                                                                                          \
    ORT_REGISTER(add_layernorm_forward_##S)                                                                                    \
    ORT_KERNEL(layernorm_backward_dx_##S)(T * dx, const T* dy, const T* x, const T* w, const float* mean, const float* rstd, long long rows, int c) { \
        layernorm_backward_dx<T>(dx, dy, x, w, mean, rstd, rows, c);                                                           \
    }                                                                                                                          \
    ORT_REGISTER(layernorm_backward_dx_##S)                                                                                    \
    ORT_KERNEL(layernorm_backward_dwdb_##S)(float* ws, const T* dy, const T* x, const float* mean, const float* rstd, long long rows, int c, \
                                            int rows_per_chunk, int chunks) {                                                  \
        layernorm_backward_dwdb<T>(ws, dy, x, mean, rstd, rows, c, rows_per_chunk, chunks);                                    \
    }                                                                                                                          \
    ORT_REGISTER(layernorm_backward_dwdb_##S)
ORT_FOR_FLOATS(LAYERNORM)
