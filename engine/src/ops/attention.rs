//! Scaled dot-product attention: out = dropout(softmax(Q·Kᵀ·scale + mask)) · V, per (batch, head).
//!
//! Mirrors `torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p,
//! is_causal, scale)` (its math path) and llm.c's `attention_forward` / `attention_backward`.
//! The forward returns the pre-dropout probabilities for the backward (a flash-style fused
//! kernel will recompute them instead); the dropout mask is regenerated from (seed, offset).

use super::def::{EvalArgs, GradCtx, Grads, OpDef, Reference};
use super::dropout::{keep, keep_scale};
use super::softmax::softmax_in_place;
use super::OpError;
use super::{MaskView, Real};
use crate::graph::builder::{broadcastable, check_p, shape_err};
use crate::graph::{ElemType, Graph, TensorId};
use crate::graph::{GraphError, Op};
use crate::plan::Req;

/// Options of [`Graph::attention`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionOpts {
    /// Query i attends to keys j ≤ i (GPT-2).
    pub causal: bool,
    /// Multiplier of Q·Kᵀ; `None` means 1/√D, as PyTorch's default.
    pub scale: Option<f32>,
    /// Dropout on the attention probabilities.
    pub dropout_p: f32,
    /// Additive mask broadcastable to (B, H, Tq, Tk), e.g. BERT's (B, 1, 1, T) padding mask.
    pub mask: Option<TensorId>,
    /// Tanh soft-cap `cap` of the scores before the mask: cap·tanh(scale·q·kᵀ) (Gemma 2's
    /// `attn_logit_softcapping`; HF's cap·tanh(scaling·q·kᵀ / cap) is scale = scaling / cap).
    pub softcap: Option<f32>,
}

impl Default for AttentionOpts {
    fn default() -> Self {
        AttentionOpts { causal: false, scale: None, dropout_p: 0.0, mask: None, softcap: None }
    }
}

/// [`Attention`]'s operands by name: the node's input slots.
pub mod slot {
    pub const Q: usize = 0;
    pub const K: usize = 1;
    pub const V: usize = 2;
    /// The optional additive mask, last.
    pub const MASK: usize = 3;
}

/// [`AttentionBackward`]'s operands by name: the node's input slots.
pub mod backward_slot {
    pub const DOUT: usize = 0;
    pub const Q: usize = 1;
    pub const K: usize = 2;
    pub const V: usize = 3;
    /// The forward's second output: the probabilities in the reference, each query row's
    /// softmax statistics in the CPU and GPU kernels (which recompute the probabilities).
    pub const PROBS: usize = 4;
    /// The forward's output (read by the GPU kernels, with the mask).
    pub const OUT: usize = 5;
    /// The optional additive mask, last.
    pub const MASK: usize = 6;
}

/// (q (B, H, Tq, D), k (B, Hkv, Tk, D), v (B, Hkv, Tk, Dv) [, mask broadcastable to
/// (B, H, Tq, Tk)]) → (out (B, H, Tq, Dv), probs (B, H, Tq, Tk)); probs are the
/// pre-dropout softmax, for the backward, not differentiable (what a backend stores of them:
/// [`backward_slot::PROBS`]). Hkv divides H
/// (grouped-query / multi-query attention): query head h reads kv head h / (H/Hkv), HF's
/// `repeat_kv` order, without the repeated K/V being materialised. With `softcap` the scores
/// are cap·tanh(scale·q·kᵀ) before the mask ([`AttentionOpts::softcap`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Attention {
    pub scale: f32,
    pub causal: bool,
    pub dropout_p: f32,
    pub offset: u64,
    pub softcap: Option<f32>,
}

impl Reference for Attention {
    fn eval<T: Real>(&self, a: &EvalArgs<'_, T>, outs: &mut [Vec<T>]) -> Result<(), OpError> {
        let dims = AttnDims::of(a.shape(slot::Q), a.shape(slot::K), a.shape(slot::V));
        let Attention { scale, causal, dropout_p, offset, softcap } = *self;
        let cfg = AttnCfg { scale, causal, dropout_p, seed: a.seed, offset, softcap };
        let m = a.mask(slot::MASK, a.out_shape(1));
        let [out, probs] = outs else { unreachable!("attention has 2 outputs") };
        let (q, k, v) = (a.f(slot::Q), a.f(slot::K), a.f(slot::V));
        attention_forward(out, probs, q, k, v, &dims, &cfg, m.as_ref());
        Ok(())
    }
}

