// Elementwise kernels: fill, add (with a broadcast operand: bias add, residual add, gradient
// sums), scale, the linear layer's bias + GELU epilogue, GELU on its own (Gemma's GeGLU gate:
// no bias), GELU and tanh backward, dropout, casts.
// CPU counterparts: engine/src/backend/cpu/kernels/elementwise.rs (same formulas, same dropout
// mask bits). One thread per element (per 16-byte pack where the operands are aligned: add —
// the bias add too, where its width is a multiple of the pack —, scale, GELU and tanh forward
// and backward, dropout, casts), grid-stride; arithmetic in f32, storage T.
#include "port.cuh"

// GELU: approx 0 = erf (exact), 1 = tanh (elementwise.rs `Gelu`, ops::gelu::gelu_forward).
__device__ __forceinline__ float gelu_f(float x, int approx) {
    const float core = approx == 0 ? erff(x * 0.70710678118654752f) : tanhf(0.7978846f * fmaf(0.044715f * x * x, x, x));
    return 0.5f * x * (1.0f + core);
}
// gelu'(x) (elementwise.rs `GeluBackward`, ops::gelu::gelu_backward).
__device__ __forceinline__ float gelu_grad(float x, int approx) {
    if (approx == 0) {
        const float cdf = 0.5f * (1.0f + erff(x * 0.70710678118654752f));
        const float pdf = 0.3989423f * expf(-0.5f * x * x);
        return fmaf(x, pdf, cdf);
    }
    const float t = tanhf(0.7978846f * fmaf(0.044715f * x * x, x, x));
    const float du = 0.7978846f * fmaf(3.0f * 0.044715f * x, x, 1.0f);
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}

// out[i] = value. out: (N). The kernel `fill_<T>` multiplies value by the step block's loss
// scale when given one: autodiff's seed d(loss)/d(loss), which holds the loss scale.
template <typename T>
__device__ void fill(T* out, long long n, float value) {
    const T v = from_f32<T>(value);
    GRID_STRIDE(i, n) out[i] = v;
}

// out[i] = a[i] + b[i mod nb] — nb = N for a plain add, nb = C for a bias over rows of C.
// out may alias a. out, a: (N); b: (nb), nb divides N. In packs where the operands allow
// (port.cuh map2_packed).
template <typename T>
__device__ void add(T* out, const T* a, const T* b, long long n, long long nb) {
    map2_packed(out, a, b, n, nb, [](float x, float y) { return x + y; });
}

// The same sum of two f16/bf16 operands written in f32: the tied embedding's gradient, whose
// two parts (embedding scatter, LM-head dW) are half activations and whose sum is a parameter
// gradient (f32, as the CPU executor keeps parameter gradients). out: (N) f32; a: (N); b: (nb).
template <typename T>
__device__ void add_to_f32(float* out, const T* a, const T* b, long long n, long long nb) {
    GRID_STRIDE(i, n) out[i] = to_f32(a[i]) + to_f32(b[nb == n ? i : i % nb]);
}

// out[i] = s·x[i]; out may alias x. out, x: (N)
template <typename T>
__device__ void scale(T* out, const T* x, long long n, float s) {
    map1_packed(out, x, n, [s](float v) { return v * s; });
}

// The epilogue of Op::Linear with GELU after the GEMM wrote x·w into pre: pre += bias,
// y = gelu(pre) (elementwise.rs `bias_gelu`). y, pre: (R, C); bias: (C)
template <typename T>
__device__ void bias_gelu(T* y, T* pre, const T* bias, long long rows, int c, int approx) {
    GRID_STRIDE(i, rows * c) {
        const float p = to_f32(pre[i]) + to_f32(bias[i % c]);
        pre[i] = from_f32<T>(p);
        y[i] = from_f32<T>(gelu_f(p, approx));
    }
}

// y = gelu(x), a GELU outside a linear layer (elementwise.rs `gelu_forward`); y may alias x.
// y, x: (N)
template <typename T>
__device__ void gelu_forward(T* y, const T* x, long long n, int approx) {
    map1_packed(y, x, n, [approx](float v) { return gelu_f(v, approx); });
}

// dx = dy·gelu'(x); dx may alias dy. dx, x, dy: (N)
template <typename T>
__device__ void gelu_backward(T* dx, const T* x, const T* dy, long long n, int approx) {
    map2_packed(dx, x, dy, n, n, [approx](float v, float d) { return d * gelu_grad(v, approx); });
}

// y = tanh(x) (elementwise.rs `Tanh`). y, x: (N)
template <typename T>
__device__ void tanh_forward(T* y, const T* x, long long n) {
    map1_packed(y, x, n, [](float v) { return tanhf(v); });
}

// dx = dy·(1 − y²) (elementwise.rs `TanhBackward`). dx, y, dy: (N)
template <typename T>
__device__ void tanh_backward(T* dx, const T* y, const T* dy, long long n) {
    map2_packed(dx, y, dy, n, n, [](float v, float d) { return d * (1.0f - v * v); });
}

