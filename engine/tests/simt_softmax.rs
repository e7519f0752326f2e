//! engine/kernels/softmax.cu (`softmax_forward`, `softmax_backward`) against the CPU kernels in
//! engine/src/backend/cpu/kernels/softmax.rs, in f32/f16/bf16 on every test device (SIMT warp
//! 32/64 × both thread orders; or the GPU).
//!
//! Cases: rows of 61, 13 and 200 (below, between and above the warp sizes, none a multiple of
//! them), row counts that are not a multiple of the rows per block, causal with Tq = N,
//! Tq > N (the visible prefix is capped at N) and Tq < N, no mask / a (B, 1, 1, N) key-padding
//! mask with −∞ keys and one batch fully −∞ (its rows are zeros, as torch's sdpa; 0 in the causal
//! tail, as the CPU) / a (1, H, Tq, N) mask with −1e4 entries. The backward reads the CPU's
//! forward output rounded to the dtype, also in place (dx over dy, as the planner runs it).
//!
//! Tolerances (`tol(dt, f32_rel)`: f32_rel plus one unit roundoff u of a half dtype, relative to
//! each element, nothing of the largest element): f32_rel = 1e-6 for both. The forward's online
//! max/sum (lane partials rescaled by exp(m_old − m_new), a butterfly merge) and the CPU's
//! two-pass SIMD-lane sum add the same terms in another order, and the kernel's expf and the
//! CPU's Cephes exp differ by ~1 ulp: a few ulp on a probability. The backward's dot(dy, y) is
//! a warp butterfly against the CPU's SIMD lanes: a few ulp of Σ|dy·y|, which reaches dx through
//! scale·y. Measured worst on the SIMT harness: 0.27 of the per-element bound in f32 (forward),
//! under 1e-3 of it (backward), and the f16/bf16 outputs equal to the rounded CPU ones. An
//! index error (wrong row, wrong mask element, missing causal cut) moves a probability by far
//! more than 1e-6 of itself; in f16/bf16 (u = 1e-3 / 8e-3) the f32 runs of the same case are
//! the sharp check.

mod kernel_harness;

use kernel_harness::*;
use ortbench_engine::backend::cpu::kernels::softmax::{self as cpu, MaskMap};
use ortbench_engine::backend::cpu::pool::Pool;
use ortbench_engine::exec::gpu::launch::{softmax as launch, Mask as LMask};
use ortbench_simt::{Buf, Dtype};

const F32_REL: f32 = 1e-6;

#[derive(Clone, Copy, Debug)]
enum Mask {
    None,
    /// (B, 1, 1, N): ~25% of the keys −∞ (never key 0), the others a bias in [-1, 1); the whole
    /// of batch 1 −∞ (every row of it fully masked).
    KeyPad,
    /// (1, H, Tq, N): random in [-2, 1), ~10% −1e4.
    Full,
}

#[derive(Clone, Copy, Debug)]
struct Case {
    b: usize,
    h: usize,
    tq: usize,
    n: usize,
    causal: bool,
    mask: Mask,
}

const CASES: [Case; 6] = [
    Case { b: 1, h: 2, tq: 11, n: 61, causal: false, mask: Mask::None },
    Case { b: 2, h: 2, tq: 7, n: 61, causal: true, mask: Mask::KeyPad },
    Case { b: 1, h: 2, tq: 9, n: 61, causal: false, mask: Mask::Full },
    // Tq > N: rows past N see the whole row; fully masked batch with causal.
    Case { b: 2, h: 1, tq: 19, n: 13, causal: true, mask: Mask::KeyPad },
    // Tq < N and wide rows: several strides per lane at warp 64.
    Case { b: 1, h: 2, tq: 7, n: 200, causal: true, mask: Mask::Full },
    Case { b: 2, h: 1, tq: 5, n: 200, causal: false, mask: Mask::KeyPad },
];

/// Element strides of a mask of `shape` broadcast to (B, H, Tq, N): contiguous, 0 on size-1 dims.
fn mask_strides(shape: [usize; 4]) -> [i64; 4] {
    let mut s = [0i64; 4];
    let mut acc = 1usize;
    for d in (0..4).rev() {
        s[d] = if shape[d] == 1 { 0 } else { acc as i64 };
        acc *= shape[d];
    }
    s
}

/// The case's mask (shape and values rounded to `dt`), or None.
fn make_mask(c: &Case, rng: &mut Rng, dt: Dtype) -> Option<([usize; 4], Vec<f32>)> {
    match c.mask {
        Mask::None => None,
        Mask::KeyPad => {
            let mut m = rng.vec(c.b * c.n, -1.0, 1.0, dt);
            for (i, x) in m.iter_mut().enumerate() {
                if i / c.n == 1 || (i % c.n != 0 && rng.below(4) == 0) {
                    *x = f32::NEG_INFINITY;
                }
            }
            Some(([c.b, 1, 1, c.n], m))
        }
        Mask::Full => {
            let mut m = rng.vec(c.h * c.tq * c.n, -2.0, 1.0, dt);
            for x in m.iter_mut() {
                if rng.below(10) == 0 {
                    *x = dt.round(-1e4);
                }
            }
            Some(([1, c.h, c.tq, c.n], m))
        }
    }
}

