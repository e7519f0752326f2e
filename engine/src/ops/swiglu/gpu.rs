//! SwiGLU's GPU launchers, of `engine/kernels/swiglu.cu`: one thread per element, grid-stride,
//! f32 arithmetic over storage type `dtype`, every operand rows of `w` at the plan's strides
//! (up to three leading dims, `launch::rows`). CPU counterparts: [`super::cpu`].

use super::{backward_slot as bs, slot, SwiGlu, SwiGluBackward};
use crate::exec::gpu::kernel::{GpuKernel, NodeCx};
use crate::exec::gpu::launch::rows::{rows_of, Rows3};
use crate::exec::gpu::launch::{grid_stride, kernel_name, Arg, Device, Launch};
use crate::exec::gpu::{Call, Resolver};
use crate::plan::PlanError;
use crate::DType;

/// The arguments every SwiGLU kernel takes after its pointers: elements, row width, n1, n2 and
/// each operand's three strides; returns the elements.
fn tail<P, const K: usize>(args: &mut Vec<Arg<P>>, (lead, strides): Rows3<K>, w: usize) -> usize {
    let n = lead.iter().product::<usize>() * w;
    let (n1, n2) = (lead[1] as i64, lead[2] as i64);
    args.extend([Arg::I64(n as i64), Arg::I64(w as i64), Arg::I64(n1), Arg::I64(n2)]);
    args.extend(strides.iter().flatten().map(|&s| Arg::I64(s)));
    n
}

/// One row of every element: the form the kernels index without a division (every operand
/// dense; `w` is then all the elements).
pub fn one_row<const K: usize>() -> Rows3<K> {
    ([1, 1, 1], [[0; 3]; K])
}

/// `rows` of `w` as the launch gives them: [`one_row`] of rows·w when every operand is dense
/// (rows `w` apart), else as they are.
fn fold_dense<const K: usize>((lead, strides): Rows3<K>, w: usize) -> (Rows3<K>, usize) {
    if lead[..2] == [1, 1] && strides.iter().all(|s| *s == [0, 0, w as i64]) {
        (one_row(), lead[2] * w)
    } else {
        ((lead, strides), w)
    }
}

/// `swiglu_forward_<T>`: h = silu(gate)·up; h may be gate or up.
// h, gate, up: rows × w at `rows`' strides (h, gate, up)
pub struct Forward<P> {
    pub dtype: DType,
    pub h: P,
    pub gate: P,
    pub up: P,
    pub rows: Rows3<3>,
    pub w: usize,
}

impl<P> Forward<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        let mut args = vec![Arg::Ptr(self.h), Arg::Ptr(self.gate), Arg::Ptr(self.up)];
        let n = tail(&mut args, self.rows, self.w);
        grid_stride(kernel_name("swiglu_forward", self.dtype), n, dev, args)
    }
}

/// `swiglu_backward_<T>`: dgate = (dh·up)·silu'(gate), dup = dh·silu(gate); dgate may be dh.
// dgate, dup, dh, gate, up: rows × w at `rows`' strides (in that order)
pub struct Backward<P> {
    pub dtype: DType,
    pub dgate: P,
    pub dup: P,
    pub dh: P,
    pub gate: P,
    pub up: P,
    pub rows: Rows3<5>,
    pub w: usize,
}

impl<P> Backward<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        let mut args = vec![
            Arg::Ptr(self.dgate),
            Arg::Ptr(self.dup),
            Arg::Ptr(self.dh),
            Arg::Ptr(self.gate),
            Arg::Ptr(self.up),
        ];
        let n = tail(&mut args, self.rows, self.w);
        grid_stride(kernel_name("swiglu_backward", self.dtype), n, dev, args)
    }
}

impl GpuKernel for SwiGlu {
    // (gate, up) → h, rows of I at the plan's strides
    fn launches(&self, r: &mut Resolver<'_>, cx: &NodeCx<'_>) -> Result<Vec<Call>, PlanError> {
        let (ins, outs) = (&cx.node.inputs, &cx.node.outputs);
        cx.same(&[outs[0], ins[slot::GATE], ins[slot::UP]])?;
        let (h, ht) = match cx.inplace {
            Some(k) => (cx.inp(k), ins[k]),
            None => (cx.out(0), outs[0]),
        };
        let (gate, up) = (cx.inp(slot::GATE), cx.inp(slot::UP));
        let rows = rows_of(r, cx, [ht, ins[slot::GATE], ins[slot::UP]])?;
        let (rows, w) = fold_dense(rows, cx.last(outs[0]));
        let l = Forward { dtype: cx.dt(outs[0]), h, gate, up, rows, w };
        Ok(vec![l.launch(r.device()).into()])
    }
}

impl GpuKernel for SwiGluBackward {
    // (dh, gate, up) → (dgate, dup), rows of I at the plan's strides
    fn launches(&self, r: &mut Resolver<'_>, cx: &NodeCx<'_>) -> Result<Vec<Call>, PlanError> {
        let (ins, outs) = (&cx.node.inputs, &cx.node.outputs);
        cx.same(&[outs[0], outs[1], ins[bs::DH], ins[bs::GATE], ins[bs::UP]])?;
        let (dgate, dgt) = match cx.inplace {
            Some(_) => (cx.inp(bs::DH), ins[bs::DH]),
            None => (cx.out(0), outs[0]),
        };
        let (dh, gate, up) = (cx.inp(bs::DH), cx.inp(bs::GATE), cx.inp(bs::UP));
        let rows = rows_of(r, cx, [dgt, outs[1], ins[bs::DH], ins[bs::GATE], ins[bs::UP]])?;
        let (rows, w) = fold_dense(rows, cx.last(outs[0]));
        let l = Backward { dtype: cx.dt(outs[0]), dgate, dup: cx.out(1), dh, gate, up, rows, w };
        Ok(vec![l.launch(r.device()).into()])
    }
}
