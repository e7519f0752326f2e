// Fused scaled dot-product attention on tensor cores (mma.sync m16n8k16, f16/bf16 operands, f32
// accumulation): out = dropout(softmax(scale·Q·Kᵀ + mask))·V, FlashAttention-2 style (Dao 2023,
// algorithms 1 and 2; the warp layout of the FlashAttention-2 CUDA kernels). The same operands,
// strides and semantics as attention.cu — which stays as the f32 path, the AMD path and this
// file's second reference — so the launcher picks one or the other
// (exec/gpu/launch/attention.rs). CPU counterpart: engine/src/backend/cpu/kernels/attention.rs.
// NVIDIA-only (mma.sync, warp size 32): kernel names carry `_mma_`, and the AMD build compiles
// this file to nothing.
//
// Layout. Head size D = Dv is a template parameter (16, 32, 64, 80, 96, 128: multiples of the
// mma's k = 16), so fragment arrays live in registers. A block is 4 warps; a warp owns 16 rows
// of every tile product (its 16 queries in the forward and dq, its 16 keys in dkdv). Tiles sit
// in shared memory as T with a row pitch of D + 8 elements, so the 8 row addresses of an
// ldmatrix fall in 8 different 16-byte bank groups; loads are 16-byte vectors when the
// operand's rows are 16-byte aligned, element by element otherwise.
// - Forward: one block per (batch·head, 64 queries). Q's A fragments are loaded once into
//   registers; K/V tiles of 64 keys stream through shared memory; S = Q·Kᵀ (16 × 64 per warp),
//   scale, mask, the online softmax per row on the accumulators (row max and sum over the 4
//   lanes that share a row: two shuffles), then P (rounded to T, as FlashAttention does) goes
//   from accumulator to A fragment in registers and O += P·V. Writes O and the rows' softmax
//   statistics (m, log l) (attention.cu: why not their sum, the LSE).
// - Backward: `attention_mma_backward_dq` (one block per 64 queries, key tiles of 32: recomputes
//   P = exp((s − m) − log l), dP = dO·Vᵀ, dS = P ⊙ (dP − delta), dQ += dS·K; writes delta = rowsum(dO ⊙ O)
//   first), then `attention_mma_backward_dkdv` (one block per (batch·K/V head, 64 keys), query
//   tiles of 32 of every query head of the group: Sᵀ = K·Qᵀ, dV += Pᵀ·dO, dPᵀ = V·dOᵀ,
//   dK += dSᵀ·Q). No atomics: every run gives the same bits.
#include "port.cuh"

// (m16n8k16 with bf16 operands needs sm_80: for older NVIDIA targets the file is empty too.)
#if defined(ORT_HAS_MMA) && (!defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800)

struct AttnStrides {
    long long sb, sh, st;
};
struct MaskStrides {
    long long sb, sh, sq, sk;
};

constexpr int MMA_WARPS = 4;
constexpr int MMA_ROWS = 16 * MMA_WARPS;  // queries per forward/dq block, keys per dkdv block
constexpr int MMA_BN_FWD = 64;            // keys per forward tile
constexpr int MMA_BN_BWD = 32;            // keys (dq) or queries (dkdv) per backward tile

__device__ __forceinline__ int mma_min(int a, int b) { return a < b ? a : b; }

// Rows [0, rows) of a (·, D) operand (row pitch `st` elements) into shared memory (pitch D + 8),
// rows [rows, tile_rows) zero. 16-byte vectors when the source rows are 16-byte aligned.
template <typename T, int D>
__device__ __forceinline__ void mma_load_tile(T* dst, const T* src, long long st, int rows, int tile_rows) {
    constexpr int P = D + 8, V = 16 / (int)sizeof(T);
    const bool vec = ((unsigned long long)src % 16 == 0) && (st % V == 0);
    if (vec) {
        for (int idx = threadIdx.x; idx < tile_rows * (D / V); idx += blockDim.x) {
            const int r = idx / (D / V), c = (idx % (D / V)) * V;
            const uint4 x = r < rows ? load16(src + (long long)r * st + c) : uint4{0u, 0u, 0u, 0u};
            store16(dst + r * P + c, x);
        }
    } else {
        for (int idx = threadIdx.x; idx < tile_rows * D; idx += blockDim.x) {
            const int r = idx / D, c = idx % D;
            dst[r * P + c] = r < rows ? src[(long long)r * st + c] : from_f32<T>(0.0f);
        }
    }
}

