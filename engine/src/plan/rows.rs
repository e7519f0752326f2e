//! Rows a cross-entropy ignores: the work they would cost is skipped at run time.
//!
//! A masked-LM loss reads only the rows of its logits whose label is not the ignore index
//! (HF's data collator labels 15% of the tokens), and the gradient of every other row is
//! exactly zero. Without changing the graph, this analysis finds, per cross-entropy:
//!
//! - **dead rows** going back from the logits through row-wise producers (bias add, scale,
//!   broadcast add, reshapes keeping the last dim) to the matmul that makes them: that matmul
//!   need only compute the labelled rows (the others are never read: the forward skips them
//!   and the backward writes their gradient as 0 without reading them);
//! - **zero rows** going forward from the gradient of the logits: a matmul `dL·W` computes the
//!   labelled rows and writes zeros elsewhere; a matmul contracting over rows (`dLᵀ·X` or
//!   `Xᵀ·dL`, the weight gradients) contracts over the labelled rows only; a sum over rows
//!   (the bias gradient) adds the labelled rows only.
//!
//! The row set is read from the labels at the start of each step; the executor uses it only
//! when it is sparse enough to pay for the row gathers (and runs the dense kernel otherwise),
//! so results are the same function either way — sums skip exact zeros. For BERT MLM (b8×s128)
//! this removes ~120 of the step's ~680 GFLOP. `ORTBENCH_ROW_SKIP=0` turns it off.

use crate::graph::op::{CrossEntropy, CrossEntropyBackward, MatMul};
use crate::graph::{Graph, Op, TensorId};

/// The labelled rows of one cross-entropy: rows r of `labels` (flat) with
/// `labels[r] != ignore_index`, out of `rows`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowSet {
    pub labels: TensorId,
    pub ignore_index: i64,
    pub rows: usize,
}

/// How a node may restrict its work to a row set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowUse {
    /// Matmul output rows outside the set are never read: compute the set's rows only.
    Dead,
    /// Matmul output rows outside the set are exactly zero (its `a` operand's rows are).
    Zero,
    /// A matmul contracting over rows (ta, K = rows) whose operand rows outside the set are
    /// zero: contract over the set's rows only.
    SparseK,
    /// A sum over rows whose rows outside the set are zero.
    Skip,
}

/// The analysis of one graph.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RowPlan {
    pub sets: Vec<RowSet>,
    /// Per node: (set, use).
    pub nodes: Vec<Option<(usize, RowUse)>>,
}

impl RowPlan {
    /// Whether any node can use a row set.
    pub fn is_empty(&self) -> bool {
        self.nodes.iter().all(Option::is_none)
    }
}

/// Whether `ORTBENCH_ROW_SKIP` leaves row skipping on (the default).
pub fn enabled() -> bool {
    !std::env::var("ORTBENCH_ROW_SKIP").is_ok_and(|v| v == "0")
}

