//! Rotary position embedding (HF's `apply_rotary_pos_emb`), rows of D split over the pool. The
//! backward is the same kernel with `inverse` (sin negated): see `ops::rotary`.
//!
//! x and y are rows of D contiguous elements at any strides of the leading dims (the op's
//! `Req::Rows`): q and k are read where their projection wrote them, (B, T, H·D) seen as (B, H,
//! T, D), and the backward writes dq and dk there too — the head permutes around the op are
//! folded, never copied. Each row's pairs (x[i], x[i + D/2]) are read before (y[i], y[i + D/2])
//! are written, so y may be x (the in-place slot 0 of `Rotary`'s `OpDef`, `ops/rotary.rs`).
//!
//! References: `ops::rotary` (tested against), HF `apply_rotary_pos_emb` / `rotate_half`.

use super::copy::Walk;
use super::rotary;
use super::rows::RowsAt;
use super::simd::multiversion;
use crate::backend::cpu::pool::{Pool, SyncPtr};
use crate::exec::planned::kernel::{CpuKernel, Kernel};
use crate::graph::op::Rotary;
use crate::ops::OpError;

/// Rows of `d` per task below which the kernel stays on one thread (16 Ki elements).
fn min_rows(d: usize) -> usize {
    ((1 << 14) / d.max(1)).max(1)
}

/// Rows `rows` of y from x (or y itself when `x` is None): per pair i < D/2,
/// y[i] = x[i]·cos[i] − x[i+h]·sin[i]·σ, y[i+h] = x[i+h]·cos[i+h] + x[i]·sin[i+h]·σ, the row at
/// position t = row mod T. The rows' addresses are valid ([`rotary_rows`]' contract).
///
/// (The walk over the rows is here, inside the multiversioned body, not `rows::for_rows`: a
/// head's row is 64 to 128 elements, and a call through the SIMD-level dispatch per row is
/// measurably slower — docs/measurements.md, "Rotary and SwiGLU on strided rows".)
#[inline(always)]
#[allow(
    clippy::too_many_arguments,
    reason = "a kernel's operands and dimensions, as its reference in ops/rotary.rs"
)]
fn rows_body(
    y: RowsAt<'_>,
    x: Option<RowsAt<'_>>,
    cos: &[f32],
    sin: &[f32],
    d: usize,
    rows: std::ops::Range<usize>,
    sg: f32,
) {
    let (h, tt) = (d / 2, cos.len() / d);
    let mut wy = Walk::new(y.lead, y.strides, 0, rows.start);
    let mut wx = x.map(|x| Walk::new(x.lead, x.strides, 0, rows.start));
    for r in rows {
        let t = r % tt;
        let (c, s) = (&cos[t * d..(t + 1) * d], &sin[t * d..(t + 1) * d]);
        // SAFETY: rotary_rows' contract: row r of y is valid and this task's alone.
        let yr = unsafe { std::slice::from_raw_parts_mut(y.ptr.ptr().add(wy.off), d) };
        let (lo, hi) = yr.split_at_mut(h);
        match (x, wx.as_mut()) {
            (Some(x), Some(w)) => {
                // SAFETY: rotary_rows' contract: row r of x is valid and not y's.
                let xr = unsafe { std::slice::from_raw_parts(x.ptr.ptr().add(w.off), d) };
                let (xl, xh) = xr.split_at(h);
                for i in 0..h {
                    let (a, b) = (xl[i], xh[i]);
                    lo[i] = a.mul_add(c[i], -(b * s[i] * sg));
                    hi[i] = b.mul_add(c[h + i], a * s[h + i] * sg);
                }
                w.advance();
            }
            _ => {
                for i in 0..h {
                    let (a, b) = (lo[i], hi[i]);
                    lo[i] = a.mul_add(c[i], -(b * s[i] * sg));
                    hi[i] = b.mul_add(c[h + i], a * s[h + i] * sg);
                }
            }
        }
        wy.advance();
    }
}
multiversion!(fn rows_chunk<>(y: RowsAt<'_>, x: Option<RowsAt<'_>>, cos: &[f32], sin: &[f32], d: usize, rows: std::ops::Range<usize>, sg: f32) => rows_body);

/// y = x·cos + rotate_half(x)·sin (sin negated when `inverse`) over rows at any strides; `x`
/// None: in place over y.
///
/// # Safety
/// Every row of y and x (Π lead rows of `d` elements each) is valid; y's rows do not overlap
/// each other or x's, and nothing else touches them during the call.
// y, x: (…, T, D) rows; cos, sin: (T, D)
pub unsafe fn rotary_rows(
    pool: &Pool,
    y: RowsAt<'_>,
    x: Option<RowsAt<'_>>,
    cos: &[f32],
    sin: &[f32],
    d: usize,
    inverse: bool,
) {
    assert!(d.is_multiple_of(2) && d > 0 && cos.len() == sin.len() && cos.len().is_multiple_of(d));
    assert!(y.lead.len() == y.strides.len() && x.is_none_or(|x| x.lead == y.lead));
    assert!(x.is_none_or(|x| x.strides.len() == x.lead.len()));
    let rows: usize = y.lead.iter().product();
    let sg = if inverse { -1.0 } else { 1.0 };
    pool.for_ranges(rows, min_rows(d), 1, &|r| rows_chunk(y, x, cos, sin, d, r, sg));
}

