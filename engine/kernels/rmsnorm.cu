// RMSNorm over the last dimension (HF's LlamaRMSNorm, in f32), forward (plain and with the
// residual add fused in, ORT's SkipSimplifiedLayerNormalization) and backward. CPU counterparts:
// engine/src/backend/cpu/kernels/rmsnorm.rs (`rmsnorm_forward`, `add_rmsnorm_forward`,
// `rmsnorm_backward`); reference: engine/src/ops/rmsnorm.rs. Launchers:
// engine/src/exec/gpu/launch/rmsnorm.rs.
//
// The structure of layernorm.cu: one warp per row (the row stays in L1 between the passes),
// in 16-byte packs where the width and the operands allow (`warp_row_packed`), rstd =
// 1/sqrt(mean(x²) + eps) in f32; the weight gradient is a column sum over all rows,
// per-chunk partials here added in order by reduce.cu's `column_sum_finish`, so no atomics
// and the same bits on every run.
#include "port.cuh"

// y = w·(x·rstd) per row (HF's order of the two products); rstd saved for the backward.
// y, x: (R, C) T; rstd: (R) f32; w: (C) T. Block: rows_per_block = blockDim / warpSize.
template <typename T>
__device__ void rmsnorm_forward(T* y, float* rstd, const T* x, const T* w, long long rows, int c, float eps) {
    const long long row = (long long)blockIdx.x * (blockDim.x / warpSize) + warp_id();
    if (row >= rows) return;  // warp-uniform: no collective is skipped by part of a warp
    const T* xr = x + row * c;
    T* yr = y + row * c;
    constexpr int V = Pack<T>::V;
    const bool packed = c % V == 0 && aligned16(x) && aligned16(y) && aligned16(w);
    float s = 0.0f;
    warp_row_packed<V>(
        c, packed,
        [&](int i) {
            const float v = to_f32(xr[i]);
            s = fmaf(v, v, s);
        },
        [&](int i) {
            const Pack<T> p = load_pack(xr + i);
            for (int j = 0; j < V; ++j) s = fmaf(to_f32(p.e[j]), to_f32(p.e[j]), s);
        });
    const float r = 1.0f / sqrtf(warp_sum(s) * (1.0f / (float)c) + eps);
    warp_row_packed<V>(
        c, packed, [&](int i) { yr[i] = from_f32<T>(to_f32(w[i]) * (to_f32(xr[i]) * r)); },
        [&](int i) {
            const Pack<T> p = load_pack(xr + i), wp = load_pack(w + i);
            Pack<T> o;
            for (int j = 0; j < V; ++j) o.e[j] = from_f32<T>(to_f32(wp.e[j]) * (to_f32(p.e[j]) * r));
            store_pack(yr + i, o);
        });
    if (lane_id() == 0) rstd[row] = r;
}

// sum = a + b, y = RMSNorm(sum): the normalisation reads the f32 sum (recomputed per pass),
// not its rounded copy, as the CPU does. a may alias sum (the plan put the sum over a dying
// operand). sum, y, a, b: (R, C) T; rstd: (R) f32; w: (C) T.
template <typename T>
__device__ void add_rmsnorm_forward(T* sum, T* y, float* rstd, const T* a, const T* b, const T* w, long long rows, int c, float eps) {
    const long long row = (long long)blockIdx.x * (blockDim.x / warpSize) + warp_id();
    if (row >= rows) return;  // warp-uniform
    const long long o = row * c;
    constexpr int V = Pack<T>::V;
    const bool packed = c % V == 0 && aligned16(sum) && aligned16(y) && aligned16(a) && aligned16(b) && aligned16(w);
    float s = 0.0f;
    warp_row_packed<V>(
        c, packed,
        [&](int i) {
            const float t = to_f32(a[o + i]) + to_f32(b[o + i]);
            s = fmaf(t, t, s);
        },
        [&](int i) {
            const Pack<T> pa = load_pack(a + o + i), pb = load_pack(b + o + i);
            for (int j = 0; j < V; ++j) {
                const float t = to_f32(pa.e[j]) + to_f32(pb.e[j]);
                s = fmaf(t, t, s);
            }
        });
    const float r = 1.0f / sqrtf(warp_sum(s) * (1.0f / (float)c) + eps);
    // Each element (or pack) read before it is written: a may be sum.
    warp_row_packed<V>(
        c, packed,
        [&](int i) {
            const float t = to_f32(a[o + i]) + to_f32(b[o + i]);
            sum[o + i] = from_f32<T>(t);
            y[o + i] = from_f32<T>(to_f32(w[i]) * (t * r));
        },
        [&](int i) {
            const Pack<T> pa = load_pack(a + o + i), pb = load_pack(b + o + i), wp = load_pack(w + i);
            Pack<T> ps, py;
            for (int j = 0; j < V; ++j) {
                const float t = to_f32(pa.e[j]) + to_f32(pb.e[j]);
                ps.e[j] = from_f32<T>(t);
                py.e[j] = from_f32<T>(to_f32(wp.e[j]) * (t * r));
            }
            store_pack(sum + o + i, ps);
            store_pack(y + o + i, py);
        });
    if (lane_id() == 0) rstd[row] = r;
}

