// Column sums of a row-major matrix, deterministically: out[j] = Σ_r x[r, j] — the bias
// gradient of a linear layer (CPU: engine/src/backend/cpu/kernels/reduce.rs
// `reduce_sum_leading`) and the LayerNorm weight/bias gradients' last step (layernorm.cu).
//
// Two kernels, no atomics, so every run gives the same bits: `column_sum_partial` has each
// thread own one column of one chunk of rows and walk its rows in order (a warp reads a row's
// consecutive columns: coalesced), writing one f32 partial per (chunk, column); then
// `column_sum_finish` adds a column's partials in chunk order.
#include "port.cuh"

// Grid: chunks × ceil(C / blockDim) blocks, 1-D: block b is chunk b / col_blocks, column block
// b % col_blocks. ws: (chunks, C) f32; x: (R, C) T.
template <typename T>
__device__ void column_sum_partial(float* ws, const T* x, long long rows, int c, int rows_per_chunk) {
    const ColumnChunk k = column_chunk(rows, c, rows_per_chunk);
    if (k.j >= c) return;
    float acc = 0.0f;
    for (long long r = k.r0; r < k.r1; ++r) acc += to_f32(x[r * c + k.j]);
    ws[k.chunk * c + k.j] = acc;
}

// out[j] = Σ_k ws[k, j] over the chunks in order. out: (C) T; ws: (chunks, C) f32.
template <typename T>
__device__ void column_sum_finish(T* out, const float* ws, int chunks, int c) {
    GRID_STRIDE(j, c) {
        float acc = 0.0f;
        for (int k = 0; k < chunks; ++k) acc += ws[(long long)k * c + j];
        out[j] = from_f32<T>(acc);
    }
}

#define REDUCE(S, T)                                                                                                   \
    ORT_KERNEL(column_sum_partial_##S)(float* ws, const T* x, long long rows, int c, int rows_per_chunk) {            \
        column_sum_partial<T>(ws, x, rows, c, rows_per_chunk);                                                         \
    }                                                                                                                  \
    ORT_REGISTER(column_sum_partial_##S)                                                                               \
    ORT_KERNEL(column_sum_finish_##S)(T * out, const float* ws, int chunks, int c) { column_sum_finish<T>(out, ws, chunks, c); } \
    ORT_REGISTER(column_sum_finish_##S)
ORT_FOR_FLOATS(REDUCE)
