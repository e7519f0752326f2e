//! Launchers of `engine/kernels/elementwise.cu`: one thread per element, grid-stride, f32
//! arithmetic over storage type `dtype`. Operands are flat: (n) elements, a broadcast operand
//! (nb) with nb dividing n. CPU counterparts: `backend/cpu/kernels/elementwise.rs`.

use super::copy;
pub use super::Seed;
use super::{grid_stride, kernel_name, opt, Arg, Device, Launch};
use crate::exec::gpu::contiguous;
use crate::exec::gpu::kernel::{GpuKernel, NodeCx};
use crate::exec::gpu::{Call, Resolver};
use crate::graph::op;
use crate::graph::op::{BiasAdd, Tanh};
use crate::graph::Op;
use crate::graph::TensorKind;
use crate::graph::{Graph, Node};
use crate::ops::gelu::GeluApprox;
use crate::plan::PlanError;
use crate::DType;

/// The GELU variant as the kernels take it: 0 = erf (exact), 1 = tanh.
fn approx<P>(a: GeluApprox) -> Arg<P> {
    Arg::I32(match a {
        GeluApprox::Erf => 0,
        GeluApprox::Tanh => 1,
    })
}

/// `fill_<T>`: out[i] = value, or value × the loss scale of the step block `scaled_by` (the
/// backward's seed).
// out: (n)
pub struct Fill<P> {
    pub dtype: DType,
    pub out: P,
    pub n: usize,
    pub value: f32,
    pub scaled_by: Option<P>,
}

impl<P> Fill<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        grid_stride(
            kernel_name("fill", self.dtype),
            self.n,
            dev,
            vec![
                Arg::Ptr(self.out),
                Arg::I64(self.n as i64),
                Arg::F32(self.value),
                opt(self.scaled_by),
            ],
        )
    }
}

/// `add_<T>`: out[i] = a[i] + b[i mod nb] (residual add, bias add, gradient sums); out may be a.
/// With `to_f32`, `add_to_f32_<T>`: two half operands summed into an f32 output (a tied
/// weight's gradient from its two half parts).
// out, a: (n); b: (nb), nb divides n
pub struct Add<P> {
    pub dtype: DType,
    pub to_f32: bool,
    pub out: P,
    pub a: P,
    pub b: P,
    pub n: usize,
    pub nb: usize,
}

impl<P> Add<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        let base = if self.to_f32 { "add_to_f32" } else { "add" };
        grid_stride(
            kernel_name(base, self.dtype),
            self.n,
            dev,
            vec![
                Arg::Ptr(self.out),
                Arg::Ptr(self.a),
                Arg::Ptr(self.b),
                Arg::I64(self.n as i64),
                Arg::I64(self.nb as i64),
            ],
        )
    }
}

/// `scale_<T>`: out[i] = s·x[i]; out may be x.
// out, x: (n)
pub struct Scale<P> {
    pub dtype: DType,
    pub out: P,
    pub x: P,
    pub n: usize,
    pub s: f32,
}

impl<P> Scale<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        grid_stride(
            kernel_name("scale", self.dtype),
            self.n,
            dev,
            vec![Arg::Ptr(self.out), Arg::Ptr(self.x), Arg::I64(self.n as i64), Arg::F32(self.s)],
        )
    }
}

/// `bias_gelu_<T>`: the epilogue of a linear layer with GELU after its GEMM wrote x·w into
/// `pre`: pre += bias, y = gelu(pre).
// y, pre: (rows, c); bias: (c)
pub struct BiasGelu<P> {
    pub dtype: DType,
    pub y: P,
    pub pre: P,
    pub bias: P,
    pub rows: usize,
    pub c: usize,
    pub approx: GeluApprox,
}

impl<P> BiasGelu<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        grid_stride(
            kernel_name("bias_gelu", self.dtype),
            self.rows * self.c,
            dev,
            vec![
                Arg::Ptr(self.y),
                Arg::Ptr(self.pre),
                Arg::Ptr(self.bias),
                Arg::I64(self.rows as i64),
                Arg::I32(self.c as i32),
                approx(self.approx),
            ],
        )
    }
}

/// `gelu_forward_<T>`: y = gelu(x), a GELU outside a linear layer; y may be x.
// y, x: (n)
pub struct GeluForward<P> {
    pub dtype: DType,
    pub y: P,
    pub x: P,
    pub n: usize,
    pub approx: GeluApprox,
}

impl<P> GeluForward<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        grid_stride(
            kernel_name("gelu_forward", self.dtype),
            self.n,
            dev,
            vec![Arg::Ptr(self.y), Arg::Ptr(self.x), Arg::I64(self.n as i64), approx(self.approx)],
        )
    }
}

/// `gelu_backward_<T>`: dx = dy·gelu'(x); dx may be dy.
// dx, x, dy: (n)
pub struct GeluBackward<P> {
    pub dtype: DType,
    pub dx: P,
    pub x: P,
    pub dy: P,
    pub n: usize,
    pub approx: GeluApprox,
}

