//! Additions and scaling: bias add / residual add (b broadcast over leading rows), the sum over
//! leading rows that is their backward, and multiplication by a constant.
//!
//! Mirrors `torch.add` with trailing-dim broadcasting (`x + bias`, `h + pos_emb`), the bias
//! gradient of llm.c's `matmul_backward` (dbias = sum over B·T rows), and `torch.mul(x, s)`.

use super::def::{EvalArgs, GradCtx, Grads, OpDef, Reference};
use super::OpError;
use super::Real;
use crate::graph::builder::shape_err;
use crate::graph::GraphError;
use crate::graph::{ElemType, Graph, Op, TensorId};

/// (x (…, C), bias (C)) → (…, C)
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BiasAdd;

impl Reference for BiasAdd {
    fn eval<T: Real>(&self, a: &EvalArgs<'_, T>, outs: &mut [Vec<T>]) -> Result<(), OpError> {
        add_forward(&mut outs[0], a.f(0), a.f(1));
        Ok(())
    }
}

impl OpDef for BiasAdd {
    fn name(&self) -> &'static str {
        "bias_add"
    }

    fn inplace_inputs(&self) -> &'static [usize] {
        &[0]
    }

    fn grad(&self, cx: &mut GradCtx<'_>) -> Result<Grads, GraphError> {
        let (ins, dy) = (cx.ins(), cx.gy()?);
        let c = cx.shape(ins[1]);
        Ok(vec![Some(dy), cx.need[1].then(|| cx.g.reduce_sum_leading(dy, &c)).transpose()?])
    }
}

/// (a, b) → a + b, b's shape a suffix of a's (broadcast over a's leading dims).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Add;

impl Reference for Add {
    fn eval<T: Real>(&self, a: &EvalArgs<'_, T>, outs: &mut [Vec<T>]) -> Result<(), OpError> {
        add_forward(&mut outs[0], a.f(0), a.f(1));
        Ok(())
    }
}

impl OpDef for Add {
    fn name(&self) -> &'static str {
        "add"
    }

    fn inplace_inputs(&self) -> &'static [usize] {
        &[0, 1]
    }

    fn grad(&self, cx: &mut GradCtx<'_>) -> Result<Grads, GraphError> {
        let (ins, dy) = (cx.ins(), cx.gy()?);
        let (sa, sb) = (cx.shape(ins[0]), cx.shape(ins[1]));
        let db = if sa == sb || !cx.need[1] { dy } else { cx.g.reduce_sum_leading(dy, &sb)? };
        Ok(vec![Some(dy), Some(db)])
    }
}

/// (x) → s·x
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scale {
    pub s: f32,
}

impl Reference for Scale {
    fn eval<T: Real>(&self, a: &EvalArgs<'_, T>, outs: &mut [Vec<T>]) -> Result<(), OpError> {
        scale_forward(&mut outs[0], a.f(0), a.t(self.s));
        Ok(())
    }
}

impl OpDef for Scale {
    fn name(&self) -> &'static str {
        "scale"
    }

    fn attrs(&self) -> String {
        format!("s={}", self.s)
    }

    fn inplace_inputs(&self) -> &'static [usize] {
        &[0]
    }

    fn grad(&self, cx: &mut GradCtx<'_>) -> Result<Grads, GraphError> {
        let dy = cx.gy()?;
        Ok(vec![Some(cx.g.scale(dy, self.s)?)])
    }
}

/// (x (…, S…)) → (S…): sum over the leading dims (bias and broadcast-add gradients).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReduceSumLeading;

impl Reference for ReduceSumLeading {
    fn eval<T: Real>(&self, a: &EvalArgs<'_, T>, outs: &mut [Vec<T>]) -> Result<(), OpError> {
        reduce_sum_leading(&mut outs[0], a.f(0));
        Ok(())
    }
}

impl OpDef for ReduceSumLeading {
    fn name(&self) -> &'static str {
        "reduce_sum_leading"
    }
}

/// out = a + b, b repeated over the leading rows of a (b.len() divides a.len()).
// out: (R, N)
// a: (R, N)
// b: (N)
pub fn add_forward<T: Real>(out: &mut [T], a: &[T], b: &[T]) {
    let n = b.len();
    for (o, ar) in out.chunks_exact_mut(n).zip(a.chunks_exact(n)) {
        for ((o, &x), &y) in o.iter_mut().zip(ar).zip(b) {
            *o = x + y;
        }
    }
}

