//! The fused linear layer: y = [gelu](x·op(w) + bias), the forward of `Op::Linear`.
//!
//! Defined as the composition of the reference matmul, bias add and GELU (so the fused graph
//! computes exactly what the unfused one does); its backward needs no op of its own — autodiff
//! writes GELU's backward from the saved pre-activation, then the matmul's two products and
//! the bias's row sum. Reference: `torch.nn.functional.linear` + `gelu`; cuBLASLt's
//! `CUBLASLT_EPILOGUE_GELU_AUX_BIAS` (the epilogue that also stores the pre-activation).

use super::def::{EvalArgs, GradCtx, Grads, OpDef, Reference};
use super::gelu::{gelu_forward, GeluApprox};
use super::matmul::{matmul_forward, matmul_grads, MatMulDims};
use super::OpError;
use super::Real;
use crate::graph::builder::shape_err;
use crate::graph::GraphError;
use crate::graph::{ElemType, Graph, Op, TensorId};
use crate::plan::Req;

/// (x (…, K), w (N, K) when `tb` else (K, N), bias (N)) → y (…, N) = [gelu](x·op(w) + bias);
/// with `gelu` a second output pre (…, N) = x·op(w) + bias, saved for the backward (not
/// differentiable). `nn.Linear` (+ activation) as one GEMM with a bias/GELU epilogue
/// (cuBLASLt's `CUBLASLT_EPILOGUE_GELU_AUX_BIAS`, ORT's `FusedMatMul` + `BiasGelu`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Linear {
    pub tb: bool,
    pub gelu: Option<GeluApprox>,
}

impl Reference for Linear {
    fn eval<T: Real>(&self, a: &EvalArgs<'_, T>, outs: &mut [Vec<T>]) -> Result<(), OpError> {
        let k = a.last(0);
        let (y, pre) = match outs {
            [y] => (y, &mut Vec::new()),
            [y, pre] => (y, pre),
            _ => unreachable!("linear has 1 or 2 outputs"),
        };
        linear_forward(y, pre, a.f(0), a.f(1), a.f(2), k, self.tb, self.gelu);
        Ok(())
    }
}

impl OpDef for Linear {
    fn name(&self) -> &'static str {
        "linear"
    }

    // (y [, pre]): the pre-activation is saved for the backward.
    fn differentiable_outputs(&self, _outputs: usize) -> usize {
        1
    }

    fn attrs(&self) -> String {
        match self.gelu {
            Some(a) => format!("tb={} gelu={}", self.tb, a.name()),
            None => format!("tb={}", self.tb),
        }
    }

    fn read_req(&self, slot: usize) -> Req {
        // x and w are GEMM operands; the bias is dense.
        if slot < 2 {
            Req::Matrix
        } else {
            Req::Contig
        }
    }

    fn grad(&self, cx: &mut GradCtx<'_>) -> Result<Grads, GraphError> {
        // GELU's backward from the saved pre-activation, then what MatMul and BiasAdd would
        // emit: the same backward nodes as the unfused graph.
        let (ins, outs, dy) = (cx.ins(), cx.outs(), cx.gy()?);
        let dpre = match self.gelu {
            Some(approx) => cx.g.gelu_backward(outs[1], dy, approx)?,
            None => dy,
        };
        let n = cx.shape(ins[2]);
        let dbias = cx.need[2].then(|| cx.g.reduce_sum_leading(dpre, &n)).transpose()?;
        let mut d = matmul_grads(cx.g, ins[0], ins[1], dpre, false, self.tb, cx.need)?;
        d.push(dbias);
        Ok(d)
    }
}

