//! `Real`: the float type the reference ops are written over.
//!
//! The executor runs them in f32 (the engine's compute type, as PyTorch's f32 CPU ops do); the
//! tests also run them in f64 so that central finite differences can check every backward to
//! ~1e-7 instead of the ~1e-2 an f32 finite difference allows.

use super::def::{EvalArgs, OpDef};
use super::OpError;
use std::borrow::Cow;
use std::fmt::{Debug, Display};
use std::ops::{Add, AddAssign, Div, DivAssign, Mul, MulAssign, Neg, Sub, SubAssign};

pub trait Real:
    Copy
    + Debug
    + Display
    + Default
    + PartialOrd
    + Send
    + Sync
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
    + AddAssign
    + SubAssign
    + MulAssign
    + DivAssign
    + 'static
{
    const ZERO: Self;
    const ONE: Self;
    const NEG_INFINITY: Self;

    fn from_f64(x: f64) -> Self;
    fn to_f64(self) -> f64;
    fn exp(self) -> Self;
    fn ln(self) -> Self;
    fn sqrt(self) -> Self;
    fn tanh(self) -> Self;
    /// Error function, to libm accuracy in the type's own precision.
    fn erf(self) -> Self;
    fn max(self, other: Self) -> Self;
    /// Borrows when `Self` is f32 (the executor's case), converts otherwise.
    fn from_f32_slice(x: &[f32]) -> Cow<'_, [Self]>;
    /// A fast batched matmul for this type, if the backend has one: f32 goes to the CPU
    /// GEMM library (MKL, or the pure-Rust `gemm` crate); f64 (gradient checks) keeps the
    /// reference loops. Returns false when it did nothing.
    /// Runs `op`'s reference semantics in this type ([`RefEval`], the dispatch a generic method
    /// cannot have through `dyn OpDef`).
    fn eval_op(
        op: &dyn OpDef,
        a: &EvalArgs<'_, Self>,
        outs: &mut [Vec<Self>],
    ) -> Result<(), OpError>;
    fn matmul_fast(
        _out: &mut [Self],
        _a: &[Self],
        _b: &[Self],
        _d: &super::matmul::MatMulDims,
    ) -> bool {
        false
    }
}

impl Real for f32 {
    fn eval_op(
        op: &dyn OpDef,
        a: &EvalArgs<'_, f32>,
        outs: &mut [Vec<f32>],
    ) -> Result<(), OpError> {
        op.eval_f32(a, outs)
    }
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    const NEG_INFINITY: Self = f32::NEG_INFINITY;

    fn from_f64(x: f64) -> Self {
        x as f32
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn exp(self) -> Self {
        f32::exp(self)
    }
    fn ln(self) -> Self {
        f32::ln(self)
    }
    fn sqrt(self) -> Self {
        f32::sqrt(self)
    }
    fn tanh(self) -> Self {
        f32::tanh(self)
    }
    fn erf(self) -> Self {
        libm::erff(self)
    }
    fn max(self, other: Self) -> Self {
        f32::max(self, other)
    }
    fn from_f32_slice(x: &[f32]) -> Cow<'_, [Self]> {
        Cow::Borrowed(x)
    }
    fn matmul_fast(out: &mut [f32], a: &[f32], b: &[f32], d: &super::matmul::MatMulDims) -> bool {
        super::matmul::matmul_sgemm(out, a, b, d);
        true
    }
}

impl Real for f64 {
    fn eval_op(
        op: &dyn OpDef,
        a: &EvalArgs<'_, f64>,
        outs: &mut [Vec<f64>],
    ) -> Result<(), OpError> {
        op.eval_f64(a, outs)
    }
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    const NEG_INFINITY: Self = f64::NEG_INFINITY;

    fn from_f64(x: f64) -> Self {
        x
    }
    fn to_f64(self) -> f64 {
        self
    }
    fn exp(self) -> Self {
        f64::exp(self)
    }
    fn ln(self) -> Self {
        f64::ln(self)
    }
    fn sqrt(self) -> Self {
        f64::sqrt(self)
    }
    fn tanh(self) -> Self {
        f64::tanh(self)
    }
    fn erf(self) -> Self {
        libm::erf(self)
    }
    fn max(self, other: Self) -> Self {
        f64::max(self, other)
    }
    fn from_f32_slice(x: &[f32]) -> Cow<'_, [Self]> {
        Cow::Owned(x.iter().map(|&v| v as f64).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_matches_known_values() {
        // Reference values: Python math.erf.
        for (x, want) in [
            (0.5f64, 0.5204998778130465),
            (1.0, 0.8427007929497149),
            (2.0, 0.9953222650189527),
            (-0.3, -0.3286267594591274),
        ] {
            assert!((Real::erf(x) - want).abs() < 1e-15, "erf({x})");
            assert!((Real::erf(x as f32) as f64 - want).abs() < 1e-7, "erff({x})");
        }
    }
}
