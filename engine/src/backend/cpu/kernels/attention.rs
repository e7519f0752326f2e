//! Scaled dot-product attention, forward and backward, one (batch, head) at a time per task,
//! in blocks of query rows: a block's scores (rows × Tk f32: 32 × 1024 = 128 KiB causal,
//! 128 × 512 = 256 KiB otherwise) stay in cache between the GEMMs and the row softmax.
//!
//! Forward per (b, h) and row block: S = scale·Q·Kᵀ into scratch, row softmax in place
//! ([soft-cap,] mask, causal), P·dropout → scratch, O = Pd·V. The backward gets each query
//! row's softmax (max, 1/sum) instead of the probabilities (the node's second output, (B, H,
//! Tq, Tk) in the graph, is stored as (B, H, Tq, 2) f32) and recomputes each block's P with the
//! same GEMM and one pass, exp(x − max)·(1/sum), bit for bit the forward's: FlashAttention's
//! recompute on the CPU — one more GEMM (2·Tq·Tk·D FLOPs per head, counted in
//! [`AttnPlan::executed_flops`]) for B·H·Tq·Tk floats of activation memory.
//! Then dPd = dO·Vᵀ, dV += Pdᵀ·dO, dP = dPd·dropout, dS = P ⊙ (dP − rowsum(dP ⊙ P))·scale,
//! dQ = dS·K, dK += dSᵀ·Q — six single-threaded GEMMs on strided Q/K/V (head split/merge
//! permutes folded into leading dimensions) and two row passes. The dropout mask is
//! regenerated from the counter-based RNG, element for element the reference's. A soft-cap
//! (Gemma 2: S ← cap·tanh(S) before the mask) keeps the recomputed S = scale·Q·Kᵀ beside P
//! for dS's factor cap·(1 − tanh²).
//!
//! Grouped-query / multi-query attention (Hkv kv heads, each read by H/Hkv query heads in HF's
//! `repeat_kv` order) reads a query head's kv head through its strides, never a repeated copy;
//! the backward runs per (batch, kv head) so that the dK and dV sums over its query heads have
//! one writer.
//!
//! References: `ops::attention` (tested against), llm.c `attention_forward` /
//! `attention_backward`, `torch.nn.functional.scaled_dot_product_attention` (math path).

use super::attention;
use super::elementwise::DropMask;
use super::simd::{self, multiversion};
use super::softmax::{softmax_row_again, softmax_row_in_place, MaskMap};
use crate::backend::cpu::blas::sgemm_st;
use crate::backend::cpu::pool::{Pool, SyncPtr};
use crate::exec::planned::kernel::ResolveCx;
use crate::exec::planned::kernel::{CpuKernel, Kernel};
use crate::exec::planned::Aux;
use crate::exec::planned::{CpuSupport, PlannedExecutor, Resolved};
use crate::graph::op::{Attention, AttentionBackward};
use crate::graph::{Graph, Node, TensorId};
use crate::ops::attention::{backward_slot, slot};
use crate::ops::OpError;
use crate::plan::{Place, PlanError};

/// One attention node resolved: sizes, attributes and the (b, h, t) strides of each operand
/// (the last dim is contiguous).
#[derive(Debug, Clone, PartialEq)]
pub struct AttnPlan {
    pub b: usize,
    /// Query heads, and kv heads (dividing h; h/hkv query heads share one kv head).
    pub h: usize,
    pub hkv: usize,
    pub tq: usize,
    pub tk: usize,
    pub d: usize,
    pub dv: usize,
    pub scale: f32,
    pub causal: bool,
    pub dropout_p: f32,
    pub offset: u64,
    /// The scores' tanh soft-cap, if any: cap·tanh(scale·q·k) before the mask.
    pub softcap: Option<f32>,
    /// Strides of q, k, v, and of out (forward) or dout (backward).
    pub q: [usize; 3],
    pub k: [usize; 3],
    pub v: [usize; 3],
    pub o: [usize; 3],
    /// Strides of dq, dk, dv (backward only).
    pub dq: [usize; 3],
    pub dk: [usize; 3],
    pub dvs: [usize; 3],
    /// The additive mask against (B, H, Tq, Tk).
    pub mask: Option<MaskMap>,
}

impl AttnPlan {
    /// f32 scratch the forward needs ([`workspace_elems`]).
    pub fn forward_workspace(&self, threads: usize) -> usize {
        workspace_elems(&self.attrs(), (self.tq, self.tk), threads, false)
    }

    /// f32 scratch the backward needs ([`workspace_elems`]).
    pub fn backward_workspace(&self, threads: usize) -> usize {
        workspace_elems(&self.attrs(), (self.tq, self.tk), threads, true)
    }

    fn attrs(&self) -> Attention {
        let AttnPlan { scale, causal, dropout_p, offset, softcap, .. } = *self;
        Attention { scale, causal, dropout_p, offset, softcap }
    }

    /// Offset of query problem `bh` = (b, h) in a (B, H, T, ·) operand.
    fn at(&self, s: &[usize; 3], bh: usize) -> usize {
        (bh / self.h) * s[0] + (bh % self.h) * s[1]
    }

    /// Offset of the kv head query problem `bh` reads in a (B, Hkv, T, ·) operand: head
    /// h / (H/Hkv), HF's `repeat_kv` order.
    fn at_kv(&self, s: &[usize; 3], bh: usize) -> usize {
        (bh / self.h) * s[0] + (bh % self.h) / (self.h / self.hkv) * s[1]
    }
}

/// Per thread, the (rows, Tk) blocks of scratch: the forward's P and, with dropout, its
/// dropped copy; the backward's recomputed P and dP, with dropout dropout(P), with a soft-cap
/// S = scale·Q·Kᵀ before the cap.
fn scratch_blocks(a: &Attention, backward: bool) -> usize {
    let dropped = usize::from(a.dropout_p > 0.0);
    if backward {
        2 + dropped + usize::from(a.softcap.is_some())
    } else {
        1 + dropped
    }
}

