//! Launchers of `engine/kernels/elementwise.cu`: one thread per element, grid-stride, f32
//! arithmetic over storage type `dtype`. Operands are flat: (n) elements, a broadcast operand
//! (nb) with nb dividing n. CPU counterparts: `backend/cpu/kernels/elementwise.rs`.

pub use super::Seed;
use super::{grid_stride, kernel_name, Arg, Device, Launch, StepValue};
use crate::ops::gelu::GeluApprox;
use crate::DType;

/// The GELU variant as the kernels take it: 0 = erf (exact), 1 = tanh.
fn approx<P>(a: GeluApprox) -> Arg<P> {
    Arg::I32(match a {
        GeluApprox::Erf => 0,
        GeluApprox::Tanh => 1,
    })
}

/// `fill_<T>`: out[i] = value, or value × the step's loss scale (the backward's seed).
// out: (n)
pub struct Fill<P> {
    pub dtype: DType,
    pub out: P,
    pub n: usize,
    pub value: f32,
    pub loss_scaled: bool,
}

impl<P> Fill<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        let v = if self.loss_scaled {
            Arg::Step(StepValue::LossScaled(self.value))
        } else {
            Arg::F32(self.value)
        };
        grid_stride(
            kernel_name("fill", self.dtype),
            self.n,
            dev,
            vec![Arg::Ptr(self.out), Arg::I64(self.n as i64), v],
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
    pub seed: Seed,
    pub offset: u64,
}

impl<P> Dropout<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        grid_stride(
            kernel_name("dropout", self.dtype),
            self.n,
            dev,
            vec![
                Arg::Ptr(self.out),
                Arg::Ptr(self.x),
                Arg::I64(self.n as i64),
                Arg::F32(self.p),
                self.seed.arg(),
                Arg::U64(self.offset),
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
