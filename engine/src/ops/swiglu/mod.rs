//! SwiGLU, the gate of the Llama family's MLP: h = silu(gate)·up, with its backward, each one
//! pass over the elements (Liger-Kernel's `LigerSiLUMulFunction`).
//!
//! HF writes `down_proj(act_fn(gate_proj(x)) * up_proj(x))` (`LlamaMLP`, also Mistral's, Qwen2's
//! and Qwen3's); the builder writes it as `silu` then `mul`, and `passes::fuse_swiglu` turns
//! that into this op. Against the two ops: the forward stores no silu(gate), so the backward
//! saves one (…, I) tensor per layer less, and the backward recomputes σ(gate) from gate
//! instead of reading silu(gate) — the one place the fused op computes something the unfused
//! graph does not (README names it).
//!
//! The op in one place: its definition, reference, gradient rule and shape rule here, its CPU
//! kernels in [`cpu`], its GPU launchers in [`gpu`] (kernels: `engine/kernels/swiglu.cu`).
//!
//! Reference: `torch.nn.functional.silu(gate) * up` and the derivatives of `silu` and `mul`
//! (`tools/autograd/derivatives.yaml`).

pub mod cpu;
pub mod gpu;

use super::def::{EvalArgs, GradCtx, Grads, OpDef, Reference};
use super::pointwise::UnaryFn;
use super::{OpError, Real};
use crate::graph::builder::shape_err;
use crate::graph::{ElemType, Graph, GraphError, Op, TensorId};
use crate::plan::Req;

/// (gate (…, I), up (…, I)) → h (…, I) = silu(gate)·up.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SwiGlu;

/// The forward's operands.
pub mod slot {
    pub const GATE: usize = 0;
    pub const UP: usize = 1;
}

/// (dh, gate, up) → (dgate = dh·up·silu'(gate), dup = dh·silu(gate)), all (…, I).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SwiGluBackward;

/// The backward's operands.
pub mod backward_slot {
    pub const DH: usize = 0;
    pub const GATE: usize = 1;
    pub const UP: usize = 2;
}

impl Reference for SwiGlu {
    fn eval<T: Real>(&self, a: &EvalArgs<'_, T>, outs: &mut [Vec<T>]) -> Result<(), OpError> {
        swiglu_forward(&mut outs[0], a.f(slot::GATE), a.f(slot::UP));
        Ok(())
    }
}

impl OpDef for SwiGlu {
    fn name(&self) -> &'static str {
        "swiglu"
    }

    // gate, up and h: rows of I at any strides (Phi-3's halves of one gate_up projection).
    fn read_req(&self, _slot: usize) -> Req {
        Req::Rows
    }

    fn write_req(&self, _slot: usize) -> Req {
        Req::Rows
    }

    // h[i] depends on gate[i] and up[i] only.
    fn inplace_inputs(&self) -> &'static [usize] {
        &[slot::GATE, slot::UP]
    }

    fn grad(&self, cx: &mut GradCtx<'_>) -> Result<Grads, GraphError> {
        let (ins, dh) = (cx.ins(), cx.gy()?);
        let [dgate, dup] = cx.g.swiglu_backward(dh, ins[slot::GATE], ins[slot::UP])?;
        Ok(vec![cx.need[slot::GATE].then_some(dgate), cx.need[slot::UP].then_some(dup)])
    }
}

impl Reference for SwiGluBackward {
    fn eval<T: Real>(&self, a: &EvalArgs<'_, T>, outs: &mut [Vec<T>]) -> Result<(), OpError> {
        use backward_slot::{DH, GATE, UP};
        let [dgate, dup] = outs else { unreachable!("swiglu_backward has 2 outputs") };
        swiglu_backward(dgate, dup, a.f(DH), a.f(GATE), a.f(UP));
        Ok(())
    }
}

impl OpDef for SwiGluBackward {
    fn name(&self) -> &'static str {
        "swiglu_backward"
    }

    // dh, gate, up, dgate and dup: rows of I at any strides (Phi-3's dgate and dup are the
    // halves of its gate_up projection's gradient).
    fn read_req(&self, _slot: usize) -> Req {
        Req::Rows
    }

    fn write_req(&self, _slot: usize) -> Req {
        Req::Rows
    }

    // dgate over dh: each element of dh is read before its dgate is written.
    fn inplace_inputs(&self) -> &'static [usize] {
        &[backward_slot::DH]
    }
}

