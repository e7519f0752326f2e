//! CPU kernels of the pointwise functions of `ops::pointwise`: each function's formula is a
//! [`Map1`] (forward) and a [`Map2`] (backward, f(x, dy)) or a [`Map2`] (binary), run by the
//! drivers of `elementwise` (threads, SIMD, broadcast). The function is dispatched once per
//! call, outside the loop: [`with_unary`] and [`with_binary`] are the only places that list
//! the functions, so adding one here is its formulas and one line in each.
//!
//! References: `ops::pointwise` (each formula's definition, which the tests compare with).

use super::elementwise::{self as ew, Map1, Map2};
use super::pointwise as pw;
use super::simd;
use crate::backend::cpu::pool::Pool;
use crate::exec::planned::kernel::{CpuKernel, Kernel};
use crate::graph::op::{Binary, Unary, UnaryBackward};
use crate::ops::pointwise::{BinaryFn, UnaryFn};
use crate::ops::OpError;

/// Runs `$body` with `$fwd` and `$bwd` bound to the forward and backward formulas of `$f`.
macro_rules! with_unary {
    ($f:expr, |$fwd:ident, $bwd:ident| $body:expr) => {
        match $f {
            UnaryFn::Silu => {
                let ($fwd, $bwd) = (Silu, SiluBackward);
                $body
            }
            UnaryFn::Relu => {
                let ($fwd, $bwd) = (Relu, ReluBackward);
                $body
            }
        }
    };
}

/// Runs `$body` with `$fun` bound to the formula of `$f`.
macro_rules! with_binary {
    ($f:expr, |$fun:ident| $body:expr) => {
        match $f {
            BinaryFn::Mul => {
                let $fun = Mul;
                $body
            }
        }
    };
}

/// y = f(x)
// y, x: (N)
pub fn unary(pool: &Pool, y: &mut [f32], x: &[f32], f: UnaryFn) {
    with_unary!(f, |fwd, _bwd| ew::map1(pool, y, x, fwd))
}

/// xo = f(xo)
// xo: (N)
pub fn unary_inplace(pool: &Pool, xo: &mut [f32], f: UnaryFn) {
    with_unary!(f, |fwd, _bwd| ew::map1_inplace(pool, xo, fwd))
}

/// dx = dy·f'(x)
// dx, x, dy: (N)
pub fn unary_backward(pool: &Pool, dx: &mut [f32], x: &[f32], dy: &[f32], f: UnaryFn) {
    with_unary!(f, |_fwd, bwd| ew::map2(pool, dx, x, dy, bwd))
}

/// dyo = dyo·f'(x): the gradient overwritten in place.
// x, dyo: (N)
pub fn unary_backward_inplace(pool: &Pool, x: &[f32], dyo: &mut [f32], f: UnaryFn) {
    with_unary!(f, |_fwd, bwd| ew::map2_inplace_b(pool, x, dyo, bwd))
}

/// out = f(a, b), b of a's length or broadcast over a's rows.
// out, a: (R, N); b: (R, N) or (N)
pub fn binary(pool: &Pool, out: &mut [f32], a: &[f32], b: &[f32], f: BinaryFn) {
    with_binary!(f, |fun| ew::map2(pool, out, a, b, fun))
}

/// ao = f(ao, b), b as in [`binary`].
// ao: (R, N); b: (R, N) or (N)
pub fn binary_inplace_a(pool: &Pool, ao: &mut [f32], b: &[f32], f: BinaryFn) {
    with_binary!(f, |fun| ew::map2_inplace_a(pool, ao, b, fun))
}

/// bo = f(a, bo), same lengths.
// a, bo: (N)
pub fn binary_inplace_b(pool: &Pool, a: &[f32], bo: &mut [f32], f: BinaryFn) {
    with_binary!(f, |fun| ew::map2_inplace_b(pool, a, bo, fun))
}

// ---------------------------------------------------------------- formulas

/// σ(x) = 1/(1 + e^−x) with the SIMD exp (`simd::exp` clamps, so σ(−∞) is 0, σ(+∞) is 1).
#[inline(always)]
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + simd::exp(-x))
}

/// x·σ(x) (`UnaryFn::Silu`).
#[derive(Clone, Copy)]
pub struct Silu;
impl Map1 for Silu {
    #[inline(always)]
    fn f(&self, x: f32) -> f32 {
        x * sigmoid(x)
    }
}

/// dx = dy·σ(x)·(1 + x·(1 − σ(x))), as f(x, dy) (`UnaryFn::Silu`'s derivative).
#[derive(Clone, Copy)]
pub struct SiluBackward;
impl Map2 for SiluBackward {
    #[inline(always)]
    fn f(&self, x: f32, dy: f32) -> f32 {
        let s = sigmoid(x);
        dy * (s * x.mul_add(1.0 - s, 1.0))
    }
}

/// max(x, 0) (`UnaryFn::Relu`); NaN passes through, as torch.relu.
#[derive(Clone, Copy)]
pub struct Relu;
impl Map1 for Relu {
    #[inline(always)]
    fn f(&self, x: f32) -> f32 {
        if x < 0.0 {
            0.0
        } else {
            x
        }
    }
}

