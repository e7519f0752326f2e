//! SwiGLU's GPU launchers, of `engine/kernels/swiglu.cu`: one thread per element, grid-stride,
//! f32 arithmetic over storage type `dtype`. CPU counterparts: [`super::cpu`].

use super::{backward_slot as bs, slot, SwiGlu, SwiGluBackward};
use crate::exec::gpu::kernel::{GpuKernel, NodeCx};
use crate::exec::gpu::launch::{grid_stride, kernel_name, Arg, Device, Launch};
use crate::exec::gpu::{Call, Resolver};
use crate::plan::PlanError;
use crate::DType;

/// `swiglu_forward_<T>`: h = silu(gate)·up; h may be gate or up.
// h, gate, up: (n)
pub struct Forward<P> {
    pub dtype: DType,
    pub h: P,
    pub gate: P,
    pub up: P,
    pub n: usize,
}

impl<P> Forward<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        let args =
            vec![Arg::Ptr(self.h), Arg::Ptr(self.gate), Arg::Ptr(self.up), Arg::I64(self.n as i64)];
        grid_stride(kernel_name("swiglu_forward", self.dtype), self.n, dev, args)
    }
}

/// `swiglu_backward_<T>`: dgate = (dh·up)·silu'(gate), dup = dh·silu(gate); dgate may be dh.
// dgate, dup, dh, gate, up: (n)
pub struct Backward<P> {
    pub dtype: DType,
    pub dgate: P,
    pub dup: P,
    pub dh: P,
    pub gate: P,
    pub up: P,
    pub n: usize,
}

impl<P> Backward<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        let args = vec![
            Arg::Ptr(self.dgate),
            Arg::Ptr(self.dup),
            Arg::Ptr(self.dh),
            Arg::Ptr(self.gate),
            Arg::Ptr(self.up),
            Arg::I64(self.n as i64),
        ];
        grid_stride(kernel_name("swiglu_backward", self.dtype), self.n, dev, args)
    }
}

impl GpuKernel for SwiGlu {
    fn launches(&self, r: &mut Resolver<'_>, cx: &NodeCx<'_>) -> Result<Vec<Call>, PlanError> {
        let (ins, outs) = (&cx.node.inputs, &cx.node.outputs);
        cx.same(&[outs[0], ins[slot::GATE], ins[slot::UP]])?;
        let h = match cx.inplace {
            Some(k) => cx.inp(k),
            None => cx.out(0),
        };
        let (gate, up) = (cx.inp(slot::GATE), cx.inp(slot::UP));
        let l = Forward { dtype: cx.dt(outs[0]), h, gate, up, n: cx.n(outs[0]) };
        Ok(vec![l.launch(r.device()).into()])
    }
}

impl GpuKernel for SwiGluBackward {
    fn launches(&self, r: &mut Resolver<'_>, cx: &NodeCx<'_>) -> Result<Vec<Call>, PlanError> {
        let (ins, outs) = (&cx.node.inputs, &cx.node.outputs);
        cx.same(&[outs[0], outs[1], ins[bs::DH], ins[bs::GATE], ins[bs::UP]])?;
        let dgate = if cx.inplace.is_some() { cx.inp(bs::DH) } else { cx.out(0) };
        let (dh, gate, up) = (cx.inp(bs::DH), cx.inp(bs::GATE), cx.inp(bs::UP));
        let (dtype, n) = (cx.dt(outs[0]), cx.n(outs[0]));
        let l = Backward { dtype, dgate, dup: cx.out(1), dh, gate, up, n };
        Ok(vec![l.launch(r.device()).into()])
    }
}
