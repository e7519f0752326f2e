//! Row softmax with scale, additive broadcast mask and causal mask, its backward, and the row
//! primitives attention reuses.
//!
//! References: `ops::softmax` (tested against), llm.c `softmax_forward`, ATen
//! `_softmax_backward_data`.

use super::simd::{self, multiversion};
use super::softmax;
use crate::backend::cpu::pool::{Pool, SyncPtr};
use crate::exec::planned::kernel::ResolveCx;
use crate::exec::planned::kernel::{CpuKernel, Kernel};
use crate::exec::planned::Aux;
use crate::graph::op::{Softmax, SoftmaxBackward};
use crate::ops::OpError;
use crate::plan::PlanError;

/// An additive mask broadcast against the rows of a tensor (numpy rules, right-aligned), with
/// the index arithmetic precomputed at plan time (`ops::MaskView` without its data, so that
/// building it inside a step allocates nothing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MaskMap {
    /// Mask stride of each leading (row) dim of the full shape; 0 where broadcast.
    strides: Vec<usize>,
    row_dims: Vec<usize>,
    /// Mask stride of the last dim (0 when broadcast).
    pub last_stride: usize,
    /// Elements the mask data must have.
    pub len: usize,
}

impl MaskMap {
    /// mask_shape broadcastable to full (checked by the graph builder).
    pub fn new(mask_shape: &[usize], full: &[usize]) -> Self {
        let rank = full.len();
        let pad = rank - mask_shape.len();
        let shape: Vec<usize> =
            (0..rank).map(|d| if d < pad { 1 } else { mask_shape[d - pad] }).collect();
        let mut strides = vec![0; rank];
        let mut s = 1;
        for d in (0..rank).rev() {
            strides[d] = if shape[d] == 1 { 0 } else { s };
            s *= shape[d];
        }
        MaskMap {
            last_stride: strides[rank - 1],
            strides: strides[..rank - 1].to_vec(),
            row_dims: full[..rank - 1].to_vec(),
            len: s,
        }
    }

    /// Offset into the mask of row `row` (flat over the leading dims of the full shape).
    #[inline]
    pub fn row_offset(&self, mut row: usize) -> usize {
        let mut off = 0;
        for d in (0..self.row_dims.len()).rev() {
            off += (row % self.row_dims[d]) * self.strides[d];
            row /= self.row_dims[d];
        }
        off
    }
}

/// y = softmax(y) over the first `valid` entries, 0 after them (causal tail). Returns the row's
/// max m and inv = 1/Σ exp(y − m): each entry is exp(y − m)·inv, bit for bit (−∞ and 0 for a
/// row masked everywhere, whose entries are 0).
#[inline(always)]
pub fn softmax_row_in_place(y: &mut [f32], valid: usize) -> (f32, f32) {
    let (head, tail) = y.split_at_mut(valid);
    tail.fill(0.0);
    let m = simd::max(head);
    if m == f32::NEG_INFINITY {
        // Every entry masked: zeros, as torch's sdpa (`_safe_softmax`) and the reference.
        head.fill(0.0);
        return (m, 0.0);
    }
    let mut acc = [0f32; simd::LANES];
    let mut chunks = head.chunks_exact_mut(simd::LANES);
    for c in &mut chunks {
        for l in 0..simd::LANES {
            let e = simd::exp(c[l] - m);
            c[l] = e;
            acc[l] += e;
        }
    }
    for (l, v) in chunks.into_remainder().iter_mut().enumerate() {
        let e = simd::exp(*v - m);
        *v = e;
        acc[l] += e;
    }
    let inv = 1.0 / simd::sum(&acc);
    for v in head.iter_mut() {
        *v *= inv;
    }
    (m, inv)
}

/// The row of [`softmax_row_in_place`] again from the same input and its (m, inv): one pass,
/// the same bits.
#[inline(always)]
pub fn softmax_row_again(y: &mut [f32], valid: usize, (m, inv): (f32, f32)) {
    let (head, tail) = y.split_at_mut(valid);
    tail.fill(0.0);
    if m == f32::NEG_INFINITY {
        head.fill(0.0);
        return;
    }
    for v in head.iter_mut() {
        *v = simd::exp(*v - m) * inv;
    }
}

