//! One typed launcher per kernel of `engine/kernels/*.cu`: its arguments as named fields, in
//! the kernel's order, and its launch geometry — written once, here, beside the host-side
//! description of the kernels ([`super::kernels`]: block sizes, tiles), and used by the GPU
//! executor ([`super::GpuExecutor`]) and the SIMT kernel tests (`engine/tests/simt_*.rs`)
//! alike, so the two cannot launch a kernel differently.
//!
//! A launcher is generic over how its caller addresses an operand (`P`): a device address in
//! the executor, a host buffer in the tests. Module per `.cu` file, launcher per kernel, named
//! as the kernel (`elementwise.cu` `tanh_backward_<T>` → [`elementwise::TanhBackward`]).

pub mod elementwise;
pub mod pointwise;

use super::kernels::{suffix, EW_BLOCK};
use crate::DType;

/// What launch geometry depends on: the device's warp size and largest 1-D grid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Device {
    pub warp: u32,
    pub max_blocks: u32,
}

/// A scalar only known when a step runs: the executor fills it in each step; a test passes a
/// fixed value through the launcher's field instead.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum StepValue {
    /// The step's dropout seed (u64).
    Seed,
    /// This value times the step's loss scale (f32): the backward's seed.
    LossScaled(f32),
}

/// One kernel argument: an operand (`P`), a null pointer (an optional operand left out), or a
/// scalar of the kernel's C type.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arg<P> {
    Ptr(P),
    Null,
    I32(i32),
    U32(u32),
    I64(i64),
    U64(u64),
    F32(f32),
    Step(StepValue),
}

/// One launch: the kernel's name (with its storage-type suffix), a 1-D grid of 1-D blocks,
/// dynamic shared memory in bytes, and the arguments in the kernel's order.
#[derive(Debug, Clone, PartialEq)]
pub struct Launch<P> {
    pub name: String,
    pub grid: u32,
    pub block: u32,
    pub smem: u32,
    pub args: Vec<Arg<P>>,
}

impl<P> Launch<P> {
    /// The same launch with its operands addressed another way.
    pub fn map<Q>(self, mut f: impl FnMut(P) -> Q) -> Launch<Q> {
        let args = self
            .args
            .into_iter()
            .map(|a| match a {
                Arg::Ptr(p) => Arg::Ptr(f(p)),
                Arg::Null => Arg::Null,
                Arg::I32(v) => Arg::I32(v),
                Arg::U32(v) => Arg::U32(v),
                Arg::I64(v) => Arg::I64(v),
                Arg::U64(v) => Arg::U64(v),
                Arg::F32(v) => Arg::F32(v),
                Arg::Step(v) => Arg::Step(v),
            })
            .collect();
        Launch { name: self.name, grid: self.grid, block: self.block, smem: self.smem, args }
    }
}

/// `base_<suffix>`: the kernel instantiated for storage type `dtype` (`ORT_FOR_FLOATS`).
pub fn kernel_name(base: &str, dtype: DType) -> String {
    format!("{base}_{}", suffix(dtype))
}

/// A grid-stride launch over `n` elements: blocks of [`EW_BLOCK`], as many as cover `n` up to
/// the device's largest grid (the kernel strides over the rest).
pub fn grid_stride<P>(name: String, n: usize, dev: Device, args: Vec<Arg<P>>) -> Launch<P> {
    let grid = (n.div_ceil(EW_BLOCK as usize) as u64).clamp(1, dev.max_blocks as u64) as u32;
    Launch { name, grid, block: EW_BLOCK, smem: 0, args }
}
