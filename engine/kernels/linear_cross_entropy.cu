// Linear + cross-entropy without the (rows, V) logits (Op::LinearCrossEntropy,
// Op::LinearCrossEntropyBackward): the LM head's GEMM and its loss in chunks of labelled rows.
// CPU counterpart (the numbers to match): engine/src/backend/cpu/kernels/linear_cross_entropy.rs
// `linear_cross_entropy`; reference: engine/src/ops/linear_cross_entropy.rs; Liger-Kernel's
// fused_linear_cross_entropy, Apple's Cut Cross-Entropy.
//
// The GEMMs are the executor's (cuBLASLt); these kernels are the steps between them. Per step:
//   lce_compact (one block): idx = the rows whose label is not the ignore index, in row order,
//     and their count — on the device, so nothing is read back mid-step. The host therefore
//     does not know the count: it issues ⌈R / chunk⌉ chunks over the compacted positions, and
//     a position at or past the count is a zero row everywhere (gathered x, g), so it adds
//     nothing to dx, dw, dbias or the loss.
//   per chunk of positions [start, start + k):
//     lce_gather_<T>: xs (k, C) = x rows idx[start + s] (zeros past the count);
//     GEMM logits (k, V) f32 = xs · wᵀ;
//     lce_rows_<T>: per row, bias added, [soft-capped,] lse, loss lse − z[y], and with dloss
//       the row overwritten by g·softmax − g·onehot, g = dloss / count [times the cap's
//       derivative] (and its copy in T for half GEMM operands);
//     GEMM dxs (k, C) f32 = G · w, lce_scatter_<T> to dx's rows idx[start + s];
//     GEMM dw (V, C) f32 (+)= Gᵀ · xs (β = 1 after the first chunk);
//     lce_column_sum: dbias (V) f32 (+)= the column sums of G, rows in order (the CPU's order);
//   then cross_entropy.cu's cross_entropy_mean over the per-position losses (R, 0 past the
//   count) gives the mean in a fixed order. No floating-point atomics: every run, the same bits.
//
// Positions and counts: idx is i32 (rows < 2^31), the count f32 (exact below 2^24 rows). A
// label neither the ignore index nor in [0, V) is counted, sets err[0] = 1 and gives a NaN loss
// and NaN gradient row instead of an out-of-bounds read (as cross_entropy.cu); the host then
// names it. err may be null.
#include "port.cuh"

__device__ __forceinline__ float lce_nan() { return __int_as_float(0x7fc00000); }

// log Σ_j exp(row[j]) over a row of v f32, by the whole block; every thread gets it. Each
// thread reads only the columns j ≡ threadIdx.x (mod blockDim.x). Called by every thread of
// the block; ends with a barrier. scratch: __shared__ float[64]. (cross_entropy.cu's
// ce_block_lse over f32.)
__device__ __forceinline__ float lce_block_lse(const float* row, int v, float* scratch) {
    float m = neg_inf(), s = 0.0f;
    for (int j = threadIdx.x; j < v; j += blockDim.x) lse_add(m, s, row[j]);
    warp_lse_merge(m, s);
    if (lane_id() == 0) {
        scratch[warp_id()] = m;
        scratch[32 + warp_id()] = s;
    }
    __syncthreads();
    float bm = neg_inf(), bs = 0.0f;
    const int nwarps = (int)blockDim.x / warpSize;
    for (int w = 0; w < nwarps; ++w) lse_merge(bm, bs, scratch[w], scratch[32 + w]);
    __syncthreads();  // every thread has read scratch before the next row overwrites it
    return bm + logf(bs);
}

