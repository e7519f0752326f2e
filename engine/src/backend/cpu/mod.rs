//! The CPU backend: reference and optimised kernels that run on the host.
//!
//! `gemm` is split out first because the CPU training step is GEMM-bound: which GEMM library
//! runs decides the CPU result, so every matmul of the engine goes through that one module.

pub mod gemm;
