// ortbench's portability header: one kernel dialect for NVIDIA (NVRTC), AMD (hiprtc/hipcc) and
// the host SIMT harness (engine/kernels/simt, kernels compiled as C++ and a block's threads run as fibers on the CPU).
//
// Kernel discipline this header relies on, so that the host harness emulates exactly what a GPU
// does:
// - warp collectives (`warp_shfl_*`, `warp_sum`, ...) are called by every lane of the warp, and
//   `__syncthreads()` by every thread of the block (no collective inside divergent code, no
//   early `return` before a barrier);
// - blocks are 1-D and a multiple of the warp size (32 on NVIDIA, 64 on CDNA, both on the host);
//   code reads the warp size from `warpSize`, never a literal 32;
// - dynamic shared memory is declared with `DYN_SHARED(type, name)`;
// - kernels are `ORT_KERNEL(name)(args) { ... }` followed by `ORT_REGISTER(name)`: extern "C"
//   (unmangled, so the driver and the harness find them by name) and registered in the host
//   harness. Templates carry the dtype; a kernel per dtype names it `_f32`, `_f16` or `_bf16`.
// - storage types are float, f16_t and bf16_t; arithmetic is in float (`to_f32` / `from_f32`).
#pragma once

#if defined(ORTBENCH_SIMT_HOST)
// ---------------------------------------------------------------- host SIMT harness (C++20)
#include "simt/host.h"
#define ORT_HAS_MMA 1

#elif defined(__HIPCC__) || defined(__HIPCC_RTC__) || defined(__HIP_PLATFORM_AMD__)
// ---------------------------------------------------------------- AMD HIP
#ifndef __HIPCC_RTC__
// hipcc; hiprtc prepends the runtime and fp16 headers itself (including them again redefines).
#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
#endif
typedef __half f16_t;
// HIP 5.2's hip_bfloat16.h pulls in host <cmath> (unusable under hiprtc): bf16 as its bits, with
// the same round-to-nearest-even conversion as __float2bfloat16_rn and the host harness.
struct bf16_t {
    unsigned short bits;
};
#define ORT_KERNEL(name) extern "C" __global__ void name
#define ORT_REGISTER(name)
#define DYN_SHARED(type, name) extern __shared__ unsigned char name##_raw[]; type* name = reinterpret_cast<type*>(name##_raw)
__device__ __forceinline__ float to_f32(f16_t x) { return __half2float(x); }
__device__ __forceinline__ float to_f32(bf16_t x) { return __uint_as_float((unsigned)x.bits << 16); }
template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ f16_t from_f32<f16_t>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ bf16_t from_f32<bf16_t>(float f) {
    const unsigned x = __float_as_uint(f);
    bf16_t b;
    b.bits = (x & 0x7fffffffu) > 0x7f800000u ? (unsigned short)((x >> 16) | 0x40u) : (unsigned short)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
    return b;
}
template <typename T> __device__ __forceinline__ T port_shfl_xor(T v, int mask) { return __shfl_xor(v, mask); }
template <typename T> __device__ __forceinline__ T port_shfl(T v, int src) { return __shfl(v, src); }
__device__ __forceinline__ void port_syncwarp() {}

#else
// ---------------------------------------------------------------- NVIDIA CUDA (NVRTC)
#include <cuda_fp16.h>
#include <cuda_bf16.h>
typedef __half f16_t;
typedef __nv_bfloat16 bf16_t;
#define ORT_KERNEL(name) extern "C" __global__ void name
#define ORT_REGISTER(name)
#define DYN_SHARED(type, name) extern __shared__ __align__(16) unsigned char name##_raw[]; type* name = reinterpret_cast<type*>(name##_raw)
__device__ __forceinline__ float to_f32(f16_t x) { return __half2float(x); }
__device__ __forceinline__ float to_f32(bf16_t x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ f16_t from_f32<f16_t>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ bf16_t from_f32<bf16_t>(float x) { return __float2bfloat16_rn(x); }
template <typename T> __device__ __forceinline__ T port_shfl_xor(T v, int mask) { return __shfl_xor_sync(0xffffffffu, v, mask); }
template <typename T> __device__ __forceinline__ T port_shfl(T v, int src) { return __shfl_sync(0xffffffffu, v, src); }
__device__ __forceinline__ void port_syncwarp() { __syncwarp(); }
#define ORT_HAS_MMA 1
#endif

// ---------------------------------------------------------------- common to every target

__device__ __forceinline__ float to_f32(float x) { return x; }
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }

