//! Operands as rows at strides: what a kernel sees of a tensor whose layout requirement is
//! `Req::Rows` (the last dim contiguous, the leading dims at any strides), so that the views
//! around it — a head permute, a split of a fused projection, a concat of gradients — fold into
//! its addressing instead of being copied.

use super::copy::Walk;
use crate::backend::cpu::pool::{Pool, SyncPtr};
use crate::exec::planned::kernel::Kernel;
use crate::graph::TensorId;

/// One operand's rows: row r (row-major over `lead`, the dims before the last) starts at
/// `ptr` + Σ index·stride over `lead`; its elements along the last dim are contiguous.
#[derive(Clone, Copy, Debug)]
pub struct RowsAt<'a> {
    pub ptr: SyncPtr<f32>,
    pub lead: &'a [usize],
    pub strides: &'a [usize],
}

impl<'a> RowsAt<'a> {
    /// Tensor `t` of a step as rows, at the plan's place.
    ///
    /// # Safety
    /// As [`crate::exec::planned::kernel::CpuKernel::exec`].
    pub unsafe fn of(k: &Kernel<'a>, t: TensorId) -> Self {
        let lead = k.g.shape(t);
        let lead = &lead[..lead.len() - 1];
        RowsAt { ptr: SyncPtr(k.ptr(t)), lead, strides: &k.pl(t).strides[..lead.len()] }
    }
}

/// Rows of `width` elements per task below which the work stays on one thread (16 Ki
/// elements).
fn min_rows(width: usize) -> usize {
    ((1 << 14) / width.max(1)).max(1)
}

/// `f([start of row r of each operand])` for every row r, rows split over the pool in ranges;
/// every operand has the same leading dims.
///
/// # Safety
/// Every row of every operand is valid for `f`'s accesses; rows an `f` writes are touched by no
/// other call of `f` (distinct rows of a written operand do not overlap).
pub unsafe fn for_rows<const K: usize>(
    pool: &Pool,
    ops: [RowsAt<'_>; K],
    width: usize,
    f: &(dyn Fn([*mut f32; K]) + Sync),
) {
    let lead = ops[0].lead;
    assert!(ops.iter().all(|o| o.lead == lead && o.strides.len() == lead.len()));
    let rows: usize = lead.iter().product();
    pool.for_ranges(rows, min_rows(width), 1, &|r| {
        let mut walks = ops.map(|o| Walk::new(o.lead, o.strides, 0, r.start));
        for _ in r {
            // SAFETY: the walks' offsets are rows of their operands (the function's contract).
            let at: [*mut f32; K] =
                std::array::from_fn(|k| unsafe { ops[k].ptr.ptr().add(walks[k].off) });
            f(at);
            walks.iter_mut().for_each(|w| w.advance());
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testutil::Rng;

    /// out = a + b row by row, a read as a permuted view ((4, 3) rows stored as (3, 4)), b at row
    /// stride W + 2 (gaps), out dense, over 3 threads: each row of out must be the sum of the
    /// rows at those strides, the gaps never touched.
    #[test]
    fn for_rows_hands_each_operand_its_rows_at_its_strides() {
        let pool = Pool::new(3);
        let (n0, n1, w) = (4usize, 3usize, 5usize);
        let a = Rng::new(3).vec_f32(n0 * n1 * w); // stored (n1, n0, w)
        let b: Vec<f32> = Rng::new(4).vec_f32(n0 * n1 * (w + 2)); // rows at w + 2
        let mut out = vec![f32::NAN; n0 * n1 * w];
        let lead = [n0, n1];
        let (sa, sb, so) = ([w, n0 * w], [n1 * (w + 2), w + 2], [n1 * w, w]);
        let at =
            |p: *const f32, strides| RowsAt { ptr: SyncPtr(p as *mut f32), lead: &lead, strides };
        // SAFETY: every row of the three layouts lies inside its vector; out is apart.
        unsafe {
            for_rows(
                &pool,
                [
                    at(out.as_mut_ptr(), &so),
                    at(a.as_ptr() as *mut f32, &sa),
                    at(b.as_ptr() as *mut f32, &sb),
                ],
                w,
                &|[o, x, y]| {
                    for i in 0..w {
                        *o.add(i) = *x.add(i) + *y.add(i);
                    }
                },
            );
        }
        for (i, j, k) in
            (0..n0).flat_map(|i| (0..n1).flat_map(move |j| (0..w).map(move |k| (i, j, k))))
        {
            let want = a[(j * n0 + i) * w + k] + b[(i * n1 + j) * (w + 2) + k];
            assert_eq!(out[(i * n1 + j) * w + k], want, "row ({i}, {j}) element {k}");
        }
    }
}