// Fragments from a tile in shared memory (pitch P elements):
// A: rows [r0, r0 + 16) × columns [c0, c0 + 16).
template <typename T, int P>
__device__ __forceinline__ MmaA mma_frag_a(const T* tile, int r0, int c0) {
    const int l = lane_id();
    MmaA a;
    ldmatrix_x4(a.r, tile + (r0 + (l & 15)) * P + c0 + (l >> 4) * 8);
    return a;
}
// B of two n-tiles from a tile whose rows are n and columns k (Kᵀ from K): n [n0, n0 + 16),
// k [k0, k0 + 16); b0 covers n0.., b1 n0 + 8...
template <typename T, int P>
__device__ __forceinline__ void mma_frag_b_nk(const T* tile, int n0, int k0, MmaB& b0, MmaB& b1) {
    const int l = lane_id();
    unsigned r[4];
    ldmatrix_x4(r, tile + (n0 + (l & 7) + ((l >> 4) << 3)) * P + k0 + ((l >> 3) & 1) * 8);
    b0 = MmaB{{r[0], r[1]}};
    b1 = MmaB{{r[2], r[3]}};
}
// B of two n-tiles from a tile whose rows are k and columns n (V as is): k [k0, k0 + 16),
// n [n0, n0 + 16), through ldmatrix .trans.
template <typename T, int P>
__device__ __forceinline__ void mma_frag_b_kn(const T* tile, int k0, int n0, MmaB& b0, MmaB& b1) {
    const int l = lane_id();
    unsigned r[4];
    ldmatrix_x4_trans(r, tile + (k0 + (l & 7) + ((l >> 3) & 1) * 8) * P + n0 + (l >> 4) * 8);
    b0 = MmaB{{r[0], r[1]}};
    b1 = MmaB{{r[2], r[3]}};
}
// One k-step of a product whose B is a tile's rows read as columns (S = Q·Kᵀ):
// acc[0, 2·NP) (16 × 16·NP) += a (16 × 16) · tile[rows 0..16·NP, columns k0..k0 + 16)ᵀ.
template <typename T, int P, int NP>
__device__ __forceinline__ void mma_step_tile_t(MmaAcc* acc, const MmaA& a, const T* tile, int k0) {
#pragma unroll
    for (int j = 0; j < NP; ++j) {
        MmaB b0, b1;
        mma_frag_b_nk<T, P>(tile, 16 * j, k0, b0, b1);
        mma_16816<T>(acc[2 * j], a, b0);
        mma_16816<T>(acc[2 * j + 1], a, b1);
    }
}
// One k-step of a product whose B is a tile as it is (O += P·V):
// acc[0, 2·NP) (16 × 16·NP) += a (16 × 16) · tile[rows k0..k0 + 16, columns 0..16·NP).
template <typename T, int P, int NP>
__device__ __forceinline__ void mma_step_tile(MmaAcc* acc, const MmaA& a, const T* tile, int k0) {
#pragma unroll
    for (int x = 0; x < NP; ++x) {
        MmaB b0, b1;
        mma_frag_b_kn<T, P>(tile, k0, 16 * x, b0, b1);
        mma_16816<T>(acc[2 * x], a, b0);
        mma_16816<T>(acc[2 * x + 1], a, b1);
    }
}

// Accumulators of n-tiles 2j, 2j + 1 (16 columns) as the A fragment of the next product (their
// columns become its k): port.cuh's fragment note.
template <typename T>
__device__ __forceinline__ MmaA mma_acc_to_a(const MmaAcc& lo, const MmaAcc& hi) {
    return MmaA{{pack_half2<T>(lo.c[0], lo.c[1]), pack_half2<T>(lo.c[2], lo.c[3]), pack_half2<T>(hi.c[0], hi.c[1]), pack_half2<T>(hi.c[2], hi.c[3])}};
}

// s = scale·acc [soft-capped: port.cuh `attn_softcap`, its slope in `slope`] + mask for query
// i, key j; −∞ where masked: past the valid keys (kend), past the causal limit, or a row past
// Tq.
template <typename T>
__device__ __forceinline__ float mma_score(float acc, float scale, float cap, const T* mb, const MaskStrides& ms, int i, int j, int tq, int kend, int causal,
                                           float& slope) {
    slope = 1.0f;
    if (i >= tq || j >= kend || (causal && j > i)) return neg_inf();
    float s = attn_softcap(acc * scale, cap, slope);
    if (mb) s += to_f32(mb[(long long)i * ms.sq + (long long)j * ms.sk]);
    return s;
}

