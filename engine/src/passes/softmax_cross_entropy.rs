//! Softmax + cross-entropy: no pass, because [`crate::graph::Op::CrossEntropy`] is already the
//! fused form. The builders write HF's `CrossEntropyLoss()(logits, labels)` as that one op;
//! its forward is a max-subtracted log-sum-exp per row (no probabilities stored), its backward
//! recomputes the row's softmax from the logits once and writes `softmax − onehot` (over the
//! logits' buffer when the planner makes it in place), so the (rows, V) probabilities are
//! never materialised — not once as an activation and again as a gradient, as the two-op
//! `log_softmax` + `nll_loss` form does.
//!
//! These tests check the fused reference op and the planned CPU kernel against that two-op
//! form (softmax, then −log p at the label; gradient (p − onehot)/count) on random logits,
//! with some rows ignored.

use crate::backend::cpu::kernels::cross_entropy as ce_kernel;
use crate::backend::cpu::pool::Pool;
use crate::ops::cross_entropy;
use crate::ops::softmax::softmax_forward;
use crate::ops::testutil::Rng;

/// (loss, dlogits) of the two-op form in f64.
fn two_op(logits: &[f64], labels: &[i64], v: usize) -> (f64, Vec<f64>) {
    let mut p = vec![0.0; logits.len()];
    softmax_forward(&mut p, logits, v, 1.0, false, 1, None);
    let count = labels.iter().filter(|&&l| l != -100).count() as f64;
    let (mut loss, mut d) = (0.0, vec![0.0; logits.len()]);
    for (r, &l) in labels.iter().enumerate() {
        if l == -100 {
            continue;
        }
        let row = &p[r * v..(r + 1) * v];
        loss -= row[l as usize].ln();
        for j in 0..v {
            d[r * v + j] = (row[j] - if j == l as usize { 1.0 } else { 0.0 }) / count;
        }
    }
    (loss / count, d)
}

#[test]
fn fused_cross_entropy_matches_softmax_then_nll() {
    let pool = Pool::new(2);
    for &(rows, v) in &[(6usize, 5usize), (33, 50), (8, 1000)] {
        let mut rng = Rng::new(rows as u64 * 7 + v as u64);
        let logits: Vec<f64> = rng.vec(rows * v).iter().map(|x| 4.0 * x).collect();
        let labels: Vec<i64> =
            (0..rows).map(|r| if r % 3 == 2 { -100 } else { rng.below(v) as i64 }).collect();
        let (want_l, want_d) = two_op(&logits, &labels, v);
        // Reference op (f64): the same math, one pass per row.
        let l = cross_entropy::cross_entropy_forward(&logits, &labels, v, -100).unwrap();
        let mut d = vec![0.0; rows * v];
        cross_entropy::cross_entropy_backward(&mut d, 1.0, &logits, &labels, v, -100).unwrap();
        assert!((l - want_l).abs() <= 1e-12 * want_l.abs(), "reference loss {l} vs {want_l}");
        let dmax = d.iter().zip(&want_d).fold(0f64, |m, (a, b)| m.max((a - b).abs()));
        assert!(dmax <= 1e-14, "reference dlogits differ by {dmax:e}");
        // CPU kernel (f32, out of place and in place): 1e-5 relative on the loss, 1e-6·max|d|
        // on the gradient (f32 exp and sums in another order).
        let l32: Vec<f32> = logits.iter().map(|&x| x as f32).collect();
        let mut ws = vec![0f32; rows];
        let lk = ce_kernel::cross_entropy_forward(&pool, &l32, &labels, v, -100, &mut ws).unwrap()
            as f64;
        assert!((lk - want_l).abs() <= 1e-5 * want_l.abs(), "kernel loss {lk} vs {want_l}");
        let big = want_d.iter().fold(0f64, |m, x| m.max(x.abs()));
        let mut dk = vec![f32::NAN; rows * v];
        ce_kernel::cross_entropy_backward(&pool, &mut dk, 1.0, Some(&l32), &labels, v, -100)
            .unwrap();
        let mut inplace = l32.clone();
        ce_kernel::cross_entropy_backward(&pool, &mut inplace, 1.0, None, &labels, v, -100)
            .unwrap();
        for (what, got) in [("out of place", &dk), ("in place", &inplace)] {
            let dmax = got.iter().zip(&want_d).fold(0f64, |m, (&a, b)| m.max((a as f64 - b).abs()));
            assert!(dmax <= 1e-6 * big, "kernel dlogits ({what}) differ by {dmax:e} (max {big:e})");
        }
    }
}
