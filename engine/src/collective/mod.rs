//! Collectives over data-parallel ranks: the operations DDP and ZeRO-1 need, as one trait with
//! an implementation per transport (NCCL's semantics: every rank calls the same collectives in
//! the same order; buffers are the engine's flat buffers).
//!
//! - [`local::LocalGroup`]: ranks as threads of one process sharing memory (CPU ranks, or
//!   several ranks on one device).
//! - [`tcp::TcpGroup`]: ranks as processes or machines, started by torchrun-style variables.
//! - [`device::DeviceGroup`]: NCCL (NVIDIA) or RCCL (AMD), loaded at run time.

pub mod device;
pub mod local;
pub mod tcp;

pub use device::{DeviceGroup, Vendor};
pub use local::LocalGroup;
pub use tcp::TcpGroup;

/// How values from different ranks combine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    /// Sum divided by the number of ranks (gradient averaging).
    Avg,
    Max,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CollectiveError {
    #[error("{op}: rank {rank} passed {got} elements, expected {expected}")]
    Size { op: &'static str, rank: usize, expected: usize, got: usize },
    #[error("broadcast root {root} is not a rank of a group of {world}")]
    Root { root: usize, world: usize },
    #[error("{0}: a rank of the group failed or left")]
    Poisoned(&'static str),
    #[error("collective transport: {0}")]
    Io(String),
    #[error("rank 0 reports: {0}")]
    Remote(String),
    #[error("{0}")]
    Env(String),
    #[error("GPU collectives unavailable: {0}")]
    Unavailable(String),
    #[error("GPU collective failed: {0}")]
    Device(String),
}

/// The element types collectives move (for transports that need to name them, as NCCL does).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ElementKind {
    U8,
    F16,
    Bf16,
    F32,
    F64,
}

/// Element types collectives move: reductions accumulate in f64 and round once.
pub trait Element: Copy + Send + Sync + 'static {
    const KIND: ElementKind;
    fn to_f64(self) -> f64;
    fn from_f64(x: f64) -> Self;
}

impl Element for f32 {
    const KIND: ElementKind = ElementKind::F32;
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
    fn from_f64(x: f64) -> Self {
        x as f32
    }
}
impl Element for f64 {
    const KIND: ElementKind = ElementKind::F64;
    fn to_f64(self) -> f64 {
        self
    }
    fn from_f64(x: f64) -> Self {
        x
    }
}
impl Element for u8 {
    const KIND: ElementKind = ElementKind::U8;
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
    fn from_f64(x: f64) -> Self {
        x as u8
    }
}
impl Element for half::f16 {
    const KIND: ElementKind = ElementKind::F16;
    fn to_f64(self) -> f64 {
        f64::from(self.to_f32())
    }
    fn from_f64(x: f64) -> Self {
        half::f16::from_f64(x)
    }
}
impl Element for half::bf16 {
    const KIND: ElementKind = ElementKind::Bf16;
    fn to_f64(self) -> f64 {
        f64::from(self.to_f32())
    }
    fn from_f64(x: f64) -> Self {
        half::bf16::from_f64(x)
    }
}

/// One rank's handle on a group.
pub trait Collective: Send {
    fn rank(&self) -> usize;
    fn world_size(&self) -> usize;

    /// Every rank's `buf` becomes the reduction of all ranks' `buf`s (same length on all).
    fn all_reduce<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<(), CollectiveError>;

    /// `send` (length N·k on every rank) is reduced element-wise across ranks, and rank r
    /// receives elements r·k..(r+1)·k of the result in `recv` (length k).
    fn reduce_scatter<T: Element>(&self, send: &[T], recv: &mut [T], op: ReduceOp) -> Result<(), CollectiveError>;

    /// Every rank's `recv` (length N·k) becomes the concatenation of all ranks' `send` (k each),
    /// in rank order.
    fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<(), CollectiveError>;

    /// Every rank's `buf` becomes `root`'s.
    fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<(), CollectiveError>;

    /// Returns once every rank has called it.
    fn barrier(&self) -> Result<(), CollectiveError>;
}

/// Shard bookkeeping for ZeRO-1: `total` elements split into `world` equal shards, the total
/// padded up to a multiple of `world · align` elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sharding {
    pub total: usize,
    pub world: usize,
    /// Elements per shard (padded).
    pub shard: usize,
}

impl Sharding {
    pub fn new(total: usize, world: usize, align: usize) -> Self {
        assert!(world > 0 && align > 0);
        let unit = world * align;
        let padded = total.div_ceil(unit) * unit;
        Sharding { total, world, shard: padded / world }
    }
    pub fn padded(&self) -> usize {
        self.shard * self.world
    }
    /// The range of the (padded) buffer that `rank` owns.
    pub fn range(&self, rank: usize) -> std::ops::Range<usize> {
        rank * self.shard..(rank + 1) * self.shard
    }
    /// The part of `rank`'s range that holds real (unpadded) elements.
    pub fn real_range(&self, rank: usize) -> std::ops::Range<usize> {
        let r = self.range(rank);
        r.start.min(self.total)..r.end.min(self.total)
    }
}
