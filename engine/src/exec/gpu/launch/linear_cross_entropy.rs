//! Launchers of `engine/kernels/linear_cross_entropy.cu`: the steps between the linear
//! cross-entropy's GEMMs — the labelled rows compacted on the device (one block), then per
//! chunk of compacted positions the gather of x's rows, the logits rows' pass (bias, lse, loss,
//! g·softmax − g·onehot in place), the scatter of dx rows and dbias's column sums. The loss is
//! cross_entropy.cu's `cross_entropy_mean` over the per-position losses. Positions at or past
//! the labelled count (which the host never reads) are zero rows. CPU counterpart:
//! `backend/cpu/kernels/linear_cross_entropy.rs`.

use super::cross_entropy as ce;
use super::elementwise as ew;
use super::{block_rows, grid_stride, kernel_name, one_block, opt, Arg, Device, Launch};
use crate::exec::gpu::kernel::{GpuKernel, NodeCx};
use crate::exec::gpu::support::GpuSupport;
use crate::exec::gpu::{Call, Resolver};
use crate::graph::op::{LinearCrossEntropy, LinearCrossEntropyBackward};
use crate::graph::Op;
use crate::graph::{Graph, Node, TensorId};
use crate::ops::linear_cross_entropy::SoftCap;
use crate::plan::PlanError;
use crate::DType;

/// `lce_compact`: idx[0 .. count) = the rows whose label is not `ignore_index`, in row order,
/// count[0] = how many (f32); a label outside [0, v) sets `err`.
// idx: (rows) i32; count: (1) f32; err: (1) i32 or none; labels: (rows) i64
pub struct LceCompact<P> {
    pub idx: P,
    pub count: P,
    pub err: Option<P>,
    pub labels: P,
    pub rows: usize,
    pub v: usize,
    pub ignore_index: i64,
}

impl<P> LceCompact<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        one_block(
            "lce_compact".into(),
            dev,
            vec![
                Arg::Ptr(self.idx),
                Arg::Ptr(self.count),
                opt(self.err),
                Arg::Ptr(self.labels),
                Arg::I64(self.rows as i64),
                Arg::I32(self.v as i32),
                Arg::I64(self.ignore_index),
            ],
        )
    }
}

/// `lce_gather_<T>`: xs[s] = x[idx[start + s]] for the chunk's k positions, zero rows past the
/// labelled count.
// xs: (k, c) T; x: (rows, c) T; idx: (rows) i32; count: (1) f32
pub struct LceGather<P> {
    pub dtype: DType,
    pub xs: P,
    pub x: P,
    pub idx: P,
    pub count: P,
    pub start: usize,
    pub k: usize,
    pub c: usize,
}

impl<P> LceGather<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        grid_stride(
            kernel_name("lce_gather", self.dtype),
            self.k * self.c,
            dev,
            vec![
                Arg::Ptr(self.xs),
                Arg::Ptr(self.x),
                Arg::Ptr(self.idx),
                Arg::Ptr(self.count),
                Arg::I64(self.start as i64),
                Arg::I32(self.k as i32),
                Arg::I32(self.c as i32),
            ],
        )
    }
}

/// `lce_rows_<T>`: per chunk row (position start + s): bias added, soft-capped when `softcap`
/// is given, losses[start + s] = lse − z[label]; with `dloss`, the row overwritten by
/// g·softmax − g·onehot (g = dloss/count; times the soft-cap's derivative), copied to `g16` in
/// T when given. Zero rows and losses past the labelled count.
// logits: (k, v) f32; g16: (k, v) T or none; losses: (rows) f32; err: (1) i32 or none;
// labels: (rows) i64; idx: (rows) i32; count: (1) f32; bias: (v) T or none; dloss: (1) f32 or
// none (the forward)
pub struct LceRows<P> {
    pub dtype: DType,
    pub logits: P,
    pub g16: Option<P>,
    pub losses: P,
    pub err: Option<P>,
    pub labels: P,
    pub idx: P,
    pub count: P,
    pub bias: Option<P>,
    pub dloss: Option<P>,
    pub start: usize,
    pub k: usize,
    pub v: usize,
    pub ignore_index: i64,
    pub softcap: Option<SoftCap>,
}

impl<P> LceRows<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        block_rows(
            kernel_name("lce_rows", self.dtype),
            self.k,
            dev,
            vec![
                Arg::Ptr(self.logits),
                opt(self.g16),
                Arg::Ptr(self.losses),
                opt(self.err),
                Arg::Ptr(self.labels),
                Arg::Ptr(self.idx),
                Arg::Ptr(self.count),
                opt(self.bias),
                opt(self.dloss),
                Arg::I64(self.start as i64),
                Arg::I32(self.k as i32),
                Arg::I32(self.v as i32),
                Arg::I64(self.ignore_index),
                // (inv, cap); cap 0 is no soft-cap.
                Arg::F32(self.softcap.map_or(0.0, |s| s.inv)),
                Arg::F32(self.softcap.map_or(0.0, |s| s.cap)),
            ],
        )
    }
}

