//! Scale + mask + softmax in one op: `softmax(s·x + mask)`.
//!
//! HF's eager attention writes `scores / √d`, `+ attention_mask`, `softmax`. [`Op::Softmax`]
//! already takes a scale and an optional additive mask (its kernel applies both while it
//! reads the row), so a `scale` feeding a softmax folds into its scale, and an `add` of a
//! mask that depends on no parameter (masks get no gradient) feeding a softmax with scale 1
//! and no mask becomes its mask input. Repeated, scale → add → softmax becomes one node.
//! (A mask added *after* scaling keeps its order: `softmax(c·(s·x) + m)` folds `s` into `c`
//! at any time, but `m` only while the softmax's scale is still 1.)
//!
//! The softmax → dropout step of the same chain has no op of its own: only attention has it,
//! and `fuse_attention` takes the whole chain.
//!
//! Reference: ORT `SoftmaxFusion` / the `MaskedSoftmax` of its attention fusion; Megatron's
//! `FusedScaleMaskSoftmax`.

use super::rewrite::{param_dependent, Rewrite, Uses};
use crate::graph::op::{Scale, Softmax};
use crate::graph::{Graph, GraphError, Op};

pub fn run(g: &Graph) -> Result<(Graph, usize), GraphError> {
    let uses = Uses::new(g);
    let dep = param_dependent(g);
    let mut rw = Rewrite::new(g);
    for (i, n) in g.nodes().iter().enumerate() {
        let Op::Softmax(Softmax { mut scale, causal }) = n.op else { continue };
        let (mut x, mut mask) = (n.inputs[0], n.inputs.get(1).copied());
        let mut changed = false;
        while uses.single_use(x) {
            let Some(p) = uses.producer[x.index()] else { break };
            let pn = &g.nodes()[p];
            match pn.op {
                Op::Scale(Scale { s }) => {
                    scale *= s;
                    x = pn.inputs[0];
                }
                Op::Add
                    if mask.is_none()
                        && scale == 1.0
                        && !dep[pn.inputs[1].index()]
                        && dep[pn.inputs[0].index()] =>
                {
                    mask = Some(pn.inputs[1]);
                    x = pn.inputs[0];
                }
                _ => break,
            }
            rw.remove(p);
            rw.count += 1;
            changed = true;
        }
        if changed {
            let node = rw.node_mut(i);
            node.op = Op::Softmax(Softmax { scale, causal });
            node.inputs = std::iter::once(x).chain(mask).collect();
        }
    }
    let count = rw.count;
    Ok((rw.finish()?, count))
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::*;

    #[test]
    fn scale_and_mask_fold_into_softmax_and_nothing_changes() {
        let g = eager_gpt(2, 5, 8, 2, 11, 1, 0.0);
        let (after, n) = show("fuse_softmax", &g, run);
        assert_eq!(n, 2);
        let c = op_counts(&after);
        assert_eq!((c.get("scale"), c["add"]), (None, op_counts(&g)["add"] - 1));
        assert_same_numbers(&g, &after, 1e-12, true);
    }

    #[test]
    fn a_mask_added_after_scaling_the_softmax_input_is_kept() {
        let mut g = Graph::new();
        let x = g.input_float("x", &[3, 4]).unwrap();
        let w = g.param("w", &[4, 4]).unwrap();
        let m = g.input_float("m", &[4]).unwrap();
        let y = g.matmul(x, w, false, false).unwrap();
        let y = g.add(y, m).unwrap();
        g.softmax(y, 0.5, false, None).unwrap();
        let (after, n) = run(&g).unwrap();
        assert_eq!((n, op_counts(&after)["add"]), (0, 1));
    }
}
