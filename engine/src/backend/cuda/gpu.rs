//! The NVIDIA GPU as the GPU executor drives it ([`GpuDevice`]): the engine's kernels
//! ([`CudaDevice`]) and GEMMs on cuBLASLt ([`Gemm`]) on one stream.

use std::cell::RefCell;

use cudarc::driver::sys::CUdevice_attribute;

use super::device::{CudaDevice, DeviceBuffer, PinnedBuffer, StepGraph};
use super::gemm::Gemm;
use super::CudaError;
use crate::backend::gpu::{Epilogue, GemmPtrs, GemmShape, GpuDevice, GpuError, KernelArg};

/// One GPU with its kernels and a cuBLASLt handle (plans cached per shape).
pub struct CudaGpu {
    dev: CudaDevice,
    gemm: RefCell<Gemm>,
    sms: u32,
    max_smem: u32,
}

fn err(e: CudaError) -> GpuError {
    GpuError(e.to_string())
}

impl CudaGpu {
    /// Opens GPU `ordinal` (see [`super::open`]) with cuBLASLt.
    pub fn open(ordinal: usize) -> Result<CudaGpu, CudaError> {
        let dev = CudaDevice::open(ordinal)?;
        let gemm = Gemm::new(&dev)?;
        let sms =
            dev.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32;
        let max_smem = dev
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?
            as u32;
        Ok(CudaGpu { dev, gemm: RefCell::new(gemm), sms, max_smem })
    }

    pub fn device(&self) -> &CudaDevice {
        &self.dev
    }
}

impl GpuDevice for CudaGpu {
    type Buffer = DeviceBuffer;
    type Pinned = PinnedBuffer;
    type Graph = StepGraph;

    fn describe(&self) -> String {
        format!("{} ({})", self.dev.name(), self.dev.arch())
    }
    fn warp_size(&self) -> u32 {
        32
    }
    fn max_blocks(&self) -> u32 {
        // A few waves of full SMs: enough blocks in flight to hide latency.
        self.sms * 16
    }
    fn max_shared_bytes(&self) -> u32 {
        self.max_smem
    }
    fn has_mma(&self) -> bool {
        // "sm_XY": mma.sync m16n8k16 with bf16 operands needs sm_80.
        self.dev.arch()[3..].parse::<u32>().is_ok_and(|v| v >= 80)
    }
    fn alloc_zeroed(&self, bytes: usize) -> Result<DeviceBuffer, GpuError> {
        let b = self.dev.alloc(bytes).map_err(err)?;
        self.dev.zero(&b).map_err(err)?;
        Ok(b)
    }
    fn address(&self, buf: &DeviceBuffer) -> u64 {
        buf.ptr()
    }
    unsafe fn upload(&self, dst: u64, src: &[u8]) -> Result<(), GpuError> {
        self.dev.upload_to(dst, src).map_err(err)
    }
    unsafe fn download(&self, src: u64, dst: &mut [u8]) -> Result<(), GpuError> {
        self.dev.download_from(src, dst).map_err(err)
    }
    unsafe fn launch(
        &self,
        name: &str,
        grid: u32,
        block: u32,
        shared_bytes: u32,
        args: &[KernelArg],
    ) -> Result<(), GpuError> {
        self.dev.launch(name, (grid, 1, 1), (block, 1, 1), shared_bytes, args).map_err(err)
    }
    unsafe fn gemm(&self, shape: &GemmShape, ptrs: &GemmPtrs) -> Result<(), GpuError> {
        // β = 1 only where the shape asks to add into C.
        let beta = if shape.epilogue == Epilogue::Accumulate { 1.0 } else { 0.0 };
        self.gemm.borrow_mut().run(self.dev.cu_stream() as _, shape, ptrs, 1.0, beta).map_err(err)
    }
    fn synchronize(&self) -> Result<(), GpuError> {
        self.dev.synchronize().map_err(err)
    }
    fn alloc_pinned(&self, bytes: usize) -> Result<PinnedBuffer, GpuError> {
        self.dev.alloc_pinned(bytes).map_err(err)
    }
    unsafe fn upload_pinned(&self, dst: u64, src: &PinnedBuffer) -> Result<(), GpuError> {
        self.dev.upload_pinned(dst, src).map_err(err)
    }
    fn capture_begin(&self) -> Result<(), GpuError> {
        self.dev.capture_begin().map_err(err)
    }
    fn capture_end(&self) -> Result<StepGraph, GpuError> {
        self.dev.capture_end().map_err(err)
    }
    unsafe fn replay(&self, graph: &StepGraph) -> Result<(), GpuError> {
        graph.launch().map_err(err)
    }
}
