//! RMSNorm over the last dim, with a weight and no bias or mean subtraction.
//!
//! Mirrors HF's `LlamaRMSNorm` (also Mistral's, Qwen2's and Qwen3's): the row is taken to f32,
//! rstd = 1/√(mean(x²) + eps) (eps inside the square root, as `torch.rsqrt(variance + eps)`),
//! y = w·(x·rstd). The forward also returns each row's rstd so the backward does not recompute
//! it, as [`super::layernorm`] returns its mean and rstd. Kernels: `backend/cpu/kernels/rmsnorm.rs`
//! (CPU), `engine/kernels/rmsnorm.cu` with its launchers in `exec/gpu/launch/rmsnorm.rs` (GPU).

use super::def::{EvalArgs, GradCtx, Grads, OpDef, Reference};
use super::OpError;
use super::Real;
use crate::graph::builder::shape_err;
use crate::graph::GraphError;
use crate::graph::{ElemType, Graph, Op, TensorId};
use crate::DType;

/// (x (…, C), w (C)) → (y (…, C), rstd (…)); HF `LlamaRMSNorm` computed in f32:
/// rstd = 1/√(mean(x²) + eps), y = w·(x·rstd). rstd is saved for the backward and is not
/// differentiable.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RmsNorm {
    pub eps: f32,
}

impl Reference for RmsNorm {
    fn eval<T: Real>(&self, a: &EvalArgs<'_, T>, outs: &mut [Vec<T>]) -> Result<(), OpError> {
        let [y, rstd] = outs else { unreachable!("rms_norm has 2 outputs") };
        rmsnorm_forward(y, rstd, a.f(0), a.f(1), a.t(self.eps));
        Ok(())
    }
}

impl OpDef for RmsNorm {
    fn name(&self) -> &'static str {
        "rms_norm"
    }

    // (y, rstd): rstd is saved for the backward.
    fn differentiable_outputs(&self, _outputs: usize) -> usize {
        1
    }

    fn attrs(&self) -> String {
        format!("eps={:e}", self.eps)
    }

    fn grad(&self, cx: &mut GradCtx<'_>) -> Result<Grads, GraphError> {
        let (ins, outs, dy) = (cx.ins(), cx.outs(), cx.gy()?);
        let d = cx.g.rms_norm_backward(dy, ins[0], ins[1], outs[1])?;
        Ok(d.into_iter().map(Some).collect())
    }
}

/// (a (…, C), b (…, C), w (C)) → (sum (…, C) = a + b, y (…, C) = RmsNorm(sum), rstd (…));
/// sum and y are differentiable, rstd is the saved statistic. The residual add + RMSNorm of
/// every Llama block in one pass over the rows (ORT's `SkipSimplifiedLayerNormalization`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AddRmsNorm {
    pub eps: f32,
}

impl Reference for AddRmsNorm {
    fn eval<T: Real>(&self, a: &EvalArgs<'_, T>, outs: &mut [Vec<T>]) -> Result<(), OpError> {
        let [sum, y, rstd] = outs else { unreachable!("add_rms_norm has 3 outputs") };
        add_rmsnorm_forward(sum, y, rstd, a.f(0), a.f(1), a.f(2), a.t(self.eps));
        Ok(())
    }
}

impl OpDef for AddRmsNorm {
    fn name(&self) -> &'static str {
        "add_rms_norm"
    }

    // (sum, y, rstd): rstd is saved for the backward.
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
        // RMSNorm's backward on the saved sum, plus the gradient reaching the sum from its other
        // uses (the residual stream); both addends get that total.
        let (ins, outs) = (cx.ins(), cx.outs());
        let (mut dsum, mut dw) = (cx.gout[0], None);
        if let Some(dy) = cx.gout[1] {
            let d = cx.g.rms_norm_backward(dy, outs[0], ins[2], outs[2])?;
            dsum = Some(match dsum {
                Some(other) => cx.g.add(other, d[0])?,
                None => d[0],
            });
            dw = Some(d[1]);
        }
        Ok(vec![dsum, dsum, dw])
    }
}

/// (dy, x, w, rstd) → (dx, dw)
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RmsNormBackward;

impl Reference for RmsNormBackward {
    fn eval<T: Real>(&self, a: &EvalArgs<'_, T>, outs: &mut [Vec<T>]) -> Result<(), OpError> {
        let [dx, dw] = outs else { unreachable!("rms_norm_backward has 2 outputs") };
        rmsnorm_backward(dx, dw, a.f(0), a.f(1), a.f(2), a.f(3));
        Ok(())
    }
}

