//! What an op is, stated in one place: [`OpDef`], implemented by each op's attribute struct in
//! that op's module (`ops/rmsnorm.rs` holds `RmsNorm`'s name, operands, reference semantics and
//! memory needs and gradient rule together). Autodiff, the planner and the memory split ask
//! the op through
//! [`crate::graph::Op::def`] instead of matching over every op per aspect.
//!
//! The defaults are the common case — dense operands, no in-place output, no logits — so an op
//! states only where it differs (as burn's backend traits do); [`OpDef::name`] has none.

use super::{MaskView, OpError, Real};
use crate::exec::gpu::kernel::GpuKernel;
use crate::exec::planned::kernel::CpuKernel;
use crate::graph::{Graph, GraphError, Node, TensorId};
use crate::plan::split::LossHead;
use crate::plan::Req;

/// One op's definition: what the graph printer, autodiff, the reference executor, the memory
/// planner and the memory split need.
pub trait OpDef: RefEval + CpuKernel + GpuKernel {
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

    /// Whether the node's id operands (token ids, labels) are in range, `ids(slot)` giving an
    /// id operand's values where they are known: the check the CPU kernels make as they read
    /// them, which the GPU executor asks to name an id its kernels flagged. Ok for an op that
    /// indexes with no ids (the default).
    fn check_ids<'a>(
        &self,
        _g: &Graph,
        _node: &Node,
        _ids: &dyn Fn(usize) -> Option<&'a [i64]>,
    ) -> Result<(), OpError> {
        Ok(())
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

/// One operand's data as the reference kernels read it.
#[derive(Debug, Clone, Copy)]
pub enum Arg<'a, T> {
    Float(&'a [T]),
    Ids(&'a [i64]),
}

/// What a reference kernel reads: the node, its operands' data and shapes, and the step's
/// dropout seed. Its outputs are passed beside it, sized and zeroed.
pub struct EvalArgs<'a, T> {
    pub g: &'a Graph,
    pub node: &'a Node,
    pub args: Vec<Arg<'a, T>>,
    pub seed: u64,
}

impl<'a, T: Real> EvalArgs<'a, T> {
    /// Float operand `i`.
    pub fn f(&self, i: usize) -> &'a [T] {
        match self.args[i] {
            Arg::Float(v) => v,
            Arg::Ids(_) => unreachable!("{}: input {i} is not a float tensor", self.node.op.name()),
        }
    }

    /// Id operand `i` (token ids, labels).
    pub fn ids(&self, i: usize) -> &'a [i64] {
        match self.args[i] {
            Arg::Ids(v) => v,
            Arg::Float(_) => unreachable!("{}: input {i} is not an id tensor", self.node.op.name()),
        }
    }

    /// The number of operands (optional ones last).
    pub fn operands(&self) -> usize {
        self.args.len()
    }

    pub fn shape(&self, i: usize) -> &'a [usize] {
        self.g.shape(self.node.inputs[i])
    }

    /// The last dim of operand `i` (1 for a scalar).
    pub fn last(&self, i: usize) -> usize {
        *self.shape(i).last().unwrap_or(&1)
    }

    pub fn out_shape(&self, i: usize) -> &'a [usize] {
        self.g.shape(self.node.outputs[i])
    }

    /// An f32 attribute in the compute type.
    pub fn t(&self, x: f32) -> T {
        T::from_f64(x as f64)
    }

    /// The optional additive mask at operand `i`, broadcast against `full`.
    pub fn mask(&self, i: usize, full: &[usize]) -> Option<MaskView<'a, T>> {
        (self.operands() > i).then(|| MaskView::new(self.f(i), self.shape(i), full))
    }
}

/// An op's reference semantics: the plain loops of `ops/` over its operands, in any [`Real`]
/// (f32 in the reference executor, f64 in the gradient checks). Every fast kernel is tested
/// against it.
pub trait Reference {
    /// Computes the node's outputs (`outs`, sized and zeroed, in output order).
    fn eval<T: Real>(&self, a: &EvalArgs<'_, T>, outs: &mut [Vec<T>]) -> Result<(), OpError>;
}

/// [`Reference::eval`] for the two compute types, callable through `dyn OpDef` (a generic
/// method is not); every [`Reference`] has it.
pub trait RefEval {
    fn eval_f32(&self, a: &EvalArgs<'_, f32>, outs: &mut [Vec<f32>]) -> Result<(), OpError>;
    fn eval_f64(&self, a: &EvalArgs<'_, f64>, outs: &mut [Vec<f64>]) -> Result<(), OpError>;
}

impl<R: Reference> RefEval for R {
    fn eval_f32(&self, a: &EvalArgs<'_, f32>, outs: &mut [Vec<f32>]) -> Result<(), OpError> {
        self.eval(a, outs)
    }

    fn eval_f64(&self, a: &EvalArgs<'_, f64>, outs: &mut [Vec<f64>]) -> Result<(), OpError> {
        self.eval(a, outs)
    }
}
