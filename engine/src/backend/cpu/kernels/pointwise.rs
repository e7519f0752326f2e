//! CPU kernels of the pointwise functions of `ops::pointwise`: each function's formula is a
//! [`Map1`] (forward) and a [`Map2`] (backward, f(x, dy)) or a [`Map2`] (binary), run by the
//! drivers of `elementwise` (threads, SIMD, broadcast). The function is dispatched once per
//! call, outside the loop: [`with_unary`] and [`with_binary`] are the only places that list
//! the functions, so adding one here is its formulas and one line in each.
//!
//! References: `ops::pointwise` (each formula's definition, which the tests compare with).

use super::elementwise as ew;
use crate::backend::cpu::pool::Pool;
use crate::ops::pointwise::{BinaryFn, UnaryFn};

/// Runs `$body` with `$fwd` and `$bwd` bound to the forward and backward formulas of `$f`.
macro_rules! with_unary {
    ($f:expr, |$fwd:ident, $bwd:ident| $body:expr) => {
        match $f {}
    };
}

/// Runs `$body` with `$fun` bound to the formula of `$f`.
macro_rules! with_binary {
    ($f:expr, |$fun:ident| $body:expr) => {
        match $f {}
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
