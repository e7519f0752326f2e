//! Launcher of `engine/kernels/rotary.cu`: rotary position embedding on q or k, one thread per
//! pair (x[i], x[i + D/2]), grid-stride, in place when the plan says so, on rows at the plan's
//! strides (up to three leading dims: the head permutes around the op folded). CPU
//! counterpart: `backend/cpu/kernels/rotary.rs`; the op: `ops::rotary`.

use super::rows::rows_of;
use super::{grid_stride, kernel_name, Arg, Device, Launch};
use crate::exec::gpu::kernel::{GpuKernel, NodeCx};
use crate::exec::gpu::{Call, Resolver};
use crate::graph::op::Rotary;
use crate::plan::PlanError;
use crate::DType;

/// `rotary_<T>`: y = x·cos + rotate_half(x)·sin (sin negated when `inverse`); y may be x.
// y, x: (n0, n1, n2, d) T rows at strides ys, xs (elements; last stride 1), rows = n0·n1·n2,
// the position of row r is r mod t; cos, sin: (t, d) T
pub struct RotaryLaunch<P> {
    pub dtype: DType,
    pub y: P,
    pub x: P,
    pub cos: P,
    pub sin: P,
    /// (n0, n1, n2): the leading dims.
    pub lead: [usize; 3],
    pub xs: [i64; 3],
    pub ys: [i64; 3],
    pub d: usize,
    pub t: usize,
    pub inverse: bool,
}

impl<P> RotaryLaunch<P> {
    /// Dense (R, d) rows for y and x.
    pub fn dense(
        dtype: DType,
        (y, x, cos, sin): (P, P, P, P),
        rows: usize,
        d: usize,
        t: usize,
        inverse: bool,
    ) -> Self {
        let s = [0, 0, d as i64];
        RotaryLaunch { dtype, y, x, cos, sin, lead: [1, 1, rows], xs: s, ys: s, d, t, inverse }
    }

    pub fn launch(self, dev: Device) -> Launch<P> {
        let sg = if self.inverse { -1.0 } else { 1.0 };
        let rows: usize = self.lead.iter().product();
        let mut args = vec![
            Arg::Ptr(self.y),
            Arg::Ptr(self.x),
            Arg::Ptr(self.cos),
            Arg::Ptr(self.sin),
            Arg::I64(rows as i64),
            Arg::I32(self.d as i32),
            Arg::I32(self.t as i32),
            Arg::I64(self.lead[1] as i64),
            Arg::I64(self.lead[2] as i64),
        ];
        args.extend(self.xs.iter().chain(&self.ys).map(|&s| Arg::I64(s)));
        args.push(Arg::F32(sg));
        grid_stride(kernel_name("rotary", self.dtype), rows * (self.d / 2), dev, args)
    }
}

impl GpuKernel for Rotary {
    // (x (…, T, D), cos (T, D), sin (T, D)) → y (…, T, D); x and y rows at the plan's strides
    fn launches(&self, r: &mut Resolver<'_>, cx: &NodeCx<'_>) -> Result<Vec<Call>, PlanError> {
        let (ins, outs) = (&cx.node.inputs, &cx.node.outputs);
        cx.same(&[outs[0], ins[0], ins[1], ins[2]])?;
        let (y, yt) = match cx.inplace {
            Some(_) => (cx.inp(0), ins[0]),
            None => (cx.out(0), outs[0]),
        };
        let (lead, [xs, ys]) = rows_of(r, cx, [ins[0], yt])?;
        let d = cx.last(ins[0]);
        let l = RotaryLaunch {
            dtype: cx.dt(outs[0]),
            y,
            x: cx.inp(0),
            cos: cx.inp(1),
            sin: cx.inp(2),
            lead,
            xs,
            ys,
            d,
            t: cx.n(ins[1]) / d,
            inverse: self.inverse,
        };
        Ok(vec![l.launch(r.device()).into()])
    }
}
