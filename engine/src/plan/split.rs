//! Where one rank's training memory goes, by what it holds: parameters, gradients, optimizer
//! state, activations and the loss head's logits — what the report's memory chart stacks, so a
//! reader sees which part a config saves.
//!
//! Parameters, gradients and optimizer state are flat buffers whose sizes the session knows;
//! this module splits the plan's arena. The arena is one block sized by its peak, and buffers
//! with disjoint lifetimes share its bytes, so "the logits' bytes" is defined over addresses:
//! the arena bytes that hold, at some time, a logits tensor, the logits' gradient or the loss
//! kernels' scratch ([`logits_bytes`]); the activations are the rest of the arena (activations,
//! their gradients, the other kernels' scratch and the arena's gaps). Both are at most the arena
//! and sum to it.

use std::collections::BTreeSet;

use super::{Plan, Root};
use crate::graph::Graph;

/// Bytes one rank holds, by what they hold; the last two sum to the plan's arena.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemorySplit {
    /// The flat parameter buffer (and, in fp16/bf16, the compute-dtype copy the graph reads).
    pub params_bytes: usize,
    /// The flat gradient buffer.
    pub grads_bytes: usize,
    /// The optimizer's moments (and a ZeRO-1 shard's state) on this rank.
    pub optimizer_bytes: usize,
    /// The arena less `logits_bytes`.
    pub activations_bytes: usize,
    /// The arena bytes that hold the loss head's logits, their gradient or its scratch.
    pub logits_bytes: usize,
}

impl MemorySplit {
    /// The split of a session whose flat buffers take the given bytes and whose arena is
    /// `plan`'s (of training graph `g`).
    pub fn new(
        plan: &Plan,
        g: &Graph,
        params_bytes: usize,
        grads_bytes: usize,
        optimizer_bytes: usize,
    ) -> MemorySplit {
        let arena = plan.peak_bytes();
        let logits = logits_bytes(plan, g).min(arena);
        MemorySplit {
            params_bytes,
            grads_bytes,
            optimizer_bytes,
            activations_bytes: arena - logits,
            logits_bytes: logits,
        }
    }

    /// All five parts.
    pub fn total(&self) -> usize {
        self.params_bytes
            + self.grads_bytes
            + self.optimizer_bytes
            + self.activations_bytes
            + self.logits_bytes
    }
}

/// Which operands of a loss-head node are logits-sized memory the loss exists for
/// ([`crate::graph::OpDef::loss_head`]).
pub struct LossHead {
    /// Input slots that are logits (what the head reads).
    pub inputs: &'static [usize],
    /// Output slots that are logits or their gradient, or saved for the head's backward.
    pub outputs: &'static [usize],
    /// The kernel's scratch counts as the head's (it scales with the rows and vocabulary).
    pub scratch: bool,
}

/// Bytes of the arena that hold, at some time, the loss head's logits, their gradient or its
/// scratch: the union of those buffers' byte ranges, so a logits buffer, its views and the
/// gradient written over it in place count once, and two logits buffers that reuse the same
/// bytes at different times count those bytes once.
pub fn logits_bytes(plan: &Plan, g: &Graph) -> usize {
    let mut buffers: BTreeSet<usize> = BTreeSet::new();
    let mut ranges: Vec<(usize, usize)> = Vec::new();
    for step in &plan.steps {
        let node = &g.nodes()[step.node];
        let Some(head) = node.op.def().loss_head() else { continue };
        let ins = head.inputs.iter().filter_map(|&s| node.inputs.get(s));
        let outs = head.outputs.iter().filter_map(|&s| node.outputs.get(s));
        for t in ins.chain(outs) {
            if plan.places[t.index()].root != Root::Arena {
                continue;
            }
            if let Some(b) = plan.buffer_of[t.index()] {
                buffers.insert(b);
            }
        }
        if let (true, Some((offset, len))) = (head.scratch, step.workspace) {
            ranges.push((4 * offset, 4 * (offset + len)));
        }
    }
    ranges.extend(buffers.iter().map(|&b| {
        let buf = &plan.buffers[b];
        (4 * buf.offset, 4 * (buf.offset + buf.len))
    }));
    union_len(ranges)
}

