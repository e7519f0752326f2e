//! Residual add + LayerNorm in one op: `add(a, b) → layernorm(·, w, bias)` ⇒
//! [`Op::AddLayerNorm`] `(sum, y, mean, rstd)`. Its CPU kernel adds a row and normalises it
//! while the row is in cache, instead of writing the sum in one pass and reading it back in
//! another; the sum stays an output, since pre-LN models (GPT-2) carry it on as the residual
//! stream. The backward is LayerNorm's backward on the saved sum plus the gradient reaching
//! the sum from its other readers — the same nodes the unfused graph has.
//!
//! Matched: an add of two same-shape tensors (not a broadcast add such as BERT's position
//! embeddings) read by a LayerNorm whose weight and bias exist before the add. The fused node
//! takes the add's place, so readers of the sum between the add and the LayerNorm still come
//! after it.
//!
//! Reference: ORT `SkipLayerNormFusion` (`SkipLayerNormalization`), Apex `FusedAddLayerNorm`.

use super::rewrite::{Rewrite, Uses};
use crate::graph::op::LayerNorm;
use crate::graph::{Graph, GraphError, Op};

pub fn run(g: &Graph) -> Result<(Graph, usize), GraphError> {
    let uses = Uses::new(g);
    let mut rw = Rewrite::new(g);
    for (i, n) in g.nodes().iter().enumerate() {
        let Op::LayerNorm(LayerNorm { eps }) = n.op else { continue };
        let Some((p, pn)) = uses.producer_if(g, n.inputs[0], |op| matches!(op, Op::Add)) else {
            continue;
        };
        let (a, b, w, bias) = (pn.inputs[0], pn.inputs[1], n.inputs[1], n.inputs[2]);
        let before_add = |t: crate::graph::TensorId| uses.producer[t.index()].is_none_or(|q| q < p);
        if rw.is_removed(p) || g.shape(a) != g.shape(b) || !before_add(w) || !before_add(bias) {
            continue;
        }
        let outs = rw.insert_before(p, |g| {
            g.add_layer_norm(a, b, w, bias, eps)?;
            Ok(g.nodes.last().expect("just added").outputs.clone())
        })?;
        rw.replace(pn.outputs[0], outs[0]);
        for (&old, &new) in n.outputs.iter().zip(&outs[1..]) {
            rw.replace(old, new);
        }
        rw.remove(p);
        rw.remove(i);
        rw.count += 1;
    }
    let count = rw.count;
    Ok((rw.finish()?, count))
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::*;

    /// GPT-2 (pre-LN: the sum is also the next residual) — every LayerNorm but the first
    /// (after a broadcast add and a dropout) fuses.
    #[test]
    fn residual_adds_fuse_with_their_layernorm_and_nothing_changes() {
        let g = eager_gpt(2, 5, 8, 2, 11, 2, 0.1);
        let (after, n) = show("fuse_add_layernorm", &g, run);
        assert_eq!(n, 4); // ln_2 ×2, ln_1 of block 1, ln_f
        let (b, a) = (op_counts(&g), op_counts(&after));
        assert_eq!((a["add_layernorm"], a["layernorm"]), (4, b["layernorm"] - 4));
        assert_eq!(a["add"], b["add"] - 4);
        assert_same_numbers(&g, &after, 1e-12, true);
    }

    /// BERT (post-LN: the sum is read by the LayerNorm only).
    #[test]
    fn post_ln_sum_read_by_the_layernorm_only() {
        let mut g = Graph::new();
        let x = g.input_float("x", &[2, 3, 8]).unwrap();
        let labels = g.input_ids("labels", &[2, 3]).unwrap();
        let w = g.param("dense.weight", &[8, 8]).unwrap();
        let (lw, lb) = (g.param("ln.weight", &[8]).unwrap(), g.param("ln.bias", &[8]).unwrap());
        let h = g.matmul(x, w, false, true).unwrap();
        let h2 = g.matmul(h, w, false, true).unwrap();
        let s = g.add(h2, h).unwrap();
        let y = g.layer_norm(s, lw, lb, 1e-12).unwrap();
        let loss = g.cross_entropy(y, labels).unwrap();
        g.set_loss(loss).unwrap();
        let (after, n) = show("fuse_add_layernorm", &g, run);
        assert_eq!(n, 1);
        assert!(!op_counts(&after).contains_key("add"));
        assert_same_numbers(&g, &after, 1e-12, true);
    }
}
