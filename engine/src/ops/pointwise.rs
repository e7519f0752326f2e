//! Pointwise functions: the op families `Op::Unary` (y = f(x)), `Op::UnaryBackward`
//! (dx = dy·f'(x)) and `Op::Binary` (out = f(a, b), b broadcast over a's leading dims).
//!
//! A function is defined here once: its name (which names its kernels), its formula and
//! derivative (the reference every kernel is tested against) and, for a binary function, its
//! gradient rule. The backends supply its kernels — `backend/cpu/kernels/pointwise.rs` (the
//! formula as a `Map1`/`Map2`) and `engine/kernels/pointwise.cu` (the formula as a device
//! function and its kernels' instantiation) — while everything else (the op's layouts and
//! in-place inputs, autodiff, the executors' dispatch, the typed GPU launchers) is written
//! once for the whole family. Adding a function is a variant here, its CPU formula, its `.cu`
//! formula, and its tests.
//!
//! Reference: PyTorch's pointwise ops (`torch.nn.functional.silu`, `torch.mul`) and their
//! derivatives (`tools/autograd/derivatives.yaml`).

use super::def::{EvalArgs, GradCtx, Grads, OpDef, Reference};
use super::OpError;
use super::Real;
use crate::graph::builder::shape_err;
use crate::graph::{ElemType, Op};
use crate::graph::{Graph, GraphError, TensorId};

/// (x) → f(x), a pointwise function of `ops::pointwise` (SiLU, …).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Unary {
    pub f: UnaryFn,
}

impl Reference for Unary {
    fn eval<T: Real>(&self, a: &EvalArgs<'_, T>, outs: &mut [Vec<T>]) -> Result<(), OpError> {
        unary_forward(self.f, &mut outs[0], a.f(0));
        Ok(())
    }
}

impl OpDef for Unary {
    fn name(&self) -> &'static str {
        self.f.name()
    }

    fn inplace_inputs(&self) -> &'static [usize] {
        &[0]
    }

    fn grad(&self, cx: &mut GradCtx<'_>) -> Result<Grads, GraphError> {
        let (ins, dy) = (cx.ins(), cx.gy()?);
        Ok(vec![Some(cx.g.apply_backward(self.f, ins[0], dy)?)])
    }
}

/// (a, b) → f(a, b), b's shape a suffix of a's (broadcast over a's leading dims): a
/// pointwise function of `ops::pointwise` (multiply, …).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Binary {
    pub f: BinaryFn,
}

impl Reference for Binary {
    fn eval<T: Real>(&self, a: &EvalArgs<'_, T>, outs: &mut [Vec<T>]) -> Result<(), OpError> {
        binary_forward(self.f, &mut outs[0], a.f(0), a.f(1));
        Ok(())
    }
}

impl OpDef for Binary {
    fn name(&self) -> &'static str {
        self.f.name()
    }

    fn inplace_inputs(&self) -> &'static [usize] {
        &[0, 1]
    }

    fn grad(&self, cx: &mut GradCtx<'_>) -> Result<Grads, GraphError> {
        // The function's own rule, broadcast included.
        let (ins, dy) = (cx.ins(), cx.gy()?);
        let [da, db] = self.f.gradient(cx.g, ins[0], ins[1], dy, [cx.need[0], cx.need[1]])?;
        Ok(vec![da, db])
    }
}

/// (x, dy) → dx = dy·f'(x), from the forward input.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UnaryBackward {
    pub f: UnaryFn,
}

impl Reference for UnaryBackward {
    fn eval<T: Real>(&self, a: &EvalArgs<'_, T>, outs: &mut [Vec<T>]) -> Result<(), OpError> {
        unary_backward(self.f, &mut outs[0], a.f(0), a.f(1));
        Ok(())
    }
}

impl OpDef for UnaryBackward {
    fn name(&self) -> &'static str {
        self.f.backward_name()
    }

    // Over dy.
    fn inplace_inputs(&self) -> &'static [usize] {
        &[1]
    }
}

