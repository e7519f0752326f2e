//! tanh (BERT's pooler activation).
//!
//! Mirrors `torch.tanh` and its backward `tanh_backward(grad, y) = grad·(1 - y²)` (ATen), which
//! needs only the output, so the forward input can be freed.

use super::def::{EvalArgs, GradCtx, Grads, OpDef, Reference};
use super::OpError;
use super::Real;
use crate::graph::GraphError;
use crate::graph::{Graph, Op, TensorId};

/// (x) → tanh(x)
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tanh;

impl Reference for Tanh {
    fn eval<T: Real>(&self, a: &EvalArgs<'_, T>, outs: &mut [Vec<T>]) -> Result<(), OpError> {
        tanh_forward(&mut outs[0], a.f(0));
        Ok(())
    }
}

impl OpDef for Tanh {
    fn name(&self) -> &'static str {
        "tanh"
    }

    fn inplace_inputs(&self) -> &'static [usize] {
        &[0]
    }

    fn grad(&self, cx: &mut GradCtx<'_>) -> Result<Grads, GraphError> {
        // From the forward output: tanh' = 1 − y².
        let (outs, dy) = (cx.outs(), cx.gy()?);
        Ok(vec![Some(cx.g.tanh_backward(outs[0], dy)?)])
    }
}

/// (y, dy) → dx, from the forward output.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TanhBackward;

impl Reference for TanhBackward {
    fn eval<T: Real>(&self, a: &EvalArgs<'_, T>, outs: &mut [Vec<T>]) -> Result<(), OpError> {
        tanh_backward(&mut outs[0], a.f(0), a.f(1));
        Ok(())
    }
}

impl OpDef for TanhBackward {
    fn name(&self) -> &'static str {
        "tanh_backward"
    }

    // Over dy.
    fn inplace_inputs(&self) -> &'static [usize] {
        &[1]
    }
}

// out, x: (N)
pub fn tanh_forward<T: Real>(out: &mut [T], x: &[T]) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = v.tanh();
    }
}

/// dx = dout·(1 - y²)
// dx, y, dout: (N)
pub fn tanh_backward<T: Real>(dx: &mut [T], y: &[T], dout: &[T]) {
    for ((d, &y), &g) in dx.iter_mut().zip(y).zip(dout) {
        *d = g * (T::ONE - y * y);
    }
}

/// The op's graph constructors: operand checks and the output shape rule.
impl Graph {
    pub fn tanh(&mut self, x: TensorId) -> Result<TensorId, GraphError> {
        self.unary("tanh", Op::Tanh, x)
    }

    pub(crate) fn tanh_backward(
        &mut self,
        y: TensorId,
        dy: TensorId,
    ) -> Result<TensorId, GraphError> {
        self.binary_same("tanh_backward", Op::TanhBackward, [("y", y), ("dy", dy)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testutil::*;

    #[test]
    fn backward_matches_finite_differences() {
        let mut rng = Rng::new(5);
        let x: Vec<f64> = rng.vec(16).iter().map(|v| 2.0 * v).collect();
        let dy = rng.vec(16);
        let mut y = vec![0.0; 16];
        tanh_forward(&mut y, &x);
        let mut dx = vec![0.0; 16];
        tanh_backward(&mut dx, &y, &dy);
        let fd = fd_grad(&x, FD_STEP, |x| {
            let mut y = vec![0.0; 16];
            tanh_forward(&mut y, x);
            dot(&y, &dy)
        });
        assert_close(&dx, &fd, FD_TOL, "dx");
    }
}
