//! Launchers of `engine/kernels/copy.cu`: strided copies and fills, grid-stride (the views the
//! plan could not fold: reshape, permute, split, concat; a fill into a strided place). Shapes
//! and strides come in a small i64 array, `meta` — its layout is [`copy_meta`] /
//! [`fill_meta`] —, addressed like an operand (a device array the executor uploads once, a
//! host buffer in the tests). CPU counterpart: `backend/cpu/kernels/copy.rs`.

use super::{grid_stride, kernel_name, Arg, Device, Launch, StepValue};
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

/// `fill_strided_<T>`: every element of the strided dst = value, or value × the step's loss
/// scale (the backward's seed in a strided place).
// dst: n elements, strided as `meta` ([`fill_meta`]) says
pub struct FillStrided<P> {
    pub dtype: DType,
    pub dst: P,
    pub n: usize,
    pub meta: P,
    pub value: f32,
    pub loss_scaled: bool,
}

impl<P> FillStrided<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        let v = if self.loss_scaled {
            Arg::Step(StepValue::LossScaled(self.value))
        } else {
            Arg::F32(self.value)
        };
        grid_stride(
            kernel_name("fill_strided", self.dtype),
            self.n,
            dev,
            vec![Arg::Ptr(self.dst), Arg::I64(self.n as i64), Arg::Ptr(self.meta), v],
        )
    }
}