impl<P> GeluBackward<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        grid_stride(
            kernel_name("gelu_backward", self.dtype),
            self.n,
            dev,
            vec![
                Arg::Ptr(self.dx),
                Arg::Ptr(self.x),
                Arg::Ptr(self.dy),
                Arg::I64(self.n as i64),
                approx(self.approx),
            ],
        )
    }
}

/// `tanh_forward_<T>`: y = tanh(x); y may be x.
// y, x: (n)
pub struct TanhForward<P> {
    pub dtype: DType,
    pub y: P,
    pub x: P,
    pub n: usize,
}

impl<P> TanhForward<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        grid_stride(
            kernel_name("tanh_forward", self.dtype),
            self.n,
            dev,
            vec![Arg::Ptr(self.y), Arg::Ptr(self.x), Arg::I64(self.n as i64)],
        )
    }
}

/// `tanh_backward_<T>`: dx = dy·(1 − y²) from the forward's output; dx may be dy.
// dx, y, dy: (n)
pub struct TanhBackward<P> {
    pub dtype: DType,
    pub dx: P,
    pub y: P,
    pub dy: P,
    pub n: usize,
}

impl<P> TanhBackward<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        grid_stride(
            kernel_name("tanh_backward", self.dtype),
            self.n,
            dev,
            vec![Arg::Ptr(self.dx), Arg::Ptr(self.y), Arg::Ptr(self.dy), Arg::I64(self.n as i64)],
        )
    }
}

/// `dropout_<T>`: out[i] = x[i]/(1−p) where element offset+i of the site is kept, else 0 (the
/// counter-based mask of `ops::dropout`); its backward is the same launch on the gradient.
// out, x: (n)
pub struct Dropout<P> {
    pub dtype: DType,
    pub out: P,
    pub x: P,
    pub n: usize,
    pub p: f32,
    pub seed: Seed<P>,
    pub offset: u64,
}

impl<P> Dropout<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        let (seed, step) = self.seed.split();
        grid_stride(
            kernel_name("dropout", self.dtype),
            self.n,
            dev,
            vec![
                Arg::Ptr(self.out),
                Arg::Ptr(self.x),
                Arg::I64(self.n as i64),
                Arg::F32(self.p),
                Arg::U64(seed),
                Arg::U64(self.offset),
                step,
            ],
        )
    }
}

/// `cast_<from>_<to>`: out = x in another storage type, rounded to nearest even.
// out, x: (n)
pub struct Cast<P> {
    pub from: DType,
    pub to: DType,
    pub out: P,
    pub x: P,
    pub n: usize,
}

impl<P> Cast<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        let name = format!("cast_{}_{}", super::suffix(self.from), super::suffix(self.to));
        grid_stride(
            name,
            self.n,
            dev,
            vec![Arg::Ptr(self.out), Arg::Ptr(self.x), Arg::I64(self.n as i64)],
        )
    }
}

impl GpuKernel for op::Fill {
    // Autodiff's seed, d(loss)/d(loss): it holds the loss scale (2^16 overflows f16), f32 like
    // the loss, as the CPU executor keeps it.
    fn stored_dtype(&self, g: &Graph, node: &Node, _slot: usize) -> Option<DType> {
        let seed =
            matches!(g.tensor(node.outputs[0]).kind, TensorKind::Grad(l) if Some(l) == g.loss());
        seed.then_some(DType::F32)
    }

    fn launches(&self, r: &mut Resolver<'_>, cx: &NodeCx<'_>) -> Result<Vec<Call>, PlanError> {
        let op::Fill { value } = self;
        let g = cx.g;
        let outs = &cx.node.outputs;
        let calls = {
            let o = outs[0];
            let is_seed = matches!(g.tensor(o).kind, TensorKind::Grad(l) if Some(l) == g.loss());
            let p = r.plan.places[o.index()].clone();
            let sh = g.shape(o);
            if p.strides == contiguous(sh) {
                let (dtype, n, value) = (cx.dt(o), cx.n(o), *value);
                let scaled_by = is_seed.then(|| r.step_block());
                let fill = Fill { dtype, out: cx.out(0), n, value, scaled_by };
                vec![fill.launch(r.device()).into()]
            } else {
                let meta = r.fill_meta(sh, &p.strides);
                let (dtype, n, value) = (cx.dt(o), cx.n(o), *value);
                let scaled_by = is_seed.then(|| r.step_block());
                let fill = copy::FillStrided { dtype, dst: cx.out(0), n, meta, value, scaled_by };
                vec![fill.launch(r.device()).into()]
            }
        };
        Ok(calls)
    }
}

impl GpuKernel for BiasAdd {
    // The bias is a broadcast addend: the add kernel.
    fn launches(&self, r: &mut Resolver<'_>, cx: &NodeCx<'_>) -> Result<Vec<Call>, PlanError> {
        op::Add.launches(r, cx)
    }
}