/// f32 elements of scratch a kernel of attention `a` with Tq × Tk scores needs on `threads`
/// threads: [`scratch_blocks`] blocks of [`block_rows`] × Tk each.
fn workspace_elems(a: &Attention, (tq, tk): (usize, usize), threads: usize, bwd: bool) -> usize {
    scratch_blocks(a, bwd) * threads * block_rows(a.causal, tq) * tk
}

/// Rows of scale·q·k (`tk` apart, row `row0` of the problem first) into probabilities in
/// place: [cap·tanh,] + mask, the causal cut, softmax. The softmax saves each row's (max,
/// 1/sum) into `stats` (two floats a row), or, rebuilding the rows in the backward, reads them:
/// one pass instead of three, the same bits ([`softmax_row_again`]).
#[inline(always)]
fn probs_rows(
    p: &mut [f32],
    tk: usize,
    row0: usize,
    (causal, tq): (bool, usize),
    softcap: Option<f32>,
    mask: Option<(&[f32], &MaskMap)>,
    mut stats: RowStats<'_>,
) {
    for (i, row) in p.chunks_exact_mut(tk).enumerate() {
        let valid = if causal { ((row0 + i) % tq + 1).min(tk) } else { tk };
        if let Some(cap) = softcap {
            for x in &mut row[..valid] {
                *x = cap * simd::tanh(*x);
            }
        }
        if let Some((data, mm)) = mask {
            let off = mm.row_offset(row0 + i);
            for (j, x) in row.iter_mut().enumerate() {
                *x += data[off + j * mm.last_stride];
            }
        }
        match &mut stats {
            RowStats::Save(st) => {
                let (m, inv) = softmax_row_in_place(row, valid);
                (st[2 * i], st[2 * i + 1]) = (m, inv);
            }
            RowStats::Load(st) => softmax_row_again(row, valid, (st[2 * i], st[2 * i + 1])),
        }
    }
}
multiversion!(fn probs_chunk<>(p: &mut [f32], tk: usize, row0: usize, cut: (bool, usize), softcap: Option<f32>, mask: Option<(&[f32], &MaskMap)>, stats: RowStats<'_>) => probs_rows);

/// A row block's softmax statistics, (max, 1/sum) per query row: written by the forward, read
/// by the backward.
enum RowStats<'a> {
    Save(&'a mut [f32]),
    Load(&'a [f32]),
}

/// dst = src ⊙ dropout factor, counters `first + flat index`.
#[inline(always)]
fn drop_body(dst: &mut [f32], src: &[f32], m: DropMask, first: u64) {
    for (i, (o, &x)) in dst.iter_mut().zip(src).enumerate() {
        *o = if m.keep(first + i as u64) { x * m.scale } else { 0.0 };
    }
}
multiversion!(fn drop_chunk<>(dst: &mut [f32], src: &[f32], m: DropMask, first: u64) => drop_body);

/// In place over `rows` rows of `width` entries, `ld` apart: dp = dp·factor (when dropout),
/// then ds = p ⊙ (dp − Σ dp ⊙ p)·scale per row, times the soft-cap's slope
/// cap·(1 − tanh²u) where `capped` gives u = scale·q·k (same layout) and the cap.
#[inline(always)]
#[allow(
    clippy::too_many_arguments,
    reason = "a kernel's operands and dimensions, as its reference in ops/attention.rs"
)]
fn ds_body(
    dp: &mut [f32],
    p: &[f32],
    rows: usize,
    width: usize,
    ld: usize,
    scale: f32,
    m: Option<DropMask>,
    first: u64,
    capped: Option<(&[f32], f32)>,
) {
    for r in 0..rows {
        let dr = &mut dp[r * ld..r * ld + width];
        let pr = &p[r * ld..r * ld + width];
        if let Some(m) = m {
            let f0 = first + (r * ld) as u64;
            for (j, x) in dr.iter_mut().enumerate() {
                *x = if m.keep(f0 + j as u64) { *x * m.scale } else { 0.0 };
            }
        }
        let s = simd::dot(dr, pr);
        match capped {
            None => {
                for j in 0..width {
                    dr[j] = pr[j] * (dr[j] - s) * scale;
                }
            }
            Some((u, cap)) => {
                let ur = &u[r * ld..r * ld + width];
                for j in 0..width {
                    let t = simd::tanh(ur[j]);
                    dr[j] = pr[j] * (dr[j] - s) * scale * (cap * (1.0 - t * t));
                }
            }
        }
    }
}
multiversion!(fn ds_chunk<>(dp: &mut [f32], p: &[f32], rows: usize, width: usize, ld: usize, scale: f32, m: Option<DropMask>, first: u64, capped: Option<(&[f32], f32)>) => ds_body);

/// Query rows per block of causal attention: block [r0, r1) needs keys [0, r1) only, so the
/// GEMMs skip most of the masked upper triangle (62% of the work at T = 128).
const CAUSAL_BLOCK: usize = 32;

/// Query rows per block without a causal cut: long rows' scratch stays in cache, and at
/// T ≤ 128 a (b, h) problem is one block, one GEMM per product.
const FULL_BLOCK: usize = 128;

fn block_rows(causal: bool, tq: usize) -> usize {
    if causal { CAUSAL_BLOCK } else { FULL_BLOCK }.min(tq.max(1))
}

/// Row blocks of one (b, h) problem: (r0, r1, keys needed).
fn blocks(p: &AttnPlan) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
    let rb = block_rows(p.causal, p.tq);
    (0..p.tq.div_ceil(rb)).map(move |i| {
        let (r0, r1) = (i * rb, ((i + 1) * rb).min(p.tq));
        (r0, r1, if p.causal { r1.min(p.tk) } else { p.tk })
    })
}

