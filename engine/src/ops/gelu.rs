//! GELU, exact (erf) and tanh-approximated.
//!
//! Mirrors `torch.nn.functional.gelu(x, approximate='none' | 'tanh')` — the forward and the
//! backward formulas of ATen's `GeluKernel.cpp` — and llm.c's `gelu_forward` / `gelu_backward`
//! (tanh form, as GPT-2's `gelu_new`). BERT uses the erf form.

use super::def::{EvalArgs, GradCtx, Grads, OpDef, Reference};
use super::OpError;
use super::Real;
use crate::exec::gpu::kernel::{GpuKernel, NodeCx};
use crate::exec::gpu::launch::elementwise::GeluForward;
use crate::exec::gpu::{Call, Resolver};
use crate::graph::GraphError;
use crate::graph::{Graph, Op, TensorId};
use crate::plan::PlanError;

/// (x) → gelu(x)
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gelu {
    pub approx: GeluApprox,
}

impl Reference for Gelu {
    fn eval<T: Real>(&self, a: &EvalArgs<'_, T>, outs: &mut [Vec<T>]) -> Result<(), OpError> {
        gelu_forward(&mut outs[0], a.f(0), self.approx);
        Ok(())
    }
}

impl OpDef for Gelu {
    fn name(&self) -> &'static str {
        "gelu"
    }

    fn attrs(&self) -> String {
        format!("approx={}", self.approx.name())
    }

    fn inplace_inputs(&self) -> &'static [usize] {
        &[0]
    }

    fn grad(&self, cx: &mut GradCtx<'_>) -> Result<Grads, GraphError> {
        let (ins, dy) = (cx.ins(), cx.gy()?);
        Ok(vec![Some(cx.g.gelu_backward(ins[0], dy, self.approx)?)])
    }
}

impl GpuKernel for Gelu {
    // A GELU the passes left outside a linear layer (Gemma's GeGLU gate has no bias):
    // `gelu_forward_<T>` (elementwise.cu), y = gelu(x), y may be x.
    fn launches(&self, r: &mut Resolver<'_>, cx: &NodeCx<'_>) -> Result<Vec<Call>, PlanError> {
        let (ins, outs) = (&cx.node.inputs, &cx.node.outputs);
        cx.same(&[outs[0], ins[0]])?;
        let y = if cx.inplace.is_some() { cx.inp(0) } else { cx.out(0) };
        let (dtype, n, approx) = (cx.dt(outs[0]), cx.n(outs[0]), self.approx);
        let l = GeluForward { dtype, y, x: cx.inp(0), n, approx };
        Ok(vec![l.launch(r.device()).into()])
    }
}

/// (x, dy) → dx
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GeluBackward {
    pub approx: GeluApprox,
}

impl Reference for GeluBackward {
    fn eval<T: Real>(&self, a: &EvalArgs<'_, T>, outs: &mut [Vec<T>]) -> Result<(), OpError> {
        gelu_backward(&mut outs[0], a.f(0), a.f(1), self.approx);
        Ok(())
    }
}

impl OpDef for GeluBackward {
    fn name(&self) -> &'static str {
        "gelu_backward"
    }

    fn attrs(&self) -> String {
        format!("approx={}", self.approx.name())
    }

    // Over dy.
    fn inplace_inputs(&self) -> &'static [usize] {
        &[1]
    }
}

/// Which GELU: `Erf` is BERT's `gelu`, `Tanh` is GPT-2's `gelu_new`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GeluApprox {
    Erf,
    Tanh,
}

impl GeluApprox {
    pub fn name(self) -> &'static str {
        match self {
            GeluApprox::Erf => "erf",
            GeluApprox::Tanh => "tanh",
        }
    }
}

const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4; // √(2/π)
const KAPPA: f64 = 0.044715;
const INV_SQRT_2PI: f64 = 0.398_942_280_401_432_7; // 1/√(2π)

/// out = 0.5·x·(1 + erf(x/√2)), or 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
// out, x: (N)
pub fn gelu_forward<T: Real>(out: &mut [T], x: &[T], approx: GeluApprox) {
    let half = T::from_f64(0.5);
    for (o, &v) in out.iter_mut().zip(x) {
        *o = half * v * (T::ONE + cdf_core(v, approx));
    }
}

