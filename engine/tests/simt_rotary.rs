//! engine/kernels/rotary.cu, through its typed launcher (`exec::gpu::launch::rotary`), against
//! the CPU kernel in engine/src/backend/cpu/kernels/rotary.rs, forward and inverse, out of place
//! and in place (y over x, as the planner runs it), in f32/f16/bf16 on every test device.
//!
//! Tolerance: 1e-6 relative in f32 (the same fmaf and products on both sides; one rounding
//! apart at most), plus one unit roundoff of the half dtypes.

mod kernel_harness;

use kernel_harness::*;
use ortbench_engine::backend::cpu::kernels::rotary as cpu;
use ortbench_engine::backend::cpu::kernels::rows::RowsAt;
use ortbench_engine::backend::cpu::pool::Pool;
use ortbench_engine::exec::gpu::launch::rotary::RotaryLaunch;
use ortbench_simt::Buf;

#[test]
fn rotary_and_its_inverse_match_the_cpu_kernel_in_and_out_of_place() {
    let pool = Pool::new(2);
    // (leading rows, T, D): head dims 64 and 80 (Llama, smollm2 / Phi), T not a multiple of
    // anything, R·D/2 pairs not a multiple of the block (256) or of the SIMT grid (3 blocks).
    for (lead, t, d) in [(6, 77, 64), (3, 13, 80), (1, 5, 2)] {
        let rows = lead * t;
        for dt in FLOATS {
            let mut rng = Rng::new((rows * d) as u64);
            let x = rng.vec(rows * d, -2.0, 2.0, dt);
            let cos = rng.vec(t * d, -1.0, 1.0, dt);
            let sin = rng.vec(t * d, -1.0, 1.0, dt);
            for inverse in [false, true] {
                let mut want = vec![0f32; rows * d];
                cpu::rotary(&pool, &mut want, Some(&x), &cos, &sin, d, inverse);
                for dev in devices() {
                    // y apart (0) and over x (1).
                    for y in [0, 1] {
                        let mut bufs = [
                            Buf::poisoned(rows * d, dt),
                            Buf::from_f32(&x, dt),
                            Buf::from_f32(&cos, dt),
                            Buf::from_f32(&sin, dt),
                        ];
                        let l = RotaryLaunch::dense(dtype(dt), (y, 1, 2, 3), rows, d, t, inverse);
                        let [b0, b1, b2, b3] = &mut bufs;
                        dev.run_on(l.launch(dev.geometry()), &mut [b0, b1, b2, b3]).unwrap();
                        let what = format!(
                            "rotary {dt:?} ({lead}, {t}, {d}) inverse={inverse} y at {y} on {dev}"
                        );
                        check(&what, &bufs[y].to_f32(), &want, dt, tol(dt, 1e-6));
                    }
                }
            }
        }
    }
}

/// Rows at the plan's strides, as a Llama step runs it: x read where its projection wrote it,
/// (B, T, H, D) seen as (B, H, T, D), y written at row stride D + 2 (its gaps must stay
/// poisoned), against the CPU kernel on the same layouts; then in place over the strided x.
/// (B, H, T, D) = (2, 3, 13, 80) and (3, 5, 7, 6): positions that do not divide the rows'
/// count of any other dim, so a wrong stride or index order reads another row's position.
#[test]
fn rotary_on_strided_rows_matches_the_cpu_kernel() {
    let pool = Pool::new(2);
    for (b, h, t, d) in [(2usize, 3usize, 13usize, 80usize), (3, 5, 7, 6)] {
        let (n, rows) = (b * t * h * d, b * h * t);
        let lead = [b, h, t];
        let (xs, ys) = ([t * h * d, d, h * d], [h * t * (d + 2), t * (d + 2), d + 2]);
        let ny = rows * (d + 2);
        for dt in FLOATS {
            let mut rng = Rng::new((n + 7) as u64);
            let x = rng.vec(n, -2.0, 2.0, dt);
            let cos = rng.vec(t * d, -1.0, 1.0, dt);
            let sin = rng.vec(t * d, -1.0, 1.0, dt);
            for inverse in [false, true] {
                let (mut want_y, mut want_x) = (vec![f32::NAN; ny], x.clone());
                let at = |p: *mut f32, strides| RowsAt {
                    ptr: ortbench_engine::backend::cpu::pool::SyncPtr(p),
                    lead: &lead,
                    strides,
                };
                // SAFETY: both layouts address B·H·T rows of D inside their vectors.
                unsafe {
                    let x_at = at(x.as_ptr() as *mut f32, &xs[..]);
                    cpu::rotary_rows(
                        &pool,
                        at(want_y.as_mut_ptr(), &ys[..]),
                        Some(x_at),
                        &cos,
                        &sin,
                        d,
                        inverse,
                    );
                    cpu::rotary_rows(
                        &pool,
                        at(want_x.as_mut_ptr(), &xs[..]),
                        None,
                        &cos,
                        &sin,
                        d,
                        inverse,
                    );
                }
                for dev in devices() {
                    for in_place in [false, true] {
                        let mut bufs = [
                            Buf::poisoned(ny, dt),
                            Buf::from_f32(&x, dt),
                            Buf::from_f32(&cos, dt),
                            Buf::from_f32(&sin, dt),
                        ];
                        let (y, ys_at) = if in_place { (1, xs) } else { (0, ys) };
                        let l = RotaryLaunch {
                            dtype: dtype(dt),
                            y,
                            x: 1,
                            cos: 2,
                            sin: 3,
                            lead,
                            xs: xs.map(|s| s as i64),
                            ys: ys_at.map(|s| s as i64),
                            d,
                            t,
                            inverse,
                        };
                        let [b0, b1, b2, b3] = &mut bufs;
                        dev.run_on(l.launch(dev.geometry()), &mut [b0, b1, b2, b3]).unwrap();
                        let what = format!(
                            "strided rotary {dt:?} ({b}, {h}, {t}, {d}) inverse={inverse} in place={in_place} on {dev}"
                        );
                        let got = bufs[y].to_f32();
                        if in_place {
                            check(&what, &got, &want_x, dt, tol(dt, 1e-6));
                        } else {
                            let (g, w): (Vec<f32>, Vec<f32>) = (0..rows)
                                .flat_map(|r| (0..d).map(move |i| r * (d + 2) + i))
                                .map(|k| (got[k], want_y[k]))
                                .unzip();
                            check(&what, &g, &w, dt, tol(dt, 1e-6));
                            let gaps =
                                (0..rows).flat_map(|r| [r * (d + 2) + d, r * (d + 2) + d + 1]);
                            assert!(
                                gaps.into_iter().all(|k| got[k].is_nan()),
                                "{what}: a gap written"
                            );
                        }
                    }
                }
            }
        }
    }
}
