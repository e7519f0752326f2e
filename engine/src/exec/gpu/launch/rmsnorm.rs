//! Launchers of `engine/kernels/rmsnorm.cu`: RMSNorm over the last dim of (rows, c), one warp
//! per row, rstd in f32; the weight gradient as column partials per chunk of rows, which
//! reduce.cu's `column_sum_finish` adds ([`super::reduce`]). CPU counterparts:
//! `backend/cpu/kernels/rmsnorm.rs`; the op: `ops::rmsnorm`.

use super::reduce;
use super::{columns, kernel_name, warp_rows, Arg, Device, Launch};
use crate::exec::gpu::kernel::{GpuKernel, NodeCx};
use crate::exec::gpu::support::{chunks, GpuSupport, ROWS_PER_CHUNK};
use crate::exec::gpu::{Call, Resolver};
use crate::graph::op::{AddRmsNorm, RmsNorm, RmsNormBackward};
use crate::graph::Graph;
use crate::plan::PlanError;
use crate::DType;

/// `rmsnorm_forward_<T>`: y = w·(x·rstd) per row, rstd = 1/√(mean(x²) + eps) saved for the
/// backward.
// y, x: (rows, c) T; rstd: (rows) f32; w: (c) T
pub struct RmsNormForward<P> {
    pub dtype: DType,
    pub y: P,
    pub rstd: P,
    pub x: P,
    pub w: P,
    pub rows: usize,
    pub c: usize,
    pub eps: f32,
}

impl<P> RmsNormForward<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        warp_rows(
            kernel_name("rmsnorm_forward", self.dtype),
            self.rows,
            dev,
            vec![
                Arg::Ptr(self.y),
                Arg::Ptr(self.rstd),
                Arg::Ptr(self.x),
                Arg::Ptr(self.w),
                Arg::I64(self.rows as i64),
                Arg::I32(self.c as i32),
                Arg::F32(self.eps),
            ],
        )
    }
}

/// `add_rmsnorm_forward_<T>`: sum = a + b, y = RMSNorm(sum) (ORT's
/// SkipSimplifiedLayerNormalization); `a` may be `sum` (the sum over a dying operand).
// sum, y, a, b: (rows, c) T; rstd: (rows) f32; w: (c) T
pub struct AddRmsNormForward<P> {
    pub dtype: DType,
    pub sum: P,
    pub y: P,
    pub rstd: P,
    pub a: P,
    pub b: P,
    pub w: P,
    pub rows: usize,
    pub c: usize,
    pub eps: f32,
}

impl<P> AddRmsNormForward<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        warp_rows(
            kernel_name("add_rmsnorm_forward", self.dtype),
            self.rows,
            dev,
            vec![
                Arg::Ptr(self.sum),
                Arg::Ptr(self.y),
                Arg::Ptr(self.rstd),
                Arg::Ptr(self.a),
                Arg::Ptr(self.b),
                Arg::Ptr(self.w),
                Arg::I64(self.rows as i64),
                Arg::I32(self.c as i32),
                Arg::F32(self.eps),
            ],
        )
    }
}

/// `rmsnorm_backward_dx_<T>`: the input's gradient from the saved rstd.
// dx, dy, x: (rows, c) T; w: (c) T; rstd: (rows) f32
pub struct RmsNormBackwardDx<P> {
    pub dtype: DType,
    pub dx: P,
    pub dy: P,
    pub x: P,
    pub w: P,
    pub rstd: P,
    pub rows: usize,
    pub c: usize,
}

impl<P> RmsNormBackwardDx<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        warp_rows(
            kernel_name("rmsnorm_backward_dx", self.dtype),
            self.rows,
            dev,
            vec![
                Arg::Ptr(self.dx),
                Arg::Ptr(self.dy),
                Arg::Ptr(self.x),
                Arg::Ptr(self.w),
                Arg::Ptr(self.rstd),
                Arg::I64(self.rows as i64),
                Arg::I32(self.c as i32),
            ],
        )
    }
}

/// `rmsnorm_backward_dw_<T>`: per chunk of [`ROWS_PER_CHUNK`] rows, the partial sums of
/// dy·x·rstd into `ws`; `column_sum_finish` then gives dw. The chunk count is
/// [`chunks`]`(rows)`.
// ws: (chunks(rows), c) f32; dy, x: (rows, c) T; rstd: (rows) f32
pub struct RmsNormBackwardDw<P> {
    pub dtype: DType,
    pub ws: P,
    pub dy: P,
    pub x: P,
    pub rstd: P,
    pub rows: usize,
    pub c: usize,
}

