// Strided copies and fills: the views the planner could not fold (reshape, permute, split,
// concat) and a fill into a strided place. CPU counterpart: engine/src/backend/cpu/kernels/
// copy.rs (`copy_strided`, `fill_strided`); reference: PyTorch's TensorIterator copy.
//
// Shapes and strides (in elements, up to 8 dims) come in a small device array the executor
// uploads once per node when the plan is built, so a launch passes one pointer:
//   meta = [rank, shape[0..rank), src/dst strides[0..rank) ...] laid out as below.
#include "port.cuh"

// Offset of flat row-major index i of `shape` under `strides` (both `rank` long).
__device__ __forceinline__ long long strided_offset(long long i, int rank, const long long* shape, const long long* strides) {
    long long off = 0;
    for (int d = rank - 1; d >= 0; --d) {
        const long long s = shape[d];
        off += (i % s) * strides[d];
        i /= s;
    }
    return off;
}

// dst ← src element by element in row-major order of each shape (same element count N).
// meta: (2 + 2·(src_rank + dst_rank)) i64 = [src_rank, dst_rank, src_shape, src_strides,
// dst_shape, dst_strides]. src, dst: strided T.
template <typename T>
__device__ void copy_strided(T* dst, const T* src, long long n, const long long* meta) {
    const int sr = (int)meta[0], dr = (int)meta[1];
    const long long* ss = meta + 2;
    const long long* st = ss + sr;
    const long long* ds = st + sr;
    const long long* dt = ds + dr;
    GRID_STRIDE(i, n) dst[strided_offset(i, dr, ds, dt)] = src[strided_offset(i, sr, ss, st)];
}

// Every element of the strided dst = value. meta: (1 + 2·rank) i64 = [rank, shape, strides].
// Given a step block, value × its loss scale (autodiff's seed in a strided place, as `fill_<T>`).
template <typename T>
__device__ void fill_strided(T* dst, long long n, const long long* meta, float value) {
    const int r = (int)meta[0];
    const T v = from_f32<T>(value);
    GRID_STRIDE(i, n) dst[strided_offset(i, r, meta + 1, meta + 1 + r)] = v;
}

#define COPY(S, T)                                                                                                 \
    ORT_KERNEL(copy_strided_##S)(T * dst, const T* src, long long n, const long long* meta) { copy_strided<T>(dst, src, n, meta); } \
    ORT_REGISTER(copy_strided_##S)                                                                                 \
    ORT_KERNEL(fill_strided_##S)(T * dst, long long n, const long long* meta, float value, const StepBlock* step) {              \
        fill_strided<T>(dst, n, meta, step ? value * step->loss_scale : value);                                                  \
    }                                                                                                                            \
    ORT_REGISTER(fill_strided_##S)
ORT_FOR_FLOATS(COPY)
