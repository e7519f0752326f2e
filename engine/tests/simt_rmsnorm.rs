//! engine/kernels/rmsnorm.cu (with reduce.cu's column_sum_finish for dw) against the CPU
//! kernels in engine/src/backend/cpu/kernels/rmsnorm.rs, in f32/f16/bf16 on every test device,
//! out of place and with the fused add's sum over its first operand (as the planner runs it).
//!
//! Tolerances: f32 2e-5 of each element (the CPU sums a row in SIMD lanes, the kernel in a warp
//! butterfly: same terms, another order — as simt_layernorm.rs), plus one unit roundoff of the
//! half dtypes; rstd is an f32 output in every dtype (2e-5). dx and dw also get 1e-6 of the
//! largest element: dx = rstd·(w·dy − x̂·mean(w·dy·x̂)) cancels, and dw is a sum over rows of
//! both signs.

mod kernel_harness;

use kernel_harness::*;
use ortbench_engine::backend::cpu::kernels::rmsnorm as norm;
use ortbench_engine::backend::cpu::pool::Pool;
use ortbench_engine::exec::gpu::launch::{reduce, rmsnorm as launch};
use ortbench_engine::exec::gpu::support::chunks;
use ortbench_engine::DType;
use ortbench_simt::Buf;

// Rows not a multiple of the 4 rows per block, widths below / between / above the warp sizes;
// dw over 2 and 3 chunks of 32 rows (the last partial), one or two column blocks of 128. Width
// 200 is a multiple of every pack (4 f32, 8 f16/bf16): the row kernels' 16-byte path, which
// `x misaligned` turns back to one element at a time; 61 and 13 are not.
const SHAPES: [(usize, usize); 3] = [(37, 61), (9, 13), (70, 200)];
const EPS: f32 = 1e-6;

/// For the outputs that are sums whose terms cancel: dx, dw.
fn cancels(dt: D) -> Tol {
    Tol { of_largest: 1e-6, ..tol(dt, 2e-5) }
}

#[test]
fn forward_and_add_forward_match_the_cpu_kernels() {
    let pool = Pool::new(2);
    for dt in FLOATS {
        for &(rows, c) in &SHAPES {
            let mut rng = Rng::new(7 + (rows * c) as u64);
            let a = rng.vec(rows * c, -1.0, 1.0, dt);
            let b = rng.vec(rows * c, -1.0, 2.0, dt);
            let w = rng.vec(c, 0.5, 1.5, dt);
            let (mut y0, mut r0) = (vec![0f32; rows * c], vec![0f32; rows]);
            norm::rmsnorm_forward(&pool, &mut y0, &mut r0, &b, &w, EPS);
            let (mut s1, mut y1, mut r1) =
                (vec![0f32; rows * c], vec![0f32; rows * c], vec![0f32; rows]);
            norm::add_rmsnorm_forward(&pool, &mut s1, &mut y1, &mut r1, Some(&a), &b, &w, EPS);
            let first = devices()[0];
            let cases = devices().into_iter().map(|d| (d, false));
            for (dev, mis) in cases.chain([(first, true)]) {
                let (dtype, geo) = (dtype(dt), dev.geometry());
                let m = if mis { " (x misaligned)" } else { "" };
                let what = format!("rmsnorm {dt:?} {rows}x{c}{m} on {dev}");
                let xb = Buf::from_f32(&b, dt);
                let mut bufs = [
                    Buf::poisoned(rows * c, dt),
                    Buf::poisoned(rows, D::F32),
                    if mis { xb.misaligned() } else { xb },
                    Buf::from_f32(&w, dt),
                ];
                let l =
                    launch::RmsNormForward { dtype, y: 0, rstd: 1, x: 2, w: 3, rows, c, eps: EPS };
                let [y, r, x, wb] = &mut bufs;
                dev.run_on(l.launch(geo), &mut [y, r, x, wb]).unwrap();
                check(&format!("{what} y"), &bufs[0].to_f32(), &y0, dt, tol(dt, 2e-5));
                check(&format!("{what} rstd"), &bufs[1].to_f32(), &r0, D::F32, tol(D::F32, 2e-5));

                // The sum apart (0), and over a (4), as the plan puts it over a dying operand.
                for sum in [0, 4] {
                    let what = format!("add_rmsnorm {dt:?} {rows}x{c}, sum at {sum}, on {dev}");
                    let mut bufs = [
                        Buf::poisoned(rows * c, dt),
                        Buf::poisoned(rows * c, dt),
                        Buf::poisoned(rows, D::F32),
                        Buf::from_f32(&w, dt),
                        Buf::from_f32(&a, dt),
                        Buf::from_f32(&b, dt),
                    ];
                    let l = launch::AddRmsNormForward {
                        dtype,
                        sum,
                        y: 1,
                        rstd: 2,
                        a: 4,
                        b: 5,
                        w: 3,
                        rows,
                        c,
                        eps: EPS,
                    };
                    let [b0, b1, b2, b3, b4, b5] = &mut bufs;
                    dev.run_on(l.launch(geo), &mut [b0, b1, b2, b3, b4, b5]).unwrap();
                    check(&format!("{what} sum"), &bufs[sum].to_f32(), &s1, dt, tol(dt, 1e-6));
                    check(&format!("{what} y"), &bufs[1].to_f32(), &y1, dt, tol(dt, 2e-5));
                    let r = bufs[2].to_f32();
                    check(&format!("{what} rstd"), &r, &r1, D::F32, tol(D::F32, 2e-5));
                }
            }
        }
    }
}

