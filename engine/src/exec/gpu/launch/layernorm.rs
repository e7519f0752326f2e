//! Launchers of `engine/kernels/layernorm.cu`: LayerNorm over the last dim of (rows, c), one
//! warp per row, statistics (mean, rstd) in f32; the weight/bias gradients as column partials
//! per chunk of rows, which reduce.cu's `column_sum_finish` adds ([`super::reduce`]). CPU
//! counterparts: `backend/cpu/kernels/layernorm.rs`.

use super::reduce;
use super::{columns, kernel_name, warp_rows, Arg, Device, Launch};
use crate::exec::gpu::kernel::{GpuKernel, NodeCx};
use crate::exec::gpu::support::GpuSupport;
use crate::exec::gpu::support::{chunks, ROWS_PER_CHUNK};
use crate::exec::gpu::{Call, Resolver};
use crate::graph::op::{AddLayerNorm, LayerNorm, LayerNormBackward};
use crate::graph::Graph;
use crate::plan::PlanError;
use crate::DType;

/// `layernorm_forward_<T>`: y = (x − mean)·rstd·w + b per row; mean and rstd saved for the
/// backward.
// y, x: (rows, c) T; mean, rstd: (rows) f32; w, b: (c) T
pub struct LayerNormForward<P> {
    pub dtype: DType,
    pub y: P,
    pub mean: P,
    pub rstd: P,
    pub x: P,
    pub w: P,
    pub b: P,
    pub rows: usize,
    pub c: usize,
    pub eps: f32,
}

impl<P> LayerNormForward<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        warp_rows(
            kernel_name("layernorm_forward", self.dtype),
            self.rows,
            dev,
            vec![
                Arg::Ptr(self.y),
                Arg::Ptr(self.mean),
                Arg::Ptr(self.rstd),
                Arg::Ptr(self.x),
                Arg::Ptr(self.w),
                Arg::Ptr(self.b),
                Arg::I64(self.rows as i64),
                Arg::I32(self.c as i32),
                Arg::F32(self.eps),
            ],
        )
    }
}

/// `add_layernorm_forward_<T>`: sum = a + b, y = LayerNorm(sum) (ORT's SkipLayerNormalization);
/// `a` may be `sum` (the sum over a dying operand).
// sum, y, a, b: (rows, c) T; mean, rstd: (rows) f32; w, bias: (c) T
pub struct AddLayerNormForward<P> {
    pub dtype: DType,
    pub sum: P,
    pub y: P,
    pub mean: P,
    pub rstd: P,
    pub a: P,
    pub b: P,
    pub w: P,
    pub bias: P,
    pub rows: usize,
    pub c: usize,
    pub eps: f32,
}

impl<P> AddLayerNormForward<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        warp_rows(
            kernel_name("add_layernorm_forward", self.dtype),
            self.rows,
            dev,
            vec![
                Arg::Ptr(self.sum),
                Arg::Ptr(self.y),
                Arg::Ptr(self.mean),
                Arg::Ptr(self.rstd),
                Arg::Ptr(self.a),
                Arg::Ptr(self.b),
                Arg::Ptr(self.w),
                Arg::Ptr(self.bias),
                Arg::I64(self.rows as i64),
                Arg::I32(self.c as i32),
                Arg::F32(self.eps),
            ],
        )
    }
}

/// `layernorm_backward_dx_<T>`: the input's gradient from the saved statistics; dx may be dy.
// dx, dy, x: (rows, c) T; w: (c) T; mean, rstd: (rows) f32
pub struct LayerNormBackwardDx<P> {
    pub dtype: DType,
    pub dx: P,
    pub dy: P,
    pub x: P,
    pub w: P,
    pub mean: P,
    pub rstd: P,
    pub rows: usize,
    pub c: usize,
}

impl<P> LayerNormBackwardDx<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        warp_rows(
            kernel_name("layernorm_backward_dx", self.dtype),
            self.rows,
            dev,
            vec![
                Arg::Ptr(self.dx),
                Arg::Ptr(self.dy),
                Arg::Ptr(self.x),
                Arg::Ptr(self.w),
                Arg::Ptr(self.mean),
                Arg::Ptr(self.rstd),
                Arg::I64(self.rows as i64),
                Arg::I32(self.c as i32),
            ],
        )
    }
}

/// `layernorm_backward_dwdb_<T>`: per chunk of [`ROWS_PER_CHUNK`] rows, the partial sums of
/// dy·norm (dw) and of dy (db) into `ws`, dw's chunks first; `column_sum_finish` over each
/// half then gives dw and db. The chunk count is [`chunks`]`(rows)`.
// ws: (2, chunks(rows), c) f32; dy, x: (rows, c) T; mean, rstd: (rows) f32
pub struct LayerNormBackwardDwdb<P> {
    pub dtype: DType,
    pub ws: P,
    pub dy: P,
    pub x: P,
    pub mean: P,
    pub rstd: P,
    pub rows: usize,
    pub c: usize,
}

