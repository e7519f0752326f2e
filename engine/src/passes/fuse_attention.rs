//! Eager attention into [`Op::Attention`]:
//! `matmul(q, kᵀ) → [scale] → softmax(scale, causal, [mask]) → [dropout] → matmul(·, v)`
//! ⇒ `attention(q, k, v, [mask])` with the same scale, causal flag, mask, dropout p and the
//! dropout site's RNG counters (so the mask of kept probabilities is bit-identical).
//!
//! kᵀ is either the matmul's `tb` flag (after `fold_transpose`) or a permute swapping k's
//! last two dims; a mask add and a scale still in front of the softmax (when `fuse_softmax` is
//! off) are folded too, by `fuse_softmax`'s rules.
//!
//! Gemma 2's soft-capped scores, `softcap(scale·q·kᵀ)` = scale(cap) → tanh → scale(1/cap)
//! under the softmax (HF's `attn_weights / softcap; tanh; * softcap`), fuse into the op's
//! `softcap`: the scale gathered above the tanh (the softmax's, or the scale node it folds)
//! is the cap, the scales under it the op's scale. Every intermediate (scores, probabilities, dropped probabilities) must be read by the
//! chain only, since the fused op does not materialise them — it saves only the pre-dropout
//! probabilities for its backward, and its CPU kernel computes a (batch, head) pair's rows
//! while they are in cache.
//!
//! Grouped-query attention: when K or V reaches the chain through HF's `repeat_kv` as
//! [`Graph::repeat_kv`] writes it — x (B, Hkv, T, D) → reshape (B, Hkv, 1, T·D) → concat of
//! n copies of that one tensor along the last dim → reshape (B, Hkv·n, T, D) — the fused op
//! reads x itself ([`Op::Attention`] takes Hkv kv heads), and the repeat's nodes go with the
//! chain where nothing else reads them.
//!
//! Reference: ORT `AttentionFusion` and its training counterpart; PyTorch
//! `scaled_dot_product_attention`'s math path.

use super::fold_transpose::swaps_last_two;
use super::rewrite::{param_dependent, Rewrite, Uses};
use crate::graph::op::{Dropout, MatMul, Permute, Scale, Softmax};
use crate::graph::{AttentionOpts, Graph, GraphError, Node, Op, TensorId};

/// The chain ending at matmul node `o`, if it is one.
struct Chain {
    q: TensorId,
    k: TensorId,
    v: TensorId,
    mask: Option<TensorId>,
    scale: f32,
    softcap: Option<f32>,
    causal: bool,
    dropout: Option<(f32, u64)>,
    nodes: Vec<usize>,
}