impl OpDef for Attention {
    fn name(&self) -> &'static str {
        "attention"
    }

    // (out, probs): the probabilities are for the backward.
    fn differentiable_outputs(&self, _outputs: usize) -> usize {
        1
    }

    fn attrs(&self) -> String {
        // The soft-cap only where there is one, so that uncapped nodes read as before.
        let Attention { scale, causal, dropout_p, offset, softcap } = *self;
        let mut s = format!("scale={scale} causal={causal} p={dropout_p} offset={offset}");
        if let Some(cap) = softcap {
            s += &format!(" softcap={cap}");
        }
        s
    }

    fn read_req(&self, slot: usize) -> Req {
        // q, k, v: a head's rows inside a (B, T, C) row; the mask is dense.
        if slot < slot::MASK {
            Req::Rows
        } else {
            Req::Contig
        }
    }

    fn write_req(&self, slot: usize) -> Req {
        // out: a head's rows inside a (B, T, C) row; the probabilities dense.
        if slot == 0 {
            Req::Rows
        } else {
            Req::Contig
        }
    }

    fn grad(&self, cx: &mut GradCtx<'_>) -> Result<Grads, GraphError> {
        cx.no_mask_grad(slot::MASK)?;
        let (ins, outs, dy) = (cx.ins(), cx.outs(), cx.gy()?);
        let Attention { scale, causal, dropout_p, offset, softcap } = *self;
        let attrs =
            Op::AttentionBackward(AttentionBackward { scale, causal, dropout_p, offset, softcap });
        let d = cx.g.attention_backward(
            attrs,
            dy,
            ins[slot::Q],
            ins[slot::K],
            ins[slot::V],
            outs[1],
            outs[0],
            ins.get(slot::MASK).copied(),
        )?;
        Ok(d.into_iter().map(Some).chain([None]).collect())
    }
}

/// (dout, q, k, v, probs, out[, mask]) → (dq, dk, dv); the CPU and GPU kernels read the rows'
/// softmax statistics in `probs`' place and the mask (they recompute the probabilities; the GPU
/// kernels read `out` too), the reference the probabilities.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionBackward {
    pub scale: f32,
    pub causal: bool,
    pub dropout_p: f32,
    pub offset: u64,
    pub softcap: Option<f32>,
}

impl AttentionBackward {
    /// The forward node's attributes (the same fields).
    pub fn forward(&self) -> Attention {
        let AttentionBackward { scale, causal, dropout_p, offset, softcap } = *self;
        Attention { scale, causal, dropout_p, offset, softcap }
    }
}

impl Reference for AttentionBackward {
    fn eval<T: Real>(&self, a: &EvalArgs<'_, T>, outs: &mut [Vec<T>]) -> Result<(), OpError> {
        use backward_slot as s;
        let dims = AttnDims::of(a.shape(s::Q), a.shape(s::K), a.shape(s::V));
        let AttentionBackward { scale, causal, dropout_p, offset, softcap } = *self;
        let cfg = AttnCfg { scale, causal, dropout_p, seed: a.seed, offset, softcap };
        let [dq, dk, dv] = outs else { unreachable!("attention_backward has 3 outputs") };
        let (dout, q, k, v, probs) = (a.f(s::DOUT), a.f(s::Q), a.f(s::K), a.f(s::V), a.f(s::PROBS));
        attention_backward(dq, dk, dv, dout, q, k, v, probs, &dims, &cfg);
        Ok(())
    }
}

impl OpDef for AttentionBackward {
    fn name(&self) -> &'static str {
        "attention_backward"
    }

    fn attrs(&self) -> String {
        self.forward().attrs()
    }

    fn read_req(&self, slot: usize) -> Req {
        // (dout, q, k, v) and the forward's output by rows; the saved statistics and the mask
        // dense.
        use backward_slot as s;
        if slot < s::PROBS || slot == s::OUT {
            Req::Rows
        } else {
            Req::Contig
        }
    }

    fn write_req(&self, _slot: usize) -> Req {
        // dq, dk, dv: a head's rows inside a (B, T, C) row.
        Req::Rows
    }
}

