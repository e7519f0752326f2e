//! Residual add + RMSNorm in one op: `add(a, b) → rms_norm(·, w)` ⇒ [`Op::AddRmsNorm`]
//! `(sum, y, rstd)`, the RMSNorm counterpart of [`super::fuse_add_layernorm`]. Its CPU kernel
//! adds a row and normalises it while the row is in cache; the sum stays an output, since
//! pre-norm models (Llama, Mistral, Qwen) carry it on as the residual stream. The backward is
//! RMSNorm's backward on the saved sum plus the gradient reaching the sum from its other
//! readers — the same nodes the unfused graph has.
//!
//! Matched: an add of two same-shape tensors (not a broadcast add) read by an RMSNorm whose
//! weight exists before the add. The fused node takes the add's place, so readers of the sum
//! between the add and the RMSNorm still come after it.
//!
//! Reference: ORT `SkipLayerNormFusion` (`SkipSimplifiedLayerNormalization`).

use super::rewrite::{Rewrite, Uses};
use crate::graph::op::RmsNorm;
use crate::graph::{Graph, GraphError, Op};

pub fn run(g: &Graph) -> Result<(Graph, usize), GraphError> {
    let uses = Uses::new(g);
    let mut rw = Rewrite::new(g);
    for (i, n) in g.nodes().iter().enumerate() {
        let Op::RmsNorm(RmsNorm { eps }) = n.op else { continue };
        let Some((p, pn)) = uses.producer_if(g, n.inputs[0], |op| matches!(op, Op::Add)) else {
            continue;
        };
        let (a, b, w) = (pn.inputs[0], pn.inputs[1], n.inputs[1]);
        let before_add = |t: crate::graph::TensorId| uses.producer[t.index()].is_none_or(|q| q < p);
        if rw.is_removed(p) || g.shape(a) != g.shape(b) || !before_add(w) {
            continue;
        }
        let outs = rw.insert_before(p, |g| {
            g.add_rms_norm(a, b, w, eps)?;
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

    /// A pre-norm Llama-like stack (embedding; per layer: RMSNorm → linear → residual add;
    /// final RMSNorm; tied head): every RMSNorm after a residual add fuses, the sum carried on
    /// as the residual; loss and gradients as the unfused graph's (reference f64 to 1e-12,
    /// planned f32 against reference f32).
    #[test]
    fn residual_adds_fuse_with_their_rmsnorm_and_nothing_changes() {
        let (b, t, c, v, layers) = (2, 5, 12, 11, 3);
        let mut g = Graph::new();
        let ids = g.input_ids("input_ids", &[b, t]).unwrap();
        let labels = g.input_ids("labels", &[b, t]).unwrap();
        let wte = g.param("wte", &[v, c]).unwrap();
        let mut x = g.embedding(wte, ids).unwrap();
        for l in 0..layers {
            let nw = g.param(&format!("l{l}.norm.weight"), &[c]).unwrap();
            let h = g.rms_norm(x, nw, 1e-6).unwrap();
            let w = g.param(&format!("l{l}.proj"), &[c, c]).unwrap();
            let h = g.linear(h, w, None).unwrap();
            x = g.add(x, h).unwrap();
        }
        let nw = g.param("norm.weight", &[c]).unwrap();
        let y = g.rms_norm(x, nw, 1e-6).unwrap();
        let logits = g.matmul(y, wte, false, true).unwrap();
        let loss = g.cross_entropy(logits, labels).unwrap();
        g.set_loss(loss).unwrap();
        let (after, n) = show("fuse_add_rmsnorm", &g, run);
        // The first layer's norm reads the embedding (no add); the other two and the final one fuse.
        assert_eq!(n, 3);
        let (bc, ac) = (op_counts(&g), op_counts(&after));
        assert_eq!((ac["add_rms_norm"], ac["rms_norm"]), (3, bc["rms_norm"] - 3));
        assert_eq!(ac.get("add"), None);
        assert_same_numbers(&g, &after, 1e-12, true);
    }

    /// Post-norm (the sum read by the RMSNorm only): the add goes entirely.
    #[test]
    fn post_norm_sum_read_by_the_rmsnorm_only() {
        let mut g = Graph::new();
        let x = g.input_float("x", &[2, 3, 8]).unwrap();
        let labels = g.input_ids("labels", &[2, 3]).unwrap();
        let w = g.param("dense.weight", &[8, 8]).unwrap();
        let nw = g.param("norm.weight", &[8]).unwrap();
        let h = g.matmul(x, w, false, true).unwrap();
        let h2 = g.matmul(h, w, false, true).unwrap();
        let s = g.add(h2, h).unwrap();
        let y = g.rms_norm(s, nw, 1e-6).unwrap();
        let loss = g.cross_entropy(y, labels).unwrap();
        g.set_loss(loss).unwrap();
        let (after, n) = show("fuse_add_rmsnorm", &g, run);
        assert_eq!(n, 1);
        assert!(!op_counts(&after).contains_key("add"));
        assert_same_numbers(&g, &after, 1e-12, true);
    }
}