impl AttnPlan {
    /// Multiply-add FLOPs (2 per multiply-add) the kernels really compute, with causal
    /// attention's skipped key blocks left out: forward Q·Kᵀ and P·V; backward Q·Kᵀ again (the
    /// recompute), dO·Vᵀ, Pᵀ·dO, dS·K and dSᵀ·Q. What the harness's HFU counts for attention.
    /// Per query head: with grouped kv heads every query head still multiplies against its kv
    /// head's K and V.
    pub fn executed_flops(&self, backward: bool) -> f64 {
        let per_pair: usize = blocks(self).map(|(r0, r1, kn)| (r1 - r0) * kn).sum();
        let (d, dv) = (self.d as f64, self.dv as f64);
        let products = if backward { 2.0 * dv + 3.0 * d } else { d + dv };
        2.0 * (self.b * self.h) as f64 * per_pair as f64 * products
    }
}

/// S = scale·Q·Kᵀ of `rows` queries at `q` against the first `kn` keys at `k` (the plan's
/// strides), into `out`'s rows, `tk` apart.
///
/// # Safety
/// q and k point at `rows` and `kn` rows of D elements at the plan's t strides; out holds
/// `rows` rows of `tk`.
// out: (rows, Tk) of which (rows, kn) written; q: (rows, D) strided; k: (kn, D) strided
unsafe fn scores_gemm(
    p: &AttnPlan,
    (rows, kn): (usize, usize),
    q: *const f32,
    k: *const f32,
    out: &mut [f32],
) {
    debug_assert!(out.len() >= rows * p.tk && kn <= p.tk);
    let (q_ld, k_ld) = (p.q[2], p.k[2]);
    sgemm_st(false, true, rows, kn, p.d, p.scale, q, q_ld, k, k_ld, 0.0, out.as_mut_ptr(), p.tk);
}

/// P of the row block [r0, r1) of query problem `i` (against its `kn` keys) into `pb`'s rows,
/// `tk` apart: S = scale·Q·Kᵀ, then in place [cap·tanh,] + mask, the causal cut and the
/// softmax, whose rows' statistics the forward saves and the backward reads ([`RowStats`]:
/// the block's rows of the (B·H·Tq, 2) statistics). The forward's probabilities, and bit for
/// bit the backward's recomputed ones (the same GEMM and row pass on the same operands). With
/// `scores`, S is written there first and kept (a soft-cap's slope needs it).
///
/// # Safety
/// As [`scores_gemm`], with q and k at problem `i`'s first query row and its kv head's first
/// key.
#[allow(
    clippy::too_many_arguments,
    reason = "a kernel's operands and dimensions, as its reference in ops/attention.rs"
)]
unsafe fn block_probs(
    p: &AttnPlan,
    i: usize,
    (r0, r1, kn): (usize, usize, usize),
    (q, k): (*const f32, *const f32),
    mask: Option<(&[f32], &MaskMap)>,
    pb: &mut [f32],
    scores: Option<&mut [f32]>,
    stats: RowStats<'_>,
) {
    let (rows, q) = (r1 - r0, q.add(r0 * p.q[2]));
    match scores {
        Some(u) => {
            scores_gemm(p, (rows, kn), q, k, u);
            pb.copy_from_slice(u);
        }
        None => scores_gemm(p, (rows, kn), q, k, pb),
    }
    probs_chunk(pb, p.tk, i * p.tq + r0, (p.causal, p.tq), p.softcap, mask, stats);
}

/// dQ = dS·K (written) and dK += dSᵀ·Q for one block of `rows` queries
/// and `kn` keys, dS in `ds`'s rows `tk` apart.
///
/// # Safety
/// k, q point at `kn` and `rows` rows at the plan's t strides; dq, dk at `rows` and `kn` rows
/// of dq and dk that no other thread writes.
// ds: (rows, Tk); k: (kn, D); q: (rows, D); dq: (rows, D); dk: (kn, D); all strided
unsafe fn dq_dk_of_ds(
    p: &AttnPlan,
    (rows, kn): (usize, usize),
    ds: &[f32],
    (k, q): (*const f32, *const f32),
    (dq, dk): (*mut f32, *mut f32),
) {
    let (ds, tk, d) = (ds.as_ptr(), p.tk, p.d);
    sgemm_st(false, false, rows, d, kn, 1.0, ds, tk, k, p.k[2], 0.0, dq, p.dq[2]);
    sgemm_st(true, false, kn, d, rows, 1.0, ds, tk, q, p.q[2], 1.0, dk, p.dk[2]);
}

