//! Launchers of `engine/kernels/cross_entropy.cu`: softmax cross-entropy over the last dim with
//! int64 labels and an ignore index, in four launches without atomics — forward: per-row
//! losses (one block per row), then their mean (one block); backward: the count of labelled
//! rows (one block), then dlogits (one block per row). A label out of range sets `err` (may be
//! left out) and gives NaN instead of an out-of-bounds read. CPU counterparts:
//! `backend/cpu/kernels/cross_entropy.rs`.

use super::{block_rows, kernel_name, one_block, opt, Arg, Device, Launch};
use crate::exec::gpu::kernel::{GpuKernel, NodeCx};
use crate::exec::gpu::support::GpuSupport;
use crate::graph::Graph;

use crate::exec::gpu::{Call, Resolver};
use crate::graph::op;
use crate::graph::op::CrossEntropy;
use crate::plan::PlanError;
use crate::DType;

/// `cross_entropy_forward_<T>`: losses[r] = lse(logits[r]) − logits[r, labels[r]], 0 where the
/// label is `ignore_index`.
// losses: (rows) f32; err: (1) i32 or none; logits: (rows, v) T; labels: (rows) i64
pub struct CrossEntropyForward<P> {
    pub dtype: DType,
    pub losses: P,
    pub err: Option<P>,
    pub logits: P,
    pub labels: P,
    pub rows: usize,
    pub v: usize,
    pub ignore_index: i64,
}

impl<P> CrossEntropyForward<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        block_rows(
            kernel_name("cross_entropy_forward", self.dtype),
            self.rows,
            dev,
            vec![
                Arg::Ptr(self.losses),
                opt(self.err),
                Arg::Ptr(self.logits),
                Arg::Ptr(self.labels),
                Arg::I64(self.rows as i64),
                Arg::I32(self.v as i32),
                Arg::I64(self.ignore_index),
            ],
        )
    }
}

/// `cross_entropy_mean`: loss = Σ losses / (the number of labels ≠ ignore_index), in a fixed
/// order (NaN when every row is ignored).
// loss: (1) f32; losses: (rows) f32; labels: (rows) i64
pub struct CrossEntropyMean<P> {
    pub loss: P,
    pub losses: P,
    pub labels: P,
    pub rows: usize,
    pub ignore_index: i64,
}

impl<P> CrossEntropyMean<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        one_block(
            "cross_entropy_mean".into(),
            dev,
            vec![
                Arg::Ptr(self.loss),
                Arg::Ptr(self.losses),
                Arg::Ptr(self.labels),
                Arg::I64(self.rows as i64),
                Arg::I64(self.ignore_index),
            ],
        )
    }
}

/// `cross_entropy_count`: the number of labels ≠ ignore_index, the backward's divisor.
// count: (1) f32; labels: (rows) i64
pub struct CrossEntropyCount<P> {
    pub count: P,
    pub labels: P,
    pub rows: usize,
    pub ignore_index: i64,
}

impl<P> CrossEntropyCount<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        one_block(
            "cross_entropy_count".into(),
            dev,
            vec![
                Arg::Ptr(self.count),
                Arg::Ptr(self.labels),
                Arg::I64(self.rows as i64),
                Arg::I64(self.ignore_index),
            ],
        )
    }
}

/// `cross_entropy_backward_<T>`: dlogits = dloss/count·(softmax(logits) − onehot(label)) per
/// row, 0 over an ignored row; dlogits may be logits.
// dlogits, logits: (rows, v) T; err: (1) i32 or none; labels: (rows) i64; dloss: (1) f32;
// count: (1) f32 from cross_entropy_count
pub struct CrossEntropyBackward<P> {
    pub dtype: DType,
    pub dlogits: P,
    pub err: Option<P>,
    pub logits: P,
    pub labels: P,
    pub dloss: P,
    pub count: P,
    pub rows: usize,
    pub v: usize,
    pub ignore_index: i64,
}

impl<P> CrossEntropyBackward<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        block_rows(
            kernel_name("cross_entropy_backward", self.dtype),
            self.rows,
            dev,
            vec![
                Arg::Ptr(self.dlogits),
                opt(self.err),
                Arg::Ptr(self.logits),
                Arg::Ptr(self.labels),
                Arg::Ptr(self.dloss),
                Arg::Ptr(self.count),
                Arg::I64(self.rows as i64),
                Arg::I32(self.v as i32),
                Arg::I64(self.ignore_index),
            ],
        )
    }
}

impl GpuKernel for CrossEntropy {
    // Per-row losses.
    fn workspace(&self, _sup: &GpuSupport, g: &Graph, node: usize) -> usize {
        g.tensor(g.nodes()[node].inputs[1]).numel()
    }

    fn launches(&self, r: &mut Resolver<'_>, cx: &NodeCx<'_>) -> Result<Vec<Call>, PlanError> {
        let CrossEntropy { ignore_index } = self;
        let ins = &cx.node.inputs;
        let calls = {
            let v = cx.last(ins[0]);
            let rows = cx.n(ins[0]) / v;
            // Per-row losses in the workspace, then their mean into the loss.
            let (losses, logits, labels, ignore_index) =
                (cx.ws_at(), cx.inp(0), cx.inp(1), *ignore_index);
            let (dtype, dev) = (cx.dt(ins[0]), r.device());
            let fwd = CrossEntropyForward {
                dtype,
                losses,
                err: Some(cx.err),
                logits,
                labels,
                rows,
                v,
                ignore_index,
            };
            let mean = CrossEntropyMean { loss: cx.out(0), losses, labels, rows, ignore_index };
            vec![fwd.launch(dev).into(), mean.launch(dev).into()]
        };
        Ok(calls)
    }
}

impl GpuKernel for op::CrossEntropyBackward {
    // The count of labelled rows.
    fn workspace(&self, _sup: &GpuSupport, _g: &Graph, _node: usize) -> usize {
        1
    }

    fn launches(&self, r: &mut Resolver<'_>, cx: &NodeCx<'_>) -> Result<Vec<Call>, PlanError> {
        let op::CrossEntropyBackward { ignore_index } = self;
        let ins = &cx.node.inputs;
        let outs = &cx.node.outputs;
        let calls = {
            cx.same(&[outs[0], ins[1]])?;
            if cx.dt(ins[0]) != DType::F32 {
                return Err(cx.no(" for a non-f32 loss gradient"));
            }
            let v = cx.last(ins[1]);
            let rows = cx.n(ins[1]) / v;
            // The count of labelled rows in the workspace, then dlogits dividing by it.
            let (count, labels, ignore_index) = (cx.ws_at(), cx.inp(2), *ignore_index);
            let o = if cx.inplace.is_some() { cx.inp(1) } else { cx.out(0) };
            let (dtype, dev) = (cx.dt(outs[0]), r.device());
            let cnt = CrossEntropyCount { count, labels, rows, ignore_index };
            let bwd = CrossEntropyBackward {
                dtype,
                dlogits: o,
                err: Some(cx.err),
                logits: cx.inp(1),
                labels,
                dloss: cx.inp(0),
                count,
                rows,
                v,
                ignore_index,
            };
            vec![cnt.launch(dev).into(), bwd.launch(dev).into()]
        };
        Ok(calls)
    }
}