impl OpDef for RmsNormBackward {
    fn name(&self) -> &'static str {
        "rms_norm_backward"
    }
}

/// y = w·(x·rstd), rstd = 1/√(mean(x²) + eps) per row.
// y: (R, C)
// rstd: (R)
// x: (R, C)
// w: (C)
pub fn rmsnorm_forward<T: Real>(y: &mut [T], rstd: &mut [T], x: &[T], w: &[T], eps: T) {
    let c = w.len();
    let inv_c = T::ONE / T::from_f64(c as f64);
    for (r, (xr, yr)) in x.chunks_exact(c).zip(y.chunks_exact_mut(c)).enumerate() {
        let mut ms = T::ZERO;
        for &v in xr {
            ms += v * v;
        }
        ms *= inv_c;
        let s = T::ONE / (ms + eps).sqrt();
        for i in 0..c {
            yr[i] = w[i] * (xr[i] * s);
        }
        rstd[r] = s;
    }
}

/// The residual add + RMSNorm of `Op::AddRmsNorm`: sum = a + b, then [`rmsnorm_forward`] of
/// sum (its backward is RMSNorm's, the residual gradient passing through the add unchanged).
// sum, y: (R, C)
// rstd: (R)
// a, b: (R, C)
// w: (C)
pub fn add_rmsnorm_forward<T: Real>(
    sum: &mut [T],
    y: &mut [T],
    rstd: &mut [T],
    a: &[T],
    b: &[T],
    w: &[T],
    eps: T,
) {
    for ((s, &x), &r) in sum.iter_mut().zip(a).zip(b) {
        *s = x + r;
    }
    rmsnorm_forward(y, rstd, sum, w, eps);
}

/// With x̂ = x·rstd and g = w·dy: dx = rstd·(g − x̂·mean(g·x̂)); dw = Σ_rows dy·x̂. (The mean
/// term is the derivative of rstd: ∂rstd/∂x_i = −rstd³·x_i/C.)
// dx: (R, C)
// dw: (C)
// dy, x: (R, C)
// w: (C)
// rstd: (R)
pub fn rmsnorm_backward<T: Real>(
    dx: &mut [T],
    dw: &mut [T],
    dy: &[T],
    x: &[T],
    w: &[T],
    rstd: &[T],
) {
    let c = w.len();
    let inv_c = T::ONE / T::from_f64(c as f64);
    dw.fill(T::ZERO);
    for (r, &s) in rstd.iter().enumerate() {
        let (xr, dyr) = (&x[r * c..(r + 1) * c], &dy[r * c..(r + 1) * c]);
        let mut gx = T::ZERO;
        for i in 0..c {
            let xh = xr[i] * s;
            gx += w[i] * dyr[i] * xh;
            dw[i] += dyr[i] * xh;
        }
        gx *= inv_c;
        for i in 0..c {
            let xh = xr[i] * s;
            dx[r * c + i] = s * (w[i] * dyr[i] - xh * gx);
        }
    }
}

/// The op's graph constructors: operand checks and the output shape rule.
impl Graph {
    /// HF `LlamaRMSNorm` over the last dim: y = w·(x·rstd), rstd = 1/√(mean(x²) + eps), computed
    /// in f32; w of shape (C). Returns y; the node also outputs the row rstd (f32, kept for the
    /// backward).
    // x: (…, C), w: (C) -> y (…, C), rstd (…)
    pub fn rms_norm(&mut self, x: TensorId, w: TensorId, eps: f32) -> Result<TensorId, GraphError> {
        let op = "rms_norm";
        let (sx, dt) = self.float_arg(op, "x", x)?;
        let (sw, _) = self.float_arg(op, "weight", w)?;
        if sx.is_empty() || sw != [sx[sx.len() - 1]] {
            return Err(shape_err(
                op,
                "weight must be 1-D with the size of x's last dim",
                &[("x", &sx), ("weight", &sw)],
            ));
        }
        if !(eps >= 0.0 && eps.is_finite()) {
            return Err(GraphError::Attr {
                op,
                msg: format!("eps must be finite and >= 0, got {eps}"),
            });
        }
        let rows = sx[..sx.len() - 1].to_vec();
        let outs = vec![(sx, ElemType::Float(dt)), (rows, ElemType::Float(DType::F32))];
        Ok(self.push(Op::RmsNorm(RmsNorm { eps }), vec![x, w], outs)[0])
    }

