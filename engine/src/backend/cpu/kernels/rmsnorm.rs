//! RMSNorm over the last dim, forward and backward, rows split over the pool — the structure
//! of [`super::layernorm`] (row ranges per task, SIMD lane accumulators, per-thread partial
//! weight gradients summed in thread order so the result does not depend on the scheduling).
//! Half-precision storage is the planned executor's rounding of the outputs, as for layer_norm:
//! the kernel computes in f32 (HF's `LlamaRMSNorm` takes the row to f32 too), and rstd stays f32.
//!
//! References: `ops::rmsnorm` (the reference op these are tested against), HF `LlamaRMSNorm`.

use super::rmsnorm;
use super::simd::{self, multiversion};
use crate::backend::cpu::pool::{Pool, SyncPtr};
use crate::exec::planned::kernel::{CpuKernel, Kernel};
use crate::exec::planned::CpuSupport;
use crate::graph::op::{AddRmsNorm, RmsNorm, RmsNormBackward};
use crate::graph::Graph;
use crate::ops::OpError;

/// Rows per task below which RMSNorm stays on one thread, for rows of `c` elements (as
/// layer_norm's: a task of 16 Ki elements pays its wake-up).
fn min_rows(c: usize) -> usize {
    ((1 << 14) / c.max(1)).max(1)
}

#[inline(always)]
fn fwd_rows(y: &mut [f32], rstd: &mut [f32], x: &[f32], w: &[f32], eps: f32) {
    let c = w.len();
    let inv_c = 1.0 / c as f32;
    for (r, (xr, yr)) in x.chunks_exact(c).zip(y.chunks_exact_mut(c)).enumerate() {
        // mean(x²) in LANES partial sums (a fixed order, whatever the SIMD level).
        let s = 1.0 / (simd::dot(xr, xr) * inv_c + eps).sqrt();
        for i in 0..c {
            // w·(x·rstd): HF's order of the two products.
            yr[i] = w[i] * (xr[i] * s);
        }
        rstd[r] = s;
    }
}
multiversion!(fn fwd_chunk<>(y: &mut [f32], rstd: &mut [f32], x: &[f32], w: &[f32], eps: f32) => fwd_rows);

/// y = w·(x·rstd) per row, rstd = 1/√(mean(x²) + eps).
// y, x: (R, C); rstd: (R); w: (C)
pub fn rmsnorm_forward(
    pool: &Pool,
    y: &mut [f32],
    rstd: &mut [f32],
    x: &[f32],
    w: &[f32],
    eps: f32,
) {
    let c = w.len();
    let rows = rstd.len();
    assert!(y.len() == rows * c && x.len() == rows * c);
    let (yp, sp) = (SyncPtr(y.as_mut_ptr()), SyncPtr(rstd.as_mut_ptr()));
    pool.for_ranges(rows, min_rows(c), 1, &|r| {
        // SAFETY: row ranges are disjoint; each task writes its rows of y and rstd only.
        unsafe {
            fwd_chunk(
                yp.slice(r.start * c..r.end * c),
                sp.slice(r.clone()),
                &x[r.start * c..r.end * c],
                w,
                eps,
            )
        }
    });
}

/// Rows of the residual add + RMSNorm: s = x + r (or s += r in place when `x` is None), then
/// RMSNorm of s while the row is in cache (as layernorm.rs's `add_fwd_rows`).
#[inline(always)]
#[allow(
    clippy::too_many_arguments,
    reason = "a kernel's operands and dimensions, as its reference in ops/rmsnorm.rs"
)]
fn add_fwd_rows(
    s: &mut [f32],
    x: Option<&[f32]>,
    r: &[f32],
    y: &mut [f32],
    rstd: &mut [f32],
    w: &[f32],
    eps: f32,
) {
    let c = w.len();
    for row in 0..rstd.len() {
        let e = row * c..(row + 1) * c;
        let sr = &mut s[e.clone()];
        match x {
            Some(x) => {
                for ((o, &u), &v) in sr.iter_mut().zip(&x[e.clone()]).zip(&r[e.clone()]) {
                    *o = u + v;
                }
            }
            None => {
                for (o, &v) in sr.iter_mut().zip(&r[e.clone()]) {
                    *o += v;
                }
            }
        }
        fwd_rows(&mut y[e], &mut rstd[row..row + 1], sr, w, eps);
    }
}
multiversion!(fn add_fwd_chunk<>(s: &mut [f32], x: Option<&[f32]>, r: &[f32], y: &mut [f32], rstd: &mut [f32], w: &[f32], eps: f32) => add_fwd_rows);