fn find(g: &Graph, uses: &Uses, dep: &[bool], o: usize, n: &Node) -> Option<Chain> {
    let Op::MatMul(MatMul { ta: false, tb: false }) = n.op else { return None };
    let (mut probs, v) = (n.inputs[0], n.inputs[1]);
    let mut nodes = vec![o];
    let sole = |t: TensorId, pred: fn(&Op) -> bool| {
        uses.single_use(t).then(|| uses.producer_if(g, t, pred)).flatten()
    };
    let mut dropout = None;
    if let Some((d, dn)) = sole(probs, |op| matches!(op, Op::Dropout(_))) {
        let Op::Dropout(Dropout { p, offset }) = dn.op else { unreachable!() };
        dropout = Some((p, offset));
        probs = dn.inputs[0];
        nodes.push(d);
    }
    let (s, sn) = sole(probs, |op| matches!(op, Op::Softmax(_)))?;
    let Op::Softmax(Softmax { mut scale, causal }) = sn.op else { unreachable!() };
    let mut mask = sn.inputs.get(1).copied();
    nodes.push(s);
    let mut scores = sn.inputs[0];
    // A mask still added in front (as `fuse_softmax` would fold it).
    if mask.is_none() && scale == 1.0 {
        if let Some((a, an)) = sole(scores, |op| matches!(op, Op::Add)) {
            if dep[an.inputs[0].index()] && !dep[an.inputs[1].index()] {
                mask = Some(an.inputs[1]);
                scores = an.inputs[0];
                nodes.push(a);
            }
        }
    }
    // Scales read by the chain alone fold into one factor, outermost first.
    let fold_scales = |scores: &mut TensorId, scale: &mut f32, nodes: &mut Vec<usize>| {
        while let Some((p, pn)) = sole(*scores, |op| matches!(op, Op::Scale(_))) {
            let Op::Scale(Scale { s }) = pn.op else { unreachable!() };
            *scale *= s;
            *scores = pn.inputs[0];
            nodes.push(p);
        }
    };
    fold_scales(&mut scores, &mut scale, &mut nodes);
    // cap·tanh(u): the factor so far is the cap (a positive one: the op's range), u's scales
    // the op's scale.
    let mut softcap = None;
    if let Some((t, tn)) = sole(scores, |op| matches!(op, Op::Tanh)) {
        if !(scale.is_finite() && scale > 0.0) {
            return None;
        }
        softcap = Some(scale);
        scale = 1.0;
        scores = tn.inputs[0];
        nodes.push(t);
        fold_scales(&mut scores, &mut scale, &mut nodes);
    }
    let (m, mn) = sole(scores, |op| matches!(op, Op::MatMul(MatMul { ta: false, .. })))?;
    let Op::MatMul(MatMul { tb, .. }) = mn.op else { unreachable!() };
    nodes.push(m);
    let (q, kk) = (mn.inputs[0], mn.inputs[1]);
    // Whether k's reader (the score matmul, or the transpose in front of it) goes with the
    // chain: a repeat in front of k may go only then.
    let (k, k_reader_removed) = if tb {
        (kk, true)
    } else {
        let (p, pn) = uses.producer_if(
            g,
            kk,
            |op| matches!(op, Op::Permute(Permute { perm }) if swaps_last_two(perm)),
        )?;
        let sole = uses.single_use(kk);
        if sole {
            nodes.push(p);
        }
        (pn.inputs[0], sole)
    };
    let k = unrepeat(g, uses, k, k_reader_removed, &mut nodes);
    let v = unrepeat(g, uses, v, true, &mut nodes);
    Some(Chain { q, k, v, mask, scale, softcap, causal, dropout, nodes })
}

/// The tensor x that `t` repeats when `t` is [`Graph::repeat_kv`]'s
/// `reshape(concat(n × reshape(x, (B, Hkv, 1, T·D))), (B, Hkv·n, T, D))`, else `t`. The
/// repeat's nodes join `nodes` (to be removed) from the outside in, each only when its
/// output's one reader goes too (`reader_removed` for t's reader).
fn unrepeat(
    g: &Graph,
    uses: &Uses,
    t: TensorId,
    reader_removed: bool,
    nodes: &mut Vec<usize>,
) -> TensorId {
    let found = (|| {
        let (r2, r2n) = uses.producer_if(g, t, |op| matches!(op, Op::Reshape))?;
        let rep = r2n.inputs[0];
        let (c, cn) = uses.producer_if(g, rep, |op| matches!(op, Op::Concat))?;
        let flat = cn.inputs[0];
        let n = cn.inputs.len();
        if n < 2 || cn.inputs.iter().any(|&i| i != flat) {
            return None;
        }
        let (r1, r1n) = uses.producer_if(g, flat, |op| matches!(op, Op::Reshape))?;
        let x = r1n.inputs[0];
        let (sx, st) = (g.shape(x), g.shape(t));
        let [b, hkv, tt, d] = sx[..] else { return None };
        let ok = g.shape(flat) == [b, hkv, 1, tt * d]
            && g.shape(rep) == [b, hkv, 1, n * tt * d]
            && st == [b, hkv * n, tt, d];
        ok.then_some((x, [r2, c, r1], flat, rep))
    })();
    let Some((x, [r2, c, r1], flat, rep)) = found else { return t };
    if reader_removed && uses.single_use(t) {
        nodes.push(r2);
        if uses.single_use(rep) {
            nodes.push(c);
            // The concat reads the flat tensor n times, and nothing else reads it.
            if !uses.root[flat.index()] && uses.consumers[flat.index()].iter().all(|&i| i == c) {
                nodes.push(r1);
            }
        }
    }
    x
}

