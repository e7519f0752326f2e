// Rotary position embedding (HF's apply_rotary_pos_emb on q or k): y = x·cos + rotate_half(x)·sin,
// rotate_half(x) = cat(−x[D/2:], x[:D/2]); sin negated for the backward (`inverse`, see
// engine/src/ops/rotary.rs). CPU counterpart: engine/src/backend/cpu/kernels/rotary.rs (same
// formulas, same fmaf); launcher: engine/src/exec/gpu/launch/rotary.rs.
//
// One thread per pair (x[i], x[i + D/2]) of a row, grid-stride over the R·D/2 pairs; the row at
// position t = row mod T reads cos[t], sin[t]. Each thread reads its pair before writing it, so
// y may alias x (the planner runs it in place). Arithmetic in f32, storage T.
#include "port.cuh"

// y, x: (R, D) T; cos, sin: (T, D) T; sg = −1 for the backward, else 1.
template <typename T>
__device__ void rotary(T* y, const T* x, const T* cos, const T* sin, long long rows, int d, int t, float sg) {
    const int h = d / 2;
    GRID_STRIDE(p, rows * h) {
        const long long r = p / h;
        const int i = (int)(p - r * h);
        const long long o = r * d, ct = (r % t) * d;
        const float a = to_f32(x[o + i]), b = to_f32(x[o + h + i]);
        y[o + i] = from_f32<T>(fmaf(a, to_f32(cos[ct + i]), -(b * to_f32(sin[ct + i]) * sg)));
        y[o + h + i] = from_f32<T>(fmaf(b, to_f32(cos[ct + h + i]), a * to_f32(sin[ct + h + i]) * sg));
    }
}

#define ROTARY(S, T)                                                                                              \
    ORT_KERNEL(rotary_##S)(T * y, const T* x, const T* cos, const T* sin, long long rows, int d, int t, float sg) { \
        rotary<T>(y, x, cos, sin, rows, d, t, sg);                                                                \
    }                                                                                                             \
    ORT_REGISTER(rotary_##S)
ORT_FOR_FLOATS(ROTARY)