/// sum = a + b and y = RMSNorm(sum) in one pass over the rows (`ops::rmsnorm::
/// add_rmsnorm_forward`; ORT's `SkipSimplifiedLayerNormalization`). `a` None: `sum` already
/// holds a (the plan put the sum over a dying operand) and b is added in place.
// sum, y, a, b: (R, C); rstd: (R); w: (C)
#[allow(
    clippy::too_many_arguments,
    reason = "a kernel's operands and dimensions, as its reference in ops/rmsnorm.rs"
)]
pub fn add_rmsnorm_forward(
    pool: &Pool,
    sum: &mut [f32],
    y: &mut [f32],
    rstd: &mut [f32],
    a: Option<&[f32]>,
    b: &[f32],
    w: &[f32],
    eps: f32,
) {
    let c = w.len();
    let rows = rstd.len();
    assert!(sum.len() == rows * c && y.len() == rows * c && b.len() == rows * c);
    assert!(a.is_none_or(|a| a.len() == rows * c));
    let (sp, yp, rp) =
        (SyncPtr(sum.as_mut_ptr()), SyncPtr(y.as_mut_ptr()), SyncPtr(rstd.as_mut_ptr()));
    pool.for_ranges(rows, min_rows(c), 1, &|r| {
        let e = r.start * c..r.end * c;
        // SAFETY: row ranges are disjoint; each task writes its rows of sum, y and rstd.
        unsafe {
            add_fwd_chunk(
                sp.slice(e.clone()),
                a.map(|a| &a[e.clone()]),
                &b[e.clone()],
                yp.slice(e),
                rp.slice(r.clone()),
                w,
                eps,
            )
        }
    });
}

#[inline(always)]
fn bwd_rows(dx: &mut [f32], dw: &mut [f32], dy: &[f32], x: &[f32], w: &[f32], rstd: &[f32]) {
    let c = w.len();
    let inv_c = 1.0 / c as f32;
    let full = c / simd::LANES * simd::LANES;
    for (r, &s) in rstd.iter().enumerate() {
        let (xr, dyr) = (&x[r * c..(r + 1) * c], &dy[r * c..(r + 1) * c]);
        // Σ (w·dy)·x̂ in lane partials, and dw += dy·x̂, in one pass over the row.
        let mut acc = [0f32; simd::LANES];
        let lanes = |(xc, dyc, wc, dwc): (&[f32], &[f32], &[f32], &mut [f32]),
                     acc: &mut [f32; simd::LANES]| {
            for l in 0..xc.len() {
                let xh = xc[l] * s;
                acc[l] = (wc[l] * dyc[l]).mul_add(xh, acc[l]);
                dwc[l] = dyc[l].mul_add(xh, dwc[l]);
            }
        };
        for (((xc, dyc), wc), dwc) in xr[..full]
            .chunks_exact(simd::LANES)
            .zip(dyr[..full].chunks_exact(simd::LANES))
            .zip(w[..full].chunks_exact(simd::LANES))
            .zip(dw[..full].chunks_exact_mut(simd::LANES))
        {
            lanes((xc, dyc, wc, dwc), &mut acc);
        }
        lanes((&xr[full..], &dyr[full..], &w[full..], &mut dw[full..c]), &mut acc);
        let gx = simd::sum(&acc) * inv_c;
        let dxr = &mut dx[r * c..(r + 1) * c];
        for i in 0..c {
            let xh = xr[i] * s;
            dxr[i] = s * (w[i] * dyr[i] - xh * gx);
        }
    }
}
multiversion!(fn bwd_chunk<>(dx: &mut [f32], dw: &mut [f32], dy: &[f32], x: &[f32], w: &[f32], rstd: &[f32]) => bwd_rows);

/// Workspace [`rmsnorm_backward`] needs: per-thread partial dw.
pub fn backward_workspace(threads: usize, c: usize) -> usize {
    c * threads
}

