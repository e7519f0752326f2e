//! The CPU backend: reference and optimised kernels that run on the host.
//!
//! `gemm` is split out first because the CPU training step is GEMM-bound: which GEMM library
//! runs decides the CPU result, so every matmul of the engine goes through that one module.
//! `pool` (persistent threads), `blas` (single-threaded GEMM on raw pointers, split over the
//! pool), `kernels` (fast f32 kernels) and `planned` (the planned executor) are the fast path.

pub mod blas;
pub mod gemm;
pub mod kernels;
pub mod planned;
pub mod pool;