/// Sizes: `bh` = batch·heads independent problems of Tq queries against Tk keys. `rep` query
/// heads share one kv head (grouped-query attention; 1 = multi-head): with H query heads and
/// Hkv = H/rep kv heads, problem i = b·H + h reads kv problem b·Hkv + h/rep = i/rep, HF's
/// `repeat_kv` order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttnDims {
    pub bh: usize,
    pub rep: usize,
    pub tq: usize,
    pub tk: usize,
    pub d: usize,
    pub dv: usize,
}

/// Attributes: `causal` masks keys j > i (top-left aligned, as `torch.tril`); dropout applies to
/// the probabilities, counter = offset + flat index into probs; `softcap` caps the scores to
/// cap·tanh(scale·q·k) before the mask.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnCfg {
    pub scale: f32,
    pub causal: bool,
    pub dropout_p: f32,
    pub seed: u64,
    pub offset: u64,
    pub softcap: Option<f32>,
}

impl AttnDims {
    /// q (B, H, Tq, D), k (B, Hkv, Tk, D), v (B, Hkv, Tk, Dv) → the kernel's sizes.
    pub fn of(q: &[usize], k: &[usize], v: &[usize]) -> AttnDims {
        AttnDims { bh: q[0] * q[1], rep: q[1] / k[1], tq: q[2], tk: k[2], d: q[3], dv: v[3] }
    }
}

impl AttnCfg {
    /// The score of u = scale·q·k, before the mask: u, or cap·tanh(u) with a soft-cap; and its
    /// slope ds/du: 1, or cap·(1 − tanh²u).
    fn score<T: Real>(&self, u: T) -> (T, T) {
        match self.softcap {
            None => (u, T::ONE),
            Some(cap) => {
                let (c, t) = (T::from_f64(cap as f64), u.tanh());
                (c * t, c * (T::ONE - t * t))
            }
        }
    }

    /// The factor dropout multiplies probability (bh, i, j) by: 0 or 1/(1-p).
    fn drop_factor<T: Real>(&self, counter: u64) -> T {
        if self.dropout_p == 0.0 {
            T::ONE
        } else if keep(self.seed, self.offset + counter, self.dropout_p) {
            keep_scale(self.dropout_p)
        } else {
            T::ZERO
        }
    }
}

// out: (BH, Tq, Dv)
// probs: (BH, Tq, Tk), softmax before dropout
// q: (BH, Tq, D)
// k: (BH/rep, Tk, D)
// v: (BH/rep, Tk, Dv)
// mask: broadcastable to (B, H, Tq, Tk)
#[allow(
    clippy::too_many_arguments,
    reason = "the op's operands and dimensions, as torch's sdpa takes them"
)]
pub fn attention_forward<T: Real>(
    out: &mut [T],
    probs: &mut [T],
    q: &[T],
    k: &[T],
    v: &[T],
    dims: &AttnDims,
    cfg: &AttnCfg,
    mask: Option<&MaskView<'_, T>>,
) {
    let AttnDims { bh, rep, tq, tk, d, dv } = *dims;
    let scale = T::from_f64(cfg.scale as f64);
    for qb in 0..bh {
        // The kv head this query head reads.
        let b = qb / rep;
        for i in 0..tq {
            let row = qb * tq + i;
            let qi = &q[row * d..(row + 1) * d];
            let p = &mut probs[row * tk..(row + 1) * tk];
            let moff = mask.map(|m| m.row_offset(row));
            for j in 0..tk {
                if cfg.causal && j > i {
                    p[j] = T::NEG_INFINITY;
                    continue;
                }
                let kj = &k[(b * tk + j) * d..(b * tk + j + 1) * d];
                let mut s = T::ZERO;
                for e in 0..d {
                    s += qi[e] * kj[e];
                }
                p[j] = cfg.score(s * scale).0;
                if let (Some(m), Some(off)) = (mask, moff) {
                    p[j] += m.at(off, j);
                }
            }
            softmax_in_place(p);
            let o = &mut out[row * dv..(row + 1) * dv];
            o.fill(T::ZERO);
            for j in 0..tk {
                let w = p[j] * cfg.drop_factor::<T>((row * tk + j) as u64);
                let vj = &v[(b * tk + j) * dv..(b * tk + j + 1) * dv];
                for e in 0..dv {
                    o[e] += w * vj[e];
                }
            }
        }
    }
}

