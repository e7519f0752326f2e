// Embedding gather (Op::Embedding) and its scatter-add backward (Op::EmbeddingBackward).
// CPU counterparts (the numbers to match): engine/src/backend/cpu/kernels/embedding.rs
// `embedding_forward`, `embedding_backward`, `check_ids`; references: llm.c encoder_forward /
// encoder_backward.
//
// Forward: one block per output row (grid-stride over rows), its threads copy the table row's
// columns (coalesced).
// Backward, deterministic without atomics: the table gradient is a parameter gradient, so f32
// in every precision (as the CPU executor keeps it), written whole (rows no id names are 0).
// Each thread owns one column j of the table rows whose id ≡ p (mod P): grid = col_blocks · P
// blocks, block b owns columns (b mod col_blocks)·blockDim + threadIdx.x and residue
// p = b / col_blocks, P = gridDim.x / col_blocks (the launcher picks P, e.g. 32–128, so the grid
// fills the GPU). The thread zeroes its elements, then walks ids[0..n) in order and, for the
// rows whose id it owns, adds dout[r, j] into dtable[id, j]. Every element therefore sums its
// contributions from 0 in row order — the CPU's order, so the f32 result is bit-identical to
// it. A warp reads consecutive columns of a dout row and writes consecutive columns of a table
// row (coalesced); all blocks read the ids (small, cached), and the owner test is uniform
// across the block (no divergence).
//
// An id outside [0, V) is never used as an index: err[0] = 1 (the host zeroes it before the
// step and reads it after; it is only ever set), the forward writes NaN over that output row,
// the backward skips the row; the host then names the id with embedding.rs `check_ids`.
// err may be null.
#include "port.cuh"

// out[r, :] = table[ids[r], :]. out: (n, c) T; ids: (n) i64; table: (v, c) T; err: (1) i32 or
// null. Grid: any (one block per row up to the GPU's capacity); block: any multiple of the warp
// size.
template <typename T>
__device__ void embedding_forward(T* out, int* err, const long long* ids, const T* table, long long n, int c, long long v) {
    for (long long r = blockIdx.x; r < n; r += gridDim.x) {
        const long long id = ids[r];
        T* orow = out + r * c;
        if (id < 0 || id >= v) {
            if (err && threadIdx.x == 0) err[0] = 1;
            const T qnan = from_f32<T>(__int_as_float(0x7fc00000));
            for (int j = threadIdx.x; j < c; j += blockDim.x) orow[j] = qnan;
            continue;
        }
        const T* trow = table + id * c;
        for (int j = threadIdx.x; j < c; j += blockDim.x) orow[j] = trow[j];
    }
}

// dtable[i, :] = Σ_{r: ids[r] = i} dout[r, :] in row order, 0 for ids that do not occur.
// dtable: (v, c) f32; ids: (n) i64; dout: (n, c) T; err: (1) i32 or null.
// Grid: ceil(c / blockDim) · P blocks, P ≥ 1 (see above); block: any multiple of the warp size.
template <typename T>
__device__ void embedding_backward(float* dtable, int* err, const long long* ids, const T* dout, long long n, int c, long long v) {
    const int col_blocks = (c + (int)blockDim.x - 1) / (int)blockDim.x;
    const int parts = (int)gridDim.x / col_blocks;
    const int p = (int)blockIdx.x / col_blocks;
    const int j = ((int)blockIdx.x % col_blocks) * (int)blockDim.x + (int)threadIdx.x;
    if (j >= c || p >= parts) return;  // no barrier below
    for (long long i = p; i < v; i += parts) dtable[i * c + j] = 0.0f;
    for (long long r = 0; r < n; ++r) {
        const long long id = ids[r];
        if (id < 0 || id >= v) {
            if (err && blockIdx.x == 0 && threadIdx.x == 0) err[0] = 1;
            continue;
        }
        if (id % parts != p) continue;  // uniform across the block
        dtable[id * c + j] += to_f32(dout[r * c + j]);
    }
}

#define EMBEDDING(S, T)                                                                                                          \
    ORT_KERNEL(embedding_forward_##S)(T * out, int* err, const long long* ids, const T* table, long long n, int c, long long v) {  \
        embedding_forward<T>(out, err, ids, table, n, c, v);                                                                     \
    }                                                                                                                            \
    ORT_REGISTER(embedding_forward_##S)                                                                                          \
    ORT_KERNEL(embedding_backward_##S)(float* dtable, int* err, const long long* ids, const T* dout, long long n, int c,          \
                                       long long v) {                                                                            \
        embedding_backward<T>(dtable, err, ids, dout, n, c, v);                                                                  \
    }                                                                                                                            \
    ORT_REGISTER(embedding_backward_##S)
ORT_FOR_FLOATS(EMBEDDING)
