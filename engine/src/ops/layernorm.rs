//! LayerNorm over the last dim, with weight and bias.
//!
//! Mirrors `torch.nn.functional.layer_norm(x, (C,), w, b, eps)`: biased variance, eps inside the
//! square root. Forward also returns each row's mean and 1/std (as ATen and llm.c's
//! `layernorm_forward` do) so the backward does not recompute them; the backward is llm.c's
//! `layernorm_backward`.

use super::def::{EvalArgs, GradCtx, Grads, OpDef, Reference};
use super::OpError;
use super::Real;
use crate::graph::builder::shape_err;
use crate::graph::GraphError;
use crate::graph::{ElemType, Graph, Op, TensorId};
use crate::DType;

/// (x (…, C), w (C), b (C)) → (y (…, C), mean (…), rstd (…)); mean and rstd are saved for
/// the backward and are not differentiable.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerNorm {
    pub eps: f32,
}

impl Reference for LayerNorm {
    fn eval<T: Real>(&self, a: &EvalArgs<'_, T>, outs: &mut [Vec<T>]) -> Result<(), OpError> {
        let [y, mean, rstd] = outs else { unreachable!("layernorm has 3 outputs") };
        layernorm_forward(y, mean, rstd, a.f(0), a.f(1), a.f(2), a.t(self.eps));
        Ok(())
    }
}

impl OpDef for LayerNorm {
    fn name(&self) -> &'static str {
        "layernorm"
    }

    // (y, mean, rstd): the statistics are saved for the backward.
    fn differentiable_outputs(&self, _outputs: usize) -> usize {
        1
    }

    fn attrs(&self) -> String {
        format!("eps={:e}", self.eps)
    }

    fn grad(&self, cx: &mut GradCtx<'_>) -> Result<Grads, GraphError> {
        let (ins, outs, dy) = (cx.ins(), cx.outs(), cx.gy()?);
        let d = cx.g.layer_norm_backward(dy, ins[0], ins[1], outs[1], outs[2])?;
        Ok(d.into_iter().map(Some).collect())
    }
}

/// (a (…, C), b (…, C), w (C), bias (C)) → (sum (…, C) = a + b, y (…, C) = LayerNorm(sum),
/// mean (…), rstd (…)); sum and y are differentiable, mean/rstd are saved statistics. The
/// residual add + LayerNorm of every transformer block in one pass over the rows (ORT's
/// `SkipLayerNormalization`, Apex's `FusedAddLayerNorm`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AddLayerNorm {
    pub eps: f32,
}

impl Reference for AddLayerNorm {
    fn eval<T: Real>(&self, a: &EvalArgs<'_, T>, outs: &mut [Vec<T>]) -> Result<(), OpError> {
        let [sum, y, mean, rstd] = outs else { unreachable!("add_layernorm has 4 outputs") };
        add_layernorm_forward(sum, y, mean, rstd, a.f(0), a.f(1), a.f(2), a.f(3), a.t(self.eps));
        Ok(())
    }
}

impl OpDef for AddLayerNorm {
    fn name(&self) -> &'static str {
        "add_layernorm"
    }

    // (sum, y, mean, rstd): the statistics are saved for the backward.
    fn differentiable_outputs(&self, _outputs: usize) -> usize {
        2
    }

    fn attrs(&self) -> String {
        format!("eps={:e}", self.eps)
    }

    fn inplace_inputs(&self) -> &'static [usize] {
        &[0, 1]
    }

    fn grad(&self, cx: &mut GradCtx<'_>) -> Result<Grads, GraphError> {
        // LayerNorm's backward on the saved sum, plus the gradient reaching the sum from its
        // other uses (the residual stream); both addends get that total.
        let (ins, outs) = (cx.ins(), cx.outs());
        let (mut dsum, mut dw, mut db) = (cx.gout[0], None, None);
        if let Some(dy) = cx.gout[1] {
            let d = cx.g.layer_norm_backward(dy, outs[0], ins[2], outs[2], outs[3])?;
            dsum = Some(match dsum {
                Some(other) => cx.g.add(other, d[0])?,
                None => d[0],
            });
            (dw, db) = (Some(d[1]), Some(d[2]));
        }
        Ok(vec![dsum, dsum, dw, db])
    }
}

