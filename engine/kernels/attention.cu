// Fused scaled dot-product attention, flash-style: out = dropout(softmax(scale·Q·Kᵀ + mask))·V
// without materialising the (Tq, Tk) probabilities. CPU counterpart (the numbers to match):
// engine/src/backend/cpu/kernels/attention.rs `attention_forward` / `attention_backward`
// (`AttnPlan`), reference op engine/src/ops/attention.rs; after FlashAttention-2 (Dao 2023,
// algorithms 1 and 2) and llm.c's attention kernels.
//
// Tiling. Forward: one block per (batch·head, tile of bq queries). The Q tile is staged once in
// shared memory; K/V tiles of bk keys stream through shared memory; each block keeps per query
// row a running max m, a running sum l (both f32) and an f32 output accumulator, rescaled by
// exp(m_old − m_new) when the max grows (online softmax). Memory is O(bq·(d + dv) + bk·(d + dv)),
// not O(Tq·Tk), and Q·Kᵀ never leaves the chip. The block writes o and, for the backward, the
// per-row softmax statistics (m, log l) (f32, (B, H, Tq, 2)) instead of the probabilities: the
// log-sum-exp m + log l, kept as its two terms, because under a finite mask that dwarfs the
// scores (HF's eager finfo.min) a row with no visible key has m ≈ −3.4e38, which absorbs
// log l — exp(s − (m + log l)) would be 1 where the softmax gave 1/l.
// Backward (two kernels, no floating-point atomics, so every run gives the same bits), launched
// in this order: `attention_backward_dq` is one block per (batch·head, query tile) walking the
// key tiles for dQ; it first computes its rows' delta_i = Σ_c dO_ic·O_ic (= rowsum(dP ⊙ P),
// dropout included: FlashAttention-2's D) and writes them out (f32, (B, H, Tq));
// `attention_backward_dkdv` is one block per (batch·K/V head, key tile) walking the query tiles
// (of every query head of its group, under grouped-query attention) and
// accumulating dK, dV of its keys in shared memory, reading delta. Both recompute
// P = exp((s − m) − log l) and dS with the same device function (same bits).
// Causal blocks skip the key tiles (forward, dq) or query tiles (dkdv) that are entirely masked.
//
// The tile sizes bq, bk are launch arguments (the launcher fits them to the shared memory of
// the device and the head size); the dynamic shared memory each kernel needs, in floats, is
// given above it. Every thread of a block strides over the tile's elements; the per-row
// softmax update is one thread per row (bk exps: small next to the bq·bk·d tile products), so
// the kernels need no warp collective and run unchanged at warp size 32 or 64. Keys are staged with a row pitch of d + 1 (and values
// of dv + 1 where read down a column) so that a warp's threads, which read different key rows,
// hit different banks. Arithmetic is f32 throughout; storage T is read once per tile.
//
// Semantics shared with the CPU kernel: with a soft-cap (cap ≠ 0; Gemma 2) the scores are
// cap·tanh(scale·q·k) (port.cuh `attn_softcap`) and dS takes its slope; causal masks key
// j > query i (top-left aligned, as torch.tril, also for Tq ≠ Tk); the additive mask (storage T, broadcast to (B, H, Tq, Tk)
// through 4 element strides, 0 on a broadcast dim; null for none) is added after the scale; a
// row whose every key is masked (−∞) outputs zeros, as torch's sdpa (`_safe_softmax`), with
// LSE +∞ so that the backward's P = exp(s − LSE) is 0 there too; dropout multiplies
// probability (b, h, i, j) by 0 or 1/(1−p) with counter offset + ((b·H + h)·Tq + i)·Tk + j of
// the engine's RNG (`drop_keep`), so the CPU and every GPU drop the same elements.
#include "port.cuh"

// Strides of a (B, H, T, ·) operand that lives inside (B, T, C) rows (or anywhere else): element
// (b, h, t, c) is at b·sb + h·sh + t·st + c.
struct AttnStrides {
    long long sb, sh, st;
};
// Element strides of the additive mask against (B, H, Tq, Tk); 0 where it broadcasts.
struct MaskStrides {
    long long sb, sh, sq, sk;
};