/// h = silu(gate)·up
// h, gate, up: (N)
pub fn swiglu_forward<T: Real>(h: &mut [T], gate: &[T], up: &[T]) {
    for ((o, &g), &u) in h.iter_mut().zip(gate).zip(up) {
        *o = UnaryFn::Silu.f(g) * u;
    }
}

/// dgate = (dh·up)·silu'(gate), dup = dh·silu(gate): the backward of `mul` then of `silu`, in
/// the unfused graph's order.
// dgate, dup, dh, gate, up: (N)
pub fn swiglu_backward<T: Real>(dgate: &mut [T], dup: &mut [T], dh: &[T], gate: &[T], up: &[T]) {
    for i in 0..dh.len() {
        let (d, g) = (dh[i], gate[i]);
        dgate[i] = d * up[i] * UnaryFn::Silu.df(g);
        dup[i] = d * UnaryFn::Silu.f(g);
    }
}

/// The op's graph constructors: operand checks and the output shape rule.
impl Graph {
    /// silu(gate)·up, gate and up of one shape (Llama's MLP before `down_proj`).
    // gate, up: (…, I) -> (…, I)
    pub fn swiglu(&mut self, gate: TensorId, up: TensorId) -> Result<TensorId, GraphError> {
        self.binary_same("swiglu", Op::SwiGlu, [("gate", gate), ("up", up)])
    }

    /// (dh, gate, up) → [dgate, dup], all of one shape.
    pub(crate) fn swiglu_backward(
        &mut self,
        dh: TensorId,
        gate: TensorId,
        up: TensorId,
    ) -> Result<[TensorId; 2], GraphError> {
        let op = "swiglu_backward";
        let (sd, dt) = self.float_arg(op, "dh", dh)?;
        let (sg, _) = self.float_arg(op, "gate", gate)?;
        let (su, _) = self.float_arg(op, "up", up)?;
        if sd != sg || sg != su {
            let named: &[(&str, &[usize])] = &[("dh", &sd), ("gate", &sg), ("up", &su)];
            return Err(shape_err(op, "operands must have the same shape", named));
        }
        let f = ElemType::Float(dt);
        let o = self.push(Op::SwiGluBackward, vec![dh, gate, up], vec![(sd.clone(), f), (sd, f)]);
        Ok([o[0], o[1]])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testutil::*;

    /// dgate and dup of Σ h·dh against central finite differences (f64, FD_TOL), gate spread
    /// over both tails of σ.
    #[test]
    fn backward_matches_finite_differences() {
        let n = 37;
        let mut rng = Rng::new(71);
        let gate: Vec<f64> = rng.vec(n).iter().map(|v| 8.0 * v).collect();
        let (up, dh) = (rng.vec(n), rng.vec(n));
        let loss = |g: &[f64], u: &[f64]| {
            let mut h = vec![0.0; n];
            swiglu_forward(&mut h, g, u);
            dot(&h, &dh)
        };
        let (mut dgate, mut dup) = (vec![0.0; n], vec![0.0; n]);
        swiglu_backward(&mut dgate, &mut dup, &dh, &gate, &up);
        assert_close(&dgate, &fd_grad(&gate, FD_STEP, |g| loss(g, &up)), FD_TOL, "dgate");
        assert_close(&dup, &fd_grad(&up, FD_STEP, |u| loss(&gate, u)), FD_TOL, "dup");
    }

    /// torch.nn.functional.silu(g) * u in float64 for a few pairs.
    #[test]
    fn forward_matches_torch_values() {
        // torch.nn.functional.silu(torch.tensor([-3., 0.5, 2.], dtype=torch.float64))
        //   * torch.tensor([1.5, -2., 0.25], dtype=torch.float64)
        let want = [-0.21341642929905053, -0.6224593312018546, 0.44039853898894116];
        let mut h = [0.0f64; 3];
        swiglu_forward(&mut h, &[-3.0, 0.5, 2.0], &[1.5, -2.0, 0.25]);
        for (got, w) in h.iter().zip(want) {
            assert!((got - w).abs() <= 1e-12 * (1.0 + w.abs()), "{got} vs torch {w}");
        }
    }
}