impl<P> LayerNormBackwardDwdb<P> {
    pub fn launch(self, _dev: Device) -> Launch<P> {
        columns(
            kernel_name("layernorm_backward_dwdb", self.dtype),
            self.rows,
            self.c,
            vec![
                Arg::Ptr(self.ws),
                Arg::Ptr(self.dy),
                Arg::Ptr(self.x),
                Arg::Ptr(self.mean),
                Arg::Ptr(self.rstd),
                Arg::I64(self.rows as i64),
                Arg::I32(self.c as i32),
                Arg::I32(ROWS_PER_CHUNK as i32),
                Arg::I32(chunks(self.rows) as i32),
            ],
        )
    }
}

impl GpuKernel for LayerNorm {
    fn launches(&self, r: &mut Resolver<'_>, cx: &NodeCx<'_>) -> Result<Vec<Call>, PlanError> {
        let LayerNorm { eps } = self;
        let ins = &cx.node.inputs;
        let outs = &cx.node.outputs;
        let calls = {
            cx.same(&[outs[0], ins[0], ins[1], ins[2]])?;
            let c = cx.last(ins[0]);
            let rows = cx.n(ins[0]) / c;
            let (y, mean, rstd, x, w, b) =
                (cx.out(0), cx.out(1), cx.out(2), cx.inp(0), cx.inp(1), cx.inp(2));
            let dtype = cx.dt(outs[0]);
            let l = LayerNormForward { dtype, y, mean, rstd, x, w, b, rows, c, eps: *eps };
            vec![l.launch(r.device()).into()]
        };
        Ok(calls)
    }
}

impl GpuKernel for AddLayerNorm {
    fn launches(&self, r: &mut Resolver<'_>, cx: &NodeCx<'_>) -> Result<Vec<Call>, PlanError> {
        let AddLayerNorm { eps } = self;
        let ins = &cx.node.inputs;
        let outs = &cx.node.outputs;
        let calls = {
            cx.same(&[outs[0], outs[1], ins[0], ins[1], ins[2], ins[3]])?;
            let c = cx.last(ins[0]);
            let rows = cx.n(ins[0]) / c;
            // The sum may overwrite a dying operand: the kernel allows it over `a`, and the
            // sum commutes, so that operand goes first.
            let (sum, a, b) = match cx.inplace {
                Some(k) => (cx.inp(k), cx.inp(k), cx.inp(1 - k)),
                None => (cx.out(0), cx.inp(0), cx.inp(1)),
            };
            let l = AddLayerNormForward {
                dtype: cx.dt(outs[1]),
                sum,
                y: cx.out(1),
                mean: cx.out(2),
                rstd: cx.out(3),
                a,
                b,
                w: cx.inp(2),
                bias: cx.inp(3),
                rows,
                c,
                eps: *eps,
            };
            vec![l.launch(r.device()).into()]
        };
        Ok(calls)
    }
}

impl GpuKernel for LayerNormBackward {
    // dw's and db's partial column sums: (2, chunks, c) f32.
    fn workspace(&self, _sup: &GpuSupport, g: &Graph, node: usize) -> usize {
        let n = &g.nodes()[node];
        let c = g.tensor(n.inputs[2]).numel();
        2 * crate::exec::gpu::support::chunks(g.tensor(n.inputs[0]).numel() / c.max(1)) * c
    }

    fn launches(&self, r: &mut Resolver<'_>, cx: &NodeCx<'_>) -> Result<Vec<Call>, PlanError> {
        let ins = &cx.node.inputs;
        let outs = &cx.node.outputs;
        let calls = {
            cx.same(&[outs[0], ins[0], ins[1], ins[2]])?;
            let c = cx.n(ins[2]);
            let rows = cx.n(ins[0]) / c;
            let chunks = crate::exec::gpu::support::chunks(rows);
            let ws = cx.ws_at();
            let (dy, x, mean, rstd) = (cx.inp(0), cx.inp(1), cx.inp(3), cx.inp(4));
            let dev = r.device();
            // dw's partials, then db's, in the workspace: (2, chunks, c) f32.
            let (dw_ws, db_ws) = (ws, ws + 4 * (chunks * c) as u64);
            let dtype = cx.dt(outs[0]);
            let dx = LayerNormBackwardDx {
                dtype,
                dx: cx.out(0),
                dy,
                x,
                w: cx.inp(2),
                mean,
                rstd,
                rows,
                c,
            };
            let dwdb =
                LayerNormBackwardDwdb { dtype: cx.dt(ins[0]), ws, dy, x, mean, rstd, rows, c };
            let dw = reduce::ColumnSumFinish {
                dtype: cx.dt(outs[1]),
                out: cx.out(1),
                ws: dw_ws,
                chunks,
                c,
            };
            let db = reduce::ColumnSumFinish {
                dtype: cx.dt(outs[2]),
                out: cx.out(2),
                ws: db_ws,
                chunks,
                c,
            };
            vec![
                dx.launch(dev).into(),
                dwdb.launch(dev).into(),
                dw.launch(dev).into(),
                db.launch(dev).into(),
            ]
        };
        Ok(calls)
    }
}
