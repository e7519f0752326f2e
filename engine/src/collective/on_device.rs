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
//!   NCCL calls themselves need one. Each runs on a thread of its own under the watchdog that
//!   waits for NCCL's ([`watchdog::watch`]), which aborts the group past its timeout: the
//!   watchdog's poll-and-abort path runs in CI too.
//!
//! Layouts are NCCL's in-place ones: a flat buffer of world·k elements in chunks of k, chunk r
//! rank r's ([`crate::collective::chunk`]).

use super::watchdog::{self, Progress, Watched};
use super::{
    Abortable, AnyGroup, Collective, CollectiveError, ElementKind, LocalGroup, ReduceOp, TcpGroup,
};
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

/// A host transport's collective in flight on its own thread, as the watchdog sees it: the
/// thread's end is the collective's completion, the group's abort its `ncclCommAbort`.
struct OnThread<'a, 'scope, G> {
    thread: &'a std::thread::ScopedJoinHandle<'scope, Result<(), CollectiveError>>,
    group: &'a G,
}

impl<G: Abortable> Watched for OnThread<'_, '_, G> {
    fn poll(&self) -> Result<Progress, CollectiveError> {
        Ok(if self.thread.is_finished() { Progress::Done } else { Progress::Pending })
    }
    fn abort(&self) {
        self.group.abort();
    }
}

/// Runs `collective` as NCCL runs one on a non-blocking communicator: started, then waited for
/// by [`watchdog::watch`] (the code that waits for NCCL's), which past the group's timeout
/// aborts the group and fails naming `name`. The abort releases the thread (a host group's
/// abort ends its blocked waits), so leaving the scope joins it: nothing is left running.
fn watched<G: Abortable>(
    group: &G,
    name: &str,
    collective: impl FnOnce() -> Result<(), CollectiveError> + Send,
) -> Result<(), CollectiveError> {
    std::thread::scope(|s| {
        let thread = s.spawn(collective);
        watchdog::watch(&OnThread { thread: &thread, group }, name, group.collective_timeout())?;
        thread.join().unwrap_or_else(|_| {
            Err(CollectiveError::Device(format!("{name}: its thread panicked")))
        })
    })
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
                // SAFETY: the caller's contract; a HostMemory device's addresses are host
                // pointers, and `watched` returns only once the collective's thread has ended.
                watched(self, "all_reduce", || unsafe {
                    typed_slice!(kind, addr, len, |s| self.all_reduce(s, op))
                })
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
                // SAFETY: as in all_reduce_on.
                watched(self, "reduce_scatter", || unsafe {
                    typed_slice!(kind, addr, len, |s| self.reduce_scatter_in_place(s, k, op))
                })
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
                // SAFETY: as in all_reduce_on.
                watched(self, "all_gather", || unsafe {
                    typed_slice!(kind, addr, len, |s| self.all_gather_in_place(s, k))
                })
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

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use ortbench_simt::Order;

    use super::*;
    use crate::backend::simt_device::SimtGpu;

    /// `len` f32 of rank `rank`'s values (never zero) in a SIMT device buffer.
    fn device_values(
        dev: &SimtGpu,
        rank: usize,
        len: usize,
    ) -> (<SimtGpu as GpuDevice>::Buffer, u64) {
        let buf = dev.alloc_zeroed(4 * len).unwrap();
        let at = dev.address(&buf);
        let v: Vec<u8> =
            (0..len).flat_map(|i| (0.5 + (rank * len + i) as f32).to_le_bytes()).collect();
        // SAFETY: the buffer holds len f32.
        unsafe { dev.upload(at, &v).unwrap() };
        (buf, at)
    }

    /// Under the watchdog, a device collective whose peer completes gives the host
    /// collective's result.
    #[test]
    fn a_watched_all_reduce_on_the_simt_device_sums_over_the_ranks() {
        let out: Vec<Vec<f32>> = std::thread::scope(|s| {
            let hs: Vec<_> = LocalGroup::new(2)
                .into_iter()
                .map(|g| {
                    s.spawn(move || {
                        let dev = SimtGpu::new(32, Order::Forward);
                        let (buf, at) = device_values(&dev, g.rank(), 5);
                        // SAFETY: 5 f32 at `at`.
                        unsafe { g.all_reduce_on(&dev, at, 5, ElementKind::F32, ReduceOp::Sum) }
                            .unwrap();
                        let mut b = [0u8; 20];
                        unsafe { dev.download(at, &mut b).unwrap() };
                        drop(buf);
                        b.chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let want: Vec<f32> = (0..5).map(|i| (0.5 + i as f32) + (0.5 + (5 + i) as f32)).collect();
        assert_eq!(out, vec![want.clone(), want]);
    }

    /// The injected never-completing collective: rank 1 never calls it. Rank 0's watchdog
    /// polls past the group's timeout, aborts the group and fails naming the collective; the
    /// collective's thread is joined (nothing left running), and the group is unusable.
    #[test]
    fn a_never_completing_collective_on_the_simt_device_is_aborted_by_the_watchdog() {
        let t = Duration::from_millis(300);
        let mut ranks = LocalGroup::new(2).into_iter();
        let r0 = ranks.next().unwrap().with_collective_timeout(t);
        let r1 = ranks.next().unwrap();
        // Rank 0 on a thread of its own, so that a watchdog that fails to end the wait fails
        // this test instead of hanging it.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let dev = SimtGpu::new(32, Order::Forward);
            let (_buf, at) = device_values(&dev, 0, 64);
            let start = Instant::now();
            // SAFETY: 64 f32 at `at` (2 chunks of 32).
            let e = unsafe { r0.reduce_scatter_on(&dev, at, 32, ElementKind::F32, ReduceOp::Sum) };
            tx.send((e, start.elapsed())).unwrap();
        });
        let (e, waited) = rx.recv_timeout(Duration::from_secs(20)).expect("rank 0 still waits");
        assert!(waited >= t, "{waited:?}");
        assert_eq!(
            e,
            Err(CollectiveError::Stalled { collective: "reduce_scatter".into(), after: t })
        );
        let dev = SimtGpu::new(32, Order::Forward);
        let (_buf, at) = device_values(&dev, 1, 64);
        // SAFETY: as above.
        let late = unsafe { r1.all_gather_on(&dev, at, 32, ElementKind::F32) };
        assert_eq!(late, Err(CollectiveError::Aborted("all_gather_in_place")));
    }
}
