// The host side of port.cuh: CUDA's kernel vocabulary (built-in indices, qualifiers, barriers,
// warp shuffles, half types, intrinsics) as plain C++20, so engine/kernels/*.cu compile with g++
// and run on the CPU under the scheduler in runtime.cpp.
//
// How a launch runs (runtime.cpp): blocks one at a time; a block's threads are fibers (user-space
// contexts, each with its own stack) on the launching OS thread, and only one runs at any moment
// — it runs until it reaches a barrier (`__syncthreads`, a warp collective) or returns, then
// hands over to the next runnable thread in a schedule order (forward, reverse or shuffled thread
// ids). This makes every run deterministic and every race visible: a missing `__syncthreads`
// between a shared-memory write and another thread's read gives a wrong answer under one of the
// orders, and a barrier or collective that not every thread reaches is reported as a deadlock
// naming who waits where, instead of hanging.
//
// Why fibers and not OS threads: the threads take turns anyway, so real threads only added cost
// — creating up to 1024 of them per launch and a futex wake plus a kernel context switch at every
// hand-over, which made the kernel tests spend most of their time in the kernel. A fiber switch
// is a few register moves in user space.
//
// `threadIdx` and `blockIdx` are therefore plain globals, not `thread_local`: the scheduler sets
// `threadIdx` to the resumed thread's before every switch (and `blockIdx` at each block's start).
// Launches are serialised (runtime.cpp's g_launch), so one launch owns them at a time.
//
// `__shared__` is a function-local `static`: one instance per kernel per dtype, which is per
// block because blocks never overlap. Dynamic shared memory is poisoned with 0xFF bytes (NaN)
// at each block's start, so reading it before writing shows.
#pragma once

// Standard headers first: the qualifier macros below must not reach them.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <math.h>
#include <memory>
#include <random>
#include <source_location>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

// ---------------------------------------------------------------- qualifiers and built-ins
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __shared__ static
#define __launch_bounds__(...)

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};
inline dim3 threadIdx;  // the running fiber's (see above)
inline dim3 blockIdx;
inline dim3 blockDim;
inline dim3 gridDim;
inline int warpSize = 32;

namespace simt {
void sync_block();
void sync_warp();
void warp_barrier();
unsigned long long shfl_bits(unsigned long long bits, int src_lane);
// The tensor-core instructions (tensor_core.cpp): warp collectives with the PTX ISA's
// fragment layouts. `where` is the kernel's call site, to name it when lanes diverge.
void mma_m16n8k16(bool bf16, float* d, const unsigned* a, const unsigned* b, std::source_location where);
void ldmatrix(int count, bool trans, unsigned* r, const void* row, std::source_location where);
unsigned char* dyn_smem();

// A kernel as the harness sees it: its name, its address, and a trampoline that unpacks a
// cuLaunchKernel-style argument array (pointers to each argument's value) into a typed call.
struct Entry {
    const char* name;
    void* fn;
    void (*tramp)(void* fn, void** args);
};
Entry* registry_add(const Entry& e);

template <class... A, std::size_t... I>
void call(void* fn, void** args, std::index_sequence<I...>) {
    reinterpret_cast<void (*)(A...)>(fn)(*static_cast<std::remove_cv_t<A>*>(args[I])...);
}
template <class... A>
void tramp(void* fn, void** args) {
    call<A...>(fn, args, std::index_sequence_for<A...>{});
}
struct Registration {
    template <class... A>
    Registration(const char* name, void (*f)(A...)) {
        registry_add(Entry{name, reinterpret_cast<void*>(f), &tramp<A...>});
    }
};
}  // namespace simt

#define ORT_KERNEL(name) extern "C" void name
#define ORT_REGISTER(name) static simt::Registration ort_registration_##name(#name, &name);
#define DYN_SHARED(type, name) type* name = reinterpret_cast<type*>(simt::dyn_smem())

inline void __syncthreads() { simt::sync_block(); }
inline void __syncwarp() { simt::warp_barrier(); }
inline void port_syncwarp() { simt::warp_barrier(); }

template <typename T>
inline T port_shfl(T v, int src) {
    static_assert(sizeof(T) <= 8, "shuffles move at most 64 bits");
    unsigned long long bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    bits = simt::shfl_bits(bits, src);
    T out;
    std::memcpy(&out, &bits, sizeof(T));
    return out;
}
template <typename T>
inline T port_shfl_xor(T v, int mask) {
    return port_shfl(v, ((int)threadIdx.x % warpSize) ^ mask);
}

// ---------------------------------------------------------------- intrinsics
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned i; std::memcpy(&i, &f, 4); return i; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
using std::isfinite;
using std::isinf;
using std::isnan;

// ---------------------------------------------------------------- half types (storage only)
// IEEE binary16 and bfloat16 as bit patterns; conversions round to nearest even, like
// __float2half_rn / __float2bfloat16_rn and the `half` crate the CPU engine uses.
struct f16_t {
    std::uint16_t bits;
};
struct bf16_t {
    std::uint16_t bits;
};

inline float to_f32(f16_t h) {
    const std::uint32_t sign = (std::uint32_t)(h.bits & 0x8000u) << 16;
    const std::uint32_t exp = (h.bits >> 10) & 0x1fu, man = h.bits & 0x3ffu;
    if (exp == 0) {  // zero or subnormal: man · 2^-24, exact in f32
        const float f = std::ldexp((float)man, -24);
        return sign ? -f : f;
    }
    const std::uint32_t bits = exp == 31 ? (sign | 0x7f800000u | (man << 13)) : (sign | ((exp + 112u) << 23) | (man << 13));
    return __uint_as_float(bits);
}
inline float to_f32(bf16_t b) { return __uint_as_float((std::uint32_t)b.bits << 16); }

template <typename T>
T from_f32(float x);
template <>
inline f16_t from_f32<f16_t>(float f) {
    std::uint32_t x = __float_as_uint(f);
    const std::uint16_t sign = (std::uint16_t)((x >> 16) & 0x8000u);
    x &= 0x7fffffffu;
    if (x >= 0x7f800000u) return f16_t{(std::uint16_t)(sign | (x > 0x7f800000u ? 0x7e00u : 0x7c00u))};
    if (x >= 0x477ff000u) return f16_t{(std::uint16_t)(sign | 0x7c00u)};  // ≥ 65520 rounds to inf
    if (x < 0x38800000u) {  // below 2^-14: a subnormal, round(|f| · 2^24) ulps (rint is RNE)
        const std::uint32_t r = (std::uint32_t)std::rint(__uint_as_float(x) * 16777216.0f);
        return f16_t{(std::uint16_t)(sign | r)};
    }
    const std::uint32_t rounded = x + 0xfffu + ((x >> 13) & 1u);
    return f16_t{(std::uint16_t)(sign | ((rounded - 0x38000000u) >> 13))};
}
template <>
inline bf16_t from_f32<bf16_t>(float f) {
    const std::uint32_t x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return bf16_t{(std::uint16_t)((x >> 16) | 0x40u)};
    return bf16_t{(std::uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16)};
}