// The 4 lanes of a fragment row group (lanes 4g..4g + 3) combine.
__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, port_shfl_xor(v, 1));
    return fmaxf(v, port_shfl_xor(v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
    v += port_shfl_xor(v, 1);
    return v + port_shfl_xor(v, 2);
}

// ---------------------------------------------------------------- forward

// Shared memory: 2·64·(D + 8) elements of T (Q is staged in the K tile's place first).
// Grid: B·H·ceil(Tq / 64) blocks of 128 threads. out: (B, H, Tq, D) strided (os); stats: (B, H,
// Tq, 2) f32 contiguous, (m, log l) per row; q: (B, H, Tq, D); k, v: (B, Hkv, Tk, D) strided (query head h reads K/V
// head h / (H / Hkv)); mask: broadcast to (B, H, Tq, Tk) or null. As attention.cu's forward.
template <typename T, int D>
__device__ void attention_mma_forward(T* out, float* stats, const T* q, const T* k, const T* v, const T* mask, int h, int hkv, int tq, int tk, float scale,
                                      float cap, int causal, float dropout_p, unsigned long long seed, unsigned long long offset, AttnStrides qs, AttnStrides ks,
                                      AttnStrides vs, AttnStrides os, MaskStrides ms) {
    constexpr int P = D + 8, BN = MMA_BN_FWD, KD = D / 16, NS = BN / 8, NO = D / 8;
    DYN_SHARED(T, sm);
    T* k_s = sm;           // (BN, P); Q's (64, P) first
    T* v_s = k_s + BN * P; // (BN, P)

    const int nqt = (tq + MMA_ROWS - 1) / MMA_ROWS;
    const int bh = blockIdx.x / nqt, q0 = (blockIdx.x % nqt) * MMA_ROWS;
    const int bi = bh / h, hi = bh % h, hk = hi / (h / hkv);
    const int rows = mma_min(MMA_ROWS, tq - q0);
    const int w = warp_id(), lane = lane_id(), g = lane >> 2, t = lane & 3;
    const T* kb = k + bi * ks.sb + hk * ks.sh;
    const T* vb = v + bi * vs.sb + hk * vs.sh;
    const T* mb = mask ? mask + bi * ms.sb + hi * ms.sh : nullptr;
    const bool drop = dropout_p > 0.0f;
    const DropMask dm = drop_mask(dropout_p, seed);

    mma_load_tile<T, D>(k_s, q + bi * qs.sb + hi * qs.sh + (long long)q0 * qs.st, qs.st, rows, MMA_ROWS);
    __syncthreads();
    MmaA qf[KD];
#pragma unroll
    for (int kk = 0; kk < KD; ++kk) qf[kk] = mma_frag_a<T, P>(k_s, 16 * w, 16 * kk);
    // This lane's two rows: 16w + g and 16w + g + 8 of the tile.
    const int i0 = q0 + 16 * w + g, i1 = i0 + 8;
    float m[2] = {neg_inf(), neg_inf()}, l[2] = {0.0f, 0.0f};  // l: this lane's part of the row sum
    MmaAcc o[NO];
#pragma unroll
    for (int n = 0; n < NO; ++n) o[n] = MmaAcc{{0.0f, 0.0f, 0.0f, 0.0f}};

    const int kend = causal ? mma_min(q0 + rows, tk) : tk;
    for (int k0 = 0; k0 < kend; k0 += BN) {
        const int kn = mma_min(BN, kend - k0);
        __syncthreads();  // every warp is done with the last tile (or Q's fragments)
        mma_load_tile<T, D>(k_s, kb + (long long)k0 * ks.st, ks.st, kn, BN);
        mma_load_tile<T, D>(v_s, vb + (long long)k0 * vs.st, vs.st, kn, BN);
        __syncthreads();
        MmaAcc s[NS];
#pragma unroll
        for (int n = 0; n < NS; ++n) s[n] = MmaAcc{{0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
        for (int kk = 0; kk < KD; ++kk) mma_step_tile_t<T, P, NS / 2>(s, qf[kk], k_s, 16 * kk);
        // Scores, the rows' new max, and the rescale of what came before.
        float mx[2] = {neg_inf(), neg_inf()};
#pragma unroll
        for (int n = 0; n < NS; ++n)
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const int i = c < 2 ? i0 : i1, j = k0 + 8 * n + 2 * t + (c & 1);
                float slope;
                s[n].c[c] = mma_score(s[n].c[c], scale, cap, mb, ms, i, j, tq, kend, causal, slope);
                mx[c >> 1] = fmaxf(mx[c >> 1], s[n].c[c]);
            }
        float alpha[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const float m_new = fmaxf(m[r], quad_max(mx[r]));
            // Every key so far masked: keep m = −∞ and add nothing (no −∞ − −∞).
            alpha[r] = m_new == neg_inf() ? 1.0f : expf(m[r] - m_new);
            m[r] = m_new;
            l[r] *= alpha[r];
        }
        // P = exp(s − m) (the softmax's sum before dropout), then dropped as the CPU drops it.
#pragma unroll
        for (int n = 0; n < NS; ++n)
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const int r = c >> 1, i = r ? i1 : i0, j = k0 + 8 * n + 2 * t + (c & 1);
                float e = m[r] == neg_inf() ? 0.0f : expf(s[n].c[c] - m[r]);
                l[r] += e;
                if (drop && e != 0.0f)
                    e = drop_keep(dm, offset + ((unsigned long long)bh * tq + (unsigned long long)i) * (unsigned long long)tk + (unsigned long long)j) ? e * dm.scale : 0.0f;
                s[n].c[c] = e;
            }
#pragma unroll
        for (int n = 0; n < NO; ++n)
#pragma unroll
            for (int c = 0; c < 4; ++c) o[n].c[c] *= alpha[c >> 1];
        // O += P·V: P's accumulators are the A fragments, 16 keys at a time.
#pragma unroll
        for (int kk = 0; kk < NS / 2; ++kk) mma_step_tile<T, P, NO / 2>(o, mma_acc_to_a<T>(s[2 * kk], s[2 * kk + 1]), v_s, 16 * kk);
    }
    T* ob = out + bi * os.sb + hi * os.sh;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const float sum = quad_sum(l[r]);
        const int i = r ? i1 : i0;
        if (i >= tq) continue;
        const float inv = m[r] == neg_inf() ? 0.0f : 1.0f / sum;
#pragma unroll
        for (int n = 0; n < NO; ++n) {
            const int c = 8 * n + 2 * t;
            ob[(long long)i * os.st + c] = from_f32<T>(o[n].c[2 * r] * inv);
            ob[(long long)i * os.st + c + 1] = from_f32<T>(o[n].c[2 * r + 1] * inv);
        }
        // No visible key: (+∞, 0), so that the backward's P is 0 there too.
        if (t == 0)
            reinterpret_cast<RowStats*>(stats)[(long long)bh * tq + i] = m[r] == neg_inf() ? RowStats{-neg_inf(), 0.0f} : RowStats{m[r], logf(sum)};
    }
}