/// A unary pointwise function y = f(x).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnaryFn {
    /// SiLU (swish): x·σ(x), σ the logistic sigmoid — Llama's, Mistral's and Qwen's MLP
    /// activation (`torch.nn.functional.silu`).
    Silu,
    /// ReLU: max(x, 0) — DistilBERT's pre-classifier activation (`torch.nn.ReLU`).
    Relu,
}

impl UnaryFn {
    /// Every function, for the tests that cover each one.
    pub const ALL: &'static [UnaryFn] = &[UnaryFn::Silu, UnaryFn::Relu];

    /// The op's name and its kernels' stem (`<name>_forward_<T>`, `<name>_backward_<T>`).
    pub fn name(self) -> &'static str {
        match self {
            UnaryFn::Silu => "silu",
            UnaryFn::Relu => "relu",
        }
    }

    /// The backward op's name.
    pub fn backward_name(self) -> &'static str {
        match self {
            UnaryFn::Silu => "silu_backward",
            UnaryFn::Relu => "relu_backward",
        }
    }

    /// f(x).
    pub fn f<T: Real>(self, x: T) -> T {
        match self {
            UnaryFn::Silu => x * sigmoid(x),
            // NaN stays NaN (torch.relu propagates it).
            UnaryFn::Relu => {
                if x < T::ZERO {
                    T::ZERO
                } else {
                    x
                }
            }
        }
    }

    /// f'(x): the backward is dx = dy·f'(x), from the forward's input.
    pub fn df<T: Real>(self, x: T) -> T {
        match self {
            // d/dx x·σ(x) = σ(x)·(1 + x·(1 − σ(x))), ATen's `silu_backward`.
            UnaryFn::Silu => {
                let s = sigmoid(x);
                s * (T::ONE + x * (T::ONE - s))
            }
            // ATen's `threshold_backward(dy, x, 0)`: dy where x > 0, else 0 (0 at x = 0).
            UnaryFn::Relu => {
                if x > T::ZERO {
                    T::ONE
                } else {
                    T::ZERO
                }
            }
        }
    }
}

/// σ(x) = 1/(1 + e^−x): for x → −∞ e^−x overflows to inf and σ to 0, as it should.
fn sigmoid<T: Real>(x: T) -> T {
    T::ONE / (T::ONE + (-x).exp())
}

/// A binary pointwise function out = f(a, b), b of a's shape or a trailing part of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinaryFn {
    /// a·b (`torch.mul`): the gate of a SwiGLU MLP, RMSNorm's weight, rotary's cos/sin.
    Mul,
}

impl BinaryFn {
    /// Every function, for the tests that cover each one.
    pub const ALL: &'static [BinaryFn] = &[BinaryFn::Mul];

    /// The op's name and its kernel's stem (`<name>_<T>`).
    pub fn name(self) -> &'static str {
        match self {
            BinaryFn::Mul => "mul",
        }
    }

    /// f(a, b).
    pub fn f<T: Real>(self, a: T, b: T) -> T {
        match self {
            BinaryFn::Mul => a * b,
        }
    }

    /// The gradient rule: (da, db) from dy as graph ops, where `need` asks. A broadcast b
    /// (a trailing part of a's shape) gets its gradient summed over a's leading dims.
    pub fn gradient(
        self,
        g: &mut Graph,
        a: TensorId,
        b: TensorId,
        dy: TensorId,
        need: [bool; 2],
    ) -> Result<[Option<TensorId>; 2], GraphError> {
        match self {
            // da = dy·b (b broadcast as in the forward); db = Σ_leading dy·a.
            BinaryFn::Mul => {
                let da = need[0].then(|| g.apply2(BinaryFn::Mul, dy, b)).transpose()?;
                let db = if need[1] {
                    let p = g.apply2(BinaryFn::Mul, dy, a)?;
                    let sb = g.shape(b).to_vec();
                    Some(if g.shape(a) == sb { p } else { g.reduce_sum_leading(p, &sb)? })
                } else {
                    None
                };
                Ok([da, db])
            }
        }
    }
}

/// y = f(x)
// y, x: (N)
pub fn unary_forward<T: Real>(f: UnaryFn, y: &mut [T], x: &[T]) {
    for (o, &v) in y.iter_mut().zip(x) {
        *o = f.f(v);
    }
}

