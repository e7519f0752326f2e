//! Fill: a tensor filled with one value (the loss seed 1.0; zero gradients of unused outputs).
use super::def::{EvalArgs, GradCtx, Grads, OpDef, Reference};
use super::OpError;
use super::Real;
use crate::graph::GraphError;
use crate::graph::{ElemType, Graph, Op, TensorId};
use crate::plan::Req;

/// () → a tensor filled with `value` (the loss seed 1.0; zero gradients of unused outputs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fill {
    pub value: f32,
}

impl Reference for Fill {
    fn eval<T: Real>(&self, a: &EvalArgs<'_, T>, outs: &mut [Vec<T>]) -> Result<(), OpError> {
        outs[0].fill(a.t(self.value));
        Ok(())
    }
}

impl OpDef for Fill {
    fn name(&self) -> &'static str {
        "fill"
    }

    fn attrs(&self) -> String {
        format!("value={}", self.value)
    }

    fn write_req(&self, _slot: usize) -> Req {
        Req::Any
    }

    fn grad(&self, _cx: &mut GradCtx<'_>) -> Result<Grads, GraphError> {
        // A constant.
        Ok(vec![])
    }
}

/// The op's graph constructors: operand checks and the output shape rule.
impl Graph {
    // ---------------------------------------------------------------- forward ops

    /// A constant tensor (the loss seed, zero gradients).
    pub fn fill(&mut self, shape: &[usize], value: f32) -> TensorId {
        self.push(
            Op::Fill(Fill { value }),
            vec![],
            vec![(shape.to_vec(), ElemType::Float(self.dtype))],
        )[0]
    }
}
