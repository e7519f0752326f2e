//! engine/kernels/pointwise.cu, launched through the executor's typed launchers
//! (`exec::gpu::launch::pointwise`), against the CPU kernels of
//! engine/src/backend/cpu/kernels/pointwise.rs, for every function of `ops::pointwise`, in
//! f32/f16/bf16, on the devices of `kernel_harness::devices`.
//!
//! Tolerances: unary f32 2e-6 relative (the CPU's polynomial exp against libm's or the GPU's, a
//! few ulp each), binary 1e-6 (one rounding, the same formula), on top of one unit roundoff of
//! the half dtypes (both sides round nearly equal f32 values), per element; x·σ(x) for x ≪ 0
//! is small and exact on both sides, so no term of the largest element is needed.

mod kernel_harness;

use kernel_harness::*;
use ortbench_engine::backend::cpu::kernels::pointwise as cpu;
use ortbench_engine::backend::cpu::pool::Pool;
use ortbench_engine::exec::gpu::launch::pointwise as launch;
use ortbench_engine::ops::pointwise::{BinaryFn, UnaryFn};
use ortbench_simt::Buf;

// Not a multiple of the block (256) or of the grid the SIMT harness caps (3 blocks): the
// grid-stride loop takes several turns and ends mid-block.
const N: usize = 3 * 256 * 2 + 77;

#[test]
fn unary_forward_and_backward_match_the_cpu_kernels() {
    let pool = Pool::new(2);
    for &f in UnaryFn::ALL {
        for dt in FLOATS {
            let mut rng = Rng::new(21);
            // Both tails of σ and the region around 0.
            let x = rng.vec(N, -12.0, 12.0, dt);
            let dy = rng.vec(N, -2.0, 2.0, dt);
            let (mut y_want, mut dx_want) = (vec![0f32; N], vec![0f32; N]);
            cpu::unary(&pool, &mut y_want, &x, f);
            cpu::unary_backward(&pool, &mut dx_want, &x, &dy, f);
            // Aligned operands (16-byte packs, then the N mod V tail), and one input an element
            // off (one element at a time).
            for (dev, mis) in devices().iter().flat_map(|d| [(d, false), (d, true)]) {
                let off = |b: Buf| if mis { b.misaligned() } else { b };
                let (mut y, mut xb) = (Buf::poisoned(N, dt), off(Buf::from_f32(&x, dt)));
                let l = launch::Unary { f, dtype: dtype(dt), y: &mut y, x: &mut xb, n: N };
                dev.run(l.launch(dev.geometry())).unwrap();
                let what = format!("{} {dt:?} (misaligned x: {mis}) on {dev}", f.name());
                check(&what, &y.to_f32(), &y_want, dt, tol(dt, 2e-6));
                let (mut dx, mut xb, mut dyb) =
                    (Buf::poisoned(N, dt), Buf::from_f32(&x, dt), off(Buf::from_f32(&dy, dt)));
                let (dx_, x_, dy_) = (&mut dx, &mut xb, &mut dyb);
                let l =
                    launch::UnaryBackward { f, dtype: dtype(dt), dx: dx_, x: x_, dy: dy_, n: N };
                dev.run(l.launch(dev.geometry())).unwrap();
                let what = format!("{} {dt:?} (misaligned dy: {mis}) on {dev}", f.backward_name());
                check(&what, &dx.to_f32(), &dx_want, dt, tol(dt, 2e-6));
            }
        }
    }
}

#[test]
fn binary_same_shape_and_broadcast_match_the_cpu_kernels() {
    let pool = Pool::new(2);
    // Rows of C broadcast over N / C rows: C = 61 (not a multiple of the block or of a pack:
    // one element at a time, and an N mod V tail when not broadcast) and C = 40 (a multiple
    // of every pack: the broadcast in 16-byte packs), with b aligned and an element off.
    for c in [61, 40] {
        let n = c * 29;
        for &f in BinaryFn::ALL {
            for dt in FLOATS {
                let mut rng = Rng::new(23);
                let a = rng.vec(n, -3.0, 3.0, dt);
                let b = rng.vec(n, -3.0, 3.0, dt);
                for (nb, mis) in [(n, false), (c, false), (c, true)] {
                    let mut want = vec![0f32; n];
                    cpu::binary(&pool, &mut want, &a, &b[..nb], f);
                    for dev in devices() {
                        let bb = Buf::from_f32(&b[..nb], dt);
                        let mut bb = if mis { bb.misaligned() } else { bb };
                        let (mut out, mut ab) = (Buf::poisoned(n, dt), Buf::from_f32(&a, dt));
                        let (o, a_, b_) = (&mut out, &mut ab, &mut bb);
                        let l = launch::Binary { f, dtype: dtype(dt), out: o, a: a_, b: b_, n, nb };
                        dev.run(l.launch(dev.geometry())).unwrap();
                        let what =
                            format!("{} {dt:?} b of {nb} (misaligned: {mis}) on {dev}", f.name());
                        check(&what, &out.to_f32(), &want, dt, tol(dt, 1e-6));
                    }
                }
            }
        }
    }
}
