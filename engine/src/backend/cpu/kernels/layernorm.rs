//! LayerNorm over the last dim, forward and backward, rows split over the pool.
//!
//! References: `ops::layernorm` (the reference op these are tested against), llm.c
//! `layernorm_forward` / `layernorm_backward`, `torch.nn.functional.layer_norm`.

use super::layernorm;
use super::simd::{self, multiversion};
use crate::backend::cpu::pool::{Pool, SyncPtr};
use crate::exec::planned::kernel::{CpuKernel, Kernel};
use crate::exec::planned::CpuSupport;
use crate::graph::op::{AddLayerNorm, LayerNorm, LayerNormBackward};
use crate::graph::Graph;
use crate::ops::OpError;

/// Rows per task below which LayerNorm stays on one thread, for rows of `c` elements.
fn min_rows(c: usize) -> usize {
    ((1 << 14) / c.max(1)).max(1)
}

#[inline(always)]
fn fwd_rows(
    y: &mut [f32],
    mean: &mut [f32],
    rstd: &mut [f32],
    x: &[f32],
    w: &[f32],
    b: &[f32],
    eps: f32,
) {
    let c = w.len();
    let inv_c = 1.0 / c as f32;
    for (r, (xr, yr)) in x.chunks_exact(c).zip(y.chunks_exact_mut(c)).enumerate() {
        let m = simd::sum(xr) * inv_c;
        let mut acc = [0f32; simd::LANES];
        let chunks = xr.chunks_exact(simd::LANES);
        let rest = chunks.remainder();
        for ch in chunks {
            for l in 0..simd::LANES {
                let d = ch[l] - m;
                acc[l] = d.mul_add(d, acc[l]);
            }
        }
        for (l, &v) in rest.iter().enumerate() {
            let d = v - m;
            acc[l] = d.mul_add(d, acc[l]);
        }
        let var = simd::sum(&acc) * inv_c;
        let s = 1.0 / (var + eps).sqrt();
        for i in 0..c {
            yr[i] = ((xr[i] - m) * s).mul_add(w[i], b[i]);
        }
        mean[r] = m;
        rstd[r] = s;
    }
}
multiversion!(fn fwd_chunk<>(y: &mut [f32], mean: &mut [f32], rstd: &mut [f32], x: &[f32], w: &[f32], b: &[f32], eps: f32) => fwd_rows);

/// y = (x − mean)·rstd·w + b per row, rstd = 1/√(var + eps) (biased variance).
// y, x: (R, C); mean, rstd: (R); w, b: (C)
#[allow(
    clippy::too_many_arguments,
    reason = "a kernel's operands and dimensions, as its reference in ops/layernorm.rs"
)]
pub fn layernorm_forward(
    pool: &Pool,
    y: &mut [f32],
    mean: &mut [f32],
    rstd: &mut [f32],
    x: &[f32],
    w: &[f32],
    b: &[f32],
    eps: f32,
) {
    let c = w.len();
    let rows = mean.len();
    assert!(y.len() == rows * c && x.len() == rows * c && rstd.len() == rows && b.len() == c);
    let (yp, mp, sp) =
        (SyncPtr(y.as_mut_ptr()), SyncPtr(mean.as_mut_ptr()), SyncPtr(rstd.as_mut_ptr()));
    pool.for_ranges(rows, min_rows(c), 1, &|r| {
        // SAFETY: row ranges are disjoint; each task writes its rows of y, mean and rstd only.
        unsafe {
            fwd_chunk(
                yp.slice(r.start * c..r.end * c),
                mp.slice(r.clone()),
                sp.slice(r.clone()),
                &x[r.start * c..r.end * c],
                w,
                b,
                eps,
            )
        }
    });
}

/// Rows of the residual add + LayerNorm: s = x + r (or s += r in place when `x` is None),
/// then LayerNorm of s while the row is in cache.
#[inline(always)]
#[allow(
    clippy::too_many_arguments,
    reason = "a kernel's operands and dimensions, as its reference in ops/layernorm.rs"
)]
fn add_fwd_rows(
    s: &mut [f32],
    x: Option<&[f32]>,
    r: &[f32],
    y: &mut [f32],
    mean: &mut [f32],
    rstd: &mut [f32],
    w: &[f32],
    b: &[f32],
    eps: f32,
) {
    let c = w.len();
    for row in 0..mean.len() {
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
        fwd_rows(&mut y[e], &mut mean[row..row + 1], &mut rstd[row..row + 1], sr, w, b, eps);
    }
}
multiversion!(fn add_fwd_chunk<>(s: &mut [f32], x: Option<&[f32]>, r: &[f32], y: &mut [f32], mean: &mut [f32], rstd: &mut [f32], w: &[f32], b: &[f32], eps: f32) => add_fwd_rows);

