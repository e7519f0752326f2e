//! SiLU-gated MLP in one op: `silu(gate) → mul(·, up)` ⇒ [`Op::SwiGlu`] `(gate, up)`, the
//! Llama family's `act_fn(gate_proj(x)) * up_proj(x)`. The silu output is never stored, so the
//! backward saves gate and up only; its gradient rule writes one `swiglu_backward` for the
//! unfused graph's mul and silu backwards.
//!
//! Matched: a `mul` one of whose operands is a `silu` output read by that mul alone (otherwise
//! the silu must stay), the other operand of the same shape (not a broadcast). The fused node
//! takes the mul's place: both operands exist before it.
//!
//! Reference: Liger-Kernel's `LigerSiLUMulFunction` (`liger_kernel/ops/swiglu.py`).

use super::rewrite::{Rewrite, Uses};
use crate::graph::op::{Binary, Unary};
use crate::graph::{Graph, GraphError, Op};
use crate::ops::pointwise::{BinaryFn, UnaryFn};

pub fn run(g: &Graph) -> Result<(Graph, usize), GraphError> {
    let uses = Uses::new(g);
    let mut rw = Rewrite::new(g);
    let is_silu = |op: &Op| matches!(op, Op::Unary(Unary { f: UnaryFn::Silu }));
    for (i, n) in g.nodes().iter().enumerate() {
        let Op::Binary(Binary { f: BinaryFn::Mul }) = n.op else { continue };
        // HF's order is silu(gate) * up; up * silu(gate) is the same product.
        for (a, b) in [(n.inputs[0], n.inputs[1]), (n.inputs[1], n.inputs[0])] {
            let Some((p, pn)) = uses.producer_if(g, a, is_silu) else { continue };
            let (gate, up) = (pn.inputs[0], b);
            if !uses.single_use(a) || rw.is_removed(p) || g.shape(gate) != g.shape(up) {
                continue;
            }
            let h = rw.insert_before(i, |g| g.swiglu(gate, up))?;
            rw.replace(n.outputs[0], h);
            rw.remove(p);
            rw.remove(i);
            rw.count += 1;
            break;
        }
    }
    let count = rw.count;
    Ok((rw.finish()?, count))
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::*;

    /// A Llama-like stack (embedding; per layer: down(silu(gate(x)) · up(x)) + residual; tied
    /// head), one layer with the product written up · silu(gate): every MLP fuses, no silu or
    /// mul is left; loss and gradients as the unfused graph's (reference f64 to 1e-12, planned
    /// f32 against reference f32).
    #[test]
    fn llama_mlps_fuse_and_nothing_changes() {
        let (b, t, c, inter, v, layers) = (2, 5, 12, 19, 11, 3);
        let mut g = Graph::new();
        let ids = g.input_ids("input_ids", &[b, t]).unwrap();
        let labels = g.input_ids("labels", &[b, t]).unwrap();
        let wte = g.param("wte", &[v, c]).unwrap();
        let mut x = g.embedding(wte, ids).unwrap();
        for l in 0..layers {
            let wg = g.param(&format!("l{l}.gate_proj"), &[inter, c]).unwrap();
            let wu = g.param(&format!("l{l}.up_proj"), &[inter, c]).unwrap();
            let wd = g.param(&format!("l{l}.down_proj"), &[c, inter]).unwrap();
            let gate = g.linear(x, wg, None).unwrap();
            let up = g.linear(x, wu, None).unwrap();
            let act = g.apply(UnaryFn::Silu, gate).unwrap();
            let h = if l == 1 {
                g.apply2(BinaryFn::Mul, up, act)
            } else {
                g.apply2(BinaryFn::Mul, act, up)
            };
            let m = g.linear(h.unwrap(), wd, None).unwrap();
            x = g.add(x, m).unwrap();
        }
        let logits = g.matmul(x, wte, false, true).unwrap();
        let loss = g.cross_entropy(logits, labels).unwrap();
        g.set_loss(loss).unwrap();
        let (after, n) = show("fuse_swiglu", &g, run);
        assert_eq!(n, layers);
        let ac = op_counts(&after);
        assert_eq!((ac["swiglu"], ac.get("silu"), ac.get("mul")), (layers, None, None));
        assert_same_numbers(&g, &after, 1e-12, true);
    }

    /// A silu output read twice, and a mul by a broadcast row: neither fuses.
    #[test]
    fn a_silu_read_elsewhere_or_a_broadcast_mul_stays() {
        let mut g = Graph::new();
        let x = g.input_float("x", &[2, 3, 8]).unwrap();
        let labels = g.input_ids("labels", &[2, 3]).unwrap();
        let w = g.param("w", &[8, 8]).unwrap();
        let row = g.param("row", &[8]).unwrap();
        let gate = g.matmul(x, w, false, true).unwrap();
        let act = g.apply(UnaryFn::Silu, gate).unwrap();
        let h = g.apply2(BinaryFn::Mul, act, gate).unwrap();
        let h = g.add(h, act).unwrap();
        let act2 = g.apply(UnaryFn::Silu, h).unwrap();
        let y = g.apply2(BinaryFn::Mul, act2, row).unwrap();
        let loss = g.cross_entropy(y, labels).unwrap();
        g.set_loss(loss).unwrap();
        let (after, n) = show("fuse_swiglu", &g, run);
        assert_eq!(n, 0);
        assert_eq!(op_counts(&after), op_counts(&g));
    }
}
