//! Rotary position embedding (HF's `apply_rotary_pos_emb`), rows of D split over the pool. The
//! backward is the same kernel with `inverse` (sin negated): see `ops::rotary`.
//!
//! Each row's pairs (x[i], x[i + D/2]) are read before (y[i], y[i + D/2]) are written, so the
//! output may overwrite x (the in-place slot 0 of `Rotary`'s `OpDef`, `ops/rotary.rs`).
//!
//! References: `ops::rotary` (tested against), HF `apply_rotary_pos_emb` / `rotate_half`.

use super::rotary;
use super::simd::multiversion;
use crate::backend::cpu::pool::{Pool, SyncPtr};
use crate::exec::planned::kernel::{CpuKernel, Kernel};
use crate::graph::op::Rotary;
use crate::ops::OpError;

/// Rows of `d` per task below which the kernel stays on one thread (16 Ki elements).
fn min_rows(d: usize) -> usize {
    ((1 << 14) / d.max(1)).max(1)
}

/// Rows `row0..` of y from x (or y itself when `x` is None): per pair i < D/2,
/// y[i] = x[i]·cos[i] − x[i+h]·sin[i]·σ, y[i+h] = x[i+h]·cos[i+h] + x[i]·sin[i+h]·σ.
#[inline(always)]
#[allow(
    clippy::too_many_arguments,
    reason = "a kernel's operands and dimensions, as its reference in ops/rotary.rs"
)]
fn rows_body(
    y: &mut [f32],
    x: Option<&[f32]>,
    cos: &[f32],
    sin: &[f32],
    d: usize,
    row0: usize,
    sg: f32,
) {
    let (h, tt) = (d / 2, cos.len() / d);
    for r in 0..y.len() / d {
        let t = (row0 + r) % tt;
        let (c, s) = (&cos[t * d..(t + 1) * d], &sin[t * d..(t + 1) * d]);
        let yr = &mut y[r * d..(r + 1) * d];
        let (lo, hi) = yr.split_at_mut(h);
        match x {
            Some(x) => {
                let (xl, xh) = x[r * d..(r + 1) * d].split_at(h);
                for i in 0..h {
                    let (a, b) = (xl[i], xh[i]);
                    lo[i] = a.mul_add(c[i], -(b * s[i] * sg));
                    hi[i] = b.mul_add(c[h + i], a * s[h + i] * sg);
                }
            }
            None => {
                for i in 0..h {
                    let (a, b) = (lo[i], hi[i]);
                    lo[i] = a.mul_add(c[i], -(b * s[i] * sg));
                    hi[i] = b.mul_add(c[h + i], a * s[h + i] * sg);
                }
            }
        }
    }
}
multiversion!(fn rows_chunk<>(y: &mut [f32], x: Option<&[f32]>, cos: &[f32], sin: &[f32], d: usize, row0: usize, sg: f32) => rows_body);

/// y = x·cos + rotate_half(x)·sin (sin negated when `inverse`); `x` None: in place over y.
// y, x: (R, D), R = (…)·T; cos, sin: (T, D)
pub fn rotary(
    pool: &Pool,
    y: &mut [f32],
    x: Option<&[f32]>,
    cos: &[f32],
    sin: &[f32],
    d: usize,
    inverse: bool,
) {
    assert!(d.is_multiple_of(2) && d > 0 && y.len().is_multiple_of(d) && cos.len() == sin.len());
    assert!(cos.len().is_multiple_of(d) && x.is_none_or(|x| x.len() == y.len()));
    let rows = y.len() / d;
    let sg = if inverse { -1.0 } else { 1.0 };
    let yp = SyncPtr(y.as_mut_ptr());
    pool.for_ranges(rows, min_rows(d), 1, &|r| {
        let e = r.start * d..r.end * d;
        // SAFETY: row ranges are disjoint; each task writes (and in place reads) its rows only.
        unsafe { rows_chunk(yp.slice(e.clone()), x.map(|x| &x[e]), cos, sin, d, r.start, sg) }
    });
}

impl CpuKernel for Rotary {
    unsafe fn exec(&self, k: &Kernel<'_>) -> Result<(), OpError> {
        let Rotary { inverse } = self;
        let d = k.last(k.node.inputs[0]);
        match k.r.inplace {
            Some(_) => rotary::rotary(k.pool, k.rw(0), None, k.rd(1), k.rd(2), d, *inverse),
            None => rotary::rotary(k.pool, k.wr(0), Some(k.rd(0)), k.rd(1), k.rd(2), d, *inverse),
        }

        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::rotary as rref;
    use crate::ops::testutil::Rng;

    /// Against the reference (`ops::rotary`, f32), forward and inverse (the backward), out of
    /// place and in place, at D = 6, 74 (not multiples of the SIMD width; odd half 37) and 128,
    /// row counts that split unevenly over 3 threads: |Δ| ≤ 1e-6·max|ref| (two products and a
    /// sum, fused in the kernel).
    #[test]
    fn rotary_kernel_matches_the_reference_forward_and_inverse() {
        let pool = Pool::new(3);
        for &(b, t, d) in &[(7usize, 5usize, 6usize), (3, 67, 74), (2, 301, 128), (1, 1, 2)] {
            let (c64, s64) = crate::ops::rotary::hf_cos_sin(t, d);
            let (c, s): (Vec<f32>, Vec<f32>) =
                (c64.iter().map(|&v| v as f32).collect(), s64.iter().map(|&v| v as f32).collect());
            let x = Rng::new((b * t * d) as u64).vec_f32(b * t * d);
            for inverse in [false, true] {
                let mut want = vec![0f32; x.len()];
                rref::rotary_forward(&mut want, &x, &c, &s, d, inverse);
                let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
                let mut out = vec![f32::NAN; x.len()];
                rotary(&pool, &mut out, Some(&x), &c, &s, d, inverse);
                let mut inplace = x.clone();
                rotary(&pool, &mut inplace, None, &c, &s, d, inverse);
                for (what, got) in [("out of place", &out), ("in place", &inplace)] {
                    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                        assert!(
                            (g - w).abs() <= 1e-6 * scale,
                            "{what} ({b}x{t}x{d}, inverse={inverse}) [{i}]: {g} vs {w}"
                        );
                    }
                }
            }
        }
    }
}