/// out = dropout(softmax(Q·Kᵀ·scale + mask))·V. The probabilities live in scratch, a row
/// block at a time; what [`attention_backward`] rebuilds them from is each query row's softmax
/// (max, 1/sum), saved in `stats`.
///
/// # Safety
/// q, k, v, out point at the operands' starts with the plan's strides; stats has B·H·Tq·2
/// elements; ws has [`AttnPlan::forward_workspace`] elements; out overlaps nothing else.
// out: (B, H, Tq, Dv) strided; stats: (B, H, Tq, 2); q: (B, H, Tq, D); k: (B, Hkv, Tk, D);
// v: (B, Hkv, Tk, Dv); mask: broadcastable to (B, H, Tq, Tk)
#[allow(
    clippy::too_many_arguments,
    reason = "a kernel's operands and dimensions, as its reference in ops/attention.rs"
)]
pub unsafe fn attention_forward(
    pool: &Pool,
    p: &AttnPlan,
    out: *mut f32,
    stats: &mut [f32],
    q: *const f32,
    k: *const f32,
    v: *const f32,
    mask: Option<&[f32]>,
    seed: u64,
    ws: &mut [f32],
) {
    let (bh, tq, tk) = (p.b * p.h, p.tq, p.tk);
    assert_eq!(stats.len(), bh * tq * 2, "attention statistics: two floats per query row");
    let t = pool.threads().min(bh).max(1);
    let per = bh.div_ceil(t);
    let dm = (p.dropout_p > 0.0).then(|| DropMask::new(p.dropout_p, seed));
    let (nb, be) = (scratch_blocks(&p.attrs(), false), block_rows(p.causal, tq) * tk);
    debug_assert!(ws.len() >= p.forward_workspace(t));
    let (op, wp, sp) = (SyncPtr(out), SyncPtr(ws.as_mut_ptr()), SyncPtr(stats.as_mut_ptr()));
    let (qp, kp, vp) = (SyncPtr(q as *mut f32), SyncPtr(k as *mut f32), SyncPtr(v as *mut f32));
    let mask = mask.zip(p.mask.as_ref());
    pool.run(t, &|task| {
        // SAFETY: scratch blocks nb·task .. nb·task + nb are this task's.
        let block = |j: usize| wp.slice((nb * task + j) * be..(nb * task + j + 1) * be);
        let probs = block(0);
        let mut dropped = dm.map(|_| block(1));
        for i in task * per..((task + 1) * per).min(bh) {
            // SAFETY: (b, h) pair i's rows of out and of the statistics are this task's.
            let (qi, ki, vi, oi) = (
                qp.ptr().add(p.at(&p.q, i)),
                kp.ptr().add(p.at_kv(&p.k, i)),
                vp.ptr().add(p.at_kv(&p.v, i)),
                op.ptr().add(p.at(&p.o, i)),
            );
            for (r0, r1, kn) in blocks(p) {
                let rows = r1 - r0;
                let pb = &mut probs[..rows * tk];
                let st = RowStats::Save(sp.slice(2 * (i * tq + r0)..2 * (i * tq + r1)));
                block_probs(p, i, (r0, r1, kn), (qi, ki), mask, pb, None, st);
                let pd: &[f32] = match (dm, dropped.as_deref_mut()) {
                    (Some(m), Some(s)) => {
                        let sb = &mut s[..rows * tk];
                        drop_chunk(sb, pb, m, p.offset + ((i * tq + r0) * tk) as u64);
                        sb
                    }
                    _ => pb,
                };
                let (pd, vld, o) = (pd.as_ptr(), p.v[2], oi.add(r0 * p.o[2]));
                sgemm_st(false, false, rows, p.dv, kn, 1.0, pd, tk, vi, vld, 0.0, o, p.o[2]);
            }
        }
    });
}

/// dq, dk, dv of [`attention_forward`] from dout, each row block's probabilities recomputed
/// ([`block_probs`]) from the forward's statistics.
///
/// # Safety
/// As [`attention_forward`]; dq, dk, dv overlap nothing else; ws has
/// [`AttnPlan::backward_workspace`] elements.
// dq: (B, H, Tq, D); dk: (B, Hkv, Tk, D); dv: (B, Hkv, Tk, Dv); dout: (B, H, Tq, Dv);
// q, k, v, mask, stats: as in the forward
#[allow(
    clippy::too_many_arguments,
    reason = "a kernel's operands and dimensions, as its reference in ops/attention.rs"
)]
pub unsafe fn attention_backward(
    pool: &Pool,
    p: &AttnPlan,
    (dq, dk, dv): (*mut f32, *mut f32, *mut f32),
    dout: *const f32,
    q: *const f32,
    k: *const f32,
    v: *const f32,
    mask: Option<&[f32]>,
    stats: &[f32],
    seed: u64,
    ws: &mut [f32],
) {
    assert_eq!(stats.len(), p.b * p.h * p.tq * 2, "attention statistics: two floats per query row");
    // One task per (batch, kv head): the rep = H/Hkv query heads reading it add into its dK
    // and dV, which no other task writes.
    let (bkv, rep, tk) = (p.b * p.hkv, p.h / p.hkv, p.tk);
    let t = pool.threads().min(bkv).max(1);
    let per = bkv.div_ceil(t);
    let dm = (p.dropout_p > 0.0).then(|| DropMask::new(p.dropout_p, seed));
    let (nb, be) = (scratch_blocks(&p.attrs(), true), block_rows(p.causal, p.tq) * tk);
    debug_assert!(ws.len() >= p.backward_workspace(t));
    let wp = SyncPtr(ws.as_mut_ptr());
    let (dqp, dkp, dvp) = (SyncPtr(dq), SyncPtr(dk), SyncPtr(dv));
    let (gp, qp, kp, vp) = (
        SyncPtr(dout as *mut f32),
        SyncPtr(q as *mut f32),
        SyncPtr(k as *mut f32),
        SyncPtr(v as *mut f32),
    );
    let mask = mask.zip(p.mask.as_ref());
    pool.run(t, &|task| {
        // SAFETY: scratch blocks nb·task .. nb·task + nb are this task's.
        let block = |j: usize| wp.slice((nb * task + j) * be..(nb * task + j + 1) * be);
        let mut sc = Scratch {
            probs: block(0),
            dp: block(1),
            dropped: dm.map(|_| block(2)),
            scores: p.softcap.map(|_| block(2 + usize::from(dm.is_some()))),
        };
        for kvi in task * per..((task + 1) * per).min(bkv) {
            // The kv head's first query problem: (b, g·rep).
            let i0 = (kvi / p.hkv) * p.h + (kvi % p.hkv) * rep;
            // SAFETY: kv head kvi's rows of dk and dv are this task's; the row blocks and the
            // group's query heads add into them from zero.
            let (dki, dvi) =
                (dkp.ptr().add(p.at_kv(&p.dk, i0)), dvp.ptr().add(p.at_kv(&p.dvs, i0)));
            for j in 0..tk {
                std::slice::from_raw_parts_mut(dki.add(j * p.dk[2]), p.d).fill(0.0);
                std::slice::from_raw_parts_mut(dvi.add(j * p.dvs[2]), p.dv).fill(0.0);
            }
            for i in i0..i0 + rep {
                let (qi, ki, vi, gi) = (
                    qp.ptr().add(p.at(&p.q, i)),
                    kp.ptr().add(p.at_kv(&p.k, i)),
                    vp.ptr().add(p.at_kv(&p.v, i)),
                    gp.ptr().add(p.at(&p.o, i)),
                );
                // SAFETY: (b, h) pair i's rows of dq are this task's.
                let dqi = dqp.ptr().add(p.at(&p.dq, i));
                let ops =
                    BlockOperands { i, q: qi, k: ki, v: vi, dout: gi, dq: dqi, dk: dki, dv: dvi };
                for blk in blocks(p) {
                    backward_block(p, blk, &ops, (mask, stats), dm, &mut sc);
                }
            }
        }
    });
}

