//! Measuring a GPU run the same way whoever computes on it (libtorch or the engine): device time
//! of a step between two CUDA events, and the device memory the run used at its peak.
//!
//! - Time: events recorded on the legacy default stream (the stream libtorch computes on by
//!   default and that synchronises with every blocking stream) before and after the step;
//!   `end_step` waits for the second and returns the elapsed device time. The caller keeps the
//!   wall time to the same point as its own figure (events miss the host's launch gaps before
//!   the first kernel; wall time includes them).
//! - Memory: `cuMemGetInfo` on the device, polled every 2 ms by a thread and once more at each
//!   step's end; the peak is the largest used − used-at-start, i.e. everything the run
//!   allocated after the CUDA context existed (weights, activations, optimizer state, the
//!   framework allocator's cache) — one source for every config. It is device-wide: on a GPU
//!   shared with other processes their allocations count too (the GPU machines are not shared).
//!   optimum-benchmark's `max_global_vram` is the same quantity (NVML, device-wide, polled).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaContext, CudaEvent, CudaStream};

use super::libs::{self, CudaLib};
use super::CudaError;

pub struct DeviceWatch {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    start: CudaEvent,
    end: CudaEvent,
    base_used: u64,
    peak_used: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    poller: Option<JoinHandle<()>>,
}

fn drv(what: &str, e: cudarc::driver::DriverError) -> CudaError {
    CudaError::Driver(format!("{what}: {e:?}"))
}

fn used(ctx: &CudaContext) -> Result<u64, CudaError> {
    let (free, total) = ctx.mem_get_info().map_err(|e| drv("cuMemGetInfo", e))?;
    Ok(total.saturating_sub(free) as u64)
}

impl DeviceWatch {
    /// Opens GPU `ordinal`'s primary context (the one libtorch's runtime uses too), notes the
    /// memory in use now and starts the poller.
    pub fn start(ordinal: usize) -> Result<DeviceWatch, CudaError> {
        libs::load(CudaLib::Driver)?;
        let ctx =
            CudaContext::new(ordinal).map_err(|e| drv(&format!("opening GPU {ordinal}"), e))?;
        let stream = ctx.default_stream();
        let timing = Some(CUevent_flags::CU_EVENT_DEFAULT);
        let start = ctx.new_event(timing).map_err(|e| drv("cuEventCreate", e))?;
        let end = ctx.new_event(timing).map_err(|e| drv("cuEventCreate", e))?;
        let base_used = used(&ctx)?;
        let peak_used = Arc::new(AtomicU64::new(base_used));
        let stop = Arc::new(AtomicBool::new(false));
        let poller = {
            let (ctx, peak, stop) = (ctx.clone(), peak_used.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(u) = used(&ctx) {
                        peak.fetch_max(u, Ordering::Relaxed);
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
            })
        };
        Ok(DeviceWatch {
            ctx,
            stream,
            start,
            end,
            base_used,
            peak_used,
            stop,
            poller: Some(poller),
        })
    }

    /// Records the start event of a step.
    pub fn begin_step(&self) -> Result<(), CudaError> {
        self.start.record(&self.stream).map_err(|e| drv("cuEventRecord", e))
    }

    /// Records the end event, waits for it, and returns the step's device time in ms.
    pub fn end_step(&self) -> Result<f64, CudaError> {
        self.end.record(&self.stream).map_err(|e| drv("cuEventRecord", e))?;
        let ms = self.start.elapsed_ms(&self.end).map_err(|e| drv("cuEventElapsedTime", e))?;
        if let Ok(u) = used(&self.ctx) {
            self.peak_used.fetch_max(u, Ordering::Relaxed);
        }
        Ok(ms as f64)
    }

    /// Peak device memory used since [`start`](Self::start), in bytes.
    pub fn peak_bytes(&self) -> u64 {
        self.peak_used.load(Ordering::Relaxed).saturating_sub(self.base_used)
    }
}

impl Drop for DeviceWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(p) = self.poller.take() {
            let _ = p.join();
        }
    }
}
