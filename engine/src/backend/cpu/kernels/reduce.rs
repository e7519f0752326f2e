//! Sum over leading rows (bias and broadcast-add gradients), columns split over the pool.
//!
//! Reference: `ops::add::reduce_sum_leading`; llm.c `matmul_backward`'s dbias. Each output
//! element sums its column in row order, exactly as the reference does, so the result is
//! bit-identical to it whatever the thread count.

use super::simd::multiversion;
use super::{matmul, reduce};
use crate::backend::cpu::pool::{Pool, SyncPtr};
use crate::exec::planned::kernel::{CpuKernel, Kernel};
use crate::exec::planned::Aux;
use crate::graph::op::ReduceSumLeading;
use crate::ops::OpError;

#[inline(always)]
fn cols_body(out: &mut [f32], x: &[f32], n: usize, c0: usize) {
    out.fill(0.0);
    let w = out.len();
    for row in x.chunks_exact(n) {
        for (o, &v) in out.iter_mut().zip(&row[c0..c0 + w]) {
            *o += v;
        }
    }
}
multiversion!(fn cols_chunk<>(out: &mut [f32], x: &[f32], n: usize, c0: usize) => cols_body);

/// out = Σ_r x[r, :]
// out: (N); x: (R, N)
pub fn reduce_sum_leading(pool: &Pool, out: &mut [f32], x: &[f32]) {
    let n = out.len();
    assert!(n > 0 && x.len().is_multiple_of(n));
    let rows = x.len() / n;
    let o = SyncPtr(out.as_mut_ptr());
    // Column blocks of >= 64 floats, enough work (rows·cols) per task to pay a wake-up.
    let min_cols = ((1usize << 15) / rows.max(1)).max(64);
    pool.for_ranges(n, min_cols, 16, &|r| {
        // SAFETY: column ranges are disjoint and inside `out`.
        cols_chunk(unsafe { o.slice(r.clone()) }, x, n, r.start)
    });
}

#[inline(always)]
fn rows_body(out: &mut [f32], x: &[f32], n: usize, c0: usize, sel: &[u32]) {
    out.fill(0.0);
    let w = out.len();
    for &r in sel {
        let row = &x[r as usize * n + c0..r as usize * n + c0 + w];
        for (o, &v) in out.iter_mut().zip(row) {
            *o += v;
        }
    }
}
multiversion!(fn rows_chunk<>(out: &mut [f32], x: &[f32], n: usize, c0: usize, sel: &[u32]) => rows_body);

/// out = Σ_{r ∈ sel} x[r, :] — [`reduce_sum_leading`] when the other rows are zero (the same
/// sums without their exact zeros).
// out: (N); x: (R, N); sel: ascending row indices
pub fn reduce_sum_rows(pool: &Pool, out: &mut [f32], x: &[f32], sel: &[u32]) {
    let n = out.len();
    let o = SyncPtr(out.as_mut_ptr());
    let min_cols = ((1usize << 15) / sel.len().max(1)).max(64);
    pool.for_ranges(n, min_cols, 16, &|r| {
        // SAFETY: column ranges are disjoint and inside `out`.
        rows_chunk(unsafe { o.slice(r.clone()) }, x, n, r.start, sel)
    });
}

impl CpuKernel for ReduceSumLeading {
    unsafe fn exec(&self, k: &Kernel<'_>) -> Result<(), OpError> {
        match k.r.aux {
            Aux::RowSum(set) if k.x.sel[set].len() <= matmul::row_cap(k.x.row_sets[set].rows) => {
                reduce::reduce_sum_rows(k.pool, k.wr(0), k.rd(0), &k.x.sel[set])
            }
            _ => reduce::reduce_sum_leading(k.pool, k.wr(0), k.rd(0)),
        };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::add;
    use crate::ops::testutil::Rng;

    #[test]
    fn bit_identical_to_the_reference() {
        let pool = Pool::new(2);
        for &(rows, n) in &[(1024usize, 768usize), (7, 3), (1, 100), (513, 30522 / 16)] {
            let x = Rng::new(rows as u64).vec_f32(rows * n);
            let mut want = vec![0.0; n];
            add::reduce_sum_leading(&mut want, &x);
            let mut got = vec![f32::NAN; n];
            reduce_sum_leading(&pool, &mut got, &x);
            assert_eq!(got, want, "{rows}x{n}");
        }
        // Only the selected rows, with the others zero: the same sums.
        let (rows, n) = (200usize, 77usize);
        let sel: Vec<u32> = (0..rows as u32).filter(|r| r % 5 == 1).collect();
        let mut x = Rng::new(9).vec_f32(rows * n);
        for r in 0..rows {
            if r % 5 != 1 {
                x[r * n..(r + 1) * n].fill(0.0);
            }
        }
        let mut want = vec![0.0; n];
        add::reduce_sum_leading(&mut want, &x);
        let mut got = vec![f32::NAN; n];
        reduce_sum_rows(&pool, &mut got, &x, &sel);
        assert_eq!(got, want);
    }
}