/// One task's scratch blocks in the backward, each (rows, Tk).
struct Scratch<'a> {
    probs: &'a mut [f32],
    dp: &'a mut [f32],
    dropped: Option<&'a mut [f32]>,
    scores: Option<&'a mut [f32]>,
}

/// Query problem `i`'s operands at their first rows, and its kv head's dK and dV.
struct BlockOperands {
    i: usize,
    q: *const f32,
    k: *const f32,
    v: *const f32,
    dout: *const f32,
    dq: *mut f32,
    dk: *mut f32,
    dv: *mut f32,
}

/// The backward of row block (r0, r1, kn) of one query problem: P again, dPd = dO·Vᵀ,
/// dV += Pdᵀ·dO, dS, dQ = dS·K (rows r0..r1 written) and dK += dSᵀ·Q.
///
/// # Safety
/// As [`attention_backward`]: `o`'s dq rows and dk, dv are the caller's task's alone.
unsafe fn backward_block(
    p: &AttnPlan,
    (r0, r1, kn): (usize, usize, usize),
    o: &BlockOperands,
    (mask, stats): (Option<(&[f32], &MaskMap)>, &[f32]),
    dm: Option<DropMask>,
    sc: &mut Scratch<'_>,
) {
    let (rows, tk) = (r1 - r0, p.tk);
    let first = p.offset + ((o.i * p.tq + r0) * tk) as u64;
    let pb = &mut sc.probs[..rows * tk];
    let mut scores = sc.scores.as_deref_mut().map(|u| &mut u[..rows * tk]);
    let st = RowStats::Load(&stats[2 * (o.i * p.tq + r0)..2 * (o.i * p.tq + r1)]);
    block_probs(p, o.i, (r0, r1, kn), (o.q, o.k), mask, pb, scores.as_deref_mut(), st);
    let db = &mut sc.dp[..rows * tk];
    let (gr, qr) = (o.dout.add(r0 * p.o[2]), o.q.add(r0 * p.q[2]));
    // dPd = dO·Vᵀ
    sgemm_st(false, true, rows, kn, p.dv, 1.0, gr, p.o[2], o.v, p.v[2], 0.0, db.as_mut_ptr(), tk);
    // dV += Pdᵀ·dO
    let pd: &[f32] = match (dm, sc.dropped.as_deref_mut()) {
        (Some(m), Some(s)) => {
            let sb = &mut s[..rows * tk];
            drop_chunk(sb, pb, m, first);
            sb
        }
        _ => &*pb,
    };
    let (pd, dvs) = (pd.as_ptr(), p.dvs[2]);
    sgemm_st(true, false, kn, p.dv, rows, 1.0, pd, tk, gr, p.o[2], 1.0, o.dv, dvs);
    // dS (in dp), with a soft-cap's slope from S
    let capped = p.softcap.zip(scores.map(|u| &*u)).map(|(cap, u)| (u, cap));
    ds_chunk(db, pb, rows, kn, tk, p.scale, dm, first, capped);
    dq_dk_of_ds(p, (rows, kn), db, (o.k, qr), (o.dq.add(r0 * p.dq[2]), o.dk));
}

impl CpuKernel for Attention {
    fn check(&self, g: &Graph, node: &Node) -> Result<(), String> {
        four_d(g, node.inputs[slot::Q])
    }

    fn workspace(&self, cpu: &CpuSupport, g: &Graph, node: usize) -> usize {
        let p = g.shape(g.nodes()[node].outputs[1]);
        workspace_elems(self, (p[2], p[3]), cpu.threads, false)
    }

    // In the probabilities' place, each query row's softmax (max, 1/sum): (B, H, Tq, 2) f32,
    // from which the backward rebuilds them.
    fn stored_elems(&self, g: &Graph, node: &Node, slot: usize) -> Option<usize> {
        let q = g.shape(node.inputs[slot::Q]);
        (slot == 1).then(|| q[0] * q[1] * q[2] * 2)
    }

    fn resolve(&self, cx: &ResolveCx<'_>) -> Result<Aux, PlanError> {
        Ok(attn_plan(cx, true, *self))
    }

    fn flops(&self, _x: &PlannedExecutor, r: &Resolved) -> f64 {
        let Aux::Attn(a) = &r.aux else { unreachable!("resolved at build") };
        a.executed_flops(false)
    }

    unsafe fn exec(&self, k: &Kernel<'_>) -> Result<(), OpError> {
        let Aux::Attn(a) = &k.r.aux else { unreachable!("resolved at build") };
        use crate::ops::attention::slot as s;
        let i = &k.node.inputs;
        let m = i.get(s::MASK).map(|_| k.rd(s::MASK));
        let (q, kk, v) = (k.ptr(i[s::Q]), k.ptr(i[s::K]), k.ptr(i[s::V]));
        let out = k.ptr(k.node.outputs[0]);
        let stats = std::slice::from_raw_parts_mut(k.ptr(k.node.outputs[1]), stats_len(a));
        attention::attention_forward(k.pool, a, out, stats, q, kk, v, m, k.seed, k.ws());
        Ok(())
    }
}

impl CpuKernel for AttentionBackward {
    fn check(&self, g: &Graph, node: &Node) -> Result<(), String> {
        four_d(g, node.inputs[backward_slot::Q])
    }

    // (dout, q, k, v), the rows' statistics in the probabilities' place, and the mask; the
    // forward's output is read by the GPU kernels only.
    fn reads(&self, slot: usize) -> bool {
        slot < backward_slot::OUT || slot == backward_slot::MASK
    }