pub fn run(g: &Graph) -> Result<(Graph, usize), GraphError> {
    let uses = Uses::new(g);
    let dep = param_dependent(g);
    let mut rw = Rewrite::new(g);
    for (o, n) in g.nodes().iter().enumerate() {
        let Some(c) = find(g, &uses, &dep, o, n) else { continue };
        let (p, offset) = c.dropout.unwrap_or((0.0, 0));
        let opts = AttentionOpts {
            causal: c.causal,
            scale: Some(c.scale),
            dropout_p: p,
            mask: c.mask,
            softcap: c.softcap,
        };
        // Shapes the fused op does not take (not 4-D, …) leave the chain as it is.
        let Ok(out) = rw.insert_before(o, |g| g.attention_at(c.q, c.k, c.v, opts, Some(offset)))
        else {
            continue;
        };
        rw.replace(n.outputs[0], out);
        for &i in &c.nodes {
            rw.remove(i);
        }
        rw.count += 1;
    }
    let count = rw.count;
    Ok((rw.finish()?, count))
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::super::{fold_transpose, fuse_softmax};
    use super::*;

    /// Straight from the eager form (transpose and scale still there), dropout on: the
    /// fused op uses the dropout site's counters, so the numbers agree to rounding.
    #[test]
    fn eager_attention_fuses_and_nothing_changes() {
        let g = eager_gpt(2, 5, 8, 2, 11, 2, 0.2);
        let (after, n) = show("fuse_attention", &g, run);
        assert_eq!(n, 2);
        let c = op_counts(&after);
        assert_eq!((c["attention"], c.get("softmax"), c.get("scale")), (2, None, None));
        assert_eq!(c["dropout"], op_counts(&g)["dropout"] - 2);
        assert_eq!(c["matmul"], op_counts(&g)["matmul"] - 4);
        assert_same_numbers(&g, &after, 1e-10, true);
    }

    /// After fold_transpose and fuse_softmax (the default order).
    #[test]
    fn fuses_after_the_transpose_and_softmax_passes() {
        let g = eager_gpt(2, 6, 8, 2, 13, 1, 0.1);
        let (g1, _) = fold_transpose::run(&g).unwrap();
        let (g2, _) = fuse_softmax::run(&g1).unwrap();
        let (after, n) = show("fuse_attention", &g2, run);
        assert_eq!(n, 1);
        assert_eq!(op_counts(&after)["attention"], 1);
        assert_same_numbers(&g, &after, 1e-10, true);
    }

    /// A Llama-like forward graph as HF's eager code writes it: embedding, RMSNorm, q/k/v
    /// projections without bias, heads permuted out, `repeat_kv` on k and v (H = 6 query heads
    /// over `hkv` kv heads), q·kᵀ through a transpose, scale, [additive (T, T) mask], causal
    /// softmax, dropout, ·v, heads merged, o projection, residual, RMSNorm, tied head,
    /// cross-entropy. Loss set. With `softcap`, the scaled scores are soft-capped as HF's Gemma 2
    /// writes it: scale(1/cap) → tanh → scale(cap), before the mask.
    fn eager_gqa(hkv: usize, with_mask: bool, dropout: f32, softcap: Option<f32>) -> Graph {
        let (b, t, h, d, v) = (2, 5, 6, 4, 11);
        let c = h * d;
        let r = || -> Result<Graph, GraphError> {
            let mut g = Graph::new();
            let ids = g.input_ids("input_ids", &[b, t])?;
            let labels = g.input_ids("labels", &[b, t])?;
            let wte = g.param("wte", &[v, c])?;
            let x = g.embedding(wte, ids)?;
            let ln = g.param("ln.weight", &[c])?;
            let hs = g.rms_norm(x, ln, 1e-6)?;
            let proj = |g: &mut Graph, name: &str, n: usize| -> Result<TensorId, GraphError> {
                let w = g.param(name, &[n * d, c])?;
                let y = g.linear(hs, w, None)?;
                let y = g.reshape(y, &[b, t, n, d])?;
                g.permute(y, &[0, 2, 1, 3])
            };
            let q = proj(&mut g, "q_proj", h)?;
            let k = proj(&mut g, "k_proj", hkv)?;
            let vv = proj(&mut g, "v_proj", hkv)?;
            let k = g.repeat_kv(k, h / hkv)?;
            let vv = g.repeat_kv(vv, h / hkv)?;
            let kt = g.transpose(k, 2, 3)?;
            let s = g.matmul(q, kt, false, false)?;
            let mut s = g.scale(s, 1.0 / (d as f32).sqrt())?;
            if let Some(cap) = softcap {
                let u = g.scale(s, 1.0 / cap)?;
                let t = g.tanh(u)?;
                s = g.scale(t, cap)?;
            }
            if with_mask {
                let mask = g.input_float("attention_mask", &[t, t])?;
                s = g.add(s, mask)?;
            }
            let p = g.softmax(s, 1.0, true, None)?;
            let p = g.dropout(p, dropout)?;
            let a = g.matmul(p, vv, false, false)?;
            let a = g.permute(a, &[0, 2, 1, 3])?;
            let a = g.reshape(a, &[b, t, c])?;
            let wo = g.param("o_proj", &[c, c])?;
            let a = g.linear(a, wo, None)?;
            let x = g.add(x, a)?;
            let lnf = g.param("norm.weight", &[c])?;
            let x = g.rms_norm(x, lnf, 1e-6)?;
            let logits = g.matmul(x, wte, false, true)?;
            let loss = g.cross_entropy(logits, labels)?;
            g.set_loss(loss)?;
            Ok(g)
        };
        r().unwrap()
    }

    /// Grouped-query (H = 6, Hkv = 2) and multi-query (Hkv = 1) attention written with HF's
    /// repeat_kv: the fused op reads the un-repeated k and v (no concat or repeat reshape is
    /// left), causal with and without an additive mask, dropout on; loss and every gradient
    /// as the unfused graph's (reference f64 to 1e-10, planned f32 against reference f32).
    #[test]
    fn sees_through_repeat_kv_for_grouped_and_multi_query_attention() {
        for (hkv, with_mask, p) in
            [(2, true, 0.2), (2, false, 0.0), (1, true, 0.0), (1, false, 0.1)]
        {
            let g = eager_gqa(hkv, with_mask, p, None);
            let (after, n) = show("fuse_attention", &g, run);
            assert_eq!(n, 1, "hkv={hkv} mask={with_mask}");
            let c = op_counts(&after);
            assert_eq!((c["attention"], c.get("concat"), c.get("softmax")), (1, None, None));
            let att = after.nodes().iter().find(|n| n.op.name() == "attention").unwrap();
            assert_eq!(after.shape(att.inputs[1])[1], hkv, "k read with Hkv heads");
            assert_eq!(after.shape(att.inputs[2])[1], hkv, "v read with Hkv heads");
            // Only the heads' reshapes of q/k/v/out stay (no repeat reshapes).
            assert_eq!(c["reshape"], 4, "hkv={hkv}");
            assert_same_numbers(&g, &after, 1e-10, true);
        }
    }

    /// The unfused graph (passes off) on the planned executor against the reference executor:
    /// the repeat's concat reads one tensor n times, which the planner must copy, not fold (a
    /// folded concat would give that tensor one place and leave the other pieces unwritten);
    /// and its backward splits a transposed gradient, whose split input must not take a
    /// piece's strides (`plan::layout::non_overlapping`).
    #[test]
    fn unfused_repeat_kv_runs_on_the_planned_executor() {
        for (hkv, m, p) in [
            (6, false, 0.0),
            (6, true, 0.1),
            (2, false, 0.0),
            (2, true, 0.0),
            (2, false, 0.1),
            (1, true, 0.1),
        ] {
            eprintln!("unfused hkv={hkv} mask={m} p={p}");
            let g = eager_gqa(hkv, m, p, None);
            assert_same_numbers(&g, &g, 0.0, true);
        }
    }

    /// After the default forward passes before it (fold_transpose folds kᵀ into the matmul's
    /// flag, fuse_softmax takes the scale and mask), the repeat is still seen through.
    #[test]
    fn sees_through_repeat_kv_after_the_transpose_and_softmax_passes() {
        let g = eager_gqa(2, true, 0.1, None);
        let (g1, _) = fold_transpose::run(&g).unwrap();
        let (g2, _) = fuse_softmax::run(&g1).unwrap();
        let (after, n) = show("fuse_attention", &g2, run);
        assert_eq!(n, 1);
        assert_eq!(op_counts(&after).get("concat"), None);
        assert_same_numbers(&g, &after, 1e-10, true);
    }

    /// A repeated k that something else also reads: the fused op still reads the un-repeated
    /// k, and the repeat stays for its other reader.
    #[test]
    fn a_repeat_read_elsewhere_stays() {
        let mut g = eager_gqa(2, false, 0.0, None);
        // The first concat (k's repeat) also feeds the loss.
        let rep = g.nodes().iter().find(|n| n.op.name() == "concat").unwrap().outputs[0];
        let loss = g.loss().unwrap();
        let extra = g.reshape(rep, &[2 * 2 * 5 * 3 * 4]).unwrap();
        let w = g.param("extra", &[2 * 2 * 5 * 3 * 4]).unwrap();
        let m = g.apply2(crate::ops::pointwise::BinaryFn::Mul, extra, w).unwrap();
        let m = g.reshape(m, &[1, 2 * 2 * 5 * 3 * 4]).unwrap();
        let ones = g.param("ones", &[2 * 2 * 5 * 3 * 4, 1]).unwrap();
        let s = g.matmul(m, ones, false, false).unwrap();
        let s = g.reshape(s, &[]).unwrap();
        let total = g.add(loss, s).unwrap();
        g.set_loss(total).unwrap();
        let (after, n) = show("fuse_attention", &g, run);
        assert_eq!(n, 1);
        assert_eq!(op_counts(&after)["concat"], 2 - 1, "v's repeat goes, k's stays");
        assert_same_numbers(&g, &after, 1e-10, true);
    }

    /// Gemma 2's soft-capped scores (cap 0.05, under which the scores' tanh bends), straight
    /// from the eager form and after the passes before this one, grouped-query, with and
    /// without a mask and dropout: one attention node carrying the cap, the tanh and every
    /// scale gone, and the loss and every gradient as the unfused graph's (reference f64 to
    /// 1e-10, planned f32 against reference f32: the CPU kernels).
    #[test]
    fn soft_capped_scores_fuse_into_the_op_and_nothing_changes() {
        let cap = 0.05f32;
        for (hkv, with_mask, p, passes_first) in [
            (2, true, 0.0, false),
            (2, false, 0.2, true),
            (1, true, 0.1, true),
            (6, false, 0.0, false),
        ] {
            let g = eager_gqa(hkv, with_mask, p, Some(cap));
            let before = if passes_first {
                let (g1, _) = fold_transpose::run(&g).unwrap();
                fuse_softmax::run(&g1).unwrap().0
            } else {
                g.clone()
            };
            let (after, n) = show("fuse_attention", &before, run);
            let what = format!("hkv={hkv} mask={with_mask} p={p} passes first={passes_first}");
            assert_eq!(n, 1, "{what}");
            let c = op_counts(&after);
            assert_eq!((c.get("tanh"), c.get("scale"), c.get("softmax")), (None, None, None));
            let att = after.nodes().iter().find(|n| n.op.name() == "attention").unwrap();
            let Op::Attention(a) = att.op else { unreachable!() };
            assert_eq!(a.softcap, Some(cap), "{what}");
            let want = 1.0 / (4f32.sqrt() * cap);
            assert!((a.scale - want).abs() <= 1e-6 * want, "{what}: scale {}", a.scale);
            assert_same_numbers(&g, &after, 1e-10, true);
        }
    }

    /// A tanh of the scores that something else also reads stays, and with it the chain: the
    /// fused op would not write it.
    #[test]
    fn a_soft_cap_read_elsewhere_keeps_the_chain() {
        let mut g = eager_gqa(2, false, 0.0, Some(0.05));
        let t = g.nodes().iter().find(|n| n.op.name() == "tanh").unwrap().outputs[0];
        let _also = g.scale(t, 2.0).unwrap();
        assert_eq!(run(&g).unwrap().1, 0);
    }
}