__device__ __forceinline__ float neg_inf() { return __int_as_float((int)0xff800000u); }

// 16-byte vector loads and stores (the address 16-byte aligned). On the host through memcpy,
// so that viewing T storage as uint4 is not an aliasing violation there.
#if defined(ORTBENCH_SIMT_HOST)
struct uint4 {
    unsigned x, y, z, w;
};
inline uint4 load16(const void* p) {
    uint4 v;
    std::memcpy(&v, p, 16);
    return v;
}
inline void store16(void* p, uint4 v) { std::memcpy(p, &v, 16); }
#else
__device__ __forceinline__ uint4 load16(const void* p) { return *reinterpret_cast<const uint4*>(p); }
__device__ __forceinline__ void store16(void* p, uint4 v) { *reinterpret_cast<uint4*>(p) = v; }
#endif

// The thread's index in its (1-D) block, its lane and its warp.
__device__ __forceinline__ int lane_id() { return (int)threadIdx.x % warpSize; }
__device__ __forceinline__ int warp_id() { return (int)threadIdx.x / warpSize; }

// Butterfly reductions: every lane ends with the result.
__device__ __forceinline__ float warp_sum(float v) {
    for (int m = warpSize / 2; m > 0; m >>= 1) v += port_shfl_xor(v, m);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int m = warpSize / 2; m > 0; m >>= 1) v = fmaxf(v, port_shfl_xor(v, m));
    return v;
}

// Block-wide sum, result in every thread. `scratch` is __shared__ float[32] (up to 1024/32
// warps; 1024/64 on wave64). Two barriers: the second keeps a following call from overwriting
// scratch while a slow warp still reads it.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    v = warp_sum(v);
    const int nwarps = (int)blockDim.x / warpSize;
    if (lane_id() == 0) scratch[warp_id()] = v;
    __syncthreads();
    float t = lane_id() < nwarps ? scratch[lane_id()] : 0.0f;
    t = warp_sum(t);
    __syncthreads();
    return t;
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
    v = warp_max(v);
    const int nwarps = (int)blockDim.x / warpSize;
    if (lane_id() == 0) scratch[warp_id()] = v;
    __syncthreads();
    float t = lane_id() < nwarps ? scratch[lane_id()] : neg_inf();
    t = warp_max(t);
    __syncthreads();
    return t;
}

// Online log-sum-exp (softmax.cu, cross_entropy.cu): a running (max m, Σ exp(· − m)) pair.
// Folds value v in; −∞ adds nothing (no −∞ − −∞).
__device__ __forceinline__ void lse_add(float& m, float& s, float v) {
    if (v > m) {
        s = s * expf(m - v) + 1.0f;  // m = −∞ at first: 0·0 + 1
        m = v;
    } else if (v != neg_inf()) {
        s += expf(v - m);
    }
}

// Merges pair (m2, s2) into (m, s); an empty pair has m = −∞, s = 0.
__device__ __forceinline__ void lse_merge(float& m, float& s, float m2, float s2) {
    const float mx = fmaxf(m, m2);
    if (mx == neg_inf()) return;  // both empty
    s = s * expf(m - mx) + s2 * expf(m2 - mx);
    m = mx;
}

// Every lane ends with the warp's pair; merging is commutative, so both lanes of each butterfly
// step compute the same bits. The pair travels as one 64-bit shuffle.
__device__ __forceinline__ void warp_lse_merge(float& m, float& s) {
    for (int k = warpSize / 2; k > 0; k >>= 1) {
        const unsigned long long o = port_shfl_xor(((unsigned long long)__float_as_uint(m) << 32) | __float_as_uint(s), k);
        lse_merge(m, s, __uint_as_float((unsigned)(o >> 32)), __uint_as_float((unsigned)o));
    }
}

