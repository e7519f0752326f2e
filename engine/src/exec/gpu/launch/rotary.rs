//! Launcher of `engine/kernels/rotary.cu`: rotary position embedding on q or k, one thread per
//! pair (x[i], x[i + D/2]), grid-stride, in place when the plan says so. CPU counterpart:
//! `backend/cpu/kernels/rotary.rs`; the op: `ops::rotary`.

use super::{grid_stride, kernel_name, Arg, Device, Launch};
use crate::exec::gpu::kernel::{GpuKernel, NodeCx};
use crate::exec::gpu::{Call, Resolver};
use crate::graph::op::Rotary;
use crate::plan::PlanError;
use crate::DType;

/// `rotary_<T>`: y = x·cos + rotate_half(x)·sin (sin negated when `inverse`); y may be x.
// y, x: (rows, d) T, rows = (…)·t; cos, sin: (t, d) T
pub struct RotaryLaunch<P> {
    pub dtype: DType,
    pub y: P,
    pub x: P,
    pub cos: P,
    pub sin: P,
    pub rows: usize,
    pub d: usize,
    pub t: usize,
    pub inverse: bool,
}

impl<P> RotaryLaunch<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        let sg = if self.inverse { -1.0 } else { 1.0 };
        grid_stride(
            kernel_name("rotary", self.dtype),
            self.rows * (self.d / 2),
            dev,
            vec![
                Arg::Ptr(self.y),
                Arg::Ptr(self.x),
                Arg::Ptr(self.cos),
                Arg::Ptr(self.sin),
                Arg::I64(self.rows as i64),
                Arg::I32(self.d as i32),
                Arg::I32(self.t as i32),
                Arg::F32(sg),
            ],
        )
    }
}

impl GpuKernel for Rotary {
    // The kernel addresses rows as r·D: dense x and y (the CPU kernel takes strided rows).
    fn dense_rows(&self) -> bool {
        true
    }

    // (x (…, T, D), cos (T, D), sin (T, D)) → y (…, T, D)
    fn launches(&self, r: &mut Resolver<'_>, cx: &NodeCx<'_>) -> Result<Vec<Call>, PlanError> {
        let (ins, outs) = (&cx.node.inputs, &cx.node.outputs);
        cx.same(&[outs[0], ins[0], ins[1], ins[2]])?;
        let d = cx.last(ins[0]);
        let y = if cx.inplace.is_some() { cx.inp(0) } else { cx.out(0) };
        let l = RotaryLaunch {
            dtype: cx.dt(outs[0]),
            y,
            x: cx.inp(0),
            cos: cx.inp(1),
            sin: cx.inp(2),
            rows: cx.n(ins[0]) / d,
            d,
            t: cx.n(ins[1]) / d,
            inverse: self.inverse,
        };
        Ok(vec![l.launch(r.device()).into()])
    }
}