// out[i] = x[i]/(1−p) if element offset+i of the site is kept, else 0 (elementwise.rs
// `dropout`, same mask bits); its backward is the same call on the gradient. out, x: (N)
template <typename T>
__device__ void dropout(T* out, const T* x, long long n, float p, unsigned long long seed, unsigned long long offset) {
    const DropMask m = drop_mask(p, seed);
    const auto one = [&](long long i, float v) { return drop_keep(m, offset + (unsigned long long)i) ? from_f32<T>(v * m.scale) : from_f32<T>(0.0f); };
    constexpr int V = Pack<T>::V;
    grid_stride_packed<V>(
        n, aligned16(out) && aligned16(x), [&](long long i) { out[i] = one(i, to_f32(x[i])); },
        [&](long long i) {
            Pack<T> v = load_pack(x + i);
            for (int j = 0; j < V; ++j) v.e[j] = one(i + j, to_f32(v.e[j]));
            store_pack(out + i, v);
        });
}

// Casts between storage types, rounding to nearest even. out, x: (N)
// Where both are 16-byte aligned, E = max of the two packs' lengths elements a step: E / VF
// packs read, E / VT written (f32 → bf16: two packs of 4 in, one of 8 out), every access
// 16 bytes and aligned (i is a multiple of E, and E elements of either type are ≥ 16 bytes).
template <typename To, typename From>
__device__ void cast(To* out, const From* x, long long n) {
    constexpr int VT = Pack<To>::V, VF = Pack<From>::V, E = VT > VF ? VT : VF;
    grid_stride_packed<E>(
        n, aligned16(out) && aligned16(x), [&](long long i) { out[i] = from_f32<To>(to_f32(x[i])); },
        [&](long long i) {
            float v[E];
            for (int p = 0; p < E / VF; ++p) {
                const Pack<From> f = load_pack(x + i + p * VF);
                for (int j = 0; j < VF; ++j) v[p * VF + j] = to_f32(f.e[j]);
            }
            for (int p = 0; p < E / VT; ++p) {
                Pack<To> t;
                for (int j = 0; j < VT; ++j) t.e[j] = from_f32<To>(v[p * VT + j]);
                store_pack(out + i + p * VT, t);
            }
        });
}

#define ELEMENTWISE(S, T)                                                                                                        \
    ORT_KERNEL(fill_##S)(T * out, long long n, float value, const StepBlock* step) {                                             \
        fill<T>(out, n, step ? value * step->loss_scale : value);                                                                \
    }                                                                                                                            \
    ORT_REGISTER(fill_##S)                                                                                                       \
    ORT_KERNEL(add_##S)(T * out, const T* a, const T* b, long long n, long long nb) { add<T>(out, a, b, n, nb); }                 \
    ORT_REGISTER(add_##S)                                                                                                        \
    ORT_KERNEL(scale_##S)(T * out, const T* x, long long n, float s) { scale<T>(out, x, n, s); }                                  \
    ORT_REGISTER(scale_##S)                                                                                                      \
    ORT_KERNEL(bias_gelu_##S)(T * y, T * pre, const T* bias, long long rows, int c, int approx) {                               \
        bias_gelu<T>(y, pre, bias, rows, c, approx);                                                                             \
    }                                                                                                                            \
    ORT_REGISTER(bias_gelu_##S)                                                                                                  \
    ORT_KERNEL(gelu_forward_##S)(T * y, const T* x, long long n, int approx) { gelu_forward<T>(y, x, n, approx); }               \
    ORT_REGISTER(gelu_forward_##S)                                                                                               \
    ORT_KERNEL(gelu_backward_##S)(T * dx, const T* x, const T* dy, long long n, int approx) { gelu_backward<T>(dx, x, dy, n, approx); } \
    ORT_REGISTER(gelu_backward_##S)                                                                                              \
    ORT_KERNEL(tanh_forward_##S)(T * y, const T* x, long long n) { tanh_forward<T>(y, x, n); }                                    \
    ORT_REGISTER(tanh_forward_##S)                                                                                               \
    ORT_KERNEL(tanh_backward_##S)(T * dx, const T* y, const T* dy, long long n) { tanh_backward<T>(dx, y, dy, n); }               \
    ORT_REGISTER(tanh_backward_##S)                                                                                              \
    ORT_KERNEL(dropout_##S)(T * out, const T* x, long long n, float p, unsigned long long seed, unsigned long long offset,       \
                            const StepBlock* step) {                                                                             \
        dropout<T>(out, x, n, p, step ? step->seed : seed, offset);                                                              \
    }                                                                                                                            \
    ORT_REGISTER(dropout_##S)
ORT_FOR_FLOATS(ELEMENTWISE)

#define ADD_TO_F32(S, T)                                                                                  \
    ORT_KERNEL(add_to_f32_##S)(float* out, const T* a, const T* b, long long n, long long nb) { add_to_f32<T>(out, a, b, n, nb); } \
    ORT_REGISTER(add_to_f32_##S)
ADD_TO_F32(f16, f16_t)
ADD_TO_F32(bf16, bf16_t)

#define CAST(SA, A, SB, B)                                                                    \
    ORT_KERNEL(cast_##SA##_##SB)(B * out, const A* x, long long n) { cast<B, A>(out, x, n); } \
    ORT_REGISTER(cast_##SA##_##SB)
CAST(f32, float, f16, f16_t)
CAST(f32, float, bf16, bf16_t)
CAST(f16, f16_t, f32, float)
CAST(bf16, bf16_t, f32, float)