// dx = rstd·(w·dy − x̂·mean(w·dy·x̂)), x̂ = x·rstd (the mean term is rstd's derivative).
// dx, dy, x: (R, C) T; w: (C) T; rstd: (R) f32.
template <typename T>
__device__ void rmsnorm_backward_dx(T* dx, const T* dy, const T* x, const T* w, const float* rstd, long long rows, int c) {
    const long long row = (long long)blockIdx.x * (blockDim.x / warpSize) + warp_id();
    if (row >= rows) return;  // warp-uniform
    const long long o = row * c;
    const float r = rstd[row];
    constexpr int V = Pack<T>::V;
    const bool packed = c % V == 0 && aligned16(dx) && aligned16(dy) && aligned16(x) && aligned16(w);
    float g = 0.0f;
    warp_row_packed<V>(
        c, packed, [&](int i) { g = fmaf(to_f32(w[i]) * to_f32(dy[o + i]), to_f32(x[o + i]) * r, g); },
        [&](int i) {
            const Pack<T> pw = load_pack(w + i), pd = load_pack(dy + o + i), px = load_pack(x + o + i);
            for (int j = 0; j < V; ++j) g = fmaf(to_f32(pw.e[j]) * to_f32(pd.e[j]), to_f32(px.e[j]) * r, g);
        });
    const float gx = warp_sum(g) * (1.0f / (float)c);
    // dx may be dy (in place): each pack read before it is written.
    warp_row_packed<V>(
        c, packed,
        [&](int i) {
            const float xh = to_f32(x[o + i]) * r;
            dx[o + i] = from_f32<T>(r * (to_f32(w[i]) * to_f32(dy[o + i]) - xh * gx));
        },
        [&](int i) {
            const Pack<T> pw = load_pack(w + i), pd = load_pack(dy + o + i), px = load_pack(x + o + i);
            Pack<T> out;
            for (int j = 0; j < V; ++j) out.e[j] = from_f32<T>(r * (to_f32(pw.e[j]) * to_f32(pd.e[j]) - to_f32(px.e[j]) * r * gx));
            store_pack(dx + o + i, out);
        });
}

// Partial weight gradients per chunk of rows: ws[k, j] = Σ_{r in chunk k} dy·x·rstd (then
// column_sum_finish_f32 gives dw). Grid as reduce.cu's column_sum_partial: chunks ×
// ceil(C / blockDim) blocks. ws: (chunks, C) f32; dy, x: (R, C) T; rstd: (R) f32.
template <typename T>
__device__ void rmsnorm_backward_dw(float* ws, const T* dy, const T* x, const float* rstd, long long rows, int c, int rows_per_chunk) {
    const ColumnChunk k = column_chunk(rows, c, rows_per_chunk);
    if (k.j >= c) return;
    float dw = 0.0f;
    for (long long r = k.r0; r < k.r1; ++r) dw = fmaf(to_f32(dy[r * c + k.j]), to_f32(x[r * c + k.j]) * rstd[r], dw);
    ws[k.chunk * c + k.j] = dw;
}

#define RMSNORM(S, T)                                                                                                          \
    ORT_KERNEL(rmsnorm_forward_##S)(T * y, float* rstd, const T* x, const T* w, long long rows, int c, float eps) {            \
        rmsnorm_forward<T>(y, rstd, x, w, rows, c, eps);                                                                       \
    }                                                                                                                          \
    ORT_REGISTER(rmsnorm_forward_##S)                                                                                          \
    ORT_KERNEL(add_rmsnorm_forward_##S)(T * sum, T * y, float* rstd, const T* a, const T* b, const T* w, long long rows, int c, \
                                        float eps) {                                                                           \
        add_rmsnorm_forward<T>(sum, y, rstd, a, b, w, rows, c, eps);                                                           \
    }                                                                                                                          \
    ORT_REGISTER(add_rmsnorm_forward_##S)                                                                                      \
    ORT_KERNEL(rmsnorm_backward_dx_##S)(T * dx, const T* dy, const T* x, const T* w, const float* rstd, long long rows, int c) { \
        rmsnorm_backward_dx<T>(dx, dy, x, w, rstd, rows, c);                                                                   \
    }                                                                                                                          \
    ORT_REGISTER(rmsnorm_backward_dx_##S)                                                                                      \
    ORT_KERNEL(rmsnorm_backward_dw_##S)(float* ws, const T* dy, const T* x, const float* rstd, long long rows, int c,           \
                                        int rows_per_chunk) {                                                                  \
        rmsnorm_backward_dw<T>(ws, dy, x, rstd, rows, c, rows_per_chunk);                                                      \
    }                                                                                                                          \
    ORT_REGISTER(rmsnorm_backward_dw_##S)
ORT_FOR_FLOATS(RMSNORM)