/// With P = probs and Pd = dropout(P): dV = Pdᵀ·dO; dP = dropout(dO·Vᵀ);
/// dS = P ⊙ (dP - rowsum(dP ⊙ P)) ⊙ slope; dQ = scale·dS·K; dK = scale·dSᵀ·Q, the slope the
/// soft-cap's cap·(1 − tanh²(scale·q·k)) (1 without one). A kv head's dK and dV sum over the
/// `rep` query heads that read it.
// dq: (BH, Tq, D)
// dk: (BH/rep, Tk, D)
// dv: (BH/rep, Tk, Dv)
// dout: (BH, Tq, Dv)
// q, k, v: as in attention_forward
// probs: (BH, Tq, Tk)
#[allow(
    clippy::too_many_arguments,
    reason = "the op's operands and dimensions, as torch's sdpa takes them"
)]
pub fn attention_backward<T: Real>(
    dq: &mut [T],
    dk: &mut [T],
    dv: &mut [T],
    dout: &[T],
    q: &[T],
    k: &[T],
    v: &[T],
    probs: &[T],
    dims: &AttnDims,
    cfg: &AttnCfg,
) {
    let AttnDims { bh, rep, tq, tk, d, dv: dvd } = *dims;
    let scale = T::from_f64(cfg.scale as f64);
    dq.fill(T::ZERO);
    dk.fill(T::ZERO);
    dv.fill(T::ZERO);
    let mut dp = vec![T::ZERO; tk];
    for qb in 0..bh {
        let b = qb / rep;
        for i in 0..tq {
            let row = qb * tq + i;
            let p = &probs[row * tk..(row + 1) * tk];
            let go = &dout[row * dvd..(row + 1) * dvd];
            for j in 0..tk {
                let f: T = cfg.drop_factor((row * tk + j) as u64);
                let kv = (b * tk + j) * dvd;
                let mut s = T::ZERO;
                for e in 0..dvd {
                    s += go[e] * v[kv + e];
                    dv[kv + e] += p[j] * f * go[e];
                }
                dp[j] = s * f;
            }
            let mut sum = T::ZERO;
            for j in 0..tk {
                sum += dp[j] * p[j];
            }
            for j in 0..tk {
                let kj = (b * tk + j) * d;
                let slope = match cfg.softcap {
                    None => T::ONE,
                    Some(_) => {
                        let mut u = T::ZERO;
                        for e in 0..d {
                            u += q[row * d + e] * k[kj + e];
                        }
                        cfg.score(u * scale).1
                    }
                };
                let ds = p[j] * (dp[j] - sum) * scale * slope;
                for e in 0..d {
                    dq[row * d + e] += ds * k[kj + e];
                    dk[kj + e] += ds * q[row * d + e];
                }
            }
        }
    }
}

/// The op's graph constructors: operand checks and the output shape rule.
impl Graph {
    /// softmax(Q·Kᵀ·scale + mask)·V with optional causal mask and dropout on the probabilities.
    /// q (B, H, Tq, D), k (B, H, Tk, D), v (B, H, Tk, Dv) → (B, H, Tq, Dv).
    pub fn attention(
        &mut self,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        opts: AttentionOpts,
    ) -> Result<TensorId, GraphError> {
        self.attention_at(q, k, v, opts, None)
    }

