//! engine/kernels/cross_entropy.cu (`cross_entropy_forward` + `cross_entropy_mean`,
//! `cross_entropy_count` + `cross_entropy_backward`) against the CPU kernels in
//! engine/src/backend/cpu/kernels/cross_entropy.rs, logits in f32/f16/bf16 on every test device (SIMT
//! warp 32/64 × both thread orders; or the GPU).
//!
//! Cases: V = 1003 and 61 (above and below the block of 128, neither a multiple of a warp) with
//! 23 and 13 rows, V = 30522 (BERT's vocabulary) with 2 rows, the SIMT harness's grid of at
//! most 3 blocks (the grid-stride loop over rows); every 5th label the ignore index (−100),
//! labels 0 and V − 1 included; logits in [-8, 8) so the max subtraction matters; the backward
//! out of place and in place (dlogits over logits, as the planner runs it); every row ignored
//! (mean NaN as the CPU's 0/0); labels out of range (V, −5 and 2^40: the last would fault if it
//! were used as an index) set the error flag, give NaN rows and write nothing out of bounds.
//!
//! Tolerances (`tol(dt, f32_rel)`: f32_rel plus one unit roundoff u of a half output, relative to
//! each element, nothing of the largest element), f32_rel = 1e-6, 4e-6 for dlogits:
//! - per-row losses and the mean (f32 outputs in every dtype): lse = max + log Σ exp; the
//!   kernel's online per-thread sums merged by a butterfly and across warps, and the CPU's
//!   SIMD-lane sums, add the same terms in another order (expf vs Cephes exp ~1 ulp): a few ulp
//!   of Σ, ~1e-7 absolute on a loss of ~8; the mean sums ≤ 23 rows in a tree vs in order.
//! - dlogits: g·exp(x − lse), per element: lse is off by an ulp or so (|lse| < 32 here: an ulp
//!   is up to 1.9e-6 absolute), which is a relative difference of the same size in
//!   exp(x − lse), plus one expf ulp: 4e-6 of each element. The largest element is ~g (the
//!   label's −g term), so a wrong index or a missing −g is off by about the largest element.
//!
//! Measured worst on the SIMT harness: 1.0e-7 (f32 losses), 1.0e-6 relative (f32 dlogits); half
//! dlogits within one u (a rounding flip, 2.6e-3 in bf16), f16 ones below 2^-14 within the
//! harness's floor (one f16 subnormal step). The count is exact (an integer below 2^24 in f32).

mod kernel_harness;

use kernel_harness::*;
use ortbench_engine::backend::cpu::kernels::cross_entropy as cpu;
use ortbench_engine::backend::cpu::pool::Pool;
use ortbench_engine::exec::gpu::launch::cross_entropy as launch;
use ortbench_simt::{Buf, Dtype};

const IGNORE: i64 = -100;
const F32_REL: f32 = 1e-6;
/// dlogits = g·exp(x − lse), per element: an ulp of difference in lse (|lse| < 32 here: ulp
/// 1.9e-6) is a relative difference of exp(x − lse) of the same size, plus an expf ulp.
const DLOGITS_REL: f32 = 4e-6;
const DLOSS: f32 = 1.3;

fn labels_for(rows: usize, v: usize, rng: &mut Rng) -> Vec<i64> {
    (0..rows)
        .map(|i| match i {
            _ if i % 5 == 3 => IGNORE,
            0 => 0,
            1 => v as i64 - 1,
            _ => rng.below(v as u64) as i64,
        })
        .collect()
}

/// Per-row losses (f32), the mean (f32) and the error flag from the forward kernels.
fn forward(dev: &Dev, dt: Dtype, logits: &[f32], labels: &[i64], v: usize) -> (Vec<f32>, f32, i64) {
    let rows = labels.len();
    let (mut losses, mut err, mut lb, mut yb) = (
        Buf::poisoned(rows, D::F32),
        Buf::from_i32(&[0]),
        Buf::from_f32(logits, dt),
        Buf::from_i64(labels),
    );
    let l = launch::CrossEntropyForward {
        dtype: dtype(dt),
        losses: &mut losses,
        err: Some(&mut err),
        logits: &mut lb,
        labels: &mut yb,
        rows,
        v,
        ignore_index: IGNORE,
    };
    dev.run(l.launch(dev.geometry())).unwrap();
    let mut mean = Buf::poisoned(1, D::F32);
    let (loss, losses_, labels) = (&mut mean, &mut losses, &mut yb);
    let l = launch::CrossEntropyMean { loss, losses: losses_, labels, rows, ignore_index: IGNORE };
    dev.run(l.launch(dev.geometry())).unwrap();
    (losses.to_f32(), mean.to_f32()[0], err.to_i64()[0])
}