/// Finds the row-restricted nodes of training graph `g`.
pub fn analyze(g: &Graph) -> RowPlan {
    let nodes = g.nodes();
    let nt = g.tensors().len();
    let mut producer = vec![None; nt];
    let mut consumers: Vec<Vec<(usize, usize)>> = vec![Vec::new(); nt];
    for (i, n) in nodes.iter().enumerate() {
        for &o in &n.outputs {
            producer[o.index()] = Some(i);
        }
        for (s, &x) in n.inputs.iter().enumerate() {
            consumers[x.index()].push((i, s));
        }
    }
    let last = |t: TensorId| *g.shape(t).last().unwrap_or(&1);
    let rows_of = |t: TensorId| g.tensor(t).numel() / last(t).max(1);
    let mut plan = RowPlan { sets: Vec::new(), nodes: vec![None; nodes.len()] };
    for (ci, n) in nodes.iter().enumerate() {
        let Op::CrossEntropy(CrossEntropy { ignore_index }) = n.op else { continue };
        let (logits, labels) = (n.inputs[0], n.inputs[1]);
        let rows = g.tensor(labels).numel();
        let v = last(logits);
        let set = plan.sets.len();
        // The backward nodes of this loss: same logits, labels and ignore index.
        let backs: Vec<usize> = consumers[logits.index()]
            .iter()
            .map(|&(b, _)| b)
            .filter(|&b| matches!(nodes[b].op, Op::CrossEntropyBackward(CrossEntropyBackward { ignore_index: ii }) if ii == ignore_index) && nodes[b].inputs[1] == logits && nodes[b].inputs[2] == labels)
            .collect();
        let mut used = false;

        // Dead rows, from the logits back to the matmul that makes them.
        let only_loss =
            consumers[logits.index()].iter().all(|&(x, _)| x == ci || backs.contains(&x));
        if only_loss {
            let mut t = logits;
            while let Some(p) = producer[t.index()] {
                let pn = &nodes[p];
                let next = match pn.op {
                    Op::BiasAdd | Op::Scale(_) => Some(pn.inputs[0]),
                    Op::Add if g.tensor(pn.inputs[1]).numel() < g.tensor(t).numel() => {
                        Some(pn.inputs[0])
                    }
                    Op::Reshape if last(pn.inputs[0]) == v => Some(pn.inputs[0]),
                    Op::MatMul(MatMul { ta: false, .. })
                        if g.shape(pn.inputs[1]).len() == 2 && rows_of(t) == rows =>
                    {
                        plan.nodes[p] = Some((set, RowUse::Dead));
                        used = true;
                        None
                    }
                    // Any other producer ends the walk: its rows are computed in full (safe).
                    _ => None,
                };
                match next {
                    Some(x)
                        if consumers[x.index()].len() == 1
                            && rows_of(x) == rows
                            && last(x) == v =>
                    {
                        t = x
                    }
                    _ => break,
                }
            }
        }

        // Zero rows, from the logits' gradient forward (through reshapes keeping the last dim).
        for &b in &backs {
            let mut frontier = vec![nodes[b].outputs[0]];
            while let Some(d) = frontier.pop() {
                for &(x, slot) in &consumers[d.index()] {
                    let xn = &nodes[x];
                    let two_d = |t: TensorId| g.shape(t).len() == 2;
                    let r = match xn.op {
                        Op::Reshape if last(xn.outputs[0]) == v => {
                            frontier.push(xn.outputs[0]);
                            None
                        }
                        Op::MatMul(MatMul { ta: false, .. })
                            if slot == 0 && two_d(xn.inputs[1]) && rows_of(d) == rows =>
                        {
                            Some(RowUse::Zero)
                        }
                        Op::MatMul(MatMul { ta: true, tb: false })
                            if two_d(xn.inputs[0])
                                && two_d(xn.inputs[1])
                                && g.shape(xn.inputs[0])[0] == rows =>
                        {
                            Some(RowUse::SparseK)
                        }
                        Op::ReduceSumLeading
                            if rows_of(d) == rows && g.tensor(xn.outputs[0]).numel() == v =>
                        {
                            Some(RowUse::Skip)
                        }
                        // Any other consumer reads the zero rows in full (safe).
                        _ => None,
                    };
                    if let Some(r) = r {
                        if plan.nodes[x].is_none() {
                            plan.nodes[x] = Some((set, r));
                            used = true;
                        }
                    }
                }
            }
        }
        if used {
            plan.sets.push(RowSet { labels, ignore_index, rows });
        } else {
            // Nothing uses this set: drop the index we reserved.
            for e in plan.nodes.iter_mut() {
                if matches!(e, Some((s, _)) if *s == set) {
                    *e = None;
                }
            }
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::testgraphs::{bert_like, gpt_like, Dims};

    fn uses(g: &Graph) -> Vec<(&'static str, RowUse)> {
        let p = analyze(g);
        g.nodes()
            .iter()
            .zip(&p.nodes)
            .filter_map(|(n, u)| u.map(|(_, r)| (n.op.name(), r)))
            .collect()
    }

    #[test]
    fn mlm_and_lm_heads_are_found() {
        let d = Dims { b: 2, t: 9, c: 24, h: 3, v: 37, layers: 1, dropout: 0.1 };
        // BERT MLM: decoder matmul (dead), its dX (zero), dW (sparse K), bias gradient (skip).
        let u = uses(&bert_like(&d, false).unwrap());
        for want in [RowUse::Dead, RowUse::Zero, RowUse::SparseK, RowUse::Skip] {
            assert_eq!(u.iter().filter(|(_, r)| *r == want).count(), 1, "{want:?} in {u:?}");
        }
        // GPT-2: no bias on the head, so no skip.
        let u = uses(&gpt_like(&d).unwrap());
        assert_eq!(u.len(), 3, "{u:?}");
        assert!(u.iter().all(|(op, _)| *op == "matmul"));
        // The classifier's 3 logits come from a pooled (B, C) matmul with one row per label:
        // its rows are all labelled in practice, but the analysis still finds them.
        let p = analyze(&bert_like(&d, true).unwrap());
        assert_eq!(p.sets.len(), 1);
    }
}
