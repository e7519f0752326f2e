//! Eliminations: nodes that compute their input.
//!
//! - `eliminate_dropout`: `dropout(x, p = 0)` is x (HF models keep `nn.Dropout(0.0)` modules,
//!   and the builders write them). A p = 0 site draws no RNG counters
//!   ([`Graph::dropout`]), so removing it changes no other site's mask.
//! - `eliminate_identity`: a reshape to the shape it already has, a permute by the identity.
//!   The IR has no cast op (a graph has one storage dtype; the loss is f32 by construction), so
//!   there are no identity casts to remove.
//!
//! Reference: ORT `DropoutElimination`, `EliminateIdentity`, `ReshapeFusion`'s no-op case.

use super::rewrite::{Rewrite, Uses};
use crate::graph::op::{Dropout, Permute};
use crate::graph::{Graph, GraphError, Op};

/// Removes every `dropout(x, p = 0)`, its readers reading x.
pub fn eliminate_dropout(g: &Graph) -> Result<(Graph, usize), GraphError> {
    eliminate(g, |g, n| {
        matches!(n.op, Op::Dropout(Dropout { p, .. }) if p == 0.0)
            && g.shape(n.inputs[0]) == g.shape(n.outputs[0])
    })
}

/// Removes every reshape to the same shape and identity permute, their readers reading x.
pub fn eliminate_identity(g: &Graph) -> Result<(Graph, usize), GraphError> {
    eliminate(g, |g, n| match &n.op {
        Op::Reshape => g.shape(n.inputs[0]) == g.shape(n.outputs[0]),
        Op::Permute(Permute { perm }) => perm.iter().enumerate().all(|(i, &p)| i == p),
        _ => false,
    })
}

fn eliminate(
    g: &Graph,
    is_identity: impl Fn(&Graph, &crate::graph::Node) -> bool,
) -> Result<(Graph, usize), GraphError> {
    let uses = Uses::new(g);
    let mut rw = Rewrite::new(g);
    for (i, n) in g.nodes().iter().enumerate() {
        // A root (the loss) keeps its node: it is not read through a substitution alone.
        if is_identity(g, n) && !uses.root[n.outputs[0].index()] {
            rw.remove(i);
            rw.replace(n.outputs[0], n.inputs[0]);
            rw.count += 1;
        }
    }
    let count = rw.count;
    Ok((rw.finish()?, count))
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::*;

    /// An MLP with p = 0 dropouts, a same-shape reshape and an identity permute.
    fn graph() -> Graph {
        let mut g = Graph::new();
        let (x, labels) =
            (g.input_float("x", &[3, 4, 8]).unwrap(), g.input_ids("labels", &[3, 4]).unwrap());
        let w = g.param("w", &[8, 8]).unwrap();
        let h = g.dropout(x, 0.0).unwrap();
        let h = g.matmul(h, w, false, true).unwrap();
        let h = g.reshape(h, &[3, 4, 8]).unwrap();
        let h = g.permute(h, &[0, 1, 2]).unwrap();
        let h = g.dropout(h, 0.0).unwrap();
        let h = g.gelu(h, crate::graph::GeluApprox::Erf).unwrap();
        let h = g.dropout(h, 0.25).unwrap(); // stays
        let loss = g.cross_entropy(h, labels).unwrap();
        g.set_loss(loss).unwrap();
        g
    }

    #[test]
    fn dropout_p0_is_removed_and_nothing_changes() {
        let g = graph();
        let (after, n) = show("eliminate_dropout", &g, eliminate_dropout);
        assert_eq!(n, 2);
        assert_eq!(op_counts(&after)["dropout"], 1);
        assert_same_numbers(&g, &after, 0.0, true);
    }

    #[test]
    fn identity_reshapes_and_permutes_are_removed_and_nothing_changes() {
        let g = graph();
        let (after, n) = show("eliminate_identity", &g, eliminate_identity);
        assert_eq!(n, 2);
        assert!(
            !op_counts(&after).contains_key("reshape")
                && !op_counts(&after).contains_key("permute")
        );
        assert_same_numbers(&g, &after, 0.0, true);
    }
}