/// dx = rstd·(w·dy − x̂·mean(w·dy·x̂)), x̂ = x·rstd; dw = Σ_rows dy·x̂ (rows summed per thread in
/// `ws`, then the threads' partials in thread order, as layer_norm's dw).
// dx, dy, x: (R, C); dw, w: (C); rstd: (R); ws: (threads, C)
#[allow(
    clippy::too_many_arguments,
    reason = "a kernel's operands and dimensions, as its reference in ops/rmsnorm.rs"
)]
pub fn rmsnorm_backward(
    pool: &Pool,
    dx: &mut [f32],
    dw: &mut [f32],
    dy: &[f32],
    x: &[f32],
    w: &[f32],
    rstd: &[f32],
    ws: &mut [f32],
) {
    let c = w.len();
    let rows = rstd.len();
    let t = pool.threads();
    assert!(
        dx.len() == rows * c
            && dy.len() == rows * c
            && x.len() == rows * c
            && dw.len() == c
            && ws.len() >= c * t
    );
    let parts = super::super::pool::chunks(rows, t, min_rows(c), 1);
    let per = rows.div_ceil(parts.max(1));
    let (dxp, wsp) = (SyncPtr(dx.as_mut_ptr()), SyncPtr(ws.as_mut_ptr()));
    pool.run(parts, &|i| {
        let (r0, r1) = ((i * per).min(rows), ((i + 1) * per).min(rows));
        // SAFETY: task i writes rows [r0, r1) of dx and its own C of the workspace.
        let pw = unsafe { wsp.slice(i * c..(i + 1) * c) };
        pw.fill(0.0);
        unsafe {
            bwd_chunk(
                dxp.slice(r0 * c..r1 * c),
                pw,
                &dy[r0 * c..r1 * c],
                &x[r0 * c..r1 * c],
                w,
                &rstd[r0..r1],
            )
        }
    });
    dw.copy_from_slice(&ws[..c]);
    for i in 1..parts {
        for (d, &p) in dw.iter_mut().zip(&ws[i * c..(i + 1) * c]) {
            *d += p;
        }
    }
}

impl CpuKernel for AddRmsNorm {
    unsafe fn exec(&self, k: &Kernel<'_>) -> Result<(), OpError> {
        let AddRmsNorm { eps } = self;
        let (y, rstd) = (k.wr(1), k.wr(2));
        match k.r.inplace {
            // The sum overwrites a dying operand; addition commutes, so add the other.
            Some(s) => rmsnorm::add_rmsnorm_forward(
                k.pool,
                k.rw(s),
                y,
                rstd,
                None,
                k.rd(1 - s),
                k.rd(2),
                *eps,
            ),
            None => rmsnorm::add_rmsnorm_forward(
                k.pool,
                k.wr(0),
                y,
                rstd,
                Some(k.rd(0)),
                k.rd(1),
                k.rd(2),
                *eps,
            ),
        }

        Ok(())
    }
}

impl CpuKernel for RmsNorm {
    unsafe fn exec(&self, k: &Kernel<'_>) -> Result<(), OpError> {
        let RmsNorm { eps } = self;
        rmsnorm::rmsnorm_forward(k.pool, k.wr(0), k.wr(1), k.rd(0), k.rd(1), *eps);
        Ok(())
    }
}

impl CpuKernel for RmsNormBackward {
    fn workspace(&self, cpu: &CpuSupport, g: &Graph, node: usize) -> usize {
        backward_workspace(cpu.threads, *g.shape(g.nodes()[node].inputs[2]).first().unwrap_or(&1))
    }