/// Length of the union of half-open ranges.
fn union_len(mut ranges: Vec<(usize, usize)>) -> usize {
    ranges.sort_unstable();
    let (mut total, mut end) = (0, 0);
    for (s, e) in ranges {
        if e > end {
            total += e - s.max(end);
            end = e;
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::autodiff::backward;
    use crate::graph::{Op, TensorId};
    use crate::plan::{build, KernelSupport, PlanError};

    /// Kernels with the ops' own layouts and in-place rules (or none in place), and scratch for
    /// the loss heads only: a fixed backend, so the byte counts below follow from the planner's
    /// rules alone.
    struct Fixed {
        inplace: bool,
    }
    impl KernelSupport for Fixed {
        fn name(&self) -> &'static str {
            "fixed"
        }
        fn check(&self, _: &Graph, _: usize) -> Result<(), PlanError> {
            Ok(())
        }
        fn inplace(&self, g: &Graph, node: usize) -> Vec<usize> {
            if self.inplace {
                g.nodes()[node].op.def().inplace_inputs().to_vec()
            } else {
                vec![]
            }
        }
        fn workspace(&self, g: &Graph, node: usize) -> usize {
            match g.nodes()[node].op {
                Op::CrossEntropy(_) => 3,
                Op::LinearCrossEntropy(_) => 20,
                Op::LinearCrossEntropyBackward(_) => 40,
                _ => 0,
            }
        }
    }

    /// logits (3, 10) = x (3, 8) · w (8, 10), cross-entropy against 3 labels; x is a step input,
    /// so the backward is dlogits and dw (into the gradient buffer) only.
    fn head() -> (Graph, TensorId) {
        let mut g = Graph::new();
        let x = g.input_float("x", &[3, 8]).unwrap();
        let labels = g.input_ids("labels", &[3]).unwrap();
        let w = g.param("w", &[8, 10]).unwrap();
        let logits = g.matmul(x, w, false, false).unwrap();
        let loss = g.cross_entropy(logits, labels).unwrap();
        (backward(&g, loss).unwrap(), logits)
    }

    #[test]
    fn split_of_a_cross_entropy_head_matches_a_hand_count() {
        // Schedule: 0 matmul → logits, 1 cross_entropy → loss (+ scratch), 2 fill → dloss,
        // 3 cross_entropy_backward → dlogits over the logits, 4 matmul → dw (gradient buffer).
        // Arena items in 4-byte units, each rounded up to 16: logits+dlogits 30 → 32 (nodes
        // 0..=4), loss 1 → 16 (1..=end), scratch 3 → 16 (node 1), dloss 1 → 16 (2..=3).
        // Best fit, largest first: logits at 0, loss at 32, scratch at 48 (both live at node 1),
        // dloss at 48 too (the scratch is dead by node 2) → arena 64 units = 256 bytes.
        // Logits' bytes: [0, 128) and the scratch's [192, 256) = 192; activations: 64.
        let (g, logits) = head();
        let plan = build(&g, &Fixed { inplace: true }).unwrap();
        plan.check(&g).unwrap();
        assert_eq!(plan.peak_bytes(), 256, "{}", plan.summary(&g));
        let ce_back =
            plan.steps.iter().find(|s| matches!(g.nodes()[s.node].op, Op::CrossEntropyBackward(_)));
        assert_eq!(ce_back.and_then(|s| s.inplace), Some(1), "dlogits over the logits");
        assert_eq!(plan.buffers[plan.buffer_of[logits.index()].unwrap()].len, 32);
        let s = MemorySplit::new(&plan, &g, 320, 320, 640);
        assert_eq!(
            s,
            MemorySplit {
                params_bytes: 320,
                grads_bytes: 320,
                optimizer_bytes: 640,
                activations_bytes: 64,
                logits_bytes: 192,
            }
        );
        assert_eq!(s.total(), 320 + 320 + 640 + 256);
    }

    #[test]
    fn logits_and_their_gradient_in_two_buffers_count_both() {
        // Nothing in place: dlogits (32 units, nodes 3..=4) is live with the logits (0..=3) at
        // node 3, so it gets bytes of its own. Largest first: logits at 0, dlogits at 32, loss
        // (1..=end) at 64; the scratch (node 1 only) fits the gap dlogits leaves before node 3,
        // at 32; dloss (2..=3) at 80 → 96 units = 384 bytes. Logits' bytes: [0, 256), the
        // scratch's inside it; activations: the loss and dloss, 128.
        let (g, _) = head();
        let plan = build(&g, &Fixed { inplace: false }).unwrap();
        plan.check(&g).unwrap();
        assert_eq!(plan.peak_bytes(), 384, "{}", plan.summary(&g));
        let s = MemorySplit::new(&plan, &g, 0, 0, 0);
        assert_eq!((s.logits_bytes, s.activations_bytes), (256, 128));
    }

    #[test]
    fn fused_linear_cross_entropy_holds_only_its_scratch_as_logits() {
        // loss = linear_cross_entropy(x (3, 8), w (10, 8), labels): no logits tensor at all.
        // Its logits are the kernels' chunks: scratch of 20 → 32 units at node 0 (forward) and
        // 40 → 48 units at node 2 (backward). Largest first, the backward's at 0; the
        // forward's, live at node 0 only, is placed next (before any other 32-unit item, by
        // its earlier first use) and shares those bytes: the logits' bytes are 48 units, 192.
        let mut g = Graph::new();
        let x = g.input_float("x", &[3, 8]).unwrap();
        let labels = g.input_ids("labels", &[3]).unwrap();
        let w = g.param("w", &[10, 8]).unwrap();
        let head = crate::graph::op::LinearCrossEntropy {
            ignore_index: crate::graph::IGNORE_INDEX,
            softcap: None,
        };
        let loss = g.linear_cross_entropy(x, w, labels, None, head).unwrap();
        let g = backward(&g, loss).unwrap();
        let plan = build(&g, &Fixed { inplace: true }).unwrap();
        plan.check(&g).unwrap();
        let s = MemorySplit::new(&plan, &g, 0, 0, 0);
        assert_eq!(s.logits_bytes, 192, "{:?}", plan.buffers);
        assert_eq!(s.activations_bytes, plan.peak_bytes() - 192);
    }

    #[test]
    fn union_counts_shared_bytes_once() {
        assert_eq!(union_len(vec![(0, 64), (32, 96), (128, 192), (128, 160)]), 160);
        assert_eq!(union_len(vec![]), 0);
    }
}