// idx[0 .. count) = the rows r with labels[r] ≠ ignore_index, ascending; count[0] = how many.
// Each thread takes a contiguous run of rows (so the order is the rows' order), counts its
// labelled rows, thread 0 turns the counts into offsets, then each thread writes its run.
// idx: (rows) i32 (entries past the count untouched); count: (1) f32; err: (1) i32 or null;
// labels: (rows) i64. Grid: 1 block of at most 1024 threads.
ORT_KERNEL(lce_compact)(int* idx, float* count, int* err, const long long* labels, long long rows, int v, long long ignore_index) {
    __shared__ int offs[1024];
    const long long per = (rows + blockDim.x - 1) / blockDim.x;
    const long long r0 = (long long)threadIdx.x * per;
    const long long r1 = r0 + per < rows ? r0 + per : rows;
    int c = 0;
    for (long long r = r0; r < r1; ++r) {
        const long long y = labels[r];
        if (y == ignore_index) continue;
        ++c;
        if ((y < 0 || y >= v) && err) err[0] = 1;
    }
    offs[threadIdx.x] = c;
    __syncthreads();
    if (threadIdx.x == 0) {
        int acc = 0;
        for (int t = 0; t < (int)blockDim.x; ++t) {
            const int ct = offs[t];
            offs[t] = acc;
            acc += ct;
        }
        count[0] = (float)acc;
    }
    __syncthreads();
    int o = offs[threadIdx.x];
    for (long long r = r0; r < r1; ++r)
        if (labels[r] != ignore_index) idx[o++] = (int)r;
}
ORT_REGISTER(lce_compact)

// xs[s, :] = x[idx[start + s], :] for start + s < count, 0 past it (a zero row adds nothing to
// any product). xs: (k, c) T; x: (rows, c) T; idx: (rows) i32; count: (1) f32. Grid-stride.
template <typename T>
__device__ void lce_gather(T* xs, const T* x, const int* idx, const float* count, long long start, int k, int c) {
    const long long n = (long long)count[0];
    GRID_STRIDE(e, (long long)k * c) {
        const long long pos = start + e / c;
        xs[e] = pos < n ? x[(long long)idx[pos] * c + e % c] : from_f32<T>(0.0f);
    }
}

// One chunk's logits rows, position p = start + s: z = logits[s] (+ bias), soft-capped
// z ← cap·tanh(inv·z) when cap ≠ 0 (Gemma 2's final_logit_softcapping; as elementwise.cu's
// scale, tanh and scale compute it); losses[p] = lse(z) − z[y], y = labels[idx[p]]; with dloss,
// logits[s] = g·softmax(z) − g·onehot(y), g = dloss[0] / max(count, 1) (with a cap, times
// cap·(1 − t²)·inv, t = z / cap: the unfused backward's order), and g16[s] the same in T when
// g16 is given (a half GEMM's operand). Past the count: losses[p] = 0 and (with dloss) zero
// rows. Each thread rewrites only the columns it read itself, and the label's loss is taken by
// the thread owning column y before it overwrites it, so the in-place rewrite needs no barrier
// of its own.
// logits: (k, v) f32; g16: (k, v) T or null; losses: (≥ start + k) f32; err: (1) i32 or null;
// labels: (rows) i64; idx: (rows) i32; count: (1) f32; bias: (v) T or null; dloss: (1) f32 or
// null (the forward). Grid: any (one block per row is the natural size), grid-stride over the
// k rows; block: a multiple of the warp size ≤ 1024.
template <typename T>
__device__ void lce_rows(float* logits, T* g16, float* losses, int* err, const long long* labels, const int* idx, const float* count, const T* bias,
                         const float* dloss, long long start, int k, int v, long long ignore_index, float inv, float cap) {
    __shared__ float scratch[64];
    const long long n = (long long)count[0];
    const float g = dloss ? dloss[0] / fmaxf(count[0], 1.0f) : 0.0f;
    for (long long s = blockIdx.x; s < k; s += gridDim.x) {  // block-uniform
        float* row = logits + s * v;
        T* grow = g16 ? g16 + s * v : nullptr;
        const long long pos = start + s;
        const long long y = pos < n ? labels[idx[pos]] : 0;
        const bool bad = pos < n && (y < 0 || y >= v);
        if (pos >= n || bad) {
            if (threadIdx.x == 0) {
                losses[pos] = bad ? lce_nan() : 0.0f;
                if (bad && err) err[0] = 1;
            }
            if (dloss) {
                const float fillv = bad ? lce_nan() : 0.0f;
                for (int j = threadIdx.x; j < v; j += blockDim.x) {
                    row[j] = fillv;
                    if (grow) grow[j] = from_f32<T>(fillv);
                }
            }
            continue;
        }
        if (bias)
            for (int j = threadIdx.x; j < v; j += blockDim.x) row[j] += to_f32(bias[j]);
        if (cap != 0.0f)  // the same threads' columns as lce_block_lse reads: no barrier
            for (int j = threadIdx.x; j < v; j += blockDim.x) row[j] = tanhf(row[j] * inv) * cap;
        const float lse = lce_block_lse(row, v, scratch);
        for (int j = threadIdx.x; j < v; j += blockDim.x) {
            const float z = row[j];
            if (j == y) losses[pos] = lse - z;
            if (dloss) {
                float d = g * expf(z - lse);
                if (j == y) d -= g;
                if (cap != 0.0f) {
                    const float t = z / cap;
                    d = d * cap * (1.0f - t * t) * inv;
                }
                row[j] = d;
                if (grow) grow[j] = from_f32<T>(d);
            }
        }
    }
}

