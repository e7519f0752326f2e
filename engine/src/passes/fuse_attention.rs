//! Eager attention into [`Op::Attention`]:
//! `matmul(q, kᵀ) → [scale] → softmax(scale, causal, [mask]) → [dropout] → matmul(·, v)`
//! ⇒ `attention(q, k, v, [mask])` with the same scale, causal flag, mask, dropout p and the
//! dropout site's RNG counters (so the mask of kept probabilities is bit-identical).
//!
//! kᵀ is either the matmul's `tb` flag (after `fold_transpose`) or a permute swapping k's
//! last two dims; a mask add and a scale still in front of the softmax (when `fuse_softmax` is
//! off) are folded too, by `fuse_softmax`'s rules. Every intermediate (scores, probabilities, dropped probabilities) must be read by the
//! chain only, since the fused op does not materialise them — it saves only the pre-dropout
//! probabilities for its backward, and its CPU kernel computes a (batch, head) pair's rows
//! while they are in cache.
//!
//! Reference: ORT `AttentionFusion` and its training counterpart; PyTorch
//! `scaled_dot_product_attention`'s math path.

use super::fold_transpose::swaps_last_two;
use super::rewrite::{param_dependent, Rewrite, Uses};
use crate::graph::{AttentionOpts, Graph, GraphError, Node, Op, TensorId};

/// The chain ending at matmul node `o`, if it is one.
struct Chain {
    q: TensorId,
    k: TensorId,
    v: TensorId,
    mask: Option<TensorId>,
    scale: f32,
    causal: bool,
    dropout: Option<(f32, u64)>,
    nodes: Vec<usize>,
}

fn find(g: &Graph, uses: &Uses, dep: &[bool], o: usize, n: &Node) -> Option<Chain> {
    let Op::MatMul { ta: false, tb: false } = n.op else { return None };
    let (mut probs, v) = (n.inputs[0], n.inputs[1]);
    let mut nodes = vec![o];
    let sole = |t: TensorId, pred: fn(&Op) -> bool| {
        uses.single_use(t).then(|| uses.producer_if(g, t, pred)).flatten()
    };
    let mut dropout = None;
    if let Some((d, dn)) = sole(probs, |op| matches!(op, Op::Dropout { .. })) {
        let Op::Dropout { p, offset } = dn.op else { unreachable!() };
        dropout = Some((p, offset));
        probs = dn.inputs[0];
        nodes.push(d);
    }
    let (s, sn) = sole(probs, |op| matches!(op, Op::Softmax { .. }))?;
    let Op::Softmax { mut scale, causal } = sn.op else { unreachable!() };
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
    if let Some((p, pn)) = sole(scores, |op| matches!(op, Op::Scale { .. })) {
        let Op::Scale { s } = pn.op else { unreachable!() };
        scale *= s;
        scores = pn.inputs[0];
        nodes.push(p);
    }
    let (m, mn) = sole(scores, |op| matches!(op, Op::MatMul { ta: false, .. }))?;
    let Op::MatMul { tb, .. } = mn.op else { unreachable!() };
    nodes.push(m);
    let (q, kk) = (mn.inputs[0], mn.inputs[1]);
    let k = if tb {
        kk
    } else {
        let (p, pn) = uses.producer_if(
            g,
            kk,
            |op| matches!(op, Op::Permute { perm } if swaps_last_two(perm)),
        )?;
        if uses.single_use(kk) {
            nodes.push(p);
        }
        pn.inputs[0]
    };
    Some(Chain { q, k, v, mask, scale, causal, dropout, nodes })
}

pub fn run(g: &Graph) -> Result<(Graph, usize), GraphError> {
    let uses = Uses::new(g);
    let dep = param_dependent(g);
    let mut rw = Rewrite::new(g);
    for (o, n) in g.nodes().iter().enumerate() {
        let Some(c) = find(g, &uses, &dep, o, n) else { continue };
        let (p, offset) = c.dropout.unwrap_or((0.0, 0));
        let opts =
            AttentionOpts { causal: c.causal, scale: Some(c.scale), dropout_p: p, mask: c.mask };
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
}