    fn workspace(&self, cpu: &CpuSupport, g: &Graph, node: usize) -> usize {
        let p = g.shape(g.nodes()[node].inputs[backward_slot::PROBS]);
        workspace_elems(&self.forward(), (p[2], p[3]), cpu.threads, true)
    }

    fn resolve(&self, cx: &ResolveCx<'_>) -> Result<Aux, PlanError> {
        Ok(attn_plan(cx, false, self.forward()))
    }

    fn flops(&self, _x: &PlannedExecutor, r: &Resolved) -> f64 {
        let Aux::Attn(a) = &r.aux else { unreachable!("resolved at build") };
        a.executed_flops(true)
    }

    unsafe fn exec(&self, k: &Kernel<'_>) -> Result<(), OpError> {
        let Aux::Attn(a) = &k.r.aux else { unreachable!("resolved at build") };
        use crate::ops::attention::backward_slot as s;
        let (i, o) = (&k.node.inputs, &k.node.outputs);
        let m = i.get(s::MASK).map(|_| k.rd(s::MASK));
        let grads = (k.ptr(o[0]), k.ptr(o[1]), k.ptr(o[2]));
        let (q, kk, v) = (k.ptr(i[s::Q]), k.ptr(i[s::K]), k.ptr(i[s::V]));
        let dout = k.ptr(i[s::DOUT]);
        let stats = std::slice::from_raw_parts(k.ptr(i[s::PROBS]), stats_len(a));
        attention::attention_backward(k.pool, a, grads, dout, q, kk, v, m, stats, k.seed, k.ws());
        Ok(())
    }
}

/// Elements of the rows' statistics: (B, H, Tq, 2).
fn stats_len(a: &AttnPlan) -> usize {
    a.b * a.h * a.tq * 2
}

fn four_d(g: &Graph, q: TensorId) -> Result<(), String> {
    match g.shape(q).len() {
        4 => Ok(()),
        _ => Err(" for a non-4-D attention".into()),
    }
}

/// (b, h, t) strides of a (B, H, T, D) operand with unit last stride; the t stride is a GEMM
/// leading dimension, so it is at least D even where T = 1 makes it irrelevant.
fn strides3(shape: &[usize], p: &Place) -> [usize; 3] {
    [p.strides[0], p.strides[1], p.strides[2].max(shape[3]).max(1)]
}

