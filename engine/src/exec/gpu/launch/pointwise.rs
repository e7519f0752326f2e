//! Launchers of `engine/kernels/pointwise.cu`: the pointwise functions of `ops::pointwise`,
//! one thread per element, grid-stride, f32 arithmetic over storage type `dtype`. A launcher
//! serves every function of its family: the kernel is named by the function
//! (`<name>_forward_<T>`, `<name>_backward_<T>`, `<name>_<T>`), its arguments are the
//! family's. CPU counterparts: `backend/cpu/kernels/pointwise.rs`.

use super::{grid_stride, kernel_name, Arg, Device, Launch};
use crate::ops::pointwise::{BinaryFn, UnaryFn};
use crate::DType;

/// `<f>_forward_<T>`: y = f(x); y may be x.
// y, x: (n)
pub struct Unary<P> {
    pub f: UnaryFn,
    pub dtype: DType,
    pub y: P,
    pub x: P,
    pub n: usize,
}

impl<P> Unary<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        grid_stride(
            kernel_name(&format!("{}_forward", self.f.name()), self.dtype),
            self.n,
            dev,
            vec![Arg::Ptr(self.y), Arg::Ptr(self.x), Arg::I64(self.n as i64)],
        )
    }
}

/// `<f>_backward_<T>`: dx = dy·f'(x), from the forward's input; dx may be dy.
// dx, x, dy: (n)
pub struct UnaryBackward<P> {
    pub f: UnaryFn,
    pub dtype: DType,
    pub dx: P,
    pub x: P,
    pub dy: P,
    pub n: usize,
}

impl<P> UnaryBackward<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        grid_stride(
            kernel_name(&format!("{}_backward", self.f.name()), self.dtype),
            self.n,
            dev,
            vec![Arg::Ptr(self.dx), Arg::Ptr(self.x), Arg::Ptr(self.dy), Arg::I64(self.n as i64)],
        )
    }
}

/// `<f>_<T>`: out[i] = f(a[i], b[i mod nb]); out may be a (or b when nb = n).
// out, a: (n); b: (nb), nb divides n
pub struct Binary<P> {
    pub f: BinaryFn,
    pub dtype: DType,
    pub out: P,
    pub a: P,
    pub b: P,
    pub n: usize,
    pub nb: usize,
}

impl<P> Binary<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        grid_stride(
            kernel_name(self.f.name(), self.dtype),
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
