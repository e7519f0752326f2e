//! One NVIDIA GPU: context, stream, the engine's kernels compiled for it, memory and launches.
//!
//! Kernels are `engine/kernels/*.cu` (see [`super::gpu_sources`]), loaded for the device's
//! architecture from an ahead-of-time cubin, the PTX cache or NVRTC ([`super::kernel_cache`]).
//! A launch takes its arguments as [`KernelArg`]s, packed the way `cuLaunchKernel` wants them
//! (an array of pointers to the values) — the same convention as the host SIMT harness, so the
//! kernel tests run unchanged on either.
//!
//! References: cudarc's `driver`/`nvrtc` safe API (context, stream, modules) and its `result`
//! layer for the raw launch; candle's `cuda_backend` for the compile-once module cache.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;

use super::kernel_cache;
use super::libs::{self, CudaLib};
use super::CudaError;
use crate::backend::gpu_sources;
use cudarc::driver::result::{graph, stream};
use cudarc::driver::sys::{CUgraph, CUgraphExec, CUstream};
use cudarc::driver::{CudaContext, CudaFunction};

pub use crate::backend::gpu::KernelArg;

/// Device memory owned by the engine (freed on drop).
pub struct DeviceBuffer {
    ptr: u64,
    bytes: usize,
    ctx: Arc<CudaContext>,
}

impl DeviceBuffer {
    pub fn ptr(&self) -> u64 {
        self.ptr
    }
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: `ptr` came from mem_alloc in this context and is freed once.
            let _ = unsafe { cudarc::driver::result::free_sync(self.ptr) };
        }
    }
}

/// Page-locked host memory (freed on drop): the source of asynchronous uploads.
pub struct PinnedBuffer {
    ptr: *mut u8,
    len: usize,
    ctx: Arc<CudaContext>,
}

// SAFETY: the buffer owns its allocation; nothing else holds the pointer.
unsafe impl Send for PinnedBuffer {}