/// (dy, x, w, mean, rstd) → (dx, dw, db)
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerNormBackward;

impl Reference for LayerNormBackward {
    fn eval<T: Real>(&self, a: &EvalArgs<'_, T>, outs: &mut [Vec<T>]) -> Result<(), OpError> {
        let [dx, dw, db] = outs else { unreachable!("layernorm_backward has 3 outputs") };
        layernorm_backward(dx, dw, db, a.f(0), a.f(1), a.f(2), a.f(3), a.f(4));
        Ok(())
    }
}

impl OpDef for LayerNormBackward {
    fn name(&self) -> &'static str {
        "layernorm_backward"
    }
}

/// y = (x - mean)·rstd·w + b, rstd = 1/√(var + eps), var = mean((x - mean)²).
// y: (R, C)
// mean, rstd: (R)
// x: (R, C)
// w, b: (C)
pub fn layernorm_forward<T: Real>(
    y: &mut [T],
    mean: &mut [T],
    rstd: &mut [T],
    x: &[T],
    w: &[T],
    b: &[T],
    eps: T,
) {
    let c = w.len();
    let inv_c = T::ONE / T::from_f64(c as f64);
    for (r, (xr, yr)) in x.chunks_exact(c).zip(y.chunks_exact_mut(c)).enumerate() {
        let mut m = T::ZERO;
        for &v in xr {
            m += v;
        }
        m *= inv_c;
        let mut var = T::ZERO;
        for &v in xr {
            var += (v - m) * (v - m);
        }
        var *= inv_c;
        let s = T::ONE / (var + eps).sqrt();
        for i in 0..c {
            yr[i] = (xr[i] - m) * s * w[i] + b[i];
        }
        mean[r] = m;
        rstd[r] = s;
    }
}

/// The residual add + LayerNorm of `Op::AddLayerNorm`: sum = a + b, then
/// [`layernorm_forward`] of sum (its backward is LayerNorm's, the residual gradient passing
/// through the add unchanged). Reference: ORT's `SkipLayerNormalization`.
// sum, y: (R, C)
// mean, rstd: (R)
// a, b: (R, C)
// w, bias: (C)
#[allow(clippy::too_many_arguments, reason = "the op's operands and dimensions")]
pub fn add_layernorm_forward<T: Real>(
    sum: &mut [T],
    y: &mut [T],
    mean: &mut [T],
    rstd: &mut [T],
    a: &[T],
    b: &[T],
    w: &[T],
    bias: &[T],
    eps: T,
) {
    for ((s, &x), &r) in sum.iter_mut().zip(a).zip(b) {
        *s = x + r;
    }
    layernorm_forward(y, mean, rstd, sum, w, bias, eps);
}

/// dx = rstd·(dnorm - mean(dnorm) - norm·mean(dnorm·norm)) with dnorm = dy·w, norm = (x-mean)·rstd;
/// dw = Σ_rows dy·norm; db = Σ_rows dy.
// dx: (R, C)
// dw, db: (C)
// dy, x: (R, C)
// w: (C)
// mean, rstd: (R)
#[allow(clippy::too_many_arguments, reason = "the op's operands and dimensions")]
pub fn layernorm_backward<T: Real>(
    dx: &mut [T],
    dw: &mut [T],
    db: &mut [T],
    dy: &[T],
    x: &[T],
    w: &[T],
    mean: &[T],
    rstd: &[T],
) {
    let c = w.len();
    let inv_c = T::ONE / T::from_f64(c as f64);
    dw.fill(T::ZERO);
    db.fill(T::ZERO);
    for r in 0..mean.len() {
        let (xr, dyr) = (&x[r * c..(r + 1) * c], &dy[r * c..(r + 1) * c]);
        let (m, s) = (mean[r], rstd[r]);
        let mut dnorm_mean = T::ZERO;
        let mut dnorm_norm_mean = T::ZERO;
        for i in 0..c {
            let norm = (xr[i] - m) * s;
            let dnorm = dyr[i] * w[i];
            dnorm_mean += dnorm;
            dnorm_norm_mean += dnorm * norm;
            dw[i] += dyr[i] * norm;
            db[i] += dyr[i];
        }
        dnorm_mean *= inv_c;
        dnorm_norm_mean *= inv_c;
        for i in 0..c {
            let norm = (xr[i] - m) * s;
            let dnorm = dyr[i] * w[i];
            dx[r * c + i] = s * (dnorm - dnorm_mean - norm * dnorm_norm_mean);
        }
    }
}