/// `pre = x·op(w) + bias`, `y = gelu(pre)` (or `y = pre` without GELU, where `pre` is unused
/// and may be empty).
// y: (R, N)
// pre: (R, N), or empty without gelu
// x: (R, K)
// w: (N, K) when tb, else (K, N)
// bias: (N)
#[allow(clippy::too_many_arguments, reason = "the op's operands and dimensions")]
pub fn linear_forward<T: Real>(
    y: &mut [T],
    pre: &mut [T],
    x: &[T],
    w: &[T],
    bias: &[T],
    k: usize,
    tb: bool,
    gelu: Option<GeluApprox>,
) {
    let n = bias.len();
    let rows = x.len() / k.max(1);
    let dims = MatMulDims { batch: 1, m: rows, n, k, ta: false, tb, b_batched: false };
    let target: &mut [T] = if gelu.is_some() { pre } else { y };
    matmul_forward(target, x, w, &dims);
    for row in target.chunks_exact_mut(n) {
        for (v, &b) in row.iter_mut().zip(bias) {
            *v += b;
        }
    }
    if let Some(approx) = gelu {
        gelu_forward(y, pre, approx);
    }
}

/// The op's graph constructors: operand checks and the output shape rule.
impl Graph {
    // ---------------------------------------------------------------- fused ops (passes)

    /// [`Op::Linear`]: [gelu](x·op(w) + bias) with w a shared 2-D weight, (N, K) when `tb`
    /// else (K, N). Returns y; with `gelu` the node also outputs the pre-activation.
    // x: (…, K), bias: (N) -> (…, N)
    pub fn fused_linear(
        &mut self,
        x: TensorId,
        w: TensorId,
        bias: TensorId,
        tb: bool,
        gelu: Option<GeluApprox>,
    ) -> Result<TensorId, GraphError> {
        let op = "linear";
        let (sx, dt) = self.float_arg(op, "x", x)?;
        let (sw, _) = self.float_arg(op, "w", w)?;
        let (sb, _) = self.float_arg(op, "bias", bias)?;
        let named: &[(&str, &[usize])] = &[("x", &sx), ("w", &sw), ("bias", &sb)];
        if sx.len() < 2 || sw.len() != 2 {
            return Err(shape_err(op, "x must be at least 2-D and w 2-D", named));
        }
        let (k, n) = if tb { (sw[1], sw[0]) } else { (sw[0], sw[1]) };
        if sx[sx.len() - 1] != k || sb != [n] {
            return Err(shape_err(
                op,
                format!("need x (…, {k}) and bias ({n}) for w (tb={tb})"),
                named,
            ));
        }
        let mut out = sx.clone();
        *out.last_mut().expect("checked >= 2-D") = n;
        let f = ElemType::Float(dt);
        let outs = match gelu {
            Some(_) => vec![(out.clone(), f), (out, f)],
            None => vec![(out, f)],
        };
        Ok(self.push(Op::Linear(Linear { tb, gelu }), vec![x, w, bias], outs)[0])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::add::add_forward;
    use crate::ops::testutil::Rng;

    /// The fused forward is bit-for-bit the unfused chain (same ops, same order).
    #[test]
    fn equals_matmul_then_bias_then_gelu() {
        let mut rng = Rng::new(5);
        let (rows, k, n) = (7, 5, 6);
        for tb in [false, true] {
            for gelu in [None, Some(GeluApprox::Erf), Some(GeluApprox::Tanh)] {
                let (x, w, b) = (rng.vec(rows * k), rng.vec(k * n), rng.vec(n));
                let (mut y, mut pre) = (vec![0.0; rows * n], vec![0.0; rows * n]);
                linear_forward(&mut y, &mut pre, &x, &w, &b, k, tb, gelu);
                let mut mm = vec![0.0; rows * n];
                let dims = MatMulDims { batch: 1, m: rows, n, k, ta: false, tb, b_batched: false };
                matmul_forward(&mut mm, &x, &w, &dims);
                let mut want = vec![0.0; rows * n];
                add_forward(&mut want, &mm, &b);
                if let Some(a) = gelu {
                    assert_eq!(pre, want);
                    let mut act = vec![0.0; rows * n];
                    gelu_forward(&mut act, &want, a);
                    want = act;
                }
                assert_eq!(y, want, "tb={tb} gelu={gelu:?}");
            }
        }
    }
}