__device__ __forceinline__ int attn_min(int a, int b) { return a < b ? a : b; }

// `rows` rows of `cols` elements from global (row pitch `gstride`) into shared (row pitch `ld`),
// rows [rows, tile_rows) zero-filled so that whole-tile loops read finite values.
template <typename T>
__device__ __forceinline__ void attn_load_tile(float* dst, int ld, const T* src, long long gstride, int rows, int tile_rows, int cols) {
    for (int idx = threadIdx.x; idx < tile_rows * cols; idx += blockDim.x) {
        const int r = idx / cols, c = idx % cols;
        dst[r * ld + c] = r < rows ? to_f32(src[(long long)r * gstride + c]) : 0.0f;
    }
}

// s = scale·(q·k) [soft-capped] + mask, as the CPU's GEMM with alpha = scale followed by
// `probs_rows`; `slope` gets the soft-cap's ds/du (1 without one) for the backward.
// qr: (d) f32 shared; kr: (d) f32 shared; mask_bh: the mask at (b, h, 0, 0), or null.
template <typename T>
__device__ __forceinline__ float attn_score(const float* qr, const float* kr, int d, float scale, float cap, const T* mask_bh, const MaskStrides& ms, int i, int j,
                                            float& slope) {
    float acc = 0.0f;
    for (int c = 0; c < d; ++c) acc = fmaf(qr[c], kr[c], acc);
    float s = attn_softcap(acc * scale, cap, slope);
    if (mask_bh) s += to_f32(mask_bh[(long long)i * ms.sq + (long long)j * ms.sk]);
    return s;
}

// ---------------------------------------------------------------- forward