#[inline(always)]
#[allow(
    clippy::too_many_arguments,
    reason = "a kernel's operands and dimensions, as its reference in ops/softmax.rs"
)]
fn fwd_rows(
    y: &mut [f32],
    x: &[f32],
    n: usize,
    scale: f32,
    causal: bool,
    tq: usize,
    row0: usize,
    mask: Option<(&[f32], &MaskMap)>,
) {
    for (k, (xr, yr)) in x.chunks_exact(n).zip(y.chunks_exact_mut(n)).enumerate() {
        let r = row0 + k;
        match mask {
            Some((data, mm)) => {
                let off = mm.row_offset(r);
                for j in 0..n {
                    yr[j] = xr[j] * scale + data[off + j * mm.last_stride];
                }
            }
            None => {
                for j in 0..n {
                    yr[j] = xr[j] * scale;
                }
            }
        }
        let valid = if causal { (r % tq + 1).min(n) } else { n };
        softmax_row_in_place(yr, valid);
    }
}
multiversion!(fn fwd_chunk<>(y: &mut [f32], x: &[f32], n: usize, scale: f32, causal: bool, tq: usize, row0: usize, mask: Option<(&[f32], &MaskMap)>) => fwd_rows);

/// y = softmax(x·scale + mask) over rows of `n`; with `causal`, row r is query r mod `tq` and
/// sees entries j ≤ it.
// y, x: (R, N); mask: broadcastable to (…, Tq, N)
#[allow(
    clippy::too_many_arguments,
    reason = "a kernel's operands and dimensions, as its reference in ops/softmax.rs"
)]
pub fn softmax_forward(
    pool: &Pool,
    y: &mut [f32],
    x: &[f32],
    n: usize,
    scale: f32,
    causal: bool,
    tq: usize,
    mask: Option<(&[f32], &MaskMap)>,
) {
    let rows = x.len() / n;
    let yp = SyncPtr(y.as_mut_ptr());
    pool.for_ranges(rows, ((1 << 13) / n).max(1), 1, &|r| {
        // SAFETY: row ranges are disjoint and inside `y`.
        fwd_chunk(
            unsafe { yp.slice(r.start * n..r.end * n) },
            &x[r.start * n..r.end * n],
            n,
            scale,
            causal,
            tq,
            r.start,
            mask,
        )
    });
}

#[inline(always)]
fn bwd_rows(dx: &mut [f32], y: &[f32], dy: &[f32], n: usize, scale: f32) {
    for ((dxr, yr), dyr) in dx.chunks_exact_mut(n).zip(y.chunks_exact(n)).zip(dy.chunks_exact(n)) {
        let s = simd::dot(dyr, yr);
        for j in 0..n {
            dxr[j] = scale * yr[j] * (dyr[j] - s);
        }
    }
}
#[inline(always)]
fn bwd_inplace_rows(y: &[f32], dyo: &mut [f32], n: usize, scale: f32) {
    for (yr, dr) in y.chunks_exact(n).zip(dyo.chunks_exact_mut(n)) {
        let s = simd::dot(dr, yr);
        for j in 0..n {
            dr[j] = scale * yr[j] * (dr[j] - s);
        }
    }
}
multiversion!(fn bwd_chunk<>(dx: &mut [f32], y: &[f32], dy: &[f32], n: usize, scale: f32) => bwd_rows);
multiversion!(fn bwd_inplace_chunk<>(y: &[f32], dyo: &mut [f32], n: usize, scale: f32) => bwd_inplace_rows);

/// dx = scale·y·(dy − Σ dy·y) per row.
// dx, y, dy: (R, N)
pub fn softmax_backward(pool: &Pool, dx: &mut [f32], y: &[f32], dy: &[f32], n: usize, scale: f32) {
    let rows = y.len() / n;
    let p = SyncPtr(dx.as_mut_ptr());
    pool.for_ranges(rows, ((1 << 13) / n).max(1), 1, &|r| {
        let s = r.start * n..r.end * n;
        // SAFETY: row ranges are disjoint and inside `dx`.
        bwd_chunk(unsafe { p.slice(s.clone()) }, &y[s.clone()], &dy[s], n, scale)
    });
}

/// [`softmax_backward`] written over dy.
// y, dyo: (R, N)
pub fn softmax_backward_inplace(pool: &Pool, y: &[f32], dyo: &mut [f32], n: usize, scale: f32) {
    let rows = y.len() / n;
    let p = SyncPtr(dyo.as_mut_ptr());
    pool.for_ranges(rows, ((1 << 13) / n).max(1), 1, &|r| {
        let s = r.start * n..r.end * n;
        // SAFETY: row ranges are disjoint and inside `dyo`.
        bwd_inplace_chunk(&y[s.clone()], unsafe { p.slice(s) }, n, scale)
    });
}

