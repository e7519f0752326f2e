// Rotary position embedding (HF's apply_rotary_pos_emb on q or k): y = x·cos + rotate_half(x)·sin,
// rotate_half(x) = cat(−x[D/2:], x[:D/2]); sin negated for the backward (`inverse`, see
// engine/src/ops/rotary.rs). CPU counterpart: engine/src/backend/cpu/kernels/rotary.rs (same
// formulas, same fmaf); launcher: engine/src/exec/gpu/launch/rotary.rs.
//
// One thread per pair (x[i], x[i + D/2]) of a row, grid-stride over the R·D/2 pairs; the row at
// position t = row mod T reads cos[t], sin[t]. Rows are D contiguous elements at any strides of
// up to three leading dims (the plan's Req::Rows: q and k read where their projection wrote them,
// (B, T, H·D) seen as (B, H, T, D); the backward writes into the projection's gradient): row
// r = (i0·n1 + i1)·n2 + i2 starts at i0·s0 + i1·s1 + i2·s2, per operand. Each thread reads its
// pair before writing it, so y may alias x (the planner runs it in place, same strides).
// Arithmetic in f32, storage T.
#include "port.cuh"

// y, x: (n0, n1, n2, D) rows T at strides ys, xs (elements); cos, sin: (T, D) T, dense;
// rows = n0·n1·n2; sg = −1 for the backward, else 1.
template <typename T>
__device__ void rotary(T* y, const T* x, const T* cos, const T* sin, long long rows, int d, int t, long long n1,
                       long long n2, long long xs0, long long xs1, long long xs2, long long ys0, long long ys1,
                       long long ys2, float sg) {
    const int h = d / 2;
    GRID_STRIDE(p, rows * h) {
        const long long r = p / h;
        const int i = (int)(p - r * h);
        // One row dim (dense rows, or leading dims that merged) takes no division for the row.
        long long i0 = 0, i1 = 0, i2 = r;
        if (n1 != 1 || n2 != rows) {
            const long long q = r / n2;
            i2 = r - q * n2;
            i1 = q % n1;
            i0 = q / n1;
        }
        const long long xo = i0 * xs0 + i1 * xs1 + i2 * xs2, yo = i0 * ys0 + i1 * ys1 + i2 * ys2;
        const long long ct = (r % t) * d;
        const float a = to_f32(x[xo + i]), b = to_f32(x[xo + h + i]);
        y[yo + i] = from_f32<T>(fmaf(a, to_f32(cos[ct + i]), -(b * to_f32(sin[ct + i]) * sg)));
        y[yo + h + i] = from_f32<T>(fmaf(b, to_f32(cos[ct + h + i]), a * to_f32(sin[ct + h + i]) * sg));
    }
}

#define ROTARY(S, T)                                                                                        \
    ORT_KERNEL(rotary_##S)(T * y, const T* x, const T* cos, const T* sin, long long rows, int d, int t,        \
                           long long n1, long long n2, long long xs0, long long xs1, long long xs2,             \
                           long long ys0, long long ys1, long long ys2, float sg) {                             \
        rotary<T>(y, x, cos, sin, rows, d, t, n1, n2, xs0, xs1, xs2, ys0, ys1, ys2, sg);                        \
    }                                                                                                       \
    ORT_REGISTER(rotary_##S)
ORT_FOR_FLOATS(ROTARY)
