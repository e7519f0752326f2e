//! Compute backends of the engine, one module per device family.
//!
//! Why a module tree rather than one file: each backend brings its own library bindings (MKL on
//! CPU, cuBLAS/NCCL on CUDA, hipBLAS/RCCL on ROCm), and keeping them apart keeps each one small
//! enough to read next to its tests. See `docs/ARCHITECTURE.md`, "The engine pipeline".

pub mod cpu;
pub mod cuda;
pub mod gpu;
pub mod gpu_sources;
pub mod hip;
/// The host SIMT harness as a GPU device (for tests: the engine's own and, under the `simt`
/// feature, the `tests` crate's).
#[cfg(any(test, feature = "simt"))]
pub mod simt_device;