// ---------------------------------------------------------------- backward

// P and dS of one accumulator element for query i, key j (attention.cu's `attn_ds_tile`):
// P = exp((s − m) − log l), Pd = dropout(P), dS = P ⊙ (dPd·dropout − delta)·scale [· the soft-cap's
// slope]. `acc` is q·k,
// `dpd` is dO·v; masked elements give P = dS = 0 (s = −∞; a row with no key has m = +∞).
template <typename T>
__device__ __forceinline__ void mma_p_ds(float acc, float dpd, float m_i, float logl_i, float del_i, float scale, float cap, const T* mb, const MaskStrides& ms, int i, int j,
                                         int tq, int kend, int causal, bool drop, const DropMask& dm, unsigned long long row_ctr, float& pd, float& ds) {
    float slope;
    const float p = expf((mma_score(acc, scale, cap, mb, ms, i, j, tq, kend, causal, slope) - m_i) - logl_i);
    pd = p;
    if (drop) {
        const bool keep = p != 0.0f && drop_keep(dm, row_ctr + (unsigned long long)j);
        pd = keep ? p * dm.scale : 0.0f;
        dpd = keep ? dpd * dm.scale : 0.0f;
    }
    ds = p * (dpd - del_i) * scale * slope;
}

// Shared memory: 2·32·(D + 8) elements of T (Q, then dO, staged in their place first), then
// 64 floats (delta). Grid: B·H·ceil(Tq / 64) blocks of 128 threads. dq: (B, H, Tq, D)
// strided; delta: (B, H, Tq) f32 contiguous, written for the dkdv kernel (launched next);
// dout, out: (B, H, Tq, D) strided (gs, os); the rest as the forward. As attention.cu's dq.
template <typename T, int D>
__device__ void attention_mma_backward_dq(T* dq, float* delta, const T* dout, const T* out, const T* q, const T* k, const T* v, const T* mask,
                                          const float* stats, int h, int hkv, int tq, int tk, float scale, float cap, int causal, float dropout_p,
                                          unsigned long long seed, unsigned long long offset, AttnStrides qs, AttnStrides ks, AttnStrides vs,
                                          AttnStrides gs, AttnStrides os, AttnStrides dqs, MaskStrides ms) {
    constexpr int P = D + 8, BN = MMA_BN_BWD, KD = D / 16, NS = BN / 8, NO = D / 8;
    DYN_SHARED(T, sm);
    T* k_s = sm;                                             // (BN, P); Q's, then dO's (64, P) first
    T* v_s = k_s + BN * P;                                   // (BN, P)
    float* del_s = reinterpret_cast<float*>(v_s + BN * P);  // (64)

    const int nqt = (tq + MMA_ROWS - 1) / MMA_ROWS;
    const int bh = blockIdx.x / nqt, q0 = (blockIdx.x % nqt) * MMA_ROWS;
    const int bi = bh / h, hi = bh % h, hk = hi / (h / hkv);
    const int rows = mma_min(MMA_ROWS, tq - q0);
    const int w = warp_id(), lane = lane_id(), g = lane >> 2, t = lane & 3;
    const T* kb = k + bi * ks.sb + hk * ks.sh;
    const T* vb = v + bi * vs.sb + hk * vs.sh;
    const T* gb = dout + bi * gs.sb + hi * gs.sh + (long long)q0 * gs.st;
    const T* ob = out + bi * os.sb + hi * os.sh + (long long)q0 * os.st;
    const T* mb = mask ? mask + bi * ms.sb + hi * ms.sh : nullptr;
    const bool drop = dropout_p > 0.0f;
    const DropMask dm = drop_mask(dropout_p, seed);

    // delta_i = Σ_c dO_ic·O_ic from O as stored, one thread per row.
    for (int r = threadIdx.x; r < MMA_ROWS; r += blockDim.x) {
        float s = 0.0f;
        if (r < rows) {
            for (int c = 0; c < D; ++c) s = fmaf(to_f32(gb[(long long)r * gs.st + c]), to_f32(ob[(long long)r * os.st + c]), s);
            delta[(long long)bh * tq + q0 + r] = s;
        }
        del_s[r] = s;
    }
    MmaA qf[KD], gf[KD];
    mma_load_tile<T, D>(k_s, q + bi * qs.sb + hi * qs.sh + (long long)q0 * qs.st, qs.st, rows, MMA_ROWS);
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < KD; ++kk) qf[kk] = mma_frag_a<T, P>(k_s, 16 * w, 16 * kk);
    __syncthreads();
    mma_load_tile<T, D>(k_s, gb, gs.st, rows, MMA_ROWS);
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < KD; ++kk) gf[kk] = mma_frag_a<T, P>(k_s, 16 * w, 16 * kk);
    const int i0 = q0 + 16 * w + g, i1 = i0 + 8;
    // This lane's rows' (m, log l); rows past Tq as rows with no key.
    const RowStats* rs = reinterpret_cast<const RowStats*>(stats) + (long long)bh * tq;
    const RowStats st_r[2] = {i0 < tq ? rs[i0] : RowStats{-neg_inf(), 0.0f}, i1 < tq ? rs[i1] : RowStats{-neg_inf(), 0.0f}};
    const float del_r[2] = {del_s[16 * w + g], del_s[16 * w + g + 8]};  // after the barriers above
    const unsigned long long ctr[2] = {offset + ((unsigned long long)bh * tq + (unsigned long long)i0) * (unsigned long long)tk,
                                       offset + ((unsigned long long)bh * tq + (unsigned long long)i1) * (unsigned long long)tk};
    MmaAcc acc[NO];
