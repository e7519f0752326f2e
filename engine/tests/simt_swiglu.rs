//! engine/kernels/swiglu.cu, launched through SwiGLU's typed launchers (`ops::swiglu::gpu`),
//! against its CPU kernels (`ops::swiglu::cpu`), in f32/f16/bf16, out of place and in place
//! (h over gate, h over up, dgate over dh, as the planner runs them), on the devices of
//! `kernel_harness::devices`.
//!
//! Tolerance: 2e-6 relative in f32 (the CPU's polynomial exp against libm's or the GPU's, a
//! few ulp each, times one or two roundings), on top of one unit roundoff of the half dtypes
//! (both sides round nearly equal f32 values), per element.

mod kernel_harness;

use kernel_harness::*;
use ortbench_engine::backend::cpu::pool::Pool;
use ortbench_engine::ops::swiglu::{cpu, gpu};
use ortbench_simt::Buf;

// Not a multiple of the block (256) or of the grid the SIMT harness caps (3 blocks): the
// grid-stride loop takes several turns and ends mid-block.
const N: usize = 3 * 256 * 2 + 77;

#[test]
fn forward_and_backward_match_the_cpu_kernels_in_and_out_of_place() {
    let pool = Pool::new(2);
    for dt in FLOATS {
        let mut rng = Rng::new(31);
        // Both tails of σ and the region around 0.
        let gate = rng.vec(N, -12.0, 12.0, dt);
        let up = rng.vec(N, -3.0, 3.0, dt);
        let dh = rng.vec(N, -2.0, 2.0, dt);
        let mut h_want = vec![0f32; N];
        cpu::forward(&pool, &mut h_want, &gate, &up);
        let (mut dg_want, mut du_want) = (vec![0f32; N], vec![0f32; N]);
        cpu::backward(&pool, &mut dg_want, &mut du_want, &dh, &gate, &up);
        let t = tol(dt, 2e-6);
        for dev in devices() {
            let what = |s: &str| format!("swiglu {s} {dt:?} on {dev}");
            let dtype = dtype(dt);
            // Forward: h apart (0), over gate (h = 1), over up (h = 2).
            for h in 0..3 {
                let mut bufs =
                    [Buf::poisoned(N, dt), Buf::from_f32(&gate, dt), Buf::from_f32(&up, dt)];
                let l = gpu::Forward { dtype, h, gate: 1, up: 2, n: N };
                let [b0, b1, b2] = &mut bufs;
                dev.run_on(l.launch(dev.geometry()), &mut [b0, b1, b2]).unwrap();
                check(&what(&format!("forward, h at {h}")), &bufs[h].to_f32(), &h_want, dt, t);
            }
            // Backward: dgate apart (0) and over dh (2).
            for dgate in [0, 2] {
                let mut bufs = [
                    Buf::poisoned(N, dt),
                    Buf::poisoned(N, dt),
                    Buf::from_f32(&dh, dt),
                    Buf::from_f32(&gate, dt),
                    Buf::from_f32(&up, dt),
                ];
                let l = gpu::Backward { dtype, dgate, dup: 1, dh: 2, gate: 3, up: 4, n: N };
                let [b0, b1, b2, b3, b4] = &mut bufs;
                dev.run_on(l.launch(dev.geometry()), &mut [b0, b1, b2, b3, b4]).unwrap();
                let s = format!("backward, dgate at {dgate}");
                check(&what(&format!("{s}: dgate")), &bufs[dgate].to_f32(), &dg_want, dt, t);
                check(&what(&format!("{s}: dup")), &bufs[1].to_f32(), &du_want, dt, t);
            }
        }
    }
}