// Shared memory (floats): bq·d + bk·(d + 1) + bk·dv + bq·bk + bq·dv + 3·bq.
// Grid: B·H·ceil(Tq / bq) blocks; any block size that is a multiple of the warp size.
// Matches attention.rs `attention_forward` (o) and adds stats, which the CPU does not have (it
// keeps the probabilities instead).
// out: (B, H, Tq, Dv) strided (os); stats: (B, H, Tq, 2) f32 contiguous, (m, log l) per row; q: (B, H, Tq, D) strided;
// k: (B, Hkv, Tk, D) strided; v: (B, Hkv, Tk, Dv) strided (query head h reads K/V head
// h / (H / Hkv), HF's repeat_kv); mask: broadcast to (B, H, Tq, Tk) or null.
template <typename T>
__device__ void attention_forward(T* out, float* stats, const T* q, const T* k, const T* v, const T* mask, int h, int hkv, int tq, int tk, int d, int dv, float scale,
                                  float cap, int causal, float dropout_p, unsigned long long seed, unsigned long long offset, AttnStrides qs, AttnStrides ks, AttnStrides vs,
                                  AttnStrides os, MaskStrides ms, int bq, int bk) {
    DYN_SHARED(float, sm);
    const int ldk = d + 1;
    float* q_s = sm;               // (bq, d)
    float* k_s = q_s + bq * d;     // (bk, d + 1)
    float* v_s = k_s + bk * ldk;   // (bk, dv)
    float* p_s = v_s + bk * dv;    // (bq, bk): scores, then exp(s − m)·dropout
    float* o_s = p_s + bq * bk;    // (bq, dv): Σ exp(s − m)·dropout·v
    float* m_s = o_s + bq * dv;    // (bq): running max
    float* l_s = m_s + bq;         // (bq): running Σ exp(s − m) (before dropout, as the softmax)
    float* a_s = l_s + bq;         // (bq): this tile's rescale factor exp(m_old − m_new)

    const int nqt = (tq + bq - 1) / bq;
    const int bh = blockIdx.x / nqt, q0 = (blockIdx.x % nqt) * bq;
    const int bi = bh / h, hi = bh % h, hk = hi / (h / hkv);  // query head hi reads K/V head hk
    const int rows = attn_min(bq, tq - q0);
    const int tid = threadIdx.x, nt = blockDim.x;
    const T* qb = q + bi * qs.sb + hi * qs.sh + (long long)q0 * qs.st;
    const T* kb = k + bi * ks.sb + hk * ks.sh;
    const T* vb = v + bi * vs.sb + hk * vs.sh;
    const T* mb = mask ? mask + bi * ms.sb + hi * ms.sh : nullptr;
    const bool drop = dropout_p > 0.0f;
    const DropMask dm = drop_mask(dropout_p, seed);

    attn_load_tile(q_s, d, qb, qs.st, rows, bq, d);
    for (int idx = tid; idx < bq * dv; idx += nt) o_s[idx] = 0.0f;
    for (int r = tid; r < bq; r += nt) {
        m_s[r] = neg_inf();
        l_s[r] = 0.0f;
    }
    // Keys this query tile sees: all, or [0, its last query + 1) when causal.
    const int kend = causal ? attn_min(q0 + rows, tk) : tk;
    for (int k0 = 0; k0 < kend; k0 += bk) {
        const int kn = attn_min(bk, kend - k0);
        __syncthreads();  // the previous tile's readers of k_s, v_s, p_s are done (and q_s is in)
        attn_load_tile(k_s, ldk, kb + (long long)k0 * ks.st, ks.st, kn, bk, d);
        attn_load_tile(v_s, dv, vb + (long long)k0 * vs.st, vs.st, kn, bk, dv);
        __syncthreads();
        // Scores; −∞ for keys past the tile, the causal limit or the last query row.
        for (int idx = tid; idx < bq * bk; idx += nt) {
            const int r = idx / bk, j = idx % bk;
            const int i = q0 + r, kj = k0 + j;
            float slope;
            p_s[idx] = (r < rows && j < kn && !(causal && kj > i)) ? attn_score(q_s + r * d, k_s + j * ldk, d, scale, cap, mb, ms, i, kj, slope) : neg_inf();
        }
        __syncthreads();
        // Online softmax update, one thread per query row.
        for (int r = tid; r < bq; r += nt) {
            float* pr = p_s + r * bk;
            float mx = neg_inf();
            for (int j = 0; j < kn; ++j) mx = fmaxf(mx, pr[j]);
            const float m_old = m_s[r];
            const float m_new = fmaxf(m_old, mx);
            // Every key so far masked: keep m = −∞ and add nothing (no exp(−∞ − (−∞)) = NaN).
            const bool none = m_new == neg_inf();
            const float alpha = none ? 1.0f : expf(m_old - m_new);
            float sum = 0.0f;
            const unsigned long long ctr = offset + ((unsigned long long)bh * tq + (unsigned long long)(q0 + r)) * (unsigned long long)tk + (unsigned long long)k0;
            for (int j = 0; j < bk; ++j) {
                float e = (!none && j < kn) ? expf(pr[j] - m_new) : 0.0f;
                sum += e;
                if (drop) e = drop_keep(dm, ctr + (unsigned long long)j) ? e * dm.scale : 0.0f;
                pr[j] = e;
            }
            l_s[r] = fmaf(l_s[r], alpha, sum);
            m_s[r] = m_new;
            a_s[r] = alpha;
        }
        __syncthreads();
        // o = o·alpha + P·V for this tile.
        for (int idx = tid; idx < bq * dv; idx += nt) {
            const int r = idx / dv, c = idx % dv;
            const float* pr = p_s + r * bk;
            float acc = o_s[idx] * a_s[r];
            for (int j = 0; j < kn; ++j) acc = fmaf(pr[j], v_s[j * dv + c], acc);
            o_s[idx] = acc;
        }
    }
    __syncthreads();  // m_s, l_s of other threads (the loop's last barrier covers them unless Tk = 0)
    T* ob = out + bi * os.sb + hi * os.sh + (long long)q0 * os.st;
    for (int idx = tid; idx < rows * dv; idx += nt) {
        const int r = idx / dv, c = idx % dv;
        const float m = m_s[r];
        ob[(long long)r * os.st + c] = from_f32<T>(m == neg_inf() ? 0.0f : o_s[idx] / l_s[r]);
    }
    for (int r = tid; r < rows; r += nt) {
        const float m = m_s[r];
        // No visible key: (+∞, 0), so that the backward's P is 0 there too.
        reinterpret_cast<RowStats*>(stats)[(long long)bh * tq + q0 + r] = m == neg_inf() ? RowStats{-neg_inf(), 0.0f} : RowStats{m, logf(l_s[r])};
    }
}

