//! Collectives over data-parallel ranks: the operations DDP and ZeRO-1 need, as one trait with
//! an implementation per transport (NCCL's semantics: every rank calls the same collectives in
//! the same order; buffers are the engine's flat buffers).
//!
//! - [`local::LocalGroup`]: ranks as threads of one process sharing memory (CPU ranks, or
//!   several ranks on one device).
//! - [`tcp::TcpGroup`]: ranks as processes or machines, started by a launcher (torchrun, srun,
//!   mpirun).
//! - [`device::DeviceGroup`]: NCCL (NVIDIA) or RCCL (AMD), loaded at run time.
//!
//! [`on_device::DeviceCollective`] runs them over GPU memory for the GPU session's data
//! parallelism; [`watchdog`] bounds the wait for an asynchronous (NCCL) collective.

pub mod device;
pub mod local;
pub mod on_device;
pub mod tcp;
pub mod watchdog;

pub use device::{DeviceGroup, Vendor};
pub use local::LocalGroup;
pub use on_device::{DeviceCollective, HostMemory};
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
    #[error("{op}: rank {rank} passed {len} elements, more than {world} chunks of {k} hold")]
    Chunks { op: &'static str, rank: usize, len: usize, k: usize, world: usize },
    #[error("broadcast root {root} is not a rank of a group of {world}")]
    Root { root: usize, world: usize },
    #[error("{0}: a rank of the group failed or left")]
    Poisoned(&'static str),
    /// The group was aborted ([`Abortable::abort`]): no collective runs on it again.
    #[error("{0}: the group was aborted after a collective timed out")]
    Aborted(&'static str),
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
    /// A peer did not answer within the collective timeout (a stopped, hung or unreachable
    /// rank): the collective is abandoned rather than waited for forever.
    #[error("collective {collective}: rank {rank} silent for {:.1} s (the collective timeout)", .after.as_secs_f64())]
    Timeout { collective: String, rank: usize, after: std::time::Duration },
    /// An asynchronous collective (NCCL's) did not complete within the collective timeout: the
    /// watchdog aborted its communicator ([`watchdog`]).
    #[error("collective {collective} did not complete within {:.1} s (the collective timeout): its communicator was aborted", .after.as_secs_f64())]
    Stalled { collective: String, after: std::time::Duration },
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
    fn reduce_scatter<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CollectiveError>;

    /// Every rank's `recv` (length N·k) becomes the concatenation of all ranks' `send` (k each),
    /// in rank order.
    fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<(), CollectiveError>;

    /// In place (NCCL's `ncclReduceScatter(buf, buf + r·k, k)`): `buf` is the flat buffer in
    /// chunks of `k` elements, chunk r = [`chunk`]`(buf.len(), k, r)`; afterwards rank r's chunk
    /// holds the reduction of every rank's chunk r, and its other chunks are left as they were.
    /// `buf` may be shorter than N·k — a flat buffer whose padding to a multiple of the ranks is
    /// never stored: the missing tail counts as zeros, so the last chunks are short or empty.
    /// Every rank passes the same `buf.len()` (at most N·k) and `k`.
    fn reduce_scatter_in_place<T: Element>(
        &self,
        buf: &mut [T],
        k: usize,
        op: ReduceOp,
    ) -> Result<(), CollectiveError>;

    /// In place (NCCL's `ncclAllGather(buf + r·k, buf, k)`): rank r's chunk of `buf` (as in
    /// [`Collective::reduce_scatter_in_place`]) is its contribution; afterwards every rank's
    /// `buf` holds every rank's chunk. `buf` may be shorter than N·k (the padded tail is
    /// dropped). Every rank passes the same `buf.len()` (at most N·k) and `k`.
    fn all_gather_in_place<T: Element>(
        &self,
        buf: &mut [T],
        k: usize,
    ) -> Result<(), CollectiveError>;

    /// Every rank's `buf` becomes `root`'s.
    fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<(), CollectiveError>;

    /// Returns once every rank has called it.
    fn barrier(&self) -> Result<(), CollectiveError>;
}

/// A host transport that a watchdog on another thread can stop ([`watchdog`]; what
/// `ncclCommAbort` is to NCCL): the collectives blocked waiting for a peer, and every later one,
/// fail with [`CollectiveError::Aborted`].
pub trait Abortable: Collective + Sync {
    /// How long the watchdog lets one of this rank's collectives run (`--collective-timeout-s`).
    fn collective_timeout(&self) -> std::time::Duration;
    /// Ends the group for good.
    fn abort(&self);
}

/// Chunk `rank` of a flat buffer of `len` elements cut into chunks of `k` (the in-place
/// collectives' layout): `rank·k .. (rank+1)·k`, clipped to the stored `len` elements.
pub fn chunk(len: usize, k: usize, rank: usize) -> std::ops::Range<usize> {
    (rank * k).min(len)..((rank + 1) * k).min(len)
}

/// The in-place collectives' argument check, the same on every rank that passes the same
/// `len` and `k`: the chunks must hold the buffer.
fn check_chunks(
    op: &'static str,
    rank: usize,
    len: usize,
    k: usize,
    world: usize,
) -> Result<(), CollectiveError> {
    if len > world * k {
        return Err(CollectiveError::Chunks { op, rank, len, k, world });
    }
    Ok(())
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
    /// The part of `rank`'s range that holds real (unpadded) elements: its chunk of the
    /// stored `total` elements, as the in-place collectives cut it.
    pub fn real_range(&self, rank: usize) -> std::ops::Range<usize> {
        chunk(self.total, self.shard, rank)
    }
}

/// A rank of either transport, chosen at run time (enum dispatch, as candle's devices): threads
/// of one process ([`LocalGroup`]) or processes joined over TCP ([`TcpGroup`], what
/// `ortbench run --ranks N` starts and what torchrun-style launchers join).
pub enum AnyGroup {
    Local(LocalGroup),
    Tcp(TcpGroup),
}

impl From<LocalGroup> for AnyGroup {
    fn from(g: LocalGroup) -> Self {
        AnyGroup::Local(g)
    }
}

impl From<TcpGroup> for AnyGroup {
    fn from(g: TcpGroup) -> Self {
        AnyGroup::Tcp(g)
    }
}

macro_rules! any_group {
    ($self:ident, $g:ident => $e:expr) => {
        match $self {
            AnyGroup::Local($g) => $e,
            AnyGroup::Tcp($g) => $e,
        }
    };
}

impl Collective for AnyGroup {
    fn rank(&self) -> usize {
        any_group!(self, g => g.rank())
    }
    fn world_size(&self) -> usize {
        any_group!(self, g => g.world_size())
    }
    fn all_reduce<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<(), CollectiveError> {
        any_group!(self, g => g.all_reduce(buf, op))
    }
    fn reduce_scatter<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CollectiveError> {
        any_group!(self, g => g.reduce_scatter(send, recv, op))
    }
    fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<(), CollectiveError> {
        any_group!(self, g => g.all_gather(send, recv))
    }
    fn reduce_scatter_in_place<T: Element>(
        &self,
        buf: &mut [T],
        k: usize,
        op: ReduceOp,
    ) -> Result<(), CollectiveError> {
        any_group!(self, g => g.reduce_scatter_in_place(buf, k, op))
    }
    fn all_gather_in_place<T: Element>(
        &self,
        buf: &mut [T],
        k: usize,
    ) -> Result<(), CollectiveError> {
        any_group!(self, g => g.all_gather_in_place(buf, k))
    }
    fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<(), CollectiveError> {
        any_group!(self, g => g.broadcast(buf, root))
    }
    fn barrier(&self) -> Result<(), CollectiveError> {
        any_group!(self, g => g.barrier())
    }
}

impl Abortable for AnyGroup {
    fn collective_timeout(&self) -> std::time::Duration {
        any_group!(self, g => g.collective_timeout())
    }
    fn abort(&self) {
        any_group!(self, g => g.abort())
    }
}