/// dlogits, the count and the error flag from the backward kernels (out of place).
fn backward(
    dev: &Dev,
    dt: Dtype,
    logits: &[f32],
    labels: &[i64],
    v: usize,
) -> (Vec<f32>, f32, i64) {
    let rows = labels.len();
    let (mut count, mut yb) = (Buf::poisoned(1, D::F32), Buf::from_i64(labels));
    let (count_, labels_) = (&mut count, &mut yb);
    let l =
        launch::CrossEntropyCount { count: count_, labels: labels_, rows, ignore_index: IGNORE };
    dev.run(l.launch(dev.geometry())).unwrap();
    let (mut d, mut err, mut lb, mut g) = (
        Buf::poisoned(rows * v, dt),
        Buf::from_i32(&[0]),
        Buf::from_f32(logits, dt),
        Buf::from_f32(&[DLOSS], D::F32),
    );
    let l = launch::CrossEntropyBackward {
        dtype: dtype(dt),
        dlogits: &mut d,
        err: Some(&mut err),
        logits: &mut lb,
        labels: &mut yb,
        dloss: &mut g,
        count: &mut count,
        rows,
        v,
        ignore_index: IGNORE,
    };
    dev.run(l.launch(dev.geometry())).unwrap();
    (d.to_f32(), count.to_f32()[0], err.to_i64()[0])
}

#[test]
fn forward_and_backward_match() {
    let pool = Pool::new(2);
    for dt in FLOATS {
        for &(rows, v) in &[(23usize, 1003usize), (13, 61), (2, 30522)] {
            let mut rng = Rng::new((rows * v) as u64);
            let logits = rng.vec(rows * v, -8.0, 8.0, dt);
            let labels = labels_for(rows, v, &mut rng);
            let mut ws = vec![0f32; rows];
            let want_mean =
                cpu::cross_entropy_forward(&pool, &logits, &labels, v, IGNORE, &mut ws).unwrap();
            let want_count = cpu::check_labels(&labels, v, IGNORE).unwrap() as f32;
            let mut want_d = vec![0f32; rows * v];
            cpu::cross_entropy_backward(
                &pool,
                &mut want_d,
                DLOSS,
                Some(&logits),
                &labels,
                v,
                IGNORE,
            )
            .unwrap();
            for dev in devices() {
                let what = format!("cross_entropy {dt:?} {rows}x{v} on {dev}");
                let (losses, mean, err) = forward(&dev, dt, &logits, &labels, v);
                assert_eq!(err, 0, "{what}: error flag");
                check(&format!("{what} row losses"), &losses, &ws, D::F32, tol(D::F32, F32_REL));
                check(&format!("{what} mean"), &[mean], &[want_mean], D::F32, tol(D::F32, F32_REL));
                let (d, count, err) = backward(&dev, dt, &logits, &labels, v);
                assert_eq!(err, 0, "{what}: backward error flag");
                assert_eq!(count, want_count, "{what}: count");
                check(&format!("{what} dlogits"), &d, &want_d, dt, tol(dt, DLOGITS_REL));
                // In place: dlogits is the logits buffer (buffer 0 twice).
                let (mut io, mut err, mut yb, mut g, mut cb) = (
                    Buf::from_f32(&logits, dt),
                    Buf::from_i32(&[0]),
                    Buf::from_i64(&labels),
                    Buf::from_f32(&[DLOSS], D::F32),
                    Buf::from_f32(&[count], D::F32),
                );
                let l = launch::CrossEntropyBackward {
                    dtype: dtype(dt),
                    dlogits: 0,
                    err: Some(1),
                    logits: 0,
                    labels: 2,
                    dloss: 3,
                    count: 4,
                    rows,
                    v,
                    ignore_index: IGNORE,
                };
                let bufs: &mut [&mut Buf] = &mut [&mut io, &mut err, &mut yb, &mut g, &mut cb];
                dev.run_on(l.launch(dev.geometry()), bufs).unwrap();
                check(
                    &format!("{what} dlogits in place"),
                    &io.to_f32(),
                    &want_d,
                    dt,
                    tol(dt, DLOGITS_REL),
                );
            }
        }
    }
}

