// Cross-entropy over the last dim with int64 labels and an ignore index (Op::CrossEntropy,
// Op::CrossEntropyBackward): the loss of every language-model and classifier head, over
// vocabularies of 30522 (BERT) to 50257 (GPT-2) classes. CPU counterparts (the numbers to
// match): engine/src/backend/cpu/kernels/cross_entropy.rs `cross_entropy_forward`,
// `cross_entropy_backward`, `check_labels`; references: llm.c crossentropy_forward and
// crossentropy_softmax_backward, torch.nn.functional.cross_entropy(reduction='mean').
//
// Launches, no floating-point atomics (every run gives the same bits):
//   forward:  cross_entropy_forward (one block per row, grid-stride over rows) writes each row's
//             loss lse(row) − row[label] (f32, 0 for an ignored row); then cross_entropy_mean
//             (one block) adds them in a fixed order and divides by the number of counted rows
//             (NaN when every row is ignored, the reference's 0/0).
//   backward: cross_entropy_count (one block) writes the number of counted rows; then
//             cross_entropy_backward (one block per row, grid-stride) recomputes the row's lse
//             from the logits, as the CPU does, and writes dloss/count·(softmax − onehot), 0 on
//             ignored rows. dlogits may alias logits (the CPU's in-place case): the row is read
//             fully before the block's barrier and each element is then rewritten by the thread
//             that reads it.
// A row's lse: each thread keeps an online (max m, Σ exp(x − m)) pair over its strided
// columns, the pairs are merged by a warp butterfly and then across warps through shared
// memory in warp order (the same merge in every thread), lse = max + log(sum).
//
// A label that is neither the ignore index nor in [0, V) is never used as an index: the kernel
// sets err[0] = 1 (the host zeroes it before the step and reads it with the loss; the flag is
// only ever set, so one flag can serve several launches), writes NaN as that row's loss and
// NaN over that row of dlogits; the host then names the label with cross_entropy.rs `check_labels`.
// err may be null. Counts are f32 (exact for fewer than 2^24 rows).
#include "port.cuh"

// log Σ_j exp(row[j]) over a row of v, by the whole block; every thread gets it. Called by
// every thread of the block. scratch: __shared__ float[64] (32 warps' maxima, then sums).
template <typename T>
__device__ __forceinline__ float ce_block_lse(const T* row, int v, float* scratch) {
    float m = neg_inf(), s = 0.0f;
    for (int j = threadIdx.x; j < v; j += blockDim.x) lse_add(m, s, to_f32(row[j]));
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

__device__ __forceinline__ float ce_nan() { return __int_as_float(0x7fc00000); }

// losses[r] = lse(logits[r]) − logits[r, labels[r]], 0 if labels[r] = ignore_index.
// losses: (rows) f32; logits: (rows, v) T; labels: (rows) i64; err: (1) i32 or null.
// Grid: any (one block per row is the natural size); block: a multiple of the warp size ≤ 1024.
template <typename T>
__device__ void cross_entropy_forward(float* losses, int* err, const T* logits, const long long* labels, long long rows, int v, long long ignore_index) {
    __shared__ float scratch[64];
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {  // block-uniform
        const long long y = labels[r];
        if (y == ignore_index) {
            if (threadIdx.x == 0) losses[r] = 0.0f;
            continue;
        }
        if (y < 0 || y >= v) {
            if (threadIdx.x == 0) {
                losses[r] = ce_nan();
                if (err) err[0] = 1;
            }
            continue;
        }
        const T* row = logits + r * v;
        const float lse = ce_block_lse(row, v, scratch);
        if (threadIdx.x == 0) losses[r] = lse - to_f32(row[y]);
    }
}

// loss: (1) f32 = Σ losses / (number of labels ≠ ignore_index), in a fixed order: each thread
// adds its strided share of the rows in order, then block_sum. losses: (rows) f32 from
// cross_entropy_forward; labels: (rows) i64. Grid: 1 block (any multiple of the warp size ≤ 1024).
ORT_KERNEL(cross_entropy_mean)(float* loss, const float* losses, const long long* labels, long long rows, long long ignore_index) {
    __shared__ float scratch[32];
    float sum = 0.0f, count = 0.0f;
    for (long long i = threadIdx.x; i < rows; i += blockDim.x) {
        sum += losses[i];
        count += labels[i] != ignore_index ? 1.0f : 0.0f;
    }
    sum = block_sum(sum, scratch);
    count = block_sum(count, scratch);
    if (threadIdx.x == 0) loss[0] = sum / count;
}
ORT_REGISTER(cross_entropy_mean)

// count: (1) f32 = the number of labels ≠ ignore_index (the backward's divisor). Grid: 1 block.
ORT_KERNEL(cross_entropy_count)(float* count, const long long* labels, long long rows, long long ignore_index) {
    __shared__ float scratch[32];
    float c = 0.0f;
    for (long long i = threadIdx.x; i < rows; i += blockDim.x) c += labels[i] != ignore_index ? 1.0f : 0.0f;
    c = block_sum(c, scratch);
    if (threadIdx.x == 0) count[0] = c;
}
ORT_REGISTER(cross_entropy_count)

// dlogits[r, j] = g·(exp(logits[r, j] − lse_r) − [j = labels[r]]), g = dloss[0] / max(count[0], 1);
// 0 over an ignored row. dlogits, logits: (rows, v) T (may alias); labels: (rows) i64;
// dloss: (1) f32; count: (1) f32 from cross_entropy_count; err: (1) i32 or null. Grid and
// block as the forward.
template <typename T>
__device__ void cross_entropy_backward(T* dlogits, int* err, const T* logits, const long long* labels, const float* dloss, const float* count, long long rows, int v, long long ignore_index) {
    __shared__ float scratch[64];
    const float g = dloss[0] / fmaxf(count[0], 1.0f);
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {  // block-uniform
        const long long y = labels[r];
        T* drow = dlogits + r * v;
        if (y == ignore_index || y < 0 || y >= v) {
            const bool bad = y != ignore_index;
            if (bad && err && threadIdx.x == 0) err[0] = 1;
            const T fillv = from_f32<T>(bad ? ce_nan() : 0.0f);
            for (int j = threadIdx.x; j < v; j += blockDim.x) drow[j] = fillv;
            continue;
        }
        const T* row = logits + r * v;
        const float lse = ce_block_lse(row, v, scratch);  // ends with a barrier: row fully read
        for (int j = threadIdx.x; j < v; j += blockDim.x) {
            float d = g * expf(to_f32(row[j]) - lse);
            if (j == y) d -= g;
            drow[j] = from_f32<T>(d);
        }
    }
}

#define CROSS_ENTROPY(S, T)                                                                                                        \
    ORT_KERNEL(cross_entropy_forward_##S)(float* losses, int* err, const T* logits, const long long* labels, long long rows, int v, \
                                          long long ignore_index) {                                                                \
        cross_entropy_forward<T>(losses, err, logits, labels, rows, v, ignore_index);                                             \
    }                                                                                                                              \
    ORT_REGISTER(cross_entropy_forward_##S)                                                                                        \
    ORT_KERNEL(cross_entropy_backward_##S)(T * dlogits, int* err, const T* logits, const long long* labels, const float* dloss,     \
                                           const float* count, long long rows, int v, long long ignore_index) {                    \
        cross_entropy_backward<T>(dlogits, err, logits, labels, dloss, count, rows, v, ignore_index);                              \
    }                                                                                                                              \
    ORT_REGISTER(cross_entropy_backward_##S)
ORT_FOR_FLOATS(CROSS_ENTROPY)