#pragma unroll
    for (int n = 0; n < NO; ++n) acc[n] = MmaAcc{{0.0f, 0.0f, 0.0f, 0.0f}};

    const int kend = causal ? mma_min(q0 + rows, tk) : tk;
    for (int k0 = 0; k0 < kend; k0 += BN) {
        const int kn = mma_min(BN, kend - k0);
        __syncthreads();  // every warp is done with the last tile (or dO's fragments)
        mma_load_tile<T, D>(k_s, kb + (long long)k0 * ks.st, ks.st, kn, BN);
        mma_load_tile<T, D>(v_s, vb + (long long)k0 * vs.st, vs.st, kn, BN);
        __syncthreads();
        MmaAcc s[NS], dp[NS];
#pragma unroll
        for (int n = 0; n < NS; ++n) s[n] = dp[n] = MmaAcc{{0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
        for (int kk = 0; kk < KD; ++kk) {
            mma_step_tile_t<T, P, NS / 2>(s, qf[kk], k_s, 16 * kk);
            mma_step_tile_t<T, P, NS / 2>(dp, gf[kk], v_s, 16 * kk);
        }
#pragma unroll
        for (int n = 0; n < NS; ++n)
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const int r = c >> 1, i = r ? i1 : i0, j = k0 + 8 * n + 2 * t + (c & 1);
                float pd, ds;
                mma_p_ds(s[n].c[c], dp[n].c[c], st_r[r].m, st_r[r].logl, del_r[r], scale, cap, mb, ms, i, j, tq, kend, causal, drop, dm, ctr[r], pd, ds);
                s[n].c[c] = ds;
            }
        // dQ += dS·K: dS's accumulators are the A fragments, 16 keys at a time.
#pragma unroll
        for (int kk = 0; kk < NS / 2; ++kk) mma_step_tile<T, P, NO / 2>(acc, mma_acc_to_a<T>(s[2 * kk], s[2 * kk + 1]), k_s, 16 * kk);
    }
    T* dqb = dq + bi * dqs.sb + hi * dqs.sh;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int i = r ? i1 : i0;
        if (i >= tq) continue;
#pragma unroll
        for (int n = 0; n < NO; ++n) {
            dqb[(long long)i * dqs.st + 8 * n + 2 * t] = from_f32<T>(acc[n].c[2 * r]);
            dqb[(long long)i * dqs.st + 8 * n + 2 * t + 1] = from_f32<T>(acc[n].c[2 * r + 1]);
        }
    }
}

