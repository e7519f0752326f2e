//! Fast f32 CPU kernels of the planned executor, one small module per op family, each with a
//! shape comment per tensor argument, a reference to the op it implements, and a test against
//! that reference op (`crate::ops`) on random, never-zero inputs with a stated tolerance.
//!
//! Threading: every kernel takes the [`Pool`](super::pool::Pool) and splits its work into at
//! most `threads` contiguous parts (rows, columns, (batch, head) pairs, GEMM row blocks), or
//! stays on the calling thread when the work is too small to pay a wake-up. Vectorisation: hot
//! loops are compiled for AVX-512 / AVX2 and picked at run time ([`simd`]).

pub mod attention;
pub mod copy;
pub mod cross_entropy;
pub mod elementwise;
pub mod embedding;
pub mod layernorm;
pub mod linear_cross_entropy;
pub mod matmul;
pub mod pointwise;
pub mod reduce;
pub mod rmsnorm;
pub mod rotary;
pub mod rows;
pub mod simd;
pub mod softmax;