/// The op's graph constructors: operand checks and the output shape rule.
impl Graph {
    /// LayerNorm over the last dim: w, b of shape (C). Returns y; the node also outputs the row
    /// mean and rstd (kept for the backward).
    pub fn layer_norm(
        &mut self,
        x: TensorId,
        w: TensorId,
        b: TensorId,
        eps: f32,
    ) -> Result<TensorId, GraphError> {
        let op = "layernorm";
        let (sx, dt) = self.float_arg(op, "x", x)?;
        let (sw, _) = self.float_arg(op, "weight", w)?;
        let (sb, _) = self.float_arg(op, "bias", b)?;
        let named: &[(&str, &[usize])] = &[("x", &sx), ("weight", &sw), ("bias", &sb)];
        if sx.is_empty() || sw != [sx[sx.len() - 1]] || sb != sw {
            return Err(shape_err(
                op,
                "weight and bias must be 1-D with the size of x's last dim",
                named,
            ));
        }
        if !(eps >= 0.0 && eps.is_finite()) {
            return Err(GraphError::Attr {
                op,
                msg: format!("eps must be finite and >= 0, got {eps}"),
            });
        }
        let rows = sx[..sx.len() - 1].to_vec();
        let stats = ElemType::Float(DType::F32);
        let outs = vec![(sx, ElemType::Float(dt)), (rows.clone(), stats), (rows, stats)];
        Ok(self.push(Op::LayerNorm(LayerNorm { eps }), vec![x, w, b], outs)[0])
    }

    /// [`Op::AddLayerNorm`]: (sum = a + b, LayerNorm(sum)) over the last dim; a and b of the
    /// same shape. Returns (sum, y); the node also outputs the row mean and rstd.
    // a, b: (…, C); w, bias: (C) -> (…, C), (…, C)
    pub fn add_layer_norm(
        &mut self,
        a: TensorId,
        b: TensorId,
        w: TensorId,
        bias: TensorId,
        eps: f32,
    ) -> Result<(TensorId, TensorId), GraphError> {
        let op = "add_layernorm";
        let (sa, dt) = self.float_arg(op, "a", a)?;
        let (sb, _) = self.float_arg(op, "b", b)?;
        let (sw, _) = self.float_arg(op, "weight", w)?;
        let (sbias, _) = self.float_arg(op, "bias", bias)?;
        let named: &[(&str, &[usize])] =
            &[("a", &sa), ("b", &sb), ("weight", &sw), ("bias", &sbias)];
        if sa != sb || sa.is_empty() || sw != [sa[sa.len() - 1]] || sbias != sw {
            return Err(shape_err(
                op,
                "a and b must have the same shape, weight and bias the size of its last dim",
                named,
            ));
        }
        if !(eps >= 0.0 && eps.is_finite()) {
            return Err(GraphError::Attr {
                op,
                msg: format!("eps must be finite and >= 0, got {eps}"),
            });
        }
        let rows = sa[..sa.len() - 1].to_vec();
        let (f, stats) = (ElemType::Float(dt), ElemType::Float(DType::F32));
        let outs = vec![(sa.clone(), f), (sa, f), (rows.clone(), stats), (rows, stats)];
        let o = self.push(Op::AddLayerNorm(AddLayerNorm { eps }), vec![a, b, w, bias], outs);
        Ok((o[0], o[1]))
    }