// Shared memory: (2·64 + 2·32)·(D + 8) elements of T, then 3·32 floats (the rows' (m, log l), delta).
// Grid: B·Hkv·ceil(Tk / 64) blocks of 128 threads. dk, dv: (B, Hkv, Tk, D) strided; the rest
// as the dq kernel's; delta from it. As attention.cu's dkdv: each block sums the query heads of
// its K/V head in head order, so grouped-query attention needs no atomics either.
template <typename T, int D>
__device__ void attention_mma_backward_dkdv(T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* mask, const float* stats,
                                            const float* delta, int h, int hkv, int tq, int tk, float scale, float cap, int causal, float dropout_p,
                                            unsigned long long seed, unsigned long long offset, AttnStrides qs, AttnStrides ks, AttnStrides vs,
                                            AttnStrides gs, AttnStrides dks, AttnStrides dvs, MaskStrides ms) {
    constexpr int P = D + 8, BQ = MMA_BN_BWD, KD = D / 16, NQ = BQ / 8, NO = D / 8;
    DYN_SHARED(T, sm);
    T* k_s = sm;                                              // (64, P)
    T* v_s = k_s + MMA_ROWS * P;                              // (64, P)
    T* q_s = v_s + MMA_ROWS * P;                              // (BQ, P)
    T* g_s = q_s + BQ * P;                                    // (BQ, P): dO
    RowStats* stat_s = reinterpret_cast<RowStats*>(g_s + BQ * P);  // (BQ)
    float* del_s = reinterpret_cast<float*>(stat_s + BQ);           // (BQ)

    const int nkt = (tk + MMA_ROWS - 1) / MMA_ROWS;
    const int bkv = blockIdx.x / nkt, k0 = (blockIdx.x % nkt) * MMA_ROWS;
    const int bi = bkv / hkv, hk = bkv % hkv, group = h / hkv;
    const int kn = mma_min(MMA_ROWS, tk - k0);
    const int w = warp_id(), lane = lane_id(), g = lane >> 2, t = lane & 3;
    const bool drop = dropout_p > 0.0f;
    const DropMask dm = drop_mask(dropout_p, seed);

    mma_load_tile<T, D>(k_s, k + bi * ks.sb + hk * ks.sh + (long long)k0 * ks.st, ks.st, kn, MMA_ROWS);
    mma_load_tile<T, D>(v_s, v + bi * vs.sb + hk * vs.sh + (long long)k0 * vs.st, vs.st, kn, MMA_ROWS);
    const int j0 = k0 + 16 * w + g, j1 = j0 + 8;  // this lane's two keys
    MmaAcc dka[NO], dva[NO];
#pragma unroll
    for (int n = 0; n < NO; ++n) dka[n] = dva[n] = MmaAcc{{0.0f, 0.0f, 0.0f, 0.0f}};
    // Causal: queries before k0 see none of these keys; start at the tile holding query k0.
    const int qstart = causal ? (k0 / BQ) * BQ : 0;
    for (int hi = hk * group; hi < (hk + 1) * group; ++hi) {
        const int bh = bi * h + hi;
        const T* qb = q + bi * qs.sb + hi * qs.sh;
        const T* gb = dout + bi * gs.sb + hi * gs.sh;
        const T* mb = mask ? mask + bi * ms.sb + hi * ms.sh : nullptr;
        for (int q0 = qstart; q0 < tq; q0 += BQ) {
            const int rows = mma_min(BQ, tq - q0);
            __syncthreads();  // every warp is done with the last query tile (K, V are in)
            mma_load_tile<T, D>(q_s, qb + (long long)q0 * qs.st, qs.st, rows, BQ);
            mma_load_tile<T, D>(g_s, gb + (long long)q0 * gs.st, gs.st, rows, BQ);
            for (int r = threadIdx.x; r < BQ; r += blockDim.x) {
                const RowStats* rs = reinterpret_cast<const RowStats*>(stats) + (long long)bh * tq + q0;
                stat_s[r] = r < rows ? rs[r] : RowStats{-neg_inf(), 0.0f};
                del_s[r] = r < rows ? delta[(long long)bh * tq + q0 + r] : 0.0f;
            }
            __syncthreads();
            // Sᵀ = K·Qᵀ and dPdᵀ = V·dOᵀ: this warp's 16 keys × BQ queries.
            MmaAcc st[NQ], dpt[NQ];
#pragma unroll
            for (int n = 0; n < NQ; ++n) st[n] = dpt[n] = MmaAcc{{0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
            for (int kk = 0; kk < KD; ++kk) {
                mma_step_tile_t<T, P, NQ / 2>(st, mma_frag_a<T, P>(k_s, 16 * w, 16 * kk), q_s, 16 * kk);
                mma_step_tile_t<T, P, NQ / 2>(dpt, mma_frag_a<T, P>(v_s, 16 * w, 16 * kk), g_s, 16 * kk);
            }
#pragma unroll
            for (int n = 0; n < NQ; ++n)
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    const int j = c < 2 ? j0 : j1, r = 8 * n + 2 * t + (c & 1), i = q0 + r;
                    const unsigned long long row_ctr = offset + ((unsigned long long)bh * tq + (unsigned long long)i) * (unsigned long long)tk;
                    float pd, ds;
                    const RowStats rs = stat_s[r];
                    mma_p_ds(st[n].c[c], dpt[n].c[c], rs.m, rs.logl, del_s[r], scale, cap, mb, ms, i, j, tq, tk, causal, drop, dm, row_ctr, pd, ds);
                    st[n].c[c] = pd;
                    dpt[n].c[c] = ds;
                }
            // dV += Pdᵀ·dO and dK += dSᵀ·Q, 16 queries at a time.
#pragma unroll
            for (int kk = 0; kk < NQ / 2; ++kk) {
                mma_step_tile<T, P, NO / 2>(dva, mma_acc_to_a<T>(st[2 * kk], st[2 * kk + 1]), g_s, 16 * kk);
                mma_step_tile<T, P, NO / 2>(dka, mma_acc_to_a<T>(dpt[2 * kk], dpt[2 * kk + 1]), q_s, 16 * kk);
            }
        }
    }
    T* dkb = dk + bi * dks.sb + hk * dks.sh;
    T* dvb = dv + bi * dvs.sb + hk * dvs.sh;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int j = r ? j1 : j0;
        if (j >= tk) continue;
#pragma unroll
        for (int n = 0; n < NO; ++n) {
            const int c = 8 * n + 2 * t;
            dkb[(long long)j * dks.st + c] = from_f32<T>(dka[n].c[2 * r]);
            dkb[(long long)j * dks.st + c + 1] = from_f32<T>(dka[n].c[2 * r + 1]);
            dvb[(long long)j * dvs.st + c] = from_f32<T>(dva[n].c[2 * r]);
            dvb[(long long)j * dvs.st + c + 1] = from_f32<T>(dva[n].c[2 * r + 1]);
        }
    }
}

