//! Launchers of `engine/kernels/softmax.cu`: row softmax with scale, causal cut and a broadcast
//! additive mask, and its backward, one warp per row (the attention probabilities when
//! attention is not fused). CPU counterparts: `backend/cpu/kernels/softmax.rs`.

use super::{kernel_name, mask_args, warp_rows, Arg, Device, Launch, Mask};
use crate::exec::gpu::broadcast_strides4;
use crate::exec::gpu::kernel::{GpuKernel, NodeCx};
use crate::exec::gpu::launch;
use crate::exec::gpu::{Call, Resolver};
use crate::graph::op;
use crate::graph::op::Softmax;
use crate::plan::PlanError;
use crate::DType;

/// `softmax_forward_<T>`: y = softmax(x·scale + mask) per row of n; the rows are viewed as
/// (B, H, tq, n) for the mask and the causal cut (row r is query r mod tq); y may be x.
// y, x: (rows, n) T, rows = B·h·tq; mask: broadcast to (B, h, tq, n) T, or none
pub struct SoftmaxForward<P> {
    pub dtype: DType,
    pub y: P,
    pub x: P,
    pub mask: Option<Mask<P>>,
    pub rows: usize,
    pub n: usize,
    pub scale: f32,
    pub causal: bool,
    pub h: usize,
    pub tq: usize,
}

impl<P> SoftmaxForward<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        let (mask, ms) = mask_args(self.mask);
        let mut args = vec![
            Arg::Ptr(self.y),
            Arg::Ptr(self.x),
            mask,
            Arg::I64(self.rows as i64),
            Arg::I32(self.n as i32),
            Arg::F32(self.scale),
            Arg::I32(i32::from(self.causal)),
            Arg::I32(self.h as i32),
            Arg::I32(self.tq as i32),
        ];
        args.extend(ms);
        warp_rows(kernel_name("softmax_forward", self.dtype), self.rows, dev, args)
    }
}

/// `softmax_backward_<T>`: dx = scale·y·(dy − Σ dy·y) per row of n; dx may be dy.
// dx, y, dy: (rows, n) T
pub struct SoftmaxBackward<P> {
    pub dtype: DType,
    pub dx: P,
    pub y: P,
    pub dy: P,
    pub rows: usize,
    pub n: usize,
    pub scale: f32,
}

impl<P> SoftmaxBackward<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        warp_rows(
            kernel_name("softmax_backward", self.dtype),
            self.rows,
            dev,
            vec![
                Arg::Ptr(self.dx),
                Arg::Ptr(self.y),
                Arg::Ptr(self.dy),
                Arg::I64(self.rows as i64),
                Arg::I32(self.n as i32),
                Arg::F32(self.scale),
            ],
        )
    }
}

impl GpuKernel for Softmax {
    fn launches(&self, r: &mut Resolver<'_>, cx: &NodeCx<'_>) -> Result<Vec<Call>, PlanError> {
        let Softmax { scale, causal } = self;
        let g = cx.g;
        let ins = &cx.node.inputs;
        let outs = &cx.node.outputs;
        let calls = {
            cx.same(&[outs[0], ins[0]])?;
            if let Some(&m) = ins.get(1) {
                cx.same(&[ins[0], m])?;
            }
            let s = g.shape(ins[0]);
            let rank = s.len();
            let ncol = s[rank - 1];
            let rows = cx.n(ins[0]) / ncol;
            let tq = if rank >= 2 { s[rank - 2] } else { 1 };
            let h = if rank >= 3 { s[rank - 3] } else { 1 };
            let full = [rows / (h * tq).max(1), h, tq, ncol];
            let mask = ins.get(1).map(|&m| launch::Mask {
                mask: r.at(m),
                strides: broadcast_strides4(g.shape(m), full),
            });
            let l = SoftmaxForward {
                dtype: cx.dt(outs[0]),
                y: cx.out(0),
                x: cx.inp(0),
                mask,
                rows,
                n: ncol,
                scale: *scale,
                causal: *causal,
                h,
                tq,
            };
            vec![l.launch(r.device()).into()]
        };
        Ok(calls)
    }
}

impl GpuKernel for op::SoftmaxBackward {
    fn launches(&self, r: &mut Resolver<'_>, cx: &NodeCx<'_>) -> Result<Vec<Call>, PlanError> {
        let op::SoftmaxBackward { scale } = self;
        let ins = &cx.node.inputs;
        let outs = &cx.node.outputs;
        let calls = {
            cx.same(&[outs[0], ins[0], ins[1]])?;
            let ncol = cx.last(ins[0]);
            let rows = cx.n(ins[0]) / ncol;
            let o = if cx.inplace.is_some() { cx.inp(1) } else { cx.out(0) };
            let (dtype, y, dy, scale) = (cx.dt(outs[0]), cx.inp(0), cx.inp(1), *scale);
            let l = SoftmaxBackward { dtype, dx: o, y, dy, rows, n: ncol, scale };
            vec![l.launch(r.device()).into()]
        };
        Ok(calls)
    }
}
