// SwiGLU (engine/src/ops/swiglu): h = silu(gate)·up and its backward dgate = (dh·up)·silu'(gate),
// dup = dh·silu(gate). One thread per element, grid-stride; arithmetic in f32, storage T.
// CPU counterparts: engine/src/ops/swiglu/cpu.rs (same formulas, in the same order).
// Launchers: engine/src/ops/swiglu/gpu.rs.
//
// Every operand is rows of W contiguous elements at any strides of up to three leading dims (the
// plan's Req::Rows: Phi-3's gate and up are the halves of one (…, 2I) projection, and dgate, dup
// the halves of its gradient): row r = (i0·n1 + i1)·n2 + i2 starts at i0·s0 + i1·s1 + i2·s2 of
// that operand's strides s (`Rows3`, three per operand, in the kernel's operand order).
#include "port.cuh"

// σ(x) = 1/(1 + e^−x): for x → −∞, expf(−x) overflows to inf and σ to 0, as on the CPU.
__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// Element e's row (i0, i1, i2) and column c, and its offset in an operand at strides s[0..3].
// n1 = n2 = 1 (one row of every element: the launcher's form for dense operands, every Llama
// MLP) takes no division, a branch uniform across the grid; other rows cost 64-bit divisions.
struct RowIdx {
    long long i0 = 0, i1 = 0, i2 = 0, c;
    __device__ RowIdx(long long e, long long w, long long n1, long long n2) {
        if (n1 == 1 && n2 == 1) {
            c = e;
            return;
        }
        const long long r = e / w;
        c = e - r * w;
        i2 = r % n2;
        const long long q = r / n2;
        i1 = q % n1;
        i0 = q / n1;
    }
    __device__ long long at(const long long* s) const { return i0 * s[0] + i1 * s[1] + i2 * s[2] + c; }
};

// h = silu(gate)·up; h may alias gate or up (same strides). h, gate, up: rows × W;
// s: strides of h, gate, up (3 each)
template <typename T>
__device__ void swiglu_forward(T* h, const T* gate, const T* up, long long n, long long w, long long n1,
                               long long n2, const long long* s) {
    GRID_STRIDE(e, n) {
        const RowIdx x(e, w, n1, n2);
        const float g = to_f32(gate[x.at(s + 3)]);
        h[x.at(s)] = from_f32<T>(g * sigmoid(g) * to_f32(up[x.at(s + 6)]));
    }
}

// dgate = (dh·up)·σ(g)·(1 + g·(1 − σ(g))), dup = dh·(g·σ(g)); dgate may alias dh (each dh is
// read before its dgate is written). dgate, dup, dh, gate, up: rows × W; s: their strides (3 each)
template <typename T>
__device__ void swiglu_backward(T* dgate, T* dup, const T* dh, const T* gate, const T* up, long long n, long long w,
                                long long n1, long long n2, const long long* s) {
    GRID_STRIDE(e, n) {
        const RowIdx x(e, w, n1, n2);
        const float d = to_f32(dh[x.at(s + 6)]), g = to_f32(gate[x.at(s + 9)]);
        const float sg = sigmoid(g);
        dup[x.at(s + 3)] = from_f32<T>(d * (g * sg));
        dgate[x.at(s)] = from_f32<T>(d * to_f32(up[x.at(s + 12)]) * (sg * fmaf(g, 1.0f - sg, 1.0f)));
    }
}

#define SWIGLU(S, T)                                                                                            \
    ORT_KERNEL(swiglu_forward_##S)(T * h, const T* gate, const T* up, long long n, long long w, long long n1,     \
                                   long long n2, long long h0, long long h1, long long h2, long long g0,          \
                                   long long g1, long long g2, long long u0, long long u1, long long u2) {        \
        const long long s[9] = {h0, h1, h2, g0, g1, g2, u0, u1, u2};                                           \
        swiglu_forward<T>(h, gate, up, n, w, n1, n2, s);                                                        \
    }                                                                                                           \
    ORT_REGISTER(swiglu_forward_##S)                                                                            \
    ORT_KERNEL(swiglu_backward_##S)(T * dgate, T * dup, const T* dh, const T* gate, const T* up, long long n,    \
                                    long long w, long long n1, long long n2, long long a0, long long a1, long long a2,  \
                                    long long b0, long long b1, long long b2, long long c0, long long c1,         \
                                    long long c2, long long g0, long long g1, long long g2, long long u0,         \
                                    long long u1, long long u2) {                                                \
        const long long s[15] = {a0, a1, a2, b0, b1, b2, c0, c1, c2, g0, g1, g2, u0, u1, u2};                   \
        swiglu_backward<T>(dgate, dup, dh, gate, up, n, w, n1, n2, s);                                          \
    }                                                                                                           \
    ORT_REGISTER(swiglu_backward_##S)
ORT_FOR_FLOATS(SWIGLU)