// dx[idx[start + s], :] = dxs[s, :] for start + s < count (dx's other rows are zeroed before
// the chunks). dx: (rows, c) T; dxs: (k, c) f32; idx: (rows) i32; count: (1) f32. Grid-stride.
template <typename T>
__device__ void lce_scatter(T* dx, const float* dxs, const int* idx, const float* count, long long start, int k, int c) {
    const long long n = (long long)count[0];
    GRID_STRIDE(e, (long long)k * c) {
        const long long pos = start + e / c;
        if (pos < n) dx[(long long)idx[pos] * c + e % c] = from_f32<T>(dxs[e]);
    }
}

// db[j] = (accumulate ? db[j] : 0) + Σ_s g[s, j], rows in order: one thread per column, a
// warp reading a row's consecutive columns. Chunk after chunk this adds in row order, as the
// CPU kernel's colsum does. db: (v) f32; g: (k, v) f32. Grid-stride over the columns.
ORT_KERNEL(lce_column_sum)(float* db, const float* g, int k, int v, int accumulate) {
    GRID_STRIDE(j, v) {
        float acc = accumulate ? db[j] : 0.0f;
        for (int s = 0; s < k; ++s) acc += g[(long long)s * v + j];
        db[j] = acc;
    }
}
ORT_REGISTER(lce_column_sum)

#define LINEAR_CROSS_ENTROPY(S, T)                                                                                                  \
    ORT_KERNEL(lce_gather_##S)(T * xs, const T* x, const int* idx, const float* count, long long start, int k, int c) {            \
        lce_gather<T>(xs, x, idx, count, start, k, c);                                                                              \
    }                                                                                                                               \
    ORT_REGISTER(lce_gather_##S)                                                                                                    \
    ORT_KERNEL(lce_rows_##S)(float* logits, T* g16, float* losses, int* err, const long long* labels, const int* idx,              \
                             const float* count, const T* bias, const float* dloss, long long start, int k, int v,                 \
                             long long ignore_index, float inv, float cap) {                                                        \
        lce_rows<T>(logits, g16, losses, err, labels, idx, count, bias, dloss, start, k, v, ignore_index, inv, cap);                \
    }                                                                                                                               \
    ORT_REGISTER(lce_rows_##S)                                                                                                      \
    ORT_KERNEL(lce_scatter_##S)(T * dx, const float* dxs, const int* idx, const float* count, long long start, int k, int c) {     \
        lce_scatter<T>(dx, dxs, idx, count, start, k, c);                                                                           \
    }                                                                                                                               \
    ORT_REGISTER(lce_scatter_##S)
ORT_FOR_FLOATS(LINEAR_CROSS_ENTROPY)