/// out = Σ_r x[r, :]: the backward of broadcasting `b` in [`add_forward`].
// out: (N)
// x: (R, N)
pub fn reduce_sum_leading<T: Real>(out: &mut [T], x: &[T]) {
    out.fill(T::ZERO);
    for row in x.chunks_exact(out.len()) {
        for (o, &v) in out.iter_mut().zip(row) {
            *o += v;
        }
    }
}

/// out = s · x (its backward is the same op on the gradient).
// out, x: (N)
pub fn scale_forward<T: Real>(out: &mut [T], x: &[T], s: T) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = v * s;
    }
}

/// The op's graph constructors: operand checks and the output shape rule.
impl Graph {
    /// x (…, C) + bias (C).
    pub fn bias_add(&mut self, x: TensorId, bias: TensorId) -> Result<TensorId, GraphError> {
        let op = "bias_add";
        let (sx, dt) = self.float_arg(op, "x", x)?;
        let (sb, _) = self.float_arg(op, "bias", bias)?;
        if sx.is_empty() || sb.len() != 1 || sb[0] != sx[sx.len() - 1] {
            return Err(shape_err(
                op,
                "bias must be 1-D with the size of x's last dim",
                &[("x", &sx), ("bias", &sb)],
            ));
        }
        Ok(self.push(Op::BiasAdd, vec![x, bias], vec![(sx, ElemType::Float(dt))])[0])
    }

    /// a + b, where b's shape equals a's or a trailing part of it (e.g. (B, T, C) + (T, C)).
    pub fn add(&mut self, a: TensorId, b: TensorId) -> Result<TensorId, GraphError> {
        let op = "add";
        let (sa, dt) = self.float_arg(op, "a", a)?;
        let (sb, _) = self.float_arg(op, "b", b)?;
        if !sa.ends_with(&sb) {
            return Err(shape_err(
                op,
                "b's shape must equal a's or a trailing part of it (broadcast over a's leading dims)",
                &[("a", &sa), ("b", &sb)],
            ));
        }
        Ok(self.push(Op::Add, vec![a, b], vec![(sa, ElemType::Float(dt))])[0])
    }

    /// s · x
    pub fn scale(&mut self, x: TensorId, s: f32) -> Result<TensorId, GraphError> {
        self.unary("scale", Op::Scale(Scale { s }), x)
    }

    /// Sums x over its leading dims down to `shape` (a trailing part of x's shape).
    pub(crate) fn reduce_sum_leading(
        &mut self,
        x: TensorId,
        shape: &[usize],
    ) -> Result<TensorId, GraphError> {
        let op = "reduce_sum_leading";
        let (sx, dt) = self.float_arg(op, "x", x)?;
        if !sx.ends_with(shape) {
            return Err(shape_err(
                op,
                "target must be a trailing part of x's shape",
                &[("x", &sx), ("target", shape)],
            ));
        }
        Ok(self.push(Op::ReduceSumLeading, vec![x], vec![(shape.to_vec(), ElemType::Float(dt))])[0])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testutil::*;

    #[test]
    fn broadcast_add_and_its_backward() {
        let (r, n) = (4, 3);
        let mut rng = Rng::new(2);
        let a = rng.vec(r * n);
        let b = rng.vec(n);
        let dy = rng.vec(r * n);
        let mut out = vec![0.0; r * n];
        add_forward(&mut out, &a, &b);
        assert_eq!(out[n + 1], a[n + 1] + b[1]);

        // d/db of <dy, a + b> is the row sum of dy; d/da is dy itself.
        let mut db = vec![0.0; n];
        reduce_sum_leading(&mut db, &dy);
        let fd_b = fd_grad(&b, FD_STEP, |b| {
            let mut o = vec![0.0; r * n];
            add_forward(&mut o, &a, b);
            dot(&o, &dy)
        });
        assert_close(&db, &fd_b, FD_TOL, "db");
        let fd_a = fd_grad(&a, FD_STEP, |a| {
            let mut o = vec![0.0; r * n];
            add_forward(&mut o, a, &b);
            dot(&o, &dy)
        });
        assert_close(&dy, &fd_a, FD_TOL, "da");
    }

    #[test]
    fn scale_backward_is_scale() {
        let mut rng = Rng::new(3);
        let x = rng.vec(5);
        let dy = rng.vec(5);
        let mut dx = vec![0.0; 5];
        scale_forward(&mut dx, &dy, 0.37);
        let fd = fd_grad(&x, FD_STEP, |x| {
            let mut o = vec![0.0; 5];
            scale_forward(&mut o, x, 0.37);
            dot(&o, &dy)
        });
        assert_close(&dx, &fd, FD_TOL, "dx");
    }
}