/// `lce_scatter_<T>`: dx[idx[start + s]] = dxs[s] for the chunk's positions below the
/// labelled count (dx's other rows are zeroed before the chunks).
// dx: (rows, c) T; dxs: (k, c) f32; idx: (rows) i32; count: (1) f32
pub struct LceScatter<P> {
    pub dtype: DType,
    pub dx: P,
    pub dxs: P,
    pub idx: P,
    pub count: P,
    pub start: usize,
    pub k: usize,
    pub c: usize,
}

impl<P> LceScatter<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        grid_stride(
            kernel_name("lce_scatter", self.dtype),
            self.k * self.c,
            dev,
            vec![
                Arg::Ptr(self.dx),
                Arg::Ptr(self.dxs),
                Arg::Ptr(self.idx),
                Arg::Ptr(self.count),
                Arg::I64(self.start as i64),
                Arg::I32(self.k as i32),
                Arg::I32(self.c as i32),
            ],
        )
    }
}

/// `lce_column_sum`: db[j] = (db[j] if `accumulate`, else 0) + Σ_s g[s, j], rows in order.
// db: (v) f32; g: (k, v) f32
pub struct LceColumnSum<P> {
    pub db: P,
    pub g: P,
    pub k: usize,
    pub v: usize,
    pub accumulate: bool,
}

impl<P> LceColumnSum<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        grid_stride(
            "lce_column_sum".into(),
            self.v,
            dev,
            vec![
                Arg::Ptr(self.db),
                Arg::Ptr(self.g),
                Arg::I32(self.k as i32),
                Arg::I32(self.v as i32),
                Arg::I32(i32::from(self.accumulate)),
            ],
        )
    }
}

impl GpuKernel for LinearCrossEntropy {
    fn check(&self, sup: &GpuSupport, g: &Graph, n: &Node) -> Result<(), String> {
        lce_check(sup, g, n)
    }

    fn workspace(&self, sup: &GpuSupport, g: &Graph, node: usize) -> usize {
        sup.lce_workspace(g, node).len
    }