/// The attention kernels' plan: sizes, the forward node's attributes and the operands'
/// strides.
fn attn_plan(cx: &ResolveCx<'_>, fwd: bool, attrs: Attention) -> Aux {
    let Attention { scale, causal, dropout_p, offset, softcap } = attrs;
    use backward_slot as bs;
    let (g, node, pl) = (cx.g, cx.node, |t: TensorId| cx.pl(t));
    let i = &node.inputs;
    let (q, k, v, o) = if fwd {
        (i[slot::Q], i[slot::K], i[slot::V], node.outputs[0])
    } else {
        (i[bs::Q], i[bs::K], i[bs::V], i[bs::DOUT])
    };
    let (sq, sk, sv) = (g.shape(q), g.shape(k), g.shape(v));
    let full = [sq[0], sq[1], sq[2], sk[2]];
    let mask_slot = if fwd { slot::MASK } else { bs::MASK };
    let mask = i.get(mask_slot).map(|&m| MaskMap::new(g.shape(m), &full));
    let (dq, dk, dvs) = if fwd {
        ([0; 3], [0; 3], [0; 3])
    } else {
        (
            strides3(sq, pl(node.outputs[0])),
            strides3(sk, pl(node.outputs[1])),
            strides3(sv, pl(node.outputs[2])),
        )
    };
    Aux::Attn(Box::new(AttnPlan {
        b: sq[0],
        h: sq[1],
        hkv: sk[1],
        tq: sq[2],
        tk: sk[2],
        d: sq[3],
        dv: sv[3],
        scale,
        causal,
        dropout_p,
        offset,
        softcap,
        q: strides3(sq, pl(q)),
        k: strides3(sk, pl(k)),
        v: strides3(sv, pl(v)),
        o: strides3(g.shape(o), pl(o)),
        dq,
        dk,
        dvs,
        mask,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::attention as ra;
    use crate::ops::testutil::Rng;
    use crate::ops::MaskView;

    /// Self-attention of (B, H, T, D) contiguous operands, multi-head, scale 1, no causal cut,
    /// dropout, soft-cap or mask: the tests set what they vary.
    fn contig_plan(b: usize, h: usize, t: usize, d: usize) -> AttnPlan {
        let c = [h * t * d, t * d, d];
        AttnPlan {
            b,
            h,
            hkv: h,
            tq: t,
            tk: t,
            d,
            dv: d,
            scale: 1.0,
            causal: false,
            dropout_p: 0.0,
            offset: 0,
            softcap: None,
            q: c,
            k: c,
            v: c,
            o: c,
            dq: c,
            dk: c,
            dvs: c,
            mask: None,
        }
    }

    /// Against the reference on (B=2, H=3, T, D=16) with a padding mask, causal or not, with
    /// and without dropout, soft-capped or not (caps of 0.7 and 2 over scores scale·q·k of a
    /// few units: tanh bends), at T = 33 (one block of full rows, two causal blocks and a row)
    /// and T = 141 (two blocks of full rows: dK and dV summed over blocks): the dropout mask is
    /// the reference's; values differ by summation order (and the Cephes tanh) only:
    /// |Δ| ≤ 2e-5·max|ref| per tensor. The backward's probabilities are recomputed.
    #[test]
    fn forward_and_backward_match_the_reference() {
        let pool = Pool::new(2);
        for (t, causal, dp, with_mask, softcap) in [
            (33usize, false, 0.0f32, true, None),
            (33, true, 0.0, false, None),
            (33, true, 0.3, false, None),
            (33, false, 0.5, true, None),
            (33, true, 0.3, true, Some(0.7f32)),
            (33, false, 0.0, true, Some(2.0)),
            (141, false, 0.2, true, None),
            (141, true, 0.0, true, Some(0.9)),
        ] {
            let (b, h, d) = (2usize, 3usize, 16usize);
            let n = b * h * t * d;
            let mut rng = Rng::new(21 + t as u64);
            let (q, k, v, dout) = (rng.vec_f32(n), rng.vec_f32(n), rng.vec_f32(n), rng.vec_f32(n));
            let mask: Vec<f32> =
                rng.vec_f32(b * t).iter().map(|x| if *x > 0.8 { -1e4 } else { *x }).collect();
            let scale = if softcap.is_some() { 1.5 } else { 0.25 };
            let (seed, offset) = (77, 1000);
            let cfg = ra::AttnCfg { scale, causal, dropout_p: dp, seed, offset, softcap };
            let dims = ra::AttnDims { bh: b * h, rep: 1, tq: t, tk: t, d, dv: d };
            let full = [b, h, t, t];
            let mv = MaskView::new(&mask, &[b, 1, 1, t], &full);
            let (mut o0, mut p0) = (vec![0.0; n], vec![0.0; b * h * t * t]);
            ra::attention_forward(
                &mut o0,
                &mut p0,
                &q,
                &k,
                &v,
                &dims,
                &cfg,
                with_mask.then_some(&mv),
            );
            let plan = AttnPlan {
                scale,
                causal,
                dropout_p: dp,
                offset: 1000,
                softcap,
                mask: with_mask.then(|| MaskMap::new(&[b, 1, 1, t], &full)),
                ..contig_plan(b, h, t, d)
            };
            let (mut o1, mut st) = (vec![f32::NAN; n], vec![f32::NAN; b * h * t * 2]);
            // NaN scratch: every element a kernel reads, it wrote first.
            let mut ws = vec![f32::NAN; plan.backward_workspace(2)];
            unsafe {
                attention_forward(
                    &pool,
                    &plan,
                    o1.as_mut_ptr(),
                    &mut st,
                    q.as_ptr(),
                    k.as_ptr(),
                    v.as_ptr(),
                    with_mask.then_some(&mask[..]),
                    77,
                    &mut ws,
                );
            }
            let check = |a: &[f32], r: &[f32], what: &str| {
                let scale = r.iter().fold(0f32, |m, x| m.max(x.abs()));
                for (i, (x, y)) in a.iter().zip(r).enumerate() {
                    assert!(
                        (x - y).abs() <= 2e-5 * scale,
                        "{what} causal={causal} p={dp} cap={softcap:?} [{i}]: {x} vs {y}"
                    );
                }
            };
            check(&o1, &o0, "out");
            let (mut dq0, mut dk0, mut dv0) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
            ra::attention_backward(
                &mut dq0, &mut dk0, &mut dv0, &dout, &q, &k, &v, &p0, &dims, &cfg,
            );
            let (mut dq1, mut dk1, mut dv1) =
                (vec![f32::NAN; n], vec![f32::NAN; n], vec![f32::NAN; n]);
            unsafe {
                attention_backward(
                    &pool,
                    &plan,
                    (dq1.as_mut_ptr(), dk1.as_mut_ptr(), dv1.as_mut_ptr()),
                    dout.as_ptr(),
                    q.as_ptr(),
                    k.as_ptr(),
                    v.as_ptr(),
                    with_mask.then_some(&mask[..]),
                    &st,
                    77,
                    &mut ws,
                );
            }
            check(&dq1, &dq0, "dq");
            check(&dk1, &dk0, "dk");
            check(&dv1, &dv0, "dv");
        }
    }

    /// The backward's probabilities, rebuilt from the forward's row statistics in one pass, are
    /// the forward's bit for bit: every row block of (B=2, H=2, T=45, D=8), causal or not,
    /// soft-capped or not, under a mask with a row of −∞ (a query that sees no key: zeros) and
    /// HF's finite eager mask (f32::MIN on padded keys, one query row all padded).
    #[test]
    fn recomputed_probabilities_are_the_forwards_bits() {
        let (b, h, t, d) = (2usize, 2usize, 45usize, 8usize);
        let n = b * h * t * d;
        let mut rng = Rng::new(5);
        let (q, k) = (rng.vec_f32(n), rng.vec_f32(n));
        // (B, 1, T, T): batch 0 blocks query row 3 entirely, batch 1 pads keys ≥ 40 and row 7.
        let mut mask = vec![0f32; b * t * t];
        mask[3 * t..4 * t].fill(f32::NEG_INFINITY);
        for r in 0..t {
            for c in 0..t {
                if c >= 40 || r == 7 {
                    mask[t * t + r * t + c] = f32::MIN;
                }
            }
        }
        let full = [b, h, t, t];
        for (causal, softcap) in [(false, None), (true, None), (true, Some(0.8f32))] {
            let plan = AttnPlan {
                scale: 0.5,
                causal,
                softcap,
                mask: Some(MaskMap::new(&[b, 1, t, t], &full)),
                ..contig_plan(b, h, t, d)
            };
            let m = Some((&mask[..], plan.mask.as_ref().unwrap()));
            let mut stats = vec![f32::NAN; b * h * t * 2];
            let (mut fwd, mut again) = (vec![f32::NAN; t * t], vec![f32::NAN; t * t]);
            let mut u = vec![f32::NAN; t * t];
            for i in 0..b * h {
                let (qi, ki) =
                    (q[plan.at(&plan.q, i)..].as_ptr(), k[plan.at(&plan.k, i)..].as_ptr());
                for blk @ (r0, r1, _) in blocks(&plan) {
                    let (rows, st) = (r1 - r0, 2 * (i * t + r0)..2 * (i * t + r1));
                    let (pf, pa) = (&mut fwd[..rows * t], &mut again[..rows * t]);
                    let scores = softcap.map(|_| &mut u[..rows * t]);
                    // SAFETY: q, k hold problem i's rows at the plan's strides.
                    unsafe {
                        let save = RowStats::Save(&mut stats[st.clone()]);
                        block_probs(&plan, i, blk, (qi, ki), m, pf, None, save);
                        let load = RowStats::Load(&stats[st]);
                        block_probs(&plan, i, blk, (qi, ki), m, pa, scores, load);
                    }
                    for (j, (x, y)) in pf.iter().zip(&*pa).enumerate() {
                        assert_eq!(
                            x.to_bits(),
                            y.to_bits(),
                            "causal={causal} cap={softcap:?} problem {i} row {} key {}: {x} vs {y}",
                            r0 + j / t,
                            j % t
                        );
                    }
                    if i == 0 && r0 <= 3 && 3 < r1 {
                        let row = &pf[(3 - r0) * t..(4 - r0) * t];
                        assert!(row.iter().all(|&x| x == 0.0), "a row that sees no key is 0");
                    }
                }
            }
        }
    }

    /// Grouped-query (H = 6, Hkv = 2) and multi-query (Hkv = 1) attention against the reference
    /// at T = 37 (not a multiple of the causal block), D = 5: q and out inside (B, T, H·D) rows,
    /// k and v inside (B, T, Hkv·D) rows (the head permutes folded into strides, as the plan
    /// gives them), causal or not, with dropout, on 3 threads (the (batch, kv head) tasks of
    /// the backward do not split evenly); |Δ| ≤ 2e-5·max|ref| per tensor.
    #[test]
    fn grouped_query_forward_and_backward_match_the_reference() {
        let pool = Pool::new(3);
        let (b, h, t, d) = (2usize, 6usize, 37usize, 5usize);
        // The last case soft-capped (scale 2 puts scale·q·k where tanh bends).
        for (hkv, causal, dp, softcap) in [
            (2usize, true, 0.2f32, None),
            (2, false, 0.0, None),
            (1, true, 0.0, None),
            (2, true, 0.2, Some(0.9f32)),
        ] {
            let scale = if softcap.is_some() { 2.0 } else { 0.4 };
            let (nq, nk) = (b * h * t * d, b * hkv * t * d);
            let mut rng = Rng::new(40 + hkv as u64);
            let (q, k, v, dout) =
                (rng.vec_f32(nq), rng.vec_f32(nk), rng.vec_f32(nk), rng.vec_f32(nq));
            // (B, H, T, D) contiguous for the reference; (B, T, H, D) rows for the kernel.
            let rows = |x: &[f32], heads: usize| {
                let mut y = vec![0f32; x.len()];
                for bi in 0..b {
                    for hi in 0..heads {
                        for ti in 0..t {
                            for e in 0..d {
                                y[((bi * t + ti) * heads + hi) * d + e] =
                                    x[((bi * heads + hi) * t + ti) * d + e];
                            }
                        }
                    }
                }
                y
            };
            let strided = |heads: usize| [t * heads * d, d, heads * d];
            let cfg = ra::AttnCfg { scale, causal, dropout_p: dp, seed: 5, offset: 7, softcap };
            let dims = ra::AttnDims { bh: b * h, rep: h / hkv, tq: t, tk: t, d, dv: d };
            let (mut o0, mut p0) = (vec![0.0; nq], vec![0.0; b * h * t * t]);
            ra::attention_forward(&mut o0, &mut p0, &q, &k, &v, &dims, &cfg, None);
            let (mut dq0, mut dk0, mut dv0) = (vec![0.0; nq], vec![0.0; nk], vec![0.0; nk]);
            ra::attention_backward(
                &mut dq0, &mut dk0, &mut dv0, &dout, &q, &k, &v, &p0, &dims, &cfg,
            );
            let (sq, sk) = (strided(h), strided(hkv));
            let plan = AttnPlan {
                b,
                h,
                hkv,
                tq: t,
                tk: t,
                d,
                dv: d,
                scale,
                causal,
                dropout_p: dp,
                offset: 7,
                softcap,
                q: sq,
                k: sk,
                v: sk,
                o: sq,
                dq: sq,
                dk: sk,
                dvs: sk,
                mask: None,
            };
            let (qr, kr, vr, gr) = (rows(&q, h), rows(&k, hkv), rows(&v, hkv), rows(&dout, h));
            let (mut o1, mut st) = (vec![f32::NAN; nq], vec![f32::NAN; b * h * t * 2]);
            let (mut dq1, mut dk1, mut dv1) =
                (vec![f32::NAN; nq], vec![f32::NAN; nk], vec![f32::NAN; nk]);
            let mut ws = vec![f32::NAN; plan.backward_workspace(3)];
            unsafe {
                attention_forward(
                    &pool,
                    &plan,
                    o1.as_mut_ptr(),
                    &mut st,
                    qr.as_ptr(),
                    kr.as_ptr(),
                    vr.as_ptr(),
                    None,
                    5,
                    &mut ws,
                );
                attention_backward(
                    &pool,
                    &plan,
                    (dq1.as_mut_ptr(), dk1.as_mut_ptr(), dv1.as_mut_ptr()),
                    gr.as_ptr(),
                    qr.as_ptr(),
                    kr.as_ptr(),
                    vr.as_ptr(),
                    None,
                    &st,
                    5,
                    &mut ws,
                );
            }
            let check = |a: &[f32], r: &[f32], what: &str| {
                let scale = r.iter().fold(0f32, |m, x| m.max(x.abs()));
                for (i, (x, y)) in a.iter().zip(r).enumerate() {
                    assert!(
                        (x - y).abs() <= 2e-5 * scale,
                        "{what} hkv={hkv} causal={causal} p={dp} cap={softcap:?} [{i}]: {x} vs {y}"
                    );
                }
            };
            check(&o1, &rows(&o0, h), "out");
            check(&dq1, &rows(&dq0, h), "dq");
            check(&dk1, &rows(&dk0, hkv), "dk");
            check(&dv1, &rows(&dv0, hkv), "dv");
        }
    }
}