// ---------------------------------------------------------------- kernels
// Scalars as attention.cu's (scale, cap, causal, …), without d, dv (the name's D) and the tiles (fixed here).
#define ATTENTION_MMA(S, T, D)                                                                                                                    \
    ORT_KERNEL(attention_mma_forward_##S##_d##D)(T * out, float* stats, const T* q, const T* k, const T* v, const T* mask, int h, int hkv, int tq,   \
                                                 int tk, float scale, float cap, int causal, float dropout_p, unsigned long long seed,                      \
                                                 unsigned long long offset, const StepBlock* step, long long q_sb, long long q_sh, long long q_st, long long k_sb,      \
                                                 long long k_sh, long long k_st, long long v_sb, long long v_sh, long long v_st, long long o_sb, \
                                                 long long o_sh, long long o_st, long long m_sb, long long m_sh, long long m_sq, long long m_sk) { \
        attention_mma_forward<T, D>(out, stats, q, k, v, mask, h, hkv, tq, tk, scale, cap, causal, dropout_p, step ? step->seed : seed, offset, AttnStrides{q_sb, q_sh, q_st},  \
                                    AttnStrides{k_sb, k_sh, k_st}, AttnStrides{v_sb, v_sh, v_st}, AttnStrides{o_sb, o_sh, o_st},                   \
                                    MaskStrides{m_sb, m_sh, m_sq, m_sk});                                                                        \
    }                                                                                                                                             \
    ORT_REGISTER(attention_mma_forward_##S##_d##D)                                                                                           \
    ORT_KERNEL(attention_mma_backward_dq_##S##_d##D)(T * dq, float* delta, const T* dout, const T* out, const T* q, const T* k, const T* v,      \
                                                     const T* mask, const float* stats, int h, int hkv, int tq, int tk, float scale, float cap, int causal,    \
                                                     float dropout_p, unsigned long long seed, unsigned long long offset, const StepBlock* step, long long q_sb,         \
                                                     long long q_sh, long long q_st, long long k_sb, long long k_sh, long long k_st,             \
                                                     long long v_sb, long long v_sh, long long v_st, long long g_sb, long long g_sh,             \
                                                     long long g_st, long long o_sb, long long o_sh, long long o_st, long long dq_sb,            \
                                                     long long dq_sh, long long dq_st, long long m_sb, long long m_sh, long long m_sq,           \
                                                     long long m_sk) {                                                                          \
        attention_mma_backward_dq<T, D>(dq, delta, dout, out, q, k, v, mask, stats, h, hkv, tq, tk, scale, cap, causal, dropout_p, step ? step->seed : seed, offset,          \
                                        AttnStrides{q_sb, q_sh, q_st}, AttnStrides{k_sb, k_sh, k_st}, AttnStrides{v_sb, v_sh, v_st},              \
                                        AttnStrides{g_sb, g_sh, g_st}, AttnStrides{o_sb, o_sh, o_st}, AttnStrides{dq_sb, dq_sh, dq_st},           \
                                        MaskStrides{m_sb, m_sh, m_sq, m_sk});                                                                    \
    }                                                                                                                                             \
    ORT_REGISTER(attention_mma_backward_dq_##S##_d##D)                                                                                            \
    ORT_KERNEL(attention_mma_backward_dkdv_##S##_d##D)(T * dk, T * dv, const T* dout, const T* q, const T* k, const T* v, const T* mask,         \
                                                       const float* stats, const float* delta, int h, int hkv, int tq, int tk, float scale,        \
                                                       float cap, int causal, float dropout_p, unsigned long long seed, unsigned long long offset, const StepBlock* step,          \
                                                       long long q_sb, long long q_sh, long long q_st, long long k_sb, long long k_sh,           \
                                                       long long k_st, long long v_sb, long long v_sh, long long v_st, long long g_sb,           \
                                                       long long g_sh, long long g_st, long long dk_sb, long long dk_sh, long long dk_st,        \
                                                       long long dv_sb, long long dv_sh, long long dv_st, long long m_sb, long long m_sh,        \
                                                       long long m_sq, long long m_sk) {                                                        \
        attention_mma_backward_dkdv<T, D>(dk, dv, dout, q, k, v, mask, stats, delta, h, hkv, tq, tk, scale, cap, causal, dropout_p, step ? step->seed : seed, offset,         \
                                          AttnStrides{q_sb, q_sh, q_st}, AttnStrides{k_sb, k_sh, k_st}, AttnStrides{v_sb, v_sh, v_st},            \
                                          AttnStrides{g_sb, g_sh, g_st}, AttnStrides{dk_sb, dk_sh, dk_st}, AttnStrides{dv_sb, dv_sh, dv_st},      \
                                          MaskStrides{m_sb, m_sh, m_sq, m_sk});                                                                  \
    }                                                                                                                                             \
    ORT_REGISTER(attention_mma_backward_dkdv_##S##_d##D)
#define ATTENTION_MMA_DIMS(S, T) ATTENTION_MMA(S, T, 16) ATTENTION_MMA(S, T, 32) ATTENTION_MMA(S, T, 64) ATTENTION_MMA(S, T, 80) ATTENTION_MMA(S, T, 96) ATTENTION_MMA(S, T, 128)
ATTENTION_MMA_DIMS(f16, f16_t)
ATTENTION_MMA_DIMS(bf16, bf16_t)

#endif