/// sum = a + b and y = LayerNorm(sum) in one pass over the rows (`ops::layernorm::
/// add_layernorm_forward`; ORT's `SkipLayerNormalization`). `a` None: `sum` already holds a
/// (the plan put the sum over a dying operand) and b is added in place.
// sum, y, a, b: (R, C); mean, rstd: (R); w, bias: (C)
#[allow(
    clippy::too_many_arguments,
    reason = "a kernel's operands and dimensions, as its reference in ops/layernorm.rs"
)]
pub fn add_layernorm_forward(
    pool: &Pool,
    sum: &mut [f32],
    y: &mut [f32],
    mean: &mut [f32],
    rstd: &mut [f32],
    a: Option<&[f32]>,
    b: &[f32],
    w: &[f32],
    bias: &[f32],
    eps: f32,
) {
    let c = w.len();
    let rows = mean.len();
    assert!(
        sum.len() == rows * c
            && y.len() == rows * c
            && b.len() == rows * c
            && rstd.len() == rows
            && bias.len() == c
    );
    assert!(a.is_none_or(|a| a.len() == rows * c));
    let (sp, yp, mp, rp) = (
        SyncPtr(sum.as_mut_ptr()),
        SyncPtr(y.as_mut_ptr()),
        SyncPtr(mean.as_mut_ptr()),
        SyncPtr(rstd.as_mut_ptr()),
    );
    pool.for_ranges(rows, min_rows(c), 1, &|r| {
        let e = r.start * c..r.end * c;
        // SAFETY: row ranges are disjoint; each task writes its rows of sum, y, mean, rstd.
        unsafe {
            add_fwd_chunk(
                sp.slice(e.clone()),
                a.map(|a| &a[e.clone()]),
                &b[e.clone()],
                yp.slice(e),
                mp.slice(r.clone()),
                rp.slice(r.clone()),
                w,
                bias,
                eps,
            )
        }
    });
}

#[inline(always)]
#[allow(
    clippy::too_many_arguments,
    clippy::type_complexity,
    reason = "a kernel's operands and dimensions, as its reference in ops/layernorm.rs; the per-thread partial sums are a tuple of slices"
)]
fn bwd_rows(
    dx: &mut [f32],
    dw: &mut [f32],
    db: &mut [f32],
    dy: &[f32],
    x: &[f32],
    w: &[f32],
    mean: &[f32],
    rstd: &[f32],
) {
    let c = w.len();
    let inv_c = 1.0 / c as f32;
    for r in 0..mean.len() {
        let (xr, dyr) = (&x[r * c..(r + 1) * c], &dy[r * c..(r + 1) * c]);
        let (m, s) = (mean[r], rstd[r]);
        let mut a1 = [0f32; simd::LANES];
        let mut a2 = [0f32; simd::LANES];
        let full = c / simd::LANES * simd::LANES;
        let lanes = |(xc, dyc, wc, dwc, dbc): (&[f32], &[f32], &[f32], &mut [f32], &mut [f32]),
                     a1: &mut [f32; simd::LANES],
                     a2: &mut [f32; simd::LANES]| {
            for l in 0..xc.len() {
                let norm = (xc[l] - m) * s;
                let dnorm = dyc[l] * wc[l];
                a1[l] += dnorm;
                a2[l] = dnorm.mul_add(norm, a2[l]);
                dwc[l] = dyc[l].mul_add(norm, dwc[l]);
                dbc[l] += dyc[l];
            }
        };
        for ((((xc, dyc), wc), dwc), dbc) in xr[..full]
            .chunks_exact(simd::LANES)
            .zip(dyr[..full].chunks_exact(simd::LANES))
            .zip(w[..full].chunks_exact(simd::LANES))
            .zip(dw[..full].chunks_exact_mut(simd::LANES))
            .zip(db[..full].chunks_exact_mut(simd::LANES))
        {
            lanes((xc, dyc, wc, dwc, dbc), &mut a1, &mut a2);
        }
        lanes(
            (&xr[full..], &dyr[full..], &w[full..], &mut dw[full..c], &mut db[full..c]),
            &mut a1,
            &mut a2,
        );
        let dnorm_mean = simd::sum(&a1) * inv_c;
        let dnorm_norm_mean = simd::sum(&a2) * inv_c;
        let dxr = &mut dx[r * c..(r + 1) * c];
        for i in 0..c {
            let norm = (xr[i] - m) * s;
            let dnorm = dyr[i] * w[i];
            dxr[i] = s * (dnorm - dnorm_mean - norm * dnorm_norm_mean);
        }
    }
}
multiversion!(fn bwd_chunk<>(dx: &mut [f32], dw: &mut [f32], db: &mut [f32], dy: &[f32], x: &[f32], w: &[f32], mean: &[f32], rstd: &[f32]) => bwd_rows);