    /// [`Graph::attention`] whose dropout uses the counters at `offset` (a fused dropout site
    /// keeps its counters: `passes::fuse_attention`), or fresh ones when None.
    pub(crate) fn attention_at(
        &mut self,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        opts: AttentionOpts,
        offset: Option<u64>,
    ) -> Result<TensorId, GraphError> {
        let op = "attention";
        let (sq, dt) = self.float_arg(op, "q", q)?;
        let (sk, _) = self.float_arg(op, "k", k)?;
        let (sv, _) = self.float_arg(op, "v", v)?;
        let named: &[(&str, &[usize])] = &[("q", &sq), ("k", &sk), ("v", &sv)];
        if sq.len() != 4 || sk.len() != 4 || sv.len() != 4 {
            return Err(shape_err(op, "q, k, v must be 4-D (B, H, T, D)", named));
        }
        // Grouped-query / multi-query attention: Hkv kv heads, each read by H/Hkv query heads.
        if sk[0] != sq[0]
            || sk[1] == 0
            || sq[1] % sk[1] != 0
            || sk[3] != sq[3]
            || sv[..3] != sk[..3]
        {
            return Err(shape_err(
                op,
                "need q (B,H,Tq,D), k (B,Hkv,Tk,D), v (B,Hkv,Tk,Dv) with Hkv dividing H",
                named,
            ));
        }
        check_p(op, opts.dropout_p)?;
        if let Some(cap) = opts.softcap {
            if !(cap.is_finite() && cap > 0.0) {
                let msg = format!("the soft-cap must be finite and positive, got {cap}");
                return Err(GraphError::Attr { op, msg });
            }
        }
        let probs_shape = vec![sq[0], sq[1], sq[2], sk[2]];
        let mut inputs = vec![q, k, v];
        if let Some(m) = opts.mask {
            let (sm, _) = self.float_arg(op, "mask", m)?;
            if !broadcastable(&sm, &probs_shape) {
                return Err(shape_err(
                    op,
                    "mask must broadcast to (B, H, Tq, Tk)",
                    &[("q", &sq), ("k", &sk), ("mask", &sm)],
                ));
            }
            inputs.push(m);
        }
        let scale = opts.scale.unwrap_or(1.0 / (sq[3] as f32).sqrt());
        let offset = match offset {
            Some(o) => o,
            None => {
                let o = self.rng_offset;
                if opts.dropout_p > 0.0 {
                    self.rng_offset += probs_shape.iter().product::<usize>() as u64;
                }
                o
            }
        };
        let out = vec![sq[0], sq[1], sq[2], sv[3]];
        let attrs = Op::Attention(Attention {
            scale,
            causal: opts.causal,
            dropout_p: opts.dropout_p,
            offset,
            softcap: opts.softcap,
        });
        Ok(self.push(
            attrs,
            inputs,
            vec![(out, ElemType::Float(dt)), (probs_shape, ElemType::Float(dt))],
        )[0])
    }

