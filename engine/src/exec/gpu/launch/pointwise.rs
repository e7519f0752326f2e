//! Launchers of `engine/kernels/pointwise.cu`: the pointwise functions of `ops::pointwise`,
//! one thread per element, grid-stride, f32 arithmetic over storage type `dtype`. A launcher
//! serves every function of its family: the kernel is named by the function
//! (`<name>_forward_<T>`, `<name>_backward_<T>`, `<name>_<T>`), its arguments are the
//! family's. CPU counterparts: `backend/cpu/kernels/pointwise.rs`.

use super::{grid_stride, kernel_name, Arg, Device, Launch};
use crate::exec::gpu::kernel::{GpuKernel, NodeCx};

use crate::exec::gpu::{Call, Resolver};
use crate::graph::op;
use crate::ops::pointwise::{BinaryFn, UnaryFn};
use crate::plan::PlanError;
use crate::DType;

/// `<f>_forward_<T>`: y = f(x); y may be x.
// y, x: (n)
pub struct Unary<P> {
    pub f: UnaryFn,
    pub dtype: DType,
    pub y: P,
    pub x: P,
    pub n: usize,
}

impl<P> Unary<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        grid_stride(
            kernel_name(&format!("{}_forward", self.f.name()), self.dtype),
            self.n,
            dev,
            vec![Arg::Ptr(self.y), Arg::Ptr(self.x), Arg::I64(self.n as i64)],
        )
    }
}

/// `<f>_backward_<T>`: dx = dy·f'(x), from the forward's input; dx may be dy.
// dx, x, dy: (n)
pub struct UnaryBackward<P> {
    pub f: UnaryFn,
    pub dtype: DType,
    pub dx: P,
    pub x: P,
    pub dy: P,
    pub n: usize,
}

impl<P> UnaryBackward<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        grid_stride(
            kernel_name(&format!("{}_backward", self.f.name()), self.dtype),
            self.n,
            dev,
            vec![Arg::Ptr(self.dx), Arg::Ptr(self.x), Arg::Ptr(self.dy), Arg::I64(self.n as i64)],
        )
    }
}

/// `<f>_<T>`: out[i] = f(a[i], b[i mod nb]); out may be a (or b when nb = n).
// out, a: (n); b: (nb), nb divides n
pub struct Binary<P> {
    pub f: BinaryFn,
    pub dtype: DType,
    pub out: P,
    pub a: P,
    pub b: P,
    pub n: usize,
    pub nb: usize,
}

impl<P> Binary<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        grid_stride(
            kernel_name(self.f.name(), self.dtype),
            self.n,
            dev,
            vec![
                Arg::Ptr(self.out),
                Arg::Ptr(self.a),
                Arg::Ptr(self.b),
                Arg::I64(self.n as i64),
                Arg::I64(self.nb as i64),
            ],
        )
    }
}

impl GpuKernel for op::Unary {
    fn launches(&self, r: &mut Resolver<'_>, cx: &NodeCx<'_>) -> Result<Vec<Call>, PlanError> {
        let op::Unary { f } = self;
        let ins = &cx.node.inputs;
        let outs = &cx.node.outputs;
        let calls = {
            cx.same(&[outs[0], ins[0]])?;
            let y = if cx.inplace.is_some() { cx.inp(0) } else { cx.out(0) };
            let (f, dtype, n) = (*f, cx.dt(outs[0]), cx.n(outs[0]));
            vec![Unary { f, dtype, y, x: cx.inp(0), n }.launch(r.device()).into()]
        };
        Ok(calls)
    }
}

impl GpuKernel for op::UnaryBackward {
    fn launches(&self, r: &mut Resolver<'_>, cx: &NodeCx<'_>) -> Result<Vec<Call>, PlanError> {
        let op::UnaryBackward { f } = self;
        let ins = &cx.node.inputs;
        let outs = &cx.node.outputs;
        let calls = {
            cx.same(&[outs[0], ins[0], ins[1]])?;
            let dx = if cx.inplace.is_some() { cx.inp(1) } else { cx.out(0) };
            let (f, dtype, n) = (*f, cx.dt(outs[0]), cx.n(outs[0]));
            let l = UnaryBackward { f, dtype, dx, x: cx.inp(0), dy: cx.inp(1), n };
            vec![l.launch(r.device()).into()]
        };
        Ok(calls)
    }
}

impl GpuKernel for op::Binary {
    fn launches(&self, r: &mut Resolver<'_>, cx: &NodeCx<'_>) -> Result<Vec<Call>, PlanError> {
        let op::Binary { f } = self;
        let ins = &cx.node.inputs;
        let outs = &cx.node.outputs;
        let calls = {
            let (len, nb) = (cx.n(outs[0]), cx.n(ins[1]));
            if nb == 0 || len % nb != 0 {
                return Err(cx.no(" for an operand that does not tile the output"));
            }
            cx.same(&[outs[0], ins[0], ins[1]])?;
            let o = match cx.inplace {
                Some(k) => cx.inp(k),
                None => cx.out(0),
            };
            let (f, dtype, a, b) = (*f, cx.dt(outs[0]), cx.inp(0), cx.inp(1));
            vec![Binary { f, dtype, out: o, a, b, n: len, nb }.launch(r.device()).into()]
        };
        Ok(calls)
    }
}