// ---------------------------------------------------------------- backward

// The (bq, bk) tile of Pd = dropout(P) (when pd_s is not null) and dS = P ⊙ (dPd·dropout − delta)·scale
// [⊙ the soft-cap's slope], P = exp((s − m) − log l), dPd = dO·Vᵀ, for queries [q0, q0 + rows) and keys [k0, k0 + kn); 0 outside
// those or past the causal limit. attention.rs: `drop_chunk` (Pd), `ds_body` (dS).
// q_s: (bq, d); do_s: (bq, dv); k_s: (bk, d + 1); v_s: (bk, dv + 1); stat_s: (bq) the rows'
// (m, log l); del_s: (bq).
template <typename T>
__device__ __forceinline__ void attn_ds_tile(float* pd_s, float* ds_s, const float* q_s, const float* do_s, const float* k_s, const float* v_s, const RowStats* stat_s,
                                             const float* del_s, int d, int dv, int bq, int bk, int q0, int rows, int k0, int kn, int bh, int tq, int tk,
                                             float scale, float cap, int causal, bool drop, const DropMask& dm, unsigned long long offset, const T* mb,
                                             const MaskStrides& ms) {
    for (int idx = threadIdx.x; idx < bq * bk; idx += blockDim.x) {
        const int r = idx / bk, j = idx % bk;
        const int i = q0 + r, kj = k0 + j;
        float pd = 0.0f, ds = 0.0f;
        if (r < rows && j < kn && !(causal && kj > i)) {
            float slope;
            const float s = attn_score(q_s + r * d, k_s + j * (d + 1), d, scale, cap, mb, ms, i, kj, slope);
            const float p = expf((s - stat_s[r].m) - stat_s[r].logl);
            const float* gr = do_s + r * dv;
            const float* vr = v_s + j * (dv + 1);
            float dpd = 0.0f;
            for (int c = 0; c < dv; ++c) dpd = fmaf(gr[c], vr[c], dpd);
            pd = p;
            if (drop) {
                const bool keep = drop_keep(dm, offset + ((unsigned long long)bh * tq + (unsigned long long)i) * (unsigned long long)tk + (unsigned long long)kj);
                pd = keep ? p * dm.scale : 0.0f;
                dpd = keep ? dpd * dm.scale : 0.0f;
            }
            ds = p * (dpd - del_s[r]) * scale * slope;
        }
        if (pd_s) pd_s[idx] = pd;
        ds_s[idx] = ds;
    }
}

