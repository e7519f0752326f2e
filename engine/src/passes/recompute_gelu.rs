//! Recompute GELU outputs in the backward instead of keeping them (off by default; it trades
//! a GELU per MLP for memory).
//!
//! The MLP's activation `y = gelu(x)` (B, T, 4C) is read by the next matmul in the forward and
//! again by that matmul's weight gradient in the backward, so it lives from the forward to the
//! backward — as does its input x, which GELU's own backward reads anyway. This pass inserts
//! `y' = gelu(x)` right before the first backward node that reads y and makes the backward read
//! y', so y dies in the forward and the planner's arena shrinks by about one (B, T, 4C) buffer
//! per layer at the forward/backward turn (where the peak is). Works on a [`Op::Gelu`] and on
//! a [`Op::Linear`] with GELU (recomputing from its saved pre-activation).
//!
//! Backward nodes are those after the node producing the loss (autodiff appends the backward
//! there). The recomputed values are bit-identical (same op on the same input).
//!
//! Reference: ORT training's memory optimizer (`ORTMODULE_MEMORY_OPT_CONFIG`, recompute of
//! `Gelu`/`BiasGelu`); `torch.utils.checkpoint`.

use super::rewrite::{Rewrite, Uses};
use crate::graph::op::{Gelu, Linear};
use crate::graph::{Graph, GraphError, Op};

pub fn run(g: &Graph) -> Result<(Graph, usize), GraphError> {
    let uses = Uses::new(g);
    let Some(loss) = g.loss() else { return Ok((g.clone(), 0)) };
    let Some(boundary) = uses.producer[loss.index()].map(|p| p + 1) else {
        return Ok((g.clone(), 0));
    };
    let mut rw = Rewrite::new(g);
    for n in &g.nodes()[..boundary] {
        let (x, approx) = match n.op {
            Op::Gelu(Gelu { approx }) => (n.inputs[0], approx),
            Op::Linear(Linear { gelu: Some(approx), .. }) => (n.outputs[1], approx),
            _ => continue,
        };
        let y = n.outputs[0];
        let readers: Vec<usize> =
            uses.consumers[y.index()].iter().copied().filter(|&c| c >= boundary).collect();
        let Some(&first) = readers.iter().min() else { continue };
        let y2 = rw.insert_before(first, |g| g.gelu(x, approx))?;
        for &c in &readers {
            for inp in &mut rw.node_mut(c).inputs {
                if *inp == y {
                    *inp = y2;
                }
            }
        }
        rw.count += 1;
    }
    let count = rw.count;
    Ok((rw.finish()?, count))
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::super::{fuse_matmul_bias, PassConfig};
    use super::*;
    use crate::exec::planned::CpuSupport;

    fn peak(g: &Graph) -> usize {
        crate::plan::build(g, &CpuSupport::new(2)).unwrap().peak_bytes()
    }

    fn check(fwd: &Graph) {
        let before = train(fwd);
        let (after, n) = show("recompute_gelu", &before, run);
        assert_eq!(n, 2);
        let gelus = |g: &Graph| op_counts(g).get("gelu").copied().unwrap_or(0);
        assert_eq!(gelus(&after), gelus(&before) + 2);
        let (pb, pa) = (peak(&before), peak(&after));
        println!("planned peak: {pb} bytes before, {pa} after");
        assert!(pa < pb, "the peak must drop: {pa} vs {pb}");
        assert_same_numbers(&before, &after, 0.0, true);
    }

    /// 2-layer GPT-2-like graph (b2×s16, C 32), unfused GELU and fused `linear` with GELU.
    #[test]
    fn recomputed_gelu_lowers_the_peak_and_nothing_changes() {
        let fwd = eager_gpt(2, 16, 32, 2, 50, 2, 0.0);
        check(&fwd);
        let (fused, _) = fuse_matmul_bias::run(&fwd).unwrap();
        check(&fused);
        assert!(!PassConfig::all().enabled("recompute_gelu"));
    }
}
