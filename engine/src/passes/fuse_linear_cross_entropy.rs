//! An LM head and its loss as one op: `matmul(x, w, tb) [→ bias_add(·, b)] [→ scale(inv) →
//! tanh → scale(cap)] → cross_entropy(·, labels)` ⇒ [`Op::LinearCrossEntropy`] (the soft-cap,
//! Gemma 2's `final_logit_softcapping`, as its [`SoftCap`]), so the (rows, V) logits — the largest tensor of a
//! language model's step (gpt2 at b8×s512: 0.82 GB in f32) — are never stored: the kernels
//! make them a chunk of rows at a time and keep only each row's loss (forward) or turn each
//! chunk into its gradient at once (backward). Autodiff then writes the op's one backward node
//! (dx, dw, dbias).
//!
//! Matched: `w` a 2-D (V, C) weight read transposed (HF's `lm_head`/`decoder` layout, tied to
//! the embedding or not), `x` not transposed, the logits (and the pre-bias product) read by the
//! loss only. What changes in the numbers: nothing in f32 beyond summation order; in f16/bf16
//! the logits are no longer rounded to the storage dtype before the loss (they never exist in
//! it), which is closer to f32 than the unfused graph.
//!
//! Reference: Liger-Kernel's `LigerFusedLinearCrossEntropyLoss`; Apple's Cut Cross-Entropy.

use super::rewrite::{Rewrite, Uses};
use crate::graph::op::{
    CrossEntropy, LinearCrossEntropy, LinearCrossEntropyBackward, MatMul, Scale,
};
use crate::graph::{Graph, GraphError, Op, TensorId};
use crate::ops::linear_cross_entropy::SoftCap;

/// `y` = cap·tanh(inv·z) written as scale(inv) → tanh → scale(cap) (the models' `softcap`),
/// each intermediate read once: (z, the cap, the three nodes).
fn softcap_of(g: &Graph, uses: &Uses, y: TensorId) -> Option<(TensorId, SoftCap, [usize; 3])> {
    let scale = |op: &Op| matches!(op, Op::Scale(_));
    let (o, outer) = uses.producer_if(g, y, scale)?;
    let (th, tanh) = uses.producer_if(g, outer.inputs[0], |op| matches!(op, Op::Tanh))?;
    let (i, inner) = uses.producer_if(g, tanh.inputs[0], scale)?;
    let (Op::Scale(Scale { s: cap }), Op::Scale(Scale { s: inv })) = (&outer.op, &inner.op) else {
        return None;
    };
    // cap 0 would be a constant head; the kernels read cap 0 as "no cap".
    let single = uses.single_use(outer.inputs[0]) && uses.single_use(tanh.inputs[0]);
    (single && *cap != 0.0).then_some((
        inner.inputs[0],
        SoftCap { inv: *inv, cap: *cap },
        [o, th, i],
    ))
}

pub fn run(g: &Graph) -> Result<(Graph, usize), GraphError> {
    let uses = Uses::new(g);
    let mut rw = Rewrite::new(g);
    for (i, n) in g.nodes().iter().enumerate() {
        let Op::CrossEntropy(CrossEntropy { ignore_index }) = n.op else { continue };
        let (logits, labels) = (n.inputs[0], n.inputs[1]);
        if !uses.single_use(logits) {
            continue;
        }
        let (logits, softcap) = match softcap_of(g, &uses, logits) {
            Some((z, cap, nodes)) if uses.single_use(z) => (z, Some((cap, nodes))),
            _ => (logits, None),
        };
        // logits = [bias_add](matmul(x, w, tb))
        let (product, bias) = match uses.producer_if(g, logits, |op| matches!(op, Op::BiasAdd)) {
            Some((b, bn)) if uses.single_use(bn.inputs[0]) => {
                (bn.inputs[0], Some((b, bn.inputs[1])))
            }
            Some(_) => continue,
            None => (logits, None),
        };
        let Some((m, mn)) = uses
            .producer_if(g, product, |op| matches!(op, Op::MatMul(MatMul { ta: false, tb: true })))
        else {
            continue;
        };
        let (x, w) = (mn.inputs[0], mn.inputs[1]);
        if g.shape(w).len() != 2 {
            continue;
        }
        let head = LinearCrossEntropy { ignore_index, softcap: softcap.map(|(s, _)| s) };
        let loss = rw.insert_before(i, |g| {
            g.linear_cross_entropy(x, w, labels, bias.map(|(_, b)| b), head)
        })?;
        rw.replace(n.outputs[0], loss);
        rw.remove(i);
        rw.remove(m);
        if let Some((_, nodes)) = softcap {
            nodes.into_iter().for_each(|node| rw.remove(node));
        }
        if let Some((b, _)) = bias {
            rw.remove(b);
        }
        rw.count += 1;
    }
    let count = rw.count;
    Ok((rw.finish()?, count))
}