/// Workspace [`layernorm_backward`] needs: per-thread partial dw and db.
pub fn backward_workspace(threads: usize, c: usize) -> usize {
    2 * c * threads
}

/// dx = rstd·(dnorm − mean(dnorm) − norm·mean(dnorm·norm)), dnorm = dy·w; dw = Σ dy·norm;
/// db = Σ dy (rows summed per thread in `ws`, then the threads' partials in thread order).
// dx, dy, x: (R, C); dw, db, w: (C); mean, rstd: (R); ws: (threads, 2, C)
#[allow(
    clippy::too_many_arguments,
    reason = "a kernel's operands and dimensions, as its reference in ops/layernorm.rs"
)]
pub fn layernorm_backward(
    pool: &Pool,
    dx: &mut [f32],
    dw: &mut [f32],
    db: &mut [f32],
    dy: &[f32],
    x: &[f32],
    w: &[f32],
    mean: &[f32],
    rstd: &[f32],
    ws: &mut [f32],
) {
    let c = w.len();
    let rows = mean.len();
    let t = pool.threads();
    assert!(
        dx.len() == rows * c
            && dy.len() == rows * c
            && x.len() == rows * c
            && ws.len() >= 2 * c * t
    );
    let parts = super::super::pool::chunks(rows, t, min_rows(c), 1);
    let per = rows.div_ceil(parts.max(1));
    let (dxp, wsp) = (SyncPtr(dx.as_mut_ptr()), SyncPtr(ws.as_mut_ptr()));
    pool.run(parts, &|i| {
        let (r0, r1) = ((i * per).min(rows), ((i + 1) * per).min(rows));
        // SAFETY: task i writes rows [r0, r1) of dx and its own 2C of the workspace.
        let part = unsafe { wsp.slice(i * 2 * c..(i + 1) * 2 * c) };
        part.fill(0.0);
        let (pw, pb) = part.split_at_mut(c);
        unsafe {
            bwd_chunk(
                dxp.slice(r0 * c..r1 * c),
                pw,
                pb,
                &dy[r0 * c..r1 * c],
                &x[r0 * c..r1 * c],
                w,
                &mean[r0..r1],
                &rstd[r0..r1],
            )
        }
    });
    dw.copy_from_slice(&ws[..c]);
    db.copy_from_slice(&ws[c..2 * c]);
    for i in 1..parts {
        let part = &ws[i * 2 * c..(i + 1) * 2 * c];
        for j in 0..c {
            dw[j] += part[j];
            db[j] += part[c + j];
        }
    }
}

impl CpuKernel for AddLayerNorm {
    unsafe fn exec(&self, k: &Kernel<'_>) -> Result<(), OpError> {
        let AddLayerNorm { eps } = self;
        let (y, mean, rstd) = (k.wr(1), k.wr(2), k.wr(3));
        match k.r.inplace {
            // The sum overwrites a dying operand; addition commutes, so add the other.
            Some(s) => layernorm::add_layernorm_forward(
                k.pool,
                k.rw(s),
                y,
                mean,
                rstd,
                None,
                k.rd(1 - s),
                k.rd(2),
                k.rd(3),
                *eps,
            ),
            None => layernorm::add_layernorm_forward(
                k.pool,
                k.wr(0),
                y,
                mean,
                rstd,
                Some(k.rd(0)),
                k.rd(1),
                k.rd(2),
                k.rd(3),
                *eps,
            ),
        }

        Ok(())
    }
}

impl CpuKernel for LayerNorm {
    unsafe fn exec(&self, k: &Kernel<'_>) -> Result<(), OpError> {
        let LayerNorm { eps } = self;
        layernorm::layernorm_forward(
            k.pool,
            k.wr(0),
            k.wr(1),
            k.wr(2),
            k.rd(0),
            k.rd(1),
            k.rd(2),
            *eps,
        );
        Ok(())
    }
}

impl CpuKernel for LayerNormBackward {
    fn workspace(&self, cpu: &CpuSupport, g: &Graph, node: usize) -> usize {
        backward_workspace(cpu.threads, *g.shape(g.nodes()[node].inputs[2]).first().unwrap_or(&1))
    }

