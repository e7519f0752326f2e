//! One typed launcher per kernel of `engine/kernels/*.cu`: its arguments as named fields, in
//! the kernel's order, and its launch geometry — written once, here, beside the host-side
//! description of the kernels ([`super::support`]: block sizes, tiles), and used by the GPU
//! executor ([`super::GpuExecutor`]) and the SIMT kernel tests (`engine/tests/simt_*.rs`)
//! alike, so the two cannot launch a kernel differently.
//!
//! A launcher is generic over how its caller addresses an operand (`P`): a device address in
//! the executor, a host buffer in the tests. Module per `.cu` file, launcher per kernel, named
//! as the kernel (`elementwise.cu` `tanh_backward_<T>` → [`elementwise::TanhBackward`]).

pub mod adamw;
pub mod attention;
pub mod copy;
pub mod cross_entropy;
pub mod elementwise;
pub mod embedding;
pub mod gemm;
pub mod layernorm;
pub mod linear_cross_entropy;
pub mod pointwise;
pub mod reduce;
pub mod rmsnorm;
pub mod rotary;
pub mod rows;
pub mod softmax;

use super::support::{chunks, suffix, COLUMN_BLOCK, EW_BLOCK, ONE_BLOCK, ROW_BLOCK, ROW_WARPS};
use crate::backend::gpu::{GpuDevice, GpuError, KernelArg};
use crate::DType;

/// What launch geometry depends on: the device's warp size, largest 1-D grid and dynamic
/// shared memory per block (bytes; attention's tiles are fitted to it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Device {
    pub warp: u32,
    pub max_blocks: u32,
    pub max_smem: u32,
    /// Tensor cores through `mma.sync` m16n8k16 with f16/bf16 operands ([`GpuDevice::has_mma`]).
    pub mma: bool,
}

impl Device {
    /// The geometry of a [`GpuDevice`].
    pub fn of<D: GpuDevice>(d: &D) -> Device {
        Device {
            warp: d.warp_size(),
            max_blocks: d.max_blocks(),
            max_smem: d.max_shared_bytes(),
            mma: d.has_mma(),
        }
    }
}

/// Per-step scalar arguments: given as values (a kernel launched alone, as the kernel tests
/// do), or read by the kernel from the step block at `P` ([`super::StepBlock`]: the executor's
/// and the session's launches, which a captured step replays unchanged).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PerStep<V, P> {
    Value(V),
    Block(P),
}

impl<V: Default, P> PerStep<V, P> {
    /// The kernel's value arguments (unread, zero, with a block) and its step block argument
    /// (null without one), which the kernels take last.
    fn split(self) -> (V, Arg<P>) {
        match self {
            PerStep::Value(v) => (v, Arg::Null),
            PerStep::Block(b) => (V::default(), Arg::Ptr(b)),
        }
    }
}

/// A dropout mask's seed: fixed (tests), or the step block's (the executor).
pub type Seed<P> = PerStep<u64, P>;

/// An additive mask (storage T) broadcast to a (B, H, Tq, Tk) score tensor, as softmax.cu and
/// attention.cu take it: the operand and its 4 element strides against (B, H, Tq, Tk), 0 on a
/// broadcast dim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mask<P> {
    pub mask: P,
    pub strides: [i64; 4],
}

/// The mask's pointer (null for none) and its 4 strides (0 for none).
fn mask_args<P>(m: Option<Mask<P>>) -> (Arg<P>, [Arg<P>; 4]) {
    match m {
        Some(Mask { mask, strides }) => (Arg::Ptr(mask), strides.map(Arg::I64)),
        None => (Arg::Null, [0; 4].map(Arg::I64)),
    }
}

/// An optional operand: its pointer, or null.
fn opt<P>(p: Option<P>) -> Arg<P> {
    p.map_or(Arg::Null, Arg::Ptr)
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
            })
            .collect();
        Launch { name: self.name, grid: self.grid, block: self.block, smem: self.smem, args }
    }
}

impl Launch<u64> {
    /// Launches now on `dev`: the launches outside the executor's resolved step (the
    /// session's optimizer, a kernel test's launch).
    ///
    /// # Safety
    /// Every operand addresses live device memory as large as the kernel touches.
    pub unsafe fn run<D: GpuDevice>(&self, dev: &D) -> Result<(), GpuError> {
        let args: Vec<KernelArg> = self.args.iter().map(Arg::kernel_arg).collect();
        dev.launch(&self.name, self.grid, self.block, self.smem, &args)
    }
}

impl Arg<u64> {
    /// The argument as the device takes it (a null operand is address 0).
    pub fn kernel_arg(&self) -> KernelArg {
        match *self {
            Arg::Ptr(p) => KernelArg::Ptr(p),
            Arg::Null => KernelArg::Ptr(0),
            Arg::I32(v) => KernelArg::I32(v),
            Arg::U32(v) => KernelArg::U32(v),
            Arg::I64(v) => KernelArg::I64(v),
            Arg::U64(v) => KernelArg::U64(v),
            Arg::F32(v) => KernelArg::F32(v),
        }
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

/// One warp per row (layernorm.cu, softmax.cu): blocks of [`ROW_WARPS`] warps, as many as
/// cover the rows (no grid-stride: a warp past the last row returns at once).
fn warp_rows<P>(name: String, rows: usize, dev: Device, args: Vec<Arg<P>>) -> Launch<P> {
    let grid = rows.div_ceil(ROW_WARPS as usize).max(1) as u32;
    Launch { name, grid, block: ROW_WARPS * dev.warp, smem: 0, args }
}

/// One block per row, grid-stride over the rows (cross_entropy.cu, embedding.cu's gather):
/// blocks of [`ROW_BLOCK`], one per row up to the device's largest grid.
fn block_rows<P>(name: String, rows: usize, dev: Device, args: Vec<Arg<P>>) -> Launch<P> {
    let grid = (rows as u64).clamp(1, dev.max_blocks as u64) as u32;
    Launch { name, grid, block: ROW_BLOCK, smem: 0, args }
}

/// A single block (a reduction over a short vector by one block: cross_entropy.cu's mean
/// and count): [`ONE_BLOCK`] threads, at least a warp.
fn one_block<P>(name: String, dev: Device, args: Vec<Arg<P>>) -> Launch<P> {
    Launch { name, grid: 1, block: ONE_BLOCK.max(dev.warp), smem: 0, args }
}

/// The partials of a column reduction over (rows, c) (reduce.cu `column_sum_partial`,
/// layernorm.cu `layernorm_backward_dwdb`): one block per chunk of rows
/// ([`super::support::ROWS_PER_CHUNK`]) and [`COLUMN_BLOCK`] columns.
fn columns<P>(name: String, rows: usize, c: usize, args: Vec<Arg<P>>) -> Launch<P> {
    let grid = (chunks(rows) * c.div_ceil(COLUMN_BLOCK as usize)) as u32;
    Launch { name, grid, block: COLUMN_BLOCK, smem: 0, args }
}
