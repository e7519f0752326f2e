//! The NVIDIA backend: the engine's kernels (`engine/kernels/*.cu`) compiled at run time with
//! NVRTC, launched through the CUDA driver API, with cudarc (dynamic loading, so the crate
//! builds and its tests run on machines with no CUDA at all).
//!
//! - the kernel sources and NVRTC options are `backend::gpu_sources` (shared with HIP).
//! - [`libs`]: finds libcuda / libnvrtc / libcublasLt before cudarc would panic on a missing
//!   one, so a user gets an error naming what was looked for.
//! - [`kernel_cache`]: the kernel files' code for an architecture — an ahead-of-time cubin,
//!   PTX cached on disk, or NVRTC now.
//! - [`device`]: one GPU — context, stream, kernel modules, memory, launches.
//! - [`gemm`]: GEMMs on cuBLASLt with epilogues, one cached plan per shape.
//! - [`gpu`]: the GPU as the GPU executor (`exec::gpu`) drives it: kernels + cuBLASLt.
//! - [`watch`]: step device time by CUDA events and peak device memory, for the harness.
//!
//! Behind the `cuda` cargo feature (on by default); without it [`open`] is an error saying so.

#[cfg(feature = "cuda")]
pub mod device;
#[cfg(feature = "cuda")]
pub mod gemm;
#[cfg(feature = "cuda")]
pub mod gpu;
#[cfg(feature = "cuda")]
pub mod kernel_cache;
#[cfg(feature = "cuda")]
pub mod libs;
#[cfg(feature = "cuda")]
pub mod watch;

/// What can go wrong bringing up or driving a GPU.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum CudaError {
    #[error("{lib} not found (tried {tried}): is an NVIDIA driver installed? For NVRTC/cuBLASLt, set ORTBENCH_CUDA_LIB_DIR to the folder that holds them (the torch wheel's site-packages/nvidia/cu13/lib)")]
    LibraryNotFound { lib: &'static str, tried: String },
    #[error("CUDA driver: {0}")]
    Driver(String),
    #[error("NVRTC could not compile {file} for {arch}:\n{log}")]
    Nvrtc { file: String, arch: &'static str, log: String },
    #[error("no kernel named '{0}' in engine/kernels")]
    UnknownKernel(String),
    #[error("this build of ortbench-engine was compiled without the `cuda` feature: rebuild with `--features cuda` (on by default)")]
    NotCompiled,
}

/// Opens GPU `ordinal` with the engine's kernels loaded.
#[cfg(feature = "cuda")]
pub fn open(ordinal: usize) -> Result<device::CudaDevice, CudaError> {
    device::CudaDevice::open(ordinal)
}

/// Without the `cuda` feature there is no GPU backend to open.
#[cfg(not(feature = "cuda"))]
pub fn open(_ordinal: usize) -> Result<std::convert::Infallible, CudaError> {
    Err(CudaError::NotCompiled)
}