// Shared memory (floats): bk·(d + 1) + bk·(dv + 1) + bk·d + bk·dv + bq·d + bq·dv + 2·bq·bk + 3·bq.
// Grid: B·Hkv·ceil(Tk / bk) blocks. Matches attention.rs `attention_backward` (dk, dv): dV = Pdᵀ·dO,
// dK = dSᵀ·Q, each summed over the query heads of the K/V head.
// dk: (B, Hkv, Tk, D) strided; dv: (B, Hkv, Tk, Dv) strided; dout: (B, H, Tq, Dv) strided (gs);
// q, k, v, mask: as the forward; stats: (B, H, Tq, 2) f32 from the forward; delta: (B, H, Tq) f32
// written by attention_backward_dq (launched first).
template <typename T>
__device__ void attention_backward_dkdv(T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* mask, const float* stats, const float* delta, int h,
                                        int hkv, int tq, int tk, int d, int dvd, float scale, float cap, int causal, float dropout_p, unsigned long long seed,
                                        unsigned long long offset, AttnStrides qs, AttnStrides ks, AttnStrides vs, AttnStrides gs, AttnStrides dks, AttnStrides dvs, MaskStrides ms, int bq,
                                        int bk) {
    DYN_SHARED(float, sm);
    float* k_s = sm;                     // (bk, d + 1)
    float* v_s = k_s + bk * (d + 1);     // (bk, dv + 1)
    float* dk_s = v_s + bk * (dvd + 1);  // (bk, d) accumulator
    float* dv_s = dk_s + bk * d;         // (bk, dv) accumulator
    float* q_s = dv_s + bk * dvd;        // (bq, d)
    float* do_s = q_s + bq * d;          // (bq, dv)
    float* pd_s = do_s + bq * dvd;       // (bq, bk)
    float* ds_s = pd_s + bq * bk;        // (bq, bk)
    RowStats* stat_s = reinterpret_cast<RowStats*>(ds_s + bq * bk);  // (bq)
    float* del_s = reinterpret_cast<float*>(stat_s + bq);             // (bq)

    // One block per (batch·K/V head, key tile): the group's h / hkv query heads (HF's repeat_kv
    // maps query head hi to K/V head hi / (h / hkv)) all add into this block's dK, dV, in head
    // order, so GQA needs no atomics either.
    const int nkt = (tk + bk - 1) / bk;
    const int bkv = blockIdx.x / nkt, k0 = (blockIdx.x % nkt) * bk;
    const int bi = bkv / hkv, hk = bkv % hkv, group = h / hkv;
    const int kn = attn_min(bk, tk - k0);
    const int tid = threadIdx.x, nt = blockDim.x;
    const bool drop = dropout_p > 0.0f;
    const DropMask dm = drop_mask(dropout_p, seed);

    attn_load_tile(k_s, d + 1, k + bi * ks.sb + hk * ks.sh + (long long)k0 * ks.st, ks.st, kn, bk, d);
    attn_load_tile(v_s, dvd + 1, v + bi * vs.sb + hk * vs.sh + (long long)k0 * vs.st, vs.st, kn, bk, dvd);
    for (int idx = tid; idx < bk * d; idx += nt) dk_s[idx] = 0.0f;
    for (int idx = tid; idx < bk * dvd; idx += nt) dv_s[idx] = 0.0f;
    // Causal: queries before k0 see none of these keys; start at the tile holding query k0.
    const int qstart = causal ? (k0 / bq) * bq : 0;
    for (int hi = hk * group; hi < (hk + 1) * group; ++hi) {
        const int bh = bi * h + hi;
        const T* qb = q + bi * qs.sb + hi * qs.sh;
        const T* gb = dout + bi * gs.sb + hi * gs.sh;
        const T* mb = mask ? mask + bi * ms.sb + hi * ms.sh : nullptr;
        for (int q0 = qstart; q0 < tq; q0 += bq) {
            const int rows = attn_min(bq, tq - q0);
            __syncthreads();  // the previous tile's readers of q_s, do_s, pd_s, ds_s are done
            attn_load_tile(q_s, d, qb + (long long)q0 * qs.st, qs.st, rows, bq, d);
            attn_load_tile(do_s, dvd, gb + (long long)q0 * gs.st, gs.st, rows, bq, dvd);
            const RowStats* rs = reinterpret_cast<const RowStats*>(stats) + (long long)bh * tq + q0;
            for (int r = tid; r < bq; r += nt) {
                stat_s[r] = r < rows ? rs[r] : RowStats{0.0f, 0.0f};
                del_s[r] = r < rows ? delta[(long long)bh * tq + q0 + r] : 0.0f;
            }
            __syncthreads();
            attn_ds_tile(pd_s, ds_s, q_s, do_s, k_s, v_s, stat_s, del_s, d, dvd, bq, bk, q0, rows, k0, kn, bh, tq, tk, scale, cap, causal, drop, dm, offset, mb, ms);
            __syncthreads();
            // Each thread owns the same accumulator elements on every tile: no barrier needed
            // between these updates and the next tile's.
            for (int idx = tid; idx < bk * dvd; idx += nt) {
                const int j = idx / dvd, c = idx % dvd;
                float acc = dv_s[idx];
                for (int r = 0; r < rows; ++r) acc = fmaf(pd_s[r * bk + j], do_s[r * dvd + c], acc);
                dv_s[idx] = acc;
            }
            for (int idx = tid; idx < bk * d; idx += nt) {
                const int j = idx / d, c = idx % d;
                float acc = dk_s[idx];
                for (int r = 0; r < rows; ++r) acc = fmaf(ds_s[r * bk + j], q_s[r * d + c], acc);
                dk_s[idx] = acc;
            }
        }
    }
    // Same ownership as the accumulation loops: each thread writes what it accumulated.
    T* dkb = dk + bi * dks.sb + hk * dks.sh + (long long)k0 * dks.st;
    T* dvb = dv + bi * dvs.sb + hk * dvs.sh + (long long)k0 * dvs.st;
    for (int idx = tid; idx < kn * dvd; idx += nt) dvb[(long long)(idx / dvd) * dvs.st + idx % dvd] = from_f32<T>(dv_s[idx]);
    for (int idx = tid; idx < kn * d; idx += nt) dkb[(long long)(idx / d) * dks.st + idx % d] = from_f32<T>(dk_s[idx]);
}