impl GpuKernel for op::Add {
    fn launches(&self, r: &mut Resolver<'_>, cx: &NodeCx<'_>) -> Result<Vec<Call>, PlanError> {
        let ins = &cx.node.inputs;
        let outs = &cx.node.outputs;
        let calls = {
            let (len, nb) = (cx.n(outs[0]), cx.n(ins[1]));
            if nb == 0 || len % nb != 0 {
                return Err(cx.no(" for an operand that does not tile the output"));
            }
            cx.same(&[ins[0], ins[1]])?;
            let o = match cx.inplace {
                Some(k) => cx.inp(k),
                None => cx.out(0),
            };
            // Two half parts summed into a parameter's f32 gradient (tied weights).
            let to_f32 = if cx.dt(outs[0]) == cx.dt(ins[0]) {
                false
            } else if cx.dt(outs[0]) == DType::F32 {
                true
            } else {
                return Err(cx.no(" for f32 operands into a half output"));
            };
            let (a, b) = (cx.inp(0), cx.inp(1));
            let add = Add { dtype: cx.dt(ins[0]), to_f32, out: o, a, b, n: len, nb };
            vec![add.launch(r.device()).into()]
        };
        Ok(calls)
    }
}

impl GpuKernel for op::Scale {
    fn launches(&self, r: &mut Resolver<'_>, cx: &NodeCx<'_>) -> Result<Vec<Call>, PlanError> {
        let op::Scale { s } = self;
        let ins = &cx.node.inputs;
        let outs = &cx.node.outputs;
        let calls = {
            cx.same(&[outs[0], ins[0]])?;
            let o = if cx.inplace.is_some() { cx.inp(0) } else { cx.out(0) };
            let scale =
                Scale { dtype: cx.dt(outs[0]), out: o, x: cx.inp(0), n: cx.n(outs[0]), s: *s };
            vec![scale.launch(r.device()).into()]
        };
        Ok(calls)
    }
}

impl GpuKernel for Tanh {
    fn launches(&self, r: &mut Resolver<'_>, cx: &NodeCx<'_>) -> Result<Vec<Call>, PlanError> {
        let ins = &cx.node.inputs;
        let outs = &cx.node.outputs;
        let calls = {
            cx.same(&[outs[0], ins[0]])?;
            let o = if cx.inplace.is_some() { cx.inp(0) } else { cx.out(0) };
            let tanh = TanhForward { dtype: cx.dt(outs[0]), y: o, x: cx.inp(0), n: cx.n(outs[0]) };
            vec![tanh.launch(r.device()).into()]
        };
        Ok(calls)
    }
}

impl GpuKernel for op::TanhBackward {
    fn launches(&self, r: &mut Resolver<'_>, cx: &NodeCx<'_>) -> Result<Vec<Call>, PlanError> {
        let ins = &cx.node.inputs;
        let outs = &cx.node.outputs;
        let calls = {
            cx.same(&[outs[0], ins[0], ins[1]])?;
            let o = if cx.inplace.is_some() { cx.inp(1) } else { cx.out(0) };
            let (dtype, n, dev) = (cx.dt(outs[0]), cx.n(outs[0]), r.device());
            let l = match &cx.node.op {
                Op::GeluBackward(op::GeluBackward { approx }) => {
                    let (dx, x, dy, approx) = (o, cx.inp(0), cx.inp(1), *approx);
                    GeluBackward { dtype, dx, x, dy, n, approx }.launch(dev)
                }
                // Op::TanhBackward, the arm's other op.
                _ => TanhBackward { dtype, dx: o, y: cx.inp(0), dy: cx.inp(1), n }.launch(dev),
            };
            vec![l.into()]
        };
        Ok(calls)
    }
}

impl GpuKernel for op::GeluBackward {
    // One binding for the two activation backwards: it reads which from the node. Nothing
    // where the GEMM producing dy does the work in its DGELU epilogue (`gemm::dgelu_pairs`).
    fn launches(&self, r: &mut Resolver<'_>, cx: &NodeCx<'_>) -> Result<Vec<Call>, PlanError> {
        if r.in_epilogue(cx.i) {
            return Ok(Vec::new());
        }
        op::TanhBackward.launches(r, cx)
    }
}

impl GpuKernel for op::Dropout {
    fn launches(&self, r: &mut Resolver<'_>, cx: &NodeCx<'_>) -> Result<Vec<Call>, PlanError> {
        let op::Dropout { p, offset } = self;
        let ins = &cx.node.inputs;
        let outs = &cx.node.outputs;
        let calls = {
            cx.same(&[outs[0], ins[0]])?;
            let o = if cx.inplace.is_some() { cx.inp(0) } else { cx.out(0) };
            let (dtype, n, p, offset) = (cx.dt(outs[0]), cx.n(outs[0]), *p, *offset);
            let seed = Seed::Block(r.step_block());
            let drop = Dropout { dtype, out: o, x: cx.inp(0), n, p, seed, offset };
            vec![drop.launch(r.device()).into()]
        };
        Ok(calls)
    }
}
