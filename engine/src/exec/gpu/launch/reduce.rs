//! Launchers of `engine/kernels/reduce.cu`: deterministic column sums of a row-major (rows, c)
//! matrix in two launches, f32 partials per chunk of rows, then the partials added in chunk
//! order (no atomics: the same bits every run). CPU counterpart:
//! `backend/cpu/kernels/reduce.rs` (`reduce_sum_leading`).

use super::{columns, grid_stride, kernel_name, Arg, Device, Launch};
use crate::exec::gpu::kernel::{GpuKernel, NodeCx};
use crate::exec::gpu::support::GpuSupport;
use crate::graph::Graph;

use crate::exec::gpu::support::ROWS_PER_CHUNK;
use crate::exec::gpu::{Call, Resolver};
use crate::graph::op::ReduceSumLeading;
use crate::plan::PlanError;
use crate::DType;

/// `column_sum_partial_<T>`: ws[k, j] = Σ x[r, j] over chunk k of [`ROWS_PER_CHUNK`] rows.
// ws: (chunks(rows), c) f32; x: (rows, c) T
pub struct ColumnSumPartial<P> {
    pub dtype: DType,
    pub ws: P,
    pub x: P,
    pub rows: usize,
    pub c: usize,
}

impl<P> ColumnSumPartial<P> {
    pub fn launch(self, _dev: Device) -> Launch<P> {
        columns(
            kernel_name("column_sum_partial", self.dtype),
            self.rows,
            self.c,
            vec![
                Arg::Ptr(self.ws),
                Arg::Ptr(self.x),
                Arg::I64(self.rows as i64),
                Arg::I32(self.c as i32),
                Arg::I32(ROWS_PER_CHUNK as i32),
            ],
        )
    }
}

/// `column_sum_finish_<T>`: out[j] = Σ_k ws[k, j] in chunk order; `chunks` is
/// [`crate::exec::gpu::support::chunks`] of the partials' rows.
// out: (c) T; ws: (chunks, c) f32
pub struct ColumnSumFinish<P> {
    pub dtype: DType,
    pub out: P,
    pub ws: P,
    pub chunks: usize,
    pub c: usize,
}

impl<P> ColumnSumFinish<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        grid_stride(
            kernel_name("column_sum_finish", self.dtype),
            self.c,
            dev,
            vec![
                Arg::Ptr(self.out),
                Arg::Ptr(self.ws),
                Arg::I32(self.chunks as i32),
                Arg::I32(self.c as i32),
            ],
        )
    }
}

impl GpuKernel for ReduceSumLeading {
    // The partial column sums: (chunks, c) f32.
    fn workspace(&self, _sup: &GpuSupport, g: &Graph, node: usize) -> usize {
        let n = &g.nodes()[node];
        let c = g.tensor(n.outputs[0]).numel();
        crate::exec::gpu::support::chunks(g.tensor(n.inputs[0]).numel() / c.max(1)) * c
    }

    fn launches(&self, r: &mut Resolver<'_>, cx: &NodeCx<'_>) -> Result<Vec<Call>, PlanError> {
        let ins = &cx.node.inputs;
        let outs = &cx.node.outputs;
        let calls = {
            let c = cx.n(outs[0]);
            let rows = cx.n(ins[0]) / c.max(1);
            let (ws, dev) = (cx.ws_at(), r.device());
            let part = ColumnSumPartial { dtype: cx.dt(ins[0]), ws, x: cx.inp(0), rows, c };
            let chunks = crate::exec::gpu::support::chunks(rows);
            let fin = ColumnSumFinish { dtype: cx.dt(outs[0]), out: cx.out(0), ws, chunks, c };
            vec![part.launch(dev).into(), fin.launch(dev).into()]
        };
        Ok(calls)
    }
}