/// [`rotary_rows`] on dense rows: y, x (R, D).
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
    assert!(d > 0 && y.len().is_multiple_of(d) && x.is_none_or(|x| x.len() == y.len()));
    let lead = [y.len() / d];
    let strides = [d];
    let at = |p: *mut f32| RowsAt { ptr: SyncPtr(p), lead: &lead, strides: &strides };
    // SAFETY: y and x are slices of R rows of d; y is exclusively borrowed, so disjoint from x.
    unsafe {
        rotary_rows(
            pool,
            at(y.as_mut_ptr()),
            x.map(|x| at(x.as_ptr() as *mut f32)),
            cos,
            sin,
            d,
            inverse,
        )
    }
}

impl CpuKernel for Rotary {
    unsafe fn exec(&self, k: &Kernel<'_>) -> Result<(), OpError> {
        let Rotary { inverse } = self;
        let (x, y) = (k.node.inputs[0], k.node.outputs[0]);
        let d = k.last(x);
        let (cos, sin) = (k.rd(1), k.rd(2));
        match k.r.inplace {
            Some(_) => rotary::rotary_rows(k.pool, RowsAt::of(k, x), None, cos, sin, d, *inverse),
            None => {
                let (ya, xa) = (RowsAt::of(k, y), RowsAt::of(k, x));
                rotary::rotary_rows(k.pool, ya, Some(xa), cos, sin, d, *inverse)
            }
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

    /// Strided rows against the dense kernel: x read where a projection wrote it, (B, T, H, D)
    /// seen as (B, H, T, D), as the plan folds the head permute; y written at row stride D + 3
    /// (a split's piece inside wider rows) whose gaps must stay untouched (NaN), and in place
    /// over the strided x. B, H, T, D = 3, 5, 7, 6 (odd half): a wrong stride or a row counted
    /// in the wrong order reads another row's position and fails the exact comparison (same
    /// arithmetic as the dense kernel, so equal bits).
    #[test]
    fn rotary_kernel_on_strided_rows_matches_the_dense_kernel() {
        let pool = Pool::new(3);
        let (b, h, t, d) = (3usize, 5usize, 7usize, 6usize);
        let (c64, s64) = crate::ops::rotary::hf_cos_sin(t, d);
        let (c, s): (Vec<f32>, Vec<f32>) =
            (c64.iter().map(|&v| v as f32).collect(), s64.iter().map(|&v| v as f32).collect());
        let btnd = Rng::new(91).vec_f32(b * t * h * d); // (B, T, H, D)
                                                        // The same values dense in (B, H, T, D) order.
        let mut x = vec![0f32; b * h * t * d];
        for (bi, hi, ti) in
            (0..b).flat_map(|i| (0..h).flat_map(move |j| (0..t).map(move |k| (i, j, k))))
        {
            let (src, dst) = (((bi * t + ti) * h + hi) * d, ((bi * h + hi) * t + ti) * d);
            x[dst..dst + d].copy_from_slice(&btnd[src..src + d]);
        }
        let lead = [b, h, t];
        let xs = [t * h * d, d, h * d];
        let ys = [h * t * (d + 3), t * (d + 3), d + 3];
        for inverse in [false, true] {
            let mut want = vec![0f32; x.len()];
            rotary(&pool, &mut want, Some(&x), &c, &s, d, inverse);
            let mut src = btnd.clone();
            let mut y = vec![f32::NAN; b * h * t * (d + 3)];
            let at = |p: *mut f32, strides| RowsAt { ptr: SyncPtr(p), lead: &lead, strides };
            // SAFETY: every row of both layouts lies inside its vector; y and src are disjoint.
            unsafe {
                rotary_rows(
                    &pool,
                    at(y.as_mut_ptr(), &ys),
                    Some(at(src.as_mut_ptr(), &xs)),
                    &c,
                    &s,
                    d,
                    inverse,
                );
                rotary_rows(&pool, at(src.as_mut_ptr(), &xs), None, &c, &s, d, inverse);
            }
            for r in 0..b * h * t {
                let (bi, hi, ti) = (r / (h * t), r / t % h, r % t);
                let w = &want[r * d..(r + 1) * d];
                let yo = r * (d + 3);
                assert_eq!(&y[yo..yo + d], w, "strided y, row {r}, inverse={inverse}");
                assert!(y[yo + d..yo + d + 3].iter().all(|v| v.is_nan()), "gap of row {r} written");
                let xo = ((bi * t + ti) * h + hi) * d;
                assert_eq!(
                    &src[xo..xo + d],
                    w,
                    "in place over strided x, row {r}, inverse={inverse}"
                );
            }
        }
    }
}
