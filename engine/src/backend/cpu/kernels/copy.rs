//! Strided copies and fills: what a view the planner could not fold (reshape, permute, split,
//! concat) costs, and a fill into a strided place (a zero gradient piece inside a concat).
//!
//! Reference: `ops::layout` (permute/split/concat), PyTorch's `TensorIterator` copy.

use super::copy;
use crate::backend::cpu::pool::{Pool, SyncPtr};
use crate::exec::planned::kernel::{CpuKernel, Kernel};
use crate::graph::op::{Concat, Permute, Reshape, Split};
use crate::graph::Op;
use crate::ops::OpError;

/// A strided tensor walk: element offsets in row-major order of `shape`, from flat index
/// `start` on.
pub(super) struct Walk<'a> {
    shape: &'a [usize],
    strides: &'a [usize],
    idx: [usize; 8],
    pub(super) off: usize,
}

impl<'a> Walk<'a> {
    pub(super) fn new(
        shape: &'a [usize],
        strides: &'a [usize],
        base: usize,
        mut start: usize,
    ) -> Self {
        assert!(shape.len() <= 8, "strided copies support up to 8 dims");
        let mut idx = [0usize; 8];
        let mut off = base;
        for d in (0..shape.len()).rev() {
            idx[d] = start % shape[d];
            start /= shape[d];
            off += idx[d] * strides[d];
        }
        Walk { shape, strides, idx, off }
    }

    #[inline]
    pub(super) fn advance(&mut self) {
        for d in (0..self.shape.len()).rev() {
            self.idx[d] += 1;
            self.off += self.strides[d];
            if self.idx[d] < self.shape[d] {
                return;
            }
            self.off -= self.strides[d] * self.shape[d];
            self.idx[d] = 0;
        }
    }
}

/// dst (dst_shape, dst_strides) ← src (src_shape, src_strides), element by element in
/// row-major order of each (the shapes have the same number of elements).
///
/// # Safety
/// Every addressed element is valid; the destination elements do not overlap the source and
/// are not touched by anyone else during the call.
#[allow(
    clippy::too_many_arguments,
    reason = "source and destination each with their strides, as the op's layout gives them"
)]
pub unsafe fn copy_strided(
    pool: &Pool,
    src: *const f32,
    src_shape: &[usize],
    src_strides: &[usize],
    dst: *mut f32,
    dst_shape: &[usize],
    dst_strides: &[usize],
) {
    let n: usize = src_shape.iter().product();
    debug_assert_eq!(n, dst_shape.iter().product::<usize>());
    let (s, d) = (SyncPtr(src as *mut f32), SyncPtr(dst));
    pool.for_ranges(n, 1 << 15, 1, &|r| {
        let mut ws = Walk::new(src_shape, src_strides, 0, r.start);
        let mut wd = Walk::new(dst_shape, dst_strides, 0, r.start);
        for _ in r {
            // SAFETY: see the function's contract; flat ranges are disjoint per task.
            unsafe { *d.ptr().add(wd.off) = *s.ptr().add(ws.off) };
            ws.advance();
            wd.advance();
        }
    });
}

/// Every element of the strided dst = value.
///
/// # Safety
/// As [`copy_strided`]'s destination.
pub unsafe fn fill_strided(
    pool: &Pool,
    dst: *mut f32,
    shape: &[usize],
    strides: &[usize],
    value: f32,
) {
    let n: usize = shape.iter().product();
    let d = SyncPtr(dst);
    pool.for_ranges(n, 1 << 15, 1, &|r| {
        let mut w = Walk::new(shape, strides, 0, r.start);
        for _ in r {
            // SAFETY: see the function's contract.
            unsafe { *d.ptr().add(w.off) = value };
            w.advance();
        }
    });
}

impl CpuKernel for Reshape {
    unsafe fn exec(&self, k: &Kernel<'_>) -> Result<(), OpError> {
        // Materialised (the plan could not fold it): a strided copy.
        let (x, o) = (k.node.inputs[0], k.node.outputs[0]);
        let (xs, os) = (k.g.shape(x).to_vec(), k.g.shape(o));
        let (src_shape, src_strides) = match &k.node.op {
            Op::Permute(Permute { perm }) => (
                perm.iter().map(|&p| xs[p]).collect::<Vec<_>>(),
                perm.iter().map(|&p| k.pl(x).strides[p]).collect::<Vec<_>>(),
            ),
            // Op::Reshape, the arm's other op: the input as it is.
            _ => (xs, k.pl(x).strides.clone()),
        };
        copy::copy_strided(
            k.pool,
            k.ptr(x),
            &src_shape,
            &src_strides,
            k.ptr(o),
            os,
            &k.pl(o).strides,
        );

        Ok(())
    }
}

impl CpuKernel for Permute {
    // A materialised permute is the reshape's strided copy with permuted source strides.
    unsafe fn exec(&self, k: &Kernel<'_>) -> Result<(), OpError> {
        Reshape.exec(k)
    }
}

impl CpuKernel for Split {
    unsafe fn exec(&self, k: &Kernel<'_>) -> Result<(), OpError> {
        let Split { sizes } = self;
        let x = k.node.inputs[0];
        let xp = k.pl(x);
        let ls = *xp.strides.last().unwrap_or(&0);
        let mut start = 0;
        for (&o, &sz) in k.node.outputs.iter().zip(sizes) {
            let os = k.g.shape(o);
            copy::copy_strided(
                k.pool,
                k.ptr(x).add(start * ls),
                os,
                &xp.strides,
                k.ptr(o),
                os,
                &k.pl(o).strides,
            );
            start += sz;
        }

        Ok(())
    }
}

impl CpuKernel for Concat {
    unsafe fn exec(&self, k: &Kernel<'_>) -> Result<(), OpError> {
        let o = k.node.outputs[0];
        let op = k.pl(o);
        let ls = *op.strides.last().unwrap_or(&0);
        let mut start = 0;
        for &x in &k.node.inputs {
            let xs = k.g.shape(x);
            copy::copy_strided(
                k.pool,
                k.ptr(x),
                xs,
                &k.pl(x).strides,
                k.ptr(o).add(start * ls),
                xs,
                &op.strides,
            );
            start += k.last(x);
        }

        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::layout::permute_forward;
    use crate::ops::testutil::Rng;

    #[test]
    fn permute_copy_matches_the_reference() {
        let pool = Pool::new(2);
        let shape = [4usize, 33, 5, 64];
        let x = Rng::new(1).vec_f32(shape.iter().product());
        let perm = [0usize, 2, 1, 3];
        let mut want = vec![0.0; x.len()];
        permute_forward(&mut want, &x, &shape, &perm);
        let in_strides = [33 * 5 * 64, 5 * 64, 64, 1];
        let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
        let src_strides: Vec<usize> = perm.iter().map(|&p| in_strides[p]).collect();
        let dst_strides = [5 * 33 * 64, 33 * 64, 64, 1];
        let mut got = vec![f32::NAN; x.len()];
        unsafe {
            copy_strided(
                &pool,
                x.as_ptr(),
                &out_shape,
                &src_strides,
                got.as_mut_ptr(),
                &out_shape,
                &dst_strides,
            )
        };
        assert_eq!(got, want);
        // Strided fill: every other column.
        let mut y = vec![1.0f32; 8];
        unsafe { fill_strided(&pool, y.as_mut_ptr(), &[2, 2], &[4, 2], 0.0) };
        assert_eq!(y, [0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0]);
    }
}