    /// (dy, x, w, mean, rstd) → [dx, dw, db]
    pub(crate) fn layer_norm_backward(
        &mut self,
        dy: TensorId,
        x: TensorId,
        w: TensorId,
        mean: TensorId,
        rstd: TensorId,
    ) -> Result<Vec<TensorId>, GraphError> {
        let op = "layernorm_backward";
        let (sd, dt) = self.float_arg(op, "dy", dy)?;
        let (sx, _) = self.float_arg(op, "x", x)?;
        let (sw, _) = self.float_arg(op, "weight", w)?;
        let (sm, _) = self.float_arg(op, "mean", mean)?;
        let (sr, _) = self.float_arg(op, "rstd", rstd)?;
        if sd != sx
            || sx.is_empty()
            || sw != [sx[sx.len() - 1]]
            || sm[..] != sx[..sx.len() - 1]
            || sr != sm
        {
            let named: &[(&str, &[usize])] =
                &[("dy", &sd), ("x", &sx), ("weight", &sw), ("mean", &sm), ("rstd", &sr)];
            return Err(shape_err(op, "inconsistent operands", named));
        }
        let f = ElemType::Float(dt);
        Ok(self.push(
            Op::LayerNormBackward,
            vec![dy, x, w, mean, rstd],
            vec![(sx, f), (sw.clone(), f), (sw, f)],
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testutil::*;

    #[test]
    fn matches_pytorch_f32() {
        let x = [0.3f32, -1.2, 2.0, 0.7, 1.5, 0.1, -0.4, -2.2];
        let (w, b) = ([1.1f32, 0.9, -0.5, 2.0], [0.1f32, -0.2, 0.3, 0.0]);
        // F.layer_norm(x, (4,), w, b, 1e-5) in torch 2.11 f32.
        let want = [
            -0.04457505f32,
            -1.5011756,
            -0.37906468,
            0.43810627,
            1.5541209,
            0.03794704,
            0.35665405,
            -2.946011,
        ];
        let (mut y, mut m, mut s) = ([0.0f32; 8], [0.0f32; 2], [0.0f32; 2]);
        layernorm_forward(&mut y, &mut m, &mut s, &x, &w, &b, 1e-5);
        for i in 0..8 {
            assert!(
                (y[i] - want[i]).abs() <= 1e-6 * (1.0 + want[i].abs()),
                "y[{i}] {} vs {}",
                y[i],
                want[i]
            );
        }
    }

    #[test]
    fn backward_matches_finite_differences() {
        let (r, c) = (3, 5);
        let mut rng = Rng::new(6);
        let (x, w, b, dy) = (rng.vec(r * c), rng.vec(c), rng.vec(c), rng.vec(r * c));
        let loss = |x: &[f64], w: &[f64], b: &[f64]| {
            let (mut y, mut m, mut s) = (vec![0.0; r * c], vec![0.0; r], vec![0.0; r]);
            layernorm_forward(&mut y, &mut m, &mut s, x, w, b, 1e-5);
            dot(&y, &dy)
        };
        let (mut y, mut m, mut s) = (vec![0.0; r * c], vec![0.0; r], vec![0.0; r]);
        layernorm_forward(&mut y, &mut m, &mut s, &x, &w, &b, 1e-5);
        let (mut dx, mut dw, mut db) = (vec![0.0; r * c], vec![0.0; c], vec![0.0; c]);
        layernorm_backward(&mut dx, &mut dw, &mut db, &dy, &x, &w, &m, &s);
        assert_close(&dx, &fd_grad(&x, FD_STEP, |x| loss(x, &w, &b)), FD_TOL, "dx");
        assert_close(&dw, &fd_grad(&w, FD_STEP, |w| loss(&x, w, &b)), FD_TOL, "dw");
        assert_close(&db, &fd_grad(&b, FD_STEP, |b| loss(&x, &w, b)), FD_TOL, "db");
    }
}