/// dx = dout · gelu'(x)
// dx, x, dout: (N)
pub fn gelu_backward<T: Real>(dx: &mut [T], x: &[T], dout: &[T], approx: GeluApprox) {
    let half = T::from_f64(0.5);
    for ((d, &v), &g) in dx.iter_mut().zip(x).zip(dout) {
        let local = match approx {
            // Φ(x) + x·φ(x)
            GeluApprox::Erf => {
                let cdf = half * (T::ONE + cdf_core(v, approx));
                let pdf = T::from_f64(INV_SQRT_2PI) * (-half * v * v).exp();
                cdf + v * pdf
            }
            // d/dx of 0.5·x·(1 + tanh(u)), u = √(2/π)·(x + κx³)
            GeluApprox::Tanh => {
                let t = cdf_core(v, approx);
                let du = T::from_f64(SQRT_2_OVER_PI) * (T::ONE + T::from_f64(3.0 * KAPPA) * v * v);
                half * (T::ONE + t) + half * v * (T::ONE - t * t) * du
            }
        };
        *d = g * local;
    }
}

/// erf(x/√2) or tanh(√(2/π)·(x + κx³)): the term that makes 2Φ(x) - 1.
fn cdf_core<T: Real>(x: T, approx: GeluApprox) -> T {
    match approx {
        GeluApprox::Erf => (x * T::from_f64(std::f64::consts::FRAC_1_SQRT_2)).erf(),
        GeluApprox::Tanh => {
            (T::from_f64(SQRT_2_OVER_PI) * (x + T::from_f64(KAPPA) * x * x * x)).tanh()
        }
    }
}

/// The op's graph constructors: operand checks and the output shape rule.
impl Graph {
    pub fn gelu(&mut self, x: TensorId, approx: GeluApprox) -> Result<TensorId, GraphError> {
        self.unary("gelu", Op::Gelu(Gelu { approx }), x)
    }

    pub(crate) fn gelu_backward(
        &mut self,
        x: TensorId,
        dy: TensorId,
        approx: GeluApprox,
    ) -> Result<TensorId, GraphError> {
        self.binary_same(
            "gelu_backward",
            Op::GeluBackward(GeluBackward { approx }),
            [("x", x), ("dy", dy)],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testutil::*;

    const X: [f32; 6] = [-3.0, -1.0, -0.25, 0.5, 1.0, 2.5];

    /// Outputs and x-gradients of `F.gelu(x, approximate=…)` in torch 2.11 f32 on X.
    const TORCH: [(GeluApprox, [f32; 6], [f32; 6]); 2] = [
        (
            GeluApprox::Erf,
            [-0.004050225, -0.15865526, -0.10032342, 0.34573123, 0.8413447, 2.484476],
            [-0.011945605, -0.08331543, 0.3046267, 0.86749506, 1.0833154, 1.037611],
        ),
        (
            GeluApprox::Tanh,
            [-0.003637433, -0.158808, -0.100324646, 0.345714, 0.841192, 2.4849157],
            [-0.011584297, -0.08296409, 0.3046459, 0.8673699, 1.0829641, 1.0379517],
        ),
    ];

    #[test]
    fn matches_pytorch_f32() {
        for (approx, y_ref, g_ref) in TORCH {
            let mut y = [0.0f32; 6];
            gelu_forward(&mut y, &X, approx);
            let mut g = [0.0f32; 6];
            gelu_backward(&mut g, &X, &[1.0; 6], approx);
            // f32 parity to 1e-6 absolute. Not to the ulp: for x ≪ 0, 1 + erf(x/√2) cancels and
            // torch's vectorised f32 erf is ~1e-7 off there (at x = -3 torch gives -0.004050225,
            // the exact value is -0.0040496941, libm's erff gives -0.0040496886).
            for i in 0..6 {
                assert!(
                    (y[i] - y_ref[i]).abs() <= 1e-6,
                    "{approx:?} y[{i}] {} vs {}",
                    y[i],
                    y_ref[i]
                );
                assert!(
                    (g[i] - g_ref[i]).abs() <= 1e-6,
                    "{approx:?} g[{i}] {} vs {}",
                    g[i],
                    g_ref[i]
                );
            }
            // …and to the exact (f64) value within f32 rounding.
            let mut y64 = [0.0f64; 6];
            gelu_forward(&mut y64, &X.map(|v| v as f64), approx);
            for i in 0..6 {
                assert!(
                    (y[i] as f64 - y64[i]).abs() <= 2e-7 * (1.0 + y64[i].abs()),
                    "{approx:?} y[{i}] vs f64"
                );
            }
        }
    }

    #[test]
    fn backward_matches_finite_differences() {
        let mut rng = Rng::new(4);
        let x: Vec<f64> = rng.vec(32).iter().map(|v| 3.0 * v).collect();
        let dy = rng.vec(32);
        for approx in [GeluApprox::Erf, GeluApprox::Tanh] {
            let mut dx = vec![0.0; 32];
            gelu_backward(&mut dx, &x, &dy, approx);
            let fd = fd_grad(&x, FD_STEP, |x| {
                let mut y = vec![0.0; 32];
                gelu_forward(&mut y, x, approx);
                dot(&y, &dy)
            });
            assert_close(&dx, &fd, FD_TOL, approx.name());
        }
    }
}