/// The training pass `fuse_linear_cross_entropy_backward`: when the graph's loss is a
/// [`Op::LinearCrossEntropy`] seeded directly by autodiff's `fill`, its backward node — which
/// computes the same loss in the same sweep as the gradients — moves (with the seed) to the
/// forward node's place and gives the loss, and the forward node goes: one pass over the
/// logits chunks instead of two, i.e. the unfused graph's three head GEMMs instead of four.
/// The backward is then computed in the forward's place: dx and dw live from there to their
/// readers (dx is (rows, C), small; dw is the weight's gradient, in the flat gradient buffer
/// unless tied). Liger-Kernel computes its gradients in the forward the same way.
pub fn merge_backward(g: &Graph) -> Result<(Graph, usize), GraphError> {
    let uses = Uses::new(g);
    let Some(loss) = g.loss() else { return Ok((g.clone(), 0)) };
    let Some(f) = uses.producer[loss.index()] else { return Ok((g.clone(), 0)) };
    let fwd = &g.nodes()[f];
    let Op::LinearCrossEntropy(LinearCrossEntropy { ignore_index, softcap }) = fwd.op else {
        return Ok((g.clone(), 0));
    };
    // The backward of this node: same operands after dloss, read by nothing but the root.
    let back = uses.consumers[fwd.inputs[0].index()].iter().copied().find(|&b| {
        let bn = &g.nodes()[b];
        matches!(bn.op, Op::LinearCrossEntropyBackward(LinearCrossEntropyBackward { ignore_index: ii, softcap: sc }) if ii == ignore_index && sc == softcap)
            && bn.inputs[1..] == fwd.inputs[..]
            && uses.consumers[bn.outputs[0].index()].is_empty()
    });
    let Some(b) = back else { return Ok((g.clone(), 0)) };
    // dloss must be the seed: a fill with no inputs, read by this backward only.
    let dloss = g.nodes()[b].inputs[0];
    let Some((s, _)) = uses.producer_if(g, dloss, |op| matches!(op, Op::Fill(_))) else {
        return Ok((g.clone(), 0));
    };
    if !uses.consumers[loss.index()].is_empty() || uses.consumers[dloss.index()].len() != 1 {
        return Ok((g.clone(), 0));
    }
    let mut rw = Rewrite::new(g);
    rw.node_mut(b).outputs[0] = loss;
    rw.move_before(s, f);
    rw.move_before(b, f);
    rw.remove(f);
    rw.count += 1;
    Ok((rw.finish()?, 1))
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::super::{run_forward, run_training, PassConfig};
    use super::*;

    /// GPT-2-like graphs (tied head, every row labelled but the last) and a BERT-like one
    /// (untied decoder with a bias, sparse labels): the fused op replaces the head's matmul,
    /// bias add and cross-entropy, and the loss and every parameter gradient are the unfused
    /// graph's (1e-5 relative: f32 sums in another order).
    #[test]
    fn fused_head_removes_the_logits_and_nothing_changes() {
        for fwd in [eager_gpt(2, 16, 32, 2, 50, 2, 0.0), untied_head_with_bias(3, 7, 24, 41, None)]
        {
            let (after, n) = show("fuse_linear_cross_entropy", &fwd, run);
            assert_eq!(n, 1);
            let counts = op_counts(&after);
            assert_eq!(counts.get("linear_cross_entropy"), Some(&1));
            assert_eq!(counts.get("cross_entropy"), None);
            assert_same_numbers(&train(&fwd), &train(&after), 1e-5, true);
        }
    }

    /// Gemma 2's soft-capped logits, cap·tanh(logits / cap) (cap 0.3: tanh bends there): the
    /// two scales and the tanh go into the fused op too, and the loss and gradients are the
    /// unfused graph's (1e-5 relative). A second reader of the tanh's output keeps the head
    /// unfused.
    #[test]
    fn soft_capped_head_fuses_with_its_cap_and_nothing_changes() {
        let fwd = untied_head_with_bias(3, 7, 24, 41, Some(0.3));
        let (after, n) = show("fuse_linear_cross_entropy", &fwd, run);
        assert_eq!(n, 1);
        let counts = op_counts(&after);
        assert_eq!(counts.get("linear_cross_entropy"), Some(&1));
        for op in ["cross_entropy", "tanh", "scale"] {
            assert_eq!(counts.get(op), None, "{op} left after the fusion");
        }
        let Some(Op::LinearCrossEntropy(LinearCrossEntropy { softcap: Some(s), .. })) =
            after.nodes().iter().map(|n| &n.op).find(|op| matches!(op, Op::LinearCrossEntropy(_)))
        else {
            panic!("no soft-capped fused head");
        };
        assert_eq!((s.inv, s.cap), ((1.0f64 / 0.3) as f32, 0.3));
        assert_same_numbers(&train(&fwd), &train(&after), 1e-5, true);
        // The tanh read twice (its output also summed into the loss's graph): not fused.
        let mut two = untied_head_with_bias(3, 7, 24, 41, Some(0.3));
        let tanh = two.nodes().iter().find(|n| matches!(n.op, Op::Tanh)).unwrap().outputs[0];
        let _also = two.scale(tanh, 2.0).unwrap();
        assert_eq!(run(&two).unwrap().1, 0);
    }

    /// Embedding → layer norm → untied (V, C) decoder → bias add [→ cap·tanh(· / cap)] →
    /// cross-entropy (BERT's MLM decoder shape, untied), labels (B, T).
    fn untied_head_with_bias(b: usize, t: usize, c: usize, v: usize, cap: Option<f64>) -> Graph {
        let mut g = Graph::new();
        let ids = g.input_ids("input_ids", &[b, t]).unwrap();
        let labels = g.input_ids("labels", &[b, t]).unwrap();
        let wte = g.param("wte", &[v, c]).unwrap();
        let (lw, lb) = (g.param("ln.weight", &[c]).unwrap(), g.param("ln.bias", &[c]).unwrap());
        let dec = g.param("decoder.weight", &[v, c]).unwrap();
        let bias = g.param("decoder.bias", &[v]).unwrap();
        let x = g.embedding(wte, ids).unwrap();
        let x = g.layer_norm(x, lw, lb, 1e-5).unwrap();
        let logits = g.matmul(x, dec, false, true).unwrap();
        let mut logits = g.bias_add(logits, bias).unwrap();
        if let Some(cap) = cap {
            let z = g.scale(logits, (1.0 / cap) as f32).unwrap();
            let z = g.tanh(z).unwrap();
            logits = g.scale(z, cap as f32).unwrap();
        }
        let loss = g.cross_entropy(logits, labels).unwrap();
        g.set_loss(loss).unwrap();
        g
    }

    /// The training pass leaves one node giving the loss and the gradients, placed where the
    /// forward was, and the numbers are those of the two-node form.
    #[test]
    fn merged_backward_gives_the_loss_and_the_same_gradients() {
        let fwd = eager_gpt(2, 16, 32, 2, 50, 2, 0.0);
        let only = PassConfig::none().with("fuse_linear_cross_entropy", true);
        let (fused, _) = run_forward(&fwd, &only).unwrap();
        let two = train(&fused);
        let (one, n) = show("fuse_linear_cross_entropy_backward", &two, merge_backward);
        assert_eq!(n, 1);
        let counts = op_counts(&one);
        assert_eq!(counts.get("linear_cross_entropy"), None);
        assert_eq!(counts.get("linear_cross_entropy_backward"), Some(&1));
        let loss_node = one.nodes().iter().position(|n| n.outputs.contains(&one.loss().unwrap()));
        assert!(matches!(one.nodes()[loss_node.unwrap()].op, Op::LinearCrossEntropyBackward(_)));
        assert_same_numbers(&two, &one, 0.0, true);
        let (again, _) = run_training(&two, &PassConfig::all()).unwrap();
        assert_eq!(op_counts(&again).get("linear_cross_entropy"), None, "on by default");
    }
}