impl std::ops::Deref for PinnedBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `len` bytes allocated (at least one) and owned by this buffer.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}
impl std::ops::DerefMut for PinnedBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, borrowed mutably through `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: `ptr` came from malloc_host in this context and is freed once.
            let _ = unsafe { cudarc::driver::result::free_host(self.ptr as *mut c_void) };
        }
    }
}

/// The device's one stream. A blocking stream of its own: not the legacy default stream, which
/// cannot be captured, yet ordered with it — `watch::DeviceWatch` times a step between events
/// on the legacy stream, for libtorch and the engine alike.
struct Stream {
    raw: CUstream,
    ctx: Arc<CudaContext>,
}

// SAFETY: a CUDA stream handle may be used from any thread of its context (the driver
// serialises calls on it), as cudarc's own `CudaStream` is Send and Sync.
unsafe impl Send for Stream {}
unsafe impl Sync for Stream {}

impl Drop for Stream {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: created by `stream::create` in this context and destroyed once.
            let _ = unsafe { stream::destroy(self.raw) };
        }
    }
}

/// A captured step, instantiated ([`CudaDevice::capture_end`]), freed on drop.
pub struct StepGraph {
    graph: CUgraph,
    exec: CUgraphExec,
    stream: CUstream,
    ctx: Arc<CudaContext>,
}

// SAFETY: the graph is owned here and used by one thread at a time (`&self` launches only;
// CUDA requires no concurrent use of one graph, which `Send` without `Sync` keeps).
unsafe impl Send for StepGraph {}

impl StepGraph {
    /// Queues the captured work on the stream it was captured on.
    ///
    /// # Safety
    /// Every buffer the captured work addresses is alive.
    pub unsafe fn launch(&self) -> Result<(), CudaError> {
        self.ctx.bind_to_thread().map_err(|e| CudaError::Driver(format!("{e:?}")))?;
        graph::launch(self.exec, self.stream)
            .map_err(|e| CudaError::Driver(format!("replaying the captured step: {e:?}")))
    }
}

impl Drop for StepGraph {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: instantiated from `graph` by capture_end; each destroyed once.
            unsafe {
                let _ = graph::exec_destroy(self.exec);
                let _ = graph::destroy(self.graph);
            }
        }
    }
}

/// An open GPU with the engine's kernels loaded.
pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    stream: Stream,
    name: String,
    arch: &'static str,
    functions: HashMap<String, CudaFunction>,
    origins: Vec<(&'static str, kernel_cache::Origin)>,
}

impl CudaDevice {
    /// Opens GPU `ordinal`: probes the driver and NVRTC (an error names what was looked for),
    /// creates the context, compiles (or loads from the cache) every kernel source for the
    /// device's architecture at warp size 32.
    pub fn open(ordinal: usize) -> Result<CudaDevice, CudaError> {
        libs::load(CudaLib::Driver)?;
        libs::load(CudaLib::Nvrtc)?;
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| CudaError::Driver(format!("opening GPU {ordinal}: {e:?}")))?;
        let name = ctx.name().map_err(|e| CudaError::Driver(format!("{e:?}")))?;
        let (major, minor) =
            ctx.compute_capability().map_err(|e| CudaError::Driver(format!("{e:?}")))?;
        let arch = arch_name(major, minor);
        // One stream, one arena: cudarc's per-allocation event tracking is pure overhead.
        // SAFETY: every launch and copy of this device goes through `stream`.
        unsafe { ctx.disable_event_tracking() };
        ctx.bind_to_thread().map_err(|e| CudaError::Driver(format!("{e:?}")))?;
        let raw = stream::create(stream::StreamKind::Default)
            .map_err(|e| CudaError::Driver(format!("creating a stream: {e:?}")))?;
        let stream = Stream { raw, ctx: ctx.clone() };
        let mut functions = HashMap::new();
        let mut origins = Vec::new();
        for (file, _) in gpu_sources::SOURCES {
            let k = kernel_cache::image(file, arch)?;
            let module = ctx.load_module(k.image).map_err(|e| {
                CudaError::Driver(format!("loading {file} for {arch} ({}): {e:?}", k.origin))
            })?;
            origins.push((*file, k.origin));
            for name in k.entries {
                let f = module
                    .load_function(&name)
                    .map_err(|e| CudaError::Driver(format!("kernel {name} in {file}: {e:?}")))?;
                functions.insert(name, f);
            }
        }
        Ok(CudaDevice { ctx, stream, name, arch, functions, origins })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `sm_XY` of the device.
    pub fn arch(&self) -> &'static str {
        self.arch
    }

    /// Where each kernel file's code came from (an ahead-of-time cubin, cached PTX or NVRTC).
    pub fn kernel_origins(&self) -> &[(&'static str, kernel_cache::Origin)] {
        &self.origins
    }

    /// Names of the loaded kernels.
    pub fn kernel_names(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.functions.keys().map(|s| s.as_str()).collect();
        v.sort();
        v
    }

    /// `bytes` of uninitialised device memory.
    pub fn alloc(&self, bytes: usize) -> Result<DeviceBuffer, CudaError> {
        self.ctx.bind_to_thread().map_err(|e| CudaError::Driver(format!("{e:?}")))?;
        // SAFETY: a plain allocation in the current (bound) context.
        let ptr = unsafe { cudarc::driver::result::malloc_sync(bytes.max(1)) }
            .map_err(|e| CudaError::Driver(format!("allocating {bytes} bytes: {e:?}")))?;
        Ok(DeviceBuffer { ptr, bytes, ctx: self.ctx.clone() })
    }

    /// Copies `src` into `dst` (synchronous: tests and set-up, not the step).
    pub fn upload(&self, dst: &DeviceBuffer, src: &[u8]) -> Result<(), CudaError> {
        if src.len() > dst.bytes {
            return Err(CudaError::Driver(format!(
                "upload of {} bytes into a buffer of {}",
                src.len(),
                dst.bytes
            )));
        }
        self.ctx.bind_to_thread().map_err(|e| CudaError::Driver(format!("{e:?}")))?;
        // SAFETY: `dst` holds at least `src.len()` bytes.
        unsafe { cudarc::driver::result::memcpy_htod_sync(dst.ptr, src) }
            .map_err(|e| CudaError::Driver(format!("{e:?}")))
    }

    /// Copies `src` back to the host, after everything queued on the stream.
    pub fn download(&self, src: &DeviceBuffer, dst: &mut [u8]) -> Result<(), CudaError> {
        if dst.len() > src.bytes {
            return Err(CudaError::Driver(format!(
                "download of {} bytes from a buffer of {}",
                dst.len(),
                src.bytes
            )));
        }
        self.synchronize()?;
        // SAFETY: `src` holds at least `dst.len()` bytes.
        unsafe { cudarc::driver::result::memcpy_dtoh_sync(dst, src.ptr) }
            .map_err(|e| CudaError::Driver(format!("{e:?}")))
    }

    /// Queues kernel `name` on the device's stream.
    ///
    /// # Safety
    /// `args` must match the kernel's C signature in number and type, and every pointer must
    /// address device memory large enough for what the kernel touches at this grid.
    pub unsafe fn launch(
        &self,
        name: &str,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        shared_bytes: u32,
        args: &[KernelArg],
    ) -> Result<(), CudaError> {
        let f =
            self.functions.get(name).ok_or_else(|| CudaError::UnknownKernel(name.to_string()))?;
        let mut words: Vec<u64> = args.iter().map(KernelArg::word).collect();
        // cuLaunchKernel reads each argument's size from the kernel's signature, starting at
        // the pointed-to address: the low bytes of a little-endian u64 are the 4-byte value.
        let mut params: Vec<*mut c_void> =
            words.iter_mut().map(|w| w as *mut u64 as *mut c_void).collect();
        self.ctx.bind_to_thread().map_err(|e| CudaError::Driver(format!("{e:?}")))?;
        // Above 48 KiB a kernel must opt in to more dynamic shared memory (attention's tiles).
        if shared_bytes > 48 * 1024 {
            f.set_attribute(cudarc::driver::sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shared_bytes as i32)
                .map_err(|e| CudaError::Driver(format!("{name}: {shared_bytes} bytes of shared memory: {e:?}")))?;
        }
        cudarc::driver::result::launch_kernel(
            f.cu_function(),
            grid,
            block,
            shared_bytes,
            self.stream.raw,
            &mut params,
        )
        .map_err(|e| CudaError::Driver(format!("launching {name}: {e:?}")))
    }

    /// A device attribute (`cuDeviceGetAttribute`).
    pub fn attribute(&self, a: cudarc::driver::sys::CUdevice_attribute) -> Result<i32, CudaError> {
        self.ctx.attribute(a).map_err(|e| CudaError::Driver(format!("{a:?}: {e:?}")))
    }

    /// The stream every launch and copy of this device is queued on.
    pub fn cu_stream(&self) -> cudarc::driver::sys::CUstream {
        self.stream.raw
    }

    /// Zeroes a buffer (queued on the stream).
    pub fn zero(&self, buf: &DeviceBuffer) -> Result<(), CudaError> {
        self.ctx.bind_to_thread().map_err(|e| CudaError::Driver(format!("{e:?}")))?;
        // SAFETY: the whole of a live buffer of this context.
        unsafe { cudarc::driver::result::memset_d8_async(buf.ptr, 0, buf.bytes, self.stream.raw) }
            .map_err(|e| CudaError::Driver(format!("{e:?}")))
    }

    /// Copies `src` to device address `dst` (ordered after the queued work).
    ///
    /// # Safety
    /// `dst .. dst + src.len()` lies in one live buffer of this device.
    pub unsafe fn upload_to(&self, dst: u64, src: &[u8]) -> Result<(), CudaError> {
        self.ctx.bind_to_thread().map_err(|e| CudaError::Driver(format!("{e:?}")))?;
        // The host slice may be reused once this returns: copy from it synchronously.
        self.synchronize()?;
        cudarc::driver::result::memcpy_htod_sync(dst, src)
            .map_err(|e| CudaError::Driver(format!("{e:?}")))
    }

    /// Copies device bytes at `src` to the host after the queued work.
    ///
    /// # Safety
    /// `src .. src + dst.len()` lies in one live buffer of this device.
    pub unsafe fn download_from(&self, src: u64, dst: &mut [u8]) -> Result<(), CudaError> {
        self.synchronize()?;
        cudarc::driver::result::memcpy_dtoh_sync(dst, src)
            .map_err(|e| CudaError::Driver(format!("{e:?}")))
    }

    /// `bytes` of zeroed page-locked host memory (`cuMemHostAlloc`).
    pub fn alloc_pinned(&self, bytes: usize) -> Result<PinnedBuffer, CudaError> {
        self.ctx.bind_to_thread().map_err(|e| CudaError::Driver(format!("{e:?}")))?;
        let len = bytes.max(1);
        // SAFETY: a plain allocation in the current context; zeroed before it is shared.
        let ptr = unsafe { cudarc::driver::result::malloc_host(len, 0) }
            .map_err(|e| CudaError::Driver(format!("pinning {bytes} bytes: {e:?}")))?;
        // SAFETY: `len` writable bytes at `ptr`.
        unsafe { std::ptr::write_bytes(ptr as *mut u8, 0, len) };
        Ok(PinnedBuffer { ptr: ptr as *mut u8, len: bytes, ctx: self.ctx.clone() })
    }

    /// Queues a copy of page-locked `src` to device address `dst` on the stream.
    ///
    /// # Safety
    /// `dst .. dst + src.len()` lies in one live buffer; `src` is unchanged until it has run.
    pub unsafe fn upload_pinned(&self, dst: u64, src: &PinnedBuffer) -> Result<(), CudaError> {
        self.ctx.bind_to_thread().map_err(|e| CudaError::Driver(format!("{e:?}")))?;
        cudarc::driver::result::memcpy_htod_async(dst, &src[..], self.stream.raw)
            .map_err(|e| CudaError::Driver(format!("{e:?}")))
    }

    /// Starts capturing the stream (this thread's calls only).
    pub fn capture_begin(&self) -> Result<(), CudaError> {
        use cudarc::driver::sys::CUstreamCaptureMode;
        self.ctx.bind_to_thread().map_err(|e| CudaError::Driver(format!("{e:?}")))?;
        let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        // SAFETY: the device's live stream.
        unsafe { stream::begin_capture(self.stream.raw, mode) }
            .map_err(|e| CudaError::Driver(format!("beginning a capture: {e:?}")))
    }

    /// Ends the capture and instantiates what it recorded.
    pub fn capture_end(&self) -> Result<StepGraph, CudaError> {
        self.ctx.bind_to_thread().map_err(|e| CudaError::Driver(format!("{e:?}")))?;
        // SAFETY: the device's live stream, capturing.
        let g = unsafe { stream::end_capture(self.stream.raw) }
            .map_err(|e| CudaError::Driver(format!("ending a capture: {e:?}")))?;
        if g.is_null() {
            return Err(CudaError::Driver("the capture recorded nothing".into()));
        }
        let flags = cudarc::driver::sys::CUgraphInstantiate_flags(0);
        // SAFETY: `g` is the graph just captured; destroyed here if it cannot be instantiated.
        match unsafe { graph::instantiate(g, flags) } {
            Ok(exec) => {
                Ok(StepGraph { graph: g, exec, stream: self.stream.raw, ctx: self.ctx.clone() })
            }
            Err(e) => {
                // SAFETY: as above, destroyed once.
                let _ = unsafe { graph::destroy(g) };
                Err(CudaError::Driver(format!("instantiating the captured step: {e:?}")))
            }
        }
    }

    /// Waits for everything queued.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.ctx.bind_to_thread().map_err(|e| CudaError::Driver(format!("{e:?}")))?;
        // SAFETY: the device's live stream.
        unsafe { stream::synchronize(self.stream.raw) }
            .map_err(|e| CudaError::Driver(format!("{e:?}")))
    }
}

/// The NVRTC architecture name of compute capability `major.minor`; `a` variants are not
/// used, so the PTX runs on every part of that capability.
fn arch_name(major: i32, minor: i32) -> &'static str {
    match (major, minor) {
        (7, 0) => "sm_70",
        (7, 5) => "sm_75",
        (8, 0) => "sm_80",
        (8, 6) => "sm_86",
        (8, 9) => "sm_89",
        (9, 0) => "sm_90",
        (10, 0) => "sm_100",
        (12, 0) => "sm_120",
        // NVRTC's option type wants a 'static str; one leak per process and new architecture.
        _ => Box::leak(format!("sm_{major}{minor}").into_boxed_str()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_pack_little_endian_into_words() {
        assert_eq!(KernelArg::I32(-1).word(), 0xffff_ffff);
        assert_eq!(KernelArg::F32(1.5).word(), 1.5f32.to_bits() as u64);
        assert_eq!(KernelArg::Ptr(0xdead_beef_0000).word(), 0xdead_beef_0000);
        assert_eq!(arch_name(9, 0), "sm_90");
        assert_eq!(arch_name(11, 3), "sm_113");
    }
}