    unsafe fn exec(&self, k: &Kernel<'_>) -> Result<(), OpError> {
        layernorm::layernorm_backward(
            k.pool,
            k.wr(0),
            k.wr(1),
            k.wr(2),
            k.rd(0),
            k.rd(1),
            k.rd(2),
            k.rd(3),
            k.rd(4),
            k.ws(),
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::layernorm as rln;
    use crate::ops::testutil::Rng;

    /// Against the reference op on rows of 768 (and odd sizes): f32 sums in another order, so
    /// |Δ| ≤ 2e-5·max|ref| per tensor.
    #[test]
    fn forward_and_backward_match_the_reference() {
        let pool = Pool::new(2);
        for &(rows, c) in &[(64usize, 768usize), (37, 13), (5, 1), (300, 64)] {
            let mut rng = Rng::new(rows as u64 * 31 + c as u64);
            let x: Vec<f32> = rng.vec_f32(rows * c).iter().map(|v| 2.0 * v + 0.3).collect();
            let (w, b, dy) = (rng.vec_f32(c), rng.vec_f32(c), rng.vec_f32(rows * c));
            let (mut y0, mut m0, mut s0) = (vec![0.0; rows * c], vec![0.0; rows], vec![0.0; rows]);
            rln::layernorm_forward(&mut y0, &mut m0, &mut s0, &x, &w, &b, 1e-5);
            let (mut y1, mut m1, mut s1) = (vec![0.0; rows * c], vec![0.0; rows], vec![0.0; rows]);
            layernorm_forward(&pool, &mut y1, &mut m1, &mut s1, &x, &w, &b, 1e-5);
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
            check(&m1, &m0, "mean");
            check(&s1, &s0, "rstd");
            let (mut dx0, mut dw0, mut db0) = (vec![0.0; rows * c], vec![0.0; c], vec![0.0; c]);
            rln::layernorm_backward(&mut dx0, &mut dw0, &mut db0, &dy, &x, &w, &m0, &s0);
            let (mut dx1, mut dw1, mut db1) = (vec![0.0; rows * c], vec![0.0; c], vec![0.0; c]);
            let mut ws = vec![f32::NAN; backward_workspace(pool.threads(), c)];
            layernorm_backward(&pool, &mut dx1, &mut dw1, &mut db1, &dy, &x, &w, &m0, &s0, &mut ws);
            check(&dx1, &dx0, "dx");
            check(&dw1, &dw0, "dw");
            check(&db1, &db0, "db");
        }
    }

    /// The fused residual add + LayerNorm against the reference (`ops::layernorm::
    /// add_layernorm_forward`), out of place and in place over either operand; tolerance as
    /// above (2e-5·max|ref|), the sum exact.
    #[test]
    fn add_layernorm_matches_the_reference() {
        let pool = Pool::new(2);
        for &(rows, c) in &[(64usize, 768usize), (37, 13), (300, 64)] {
            let mut rng = Rng::new(rows as u64 * 17 + c as u64);
            let (a, b) = (rng.vec_f32(rows * c), rng.vec_f32(rows * c));
            let (w, bias) = (rng.vec_f32(c), rng.vec_f32(c));
            let (mut s0, mut y0, mut m0, mut r0) =
                (vec![0.0; rows * c], vec![0.0; rows * c], vec![0.0; rows], vec![0.0; rows]);
            rln::add_layernorm_forward(&mut s0, &mut y0, &mut m0, &mut r0, &a, &b, &w, &bias, 1e-5);
            let scale = y0.iter().fold(0f32, |m, v| m.max(v.abs()));
            for mode in 0..3 {
                let (mut y, mut m, mut r) = (vec![0.0; rows * c], vec![0.0; rows], vec![0.0; rows]);
                let sum = match mode {
                    0 => {
                        let mut s = vec![f32::NAN; rows * c];
                        add_layernorm_forward(
                            &pool,
                            &mut s,
                            &mut y,
                            &mut m,
                            &mut r,
                            Some(&a),
                            &b,
                            &w,
                            &bias,
                            1e-5,
                        );
                        s
                    }
                    1 => {
                        let mut s = a.clone();
                        add_layernorm_forward(
                            &pool, &mut s, &mut y, &mut m, &mut r, None, &b, &w, &bias, 1e-5,
                        );
                        s
                    }
                    _ => {
                        let mut s = b.clone();
                        add_layernorm_forward(
                            &pool, &mut s, &mut y, &mut m, &mut r, None, &a, &w, &bias, 1e-5,
                        );
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
                for (x, want) in m.iter().zip(&m0).chain(r.iter().zip(&r0)) {
                    assert!((x - want).abs() <= 2e-5 * want.abs().max(1.0), "stats: {x} vs {want}");
                }
            }
        }
    }
}
