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
                let l = gpu::Forward { dtype, h, gate: 1, up: 2, rows: gpu::one_row(), w: N };
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
                let rows = gpu::one_row();
                let l = gpu::Backward { dtype, dgate, dup: 1, dh: 2, gate: 3, up: 4, rows, w: N };
                let [b0, b1, b2, b3, b4] = &mut bufs;
                dev.run_on(l.launch(dev.geometry()), &mut [b0, b1, b2, b3, b4]).unwrap();
                let s = format!("backward, dgate at {dgate}");
                check(&what(&format!("{s}: dgate")), &bufs[dgate].to_f32(), &dg_want, dt, t);
                check(&what(&format!("{s}: dup")), &bufs[1].to_f32(), &du_want, dt, t);
            }
        }
    }
}

/// Rows of W = 37 at the plan's strides, as Phi-3 runs them: gate and up (and dgate, dup) the
/// halves of a (B, T, 2W) tensor — row stride 2W, the other half's place poisoned and never
/// written —, h and dh dense; then h over gate and dgate over dh at gate's strides. B, T = 3, 11:
/// the two leading dims merge into one row dim (`rows3`), so this is the launch the executor
/// makes. Against the CPU kernels on the dense values.
#[test]
fn forward_and_backward_on_strided_rows_match_the_cpu_kernels() {
    let pool = Pool::new(2);
    let (b, t, w) = (3usize, 11usize, 37usize);
    let (rows, n) = (b * t, b * t * w);
    // Dense values at row stride `st`, the gaps NaN; and back.
    let place = |v: &[f32], st: usize| {
        let mut o = vec![f32::NAN; rows * st];
        (0..rows).for_each(|r| o[r * st..r * st + w].copy_from_slice(&v[r * w..(r + 1) * w]));
        o
    };
    let take = |v: &[f32], st: usize| {
        (0..rows).flat_map(|r| v[r * st..r * st + w].to_vec()).collect::<Vec<f32>>()
    };
    let gaps_poisoned = |v: &[f32], st: usize| {
        (0..rows).all(|r| v[r * st + w..(r + 1) * st].iter().all(|x| x.is_nan()))
    };
    let strides = |st: usize| [0i64, (t * st) as i64, st as i64];
    let (half, full) = (2 * w, w);
    for dt in FLOATS {
        let mut rng = Rng::new(37);
        let gate = rng.vec(n, -12.0, 12.0, dt);
        let up = rng.vec(n, -3.0, 3.0, dt);
        let dh = rng.vec(n, -2.0, 2.0, dt);
        let mut h_want = vec![0f32; n];
        cpu::forward(&pool, &mut h_want, &gate, &up);
        let (mut dg_want, mut du_want) = (vec![0f32; n], vec![0f32; n]);
        cpu::backward(&pool, &mut dg_want, &mut du_want, &dh, &gate, &up);
        let tl = tol(dt, 2e-6);
        for dev in devices() {
            let what = |s: &str| format!("strided swiglu {s} {dt:?} on {dev}");
            let dtype = dtype(dt);
            // Forward: h dense apart (0), or over gate (1) at gate's strides.
            for h in [0, 1] {
                let hst = if h == 0 { full } else { half };
                let mut bufs = [
                    Buf::poisoned(n, dt),
                    Buf::from_f32(&place(&gate, half), dt),
                    Buf::from_f32(&place(&up, half), dt),
                ];
                let lead = [1, b, t];
                let rows3 = (lead, [strides(hst), strides(half), strides(half)]);
                let l = gpu::Forward { dtype, h, gate: 1, up: 2, rows: rows3, w };
                let [b0, b1, b2] = &mut bufs;
                dev.run_on(l.launch(dev.geometry()), &mut [b0, b1, b2]).unwrap();
                let got = bufs[h].to_f32();
                check(&what(&format!("forward, h at {h}")), &take(&got, hst), &h_want, dt, tl);
                assert!(h == 0 || gaps_poisoned(&got, half), "{}", what("forward: a gap written"));
            }
            // Backward: dgate apart (0) at stride 2W, or over dh (2), dh then at 2W too.
            for dgate in [0, 2] {
                let mut bufs = [
                    Buf::poisoned(rows * half, dt),
                    Buf::poisoned(rows * half, dt),
                    Buf::from_f32(&if dgate == 2 { place(&dh, half) } else { dh.clone() }, dt),
                    Buf::from_f32(&place(&gate, half), dt),
                    Buf::from_f32(&place(&up, half), dt),
                ];
                let dhst = if dgate == 2 { half } else { full };
                let s = [strides(half), strides(half), strides(dhst), strides(half), strides(half)];
                let l = gpu::Backward {
                    dtype,
                    dgate,
                    dup: 1,
                    dh: 2,
                    gate: 3,
                    up: 4,
                    rows: ([1, b, t], s),
                    w,
                };
                let [b0, b1, b2, b3, b4] = &mut bufs;
                dev.run_on(l.launch(dev.geometry()), &mut [b0, b1, b2, b3, b4]).unwrap();
                let (dg, du) = (bufs[dgate].to_f32(), bufs[1].to_f32());
                let s = format!("backward, dgate at {dgate}");
                check(&what(&format!("{s}: dgate")), &take(&dg, half), &dg_want, dt, tl);
                check(&what(&format!("{s}: dup")), &take(&du, half), &du_want, dt, tl);
                assert!(
                    gaps_poisoned(&dg, half) && gaps_poisoned(&du, half),
                    "{}",
                    what("backward: a gap written")
                );
            }
        }
    }
}