#[test]
fn backward_matches_the_cpu_kernels_dx_and_dw() {
    let pool = Pool::new(2);
    for dt in FLOATS {
        for &(rows, c) in &SHAPES {
            let mut rng = Rng::new(11 + (rows * c) as u64);
            let x = rng.vec(rows * c, -1.0, 2.0, dt);
            let dy = rng.vec(rows * c, -1.0, 1.0, dt);
            let w = rng.vec(c, 0.5, 1.5, dt);
            let (mut y0, mut r0) = (vec![0f32; rows * c], vec![0f32; rows]);
            norm::rmsnorm_forward(&pool, &mut y0, &mut r0, &x, &w, EPS);
            let (mut dx0, mut dw0) = (vec![0f32; rows * c], vec![0f32; c]);
            let mut ws = vec![0f32; norm::backward_workspace(pool.threads(), c)];
            norm::rmsnorm_backward(&pool, &mut dx0, &mut dw0, &dy, &x, &w, &r0, &mut ws);
            let chunks = chunks(rows);
            let first = devices()[0];
            let cases = devices().into_iter().map(|d| (d, false));
            for (dev, mis) in cases.chain([(first, true)]) {
                let (dtype, geo) = (dtype(dt), dev.geometry());
                let xb = Buf::from_f32(&x, dt);
                let (mut dx, mut dyb, mut xb, mut wb, mut rb) = (
                    Buf::poisoned(rows * c, dt),
                    Buf::from_f32(&dy, dt),
                    if mis { xb.misaligned() } else { xb },
                    Buf::from_f32(&w, dt),
                    Buf::from_f32(&r0, D::F32),
                );
                let l = launch::RmsNormBackwardDx {
                    dtype,
                    dx: &mut dx,
                    dy: &mut dyb,
                    x: &mut xb,
                    w: &mut wb,
                    rstd: &mut rb,
                    rows,
                    c,
                };
                dev.run(l.launch(geo)).unwrap();
                let m = if mis { " (x misaligned)" } else { "" };
                let what = format!("rmsnorm backward {dt:?} {rows}x{c}{m} on {dev}");
                check(&format!("{what} dx"), &dx.to_f32(), &dx0, dt, cancels(dt));

                let mut part = Buf::poisoned(chunks * c, D::F32);
                let l = launch::RmsNormBackwardDw {
                    dtype,
                    ws: &mut part,
                    dy: &mut dyb,
                    x: &mut xb,
                    rstd: &mut rb,
                    rows,
                    c,
                };
                dev.run(l.launch(geo)).unwrap();
                // dw is a parameter gradient: f32 in every precision.
                let mut out = Buf::poisoned(c, D::F32);
                let (dtype, out_, ws) = (DType::F32, &mut out, &mut part);
                let l = reduce::ColumnSumFinish { dtype, out: out_, ws, chunks, c };
                dev.run(l.launch(geo)).unwrap();
                check(&format!("{what} dw"), &out.to_f32(), &dw0, D::F32, cancels(D::F32));
            }
        }
    }
}