impl<P> RmsNormBackwardDw<P> {
    pub fn launch(self, _dev: Device) -> Launch<P> {
        columns(
            kernel_name("rmsnorm_backward_dw", self.dtype),
            self.rows,
            self.c,
            vec![
                Arg::Ptr(self.ws),
                Arg::Ptr(self.dy),
                Arg::Ptr(self.x),
                Arg::Ptr(self.rstd),
                Arg::I64(self.rows as i64),
                Arg::I32(self.c as i32),
                Arg::I32(ROWS_PER_CHUNK as i32),
            ],
        )
    }
}

impl GpuKernel for RmsNorm {
    fn launches(&self, r: &mut Resolver<'_>, cx: &NodeCx<'_>) -> Result<Vec<Call>, PlanError> {
        let (ins, outs) = (&cx.node.inputs, &cx.node.outputs);
        cx.same(&[outs[0], ins[0], ins[1]])?;
        let c = cx.last(ins[0]);
        let l = RmsNormForward {
            dtype: cx.dt(outs[0]),
            y: cx.out(0),
            rstd: cx.out(1),
            x: cx.inp(0),
            w: cx.inp(1),
            rows: cx.n(ins[0]) / c,
            c,
            eps: self.eps,
        };
        Ok(vec![l.launch(r.device()).into()])
    }
}

impl GpuKernel for AddRmsNorm {
    fn launches(&self, r: &mut Resolver<'_>, cx: &NodeCx<'_>) -> Result<Vec<Call>, PlanError> {
        let (ins, outs) = (&cx.node.inputs, &cx.node.outputs);
        cx.same(&[outs[0], outs[1], ins[0], ins[1], ins[2]])?;
        let c = cx.last(ins[0]);
        // The sum may overwrite a dying operand: the kernel allows it over `a`, and the sum
        // commutes, so that operand goes first.
        let (sum, a, b) = match cx.inplace {
            Some(k) => (cx.inp(k), cx.inp(k), cx.inp(1 - k)),
            None => (cx.out(0), cx.inp(0), cx.inp(1)),
        };
        let l = AddRmsNormForward {
            dtype: cx.dt(outs[1]),
            sum,
            y: cx.out(1),
            rstd: cx.out(2),
            a,
            b,
            w: cx.inp(2),
            rows: cx.n(ins[0]) / c,
            c,
            eps: self.eps,
        };
        Ok(vec![l.launch(r.device()).into()])
    }
}

impl GpuKernel for RmsNormBackward {
    // dw's partial column sums: (chunks, c) f32.
    fn workspace(&self, _sup: &GpuSupport, g: &Graph, node: usize) -> usize {
        let n = &g.nodes()[node];
        let c = g.tensor(n.inputs[2]).numel();
        chunks(g.tensor(n.inputs[1]).numel() / c.max(1)) * c
    }

    // (dy, x, w, rstd) → (dx, dw)
    fn launches(&self, r: &mut Resolver<'_>, cx: &NodeCx<'_>) -> Result<Vec<Call>, PlanError> {
        let (ins, outs) = (&cx.node.inputs, &cx.node.outputs);
        cx.same(&[outs[0], ins[0], ins[1], ins[2]])?;
        let c = cx.n(ins[2]);
        let rows = cx.n(ins[1]) / c;
        let (dy, x, rstd, ws) = (cx.inp(0), cx.inp(1), cx.inp(3), cx.ws_at());
        let (dtype, dev) = (cx.dt(outs[0]), r.device());
        let dx = RmsNormBackwardDx { dtype, dx: cx.out(0), dy, x, w: cx.inp(2), rstd, rows, c };
        let dw = RmsNormBackwardDw { dtype: cx.dt(ins[0]), ws, dy, x, rstd, rows, c };
        let finish = reduce::ColumnSumFinish {
            dtype: cx.dt(outs[1]),
            out: cx.out(1),
            ws,
            chunks: chunks(rows),
            c,
        };
        Ok(vec![dx.launch(dev).into(), dw.launch(dev).into(), finish.launch(dev).into()])
    }
}
