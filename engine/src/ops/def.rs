//! What an op is, stated in one place: [`OpDef`], implemented by each op's attribute struct in
//! that op's module (`ops/rmsnorm.rs` holds `RmsNorm`'s name, operands, reference semantics and
//! memory needs and gradient rule together). Autodiff, the planner and the memory split ask
//! the op through
//! [`crate::graph::Op::def`] instead of matching over every op per aspect.
//!
//! The defaults are the common case — dense operands, no in-place output, no logits — so an op
//! states only where it differs (as burn's backend traits do); [`OpDef::name`] has none.

use crate::graph::{Graph, GraphError, Node, TensorId};
use crate::plan::split::LossHead;
use crate::plan::Req;

/// One op's definition: what the graph printer, the memory planner and the memory split need.
pub trait OpDef {
    /// The op's name as printed in graphs and errors.
    fn name(&self) -> &'static str;

    /// Attributes as printed after the operands: `ta=false tb=true`.
    fn attrs(&self) -> String {
        String::new()
    }

    /// How many leading outputs of a node with `outputs` outputs carry gradients; the rest are
    /// statistics saved for the backward (not differentiable).
    fn differentiable_outputs(&self, outputs: usize) -> usize {
        outputs
    }

    /// The layout a kernel of this op needs for its input `slot` (the operand order the op's
    /// struct documents), the same for every backend (`plan::KernelSupport` states where a
    /// backend differs).
    fn read_req(&self, _slot: usize) -> Req {
        Req::Contig
    }

    /// The layout a kernel of this op can write its output `slot` in.
    fn write_req(&self, _slot: usize) -> Req {
        Req::Contig
    }

    /// Input slots whose buffer output 0 may overwrite, in order of preference: the kernels
    /// read an element (or, for a row kernel, its whole row) before they write it (see the
    /// aliasing notes in `engine/kernels/*.cu` and `backend/cpu/kernels`).
    fn inplace_inputs(&self) -> &'static [usize] {
        &[]
    }

    /// The loss head's part of the op's memory (its logits-sized operands), None for an op that
    /// is not a loss head.
    fn loss_head(&self) -> Option<LossHead> {
        None
    }

    /// The gradient rule: the gradients of the node's inputs from those of its outputs, as
    /// backward nodes added to `cx.g` (reverse-mode autodiff, `crate::autodiff`). The default
    /// is a backward-only op's: no double backward.
    fn grad(&self, cx: &mut GradCtx<'_>) -> Result<Grads, GraphError> {
        Err(GraphError::Autodiff(format!(
            "{} has no gradient rule (double backward is not supported)",
            cx.node.op.name()
        )))
    }
}

/// The gradients of a node's inputs, in input order (None where not needed or not defined).
pub type Grads = Vec<Option<TensorId>>;

/// What a gradient rule sees: the graph the backward nodes are added to, the forward node, the
/// gradients of its outputs (None for an output nothing depends on) and which inputs need one.
pub struct GradCtx<'a> {
    pub g: &'a mut Graph,
    pub node: &'a Node,
    pub gout: &'a [Option<TensorId>],
    pub need: &'a [bool],
}

impl<'a> GradCtx<'a> {
    pub fn ins(&self) -> &'a [TensorId] {
        &self.node.inputs
    }

    pub fn outs(&self) -> &'a [TensorId] {
        &self.node.outputs
    }

    /// The gradient of output 0, which a rule that reads it requires.
    pub fn gy(&self) -> Result<TensorId, GraphError> {
        self.gout[0].ok_or_else(|| {
            GraphError::Autodiff(format!("{}: missing output gradient", self.node.op.name()))
        })
    }

    pub fn shape(&self, t: TensorId) -> Vec<usize> {
        self.g.shape(t).to_vec()
    }

    /// Masks are inputs to the model, not trained: a mask that depends on a parameter is an
    /// error.
    pub fn no_mask_grad(&self, slot: usize) -> Result<(), GraphError> {
        if self.need.get(slot).copied().unwrap_or(false) {
            return Err(GraphError::Autodiff(format!(
                "{}: the additive mask depends on a parameter; gradients w.r.t. masks are not supported",
                self.node.op.name()
            )));
        }
        Ok(())
    }
}