    unsafe fn exec(&self, k: &Kernel<'_>) -> Result<(), OpError> {
        rmsnorm::rmsnorm_backward(
            k.pool,
            k.wr(0),
            k.wr(1),
            k.rd(0),
            k.rd(1),
            k.rd(2),
            k.rd(3),
            k.ws(),
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::rmsnorm as rref;
    use crate::ops::testutil::Rng;

    /// Against the reference op (`ops::rmsnorm`, f32) at C = 37, 67 (not multiples of the
    /// 16-lane SIMD width), 768 and 1, with row counts that do not split evenly over 3 threads:
    /// f32 sums in another order, so |Δ| ≤ 2e-5·max|ref| per tensor (as layernorm.rs's test).
    #[test]
    fn rmsnorm_kernel_forward_and_backward_match_the_reference() {
        let pool = Pool::new(3);
        for &(rows, c) in
            &[(301usize, 37usize), (53, 67), (64, 768), (5, 1), (1000, 67), (2000, 37)]
        {
            let mut rng = Rng::new(rows as u64 * 29 + c as u64);
            let x: Vec<f32> = rng.vec_f32(rows * c).iter().map(|v| 2.0 * v + 0.3).collect();
            let (w, dy) = (rng.vec_f32(c), rng.vec_f32(rows * c));
            let (mut y0, mut s0) = (vec![0.0; rows * c], vec![0.0; rows]);
            rref::rmsnorm_forward(&mut y0, &mut s0, &x, &w, 1e-6);
            let (mut y1, mut s1) = (vec![f32::NAN; rows * c], vec![f32::NAN; rows]);
            rmsnorm_forward(&pool, &mut y1, &mut s1, &x, &w, 1e-6);
            let check = |a: &[f32], b: &[f32], what: &str| {
                let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
                for (i, (x, y)) in a.iter().zip(b).enumerate() {
                    assert!(
                        (x - y).abs() <= 2e-5 * scale + 1e-30,
                        "{what} ({rows}x{c}) [{i}]: {x} vs {y}"
                    );
                }
            };
            check(&y1, &y0, "y");
            check(&s1, &s0, "rstd");
            let (mut dx0, mut dw0) = (vec![0.0; rows * c], vec![0.0; c]);
            rref::rmsnorm_backward(&mut dx0, &mut dw0, &dy, &x, &w, &s0);
            let (mut dx1, mut dw1) = (vec![f32::NAN; rows * c], vec![f32::NAN; c]);
            let mut ws = vec![f32::NAN; backward_workspace(pool.threads(), c)];
            rmsnorm_backward(&pool, &mut dx1, &mut dw1, &dy, &x, &w, &s0, &mut ws);
            check(&dx1, &dx0, "dx");
            check(&dw1, &dw0, "dw");
        }
    }

    /// The fused residual add + RMSNorm against the reference (`ops::rmsnorm::
    /// add_rmsnorm_forward`), out of place and in place over either operand, C = 37 and 67 on
    /// 3 threads: the sum exact, y and rstd within 2e-5·max|ref|.
    #[test]
    fn add_rmsnorm_kernel_matches_the_reference_in_and_out_of_place() {
        let pool = Pool::new(3);
        for &(rows, c) in &[(2000usize, 37usize), (53, 67)] {
            let mut rng = Rng::new(rows as u64 * 13 + c as u64);
            let (a, b, w) = (rng.vec_f32(rows * c), rng.vec_f32(rows * c), rng.vec_f32(c));
            let (mut s0, mut y0, mut r0) =
                (vec![0.0; rows * c], vec![0.0; rows * c], vec![0.0; rows]);
            rref::add_rmsnorm_forward(&mut s0, &mut y0, &mut r0, &a, &b, &w, 1e-6);
            let scale = y0.iter().fold(0f32, |m, v| m.max(v.abs()));
            for mode in 0..3 {
                let (mut y, mut r) = (vec![f32::NAN; rows * c], vec![f32::NAN; rows]);
                let sum = match mode {
                    0 => {
                        let mut s = vec![f32::NAN; rows * c];
                        add_rmsnorm_forward(&pool, &mut s, &mut y, &mut r, Some(&a), &b, &w, 1e-6);
                        s
                    }
                    1 => {
                        let mut s = a.clone();
                        add_rmsnorm_forward(&pool, &mut s, &mut y, &mut r, None, &b, &w, 1e-6);
                        s
                    }
                    _ => {
                        let mut s = b.clone();
                        add_rmsnorm_forward(&pool, &mut s, &mut y, &mut r, None, &a, &w, 1e-6);
                        s
                    }
                };
                assert_eq!(sum, s0, "sum ({rows}x{c}, mode {mode})");
                for (i, (x, want)) in y.iter().zip(&y0).enumerate() {
                    assert!(
                        (x - want).abs() <= 2e-5 * scale,
                        "y ({rows}x{c}, mode {mode}) [{i}]: {x} vs {want}"
                    );
                }
                for (x, want) in r.iter().zip(&r0) {
                    assert!((x - want).abs() <= 2e-5 * want.abs(), "rstd: {x} vs {want}");
                }
            }
        }
    }
}
