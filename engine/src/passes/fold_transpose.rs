//! Transposes folded into matmul flags: `matmul(a, permute(b, …, swap last two))` reads b
//! transposed through `tb` (and likewise `ta`), so the permute — a strided copy, or a
//! strided GEMM operand at best — disappears. HF's eager attention writes
//! `query @ key.transpose(-1, -2)`; this turns it into one `matmul tb=true`.
//!
//! Not folded: a transposed batched `a` against a shared 2-D `b` (`ta` with a weight), which
//! the IR rejects because its gradient would need a batched reduction.
//!
//! Reference: ORT `TransposeMatMulFusion` (into `FusedMatMul` with transA/transB).

use super::rewrite::{Rewrite, Uses};
use crate::graph::op::{MatMul, Permute};
use crate::graph::{Graph, GraphError, Op};

/// Whether `perm` swaps the last two dims and keeps the others.
pub(crate) fn swaps_last_two(perm: &[usize]) -> bool {
    let r = perm.len();
    r >= 2
        && perm[r - 1] == r - 2
        && perm[r - 2] == r - 1
        && perm[..r - 2].iter().enumerate().all(|(i, &p)| i == p)
}

pub fn run(g: &Graph) -> Result<(Graph, usize), GraphError> {
    let uses = Uses::new(g);
    let mut rw = Rewrite::new(g);
    // Per permute node: how many of its readers were rewritten.
    let mut folded = vec![0usize; g.nodes().len()];
    for (i, n) in g.nodes().iter().enumerate() {
        let Op::MatMul(MatMul { mut ta, mut tb }) = n.op else { continue };
        let mut inputs = n.inputs.clone();
        for slot in 0..2 {
            let Some((p, pn)) = uses.producer_if(
                g,
                inputs[slot],
                |op| matches!(op, Op::Permute(Permute { perm }) if swaps_last_two(perm)),
            ) else {
                continue;
            };
            let (nta, ntb) = if slot == 0 { (!ta, tb) } else { (ta, !tb) };
            let (ra, rb) = (
                g.shape(if slot == 0 { pn.inputs[0] } else { inputs[0] }).len(),
                g.shape(inputs[1]).len(),
            );
            if nta && rb == 2 && ra > 2 {
                continue; // ta with a shared 2-D b: not expressible
            }
            (ta, tb) = (nta, ntb);
            inputs[slot] = pn.inputs[0];
            folded[p] += 1;
            rw.count += 1;
        }
        if inputs != n.inputs {
            let node = rw.node_mut(i);
            node.op = Op::MatMul(MatMul { ta, tb });
            node.inputs = inputs;
        }
    }
    for (p, &k) in folded.iter().enumerate() {
        let out = g.nodes()[p].outputs[0];
        if k > 0 && k == uses.consumers[out.index()].len() && !uses.root[out.index()] {
            rw.remove(p);
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
    fn transposes_become_flags_and_nothing_changes() {
        let mut g = Graph::new();
        let x = g.input_float("x", &[2, 3, 5, 4]).unwrap();
        let labels = g.input_ids("labels", &[2, 3, 5]).unwrap();
        let w = g.param("w", &[6, 4]).unwrap();
        let k = g.param("k", &[2, 3, 6, 4]).unwrap();
        // x · wᵀ through a permute of the 2-D weight: tb.
        let wt = g.transpose(w, 0, 1).unwrap();
        let y = g.matmul(x, wt, false, false).unwrap(); // (2,3,5,6)
                                                        // batched: (kᵀ)ᵀ... y · k: k (2,3,6,4); yᵀ via permute on a (ta, batched b: allowed).
        let yt = g.transpose(y, 2, 3).unwrap(); // (2,3,6,5)
        let z = g.matmul(yt, k, true, false).unwrap(); // (2,3,5,4)
        let kt = g.transpose(k, 2, 3).unwrap(); // (2,3,4,6)
        let s = g.matmul(z, kt, false, false).unwrap(); // (2,3,5,6)
        let loss = g.cross_entropy(s, labels).unwrap();
        g.set_loss(loss).unwrap();
        let (after, n) = show("fold_transpose", &g, run);
        assert_eq!(n, 3);
        assert!(!op_counts(&after).contains_key("permute"));
        assert_same_numbers(&g, &after, 1e-12, true);
    }

    #[test]
    fn a_transposed_batched_operand_against_a_weight_is_left_alone() {
        let mut g = Graph::new();
        let x = g.input_float("x", &[2, 4, 5]).unwrap();
        let w = g.param("w", &[4, 3]).unwrap();
        let xt = g.transpose(x, 1, 2).unwrap(); // (2,5,4)
        g.matmul(xt, w, false, false).unwrap();
        let (after, n) = run(&g).unwrap();
        assert_eq!((n, op_counts(&after)["permute"]), (0, 1));
    }
}