// Shared memory (floats): 2·bq·d + bq·dv + bk·(d + 1) + bk·(dv + 1) + bq·bk + 3·bq.
// Grid: B·H·ceil(Tq / bq) blocks. Matches attention.rs `attention_backward` (dq): dQ = dS·K;
// delta_i = Σ_c dO_ic·O_ic is rowsum(dP ⊙ P) of attention.rs `ds_body` (with dropout,
// Σ_j dPd_ij·Pd_ij = dO_i·Σ_j Pd_ij·V_j = dO_i·O_i), from O as the forward stored it.
// dq: (B, H, Tq, D) strided; delta: (B, H, Tq) f32 contiguous, written for attention_backward_dkdv;
// out: (B, H, Tq, Dv) strided (os), the forward's output; the other operands as in
// attention_backward_dkdv.
template <typename T>
__device__ void attention_backward_dq(T* dq, float* delta, const T* dout, const T* out, const T* q, const T* k, const T* v, const T* mask, const float* stats, int h,
                                      int hkv, int tq, int tk, int d, int dvd, float scale, float cap, int causal, float dropout_p, unsigned long long seed,
                                      unsigned long long offset, AttnStrides qs, AttnStrides ks, AttnStrides vs, AttnStrides gs, AttnStrides os, AttnStrides dqs, MaskStrides ms, int bq,
                                      int bk) {
    DYN_SHARED(float, sm);
    float* q_s = sm;                    // (bq, d)
    float* do_s = q_s + bq * d;         // (bq, dv)
    float* dq_s = do_s + bq * dvd;      // (bq, d) accumulator
    float* k_s = dq_s + bq * d;         // (bk, d + 1)
    float* v_s = k_s + bk * (d + 1);    // (bk, dv + 1)
    float* ds_s = v_s + bk * (dvd + 1); // (bq, bk)
    RowStats* stat_s = reinterpret_cast<RowStats*>(ds_s + bq * bk);  // (bq)
    float* del_s = reinterpret_cast<float*>(stat_s + bq);             // (bq)

    const int nqt = (tq + bq - 1) / bq;
    const int bh = blockIdx.x / nqt, q0 = (blockIdx.x % nqt) * bq;
    const int bi = bh / h, hi = bh % h, hk = hi / (h / hkv);  // query head hi reads K/V head hk
    const int rows = attn_min(bq, tq - q0);
    const int tid = threadIdx.x, nt = blockDim.x;
    const T* kb = k + bi * ks.sb + hk * ks.sh;
    const T* vb = v + bi * vs.sb + hk * vs.sh;
    const T* mb = mask ? mask + bi * ms.sb + hi * ms.sh : nullptr;
    const bool drop = dropout_p > 0.0f;
    const DropMask dm = drop_mask(dropout_p, seed);

    attn_load_tile(q_s, d, q + bi * qs.sb + hi * qs.sh + (long long)q0 * qs.st, qs.st, rows, bq, d);
    const T* gb = dout + bi * gs.sb + hi * gs.sh + (long long)q0 * gs.st;
    attn_load_tile(do_s, dvd, gb, gs.st, rows, bq, dvd);
    for (int idx = tid; idx < bq * d; idx += nt) dq_s[idx] = 0.0f;
    // delta, one thread per row, from global memory (no barrier needed before the loop's first).
    const T* ob = out + bi * os.sb + hi * os.sh + (long long)q0 * os.st;
    for (int r = tid; r < bq; r += nt) {
        float s = 0.0f;
        if (r < rows) {
            for (int c = 0; c < dvd; ++c) s = fmaf(to_f32(gb[(long long)r * gs.st + c]), to_f32(ob[(long long)r * os.st + c]), s);
            delta[(long long)bh * tq + q0 + r] = s;
        }
        stat_s[r] = r < rows ? reinterpret_cast<const RowStats*>(stats)[(long long)bh * tq + q0 + r] : RowStats{0.0f, 0.0f};
        del_s[r] = s;
    }
    const int kend = causal ? attn_min(q0 + rows, tk) : tk;
    for (int k0 = 0; k0 < kend; k0 += bk) {
        const int kn = attn_min(bk, kend - k0);
        __syncthreads();  // the previous tile's readers of k_s, v_s, ds_s are done (and q_s, do_s are in)
        attn_load_tile(k_s, d + 1, kb + (long long)k0 * ks.st, ks.st, kn, bk, d);
        attn_load_tile(v_s, dvd + 1, vb + (long long)k0 * vs.st, vs.st, kn, bk, dvd);
        __syncthreads();
        attn_ds_tile<T>(nullptr, ds_s, q_s, do_s, k_s, v_s, stat_s, del_s, d, dvd, bq, bk, q0, rows, k0, kn, bh, tq, tk, scale, cap, causal, drop, dm, offset, mb, ms);
        __syncthreads();
        for (int idx = tid; idx < bq * d; idx += nt) {
            const int r = idx / d, c = idx % d;
            float acc = dq_s[idx];
            for (int j = 0; j < kn; ++j) acc = fmaf(ds_s[r * bk + j], k_s[j * (d + 1) + c], acc);
            dq_s[idx] = acc;
        }
    }
    T* dqb = dq + bi * dqs.sb + hi * dqs.sh + (long long)q0 * dqs.st;
    for (int idx = tid; idx < rows * d; idx += nt) dqb[(long long)(idx / d) * dqs.st + idx % d] = from_f32<T>(dq_s[idx]);
}

