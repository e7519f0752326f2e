//! Launchers of `engine/kernels/embedding.cu`: the gather (one block per output row) and its
//! deterministic scatter-add backward (each thread owns one column of the table rows whose id
//! falls in its residue class; no atomics, the CPU's order, the same bits). An id out of range
//! sets `err` (may be left out) instead of being used as an index. CPU counterparts:
//! `backend/cpu/kernels/embedding.rs`.

use super::elementwise as ew;
use super::{block_rows, kernel_name, opt, Arg, Device, Launch};
use crate::exec::gpu::kernel::{GpuKernel, NodeCx};
use crate::exec::gpu::support::GpuSupport;
use crate::exec::gpu::support::ROW_BLOCK;
use crate::exec::gpu::{Call, Resolver};
use crate::graph::op;
use crate::graph::op::Embedding;
use crate::graph::{ElemType, Graph};
use crate::plan::PlanError;
use crate::DType;

/// `embedding_forward_<T>`: out[r, :] = table[ids[r], :].
// out: (n, c) T; err: (1) i32 or none; ids: (n) i64; table: (v, c) T
pub struct EmbeddingForward<P> {
    pub dtype: DType,
    pub out: P,
    pub err: Option<P>,
    pub ids: P,
    pub table: P,
    pub n: usize,
    pub c: usize,
    pub v: usize,
}

impl<P> EmbeddingForward<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        block_rows(
            kernel_name("embedding_forward", self.dtype),
            self.n,
            dev,
            vec![
                Arg::Ptr(self.out),
                opt(self.err),
                Arg::Ptr(self.ids),
                Arg::Ptr(self.table),
                Arg::I64(self.n as i64),
                Arg::I32(self.c as i32),
                Arg::I64(self.v as i64),
            ],
        )
    }
}

/// `embedding_backward_<T>` (T: dout's dtype): dtable[i, :] = Σ_{r: ids[r] = i} dout[r, :] in
/// row order, f32, every row written (0 where no id names it).
// dtable: (v, c) f32; err: (1) i32 or none; ids: (n) i64; dout: (n, c) T
pub struct EmbeddingBackward<P> {
    pub dtype: DType,
    pub dtable: P,
    pub err: Option<P>,
    pub ids: P,
    pub dout: P,
    pub n: usize,
    pub c: usize,
    pub v: usize,
}

impl<P> EmbeddingBackward<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        let col_blocks = self.c.div_ceil(ROW_BLOCK as usize);
        // Residue classes of ids: enough blocks to fill the device, each walking all ids (at
        // most 64 walks, at most one class per table row).
        let parts = (dev.max_blocks as usize / col_blocks).clamp(1, 64).min(self.v);
        Launch {
            name: kernel_name("embedding_backward", self.dtype),
            grid: (col_blocks * parts) as u32,
            block: ROW_BLOCK,
            smem: 0,
            args: vec![
                Arg::Ptr(self.dtable),
                opt(self.err),
                Arg::Ptr(self.ids),
                Arg::Ptr(self.dout),
                Arg::I64(self.n as i64),
                Arg::I32(self.c as i32),
                Arg::I64(self.v as i64),
            ],
        }
    }
}

impl GpuKernel for Embedding {
    fn launches(&self, r: &mut Resolver<'_>, cx: &NodeCx<'_>) -> Result<Vec<Call>, PlanError> {
        let g = cx.g;
        let ins = &cx.node.inputs;
        let outs = &cx.node.outputs;
        let calls = {
            cx.same(&[outs[0], ins[0]])?;
            let (v, c) = (g.shape(ins[0])[0], g.shape(ins[0])[1]);
            let (dtype, ids, table, n) = (cx.dt(outs[0]), cx.inp(1), cx.inp(0), cx.n(ins[1]));
            let l =
                EmbeddingForward { dtype, out: cx.out(0), err: Some(cx.err), ids, table, n, c, v };
            vec![l.launch(r.device()).into()]
        };
        Ok(calls)
    }
}

impl GpuKernel for op::EmbeddingBackward {
    // The scatter-add writes f32; a half output that is not a parameter's gradient (a tied
    // table's part) is cast from this f32 copy.
    fn workspace(&self, _sup: &GpuSupport, g: &Graph, node: usize) -> usize {
        let o = g.nodes()[node].outputs[0];
        let half = matches!(g.tensor(o).elem, ElemType::Float(d) if d != DType::F32);
        let is_grad = (0..g.params().len()).any(|i| g.param_grad(i) == Some(o));
        if half && !is_grad {
            g.tensor(o).numel()
        } else {
            0
        }
    }

    fn launches(&self, r: &mut Resolver<'_>, cx: &NodeCx<'_>) -> Result<Vec<Call>, PlanError> {
        let g = cx.g;
        let ins = &cx.node.inputs;
        let outs = &cx.node.outputs;
        let calls = {
            let (o, dout) = (outs[0], ins[1]);
            let (v, c) = (g.shape(o)[0], g.shape(o)[1]);
            // The scatter writes f32: into the output if it is stored so, else into the
            // workspace and then cast (a half part of a tied table's gradient).
            let target = if cx.dt(o) == DType::F32 {
                cx.out(0)
            } else {
                cx.ws.ok_or_else(|| cx.no(" without its f32 workspace"))?
            };
            let (dtype, ids, dout, n_) = (cx.dt(dout), cx.inp(0), cx.inp(1), cx.n(ins[0]));
            let l = EmbeddingBackward {
                dtype,
                dtable: target,
                err: Some(cx.err),
                ids,
                dout,
                n: n_,
                c,
                v,
            };
            let mut v_ = vec![l.launch(r.device()).into()];
            if cx.dt(o) != DType::F32 {
                let (from, to, n) = (DType::F32, cx.dt(o), cx.n(o));
                let cast = ew::Cast { from, to, out: cx.out(0), x: target, n };
                v_.push(cast.launch(r.device()).into());
            }
            v_
        };
        Ok(calls)
    }
}