/// dx = dy·f'(x)
// dx, x, dy: (N)
pub fn unary_backward<T: Real>(f: UnaryFn, dx: &mut [T], x: &[T], dy: &[T]) {
    for ((d, &v), &g) in dx.iter_mut().zip(x).zip(dy) {
        *d = g * f.df(v);
    }
}

/// out = f(a, b[i mod nb]): b broadcast over a's leading dims.
// out, a: (N); b: (nb), nb divides N
pub fn binary_forward<T: Real>(f: BinaryFn, out: &mut [T], a: &[T], b: &[T]) {
    let nb = b.len();
    for (i, (o, &v)) in out.iter_mut().zip(a).enumerate() {
        *o = f.f(v, b[i % nb]);
    }
}

/// The op's graph constructors: operand checks and the output shape rule.
impl Graph {
    /// f(x) for a pointwise function of `ops::pointwise`.
    pub fn apply(&mut self, f: UnaryFn, x: TensorId) -> Result<TensorId, GraphError> {
        self.unary(f.name(), Op::Unary(Unary { f }), x)
    }

    /// f(a, b) for a pointwise function of `ops::pointwise`; b's shape equals a's or a trailing
    /// part of it (broadcast over a's leading dims, as `add`).
    pub fn apply2(
        &mut self,
        f: BinaryFn,
        a: TensorId,
        b: TensorId,
    ) -> Result<TensorId, GraphError> {
        let op = f.name();
        let (sa, dt) = self.float_arg(op, "a", a)?;
        let (sb, _) = self.float_arg(op, "b", b)?;
        if !sa.ends_with(&sb) {
            return Err(shape_err(
                op,
                "b's shape must equal a's or a trailing part of it (broadcast over a's leading dims)",
                &[("a", &sa), ("b", &sb)],
            ));
        }
        Ok(self.push(Op::Binary(Binary { f }), vec![a, b], vec![(sa, ElemType::Float(dt))])[0])
    }

    /// dx = dy·f'(x), f's backward from the forward's input.
    pub(crate) fn apply_backward(
        &mut self,
        f: UnaryFn,
        x: TensorId,
        dy: TensorId,
    ) -> Result<TensorId, GraphError> {
        self.binary_same(
            f.backward_name(),
            Op::UnaryBackward(UnaryBackward { f }),
            [("x", x), ("dy", dy)],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testutil::*;

    #[test]
    fn unary_derivatives_match_finite_differences() {
        let mut rng = Rng::new(3);
        // Both signs, and far enough out that σ saturates.
        let x: Vec<f64> = rng.vec(40).iter().map(|v| 12.0 * v).collect();
        for &f in UnaryFn::ALL {
            for &v in &x {
                let fd = (f.f(v + FD_STEP) - f.f(v - FD_STEP)) / (2.0 * FD_STEP);
                let d = f.df(v);
                assert!((d - fd).abs() <= FD_TOL * (1.0 + fd.abs()), "{f:?}'({v}) = {d}, fd {fd}");
            }
        }
    }

    #[test]
    fn silu_matches_torch_values() {
        // torch.nn.functional.silu(torch.tensor([-20., -1., 0., 1., 3.], dtype=torch.float64))
        let want = [
            -4.122307236380407e-8,
            -0.2689414213699951,
            0.0,
            0.7310585786300049,
            2.8577223804672998,
        ];
        for (x, w) in [-20.0f64, -1.0, 0.0, 1.0, 3.0].into_iter().zip(want) {
            let y = UnaryFn::Silu.f(x);
            assert!((y - w).abs() <= 1e-6 * (1.0 + w.abs()), "silu({x}) = {y}, torch {w}");
        }
        // The far tails: no NaN from inf·0.
        assert_eq!(UnaryFn::Silu.f(-1e4f32), 0.0);
        assert_eq!(UnaryFn::Silu.df(-1e4f32), 0.0);
        assert_eq!(UnaryFn::Silu.f(1e4f32), 1e4);
    }
}
