// Row softmax with scale, an additive broadcast mask and a causal mask, and its backward: the
// attention probabilities when attention is not fused (Op::Softmax / Op::SoftmaxBackward).
// CPU counterparts (the numbers to match): engine/src/backend/cpu/kernels/softmax.rs
// `softmax_forward`, `softmax_backward` / `softmax_backward_inplace`; references: llm.c
// softmax_forward, ATen _softmax_backward_data.
//
// One warp per row (rows are key lengths, 128–4096 wide: a warp's lanes stride the row), rows
// per block = blockDim / warpSize, grid = ceil(rows / rows per block). Forward in two passes
// over the row: an online max and sum of exponentials (each lane keeps its running max m and
// Σ exp(v − m), rescaled when m grows; the lanes' pairs are merged by a butterfly), then
// y = exp(v − max)·(1/sum), the CPU's formula. The backward is dot(dy, y) by a warp sum, then
// dx = scale·y·(dy − dot). f32 arithmetic throughout, storage T read and written once per pass.
// Only warp collectives, so a warp past the last row returns at once (warp-uniform).
//
// Semantics shared with the CPU kernel: v = x·scale + mask; with `causal`, row r is query
// r mod tq and sees entries j ≤ r mod tq (the others are 0); a row whose visible entries are
// all −∞ gives zeros there (torch's `_safe_softmax`, as the reference) and 0 in the causal tail. The mask (storage T,
// null for none) is broadcast to the rows viewed as (B, H, Tq, N) through 4 element strides,
// 0 on a broadcast dim, as attention.cu's (the launcher folds other ranks into B, H, Tq).
// y may alias x, dx may alias dy: every element is read and then written by the same lane.
#include "port.cuh"

// Element strides of the additive mask against (B, H, Tq, N); 0 where it broadcasts.
struct SmMaskStrides {
    long long sb, sh, sq, sk;
};

// y = softmax(x·scale + mask) per row of n, causal as above.
// y, x: (rows, n) T; mask: broadcast to (B, H, tq, n) T, or null; h = H (B = rows / (H·tq)).
template <typename T>
__device__ void softmax_forward(T* y, const T* x, const T* mask, long long rows, int n, float scale, int causal, int h, int tq, SmMaskStrides ms) {
    const long long row = (long long)blockIdx.x * (blockDim.x / warpSize) + warp_id();
    if (row >= rows) return;  // warp-uniform: no collective is skipped by part of a warp
    const int q = (int)(row % tq);
    const int valid = causal ? (q + 1 < n ? q + 1 : n) : n;
    const T* xr = x + row * n;
    T* yr = y + row * n;
    const T* mr = nullptr;
    if (mask) {
        const long long bh = row / tq;
        mr = mask + (bh / h) * ms.sb + (bh % h) * ms.sh + (long long)q * ms.sq;
    }
    float m = neg_inf(), s = 0.0f;
    for (int j = lane_id(); j < valid; j += warpSize) {
        float v = to_f32(xr[j]) * scale;
        if (mr) v += to_f32(mr[(long long)j * ms.sk]);
        lse_add(m, s, v);
    }
    warp_lse_merge(m, s);
    const bool all_masked = m == neg_inf();
    const float inv = 1.0f / s;
    for (int j = lane_id(); j < n; j += warpSize) {
        float out = 0.0f;
        if (j < valid) {
            float v = to_f32(xr[j]) * scale;
            if (mr) v += to_f32(mr[(long long)j * ms.sk]);
            out = all_masked ? 0.0f : expf(v - m) * inv;
        }
        yr[j] = from_f32<T>(out);
    }
}

// dx = scale·y·(dy − Σ dy·y) per row of n. dx, y, dy: (rows, n) T; dx may alias dy.
template <typename T>
__device__ void softmax_backward(T* dx, const T* y, const T* dy, long long rows, int n, float scale) {
    const long long row = (long long)blockIdx.x * (blockDim.x / warpSize) + warp_id();
    if (row >= rows) return;  // warp-uniform
    const long long o = row * n;
    float acc = 0.0f;
    for (int j = lane_id(); j < n; j += warpSize) acc = fmaf(to_f32(dy[o + j]), to_f32(y[o + j]), acc);
    const float dot = warp_sum(acc);
    for (int j = lane_id(); j < n; j += warpSize) {
        const float yj = to_f32(y[o + j]), g = to_f32(dy[o + j]);  // both read before dx is written
        dx[o + j] = from_f32<T>(scale * yj * (g - dot));
    }
}

// Arguments: outputs, inputs, rows, n (row length), then the forward's scale, causal (0/1),
// h, tq and the mask's 4 strides (m_sb, m_sh, m_sq, m_sk), or the backward's scale.
#define SOFTMAX(S, T)                                                                                                          \
    ORT_KERNEL(softmax_forward_##S)(T * y, const T* x, const T* mask, long long rows, int n, float scale, int causal, int h,    \
                                    int tq, long long m_sb, long long m_sh, long long m_sq, long long m_sk) {                  \
        softmax_forward<T>(y, x, mask, rows, n, scale, causal, h, tq, SmMaskStrides{m_sb, m_sh, m_sq, m_sk});                  \
    }                                                                                                                          \
    ORT_REGISTER(softmax_forward_##S)                                                                                          \
    ORT_KERNEL(softmax_backward_##S)(T * dx, const T* y, const T* dy, long long rows, int n, float scale) {                    \
        softmax_backward<T>(dx, y, dy, rows, n, scale);                                                                        \
    }                                                                                                                          \
    ORT_REGISTER(softmax_backward_##S)
ORT_FOR_FLOATS(SOFTMAX)
