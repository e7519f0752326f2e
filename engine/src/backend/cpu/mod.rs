//! The CPU backend: reference and optimised kernels that run on the host.
//!
//! `gemm` is split out first because the CPU training step is GEMM-bound: which GEMM library
//! runs decides the CPU result, so every matmul of the engine goes through that one module.
//! `pool` (persistent threads), `blas` (single-threaded GEMM on raw pointers, split over the
//! pool) and `kernels` (fast f32 kernels) are the fast path the planned executor
//! (`exec::planned`) runs.

pub mod amx_gemm;
pub mod bf16_gemm;
pub mod blas;
pub mod gemm;
pub mod kernels;
pub mod pool;