impl CpuKernel for Softmax {
    fn resolve(&self, cx: &ResolveCx<'_>) -> Result<Aux, PlanError> {
        let i = &cx.node.inputs;
        Ok(match i.get(1) {
            Some(&m) => Aux::Mask(MaskMap::new(cx.g.shape(m), cx.g.shape(i[0]))),
            None => Aux::None,
        })
    }

    unsafe fn exec(&self, k: &Kernel<'_>) -> Result<(), OpError> {
        let Softmax { scale, causal } = self;
        let s = k.g.shape(k.node.inputs[0]);
        let tq = if s.len() >= 2 { s[s.len() - 2] } else { 1 };
        softmax::softmax_forward(
            k.pool,
            k.wr(0),
            k.rd(0),
            k.last(k.node.inputs[0]),
            *scale,
            *causal,
            tq,
            k.mask(1),
        );

        Ok(())
    }
}

impl CpuKernel for SoftmaxBackward {
    unsafe fn exec(&self, k: &Kernel<'_>) -> Result<(), OpError> {
        let SoftmaxBackward { scale } = self;
        match k.r.inplace {
            Some(_) => softmax::softmax_backward_inplace(
                k.pool,
                k.rd(0),
                k.rw(1),
                k.last(k.node.inputs[0]),
                *scale,
            ),
            None => softmax::softmax_backward(
                k.pool,
                k.wr(0),
                k.rd(0),
                k.rd(1),
                k.last(k.node.inputs[0]),
                *scale,
            ),
        };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testutil::Rng;
    use crate::ops::{softmax as rsm, MaskView};

    #[test]
    fn forward_and_backward_match_the_reference_with_mask_and_causal() {
        let pool = Pool::new(2);
        let (b, h, t) = (3usize, 4usize, 37usize);
        let full = [b, h, t, t];
        let mut rng = Rng::new(5);
        let x: Vec<f32> = rng.vec_f32(b * h * t * t).iter().map(|v| 3.0 * v).collect();
        let mask = rng.vec_f32(b * t);
        let dy = rng.vec_f32(b * h * t * t);
        for causal in [false, true] {
            for use_mask in [false, true] {
                let mv = MaskView::new(&mask, &[b, 1, 1, t], &full);
                let mut want = vec![0.0; x.len()];
                rsm::softmax_forward(&mut want, &x, t, 0.7, causal, t, use_mask.then_some(&mv));
                let mm = MaskMap::new(&[b, 1, 1, t], &full);
                let mut got = vec![f32::NAN; x.len()];
                softmax_forward(
                    &pool,
                    &mut got,
                    &x,
                    t,
                    0.7,
                    causal,
                    t,
                    use_mask.then_some((&mask[..], &mm)),
                );
                for (i, (a, w)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (a - w).abs() <= 2e-7 + 4.0 * f32::EPSILON * w,
                        "fwd causal={causal} [{i}]: {a} vs {w}"
                    );
                }
                let mut dx0 = vec![0.0; x.len()];
                rsm::softmax_backward(&mut dx0, &want, &dy, t, 0.7);
                let mut dx1 = vec![0.0; x.len()];
                let mut dyc = dy.clone();
                softmax_backward(&pool, &mut dx1, &want, &dy, t, 0.7);
                softmax_backward_inplace(&pool, &want, &mut dyc, t, 0.7);
                assert_eq!(dx1, dyc);
                for (i, (a, w)) in dx1.iter().zip(&dx0).enumerate() {
                    assert!((a - w).abs() <= 1e-6, "bwd [{i}]: {a} vs {w}");
                }
            }
        }
    }

    #[test]
    fn mask_map_matches_mask_view() {
        let data: Vec<f32> = (0..6).map(|v| v as f32).collect();
        for (ms, full) in [
            (vec![2usize, 1, 3], vec![2usize, 2, 3]),
            (vec![2, 1], vec![2, 2, 3]),
            (vec![3], vec![4, 3]),
        ] {
            let n: usize = ms.iter().product();
            let mv = MaskView::new(&data[..n], &ms, &full);
            let mm = MaskMap::new(&ms, &full);
            assert_eq!(mm.len, n);
            let rows: usize = full[..full.len() - 1].iter().product();
            for r in 0..rows {
                let (a, b) = (mv.row_offset(r), mm.row_offset(r));
                assert_eq!(a, b);
                for j in 0..full[full.len() - 1] {
                    assert_eq!(mv.at(a, j), data[b + j * mm.last_stride]);
                }
            }
        }
    }
}
