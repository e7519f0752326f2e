// LayerNorm over the last dimension, forward (plain and with the residual add fused in, ORT's
// SkipLayerNormalization) and backward. CPU counterparts: engine/src/backend/cpu/kernels/layernorm.rs
// (`layernorm_forward`, `add_layernorm_forward`, `layernorm_backward`); references: llm.c
// layernorm_forward/backward, torch.nn.functional.layer_norm.
//
// One warp per row (rows of a transformer are 768–4096 wide: a warp's lanes stride the row, in
// 16-byte packs where the width and the operands allow (`warp_row_packed`); the row stays in L1
// between the passes); mean and variance in two passes in f32 as the CPU does
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
    T* yr = y + row * c;
    constexpr int V = Pack<T>::V;
    const bool packed = c % V == 0 && aligned16(x) && aligned16(y) && aligned16(w) && aligned16(b);
    float s = 0.0f;
    warp_row_packed<V>(
        c, packed, [&](int i) { s += to_f32(xr[i]); },
        [&](int i) {
            const Pack<T> p = load_pack(xr + i);
            for (int j = 0; j < V; ++j) s += to_f32(p.e[j]);
        });
    const float m = warp_sum(s) / (float)c;
    float v = 0.0f;
    const auto var = [&](float xi) {
        const float d = xi - m;
        v = fmaf(d, d, v);
    };
    warp_row_packed<V>(
        c, packed, [&](int i) { var(to_f32(xr[i])); },
        [&](int i) {
            const Pack<T> p = load_pack(xr + i);
            for (int j = 0; j < V; ++j) var(to_f32(p.e[j]));
        });
    const float r = 1.0f / sqrtf(warp_sum(v) / (float)c + eps);
    const auto out = [&](float xi, T wi, T bi) { return from_f32<T>(fmaf((xi - m) * r, to_f32(wi), to_f32(bi))); };
    warp_row_packed<V>(
        c, packed, [&](int i) { yr[i] = out(to_f32(xr[i]), w[i], b[i]); },
        [&](int i) {
            const Pack<T> p = load_pack(xr + i), pw = load_pack(w + i), pb = load_pack(b + i);
            Pack<T> o;
            for (int j = 0; j < V; ++j) o.e[j] = out(to_f32(p.e[j]), pw.e[j], pb.e[j]);
            store_pack(yr + i, o);
        });
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
    constexpr int V = Pack<T>::V;
    const bool packed = c % V == 0 && aligned16(sum) && aligned16(y) && aligned16(a) && aligned16(b) && aligned16(w) && aligned16(bias);
    float s = 0.0f;
    warp_row_packed<V>(
        c, packed, [&](int i) { s += to_f32(a[o + i]) + to_f32(b[o + i]); },
        [&](int i) {
            const Pack<T> pa = load_pack(a + o + i), pb = load_pack(b + o + i);
            for (int j = 0; j < V; ++j) s += to_f32(pa.e[j]) + to_f32(pb.e[j]);
        });
    const float m = warp_sum(s) / (float)c;
    float v = 0.0f;
    const auto var = [&](float t) {
        const float d = t - m;
        v = fmaf(d, d, v);
    };
    warp_row_packed<V>(
        c, packed, [&](int i) { var(to_f32(a[o + i]) + to_f32(b[o + i])); },
        [&](int i) {
            const Pack<T> pa = load_pack(a + o + i), pb = load_pack(b + o + i);
            for (int j = 0; j < V; ++j) var(to_f32(pa.e[j]) + to_f32(pb.e[j]));
        });
    const float r = 1.0f / sqrtf(warp_sum(v) / (float)c + eps);
    // Each element (or pack) read before it is written: a may be sum.
    warp_row_packed<V>(
        c, packed,
        [&](int i) {
            const float t = to_f32(a[o + i]) + to_f32(b[o + i]);
            sum[o + i] = from_f32<T>(t);
            y[o + i] = from_f32<T>(fmaf((t - m) * r, to_f32(w[i]), to_f32(bias[i])));
        },
        [&](int i) {
            const Pack<T> pa = load_pack(a + o + i), pb = load_pack(b + o + i);
            const Pack<T> pw = load_pack(w + i), pc = load_pack(bias + i);
            Pack<T> ps, py;
            for (int j = 0; j < V; ++j) {
                const float t = to_f32(pa.e[j]) + to_f32(pb.e[j]);
                ps.e[j] = from_f32<T>(t);
                py.e[j] = from_f32<T>(fmaf((t - m) * r, to_f32(pw.e[j]), to_f32(pc.e[j])));
            }
            store_pack(sum + o + i, ps);
            store_pack(y + o + i, py);
        });
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
    constexpr int V = Pack<T>::V;
    const bool packed = c % V == 0 && aligned16(dx) && aligned16(dy) && aligned16(x) && aligned16(w);
    float a1 = 0.0f, a2 = 0.0f;
    const auto sums = [&](float xi, float dyi, float wi) {
        const float norm = (xi - m) * r;
        const float dnorm = dyi * wi;
        a1 += dnorm;
        a2 = fmaf(dnorm, norm, a2);
    };
    warp_row_packed<V>(
        c, packed, [&](int i) { sums(to_f32(x[o + i]), to_f32(dy[o + i]), to_f32(w[i])); },
        [&](int i) {
            const Pack<T> px = load_pack(x + o + i), pd = load_pack(dy + o + i), pw = load_pack(w + i);
            for (int j = 0; j < V; ++j) sums(to_f32(px.e[j]), to_f32(pd.e[j]), to_f32(pw.e[j]));
        });
    const float inv_c = 1.0f / (float)c;
    const float dnorm_mean = warp_sum(a1) * inv_c;
    const float dnorm_norm_mean = warp_sum(a2) * inv_c;
    const auto grad = [&](float xi, float dyi, float wi) {
        const float norm = (xi - m) * r;
        const float dnorm = dyi * wi;
        return from_f32<T>(r * (dnorm - dnorm_mean - norm * dnorm_norm_mean));
    };
    // dx may be dy: each pack read before it is written.
    warp_row_packed<V>(
        c, packed, [&](int i) { dx[o + i] = grad(to_f32(x[o + i]), to_f32(dy[o + i]), to_f32(w[i])); },
        [&](int i) {
            const Pack<T> px = load_pack(x + o + i), pd = load_pack(dy + o + i), pw = load_pack(w + i);
            Pack<T> out;
            for (int j = 0; j < V; ++j) out.e[j] = grad(to_f32(px.e[j]), to_f32(pd.e[j]), to_f32(pw.e[j]));
            store_pack(dx + o + i, out);
        });
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