    fn launches(&self, r: &mut Resolver<'_>, cx: &NodeCx<'_>) -> Result<Vec<Call>, PlanError> {
        let LinearCrossEntropy { ignore_index, softcap } = self;
        let g = cx.g;
        let ins = &cx.node.inputs;
        let outs = &cx.node.outputs;
        let calls = {
            {
                // linear_cross_entropy.cu's launches around three GEMMs per chunk (see there):
                // the labelled rows compacted on the device, then ⌈rows / k⌉ chunks of their
                // positions (those past the count are zero rows), then the mean.
                let bwd = matches!(cx.node.op, Op::LinearCrossEntropyBackward(_));
                let at = usize::from(bwd);
                let (x, w) = (ins[at], ins[at + 1]);
                let (v, c) = (g.shape(w)[0], g.shape(w)[1]);
                let rows = cx.n(ins[at + 2]);
                let lw = r.sup.lce_workspace(g, cx.i);
                let base = cx.ws_at();
                let wa = |o: usize| base + 4 * o as u64;
                let t = cx.dt(x);
                let (idx, count, losses, logits, xs) =
                    (wa(lw.idx), wa(lw.count), wa(lw.losses), wa(lw.logits), wa(lw.xs));
                let (xp, wp, labels, ignore_index) =
                    (cx.inp(at), cx.inp(at + 1), cx.inp(at + 2), *ignore_index);
                let bias = ins.get(at + 3).map(|_| cx.inp(at + 3));
                let dev = r.device();
                let compact =
                    LceCompact { idx, count, err: Some(cx.err), labels, rows, v, ignore_index };
                let mut calls: Vec<Call> = vec![compact.launch(dev).into()];
                // Gradient targets: dw and dbias accumulate in f32, in their outputs when
                // stored so (parameters' gradients), else in the workspace and cast at the end.
                let dw = lw.dw.map_or_else(|| if bwd { cx.out(2) } else { 0 }, wa);
                let db =
                    if outs.len() > 3 { Some(lw.db.map_or_else(|| cx.out(3), wa)) } else { None };
                if bwd {
                    let (dtype, n) = (cx.dt(outs[1]), cx.n(outs[1]));
                    let zero = ew::Fill { dtype, out: cx.out(1), n, value: 0.0, scaled_by: None };
                    calls.push(zero.launch(dev).into());
                }
                // f32 GEMMs read g in place in the logits; half ones its copy in T.
                let gp = lw.g16.map_or(logits, wa);
                for (ci, start) in (0..rows).step_by(lw.k).enumerate() {
                    let k = lw.k.min(rows - start);
                    let gather = LceGather { dtype: t, xs, x: xp, idx, count, start, k, c };
                    calls.push(gather.launch(dev).into());
                    // logits (k, V) = xs (k, C) · wᵀ
                    calls.push(r.gemm2(
                        t,
                        (false, true),
                        (k, v, c),
                        (c, c, v),
                        (xs, wp, logits),
                        false,
                    ));
                    let rows_pass = LceRows {
                        dtype: t,
                        logits,
                        g16: lw.g16.map(wa),
                        losses,
                        err: Some(cx.err),
                        labels,
                        idx,
                        count,
                        bias,
                        dloss: bwd.then(|| cx.inp(0)),
                        start,
                        k,
                        v,
                        ignore_index,
                        softcap: *softcap,
                    };
                    calls.push(rows_pass.launch(dev).into());
                    if !bwd {
                        continue;
                    }
                    // dx rows (k, C) = g (k, V) · w (V, C), scattered to their rows.
                    let dxs = wa(lw.dxs.expect("the backward's workspace has dx rows"));
                    calls.push(r.gemm2(
                        t,
                        (false, false),
                        (k, c, v),
                        (v, c, c),
                        (gp, wp, dxs),
                        false,
                    ));
                    let scatter = LceScatter {
                        dtype: cx.dt(outs[1]),
                        dx: cx.out(1),
                        dxs,
                        idx,
                        count,
                        start,
                        k,
                        c,
                    };
                    calls.push(scatter.launch(dev).into());
                    // dw (V, C) (+)= gᵀ (V, k) · xs (k, C): β = 1 after the first chunk.
                    calls.push(r.gemm2(
                        t,
                        (true, false),
                        (v, c, k),
                        (v, c, c),
                        (gp, xs, dw),
                        ci > 0,
                    ));
                    if let Some(db) = db {
                        let sum = LceColumnSum { db, g: logits, k, v, accumulate: ci > 0 };
                        calls.push(sum.launch(dev).into());
                    }
                }
                let mean =
                    ce::CrossEntropyMean { loss: cx.out(0), losses, labels, rows, ignore_index };
                calls.push(mean.launch(dev).into());
                for (acc, o) in [(lw.dw, 2), (lw.db, 3)] {
                    if let (Some(a), true) = (acc, bwd) {
                        let cast = ew::Cast {
                            from: DType::F32,
                            to: cx.dt(outs[o]),
                            out: cx.out(o),
                            x: wa(a),
                            n: cx.n(outs[o]),
                        };
                        calls.push(cast.launch(dev).into());
                    }
                }
                calls
            }
            // The passes fuse GELU into its linear layer; `GpuSupport::check` refuses the rest.
        };
        Ok(calls)
    }
}

impl GpuKernel for LinearCrossEntropyBackward {
    fn check(&self, sup: &GpuSupport, g: &Graph, n: &Node) -> Result<(), String> {
        lce_check(sup, g, n)
    }

    fn workspace(&self, sup: &GpuSupport, g: &Graph, node: usize) -> usize {
        sup.lce_workspace(g, node).len
    }

    // One binding for both directions: it reads which from the node.
    fn launches(&self, r: &mut Resolver<'_>, cx: &NodeCx<'_>) -> Result<Vec<Call>, PlanError> {
        LinearCrossEntropy { ignore_index: self.ignore_index, softcap: self.softcap }
            .launches(r, cx)
    }
}

/// One storage type for x, w and the bias (the GEMMs' operands and the row kernel's bias are
/// one T), an f32 loss gradient, and fewer than 2^24 rows (row indices are i32 and the
/// labelled count f32).
fn lce_check(sup: &GpuSupport, g: &Graph, n: &Node) -> Result<(), String> {
    let at = usize::from(matches!(n.op, Op::LinearCrossEntropyBackward(_)));
    let d = |t: TensorId| sup.dtypes[t.index()];
    let (x, w) = (n.inputs[at], n.inputs[at + 1]);
    if d(w) != d(x) || n.inputs.get(at + 3).is_some_and(|&b| d(b) != d(x)) {
        return Err(" for x, w and bias stored in different dtypes".into());
    }
    if at == 1 && d(n.inputs[0]) != DType::F32 {
        return Err(" for a non-f32 loss gradient".into());
    }
    if g.tensor(n.inputs[at + 2]).numel() >= 1 << 24 {
        return Err(" for 2^24 rows or more".into());
    }
    Ok(())
}
