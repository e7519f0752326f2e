// SwiGLU (engine/src/ops/swiglu): h = silu(gate)·up and its backward dgate = (dh·up)·silu'(gate),
// dup = dh·silu(gate). One thread per element, grid-stride; arithmetic in f32, storage T.
// CPU counterparts: engine/src/ops/swiglu/cpu.rs (same formulas, in the same order).
// Launchers: engine/src/ops/swiglu/gpu.rs.
#include "port.cuh"

// σ(x) = 1/(1 + e^−x): for x → −∞, expf(−x) overflows to inf and σ to 0, as on the CPU.
__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// h = silu(gate)·up; h may alias gate or up. h, gate, up: (N)
template <typename T>
__device__ void swiglu_forward(T* h, const T* gate, const T* up, long long n) {
    GRID_STRIDE(i, n) {
        const float g = to_f32(gate[i]);
        h[i] = from_f32<T>(g * sigmoid(g) * to_f32(up[i]));
    }
}

// dgate = (dh·up)·σ(g)·(1 + g·(1 − σ(g))), dup = dh·(g·σ(g)); dgate may alias dh (each dh is
// read before its dgate is written). dgate, dup, dh, gate, up: (N)
template <typename T>
__device__ void swiglu_backward(T* dgate, T* dup, const T* dh, const T* gate, const T* up,
                                long long n) {
    GRID_STRIDE(i, n) {
        const float d = to_f32(dh[i]), g = to_f32(gate[i]);
        const float s = sigmoid(g);
        dup[i] = from_f32<T>(d * (g * s));
        dgate[i] = from_f32<T>(d * to_f32(up[i]) * (s * fmaf(g, 1.0f - s, 1.0f)));
    }
}

#define SWIGLU(S, T)                                                                               \
    ORT_KERNEL(swiglu_forward_##S)(T * h, const T* gate, const T* up, long long n) {               \
        swiglu_forward<T>(h, gate, up, n);                                                         \
    }                                                                                              \
    ORT_REGISTER(swiglu_forward_##S)                                                               \
    ORT_KERNEL(swiglu_backward_##S)(T * dgate, T * dup, const T* dh, const T* gate, const T* up,  \
                                    long long n) {                                                 \
        swiglu_backward<T>(dgate, dup, dh, gate, up, n);                                           \
    }                                                                                              \
    ORT_REGISTER(swiglu_backward_##S)
ORT_FOR_FLOATS(SWIGLU)
