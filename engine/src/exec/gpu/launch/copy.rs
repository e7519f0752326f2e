//! Launchers of `engine/kernels/copy.cu`: strided copies and fills, grid-stride (the views the
//! plan could not fold: reshape, permute, split, concat; a fill into a strided place). Shapes
//! and strides come in a small i64 array, `meta` — its layout is [`copy_meta`] /
//! [`fill_meta`] —, addressed like an operand (a device array the executor uploads once, a
//! host buffer in the tests). CPU counterpart: `backend/cpu/kernels/copy.rs`.

use super::{grid_stride, kernel_name, opt, Arg, Device, Launch};
use crate::exec::gpu::kernel::{GpuKernel, NodeCx};

use crate::exec::gpu::{Call, Resolver};
use crate::graph::op::{Concat, Permute, Reshape, Split};
use crate::graph::Op;
use crate::plan::PlanError;
use crate::DType;

/// `copy_strided_<T>`'s meta: [src_rank, dst_rank, src shape, src strides, dst shape, dst
/// strides] (elements).
pub fn copy_meta(ss: &[usize], st: &[usize], ds: &[usize], dt: &[usize]) -> Vec<i64> {
    let mut m = vec![ss.len() as i64, ds.len() as i64];
    m.extend(ss.iter().chain(st).chain(ds).chain(dt).map(|&v| v as i64));
    m
}

/// `fill_strided_<T>`'s meta: [rank, shape, strides] (elements).
pub fn fill_meta(shape: &[usize], strides: &[usize]) -> Vec<i64> {
    let mut m = vec![shape.len() as i64];
    m.extend(shape.iter().chain(strides).map(|&v| v as i64));
    m
}

/// `copy_strided_<T>`: dst ← src element by element in row-major order of each shape.
// dst, src: n elements, strided as `meta` ([`copy_meta`]) says
pub struct CopyStrided<P> {
    pub dtype: DType,
    pub dst: P,
    pub src: P,
    pub n: usize,
    pub meta: P,
}

impl<P> CopyStrided<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        grid_stride(
            kernel_name("copy_strided", self.dtype),
            self.n,
            dev,
            vec![
                Arg::Ptr(self.dst),
                Arg::Ptr(self.src),
                Arg::I64(self.n as i64),
                Arg::Ptr(self.meta),
            ],
        )
    }
}

/// `fill_strided_<T>`: every element of the strided dst = value, or value × the loss scale of
/// the step block `scaled_by` (the backward's seed in a strided place).
// dst: n elements, strided as `meta` ([`fill_meta`]) says
pub struct FillStrided<P> {
    pub dtype: DType,
    pub dst: P,
    pub n: usize,
    pub meta: P,
    pub value: f32,
    pub scaled_by: Option<P>,
}

impl<P> FillStrided<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        grid_stride(
            kernel_name("fill_strided", self.dtype),
            self.n,
            dev,
            vec![
                Arg::Ptr(self.dst),
                Arg::I64(self.n as i64),
                Arg::Ptr(self.meta),
                Arg::F32(self.value),
                opt(self.scaled_by),
            ],
        )
    }
}

impl GpuKernel for Reshape {
    fn launches(&self, r: &mut Resolver<'_>, cx: &NodeCx<'_>) -> Result<Vec<Call>, PlanError> {
        let g = cx.g;
        let ins = &cx.node.inputs;
        let outs = &cx.node.outputs;
        let calls = {
            // Materialised (the plan could not fold it): a strided copy.
            let (x, o) = (ins[0], outs[0]);
            cx.same(&[x, o])?;
            let xs = g.shape(x).to_vec();
            let (ss, st) = match &cx.node.op {
                Op::Permute(Permute { perm }) => (
                    perm.iter().map(|&p| xs[p]).collect::<Vec<_>>(),
                    perm.iter().map(|&p| r.strides(x)[p]).collect::<Vec<_>>(),
                ),
                // Op::Reshape, the arm's other op: the input as it is.
                _ => (xs, r.strides(x).to_vec()),
            };
            let (ds, dst) = (g.shape(o).to_vec(), r.strides(o).to_vec());
            let meta = r.copy_meta(&ss, &st, &ds, &dst);
            let copy =
                CopyStrided { dtype: cx.dt(o), dst: cx.out(0), src: cx.inp(0), n: cx.n(o), meta };
            vec![copy.launch(r.device()).into()]
        };
        Ok(calls)
    }
}

impl GpuKernel for Permute {
    // A materialised permute is the reshape's strided copy with permuted source strides.
    fn launches(&self, r: &mut Resolver<'_>, cx: &NodeCx<'_>) -> Result<Vec<Call>, PlanError> {
        Reshape.launches(r, cx)
    }
}

impl GpuKernel for Split {
    fn launches(&self, r: &mut Resolver<'_>, cx: &NodeCx<'_>) -> Result<Vec<Call>, PlanError> {
        let Split { sizes } = self;
        let g = cx.g;
        let ins = &cx.node.inputs;
        let outs = &cx.node.outputs;
        let calls = {
            let x = ins[0];
            let xst = r.strides(x).to_vec();
            let ls = *xst.last().unwrap_or(&0) as u64;
            let mut start = 0u64;
            let mut v = Vec::new();
            for (k, (&o, &sz)) in outs.iter().zip(sizes).enumerate() {
                cx.same(&[x, o])?;
                let os = g.shape(o).to_vec();
                let ost = r.strides(o).to_vec();
                let meta = r.copy_meta(&os, &xst, &os, &ost);
                let src = cx.inp(0) + cx.es(x) * start * ls;
                let copy = CopyStrided { dtype: cx.dt(o), dst: cx.out(k), src, n: cx.n(o), meta };
                v.push(copy.launch(r.device()).into());
                start += sz as u64;
            }
            v
        };
        Ok(calls)
    }
}

impl GpuKernel for Concat {
    fn launches(&self, r: &mut Resolver<'_>, cx: &NodeCx<'_>) -> Result<Vec<Call>, PlanError> {
        let g = cx.g;
        let ins = &cx.node.inputs;
        let outs = &cx.node.outputs;
        let calls = {
            let o = outs[0];
            let ost = r.strides(o).to_vec();
            let ls = *ost.last().unwrap_or(&0) as u64;
            let mut start = 0u64;
            let mut v = Vec::new();
            for (k, &x) in ins.iter().enumerate() {
                cx.same(&[x, o])?;
                let xs = g.shape(x).to_vec();
                let xst = r.strides(x).to_vec();
                let meta = r.copy_meta(&xs, &xst, &xs, &ost);
                let dst = cx.out(0) + cx.es(o) * start * ls;
                let copy = CopyStrided { dtype: cx.dt(o), dst, src: cx.inp(k), n: cx.n(x), meta };
                v.push(copy.launch(r.device()).into());
                start += cx.last(x) as u64;
            }
            v
        };
        Ok(calls)
    }
}
