//! Embedding gather and its scatter-add backward.
//!
//! The backward splits the table's columns over the pool (each task owns a column block of
//! every row), so repeated ids need no atomics and each element sums its contributions in id
//! order, exactly as the reference: the result is bit-identical to it.
//!
//! References: `ops::embedding` (tested against), llm.c `encoder_forward` /
//! `encoder_backward`.

use super::embedding;
use super::simd::multiversion;
use crate::backend::cpu::pool::{Pool, SyncPtr};
use crate::exec::planned::kernel::{CpuKernel, Kernel};
use crate::graph::op::{Embedding, EmbeddingBackward};
use crate::ops::OpError;

/// Checks every id against the table's `v` rows.
pub fn check_ids(ids: &[i64], v: usize) -> Result<(), OpError> {
    match ids.iter().position(|&id| id < 0 || id as usize >= v) {
        Some(position) => Err(OpError::IndexOutOfRange {
            op: "embedding",
            index: ids[position],
            position,
            limit: v,
        }),
        None => Ok(()),
    }
}

/// out[n, :] = table[ids[n], :]
// out: (N, C); ids: (N); table: (V, C)
pub fn embedding_forward(
    pool: &Pool,
    out: &mut [f32],
    ids: &[i64],
    table: &[f32],
    c: usize,
) -> Result<(), OpError> {
    check_ids(ids, table.len() / c)?;
    let o = SyncPtr(out.as_mut_ptr());
    pool.for_ranges(ids.len(), ((1 << 15) / c).max(1), 1, &|r| {
        for n in r {
            let row = ids[n] as usize;
            // SAFETY: row n of out is this task's alone.
            unsafe { o.slice(n * c..(n + 1) * c) }.copy_from_slice(&table[row * c..(row + 1) * c]);
        }
    });
    Ok(())
}

#[inline(always)]
fn scatter_body(dtable: *mut f32, ids: &[i64], dout: &[f32], c: usize, c0: usize, c1: usize) {
    // SAFETY (caller): columns [c0, c1) of every row of dtable (V, C) are this task's alone.
    unsafe {
        for (n, &id) in ids.iter().enumerate() {
            let d = std::slice::from_raw_parts_mut(dtable.add(id as usize * c + c0), c1 - c0);
            for (x, &g) in d.iter_mut().zip(&dout[n * c + c0..n * c + c1]) {
                *x += g;
            }
        }
    }
}
multiversion!(fn scatter_chunk<>(dtable: *mut f32, ids: &[i64], dout: &[f32], c: usize, c0: usize, c1: usize) => scatter_body);

/// dtable[v, :] = Σ_{n: ids[n] = v} dout[n, :] (zero for ids that do not occur).
// dtable: (V, C); ids: (N); dout: (N, C)
pub fn embedding_backward(
    pool: &Pool,
    dtable: &mut [f32],
    ids: &[i64],
    dout: &[f32],
    c: usize,
) -> Result<(), OpError> {
    let v = dtable.len() / c;
    check_ids(ids, v)?;
    let p = SyncPtr(dtable.as_mut_ptr());
    // Zero the table in contiguous halves first: a large contiguous fill streams (memset's
    // non-temporal stores), where zeroing each task's column block row by row did not — that
    // made this kernel slower than the one-thread reference (figures: docs/measurements.md).
    // SAFETY: the ranges are disjoint and inside the table.
    pool.for_ranges(dtable.len(), 1 << 16, 16, &|r| unsafe { p.slice(r) }.fill(0.0));
    let parts = if ids.len() * c < (1 << 16) { 1 } else { pool.threads() };
    pool.for_ranges(c, (c / parts).max(1), if c >= 16 * parts { 16 } else { 1 }, &|r| {
        scatter_chunk(p.ptr(), ids, dout, c, r.start, r.end)
    });
    Ok(())
}

impl CpuKernel for Embedding {
    unsafe fn exec(&self, k: &Kernel<'_>) -> Result<(), OpError> {
        embedding::embedding_forward(
            k.pool,
            k.wr(0),
            k.ids(1),
            k.rd(0),
            k.g.shape(k.node.inputs[0])[1],
        )?;
        Ok(())
    }
}

impl CpuKernel for EmbeddingBackward {
    unsafe fn exec(&self, k: &Kernel<'_>) -> Result<(), OpError> {
        let c = k.g.shape(k.node.outputs[0])[1];
        embedding::embedding_backward(k.pool, k.wr(0), k.ids(0), k.rd(1), c)?;

        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::embedding as remb;
    use crate::ops::testutil::Rng;

    #[test]
    fn gather_and_scatter_are_bit_identical_to_the_reference() {
        let pool = Pool::new(2);
        for &(v, c, n) in &[(1000usize, 64usize, 300usize), (7, 3, 10), (50, 768, 64)] {
            let mut rng = Rng::new(v as u64);
            let table = rng.vec_f32(v * c);
            let ids: Vec<i64> = (0..n)
                .map(|i| if i % 3 == 0 { 5 % v as i64 } else { rng.below(v) as i64 })
                .collect();
            let mut want = vec![0.0; n * c];
            remb::embedding_forward(&mut want, &ids, &table, c).unwrap();
            let mut got = vec![f32::NAN; n * c];
            embedding_forward(&pool, &mut got, &ids, &table, c).unwrap();
            assert_eq!(got, want);
            let dout = rng.vec_f32(n * c);
            let mut want = vec![0.0; v * c];
            remb::embedding_backward(&mut want, &ids, &dout, c).unwrap();
            let mut got = vec![f32::NAN; v * c];
            embedding_backward(&pool, &mut got, &ids, &dout, c).unwrap();
            assert_eq!(got, want);
        }
        let mut out = vec![0.0; 4];
        assert!(embedding_forward(&pool, &mut out, &[3], &[0.0; 6], 2).is_err());
    }
}
