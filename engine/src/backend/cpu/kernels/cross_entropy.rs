//! Cross-entropy over the last dim with integer labels and an ignore index, forward and
//! backward, rows split over the pool.
//!
//! The backward reads each row of logits once for its max and log-sum-exp and writes
//! softmax − onehot (scaled) in the same pass, over the logits when the planner makes it in
//! place: the probabilities are never stored separately.
//!
//! References: `ops::cross_entropy` (tested against); llm.c `crossentropy_forward` and
//! `crossentropy_softmax_backward`; `torch.nn.functional.cross_entropy(reduction='mean')`.

use super::cross_entropy;
use super::simd::{self, multiversion};
use crate::backend::cpu::pool::{Pool, SyncPtr};
use crate::exec::planned::kernel::{CpuKernel, Kernel};
use crate::exec::planned::CpuSupport;
use crate::graph::op::{CrossEntropy, CrossEntropyBackward};
use crate::graph::Graph;
use crate::ops::OpError;

/// log Σ exp(row), max-subtracted.
#[inline(always)]
pub(super) fn lse(row: &[f32]) -> f32 {
    let m = simd::max(row);
    let mut acc = [0f32; simd::LANES];
    let chunks = row.chunks_exact(simd::LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for l in 0..simd::LANES {
            acc[l] += simd::exp(c[l] - m);
        }
    }
    for (l, &v) in rest.iter().enumerate() {
        acc[l] += simd::exp(v - m);
    }
    m + simd::sum(&acc).ln()
}

/// Checks every label: in 0..V or the ignore index. Returns the number counted.
pub fn check_labels(labels: &[i64], v: usize, ignore_index: i64) -> Result<usize, OpError> {
    let mut count = 0;
    for (position, &l) in labels.iter().enumerate() {
        if l == ignore_index {
            continue;
        }
        if l < 0 || l as usize >= v {
            return Err(OpError::IndexOutOfRange {
                op: "cross_entropy",
                index: l,
                position,
                limit: v,
            });
        }
        count += 1;
    }
    Ok(count)
}

#[inline(always)]
fn fwd_rows(losses: &mut [f32], logits: &[f32], labels: &[i64], v: usize, ignore_index: i64) {
    for ((l, row), &y) in losses.iter_mut().zip(logits.chunks_exact(v)).zip(labels) {
        *l = if y == ignore_index { 0.0 } else { lse(row) - row[y as usize] };
    }
}
multiversion!(fn fwd_chunk<>(losses: &mut [f32], logits: &[f32], labels: &[i64], v: usize, ignore_index: i64) => fwd_rows);

/// The mean over counted rows of lse(row) − row[label] (NaN when every row is ignored, as the
/// reference's 0/0). Per-row losses go to `ws` and are summed in row order, so the result does
/// not depend on the thread count.
// logits: (R, V); labels: (R); ws: (R)
pub fn cross_entropy_forward(
    pool: &Pool,
    logits: &[f32],
    labels: &[i64],
    v: usize,
    ignore_index: i64,
    ws: &mut [f32],
) -> Result<f32, OpError> {
    let rows = labels.len();
    let count = check_labels(labels, v, ignore_index)?;
    let wp = SyncPtr(ws.as_mut_ptr());
    pool.for_ranges(rows, ((1 << 14) / v).max(1), 1, &|r| {
        // SAFETY: row ranges are disjoint and inside `ws`.
        fwd_chunk(
            unsafe { wp.slice(r.clone()) },
            &logits[r.start * v..r.end * v],
            &labels[r],
            v,
            ignore_index,
        )
    });
    let mut sum = 0f32;
    for &l in &ws[..rows] {
        sum += l;
    }
    Ok(sum / count as f32)
}

#[inline(always)]
fn bwd_row(drow: &mut [f32], row: Option<&[f32]>, y: i64, g: f32, ignore_index: i64) {
    if y == ignore_index {
        drow.fill(0.0);
        return;
    }
    // In place (row = None): the row is read fully (lse) before it is overwritten.
    let l = match row {
        Some(r) => lse(r),
        None => lse(drow),
    };
    match row {
        Some(r) => {
            for (d, &s) in drow.iter_mut().zip(r) {
                *d = g * simd::exp(s - l);
            }
        }
        None => {
            for d in drow.iter_mut() {
                *d = g * simd::exp(*d - l);
            }
        }
    }
    drow[y as usize] -= g;
}
#[inline(always)]
fn bwd_rows(
    dlogits: &mut [f32],
    logits: Option<&[f32]>,
    labels: &[i64],
    v: usize,
    g: f32,
    ignore_index: i64,
) {
    for (r, (drow, &y)) in dlogits.chunks_exact_mut(v).zip(labels).enumerate() {
        bwd_row(drow, logits.map(|l| &l[r * v..(r + 1) * v]), y, g, ignore_index);
    }
}
multiversion!(fn bwd_chunk<>(dlogits: &mut [f32], logits: Option<&[f32]>, labels: &[i64], v: usize, g: f32, ignore_index: i64) => bwd_rows);

