//! engine/kernels/rotary.cu, through its typed launcher (`exec::gpu::launch::rotary`), against
//! the CPU kernel in engine/src/backend/cpu/kernels/rotary.rs, forward and inverse, out of place
//! and in place (y over x, as the planner runs it), in f32/f16/bf16 on every test device.
//!
//! Tolerance: 1e-6 relative in f32 (the same fmaf and products on both sides; one rounding
//! apart at most), plus one unit roundoff of the half dtypes.

mod kernel_harness;

use kernel_harness::*;
use ortbench_engine::backend::cpu::kernels::rotary as cpu;
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
                        let l = RotaryLaunch {
                            dtype: dtype(dt),
                            y,
                            x: 1,
                            cos: 2,
                            sin: 3,
                            rows,
                            d,
                            t,
                            inverse,
                        };
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