    /// [`Op::AddRmsNorm`]: (sum = a + b, RmsNorm(sum)) over the last dim; a and b of the same
    /// shape. Returns (sum, y); the node also outputs the row rstd.
    // a, b: (…, C); w: (C) -> (…, C), (…, C)
    pub fn add_rms_norm(
        &mut self,
        a: TensorId,
        b: TensorId,
        w: TensorId,
        eps: f32,
    ) -> Result<(TensorId, TensorId), GraphError> {
        let op = "add_rms_norm";
        let (sa, dt) = self.float_arg(op, "a", a)?;
        let (sb, _) = self.float_arg(op, "b", b)?;
        let (sw, _) = self.float_arg(op, "weight", w)?;
        if sa != sb || sa.is_empty() || sw != [sa[sa.len() - 1]] {
            return Err(shape_err(
                op,
                "a and b must have the same shape, weight the size of its last dim",
                &[("a", &sa), ("b", &sb), ("weight", &sw)],
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
        let outs = vec![(sa.clone(), f), (sa, f), (rows, stats)];
        let o = self.push(Op::AddRmsNorm(AddRmsNorm { eps }), vec![a, b, w], outs);
        Ok((o[0], o[1]))
    }

    /// (dy, x, w, rstd) → [dx, dw]
    pub(crate) fn rms_norm_backward(
        &mut self,
        dy: TensorId,
        x: TensorId,
        w: TensorId,
        rstd: TensorId,
    ) -> Result<Vec<TensorId>, GraphError> {
        let op = "rms_norm_backward";
        let (sd, dt) = self.float_arg(op, "dy", dy)?;
        let (sx, _) = self.float_arg(op, "x", x)?;
        let (sw, _) = self.float_arg(op, "weight", w)?;
        let (sr, _) = self.float_arg(op, "rstd", rstd)?;
        if sd != sx || sx.is_empty() || sw != [sx[sx.len() - 1]] || sr[..] != sx[..sx.len() - 1] {
            let named: &[(&str, &[usize])] =
                &[("dy", &sd), ("x", &sx), ("weight", &sw), ("rstd", &sr)];
            return Err(shape_err(op, "inconsistent operands", named));
        }
        let f = ElemType::Float(dt);
        Ok(self.push(Op::RmsNormBackward, vec![dy, x, w, rstd], vec![(sx, f), (sw, f)]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testutil::*;

    /// HF `LlamaRMSNorm(4, eps=1e-6)` with weight [1.1, 0.9, -0.5, 2.0] on two rows, computed
    /// by hand in f64 from its definition (x·rsqrt(mean(x²) + eps)·w): agreement to 1e-12.
    #[test]
    fn matches_the_definition() {
        let x = [0.3f64, -1.2, 2.0, 0.7, 1.5, 0.1, -0.4, -2.2];
        let w = [1.1f64, 0.9, -0.5, 2.0];
        let (mut y, mut s) = ([0.0f64; 8], [0.0f64; 2]);
        rmsnorm_forward(&mut y, &mut s, &x, &w, 1e-6);
        for r in 0..2 {
            let ms: f64 = x[r * 4..r * 4 + 4].iter().map(|v| v * v).sum::<f64>() / 4.0;
            let want_s = 1.0 / (ms + 1e-6).sqrt();
            assert!((s[r] - want_s).abs() < 1e-12);
            for i in 0..4 {
                assert!((y[r * 4 + i] - w[i] * x[r * 4 + i] * want_s).abs() < 1e-12);
            }
        }
    }

    /// dx and dw of Σ y·dy against central finite differences (f64, FD_TOL) at C = 7.
    #[test]
    fn backward_matches_finite_differences() {
        let (r, c) = (3, 7);
        let mut rng = Rng::new(61);
        let (x, w, dy) = (rng.vec(r * c), rng.vec(c), rng.vec(r * c));
        let loss = |x: &[f64], w: &[f64]| {
            let (mut y, mut s) = (vec![0.0; r * c], vec![0.0; r]);
            rmsnorm_forward(&mut y, &mut s, x, w, 1e-5);
            dot(&y, &dy)
        };
        let (mut y, mut s) = (vec![0.0; r * c], vec![0.0; r]);
        rmsnorm_forward(&mut y, &mut s, &x, &w, 1e-5);
        let (mut dx, mut dw) = (vec![0.0; r * c], vec![0.0; c]);
        rmsnorm_backward(&mut dx, &mut dw, &dy, &x, &w, &s);
        assert_close(&dx, &fd_grad(&x, FD_STEP, |x| loss(x, &w)), FD_TOL, "dx");
        assert_close(&dw, &fd_grad(&w, FD_STEP, |w| loss(&x, w)), FD_TOL, "dw");
    }
}
