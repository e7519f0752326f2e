//! Collectives over buffers in a GPU's memory, queued in order with that GPU's work: what the
//! GPU session's data parallelism (`exec::gpu::session`) calls between the backward and the
//! optimizer, on the flat gradient and parameter buffers, with no host copy.
//!
//! - On an NVIDIA GPU: NCCL ([`DeviceGroup`]) on the engine's stream (`impl` below, feature
//!   `cuda`), as llm.c's `train_gpt2.cu` calls `ncclReduceScatter` / `ncclAllGather` on its
//!   flat buffers.
//! - On a device whose memory is host memory ([`HostMemory`]: the SIMT harness the tests run
//!   the GPU executor on): the host transports ([`LocalGroup`], [`TcpGroup`], [`AnyGroup`])
//!   over the same addresses, once the device's queued work is done — so the data-parallel GPU
//!   step, its padding, offsets and shard bookkeeping run in CI, where there is no GPU; only the
//!   NCCL calls themselves need one.
//!
//! Layouts are NCCL's in-place ones: a flat buffer of world·k elements in chunks of k, chunk r
//! rank r's ([`crate::collective::chunk`]).

use super::{AnyGroup, Collective, CollectiveError, ElementKind, LocalGroup, ReduceOp, TcpGroup};
use crate::backend::gpu::GpuDevice;

/// A [`GpuDevice`] whose addresses are host pointers (its "device memory" is the host's).
pub trait HostMemory: GpuDevice {}

/// Collectives over device memory of `D` (see the module comment). Every rank calls the same
/// collectives in the same order with the same sizes, as NCCL requires.
pub trait DeviceCollective<D: GpuDevice>: Collective {
    /// `len` elements of `kind` at `addr` become, on every rank, their reduction over the ranks.
    ///
    /// # Safety
    /// `addr .. addr + len·size(kind)` lies inside one live buffer of `dev`.
    unsafe fn all_reduce_on(
        &self,
        dev: &D,
        addr: u64,
        len: usize,
        kind: ElementKind,
        op: ReduceOp,
    ) -> Result<(), CollectiveError>;

    /// NCCL's in-place reduce-scatter (`ncclReduceScatter(buf, buf + r·k, k)`): the buffer at
    /// `addr` holds world·k elements; rank r's chunk r becomes the reduction of every rank's
    /// chunk r, its other chunks are left as they were (or clobbered: nothing may read them).
    ///
    /// # Safety
    /// `addr .. addr + world·k·size(kind)` lies inside one live buffer of `dev`.
    unsafe fn reduce_scatter_on(
        &self,
        dev: &D,
        addr: u64,
        k: usize,
        kind: ElementKind,
        op: ReduceOp,
    ) -> Result<(), CollectiveError>;

    /// NCCL's in-place all-gather (`ncclAllGather(buf + r·k, buf, k)`): every rank's buffer of
    /// world·k elements gets chunk q from rank q.
    ///
    /// # Safety
    /// As [`DeviceCollective::reduce_scatter_on`].
    unsafe fn all_gather_on(
        &self,
        dev: &D,
        addr: u64,
        k: usize,
        kind: ElementKind,
    ) -> Result<(), CollectiveError>;
}

/// Runs `$body` with `$s` bound to the `$len` elements of `$kind` at host address `$addr`.
macro_rules! typed_slice {
    ($kind:expr, $addr:expr, $len:expr, |$s:ident| $body:expr) => {
        match $kind {
            ElementKind::U8 => {
                let $s = std::slice::from_raw_parts_mut($addr as *mut u8, $len);
                $body
            }
            ElementKind::F16 => {
                let $s = std::slice::from_raw_parts_mut($addr as *mut half::f16, $len);
                $body
            }
            ElementKind::Bf16 => {
                let $s = std::slice::from_raw_parts_mut($addr as *mut half::bf16, $len);
                $body
            }
            ElementKind::F32 => {
                let $s = std::slice::from_raw_parts_mut($addr as *mut f32, $len);
                $body
            }
            ElementKind::F64 => {
                let $s = std::slice::from_raw_parts_mut($addr as *mut f64, $len);
                $body
            }
        }
    };
}

fn settled<D: GpuDevice>(dev: &D) -> Result<(), CollectiveError> {
    // The host reads what the device's queued kernels write: wait for them first.
    dev.synchronize().map_err(|e| CollectiveError::Device(e.0))
}

macro_rules! host_device_collective {
    ($group:ty) => {
        impl<D: HostMemory> DeviceCollective<D> for $group {
            unsafe fn all_reduce_on(
                &self,
                dev: &D,
                addr: u64,
                len: usize,
                kind: ElementKind,
                op: ReduceOp,
            ) -> Result<(), CollectiveError> {
                settled(dev)?;
                // SAFETY: the caller's contract; a HostMemory device's addresses are host pointers.
                typed_slice!(kind, addr, len, |s| self.all_reduce(s, op))
            }
            unsafe fn reduce_scatter_on(
                &self,
                dev: &D,
                addr: u64,
                k: usize,
                kind: ElementKind,
                op: ReduceOp,
            ) -> Result<(), CollectiveError> {
                settled(dev)?;
                let len = self.world_size() * k;
                typed_slice!(kind, addr, len, |s| self.reduce_scatter_in_place(s, k, op))
            }
            unsafe fn all_gather_on(
                &self,
                dev: &D,
                addr: u64,
                k: usize,
                kind: ElementKind,
            ) -> Result<(), CollectiveError> {
                settled(dev)?;
                let len = self.world_size() * k;
                typed_slice!(kind, addr, len, |s| self.all_gather_in_place(s, k))
            }
        }
    };
}

host_device_collective!(LocalGroup);
host_device_collective!(TcpGroup);
host_device_collective!(AnyGroup);

#[cfg(feature = "cuda")]
mod nccl {
    use super::*;
    use crate::backend::cuda::gpu::CudaGpu;
    use crate::collective::DeviceGroup;

    /// NCCL on the engine's stream, queued after the backward's kernels, then waited for under
    /// the watchdog (`DeviceGroup::watch`): the step's later wait, its status read, would block
    /// in the driver for ever behind a collective whose peer stopped. The wait costs the host's
    /// run-ahead of queuing the next kernels, not GPU time: the stream's order is unchanged.
    impl DeviceCollective<CudaGpu> for DeviceGroup {
        unsafe fn all_reduce_on(
            &self,
            dev: &CudaGpu,
            addr: u64,
            len: usize,
            kind: ElementKind,
            op: ReduceOp,
        ) -> Result<(), CollectiveError> {
            let stream = dev.device().cu_stream() as _;
            self.queue_all_reduce(addr, len, kind, op, stream)?;
            self.watch(Some(stream), "ncclAllReduce")
        }
        unsafe fn reduce_scatter_on(
            &self,
            dev: &CudaGpu,
            addr: u64,
            k: usize,
            kind: ElementKind,
            op: ReduceOp,
        ) -> Result<(), CollectiveError> {
            let stream = dev.device().cu_stream() as _;
            self.queue_reduce_scatter(addr, k, kind, op, stream)?;
            self.watch(Some(stream), "ncclReduceScatter")
        }
        unsafe fn all_gather_on(
            &self,
            dev: &CudaGpu,
            addr: u64,
            k: usize,
            kind: ElementKind,
        ) -> Result<(), CollectiveError> {
            let stream = dev.device().cu_stream() as _;
            self.queue_all_gather(addr, k, kind, stream)?;
            self.watch(Some(stream), "ncclAllGather")
        }
    }
}