#[test]
fn every_row_ignored_gives_nan_mean_and_zero_gradient() {
    let pool = Pool::new(2);
    let (rows, v) = (7usize, 100usize);
    let dt = Dtype::F32;
    let logits = Rng::new(1).vec(rows * v, -2.0, 2.0, dt);
    let labels = vec![IGNORE; rows];
    let mut ws = vec![0f32; rows];
    assert!(cpu::cross_entropy_forward(&pool, &logits, &labels, v, IGNORE, &mut ws)
        .unwrap()
        .is_nan());
    let mut want_d = vec![1f32; rows * v];
    cpu::cross_entropy_backward(&pool, &mut want_d, DLOSS, Some(&logits), &labels, v, IGNORE)
        .unwrap();
    for dev in devices() {
        let (losses, mean, err) = forward(&dev, dt, &logits, &labels, v);
        assert_eq!((err, losses), (0, vec![0f32; rows]), "on {dev}");
        assert!(mean.is_nan(), "on {dev}: mean {mean}");
        let (d, count, err) = backward(&dev, dt, &logits, &labels, v);
        assert_eq!((err, count), (0, 0.0), "on {dev}");
        assert_eq!(d, want_d, "on {dev}");
    }
}

#[test]
fn labels_out_of_range_set_the_error_flag_without_out_of_bounds_access() {
    let pool = Pool::new(2);
    let (rows, v) = (9usize, 200usize);
    for dt in FLOATS {
        let mut rng = Rng::new(4);
        let logits = rng.vec(rows * v, -4.0, 4.0, dt);
        let good = labels_for(rows, v, &mut rng);
        assert!(cpu::check_labels(&good, v, IGNORE).is_ok());
        let mut ws = vec![0f32; rows];
        cpu::cross_entropy_forward(&pool, &logits, &good, v, IGNORE, &mut ws).unwrap();
        let mut want_d = vec![0f32; rows * v];
        cpu::cross_entropy_backward(&pool, &mut want_d, DLOSS, Some(&logits), &good, v, IGNORE)
            .unwrap();
        // Bad labels at rows 2 (= V), 4 (negative, not the ignore index) and 6 (2^40).
        let bad_rows = [2usize, 4, 6];
        let mut labels = good.clone();
        for (&row, bad) in bad_rows.iter().zip([v as i64, -5, 1i64 << 40]) {
            labels[row] = bad;
        }
        assert!(cpu::check_labels(&labels, v, IGNORE).is_err());
        for dev in devices() {
            let what = format!("cross_entropy {dt:?} bad labels on {dev}");
            let (losses, _, err) = forward(&dev, dt, &logits, &labels, v);
            assert_eq!(err, 1, "{what}: forward error flag");
            for (r, (&l, &w)) in losses.iter().zip(&ws).enumerate() {
                if bad_rows.contains(&r) {
                    assert!(l.is_nan(), "{what}: loss of bad row {r} = {l}");
                } else {
                    check(
                        &format!("{what} loss row {r}"),
                        &[l],
                        &[w],
                        D::F32,
                        tol(D::F32, F32_REL),
                    );
                }
            }
            let (d, _, err) = backward(&dev, dt, &logits, &labels, v);
            assert_eq!(err, 1, "{what}: backward error flag");
            // The other rows as with the good labels: a bad label is not the ignore index, so
            // the count (and g) is the same.
            let mut got = d.clone();
            for &row in &bad_rows {
                assert!(
                    d[row * v..(row + 1) * v].iter().all(|x| x.is_nan()),
                    "{what}: dlogits of bad row {row}"
                );
                got[row * v..(row + 1) * v].copy_from_slice(&want_d[row * v..(row + 1) * v]);
            }
            check(
                &format!("{what} dlogits of the other rows"),
                &got,
                &want_d,
                dt,
                tol(dt, DLOGITS_REL),
            );
        }
    }
}
