// Pointwise functions (engine/src/ops/pointwise.rs): y = f(x), dx = dy·f'(x), out = f(a, b)
// with b broadcast over a's leading dims. One thread per element, or per 16-byte pack where
// the operands allow (port.cuh map1_packed / map2_packed), grid-stride; arithmetic in f32,
// storage T. CPU counterparts: engine/src/backend/cpu/kernels/pointwise.rs (same
// formulas). Launchers: engine/src/exec/gpu/launch/pointwise.rs.
//
// A function is its device formulas (F::f, F::df for a unary one; F::f for a binary one) and
// one instantiation line below; the kernels are the family's templates.
#include "port.cuh"

// SiLU: x·σ(x) and its derivative σ(x)·(1 + x·(1 − σ(x))) (ops::pointwise UnaryFn::Silu).
// For x → −∞, expf(−x) overflows to inf and σ to 0, as on the CPU.
struct Silu {
    static __device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
    static __device__ __forceinline__ float f(float x) { return x * sigmoid(x); }
    static __device__ __forceinline__ float df(float x) {
        const float s = sigmoid(x);
        return s * fmaf(x, 1.0f - s, 1.0f);
    }
};

// ReLU: max(x, 0) (NaN passes through, as torch.relu) and its derivative 1 where x > 0, else 0
// (ATen's threshold_backward) (ops::pointwise UnaryFn::Relu).
struct Relu {
    static __device__ __forceinline__ float f(float x) { return x < 0.0f ? 0.0f : x; }
    static __device__ __forceinline__ float df(float x) { return x > 0.0f ? 1.0f : 0.0f; }
};

// y = F::f(x); y may alias x. y, x: (N)
template <typename F, typename T>
__device__ void unary_forward(T* y, const T* x, long long n) {
    map1_packed(y, x, n, [](float v) { return F::f(v); });
}

// dx = dy·F::df(x), from the forward's input; dx may alias dy. dx, x, dy: (N)
template <typename F, typename T>
__device__ void unary_backward(T* dx, const T* x, const T* dy, long long n) {
    map2_packed(dx, x, dy, n, n, [](float v, float d) { return d * F::df(v); });
}

// out[i] = F::f(a[i], b[i mod nb]); out may alias a (or b when nb = N). out, a: (N); b: (nb)
template <typename F, typename T>
__device__ void binary(T* out, const T* a, const T* b, long long n, long long nb) {
    map2_packed(out, a, b, n, nb, [](float x, float y) { return F::f(x, y); });
}

// a·b (ops::pointwise BinaryFn::Mul).
struct Mul {
    static __device__ __forceinline__ float f(float a, float b) { return a * b; }
};

// The kernels of unary function F named NAME, for storage type T (suffix S).
#define UNARY(NAME, F, S, T)                                                                      \
    ORT_KERNEL(NAME##_forward_##S)(T * y, const T* x, long long n) { unary_forward<F, T>(y, x, n); } \
    ORT_REGISTER(NAME##_forward_##S)                                                              \
    ORT_KERNEL(NAME##_backward_##S)(T * dx, const T* x, const T* dy, long long n) {               \
        unary_backward<F, T>(dx, x, dy, n);                                                       \
    }                                                                                             \
    ORT_REGISTER(NAME##_backward_##S)

// The kernel of binary function F named NAME, for storage type T (suffix S).
#define BINARY(NAME, F, S, T)                                                                     \
    ORT_KERNEL(NAME##_##S)(T * out, const T* a, const T* b, long long n, long long nb) {          \
        binary<F, T>(out, a, b, n, nb);                                                           \
    }                                                                                             \
    ORT_REGISTER(NAME##_##S)

#define SILU(S, T) UNARY(silu, Silu, S, T)
ORT_FOR_FLOATS(SILU)
#define RELU(S, T) UNARY(relu, Relu, S, T)
ORT_FOR_FLOATS(RELU)
#define MUL(S, T) BINARY(mul, Mul, S, T)
ORT_FOR_FLOATS(MUL)