#[test]
fn forward_matches_with_scale_causal_and_mask() {
    let pool = Pool::new(2);
    let scale = 0.7f32;
    for dt in FLOATS {
        for (ci, c) in CASES.iter().enumerate() {
            let rows = c.b * c.h * c.tq;
            let mut rng = Rng::new(11 + ci as u64);
            // Logits of a few units (scaled by 0.7): far from uniform.
            let x = rng.vec(rows * c.n, -4.0, 4.0, dt);
            let mask = make_mask(c, &mut rng, dt);
            let full = [c.b, c.h, c.tq, c.n];
            let mm = mask.as_ref().map(|(s, _)| MaskMap::new(s, &full));
            let mut want = vec![0f32; rows * c.n];
            cpu::softmax_forward(
                &pool,
                &mut want,
                &x,
                c.n,
                scale,
                c.causal,
                c.tq,
                mask.as_ref().map(|(_, d)| &d[..]).zip(mm.as_ref()),
            );
            if matches!(c.mask, Mask::KeyPad) {
                let per_b = c.h * c.tq * c.n;
                assert!(
                    want[per_b..2 * per_b].iter().all(|&v| v == 0.0),
                    "case {ci}: the fully masked batch gives zero rows"
                );
                assert!(want.iter().all(|v| v.is_finite()), "case {ci}: no NaN");
            }
            let ms = mask_strides(mask.as_ref().map_or([1; 4], |(s, _)| *s));
            for dev in devices() {
                let mut y = Buf::poisoned(rows * c.n, dt);
                let mut xb = Buf::from_f32(&x, dt);
                let mut mb = mask.as_ref().map(|(_, d)| Buf::from_f32(d, dt));
                let l = launch::SoftmaxForward {
                    dtype: dtype(dt),
                    y: &mut y,
                    x: &mut xb,
                    mask: mb.as_mut().map(|mask| LMask { mask, strides: ms }),
                    rows,
                    n: c.n,
                    scale,
                    causal: c.causal,
                    h: c.h,
                    tq: c.tq,
                };
                dev.run(l.launch(dev.geometry())).unwrap();
                check(
                    &format!("softmax forward {dt:?} case {ci} {c:?} on {dev}"),
                    &y.to_f32(),
                    &want,
                    dt,
                    tol(dt, F32_REL),
                );
            }
        }
    }
}

#[test]
fn backward_matches_out_of_place_and_in_place() {
    let pool = Pool::new(2);
    let scale = 0.7f32;
    for dt in FLOATS {
        for &(rows, n) in &[(37usize, 61usize), (23, 13), (9, 200)] {
            let mut rng = Rng::new(5 + (rows * n) as u64);
            let x = rng.vec(rows * n, -4.0, 4.0, dt);
            let mut yf = vec![0f32; rows * n];
            // Causal rows (tq = 7) put exact zeros into y, as the engine's do.
            cpu::softmax_forward(&pool, &mut yf, &x, n, scale, true, 7, None);
            let y: Vec<f32> = yf.iter().map(|&v| dt.round(v)).collect();
            let dy = rng.vec(rows * n, -1.0, 1.0, dt);
            let mut want = vec![0f32; rows * n];
            cpu::softmax_backward(&pool, &mut want, &y, &dy, n, scale);
            for dev in devices() {
                let what = format!("softmax backward {dt:?} {rows}x{n} on {dev}");
                let (mut dx, mut yb, mut dyb) =
                    (Buf::poisoned(rows * n, dt), Buf::from_f32(&y, dt), Buf::from_f32(&dy, dt));
                let dtype = dtype(dt);
                let l = launch::SoftmaxBackward {
                    dtype,
                    dx: &mut dx,
                    y: &mut yb,
                    dy: &mut dyb,
                    rows,
                    n,
                    scale,
                };
                dev.run(l.launch(dev.geometry())).unwrap();
                check(&what, &dx.to_f32(), &want, dt, tol(dt, F32_REL));
                // In place: dx is dy (buffer 0 twice).
                let mut io = Buf::from_f32(&dy, dt);
                let l = launch::SoftmaxBackward { dtype, dx: 0, y: 1, dy: 0, rows, n, scale };
                dev.run_on(l.launch(dev.geometry()), &mut [&mut io, &mut yb]).unwrap();
                check(&format!("{what} in place"), &io.to_f32(), &want, dt, tol(dt, F32_REL));
            }
        }
    }
}
