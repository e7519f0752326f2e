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
use cudarc::driver::{CudaContext, CudaFunction, CudaStream};

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

/// An open GPU with the engine's kernels loaded.
pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
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
        let stream = ctx.default_stream();
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
            self.stream.cu_stream(),
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
        self.stream.cu_stream()
    }

    /// Zeroes a buffer (queued on the stream).
    pub fn zero(&self, buf: &DeviceBuffer) -> Result<(), CudaError> {
        self.ctx.bind_to_thread().map_err(|e| CudaError::Driver(format!("{e:?}")))?;
        // SAFETY: the whole of a live buffer of this context.
        unsafe {
            cudarc::driver::result::memset_d8_async(buf.ptr, 0, buf.bytes, self.stream.cu_stream())
        }
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

    /// Waits for everything queued.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.stream.synchronize().map_err(|e| CudaError::Driver(format!("{e:?}")))
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