// ---------------------------------------------------------------- kernels
// Scalars common to the three kernels: h = query heads, hkv = K/V heads (h a multiple of it:
// grouped-query attention; B is implied by the grid), tq/tk query
// and key lengths, d the q/k head size, dv the v head size, scale, cap (the soft-cap, 0 for
// none), causal (0/1), dropout_p,
// seed and offset of the dropout site, the step block (null, or the step's seed in place of
// `seed`: a captured step); then the (b, h, t) strides of each operand, the mask's
// 4 strides, and the tile sizes bq, bk.
#define ATTENTION(S, T)                                                                                                                        \
    ORT_KERNEL(attention_forward_##S)(T * out, float* stats, const T* q, const T* k, const T* v, const T* mask, int h, int hkv, int tq, int tk, int d, int dv, \
                                      float scale, float cap, int causal, float dropout_p, unsigned long long seed, unsigned long long offset, const StepBlock* step, long long q_sb,  \
                                      long long q_sh, long long q_st, long long k_sb, long long k_sh, long long k_st, long long v_sb, long long v_sh, \
                                      long long v_st, long long o_sb, long long o_sh, long long o_st, long long m_sb, long long m_sh, long long m_sq,  \
                                      long long m_sk, int bq, int bk) {                                                                         \
        attention_forward<T>(out, stats, q, k, v, mask, h, hkv, tq, tk, d, dv, scale, cap, causal, dropout_p, step ? step->seed : seed, offset, AttnStrides{q_sb, q_sh, q_st},      \
                             AttnStrides{k_sb, k_sh, k_st}, AttnStrides{v_sb, v_sh, v_st}, AttnStrides{o_sb, o_sh, o_st},                          \
                             MaskStrides{m_sb, m_sh, m_sq, m_sk}, bq, bk);                                                                      \
    }                                                                                                                                          \
    ORT_REGISTER(attention_forward_##S)                                                                                                        \
    ORT_KERNEL(attention_backward_dkdv_##S)(T * dk, T * dv, const T* dout, const T* q, const T* k, const T* v, const T* mask, const float* stats,      \
                                            const float* delta, int h, int hkv, int tq, int tk, int d, int dvd, float scale, float cap, int causal, float dropout_p, \
                                            unsigned long long seed, unsigned long long offset, const StepBlock* step, long long q_sb, long long q_sh, long long q_st,    \
                                            long long k_sb, long long k_sh, long long k_st, long long v_sb, long long v_sh, long long v_st,        \
                                            long long g_sb, long long g_sh, long long g_st, long long dk_sb, long long dk_sh, long long dk_st,     \
                                            long long dv_sb, long long dv_sh, long long dv_st, long long m_sb, long long m_sh, long long m_sq,     \
                                            long long m_sk, int bq, int bk) {                                                                   \
        attention_backward_dkdv<T>(dk, dv, dout, q, k, v, mask, stats, delta, h, hkv, tq, tk, d, dvd, scale, cap, causal, dropout_p, step ? step->seed : seed, offset,          \
                                   AttnStrides{q_sb, q_sh, q_st}, AttnStrides{k_sb, k_sh, k_st}, AttnStrides{v_sb, v_sh, v_st},                 \
                                   AttnStrides{g_sb, g_sh, g_st}, AttnStrides{dk_sb, dk_sh, dk_st}, AttnStrides{dv_sb, dv_sh, dv_st},           \
                                   MaskStrides{m_sb, m_sh, m_sq, m_sk}, bq, bk);                                                                \
    }                                                                                                                                          \
    ORT_REGISTER(attention_backward_dkdv_##S)                                                                                                  \
    ORT_KERNEL(attention_backward_dq_##S)(T * dq, float* delta, const T* dout, const T* out, const T* q, const T* k, const T* v, const T* mask,     \
                                          const float* stats, int h, int hkv, int tq, int tk, int d, int dvd, float scale, float cap, int causal, float dropout_p, \
                                          unsigned long long seed, unsigned long long offset, const StepBlock* step, long long q_sb, long long q_sh, long long q_st,      \
                                          long long k_sb, long long k_sh, long long k_st, long long v_sb, long long v_sh, long long v_st,          \
                                          long long g_sb, long long g_sh, long long g_st, long long o_sb, long long o_sh, long long o_st,          \
                                          long long dq_sb, long long dq_sh, long long dq_st, long long m_sb, long long m_sh, long long m_sq,       \
                                          long long m_sk, int bq, int bk) {                                                                     \
        attention_backward_dq<T>(dq, delta, dout, out, q, k, v, mask, stats, h, hkv, tq, tk, d, dvd, scale, cap, causal, dropout_p, step ? step->seed : seed, offset,           \
                                 AttnStrides{q_sb, q_sh, q_st}, AttnStrides{k_sb, k_sh, k_st}, AttnStrides{v_sb, v_sh, v_st},                   \
                                 AttnStrides{g_sb, g_sh, g_st}, AttnStrides{o_sb, o_sh, o_st}, AttnStrides{dq_sb, dq_sh, dq_st},                \
                                 MaskStrides{m_sb, m_sh, m_sq, m_sk}, bq, bk);                                                                  \
    }                                                                                                                                          \
    ORT_REGISTER(attention_backward_dq_##S)
ORT_FOR_FLOATS(ATTENTION)