/// dx = dy where x > 0, else 0, as f(x, dy) (`UnaryFn::Relu`'s derivative, ATen's
/// `threshold_backward`).
#[derive(Clone, Copy)]
pub struct ReluBackward;
impl Map2 for ReluBackward {
    #[inline(always)]
    fn f(&self, x: f32, dy: f32) -> f32 {
        if x > 0.0 {
            dy
        } else {
            0.0
        }
    }
}

/// a·b (`BinaryFn::Mul`).
#[derive(Clone, Copy)]
pub struct Mul;
impl Map2 for Mul {
    #[inline(always)]
    fn f(&self, a: f32, b: f32) -> f32 {
        a * b
    }
}

impl CpuKernel for Unary {
    unsafe fn exec(&self, k: &Kernel<'_>) -> Result<(), OpError> {
        let Unary { f } = self;
        match k.r.inplace {
            Some(_) => pw::unary_inplace(k.pool, k.rw(0), *f),
            None => pw::unary(k.pool, k.wr(0), k.rd(0), *f),
        };
        Ok(())
    }
}

impl CpuKernel for UnaryBackward {
    unsafe fn exec(&self, k: &Kernel<'_>) -> Result<(), OpError> {
        let UnaryBackward { f } = self;
        match k.r.inplace {
            Some(_) => pw::unary_backward_inplace(k.pool, k.rd(0), k.rw(1), *f),
            None => pw::unary_backward(k.pool, k.wr(0), k.rd(0), k.rd(1), *f),
        };
        Ok(())
    }
}

impl CpuKernel for Binary {
    unsafe fn exec(&self, k: &Kernel<'_>) -> Result<(), OpError> {
        let Binary { f } = self;
        match k.r.inplace {
            Some(0) => pw::binary_inplace_a(k.pool, k.rw(0), k.rd(1), *f),
            Some(_) => pw::binary_inplace_b(k.pool, k.rd(0), k.rw(1), *f),
            None => pw::binary(k.pool, k.wr(0), k.rd(0), k.rd(1), *f),
        };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::pointwise as reference;

    /// Random f32 in [-12, 12), both tails of σ included; n not a multiple of a SIMD width.
    fn inputs(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 24.0 - 12.0
            })
            .collect()
    }

    /// The SIMD exp is within a few ulp of libm's: 2e-6 relative, plus 1e-7 absolute for the
    /// values that cancel near zero (x·σ(x) for x ≪ 0).
    fn assert_near(got: &[f32], want: &[f64], what: &str) {
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            let tol = 2e-6 * w.abs() + 1e-7;
            assert!((f64::from(g) - w).abs() <= tol, "{what}: element {i} = {g}, want {w}");
        }
    }

    #[test]
    fn unary_kernels_match_the_reference_in_f64() {
        let pool = Pool::new(2);
        let n = 70_001; // several pool tasks and a SIMD tail
        let x = inputs(n, 1);
        let dy = inputs(n, 2);
        let x64: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
        let dy64: Vec<f64> = dy.iter().map(|&v| f64::from(v)).collect();
        for &f in UnaryFn::ALL {
            let (mut y_want, mut dx_want) = (vec![0f64; n], vec![0f64; n]);
            reference::unary_forward(f, &mut y_want, &x64);
            reference::unary_backward(f, &mut dx_want, &x64, &dy64);
            let mut y = vec![f32::NAN; n];
            unary(&pool, &mut y, &x, f);
            assert_near(&y, &y_want, &format!("{f:?} forward"));
            let mut yo = x.clone();
            unary_inplace(&pool, &mut yo, f);
            assert_eq!(yo, y, "{f:?} in place");
            let mut dx = vec![f32::NAN; n];
            unary_backward(&pool, &mut dx, &x, &dy, f);
            assert_near(&dx, &dx_want, &format!("{f:?} backward"));
            let mut dyo = dy.clone();
            unary_backward_inplace(&pool, &x, &mut dyo, f);
            assert_eq!(dyo, dx, "{f:?} backward in place");
        }
    }

    #[test]
    fn binary_kernels_match_the_reference_in_f64() {
        let pool = Pool::new(2);
        let (rows, c) = (701, 97);
        let a = inputs(rows * c, 3);
        let full = inputs(rows * c, 4);
        let a64: Vec<f64> = a.iter().map(|&v| f64::from(v)).collect();
        for &f in BinaryFn::ALL {
            // b the same shape as a, and b one row broadcast over a's rows.
            for b in [&full[..], &full[..c]] {
                let b64: Vec<f64> = b.iter().map(|&v| f64::from(v)).collect();
                let mut want = vec![0f64; a.len()];
                reference::binary_forward(f, &mut want, &a64, &b64);
                let mut out = vec![f32::NAN; a.len()];
                binary(&pool, &mut out, &a, b, f);
                let what = format!("{f:?} with b of {}", b.len());
                assert_near(&out, &want, &what);
                let mut ao = a.clone();
                binary_inplace_a(&pool, &mut ao, b, f);
                assert_eq!(ao, out, "{what}, in place over a");
                if b.len() == a.len() {
                    let mut bo = b.to_vec();
                    binary_inplace_b(&pool, &a, &mut bo, f);
                    assert_eq!(bo, out, "{what}, in place over b");
                }
            }
        }
    }
}