/// dlogits = dloss/count · (softmax(row) − onehot(label)), 0 on ignored rows. `logits = None`:
/// `dlogits` holds the logits on entry (in place).
// dlogits, logits: (R, V); labels: (R)
#[allow(
    clippy::too_many_arguments,
    reason = "a kernel's operands and dimensions, as its reference in ops/cross_entropy.rs"
)]
pub fn cross_entropy_backward(
    pool: &Pool,
    dlogits: &mut [f32],
    dloss: f32,
    logits: Option<&[f32]>,
    labels: &[i64],
    v: usize,
    ignore_index: i64,
) -> Result<(), OpError> {
    let count = check_labels(labels, v, ignore_index)?;
    let g = dloss / count.max(1) as f32;
    let rows = labels.len();
    let dp = SyncPtr(dlogits.as_mut_ptr());
    pool.for_ranges(rows, ((1 << 14) / v).max(1), 1, &|r| {
        let s = r.start * v..r.end * v;
        // SAFETY: row ranges are disjoint and inside `dlogits`.
        bwd_chunk(
            unsafe { dp.slice(s.clone()) },
            logits.map(|l| &l[s]),
            &labels[r],
            v,
            g,
            ignore_index,
        )
    });
    Ok(())
}

impl CpuKernel for CrossEntropy {
    fn workspace(&self, _cpu: &CpuSupport, g: &Graph, node: usize) -> usize {
        g.tensor(g.nodes()[node].inputs[1]).numel()
    }

    unsafe fn exec(&self, k: &Kernel<'_>) -> Result<(), OpError> {
        let CrossEntropy { ignore_index } = self;
        let v = k.last(k.node.inputs[0]);
        let l = cross_entropy::cross_entropy_forward(
            k.pool,
            k.rd(0),
            k.ids(1),
            v,
            *ignore_index,
            k.ws(),
        )?;
        k.wr(0)[0] = l;

        Ok(())
    }
}

impl CpuKernel for CrossEntropyBackward {
    unsafe fn exec(&self, k: &Kernel<'_>) -> Result<(), OpError> {
        let CrossEntropyBackward { ignore_index } = self;
        let v = k.last(k.node.inputs[1]);
        let dloss = k.rd(0)[0];
        match k.r.inplace {
            Some(_) => cross_entropy::cross_entropy_backward(
                k.pool,
                k.rw(1),
                dloss,
                None,
                k.ids(2),
                v,
                *ignore_index,
            )?,
            None => cross_entropy::cross_entropy_backward(
                k.pool,
                k.wr(0),
                dloss,
                Some(k.rd(1)),
                k.ids(2),
                v,
                *ignore_index,
            )?,
        }

        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::cross_entropy as rce;
    use crate::ops::testutil::Rng;

    #[test]
    fn forward_and_backward_match_the_reference() {
        let pool = Pool::new(2);
        let (r, v) = (67usize, 1000usize);
        let mut rng = Rng::new(9);
        let logits: Vec<f32> = rng.vec_f32(r * v).iter().map(|x| 4.0 * x).collect();
        let labels: Vec<i64> =
            (0..r).map(|i| if i % 5 == 3 { -100 } else { rng.below(v) as i64 }).collect();
        let want = rce::cross_entropy_forward(&logits, &labels, v, -100).unwrap();
        let mut ws = vec![0.0; r];
        let got = cross_entropy_forward(&pool, &logits, &labels, v, -100, &mut ws).unwrap();
        // 1e-6 relative: per-row lse with a 1-ulp exp, summed in the same order.
        assert!((got - want).abs() <= 1e-6 * want.abs(), "{got} vs {want}");
        let mut d0 = vec![0.0; r * v];
        rce::cross_entropy_backward(&mut d0, 1.3, &logits, &labels, v, -100).unwrap();
        let mut d1 = vec![f32::NAN; r * v];
        cross_entropy_backward(&pool, &mut d1, 1.3, Some(&logits), &labels, v, -100).unwrap();
        let mut d2 = logits.clone();
        cross_entropy_backward(&pool, &mut d2, 1.3, None, &labels, v, -100).unwrap();
        assert_eq!(d1, d2);
        let scale = d0.iter().fold(0f32, |m, x| m.max(x.abs()));
        for (i, (a, b)) in d1.iter().zip(&d0).enumerate() {
            assert!((a - b).abs() <= 1e-6 * scale, "[{i}] {a} vs {b}");
        }
        assert!(cross_entropy_forward(&pool, &logits, &[v as i64; 67], v, -100, &mut ws).is_err());
        assert!(cross_entropy_forward(&pool, &logits, &[-100; 67], v, -100, &mut ws)
            .unwrap()
            .is_nan());
    }
}