    /// (dout, q, k, v, probs, out[, mask]) → [dq, dk, dv], attributes copied from the forward
    /// node. The reference reads the saved probabilities; the CPU and GPU kernels save each
    /// query row's softmax statistics in `probs`' place (max and 1/sum on the CPU, max and
    /// log-sum on a GPU) and recompute the probabilities from q, k and the mask; the GPU's
    /// also need the forward's output (FlashAttention-2's D = rowsum(dO ∘ O)).
    #[allow(
        clippy::too_many_arguments,
        reason = "the attention node's inputs and attributes, as ops/attention.rs defines them"
    )]
    pub(crate) fn attention_backward(
        &mut self,
        attrs: Op,
        dout: TensorId,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        probs: TensorId,
        out: TensorId,
        mask: Option<TensorId>,
    ) -> Result<Vec<TensorId>, GraphError> {
        let op = "attention_backward";
        let (so, dt) = self.float_arg(op, "dout", dout)?;
        let (sq, _) = self.float_arg(op, "q", q)?;
        let (sk, _) = self.float_arg(op, "k", k)?;
        let (sv, _) = self.float_arg(op, "v", v)?;
        let (sp, _) = self.float_arg(op, "probs", probs)?;
        let (sout, _) = self.float_arg(op, "out", out)?;
        if let Some(m) = mask {
            self.float_arg(op, "mask", m)?;
        }
        let ok = sout == so
            && sq.len() == 4
            && sk.len() == 4
            && sv.len() == 4
            && so[..] == [sq[0], sq[1], sq[2], sv[3]]
            && sp[..] == [sq[0], sq[1], sq[2], sk[2]];
        if !ok || !matches!(attrs, Op::AttentionBackward(_)) {
            let named: &[(&str, &[usize])] =
                &[("dout", &so), ("q", &sq), ("k", &sk), ("v", &sv), ("probs", &sp)];
            return Err(shape_err(op, "inconsistent operands", named));
        }
        let f = ElemType::Float(dt);
        let mut inputs = vec![dout, q, k, v, probs, out];
        inputs.extend(mask);
        Ok(self.push(attrs, inputs, vec![(sq, f), (sk, f), (sv, f)]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testutil::*;

    #[test]
    fn backward_matches_finite_differences() {
        // (B=2, H=2, T=4, D=3), mask (B, 1, 1, T).
        let (b, h, t, d) = (2, 2, 4, 3);
        let dims = AttnDims { bh: b * h, rep: 1, tq: t, tk: t, d, dv: d };
        let mut rng = Rng::new(13);
        let (q, k, v) = (rng.vec(b * h * t * d), rng.vec(b * h * t * d), rng.vec(b * h * t * d));
        let mask_data = rng.vec(b * t);
        let dout = rng.vec(b * h * t * d);
        let full = [b, h, t, t];
        // Soft-caps of 0.8 and 1.5 against scores of up to ~2: tanh bends.
        for (causal, p, softcap) in [
            (false, 0.0, None),
            (true, 0.0, None),
            (true, 0.3, None),
            (false, 0.5, None),
            (true, 0.3, Some(0.8)),
            (false, 0.0, Some(1.5)),
        ] {
            let cfg = AttnCfg { scale: 0.6, causal, dropout_p: p, seed: 3, offset: 100, softcap };
            let mask = MaskView::new(&mask_data, &[b, 1, 1, t], &full);
            let fwd = |q: &[f64], k: &[f64], v: &[f64]| {
                let (mut o, mut pr) = (vec![0.0; b * h * t * d], vec![0.0; b * h * t * t]);
                attention_forward(&mut o, &mut pr, q, k, v, &dims, &cfg, Some(&mask));
                (o, pr)
            };
            let (_, probs) = fwd(&q, &k, &v);
            let n = b * h * t * d;
            let (mut dq, mut dk, mut dv) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
            attention_backward(&mut dq, &mut dk, &mut dv, &dout, &q, &k, &v, &probs, &dims, &cfg);
            let what = format!("causal={causal} p={p} softcap={softcap:?}");
            let fq = fd_grad(&q, FD_STEP, |q| dot(&fwd(q, &k, &v).0, &dout));
            let fk = fd_grad(&k, FD_STEP, |k| dot(&fwd(&q, k, &v).0, &dout));
            let fv = fd_grad(&v, FD_STEP, |v| dot(&fwd(&q, &k, v).0, &dout));
            assert_close(&dq, &fq, FD_TOL, &format!("dq {what}"));
            assert_close(&dk, &fk, FD_TOL, &format!("dk {what}"));
            assert_close(&dv, &fv, FD_TOL, &format!("dv {what}"));
        }
    }

    /// One head, no mask, no dropout: against the definition written out, the scores as they
    /// are and soft-capped (HF's Gemma 2: cap·tanh(scaling·q·k / cap), here scale = 0.5 / cap).
    #[test]
    fn equals_softmax_of_scores_times_v() {
        let dims = AttnDims { bh: 1, rep: 1, tq: 2, tk: 3, d: 2, dv: 2 };
        let mut rng = Rng::new(14);
        let (q, k, v) = (rng.vec(4), rng.vec(6), rng.vec(6));
        for softcap in [None, Some(0.3)] {
            let cap = softcap.map_or(1.0, f64::from);
            let (scale, seed, offset) = ((0.5 / cap) as f32, 0, 0);
            let cfg = AttnCfg { scale, causal: false, dropout_p: 0.0, seed, offset, softcap };
            let (mut o, mut p) = (vec![0.0; 4], vec![0.0; 6]);
            attention_forward(&mut o, &mut p, &q, &k, &v, &dims, &cfg, None);
            for i in 0..2 {
                let mut s: Vec<f64> = (0..3)
                    .map(|j| 0.5 * (q[i * 2] * k[j * 2] + q[i * 2 + 1] * k[j * 2 + 1]))
                    .map(|x| if softcap.is_some() { cap * (x / cap).tanh() } else { x })
                    .collect();
                softmax_in_place(&mut s);
                for e in 0..2 {
                    let want: f64 = (0..3).map(|j| s[j] * v[j * 2 + e]).sum();
                    // The capped scale is rounded to f32 (the attribute's type).
                    let tol = if softcap.is_some() { 1e-7 } else { 1e-14 };
                    assert!((o[i * 2 + e] - want).abs() < tol, "softcap={softcap:?}");
                }
            }
        }
    }
}