// The engine's counter-based dropout RNG (engine/src/backend/cpu/kernels/elementwise.rs
// `DropMask`, engine/src/ops/dropout.rs `hash`): element `counter` of a site is kept iff the top
// 24 bits of mix(key ^ counter·golden) are ≥ ceil(p·2^24), key = mix(seed + golden). Same bits
// as the CPU, so masks are identical across devices.
__device__ __forceinline__ unsigned long long drop_mix(unsigned long long z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
struct DropMask {
    unsigned long long key;
    unsigned long long threshold;
    float scale;
};
// p in [0, 1]; scale = 1/(1-p), 0 when p = 1 (`ops::dropout::keep_scale`).
__device__ __forceinline__ DropMask drop_mask(float p, unsigned long long seed) {
    DropMask m;
    m.key = drop_mix(seed + 0x9E3779B97F4A7C15ull);
    m.threshold = (unsigned long long)ceil((double)p * 16777216.0);
    m.scale = p >= 1.0f ? 0.0f : 1.0f / (float)(1.0 - (double)p);
    return m;
}
__device__ __forceinline__ bool drop_keep(const DropMask& m, unsigned long long counter) {
    return (drop_mix(m.key ^ (counter * 0x9E3779B97F4A7C15ull)) >> 40) >= m.threshold;
}

// A query row's softmax statistics, as attention.cu and attention_mma.cu keep them for the
// backward: the row's max m and log l, l = Σ_j exp(s_j − m) (attention.cu says why not m + log l).
struct RowStats {
    float m, logl;
};

// Attention scores' tanh soft-cap (Gemma 2's attn_logit_softcapping), shared by attention.cu and
// attention_mma.cu: u = scale·q·k becomes cap·tanh(u), with slope ds/du = cap·(1 − tanh²u) for
// the backward; cap 0 means none (u, slope 1). CPU: attention.rs `probs_rows` / `ds_body`.
__device__ __forceinline__ float attn_softcap(float u, float cap, float& slope) {
    if (cap == 0.0f) {
        slope = 1.0f;
        return u;
    }
    const float t = tanhf(u);
    slope = cap * (1.0f - t * t);
    return cap * t;
}

// What changes from one training step to the next, in device memory (exec/gpu/step_block.rs
// `StepBlock`, the same layout). A captured step (a CUDA graph) replays its launches with the
// arguments they were captured with, so the kernels of a step read these from the block the
// host uploads before each step — as PyTorch's graph-safe Philox state reads its seed through a
// pointer. A kernel given a null block uses its value arguments instead (a kernel launched
// alone, as the kernel tests do).
struct StepBlock {
    unsigned long long seed;  // the step's dropout seed
    float loss_scale;         // the backward's seed d(loss)/d(loss): loss scale · the rank's weight
    float inv_scale;          // 1 / loss scale: the optimizer unscales the gradients by it
    float step_size;          // AdamW: lr / (1 − β1^t)
    float inv_bc2_sqrt;       // AdamW: 1 / sqrt(1 − β2^t)
    float decay_mul;          // AdamW: 1 − lr·weight_decay
    float reserved;
};
// The host writes it as 32 bytes (`StepBlock::BYTES`, its unit test the field offsets).
static_assert(sizeof(StepBlock) == 32, "StepBlock is 32 bytes, as step_block.rs writes it");

// Instantiates X(suffix, storage type) for each float storage type: kernels per dtype.
#define ORT_FOR_FLOATS(X) X(f32, float) X(f16, f16_t) X(bf16, bf16_t)

// The column-sum grid (reduce.cu, layernorm.cu's weight gradients): chunks × ceil(C /
// blockDim) blocks, 1-D; block b handles rows [r0, r1) of chunk b / col_blocks for column j.
struct ColumnChunk {
    long long chunk, r0, r1;
    int j;
};
__device__ __forceinline__ ColumnChunk column_chunk(long long rows, int c, int rows_per_chunk) {
    const int col_blocks = (c + blockDim.x - 1) / blockDim.x;
    ColumnChunk k;
    k.chunk = blockIdx.x / col_blocks;
    k.j = (blockIdx.x % col_blocks) * blockDim.x + threadIdx.x;
    k.r0 = k.chunk * rows_per_chunk;
    k.r1 = k.r0 + rows_per_chunk < rows ? k.r0 + rows_per_chunk : rows;
    return k;
}

// A grid-stride loop over [0, n).
#define GRID_STRIDE(i, n) \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (long long)(n); i += (long long)gridDim.x * blockDim.x)

// 16 bytes of storage T (4 f32 or 8 f16/bf16), loaded and stored as one 128-bit access: the
// memory-bound kernels' unit where their operands are 16-byte aligned.
template <typename T>
struct alignas(16) Pack {
    static constexpr int V = 16 / (int)sizeof(T);
    T e[V];
};
__device__ __forceinline__ bool aligned16(const void* p) { return ((unsigned long long)p & 15ull) == 0; }
#if defined(ORTBENCH_SIMT_HOST)
template <typename T>
inline Pack<T> load_pack(const T* p) {
    Pack<T> r;
    std::memcpy(&r, p, 16);
    return r;
}
template <typename T>
inline void store_pack(T* p, const Pack<T>& v) { std::memcpy(p, &v, 16); }
#else
template <typename T>
__device__ __forceinline__ Pack<T> load_pack(const T* p) { return *reinterpret_cast<const Pack<T>*>(p); }
template <typename T>
__device__ __forceinline__ void store_pack(T* p, const Pack<T>& v) { *reinterpret_cast<Pack<T>*>(p) = v; }
#endif

// An elementwise loop over [0, n): with `packed` (every operand 16-byte aligned), `vec(i)` for
// each pack of V elements i..i+V−1 — one 16-byte access per operand — then `one(i)` for the
// last n mod V; otherwise `one(i)` for every element. Both compute the same bits per element.
template <int V, typename One, typename Vec>
__device__ __forceinline__ void grid_stride_packed(long long n, bool packed, One one, Vec vec) {
    long long done = 0;
    if (packed) {
        const long long packs = n / V;
        GRID_STRIDE(k, packs) vec(k * V);
        done = packs * V;
    }
    GRID_STRIDE(j, n - done) one(done + j);
}

// out[i] = f(x[i]) in f32, storage T, packed where out and x are 16-byte aligned (unary
// functions, their forms of the derivative that read one tensor). out may alias x.
template <typename T, typename F>
__device__ __forceinline__ void map1_packed(T* out, const T* x, long long n, F f) {
    constexpr int V = Pack<T>::V;
    grid_stride_packed<V>(
        n, aligned16(out) && aligned16(x), [&](long long i) { out[i] = from_f32<T>(f(to_f32(x[i]))); },
        [&](long long i) {
            Pack<T> v = load_pack(x + i);
            for (int j = 0; j < V; ++j) v.e[j] = from_f32<T>(f(to_f32(v.e[j])));
            store_pack(out + i, v);
        });
}

// out[i] = f(a[i], b[i mod nb]) in f32, storage T; nb divides n (nb = n: same shape; nb = C:
// b broadcast over rows of C, a bias). Packed where every operand is 16-byte aligned and nb is
// a multiple of V — then a pack of a never straddles two rows, b's pack starts at i mod nb,
// and the 64-bit modulo (tens of instructions on a GPU) is paid once per pack, not per
// element. The same-shape case skips it altogether. out may alias a (or b when nb = n).
template <typename T, typename F>
__device__ __forceinline__ void map2_packed(T* out, const T* a, const T* b, long long n, long long nb, F f) {
    constexpr int V = Pack<T>::V;
    const bool same = nb == n;
    grid_stride_packed<V>(
        n, nb % V == 0 && aligned16(out) && aligned16(a) && aligned16(b),
        [&](long long i) { out[i] = from_f32<T>(f(to_f32(a[i]), to_f32(b[same ? i : i % nb]))); },
        [&](long long i) {
            const Pack<T> x = load_pack(a + i), y = load_pack(b + (same ? i : i % nb));
            Pack<T> o;
            for (int j = 0; j < V; ++j) o.e[j] = from_f32<T>(f(to_f32(x.e[j]), to_f32(y.e[j])));
            store_pack(out + i, o);
        });
}

// A warp's loop over the c elements of a row (the row kernels: one warp per row): with `packed`
// (c a multiple of V and every row operand's base 16-byte aligned, so every row is), `vec(i)`
// for the packs i..i+V−1 the lane owns — i = lane·V, then a warp's V·warpSize further on —
// else `one(i)` for i = lane, lane + warpSize, …. Both visit every element once; the order of
// a lane's partial sums differs (a row's sums agree to rounding, not bits).
template <int V, typename One, typename Vec>
__device__ __forceinline__ void warp_row_packed(int c, bool packed, One one, Vec vec) {
    if (packed) {
        for (int i = lane_id() * V; i < c; i += warpSize * V) vec(i);
    } else {
        for (int i = lane_id(); i < c; i += warpSize) one(i);
    }
}

// ---------------------------------------------------------------- tensor cores (NVIDIA sm_80+, and the host harness)
// mma.sync m16n8k16 with f16/bf16 operands and f32 accumulation, and ldmatrix, as inline PTX:
// their fragment layouts are the PTX ISA's (§9.7.14.5.8, §9.7.14.5.15), which the host harness
// emulates element for element (simt/tensor_core.cpp) — nvcuda::wmma's are unspecified. Every
// lane of the warp calls them together (`.aligned`); warp size 32 only, so kernels using them
// are NVIDIA-only: their names contain `_mma_` and the AMD build leaves them out.
//
// Fragments (g = lane / 4, t = lane % 4; two 16-bit elements per register, the lower column or
// row index in the low half):
// - MmaA, A 16×16 row-major: r0 (g, 2t..2t+1), r1 (g+8, 2t..), r2 (g, 2t+8..), r3 (g+8, 2t+8..);
// - MmaB, B 16×8 (k × n): r0 (k 2t..2t+1, n g), r1 (k 2t+8.., n g);
// - MmaAcc, C/D 16×8 f32: c0, c1 (g, 2t..2t+1), c2, c3 (g+8, 2t..2t+1).
// An S accumulator pair covering columns 16j..16j+15 (two n-tiles) is an A fragment of the next
// product once packed: r0 = (tile 2j c0, c1), r1 = (2j c2, c3), r2 = (2j+1 c0, c1),
// r3 = (2j+1 c2, c3) — FlashAttention's P·V without a trip through shared memory.
#if defined(ORT_HAS_MMA)
struct MmaA {
    unsigned r[4];
};
struct MmaB {
    unsigned r[2];
};
struct MmaAcc {
    float c[4];
};

#if defined(ORTBENCH_SIMT_HOST)
template <typename T>
inline unsigned pack_half2(float lo, float hi) {
    return (unsigned)from_f32<T>(lo).bits | ((unsigned)from_f32<T>(hi).bits << 16);
}
// acc += a·b (T = f16_t or bf16_t: the operands' type).
template <typename T>
inline void mma_16816(MmaAcc& acc, const MmaA& a, const MmaB& b, std::source_location where = std::source_location::current()) {
    static_assert(std::is_same_v<T, f16_t> || std::is_same_v<T, bf16_t>, "mma.sync takes f16 or bf16 operands");
    simt::mma_m16n8k16(std::is_same_v<T, bf16_t>, acc.c, a.r, b.r, where);
}
// ldmatrix .m8n8 .x4 / .x2, plain or .trans: `row` is this lane's row address in shared memory
// (lanes 8i..8i+7 give matrix i's rows 0..7; 16-byte aligned).
inline void ldmatrix_x4(unsigned* r, const void* row, std::source_location where = std::source_location::current()) { simt::ldmatrix(4, false, r, row, where); }
inline void ldmatrix_x4_trans(unsigned* r, const void* row, std::source_location where = std::source_location::current()) { simt::ldmatrix(4, true, r, row, where); }
inline void ldmatrix_x2(unsigned* r, const void* row, std::source_location where = std::source_location::current()) { simt::ldmatrix(2, false, r, row, where); }
inline void ldmatrix_x2_trans(unsigned* r, const void* row, std::source_location where = std::source_location::current()) { simt::ldmatrix(2, true, r, row, where); }
#else
template <typename T> __device__ __forceinline__ unsigned pack_half2(float lo, float hi);
template <> __device__ __forceinline__ unsigned pack_half2<bf16_t>(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<unsigned*>(&h);
}
template <> __device__ __forceinline__ unsigned pack_half2<f16_t>(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<unsigned*>(&h);
}
template <typename T> __device__ __forceinline__ void mma_16816(MmaAcc& acc, const MmaA& a, const MmaB& b);
template <> __device__ __forceinline__ void mma_16816<bf16_t>(MmaAcc& acc, const MmaA& a, const MmaB& b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(acc.c[0]), "+f"(acc.c[1]), "+f"(acc.c[2]), "+f"(acc.c[3])
                 : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "r"(b.r[0]), "r"(b.r[1]));
}
template <> __device__ __forceinline__ void mma_16816<f16_t>(MmaAcc& acc, const MmaA& a, const MmaB& b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(acc.c[0]), "+f"(acc.c[1]), "+f"(acc.c[2]), "+f"(acc.c[3])
                 : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "r"(b.r[0]), "r"(b.r[1]));
}
__device__ __forceinline__ unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void ldmatrix_x4(unsigned* r, const void* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n" : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(row)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned* r, const void* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n" : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(row)));
}
__device__ __forceinline__ void ldmatrix_x2(unsigned* r, const void* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(smem_addr(row)));
}
__device__ __forceinline__ void ldmatrix_x2_trans(unsigned* r, const void* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(smem_addr(row)));
}
#endif
#endif
