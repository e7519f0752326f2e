//! `nn.Linear` (+ GELU) as one op: `matmul(x, w) → bias_add(·, b) [→ gelu]` ⇒
//! [`Op::Linear`] — one GEMM and one epilogue pass over its output rows (bias, then GELU,
//! keeping the pre-activation the backward needs) instead of a GEMM and one or two more passes
//! over the activation. The backward is unchanged (GELU's backward from the saved
//! pre-activation, then the matmul's two products and the bias's row sum).
//!
//! Matched: `a` not transposed and `w` a shared 2-D weight, the matmul's output read by the
//! bias add only (and the bias add's by the GELU only, to fuse the GELU). Not matched: a bias
//! add whose output is cross-entropy logits (BERT's MLM decoder): the planned executor's row
//! skipping (`plan::rows`) restricts that matmul to the labelled rows, and keeping it a
//! `matmul` keeps that working — its bias add is a cheap pass next to its GEMM.
//!
//! Reference: ORT `MatMulAddFusion` + `BiasGeluFusion` (`FusedGemm`); cuBLASLt's
//! `CUBLASLT_EPILOGUE_GELU_AUX_BIAS`.

use super::rewrite::{Rewrite, Uses};
use crate::graph::op::{Gelu, MatMul};
use crate::graph::{Graph, GraphError, Op};

pub fn run(g: &Graph) -> Result<(Graph, usize), GraphError> {
    let uses = Uses::new(g);
    let mut rw = Rewrite::new(g);
    let feeds_loss = |t: crate::graph::TensorId| {
        uses.consumers[t.index()].iter().any(|&c| matches!(g.nodes()[c].op, Op::CrossEntropy(_)))
    };
    for (i, n) in g.nodes().iter().enumerate() {
        if !matches!(n.op, Op::BiasAdd) || !uses.single_use(n.inputs[0]) || feeds_loss(n.outputs[0])
        {
            continue;
        }
        let Some((m, mn)) = uses
            .producer_if(g, n.inputs[0], |op| matches!(op, Op::MatMul(MatMul { ta: false, .. })))
        else {
            continue;
        };
        let Op::MatMul(MatMul { tb, .. }) = mn.op else { unreachable!() };
        let (x, w, bias) = (mn.inputs[0], mn.inputs[1], n.inputs[1]);
        if g.shape(w).len() != 2 {
            continue;
        }
        let gelu = uses.consumers[n.outputs[0].index()]
            .first()
            .filter(|_| uses.single_use(n.outputs[0]))
            .and_then(|&c| match g.nodes()[c].op {
                Op::Gelu(Gelu { approx }) => Some((c, approx)),
                _ => None,
            });
        let (last, out) = match gelu {
            Some((c, _)) => (c, g.nodes()[c].outputs[0]),
            None => (i, n.outputs[0]),
        };
        let y = rw.insert_before(last, |g| g.fused_linear(x, w, bias, tb, gelu.map(|(_, a)| a)))?;
        rw.replace(out, y);
        rw.remove(m);
        rw.remove(i);
        if let Some((c, _)) = gelu {
            rw.remove(c);
        }
        rw.count += 1;
    }
    let count = rw.count;
    Ok((rw.finish()?, count))
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::*;
    use crate::graph::GeluApprox;

    #[test]
    fn linear_and_linear_gelu_fuse_and_nothing_changes() {
        let g = eager_gpt(2, 5, 8, 2, 11, 2, 0.0);
        let (after, n) = show("fuse_matmul_bias", &g, run);
        // Per block: c_attn, attn.c_proj, c_fc + GELU, mlp.c_proj.
        assert_eq!(n, 8);
        let (b, a) = (op_counts(&g), op_counts(&after));
        assert_eq!((a["linear"], a.get("bias_add"), a.get("gelu")), (8, None, None));
        assert_eq!(a["matmul"], b["matmul"] - 8);
        assert_eq!(
            after
                .nodes()
                .iter()
                .filter(|n| matches!(
                    n.op,
                    Op::Linear(crate::graph::op::Linear { gelu: Some(GeluApprox::Tanh), .. })
                ))
                .count(),
            2
        );
        assert_same_numbers(&g, &after, 1e-12, true);
    }

    /// BERT-style: `nn.Linear` weights (tb), an erf GELU, and an MLM decoder with a bias that
    /// stays a matmul (row skipping).
    #[test]
    fn transposed_weights_and_the_logits_bias_add() {
        let mut g = Graph::new();
        let x = g.input_float("x", &[2, 3, 6]).unwrap();
        let labels = g.input_ids("labels", &[2, 3]).unwrap();
        let (w1, b1) = (g.param("w1", &[10, 6]).unwrap(), g.param("b1", &[10]).unwrap());
        let (w2, b2) = (g.param("w2", &[7, 10]).unwrap(), g.param("b2", &[7]).unwrap());
        let h = g.linear(x, w1, Some(b1)).unwrap();
        let h = g.gelu(h, GeluApprox::Erf).unwrap();
        let logits = g.linear(h, w2, Some(b2)).unwrap();
        let loss = g.cross_entropy(logits, labels).unwrap();
        g.set_loss(loss).unwrap();
        let (after, n) = show("fuse_matmul_bias", &g, run);
        assert_eq!(n, 1);
        let a = op_counts(&after);
        assert_eq!((a["linear"], a["matmul"], a["bias_add"]), (1, 1, 1));
        assert_same_numbers(&g, &after, 1e-12, true);
    }
}
